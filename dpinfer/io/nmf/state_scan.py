r"""A state's counts at blocks on workers, split by county: the census model's posterior at the
empirical-Bayes estimate of its split concentrations (or at given ones), by a Gibbs scan whose
every step runs on all the counties at once (``docs/dev/sharded-blocks.md``).

The model is :func:`~dpinfer.io.nmf.model.census_model` with the leaf sizes written iid
(:mod:`dpinfer.io.nmf.county_sizes`: the same law of the shares and of every count). One
iteration of the scan at the split concentrations theta = ``log_split``, each step an exact
draw or a NUTS transition of its block's full conditional, so the scan leaves the posterior
given theta invariant:

1. **the counts** given the leaf sizes v: the split sweep
   (:class:`~dpinfer.lattice.nested.split.SplitGibbs`; a shard is a run of counties,
   :class:`~dpinfer.io.nmf.county_shard.CountyShard`, the driver holds the state and the
   nation). Before it each shard fills its leaves' priors NB(mu_l, A_1[c] mu_l / M_1) and its
   areas' group factors (a, A, M) from its own sizes, mu_l = m0 exp(v_l) / U with U = sum over
   the state's leaves of exp(v) = sum_q exp(L_q), and the driver the upper areas' from the
   counties' sizes L; every factor is tilted towards its current sums, a county's by the
   state's tilt from the driver (:func:`~dpinfer.lattice.nested.terms.write_group_mixing`).
2. **each county's shape** given every county's size L: one NUTS transition in its shard
   (:func:`~dpinfer.io.nmf.county_sizes.county_shapes_model`, the counts as data);
3. **the sizes L and their scale s** given the shapes: one NUTS transition on the driver
   (:func:`~dpinfer.io.nmf.county_sizes.county_sizes_model`, from four summaries per county).

**Theta estimated** (``log_split=None``, the default): as ``dpinfer nmf`` does at blocks
(:func:`~dpinfer.io.nmf.model.empirical_bayes_settings`), theta at the mode of its marginal
posterior with the counts, the leaf sizes and their scale summed out, by the stochastic
approximation of :mod:`dpinfer.inference.empirical_bayes`
(:class:`~dpinfer.inference.empirical_bayes.StochasticApproximation`): each iteration every
chain makes one scan iteration at the current theta (the E-step), then reads the complete-data
score of theta and its curvature (:mod:`dpinfer.io.nmf.split_score`: each shard its levels up
to the counties', the driver the levels above from the counties' sizes and counts, summed)
and the information about theta flowing through the shapes and sizes drawn with the counts (a
probe along their NUTS metric); the chains' spread gives Louis's missing information. Then
the chains continue, after a warm-up (200 iterations by default: :data:`EMPIRICAL_BAYES`), at
the estimate: the posterior given it, which ignores theta's uncertainty (an approximation,
named in ``posterior.attrs``; compared with the one-machine estimate in the validation tier).
Unlike the one-machine estimate it does not average each cell's score over redrawings of that
cell (Rao-Blackwell), so it needs more iterations to meet the same tolerance (695 at 12
Iowa-shaped counties, where the default 1,000 is set: ``benchmarks/README.md``).

Between the driver and a shard travel, each iteration, the sizes and theta (a number a county
and a row a level), one message and one sum per direction of the split sweep, the four
summaries and, while theta is estimated, the shard's scores (three numbers a level and cell);
the counts and the shapes stay where they are drawn until the end. A shard runs in this
process or as a Dask actor on one worker; the chains advance in lock step, one after another
within an iteration.

Checkpoints (``run(checkpoint=...)``, :mod:`dpinfer.io.nmf.scan_checkpoint`) resume a scan that
stopped to the uninterrupted scan's draws. What it does not do yet: carry on by itself after a
lost worker (it stops with a RuntimeError naming the iteration and the checkpoint to resume).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import xarray as xr
from scipy.special import logsumexp

from dpinfer._random_stream import new_stream
from dpinfer._validation import check_count, check_flag, check_path, check_probability, check_seed
from dpinfer.inference import convergence, planning
from dpinfer.inference.checkpoint import Checkpoint, replaced_privately
from dpinfer.inference.empirical_bayes import PROBE, StochasticApproximation
from dpinfer.inference.engines.compiled import engine as compiled_engine
from dpinfer.inference.engines.compiled.chains import NUTS_STATS, continued_state
from dpinfer.inference.sample import unsettled
from dpinfer.inference.sharded import SharedModel, checked_options, joined_summaries, partition_groups
from dpinfer.io.nmf.county_shard import CountyShard
from dpinfer.io.nmf.county_sizes import SUMMARIES, county_leaves, county_sizes_model
from dpinfer.io.nmf.model import ROOT_SHAPE, census_model, groupings_levels, root_mean, spine_groupings
from dpinfer.io.nmf.scan_checkpoint import ScanCheckpoints, scan_identity
from dpinfer.io.nmf.split_score import PRIOR_MEAN, prior_terms, split_score
from dpinfer.io.nmf.table import CensusTable
from dpinfer.lattice.nested.split import SplitGibbs, gathered
from dpinfer.mechanisms.records import releases_of

# the empirical-Bayes estimate's settings (empirical_bayes=): dpinfer.sample's defaults but two.
# The warm-up after it, in which the shapes' and sizes' NUTS adapt their step sizes afresh: with
# dpinfer.sample's 20, on a 55-block state one of two chains sat all of its 500 draws in a
# block's second mode (empty, 2% of the posterior; R-hat 1.9), with 200 none did (R-hat 1.03).
# The iterations at most: without the one-machine estimate's Rao-Blackwell average it needs
# more; on 12 Iowa-shaped counties it settled after 695 (benchmarks/README.md)
EMPIRICAL_BAYES = {"tune": 200, "burn_in": 30, "max_iterations": 1000, "tolerance": 0.2}


class StateScan:
    """The scan of the module docstring for the census table ``table`` (Block leaves, or any
    leaves with the counties' level above) with the split concentrations ``log_split``
    (n_levels, n_cells), the levels of :func:`~dpinfer.io.nmf.model.spine_groupings`; None
    (the default): estimated by empirical Bayes, with the settings ``empirical_bayes``
    (``tune``, ``burn_in``, ``max_iterations``, ``tolerance``: :data:`EMPIRICAL_BAYES`).

    ``level``: the spine level whose areas are shared out (runs of them per shard, of about
    equal numbers of leaves): "County", or a finer one (e.g. "Tract"). ``shards``: how many
    (default: the client's workers, or 1); a run is cut in two where its areas have different
    parents in the release's tree (e.g. a state's AIAN part and the rest), so there may be a
    few more (``parts``). ``client``: a ``distributed.Client``, each shard an
    actor on one of its workers; None: in this process. ``store_counts``: keep every draw of
    the counts (for small tables; the leaf sizes and county sizes are always kept)."""

    def __init__(self, table: CensusTable, log_split=None, *, level: str = "County", shards: int | None = None,
                 client=None, tol: float = 1e-10, store_counts: bool = True, progressbar: bool = True,
                 empirical_bayes: dict | None = None, **sample_kwargs):
        if not isinstance(table, CensusTable):
            raise TypeError(f"table must be a CensusTable (census_table), got {type(table).__name__}")
        levels = groupings_levels(table)
        if not isinstance(level, str) or level not in levels:
            raise ValueError(f"level must be one of the table's spine levels above its leaves {levels}, got {level!r}")
        self.groupings = spine_groupings(table)
        self.county_level = levels.index(level)
        if self.county_level == len(levels) - 1:
            raise ValueError(f"level must be below the root ({levels[-1]}): its areas are the shards'")
        n_cells = len(table.cells)
        self.theta = None if log_split is None else _checked_theta(log_split, levels, n_cells)
        if empirical_bayes is not None and self.theta is not None:
            raise ValueError("empirical_bayes settings are for log_split=None (theta estimated); log_split was given")
        self.empirical_bayes = _empirical_bayes_settings(empirical_bayes or {})
        self.table, self.level = table, level
        if client is not None and not callable(getattr(client, "scheduler_info", None)):
            raise TypeError(f"client must be None or a dask.distributed.Client, got {client!r}")
        self.client, self.tol = client, check_probability(tol, "tol")
        self.store_counts, self.progressbar = check_flag("store_counts", store_counts), check_flag("progressbar",
                                                                                                  progressbar)
        self.settings = compiled_engine.settings(checked_options(sample_kwargs, "StateScan"))
        county = self.groupings[self.county_level]
        self.n_counties = int(county.max()) + 1
        n_shards = 1 if shards is None and client is None else shards
        if n_shards is None:
            n_shards = max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})))
        n_shards = check_count("shards", n_shards, 1)
        if n_shards > self.n_counties:
            raise ValueError(f"shards must be at most the number of {level} areas ({self.n_counties}), got {n_shards}")
        # the one-machine plan of the census model: the boxes, a start, the group factors' areas
        model = census_model(table)
        plan = planning.plan_model(model, releases_of(model), method="auto").latents[0]
        planning.first_windows([plan], tol, exact_tails=True, at_least={})
        gibbs = plan.window.gibbs
        self.support = plan.support
        self.x0 = plan.start.reshape(gibbs.box_lo.shape)
        offsets = np.cumsum([0] + [int(g.max()) + 1 for g in self.groupings])
        self.offsets = offsets
        county_areas = plan.mixing_areas[offsets[self.county_level]:offsets[self.county_level + 1]]
        # runs of about equal leaves, each cut where the tree's parent of the areas changes (a
        # state's AIAN and other parts hold counties apart): a shard's areas are one area's children
        runs = partition_groups(list(range(self.n_counties)), n_shards, np.bincount(county).astype(float))
        parent = gibbs.sums.parent[county_areas]
        self.parts = [np.array(piece, dtype=np.int64) for run in runs
                      for piece in np.split(np.array(run), np.flatnonzero(np.diff(parent[run])) + 1)]
        split = gibbs.sums.split([county_areas[p] for p in self.parts])
        self.gibbs = SplitGibbs(split, gibbs.box_lo, gibbs.box_hi, support=plan.support,
                                mixing=(plan.mixing_areas, plan.mixing_tables, plan.mixing_groups,
                                        plan.mixing_parents))
        for k, p in enumerate(self.parts):
            if not np.array_equal(split.shard_leaves[k], county_leaves(county, p)[0]):
                raise AssertionError("a shard's leaves are not its counties' (the tree and the groupings disagree)")
        self.m0 = root_mean(table)
        first = np.unique(county, return_index=True)[1]  # a leaf of each county
        self._upper = [g[first] for g in self.groupings]  # each county's group at every level
        # the upper areas' groups: (level, index in it, parent's index in the level above; -1 at the root)
        levels = np.searchsorted(offsets, self.gibbs.mixing_top.groups, side="right") - 1
        self._top_groups = [(int(k), int(g - offsets[k]), -1 if k == len(self.groupings) - 1 else
                             int(self._upper[k + 1][np.flatnonzero(self._upper[k] == g - offsets[k])[0]]))
                            for g, k in zip(self.gibbs.mixing_top.groups, levels)]
        start = {name: np.ones((self.n_counties, n_cells)) if name == "county_counts" else np.ones(self.n_counties)
                 for name in SUMMARIES}
        theta = np.full((len(self.groupings), n_cells), PRIOR_MEAN) if self.theta is None else self.theta
        self.sizes_model = county_sizes_model(self.groupings, self.county_level, theta, start, log_split_data=True)
        self.driver = SharedModel(self.sizes_model, self.n_counties, given=("log_split",))
        self._log_size_at = self.driver.compiled.slices[self.driver.compiled.names.index("county_log_size")]

    def _upper_parameters(self, L: np.ndarray, theta: np.ndarray) -> dict:
        """(log U, each level's (A (groups, C), M (groups,)) above the counties') at the sizes L."""
        log_U = float(logsumexp(L))
        W = np.exp(L - log_U)
        out = {}
        for k in range(self.county_level + 1, len(self.groupings)):
            g = self._upper[k]
            out[k] = (np.exp(theta[k]), self.m0 * np.bincount(g, weights=W, minlength=int(g.max()) + 1))
        return log_U, out

    def _refill(self, shards, state, shared: dict) -> None:
        log_U, upper = self._upper_parameters(shared["county_log_size"], shared["log_split"])
        C = shared["log_split"].shape[1]
        parameters = np.empty((len(self._top_groups), C, 3))
        for i, (k, h, parent) in enumerate(self._top_groups):
            A, M = upper[k][0], upper[k][1][h]
            new = np.full(C, ROOT_SHAPE) if parent < 0 else upper[k + 1][0] * M / upper[k + 1][1][parent]
            parameters[i, :, 0], parameters[i, :, 1], parameters[i, :, 2] = new, A, M
        tilts = self.gibbs.refill_top(state, parameters)
        outers = []
        for m, t in zip(self.gibbs.mixing_shards, tilts):
            if m.outer < 0:
                outers.append(None)
                continue
            k = int(np.searchsorted(self.offsets, m.outer, side="right") - 1)
            outers.append((upper[k][0], float(upper[k][1][m.outer - self.offsets[k]]), t))
        gathered([sh.refill(shared, log_U, o) for sh, o in zip(shards, outers)])

    def _shards(self, seeds, start: dict, probe: dict, tune: int, draws: int) -> list:
        split, g = self.gibbs.split, self.gibbs
        args = [(sums, g.box_lo[leaves], g.box_hi[leaves], self.x0[leaves], m, self.groupings, self.county_level,
                 part) for sums, leaves, m, part in zip(split.shards, split.shard_leaves, g.mixing_shards, self.parts)]
        options = dict(m0=self.m0, root_shape=ROOT_SHAPE, tune=tune, draws=draws, settings=self.settings,
                       tol=self.tol, start=start, probe=probe, support=self.support, store_counts=self.store_counts)
        if self.client is None:
            return [CountyShard(*a, seeds=s, **options) for a, s in zip(args, seeds)]
        workers = sorted(self.client.scheduler_info(n_workers=-1).get("workers", {}))
        futures = []
        for k, (a, s) in enumerate(zip(args, seeds)):  # the tree and boxes sent ahead, not in the task
            on = [workers[k % len(workers)]]
            futures.append(self.client.submit(CountyShard, *self.client.scatter(list(a), workers=on, hash=False),
                                              seeds=s,
                                              **options, actor=True, workers=on, allow_other_workers=False,
                                              pure=False))
        return [f.result() for f in futures]

    def run(self, draws: int = 1000, tune: int = 1000, chains: int = 2, random_seed: int | None = None, *,
            checkpoint=None, checkpoint_every: int = 100, resume=None) -> xr.DataTree:
        """``chains`` chains of the scan in lock step. With ``log_split`` given, ``tune`` +
        ``draws`` iterations at it. Else first the empirical-Bayes estimate of theta (module
        docstring; ``empirical_bayes`` settings: ``burn_in``, ``max_iterations``, ``tolerance``
        as :func:`~dpinfer.inference.empirical_bayes.estimate`'s), then, as ``dpinfer.sample``
        does, ``empirical_bayes["tune"]`` warm-up iterations (not ``tune``: the chains start
        near equilibrium given the estimate; the NUTS step sizes adapt afresh) and ``draws`` at
        the estimate.

        ``checkpoint``: a new or empty directory where every ``checkpoint_every`` iterations
        (the estimate's and the draws' counted together) the whole scan's state is written
        (:mod:`dpinfer.io.nmf.scan_checkpoint`; on a cluster, a directory the workers share).
        ``resume``: such a directory of a scan that stopped (interrupted, its driver killed, a
        worker lost): the same call with ``resume=`` in place of ``checkpoint=`` (``random_seed``
        may be left out) continues it from its last checkpoint, on this scan's client, and
        gives what the uninterrupted scan gives; it keeps saving there.

        Returns a DataTree: ``posterior`` with ``county_log_size`` (L), ``sd_leaf``,
        ``leaf_effect`` (v) and, with ``store_counts``, ``counts``; in ``posterior.attrs`` the
        estimate (``dpinfer_empirical_bayes``, as ``dpinfer.sample`` reports one), the seconds
        of each step (the count sweep, the shards' refills and shapes, the sizes) and the
        method; NUTS statistics of the sizes in ``sample_stats``. R-hat and ESS over everything
        drawn are checked as ``dpinfer.sample`` checks them, and an estimate that has not
        settled makes the verdict NOT CONVERGED (a ConvergenceWarning;
        ``posterior.attrs["dpinfer_convergence"]``); counts that reached their boxes' edges
        are warned of (a RuntimeWarning)."""
        draws, tune, chains = (check_count(n, v, least) for n, v, least in
                               (("draws", draws, 1), ("tune", tune, 0), ("chains", chains, 1)))
        checkpoint, resume = check_path("checkpoint", checkpoint), check_path("resume", resume)
        checkpoint_every = check_count("checkpoint_every", checkpoint_every, 1)
        if checkpoint is not None and resume is not None and checkpoint != resume:
            raise ValueError(f"give checkpoint= or resume=, not both (resume={str(resume)!r} keeps saving there)")
        if resume is not None and random_seed is None:  # the checkpointed scan's seed
            random_seed = ScanCheckpoints.stored_entropy(resume)
        seq = np.random.SeedSequence(check_seed(random_seed))
        identity = scan_identity(self.table, self._identity_settings(draws, tune, chains), seq.entropy)
        store = (None if checkpoint is None and resume is None else
                 ScanCheckpoints.open(resume, checkpoint_every, identity) if resume is not None else
                 ScanCheckpoints.create(checkpoint, checkpoint_every, identity))
        saved = store.load() if resume is not None else None
        resumed_at = saved[0] if saved is not None else None
        seqs, estimate, done = seq.spawn(chains), None, 0
        try:
            if self.theta is None:
                settings = self.empirical_bayes
                theta0 = np.full((len(self.groupings), len(self.table.cells)), PRIOR_MEAN)
                runs = [_ScanChain(self, s, theta0, settings["max_iterations"], draws, c) for c, s in enumerate(seqs)]
                if saved is None or saved[1]["phase"] == "estimate":
                    approximation = (StochasticApproximation(theta0.ravel(), chains, burn_in=settings["burn_in"],
                                                             max_iterations=settings["max_iterations"],
                                                             tolerance=settings["tolerance"])
                                     if saved is None else self._restored(store, saved, runs))
                    estimate = self._estimate(runs, theta0, approximation, store)
                    saved = None
                else:
                    estimate = saved[1]["estimate"]
                theta, tune = np.asarray(estimate["parameters"]["log_split"]), settings["tune"]
                for r in runs:
                    r.restart(tune, draws)
            else:
                theta = self.theta
                runs = [_ScanChain(self, s, theta, tune, draws, c) for c, s in enumerate(seqs)]
            if saved is not None:
                done = self._restored(store, saved, runs)
            before = estimate["iterations"] if estimate is not None else 0  # the estimate's, in the count
            total, began, last = tune + draws, time.perf_counter(), time.perf_counter()
            for i in range(done, total):
                for r in runs:
                    r.iterate(theta, before + i, store=store)
                if store is not None and (before + i + 1) % store.every == 0 and i + 1 < total:
                    store.save(before + i + 1, {"phase": "draws", "draw_iterations": i + 1, "estimate": estimate},
                               {}, runs)
                now = time.perf_counter()
                if self.progressbar and (now - last > 10.0 or i + 1 == total):
                    last = now
                    print(f"dpinfer: state scan, {chains} chain(s): {i + 1}/{total} iterations, "
                          f"{(now - began) / (i + 1 - done):.3g} s each", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            if store is not None:
                print(f"dpinfer: the state scan was interrupted; its checkpoint {str(store.path)!r} holds iteration "
                      f"{store.latest()}: run it again with resume={str(store.path)!r} to carry on",
                      file=sys.stderr, flush=True)
            raise
        tree = _datatree(self, [r.finish(theta) for r in runs], estimate)
        if resumed_at is not None:
            tree.posterior.attrs["resumed_at_iteration"] = int(resumed_at)
        edges = tree.posterior.attrs["open_box_edges_hit"]
        if edges:
            warnings.warn(f"dpinfer: the state scan's counts reached the edges of their boxes {edges} times: the "
                          "boxes (15 pilot sds around the least-squares fit) cut the draws there, so they are not "
                          "exact; such a table needs wider boxes (not yet an option of the scan)", RuntimeWarning,
                          stacklevel=2)
        names = ["county_log_size", "sd_leaf", "leaf_effect"] + (["counts"] if self.store_counts else [])
        subject = "counts, leaf sizes and their scale given the empirical-Bayes estimate of log_split" \
            if estimate is not None else "counts, leaf sizes and their scale given log_split"
        result = convergence.check(tree, names, subject=subject, latents=["counts"])
        if estimate is not None:
            result = dataclasses.replace(result, unsettled=unsettled(estimate))
        tree.posterior.attrs["dpinfer_convergence"] = json.dumps(result.as_dict())
        convergence.report(result, show=self.progressbar)
        return tree

    def _identity_settings(self, draws: int, tune: int, chains: int) -> dict:
        """What a checkpoint of this scan must share with the scan resuming it."""
        return {"level": self.level, "parts": [p.tolist() for p in self.parts],
                "log_split": None if self.theta is None else self.theta.tolist(),
                "empirical_bayes": self.empirical_bayes if self.theta is None else None,
                "sampler": {k: v for k, v in self.settings.items()}, "tol": self.tol,
                "store_counts": self.store_counts, "draws": draws, "tune": tune, "chains": chains}

    @staticmethod
    def _restored(store, saved: tuple, runs: list):
        """The chains ``runs`` continued from the checkpoint ``saved`` ((iteration, JSON,
        arrays)); returns the estimate's iterates (while estimating) or the draws' iterations
        done."""
        n, scan, arrays = saved
        for c, r in enumerate(runs):
            r.restore(store.chain_dir(n, c))
        if scan["phase"] == "estimate":
            return StochasticApproximation.restored(arrays)
        return int(scan["draw_iterations"])

    def _estimate(self, runs: list, theta0: np.ndarray, approximation: StochasticApproximation, store) -> dict:
        """The empirical-Bayes estimate of theta (module docstring) with the chains ``runs`` as
        its E-steps, from the iterates ``approximation``; its report, as ``dpinfer.sample``
        writes one. Checkpoints (``store``) every ``store.every`` iterations."""
        settings, began = self.empirical_bayes, time.perf_counter()
        last, first = began, approximation.t
        while not approximation.finished():
            theta = approximation.q.reshape(theta0.shape)
            scores = [r.iterate(theta, approximation.t, score=True, store=store) for r in runs]
            grads = np.array([g.ravel() for g, _, _ in scores])
            d = -np.mean([c.ravel() for _, c, _ in scores], axis=0)
            approximation.update(grads, d, coupling=np.mean([c.ravel() for _, _, c in scores], axis=0))
            if store is not None and approximation.t % store.every == 0 and not approximation.finished():
                store.save(approximation.t, {"phase": "estimate"}, approximation.saved(), runs)
            now = time.perf_counter()
            if self.progressbar and (now - last > 10.0 or approximation.finished()):
                last = now
                print(f"dpinfer: state scan, empirical Bayes of log_split: iteration {approximation.t} "
                      f"({approximation.phase}), {approximation.share:.0%} of the {theta.size} settled, "
                      f"{(now - began) / (approximation.t - first):.3g} s each", file=sys.stderr, flush=True)
        result = approximation.result()
        shape = theta0.shape

        def named(values):
            return {"log_split": np.asarray(values).reshape(shape).tolist()}

        return {"method": "empirical Bayes: log_split at its marginal posterior mode (the counts, leaf sizes and "
                          "their scale summed out, drawn by the scan in each E-step; stochastic-approximation "
                          "EM-gradient, dpinfer.inference.empirical_bayes, the score of every split reduced over "
                          "the shards), then held there: the posterior given it, which ignores its uncertainty",
                "uncertainty": "none", "drawn": ["leaf_effect", "county_log_size", "sd_leaf"],
                "parameters": named(result["q"]), "mc_se": named(result["mc_se"]),
                "posterior_sd": named(result["posterior_sd"]), "conditional_sd": named(result["conditional_sd"]),
                "settled": result["settled"], "tolerance": settings["tolerance"], "burn_in": result["burn_in"],
                "iterations": result["iterations"], "seconds": time.perf_counter() - began, "copies": 0,
                "rao_blackwellised": []}


class _ScanChain:
    """One chain of the scan: its shards (in this process or actors), the sizes' NUTS chain on
    the driver, the split sweep's top counts and random stream; advanced one iteration at a
    time, at the theta it is given."""

    def __init__(self, scan: StateScan, seq: np.random.SeedSequence, theta: np.ndarray, tune: int, draws: int,
                 chain: int):
        self.scan, self.chain, self.tune, self.draws = scan, chain, tune, draws
        driver_seed, probe_seed, count_seed, score_seed, *shard_seeds = seq.spawn(4 + len(scan.parts))
        compiled = scan.driver.compiled
        q0 = compiled.initial_q(int(driver_seed.generate_state(1)[0]), scan.sizes_model)
        probe_q = compiled.initial_q(int(probe_seed.generate_state(1)[0]), scan.sizes_model)
        start = scan.driver.theta(q0) | {"log_split": theta}
        probe = scan.driver.theta(probe_q) | {"log_split": theta + 0.5}
        began = time.perf_counter()
        self.shards = scan._shards([tuple(int(x) for x in s.generate_state(2)) for s in shard_seeds], start, probe,
                                   tune, draws)
        self.build = time.perf_counter() - began
        self.summaries = joined_summaries(gathered([sh.start(start) for sh in self.shards]))
        self.stepper = scan.driver.stepper(scan.settings, tune, draws, driver_seed.generate_state(1)[0], q0)
        top = scan.gibbs.split.top
        x_top = np.array(gathered([sh.root_sums() for sh in self.shards]), dtype=np.int64).reshape(len(self.shards),
                                                                                                     -1)
        self.state = (x_top, top.area_sums(x_top), top.term_sums(x_top).astype(np.int64))
        self.work = scan.gibbs.top_workspace()
        self.stream = new_stream(np.random.default_rng(count_seed.generate_state(1)[0]))
        self.score_rng = np.random.default_rng(score_seed)
        self.stats, self.failed = np.zeros(3, np.int64), 0
        self.seconds = {"refill": 0.0, "counts": 0.0, "shapes": 0.0, "sizes": 0.0, "scores": 0.0}
        self.timeline = []  # each iteration's seconds of each step

    def iterate(self, theta: np.ndarray, i: int, score: bool = False, store=None):
        """Iteration ``i`` (counted from 0 over the estimate's and the draws' together, as the
        checkpoints count them) at ``theta`` (module docstring). With ``score``, then the
        empirical-Bayes estimate's reading of it: (score, curvature, coupling), each the shape
        of theta, the prior's terms in the first two (:mod:`dpinfer.io.nmf.split_score`).
        ``store``: the scan's checkpoints, named if a worker is lost."""
        scan, driver = self.scan, self.scan.driver
        shared = driver.theta(self.stepper.state.q) | {"log_split": theta}
        t0 = time.perf_counter()
        try:
            scan._refill(self.shards, self.state, shared)
            t1 = time.perf_counter()
            self.failed += scan.gibbs.sweep(self.shards, self.state, self.work, self.stream, self.stats)
            t2 = time.perf_counter()
            self.summaries = joined_summaries(gathered([sh.sweep_shapes(shared) for sh in self.shards]))
            t3 = time.perf_counter()
            driver.set_summaries(self.summaries)  # the driver's model is every chain's: this chain's data
            driver.set_given("log_split", theta)
            self.stepper.advance(self.stepper.state.done + 1)
            t4 = time.perf_counter()
            read = self._scores(theta) if score else None
        except OSError as err:  # an actor's worker gone: the shard's counts and shapes with it
            if scan.client is None:
                raise
            if store is None:
                then = "the scan had no checkpoint (checkpoint=), so its iterations are lost: run it again"
            elif store.latest() == 0:
                then = "it had written no checkpoint yet: run it again"
            else:
                then = (f"its checkpoint holds iteration {store.latest()}: run it again with "
                        f"resume={str(store.path)!r} (the cluster's workers replaced) to carry on from there")
            raise RuntimeError(f"dpinfer: the state scan lost a shard's worker at iteration {i + 1} of chain "
                               f"{self.chain} ({err}); {then}") from err
        t5 = time.perf_counter()
        self.timeline.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4))
        for name, dt in zip(self.seconds, self.timeline[-1]):
            self.seconds[name] += dt
        return read

    def _scores(self, theta: np.ndarray) -> tuple:
        """(score, curvature, coupling) of theta at the chain's state: the shards' levels (up to
        the counties') from the shards, the levels above from the counties' sizes L and counts
        here, the prior's terms added (:mod:`dpinfer.io.nmf.split_score`; the coupling as
        :meth:`~dpinfer.io.nmf.county_shard.CountyShard.split_score`, through L with the sizes'
        NUTS metric)."""
        scan = self.scan
        k = scan.county_level + 1
        seeds = self.score_rng.integers(2**31, size=len(self.shards))
        parts = gathered([sh.split_score(theta, int(s)) for sh, s in zip(self.shards, seeds)])
        score, curvature = prior_terms(theta)
        coupling = np.zeros(theta.shape)
        for g, c, h in parts:
            score[:k] += g
            curvature[:k] += c
            coupling[:k] += h
        if k < theta.shape[0]:
            state = self.stepper.state
            groups, counts = scan._upper[k:], self.summaries["county_counts"]
            L = state.q[scan._log_size_at]
            g, c = split_score(L, counts, groups, theta[k:])
            u = self.score_rng.choice(np.array([-1.0, 1.0]), size=L.size)
            moved = L + PROBE * u * np.sqrt(state.inv_mass[scan._log_size_at])
            score[k:] += g
            curvature[k:] += c
            coupling[k:] += ((split_score(moved, counts, groups, theta[k:])[0] - g) / PROBE) ** 2
        return score, curvature, coupling

    def restart(self, tune: int, draws: int) -> None:
        """After the estimate: every chain of the shards and the driver continued under a fresh
        warm-up (:func:`~dpinfer.inference.engines.compiled.chains.continued_state`)."""
        gathered([sh.restart(tune, draws) for sh in self.shards])
        state = continued_state(self.scan.driver.compiled, self.stepper.state, len(NUTS_STATS), draws=draws)
        self.stepper = self.scan.driver.stepper(self.scan.settings, tune, draws, None, None, state=state)
        self.tune, self.draws = tune, draws

    def save(self, path: Path) -> None:
        """The chain's state between two iterations into the directory ``path``
        (:mod:`dpinfer.io.nmf.scan_checkpoint`): each shard's, written where it runs, and the
        driver's."""
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        gathered([sh.save(str(path / f"shard-{k}")) for k, sh in enumerate(self.shards)])
        (path / "driver").mkdir(mode=0o700, exist_ok=True)
        Checkpoint(path / "driver", {"model": "state scan driver"}, 0).save(0, self.stepper.state)
        with replaced_privately(path / "driver.npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, stream=self.stream, stats=self.stats, failed=self.failed,
                         timeline=np.array(self.timeline).reshape(-1, len(self.seconds)),
                         seconds=np.array(list(self.seconds.values())),
                         score_rng=np.array(json.dumps(self.score_rng.bit_generator.state)),
                         **{f"summary_{name}": value for name, value in self.summaries.items()})

    def restore(self, path: Path) -> None:
        """Continue from the state :meth:`save` wrote to ``path``: the shards' (each read where
        it runs), then the driver's, the split sweep's top counts from the shards' roots."""
        gathered([sh.restore(str(path / f"shard-{k}")) for k, sh in enumerate(self.shards)])
        state = Checkpoint(path / "driver", {"model": "state scan driver"}, 0).load(0)
        if state is None:
            raise FileNotFoundError(f"{path / 'driver'} holds no state of the scan's driver")
        self.stepper = self.scan.driver.stepper(self.scan.settings, self.tune, self.draws, None, None, state=state)
        with np.load(path / "driver.npz", allow_pickle=False) as saved:
            self.stream[...] = saved["stream"]
            self.stats[...] = saved["stats"]
            self.failed = int(saved["failed"])
            self.timeline = [tuple(row) for row in saved["timeline"]]
            self.seconds = dict(zip(self.seconds, saved["seconds"].tolist()))
            self.score_rng.bit_generator.state = json.loads(str(saved["score_rng"]))
            self.summaries = {name: saved[f"summary_{name}"] for name in self.summaries}
        top = self.scan.gibbs.split.top
        x_top = np.array(gathered([sh.root_sums() for sh in self.shards]), dtype=np.int64).reshape(len(self.shards),
                                                                                                     -1)
        self.state = (x_top, top.area_sums(x_top), top.term_sums(x_top).astype(np.int64))

    def finish(self, theta: np.ndarray) -> dict:
        """The chain's draws and records, gathered from its shards."""
        draws = self.stepper.state.draws_q.shape[0]
        driver = self.scan.driver
        thetas = {name: np.stack([driver.theta(q)[name] for q in self.stepper.state.draws_q])[None]
                  for name in ("county_log_size", "sd_leaf")}
        outs = gathered([sh.finish(thetas | {"log_split": np.broadcast_to(theta, (1, draws) + theta.shape)})
                         for sh in self.shards])
        result = self.stepper.result(self.seconds["sizes"])
        return {"outs": outs, "thetas": {k: v[0] for k, v in thetas.items()}, "stats": result,
                "seconds": self.seconds | {"build": self.build}, "timeline": np.array(self.timeline),
                "failed": self.failed, "moves": int(self.stats[0]), "trimmed_edges_hit": int(self.stats[1]),
                "open_box_edges_hit": int(self.stats[2])}


def _checked_theta(log_split, levels: list, n_cells: int) -> np.ndarray:
    theta = np.asarray(log_split, dtype=float) if np.asarray(log_split).dtype.kind in "iuf" else None
    if theta is None or theta.shape != (len(levels), n_cells) or not np.all(np.isfinite(theta)):
        raise ValueError(f"log_split must be None (estimated) or finite numbers, a row per level {levels} and a "
                         f"column per cell ({n_cells}); got {np.shape(log_split)}")
    return theta


def _empirical_bayes_settings(given: dict) -> dict:
    """``empirical_bayes=`` over EMPIRICAL_BAYES's defaults, checked by name."""
    if not isinstance(given, dict):
        raise TypeError(f"empirical_bayes must be a dict of settings {sorted(EMPIRICAL_BAYES)}, got {given!r}")
    unknown = sorted(set(given) - set(EMPIRICAL_BAYES))
    if unknown:
        raise ValueError(f"empirical_bayes got {unknown}; its settings are {sorted(EMPIRICAL_BAYES)}")
    out = EMPIRICAL_BAYES | given
    for name, least in (("tune", 0), ("burn_in", 1), ("max_iterations", 1)):
        out[name] = check_count(f"empirical_bayes[{name!r}]", out[name], least)
    if out["burn_in"] > out["max_iterations"]:
        raise ValueError(f"empirical_bayes['burn_in'] ({out['burn_in']}) must be at most max_iterations "
                         f"({out['max_iterations']})")
    tolerance = out["tolerance"]
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
            0 < tolerance < math.inf):
        raise ValueError(f"empirical_bayes['tolerance'] must be a number > 0, got {tolerance!r}")
    return out


def _datatree(scan: StateScan, runs: list, estimate: dict | None) -> xr.DataTree:
    table = scan.table
    leaves = scan.gibbs.split.shard_leaves
    n_leaves = sum(x.size for x in leaves)
    posterior = {
        "county_log_size": (("chain", "draw", "area"), np.stack([r["thetas"]["county_log_size"] for r in runs])),
        "sd_leaf": (("chain", "draw"), np.stack([r["thetas"]["sd_leaf"] for r in runs])),
    }
    effect = np.empty((len(runs), runs[0]["thetas"]["sd_leaf"].shape[0], n_leaves))
    for c, r in enumerate(runs):
        for rows, out in zip(leaves, r["outs"]):
            effect[c][:, rows] = out["leaf_effect"]
    posterior["leaf_effect"] = (("chain", "draw", "geocode"), effect)
    if scan.store_counts:
        counts = np.empty(effect.shape + (len(table.cells),), np.int32)
        for c, r in enumerate(runs):
            for rows, out in zip(leaves, r["outs"]):
                counts[c][:, rows] = out["counts"]
        posterior["counts"] = (("chain", "draw", "geocode", "cell"), counts)
    ds = xr.Dataset(posterior, coords={"chain": np.arange(len(runs))} | table.coords)
    ds.attrs["method"] = (f"sharded state scan given the split concentrations "
                          f"({'their empirical-Bayes estimate' if estimate is not None else 'as given'}): the counts "
                          "by the split sweep, each county's leaf-size shape by NUTS in its shard, the counties' "
                          "sizes and their scale by NUTS on the driver (dpinfer.io.nmf.state_scan)")
    if estimate is not None:
        ds.attrs["dpinfer_empirical_bayes"] = json.dumps(estimate)
    # JSON, a list over chains: each step's seconds in all, and each iteration's (the driver's
    # refill, counts, shapes, sizes, the estimate's scores; each shard's own refill, counts, shapes)
    ds.attrs["seconds"] = json.dumps([r["seconds"] | {"shards": [o["seconds"] for o in r["outs"]]} for r in runs])
    ds.attrs["timeline"] = json.dumps([{"driver": r["timeline"].tolist(),
                                        "shards": [o["timeline"].tolist() for o in r["outs"]]} for r in runs])
    for name in ("moves_without_mass", "trimmed_edges_hit", "open_box_edges_hit"):
        ds.attrs[name] = int(sum(r["failed" if name == "moves_without_mass" else name] for r in runs))
    stats = xr.Dataset({name: (("chain", "draw"), np.stack([r["stats"].stats[name] for r in runs]))
                        for name in NUTS_STATS})
    return xr.DataTree.from_dict({"posterior": ds, "sample_stats": stats})
