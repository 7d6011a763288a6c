"""One posterior on many workers: ``dpinfer.sample_sharded`` fits one model whose latent
counts are split into groups the model makes conditionally independent given a few shared
parameters (states given national hyperparameters, counties given a state's), each shard
of groups held by a worker (a Dask actor) for the whole fit.

The analyst writes the model in two parts:

* ``build_shard(groups)`` returns the PyMC model of those groups: their counts, releases and
  local parameters, each shared parameter a ``pm.Data`` of its name, and the *summaries*
  the shared parameters' conditional needs, as Deterministics with a leading axis over the
  groups (for a normal hierarchy log_rate_i ~ N(mu_g, sigma): each group's mu_g, number of
  cells and sum of (log_rate_i - mu_g)^2);
* ``shared_model``, a PyMC model of the shared parameters theta with their priors and one
  ``pm.Data`` per summary (leading axis over all groups), whose log density as a function of
  theta must be log p(theta) + sum_g log p(local_g | theta) up to a constant.

Each sweep is one scan of a Gibbs sampler on (theta, every shard's local parameters and
counts): the driver moves theta by NUTS given the summaries (the compiled engine's kernel on
``shared_model``), sends theta to every shard, each shard makes one iteration of the
one-machine engine on its groups given theta (exact count draws, NUTS on the local
parameters; :mod:`dpinfer.inference.shard`) and returns its summaries. Both steps leave the
joint posterior invariant, so the chain targets the one-machine engine's posterior; only
theta and the summaries cross the network each sweep (``bytes_per_sweep`` in
``sample_stats.attrs``), the counts once at the end.

That the shared model is the right conditional is the analyst's claim; it is checked before
sampling: with the local parameters at two states, the change of the shared model's log
density between two values of theta, less the change of the shards' log densities, must be
the same (it is the change of log p(theta), which the local state cannot alter). A summary
missing from the shared model, a term dropped or a wrong factor fails this check.

Chains advance in lock step (each shard runs every chain's iteration in one call). With a
seed the draws are the same whatever the workers, for the same ``shards``; so a fit carried on
from a checkpoint, after a worker was lost or by a new driver (``resume=``), gives the draws
of the uninterrupted fit. Every such recovery is on the record (:mod:`dpinfer.inference.recovery`).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pymc as pm
import xarray as xr

from dpinfer._validation import as_real_array, check_count, check_flag, check_path, check_probability, check_seed
from dpinfer.inference import convergence, recovery
from dpinfer.inference.checkpoint import (
    Checkpoint,
    CheckpointMismatchError,
    RoundCheckpoints,
    check_same_fit,
    model_hash,
    versions,
)
from dpinfer.inference.engines.compiled import engine as compiled_engine
from dpinfer.inference.sample import MAX_WIDENINGS, check_sampler_options
from dpinfer.inference.engines.compiled.chains import (
    NUTS_STATS,
    Progress,
    Stepper,
    fresh_state,
    log_density_at,
)
from dpinfer.inference.shard import Shard, short
from dpinfer.mechanisms.records import releases_of

MAX_RECOVERIES = 3  # lost workers survived per fit (as Dask's allowed-failures)
WORKER_WAIT = 120.0  # seconds to wait for a worker after losing them
LOSS_WAIT = 5.0
CHECK_RTOL = 1e-6  # the shared model's check (module docstring), relative to the terms' size
METHOD = ("sharded exact Gibbs: the shared parameters by NUTS given the shards' summaries, each "
          "shard's local parameters and counts by the compiled engine's sweep given them")


def sample_sharded(build_shard, shared_model, groups, *, draws: int = 1000, tune: int = 1000,
                   chains: int = 2, client=None, shards: int | None = None, weights=None,
                   random_seed: int | None = None, tol: float = 1e-10, progressbar: bool = True,
                   checkpoint=None, checkpoint_every: int = 100, resume=None, **sample_kwargs) -> xr.DataTree:
    """Sample one model's posterior with its groups sharded over workers (module docstring).

    Parameters
    ----------
    build_shard
        ``build_shard(groups) -> pymc.Model`` for a list of groups (items of ``groups``),
        called on the worker that holds them (so it must be importable or picklable there).
    shared_model
        The shared parameters' model (``pymc.Model``): their priors and a ``pm.Data`` per
        summary, of shape (len(groups), ...), in the order of ``groups``.
    groups
        The groups, in order (e.g. state codes); each shard holds a contiguous run of them.
    client
        A ``distributed.Client``: each shard is an actor on one of its workers (round robin).
        None: the shards run in this process, one after another (for tests and small fits).
    shards
        Number of shards (default: the client's workers, or 1 without a client).
    weights
        A weight per group (e.g. its cells) for balancing the shards (default: equal).
    checkpoint, checkpoint_every
        A new (or empty) directory, on a file system the workers share, where every
        ``checkpoint_every`` sweeps the driver and each shard write their chains' states
        (``sweep-<n>/shared`` and ``sweep-<n>/shard-<k>``, netCDF, owner-only; the previous
        sweep's removed once the new one is whole, named in ``latest.json``). A worker lost
        during the fit: the shards are started again on the workers alive from the last
        checkpoint and the fit carries on (at most MAX_RECOVERIES times); the draws are those
        of an uninterrupted fit.
    resume
        A sharded checkpoint directory (written with ``checkpoint=``) whose fit stopped (this
        process, the driver, was killed or lost): the fit continues from its last whole
        checkpoint on this call's client (the same cluster or another), replaying the
        widenings it had made, and keeps saving there; the draws are those of the
        uninterrupted fit. The same call with ``resume=`` in place of ``checkpoint=``
        (``random_seed`` may be left out: it is in the checkpoint); another model, data,
        groups, shards, settings, seed or dpinfer version is refused with what differs
        (:class:`~dpinfer.inference.checkpoint.CheckpointMismatchError`).
    draws, tune, chains, random_seed, progressbar, tol, sample_kwargs
        As ``dpinfer.sample`` with the compiled engine (``target_accept``, ``max_treedepth``,
        ``nuts_per_sweep``, ``counts_per_sweep``, for the shared parameters and every shard).

    Returns
    -------
    xarray.DataTree: ``posterior`` with the shared parameters and every shard's variables
    joined along their first dimension (the groups' cells), ``sample_stats`` with the shared
    parameters' NUTS statistics (``diverging`` also counts the shards'), each shard's as
    ``shard_<name>`` (chain, draw, shard), and in its attrs ``bytes_per_sweep``, ``shards``
    (groups, cells, build time, sweep seconds, process memory per shard), the time spent (with
    ``first_sweep_time``, when every process loads the sampler's kernels) and ``progress``,
    the progress line at the end (sweeps, rate, shards and workers alive).
    ``posterior.attrs["dpinfer"]`` holds each latent's report per shard and
    ``["dpinfer_convergence"]`` R-hat and ESS over everything.
    """
    tol = check_probability(tol, "tol")
    draws, tune, chains = (check_count(name, value, least)
                           for name, value, least in (("draws", draws, 1), ("tune", tune, 0), ("chains", chains, 1)))
    random_seed, progressbar = check_seed(random_seed), check_flag("progressbar", progressbar)
    checkpoint, resume = check_path("checkpoint", checkpoint), check_path("resume", resume)
    checkpoint_every = check_count("checkpoint_every", checkpoint_every, 1)
    if not callable(build_shard):
        raise TypeError(f"build_shard must be a function of a list of groups returning a pymc.Model, "
                        f"got {build_shard!r}")
    if isinstance(groups, (str, bytes, dict)) or not hasattr(groups, "__iter__"):
        raise TypeError(f"groups must be a list of the groups to shard (labels or indices), got {groups!r}")
    groups = list(groups)
    if not groups or len(set(map(repr, groups))) != len(groups):
        raise ValueError("groups must be a non-empty list of distinct groups")
    if not isinstance(shared_model, pm.Model):
        raise TypeError(f"shared_model must be a pymc.Model, got {type(shared_model).__name__}")
    if client is not None and not callable(getattr(client, "scheduler_info", None)):
        raise TypeError(f"client must be None or a dask.distributed.Client, got {client!r}")
    workers = _workers(client)
    n_shards = check_count("shards", shards, 1) if shards is not None else max(1, len(workers))
    if not 1 <= n_shards <= len(groups):
        raise ValueError(f"shards must be between 1 and the number of groups ({len(groups)}), got {shards!r}")
    if weights is not None:
        weights = as_real_array("weights", weights)
    settings = compiled_engine.settings(checked_options(sample_kwargs))
    if checkpoint is not None and resume is not None and Path(checkpoint) != Path(resume):
        raise ValueError(f"give checkpoint= or resume=, not both (resume={str(resume)!r} keeps saving there)")
    began = time.perf_counter()

    driver = SharedModel(shared_model, len(groups))
    if resume is not None and random_seed is None:  # the checkpointed fit's seed
        random_seed = _SweepCheckpoints.stored_entropy(resume)
    seeds = np.random.SeedSequence(random_seed)
    driver_seed, probe_seed, *shard_seeds = seeds.spawn(2 + n_shards)
    starts_q = [driver.compiled.initial_q(int(s.generate_state(1)[0]), shared_model)
                for s in driver_seed.spawn(chains)]
    probe_q = driver.compiled.initial_q(int(probe_seed.generate_state(1)[0]), shared_model)
    starts = [driver.theta(q) for q in starts_q]
    probe = driver.theta(probe_q)

    parts = partition_groups(groups, n_shards, weights)
    options = dict(shared=driver.shapes, summaries=driver.summary_names, chains=chains, tune=tune,
                   draws=draws, starts=starts, probe=probe, tol=tol, settings=settings)
    identity = {"versions": versions(), "model": _SweepCheckpoints.driver_hash_of(driver),
                "settings": settings | {"draws": draws, "tune": tune, "chains": chains, "tol": tol},
                "shards": [[repr(g) for g in part] for part in parts], "entropy": str(seeds.entropy)}
    store = (None if checkpoint is None and resume is None else
             _SweepCheckpoints.create(checkpoint, checkpoint_every, identity) if resume is None else
             _SweepCheckpoints.open(resume, checkpoint_every, identity))
    fit = _Fit(driver, build_shard, parts, options, client=client, workers=workers, store=store,
               shard_seeds=[[int(s.generate_state(1)[0]) for s in seq.spawn(chains)] for seq in shard_seeds],
               driver_seeds=driver_seed.spawn(chains), starts_q=starts_q, progressbar=progressbar)
    widenings = [[] for _ in parts]  # per shard, each refit's (failed latents: name -> bound, counts widened alone)
    rounds = store.widening_rounds() if resume is not None else []  # the stopped fit's, replayed
    for failed, counts in rounds:
        for k, f in failed.items():
            widenings[k].append((f, counts.get(k, {})))
        recovery.announce(fit.recoveries, "windows widened", _widening_message(parts, failed, counts), warn=False,
                          bounds=_bounds(parts, failed), replayed=True, counts_widened=_counted(parts, counts))
    for attempt in range(len(rounds), MAX_WIDENINGS + 1):
        sweep = store.latest() if resume is not None and attempt == len(rounds) else 0
        fit.start(widenings, sweep)
        if sweep:
            recovery.announce(fit.recoveries, "resumed", f"dpinfer: resumed the sharded fit from the checkpoint "
                              f"{str(resume)!r} at sweep {sweep} on {len(fit.workers)} workers; {len(rounds)} "
                              "widening(s) of windows replayed", checkpoint=str(resume), sweep=sweep)
        if attempt == len(rounds):
            check_shared_model(driver, fit.shards, (starts_q[0], probe_q), (starts[0], probe),
                               int(probe_seed.generate_state(2)[1]))
        outputs = fit.run()
        failed = {k: o["failed"] for k, o in enumerate(outputs) if o["failed"]}
        if not failed:
            break
        counts = {k: near for k in failed if (near := _counts_near_edges(outputs[k]["report"], failed[k]))}
        where = "; ".join(f"{sorted(f)} of the groups {short(parts[k])}" for k, f in failed.items())
        if attempt == MAX_WIDENINGS:
            raise RuntimeError(
                f"cells of {where} were held (not updated) in most draws after {MAX_WIDENINGS} widenings "
                "of their windows: at the parameters the chains visit, their windows hold almost none of "
                "the counts' conditional law. Either the chains have not reached the posterior (raise "
                "tune) or the model puts the counts far from the releases - check the model")
        for k, f in failed.items():
            widenings[k].append((f, counts.get(k, {})))
        if store is not None:
            store.widened(failed, counts)
        recovery.announce(fit.recoveries, "windows widened", _widening_message(parts, failed, counts),
                          bounds=_bounds(parts, failed), replayed=False, counts_widened=_counted(parts, counts))
    idata = _datatree(driver, fit.steppers, outputs, tune=tune, chains=chains)
    recovery.record(idata, fit.recoveries)
    idata.sample_stats.attrs.update(
        bytes_per_sweep=fit.bytes_per_sweep, sampling_time=fit.sampling_seconds,
        total_time=time.perf_counter() - began, n_shards=n_shards, progress=fit.progress_line,
        first_sweep_time=fit.first_sweep_seconds,
        shards=json.dumps([dict(info, sweep_seconds=o["sweep_seconds"], first_sweep_seconds=o["first_sweep_seconds"],
                                peak_memory_MB=o["peak_memory_MB"]) for info, o in zip(fit.infos, outputs)]))
    report = {}
    for k, o in enumerate(outputs):
        for latent, entry in o["report"].items():
            report.setdefault(latent, {"engine": "sharded", "method": METHOD, "shards": []})["shards"].append(
                dict(entry, groups=short(parts[k]), widenings=len(widenings[k])))
    idata.posterior.attrs["dpinfer"] = json.dumps(report)
    names = [rv.name for rv in shared_model.free_RVs] + [n for n in outputs[0]["free"] if n in idata.posterior]
    result = convergence.check(idata, names)
    idata.posterior.attrs["dpinfer_convergence"] = json.dumps(result.as_dict())
    convergence.report(result, show=progressbar)
    return idata


def _counts_near_edges(report: dict, failed: dict) -> dict:
    """A shard's counts to widen alone (latent -> (leaf, cell) pairs), as ``dpinfer.sample``
    takes them from its report: those of a nested latent whose draws reached or came near their
    box edges; a failed latent without them is widened whole."""
    return {name: report[name]["counts_near_box_edges"] for name in failed
            if "counts_near_box_edges" in report.get(name, {})}


def _counted(parts: list, counts: dict) -> dict:
    """How many counts of each latent each shard widened alone (JSON), keyed by its groups."""
    return {short(parts[k]): {name: len(c) for name, c in near.items()} for k, near in counts.items()}


def _widening_message(parts: list, failed: dict, counts: dict) -> str:
    def latents(k, f):
        alone = counts.get(k, {})
        return ", ".join(f"{name!r}" + (f" (only its {len(alone[name])} counts at or near their boxes' edges)"
                                        if name in alone else "") for name in sorted(f))

    where = "; ".join(f"{latents(k, f)} of the groups {short(parts[k])}" for k, f in failed.items())
    return f"dpinfer: the windows of {where} missed tol; widened them and fitted again"


def _bounds(parts: list, failed: dict) -> dict:
    """Each shard's failed latents' bounds (JSON), keyed by its groups."""
    return {short(parts[k]): recovery.bounds_of(f) for k, f in failed.items()}


class SharedModel:
    """The shared model compiled (the compiled engine, no counts): theta's names and shapes,
    the summaries' places in its data, theta's constrained values from q. ``given``: names of
    pm.Data that are not summaries (set by :meth:`set_given`)."""

    def __init__(self, model, n_groups: int, given: tuple = ()):
        if releases_of(model):
            raise ValueError("shared_model must hold the shared parameters only: its releases belong "
                             "in the shards' models")
        discrete = [rv.name for rv in model.free_RVs if rv.type.dtype.startswith(("int", "uint", "bool"))]
        if discrete:
            raise ValueError(f"shared_model's free variables must be continuous; {discrete} are not")
        if not model.free_RVs:
            raise ValueError("shared_model has no free variables: nothing is shared")
        self.model = model
        self.compiled = compiled_engine.compiled_model_for(model, [], [])
        self.env = self.compiled.environment(np.zeros(0, np.int64))
        self.grad = np.empty(self.compiled.n)
        values = self.compiled.expand(np.zeros((1, self.compiled.n)), np.zeros((1, 0), np.int64))
        self.shapes = {rv.name: np.shape(values[rv.name][0]) for rv in model.free_RVs}
        self._theta, self._no_counts = self.compiled.values_function(list(self.shapes)), np.zeros(0, np.int64)
        self.summary_names = [d.name for d in model.data_vars if d.name not in given]
        if not self.summary_names:
            raise ValueError("shared_model has no pm.Data: the shards' summaries it conditions on "
                             "must be pm.Data of the Deterministics' names")
        self._positions = {}
        for name in self.summary_names:
            positions = self.compiled.data.positions(name)
            if not positions:
                raise ValueError(f"shared_model's log density does not use its pm.Data {name!r}")
            shape = self.compiled.data.values[positions[0]].shape
            if not shape or shape[0] != n_groups:
                raise ValueError(f"shared_model's pm.Data {name!r} has shape {shape}; its first axis "
                                 f"must run over the {n_groups} groups")
            self._positions[name] = positions

    def set_given(self, name: str, value) -> None:
        """Write the pm.Data ``name``, one of ``given``: data the caller sets, not the shards'
        summaries (the split concentrations of :mod:`dpinfer.io.nmf.state_scan`'s estimate)."""
        for j in self.compiled.data.positions(name):
            self.compiled.data.values[j][...] = value

    def theta(self, q: np.ndarray) -> dict:
        """The shared parameters' constrained values at q (name -> array)."""
        return {name: np.asarray(v, dtype=float) for name, v in zip(self.shapes, self._theta(q, self._no_counts))}

    def set_summaries(self, summaries: dict) -> None:
        data = self.compiled.data.values
        for name, positions in self._positions.items():
            value = summaries[name]
            if value.shape != data[positions[0]].shape:
                raise ValueError(f"the shards' summary {name!r} joins to shape {value.shape}; shared_model's "
                                 f"pm.Data has {data[positions[0]].shape}")
            for j in positions:
                data[j][...] = value

    def stepper(self, settings: dict, tune: int, draws: int, seed, q0: np.ndarray, state=None) -> Stepper:
        """A chain of NUTS on the shared parameters (no counts), from ``state`` (a checkpoint's)
        or fresh at ``q0`` with its random stream from ``seed``; ``settings`` the compiled
        engine's."""
        compiled = self.compiled
        state = state or fresh_state(compiled, len(NUTS_STATS), draws=draws, rng=np.random.default_rng(seed), q0=q0,
                                     counts0=np.zeros(0, np.int64), target_accept=settings["target_accept"])
        return Stepper(compiled, [], state, tune=tune, draws=draws, max_tree_depth=settings["max_treedepth"],
                       nuts_per_sweep=settings["nuts_per_sweep"], counts_per_sweep=settings["counts_per_sweep"])

    def log_density(self, q: np.ndarray) -> float:
        return float(log_density_at(self.compiled.logp_grad_address, np.array(q, dtype=float), self.grad,
                                    self.env))


class _Fit:
    """A sharded fit with given windows: its shards (actors or local objects), the driver's
    chains, and the sweeps with their checkpoints and the recovery from a lost worker."""

    def __init__(self, driver: "SharedModel", build_shard, parts: list, options: dict, *, client, workers: list,
                 store, shard_seeds: list, driver_seeds: list, starts_q: list, progressbar: bool):
        self.driver, self.build_shard, self.parts, self.options = driver, build_shard, parts, options
        self.client, self.workers, self.store = client, workers, store
        self.shard_seeds, self.driver_seeds, self.starts_q = shard_seeds, driver_seeds, starts_q
        self.progressbar = progressbar
        self.total = options["tune"] + options["draws"]
        self.recoveries = []  # recovery.announce's entries, in order

    def start(self, widenings: list, sweep: int = 0) -> None:
        """Build the shards (on the workers alive) and the driver's chains, fresh or, for
        ``sweep`` > 0, from the checkpoint of that sweep; the summaries at their states."""
        self.widenings = widenings
        if sweep == 0 and self.store is not None:
            self.store.clear()  # an abandoned fit's (before a widening) must not be resumed
        if self.progressbar and sweep == 0:
            n, on = len(self.parts), f" on {len(self.workers)} workers" if self.client is not None else ""
            print(f"dpinfer: building {n} shard{'s' * (n > 1)} of {sum(map(len, self.parts))} groups{on}",
                  file=sys.stderr, flush=True)
        restore = self.store.shard_paths(sweep) if sweep else [None] * len(self.parts)
        if self.client is None:
            self.shards = [Shard(self.build_shard, part, seeds=s, widenings=w, restore=r, **self.options)
                           for part, s, w, r in zip(self.parts, self.shard_seeds, widenings, restore)]
        else:
            futures = [self.client.submit(Shard, self.build_shard, part, seeds=s, widenings=w, restore=r, actor=True,
                                          workers=[self.workers[k % len(self.workers)]], allow_other_workers=False,
                                          **self.options)
                       for k, (part, s, w, r) in enumerate(zip(self.parts, self.shard_seeds, widenings, restore))]
            self.shards = [f.result() for f in futures]
        self.infos = _call(self.shards, "info")
        states = self.store.driver_states(sweep) if sweep else [None] * len(self.driver_seeds)
        settings = self.options["settings"]
        self.steppers = [self.driver.stepper(settings, self.options["tune"], self.options["draws"], seed, q0, state)
                         for state, seed, q0 in zip(states, self.driver_seeds, self.starts_q)]
        self.summaries = _joined(_call(self.shards, "start", [self.driver.theta(s.state.q) for s in self.steppers]))
        self.done = sweep

    @property
    def bytes_per_sweep(self) -> int:
        """Shared values out to every shard and summaries back, every chain (array payload)."""
        theta = self.driver.theta(self.steppers[0].state.q)
        return int((len(self.shards) * sum(v.nbytes for v in theta.values())
                    + sum(v.nbytes for v in self.summaries[0].values())) * len(self.steppers))

    def run(self) -> list:
        """The sweeps (module docstring), then every shard's :meth:`Shard.finish`."""
        progress = Progress(self.total, "dpinfer: sharded sampling", self.progressbar,
                            status=lambda: _alive(self.client, len(self.parts)))
        began, recoveries = time.perf_counter(), 0
        self._began, self.first_sweep_seconds = began, None
        while self.done < self.total:
            try:
                self._sweeps(progress)
            except Exception as err:  # a lost worker: carry on from the last checkpoint
                lost = _lost_workers(self.client, self.workers)
                if not lost or self.store is None or recoveries == MAX_RECOVERIES:
                    if lost and self.store is None:
                        raise RuntimeError(f"dpinfer.sample_sharded: the workers {lost} were lost at sweep "
                                           f"{self.done} (pass checkpoint= to carry on from a checkpoint)") from err
                    raise
                recoveries += 1
                self.workers = _workers(self.client, wait=True)
                sweep = self.store.latest()
                recovery.announce(self.recoveries, "lost workers", f"dpinfer: lost the workers {lost} at sweep "
                                  f"{self.done}; carrying on from the checkpoint at sweep {sweep} on the "
                                  f"{len(self.workers)} workers alive", workers=[str(w) for w in lost],
                                  lost_at_sweep=int(self.done), resumed_at_sweep=int(sweep),
                                  workers_alive=len(self.workers))
                self.start(self.widenings, sweep)
                progress.done = sweep
        self.sampling_seconds = time.perf_counter() - began
        self.progress_line = progress.line(self.sampling_seconds)  # the run's last, for the report
        needed = any(info["theta_dependent"] for info in self.infos)
        return _call(self.shards, "finish", self._theta_draws() if needed else None)

    def _theta_draws(self) -> dict:
        """The shared parameters' stored draws, name -> (chains, draws, ...): what the shards'
        Deterministics that depend on them are computed from (:meth:`Shard.finish`)."""
        per_chain = [[self.driver.theta(q) for q in s.state.draws_q] for s in self.steppers]
        return {name: np.stack([np.stack([t[name] for t in chain]) for chain in per_chain])
                for name in per_chain[0][0]}

    def _sweeps(self, progress) -> None:
        while self.done < self.total:
            thetas = []
            for c, stepper in enumerate(self.steppers):
                self.driver.set_summaries(self.summaries[c])
                stepper.advance(stepper.state.done + 1)
                thetas.append(self.driver.theta(stepper.state.q))
            self.summaries = _joined(_call(self.shards, "sweep", thetas))
            self.done += 1
            if self.first_sweep_seconds is None:  # the first: kernels loaded (or compiled) everywhere
                self.first_sweep_seconds = time.perf_counter() - self._began
            progress.advance()
            if self.store is not None and self.done % self.store.every == 0 and self.done < self.total:
                self.store.save(self.shards, self.steppers, self.done)


class _SweepCheckpoints(RoundCheckpoints):
    """A sharded fit's checkpoint directory (``sample_sharded``'s ``checkpoint``;
    :class:`~dpinfer.inference.checkpoint.RoundCheckpoints`): every ``every`` sweeps a
    ``sweep-<n>`` directory with the driver's chains (``shared``) and each shard's
    (``shard-<k>``), :class:`~dpinfer.inference.checkpoint.Checkpoint`'s files.
    ``checkpoint.json`` records what the fit is (versions, the shared model's hash, settings,
    the shards' groups, the seed's entropy) and the widenings made so far, so that a new driver
    can resume it (:meth:`open`)."""

    ROUND, KIND = "sweep", "sharded dpinfer"

    def __init__(self, path, every: int, identity: dict):
        super().__init__(path, every, identity)
        self.n_shards = len(identity["shards"])
        self.driver_hash = identity["model"]

    @staticmethod
    def driver_hash_of(driver: "SharedModel") -> str:
        return model_hash(driver.compiled.key, driver.compiled.data.values, np.zeros(0, np.int64))

    @classmethod
    def create(cls, path, every: int, identity: dict) -> "_SweepCheckpoints":
        """A new checkpoint directory at ``path`` (absent or empty), no widening made yet."""
        return super().create(path, every, dict(identity, widenings=[]))

    @classmethod
    def open(cls, path, every: int, identity: dict) -> "_SweepCheckpoints":
        """The checkpoint at ``path`` to resume, after checking that it is this fit's
        (:class:`CheckpointMismatchError` naming every difference)."""
        stored = cls.read(path)
        shards = ([f"its shards hold the groups {_runs(stored['shards'])}, now {_runs(identity['shards'])} (give "
                   "the same groups, shards and weights)"] if stored["shards"] != identity["shards"] else [])
        check_same_fit(path, stored, identity, "its shared model is another (its structure or data hash differently)",
                       shards)
        return cls(path, every, stored)

    @classmethod
    def read(cls, path) -> dict:
        stored = super().read(path)
        if "entropy" not in stored:
            raise CheckpointMismatchError(f"resume={str(path)!r} was written by a dpinfer that could not resume "
                                          "a sharded fit; start it again with checkpoint=")
        return stored

    def widened(self, failed: dict, counts: dict) -> None:
        """Note a widening before the fit starts again: shard -> {latent: bound}, and shard ->
        {latent: the (leaf, cell) pairs widened alone}."""
        self.identity["widenings"].append({str(k): {n: float(b) for n, b in f.items()} for k, f in failed.items()})
        self.identity.setdefault("widened_counts", []).append(
            {str(k): {n: [[int(i) for i in pair] for pair in c] for n, c in near.items()} for k, near in counts.items()})
        self._write_identity()

    def widening_rounds(self) -> list[tuple]:
        """The widenings made so far, in order: (shard -> {latent: bound}, shard -> {latent:
        counts widened alone})."""
        rounds = self.identity["widenings"]
        counts = self.identity.get("widened_counts", [{}] * len(rounds))
        return [({int(k): f for k, f in failed.items()}, {int(k): c for k, c in near.items()})
                for failed, near in zip(rounds, counts)]

    def shard_paths(self, sweep: int) -> list | None:
        return None if sweep == 0 else [str(self.round_dir(sweep) / f"shard-{k}") for k in range(self.n_shards)]

    def save(self, shard_list: list, steppers: list, sweep: int) -> None:
        """Every shard's chains (each written by its own worker), then the driver's."""
        _call_each(shard_list, "save", self.shard_paths(sweep))
        shared = self.round_dir(sweep) / "shared"
        shared.mkdir(mode=0o700, parents=True, exist_ok=True)
        checkpoint = Checkpoint(shared, {"model": self.driver_hash}, 0)
        for c, stepper in enumerate(steppers):
            checkpoint.save(c, stepper.state)
        self.commit(sweep)

    def driver_states(self, sweep: int) -> list | None:
        if sweep == 0:
            return None
        checkpoint = Checkpoint(self.round_dir(sweep) / "shared", {"model": self.driver_hash}, 0)
        states, c = [], 0
        while checkpoint.chain_file(c).exists():
            states.append(checkpoint.load(c))
            c += 1
        return states


def check_shared_model(driver: SharedModel, shard_list: list, qs: tuple, thetas: tuple, seed: int) -> None:
    """Refuse a shared model that is not theta's conditional given the summaries (module
    docstring): its change between ``thetas`` (at the unconstrained ``qs``) less the shards'
    must not depend on the local parameters' state."""
    logs = _call(shard_list, "log_densities", list(thetas), seed)
    gaps, scale = [], 1.0
    for k in (0, 1):
        driver.set_summaries(joined_summaries([log["summaries"][k] for log in logs]))
        shared = driver.log_density(qs[0]) - driver.log_density(qs[1])
        local = sum(log["log_density"][k][0] - log["log_density"][k][1] for log in logs)
        gaps.append(shared - local)
        scale = max(scale, abs(shared), abs(local))
    if not all(map(math.isfinite, gaps)):
        raise ValueError("the shared model's check found a log density that is not finite (the shared "
                         "parameters' starts must be in every shard model's support)")
    if abs(gaps[0] - gaps[1]) > CHECK_RTOL * scale:
        raise ValueError(
            "shared_model is not the shared parameters' conditional given the summaries: between two "
            f"values of them its log density changes by {gaps[0]:.6g} more than the shards' at one state "
            f"of the local parameters and by {gaps[1]:.6g} more at another, and the two must agree (both "
            "are the change of the prior of the shared parameters). Check that every term of the "
            "local parameters' prior that involves the shared parameters is in shared_model, written "
            f"through the summaries {driver.summary_names}, and that the summaries are sufficient")


def _runs(shards: list) -> str:
    return "; ".join(f"[{part[0]} .. {part[-1]}]" if len(part) > 2 else f"{part}" for part in shards)


def checked_options(options: dict, caller: str = "sample_sharded") -> dict:
    """The NUTS and sweep options of a sharded fit (``caller`` names it in the error): only
    these four, with valid values."""
    unknown = sorted(set(options) - {"target_accept", "max_treedepth", "nuts_per_sweep", "counts_per_sweep"})
    if unknown:
        raise TypeError(f"{caller} got {unknown}; it takes target_accept, max_treedepth, "
                        "nuts_per_sweep and counts_per_sweep")
    check_sampler_options(options)
    return options


def partition_groups(groups: list, n_shards: int, weights) -> list[list]:
    """Contiguous runs of ``groups``, each split where the cumulative weight comes nearest to
    an equal share (every shard at least one group)."""
    w = np.ones(len(groups)) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (len(groups),) or np.any(~np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"weights must be {len(groups)} positive numbers, one per group")
    cum = np.concatenate([[0.0], np.cumsum(w)])
    bounds = [0]
    for k in range(1, n_shards):
        split = int(np.argmin(np.abs(cum - k * cum[-1] / n_shards)))
        bounds.append(min(max(split, bounds[-1] + 1), len(groups) - (n_shards - k)))
    bounds.append(len(groups))
    return [groups[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _workers(client, wait: bool = False) -> list:
    """The client's workers' addresses (sorted); ``wait``: up to WORKER_WAIT seconds for one."""
    if client is None:
        return []
    if wait:
        client.wait_for_workers(1, timeout=WORKER_WAIT)
    workers = sorted(client.scheduler_info(n_workers=-1).get("workers", {}))
    if not workers:
        raise ValueError("the Dask client has no workers")
    return workers


def _lost_workers(client, workers: list) -> list:
    """Those of ``workers`` the scheduler no longer has (asked for up to LOSS_WAIT seconds: it
    notices a dead worker when its connection closes)."""
    if client is None:
        return []
    deadline = time.monotonic() + LOSS_WAIT
    while True:
        alive = set(client.scheduler_info(n_workers=-1).get("workers", {}))
        lost = [w for w in workers if w not in alive]
        if lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.2)


def _call(shard_list: list, method: str, *args) -> list:
    """Every shard's ``method(*args)``, concurrently on actors."""
    results = [getattr(s, method)(*args) for s in shard_list]
    return [r.result() if hasattr(r, "result") else r for r in results]


def _call_each(shard_list: list, method: str, args: list) -> list:
    """Shard k's ``method(args[k])``, concurrently on actors."""
    results = [getattr(s, method)(a) for s, a in zip(shard_list, args)]
    return [r.result() if hasattr(r, "result") else r for r in results]


def _joined(per_shard: list) -> list[dict]:
    """Per chain, the summaries of every shard joined along the groups."""
    return [joined_summaries([shard[c] for shard in per_shard]) for c in range(len(per_shard[0]))]


def joined_summaries(parts: list[dict]) -> dict:
    """One chain's summaries of every shard (in order) joined along the groups."""
    return {name: np.concatenate([np.atleast_1d(p[name]) for p in parts]) for name in parts[0]}


def _alive(client, n_shards: int) -> str:
    if client is None:
        return f"{n_shards} shard{'s' * (n_shards > 1)} in this process"
    return f"{n_shards} shards, {len(client.scheduler_info().get('workers', {}))} workers alive"


def _datatree(driver: SharedModel, steppers: list, outputs: list, *, tune: int, chains: int):
    q = np.stack([s.state.draws_q for s in steppers])
    draws = q.shape[1]
    values = driver.compiled.expand(q.reshape(chains * draws, -1), np.zeros((chains * draws, 0), np.int64))
    coords = {"chain": np.arange(chains), "draw": np.arange(draws)}
    posterior = {}
    for name, value in values.items():
        if name in driver.summary_names:
            continue
        value = np.asarray(value).reshape((chains, draws, *np.shape(value)[1:]))
        dims = list(driver.model.named_vars_to_dims.get(name) or [f"{name}_dim_{i}" for i in range(value.ndim - 2)])
        for dim in dims:
            if driver.model.coords.get(dim) is not None:
                coords[dim] = np.asarray(driver.model.coords[dim])
        posterior[name] = xr.DataArray(value, dims=("chain", "draw", *dims))
    shared = xr.Dataset(posterior, coords=coords)
    local = [o["posterior"] for o in outputs]
    joined = {}
    for name in local[0].data_vars:
        arrays = [d[name] for d in local]
        dim = arrays[0].dims[2] if arrays[0].ndim > 2 else "shard"
        joined[name] = xr.concat(arrays, dim=dim, coords="minimal", compat="override", join="override")
    posterior = xr.merge([shared, xr.Dataset(joined)], compat="override", join="override")
    posterior.attrs = {"inference_library": "dpinfer", "tuning_steps": tune}
    stats = {}
    for j, name in enumerate(NUTS_STATS):
        stats[name] = (("chain", "draw"), np.stack([s.state.draws_stats[:, j] for s in steppers]))
    stats["diverging"] = (("chain", "draw"), stats["diverging"][1].astype(bool))
    for name in outputs[0]["sample_stats"].data_vars:
        value = np.stack([o["sample_stats"][name].values for o in outputs], axis=-1)
        stats[f"shard_{name}"] = (("chain", "draw", "shard"), value)
    if "shard_diverging" in stats:
        stats["diverging"] = (("chain", "draw"), stats["diverging"][1] | stats["shard_diverging"][1].any(axis=-1))
    return xr.DataTree.from_dict({
        "posterior": posterior,
        "sample_stats": xr.Dataset(stats, coords={"chain": coords["chain"], "draw": coords["draw"]}),
    })
