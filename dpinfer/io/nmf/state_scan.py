r"""A state's counts at blocks on workers, split by county: the census model's posterior given its
split concentrations, by a Gibbs scan whose every step runs on all the counties at once
(``docs/dev/sharded-blocks.md``).

The model is :func:`~dpinfer.io.nmf.model.census_model` with the leaf sizes written iid
(:mod:`dpinfer.io.nmf.county_sizes`: the same law of the shares and of every count) and the
split concentrations theta = ``log_split`` **given** (an estimate: the scan does not update
them yet). One iteration of the scan, each step an exact draw or a NUTS transition of its
block's full conditional, so the scan leaves the posterior given theta invariant:

1. **the counts** given the leaf sizes v: the split sweep
   (:class:`~dpinfer.lattice.nested.split.SplitGibbs`; a shard is a run of counties, the
   driver holds the state and the nation). Before it each shard fills its leaves' priors
   NB(mu_l, A_1[c] mu_l / M_1) and its areas' group factors (a, A, M) from its own sizes,
   mu_l = m0 exp(v_l) / U with U = sum over the state's leaves of exp(v) = sum_q exp(L_q),
   and the driver the upper areas' from the counties' sizes L; every factor is tilted towards
   its current sums, a county's by the state's tilt from the driver
   (:func:`~dpinfer.lattice.nested.terms.write_group_mixing`).
2. **each county's shape** given every county's size L: one NUTS transition in its shard
   (:func:`~dpinfer.io.nmf.county_sizes.county_shapes_model`, the counts as data);
3. **the sizes L and their scale s** given the shapes: one NUTS transition on the driver
   (:func:`~dpinfer.io.nmf.county_sizes.county_sizes_model`, from four summaries per county).

Between the driver and a shard travel, each iteration, the sizes and theta (a number a county
and a row a level), one message and one sum per direction of the split sweep, and the four
summaries; the counts and the shapes stay where they are drawn until the end. A shard runs in
this process or as a Dask actor on one worker.

What it does not do yet: update theta (the empirical-Bayes step), checkpoint, or carry on after
a lost worker (it stops with a RuntimeError naming the iteration); one chain per run of the scan
(``chains`` runs them one after another).
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import warnings

import numpy as np
import xarray as xr
from scipy.special import logsumexp

from dpinfer._kernel import kernel
from dpinfer._random_stream import new_stream
from dpinfer._validation import check_count, check_flag, check_probability, check_seed
from dpinfer.inference import convergence, planning
from dpinfer.inference.engines.compiled import engine as compiled_engine
from dpinfer.inference.engines.compiled.chains import NUTS_STATS
from dpinfer.inference.shard import Shard
from dpinfer.inference.sharded import SharedModel, checked_options, joined_summaries, partition_groups
from dpinfer.io.nmf.county_sizes import SUMMARIES, county_leaves, county_shapes_model, county_sizes_model
from dpinfer.io.nmf.model import ROOT_SHAPE, census_model, groupings_levels, root_mean, spine_groupings
from dpinfer.io.nmf.table import CensusTable
from dpinfer.lattice.nested.split import ShardCounts, SplitGibbs, gathered
from dpinfer.mechanisms.records import releases_of

SHAPE_DATA = ("county_log_size", "sd_leaf", "log_split")  # what the shards' shape models take each iteration


@kernel(nogil=True)
def negative_binomial_rows(box_lo, box_hi, prior_start, shape, mean, out):
    """The leaves' flat prior table: for each count i (flat, leaf * C + c), out[prior_start[i] + j]
    = log NB(box_lo[i] + j; mean[i], shape[i]) for j = 0 .. box_hi[i] - box_lo[i], the pmf of mean
    m and shape n

        log p(x) = lgamma(x + n) - lgamma(n) - lgamma(x + 1) + n log(n / (n + m)) + x log(m / (n + m)),

    at the box's low end, then along the box by p(x + 1) / p(x) = (x + n) / (x + 1) m / (n + m):
    one log an entry, where the same in numpy (three lgammas an entry and their temporaries)
    took most of a shard's refill (tests/test_state_scan.py checks it against scipy)."""
    for i in range(box_lo.size):
        n, m, lo = shape[i], mean[i], box_lo[i]
        log_q = math.log(m / (n + m))
        lp = math.lgamma(lo + n) - math.lgamma(n) - math.lgamma(lo + 1.0) + n * math.log(n / (n + m)) + lo * log_q
        start = prior_start[i]
        for j in range(box_hi[i] - lo + 1):
            out[start + j] = lp
            x = lo + j
            lp += math.log((x + n) / (x + 1.0)) + log_q


def _shapes_model(groupings, county_level, counts, log_split, n_counties, groups):
    """The shape model of the counties ``groups`` (:func:`county_shapes_model`, its data at
    placeholders: the scan writes the counts, sizes, scale and theta before every step)."""
    return county_shapes_model(groupings, county_level, np.asarray(groups, dtype=np.int64), counts, log_split,
                               np.zeros(n_counties), 1.0)


class CountyShard:
    """A run of counties of the scan (module docstring): their counts (a
    :class:`~dpinfer.lattice.nested.split.ShardCounts` of the split tree's shard ``sums`` on the
    boxes ``box_lo .. box_hi``, from ``x0``, with the group factors ``mixing``) and their shapes
    (a :class:`~dpinfer.inference.shard.Shard` of :func:`county_shapes_model`). ``groupings``
    and ``county_level`` as :func:`county_shapes_model`'s; ``m0``, ``root_shape`` the census
    model's; ``start`` the sizes, scale and theta of the first iteration. Built where it runs."""

    def __init__(self, sums, box_lo, box_hi, x0, mixing, groupings: list, county_level: int, counties, *,
                 m0: float, root_shape: float, seeds: tuple, tune: int, draws: int, settings: dict, tol: float,
                 start: dict, probe: dict, support=(0, None), store_counts: bool = True):
        began = time.perf_counter()
        self.counts = ShardCounts(sums, box_lo, box_hi, x0, None, seeds[0], support=support, mixing=mixing)
        counties = np.asarray(counties, dtype=np.int64)
        leaves, _ = county_leaves(groupings[county_level], counties)
        if leaves.size != sums.n_leaves:
            raise ValueError(f"the shard's tree has {sums.n_leaves} leaves, its counties {leaves.size}")
        n_counties = int(groupings[county_level].max()) + 1
        build = functools.partial(_shapes_model, groupings, county_level, np.asarray(x0, dtype=np.int64),
                                  np.asarray(start["log_split"], dtype=float), n_counties)
        shared = {name: np.shape(start[name]) for name in SHAPE_DATA}
        self.shapes = Shard(build, counties.tolist(), shared, list(SUMMARIES), chains=1, tune=tune, draws=draws,
                            seeds=[seeds[1]], starts=[start], probe=probe, tol=tol, settings=settings)
        compiled = self.shapes.compiled
        self._count_data = compiled.data.positions("counts")
        self._leaf_effect = compiled.values_function(["leaf_effect"])
        self.m0, self.root_shape, self.tune, self.store_counts = float(m0), float(root_shape), tune, store_counts
        # each level's groups of the shard's leaves, numbered here: a group whose area the shard
        # holds has all its leaves here (a single-county part of a state, e.g. its AIAN part,
        # may hold that part's state-level group as well as its county's)
        self._levels = [np.unique(g[leaves], return_inverse=True) for g in groupings]
        offsets = np.cumsum([0] + [int(g.max()) + 1 for g in groupings])
        self._group_level = np.searchsorted(offsets, mixing.groups, side="right") - 1
        self._group_index = np.array([np.searchsorted(self._levels[k][0], g - offsets[k])
                                      for g, k in zip(mixing.groups, self._group_level)], dtype=np.int64)
        self.n_levels = len(groupings)
        self._table_size = int(self.counts.gibbs.prior_start[-1])
        self.draws = []
        self.seconds = {"build": time.perf_counter() - began, "refill": 0.0, "counts": 0.0, "shapes": 0.0}
        self.timeline = []  # each iteration's seconds of (refill, counts, shapes) here

    def refill(self, shared: dict, log_U: float, outer) -> None:
        """Before the count sweep: the sizes, scale and theta ``shared`` into the shape model;
        the leaves' priors and the group factors from v = the shape model's leaf sizes, U
        (``log_U``) and theta; ``outer``: (A (C,), M, tilt (C,)) of the group above the shard's
        root, None at the root."""
        began = time.perf_counter()
        self.shapes.set_shared(shared)
        state = self.shapes.steppers[0].state
        v = np.asarray(self._leaf_effect(state.q, state.counts)[0], dtype=float)
        mu = self.m0 * np.exp(v - log_U)
        A = np.exp(np.asarray(shared["log_split"], dtype=float))
        M = [np.bincount(index, weights=mu, minlength=names.size) for names, index in self._levels]
        C = A.shape[1]
        shape = A[0][None, :] * (mu / M[0][self._levels[0][1]])[:, None]  # (n_leaves, C)
        g = self.counts.gibbs
        prior = np.empty(self._table_size)
        negative_binomial_rows(g.box_lo.reshape(-1), g.box_hi.reshape(-1), g.prior_start, shape.reshape(-1),
                               np.repeat(mu, C), prior)
        mixing = self.counts.mixing
        parameters = np.empty((mixing.groups.size, C, 3))
        outer_tilt = np.zeros(C)
        for i, (k, h, p) in enumerate(zip(self._group_level, self._group_index, mixing.group_parent)):
            Mg = M[k][h]
            if p >= 0:
                new = A[k + 1] * Mg / M[k + 1][self._group_index[p]]
            elif k == self.n_levels - 1:
                new = np.full(C, self.root_shape)
            else:
                if outer is None:
                    raise ValueError(f"the shard's group {int(mixing.groups[i])} has a parent outside the shard "
                                     "and the driver sent none")
                new = outer[0] * Mg / outer[1]
            parameters[i, :, 0], parameters[i, :, 1], parameters[i, :, 2] = new, A[k], Mg
        if outer is not None:
            outer_tilt = np.asarray(outer[2], dtype=float)
        self.counts.refill(prior, parameters, outer_tilt)
        self.seconds["refill"] += time.perf_counter() - began

    # the split sweep's halves (SplitGibbs.sweep calls these), timed: the shard's own work
    def begin_sweep(self, ptr, cells, signs):
        return self._timed(self.counts.begin_sweep, ptr, cells, signs)

    def split_then_message(self, root_sum, i: int):
        return self._timed(self.counts.split_then_message, root_sum, i)

    def end_sweep(self):
        return self._timed(self.counts.end_sweep)

    def _timed(self, method, *args):
        began = time.perf_counter()
        out = method(*args)
        self.seconds["counts"] += time.perf_counter() - began
        return out

    def root_sums(self) -> np.ndarray:
        return self.counts.root_sums()

    def start(self, shared: dict) -> dict:
        """The summaries at the start (the counts ``x0``)."""
        self._write_counts()
        return self.shapes.start([shared])[0]

    def sweep_shapes(self, shared: dict) -> dict:
        """The counties' shapes: one NUTS transition given the counts just drawn and ``shared``;
        the summaries after it. Keeps the counts of each iteration after tuning."""
        began = time.perf_counter()
        self._write_counts()
        out = self.shapes.sweep([shared])[0]
        if self.store_counts and self.shapes.steppers[0].state.done > self.tune:
            self.draws.append(self.counts.x.astype(np.int32))
        self.seconds["shapes"] += time.perf_counter() - began
        so_far = [self.seconds[step] for step in ("refill", "counts", "shapes")]
        self.timeline.append(np.subtract(so_far, self._so_far) if self.timeline else np.asarray(so_far))
        self._so_far = so_far
        return out

    def _write_counts(self) -> None:
        data = self.shapes.compiled.data.values
        for j in self._count_data:
            data[j][...] = self.counts.x

    def finish(self, thetas: dict) -> dict:
        """The kept counts (draws, n_leaves, n_cells) (None unless ``store_counts``), the leaf
        sizes' draws (from the shape model, at each draw's sizes ``thetas``) and the seconds spent."""
        posterior = self.shapes.finish(thetas)["posterior"]
        return {"counts": np.stack(self.draws) if self.draws else None,
                "leaf_effect": posterior["leaf_effect"].values[0], "seconds": dict(self.seconds),
                "timeline": np.array(self.timeline), "sweep_seconds": self.shapes.sweep_seconds}


class StateScan:
    """The scan of the module docstring for the census table ``table`` (Block leaves, or any
    leaves with the counties' level above) with the split concentrations ``log_split``
    (n_levels, n_cells), the levels of :func:`~dpinfer.io.nmf.model.spine_groupings`.

    ``level``: the spine level whose areas are shared out (runs of them per shard, of about
    equal numbers of leaves): "County", or a finer one (e.g. "Tract"). ``shards``: how many
    (default: the client's workers, or 1); a run is cut in two where its areas have different
    parents in the release's tree (e.g. a state's AIAN part and the rest), so there may be a
    few more (``parts``). ``client``: a ``distributed.Client``, each shard an
    actor on one of its workers; None: in this process. ``store_counts``: keep every draw of
    the counts (for small tables; the leaf sizes and county sizes are always kept)."""

    def __init__(self, table: CensusTable, log_split, *, level: str = "County", shards: int | None = None,
                 client=None, tol: float = 1e-10, store_counts: bool = True, progressbar: bool = True,
                 **sample_kwargs):
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
        theta = np.asarray(log_split, dtype=float) if np.asarray(log_split).dtype.kind in "iuf" else None
        if theta is None or theta.shape != (len(levels), n_cells) or not np.all(np.isfinite(theta)):
            raise ValueError(f"log_split must be finite numbers, a row per level {levels} and a column per cell "
                             f"({n_cells}); got {np.shape(log_split)}")
        self.table, self.theta, self.level = table, theta, level
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
        self.sizes_model = county_sizes_model(self.groupings, self.county_level, theta, start)
        self.driver = SharedModel(self.sizes_model, self.n_counties)

    def _upper_parameters(self, L: np.ndarray) -> dict:
        """(log U, each level's (A (groups, C), M (groups,)) above the counties') at the sizes L."""
        log_U = float(logsumexp(L))
        W = np.exp(L - log_U)
        out = {}
        for k in range(self.county_level + 1, len(self.groupings)):
            g = self._upper[k]
            out[k] = (np.exp(self.theta[k]), self.m0 * np.bincount(g, weights=W, minlength=int(g.max()) + 1))
        return log_U, out

    def _refill(self, shards, state, shared: dict) -> None:
        log_U, upper = self._upper_parameters(shared["county_log_size"])
        C = self.theta.shape[1]
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

    def run(self, draws: int = 1000, tune: int = 1000, chains: int = 2, random_seed: int | None = None) -> xr.DataTree:
        """``chains`` runs of the scan, one after another, each ``tune`` + ``draws`` iterations.
        Returns a DataTree: ``posterior`` with ``county_log_size`` (L), ``sd_leaf``,
        ``leaf_effect`` (v) and, with ``store_counts``, ``counts``; in ``posterior.attrs`` the
        seconds of each step (the count sweep, the shards' refills and shapes, the sizes) and
        the method; NUTS statistics of the sizes in ``sample_stats``. R-hat and ESS over
        everything drawn are checked as ``dpinfer.sample`` checks them (a ConvergenceWarning
        when short; ``posterior.attrs["dpinfer_convergence"]``), and counts that reached
        their boxes' edges are warned of (a RuntimeWarning)."""
        draws, tune, chains = (check_count(n, v, least) for n, v, least in
                               (("draws", draws, 1), ("tune", tune, 0), ("chains", chains, 1)))
        seed = check_seed(random_seed)
        runs = [self._run_chain(s, draws, tune, c) for c, s in enumerate(np.random.SeedSequence(seed).spawn(chains))]
        tree = _datatree(self, runs)
        edges = tree.posterior.attrs["open_box_edges_hit"]
        if edges:
            warnings.warn(f"dpinfer: the state scan's counts reached the edges of their boxes {edges} times: the "
                          "boxes (15 pilot sds around the least-squares fit) cut the draws there, so they are not "
                          "exact; such a table needs wider boxes (not yet an option of the scan)", RuntimeWarning,
                          stacklevel=2)
        names = ["county_log_size", "sd_leaf", "leaf_effect"] + (["counts"] if self.store_counts else [])
        result = convergence.check(tree, names, latents=["counts"])
        tree.posterior.attrs["dpinfer_convergence"] = json.dumps(result.as_dict())
        convergence.report(result, show=self.progressbar)
        return tree

    def _run_chain(self, seq: np.random.SeedSequence, draws: int, tune: int, chain: int) -> dict:
        driver_seed, probe_seed, count_seed, *shard_seeds = seq.spawn(3 + len(self.parts))
        compiled = self.driver.compiled
        q0 = compiled.initial_q(int(driver_seed.generate_state(1)[0]), self.sizes_model)
        probe_q = compiled.initial_q(int(probe_seed.generate_state(1)[0]), self.sizes_model)
        start = self.driver.theta(q0) | {"log_split": self.theta}
        probe = self.driver.theta(probe_q) | {"log_split": self.theta + 0.5}
        began = time.perf_counter()
        shards = self._shards([tuple(int(x) for x in s.generate_state(2)) for s in shard_seeds], start, probe,
                              tune, draws)
        build = time.perf_counter() - began
        self.driver.set_summaries(joined_summaries(gathered([sh.start(start) for sh in shards])))
        stepper = self.driver.stepper(self.settings, tune, draws, driver_seed.generate_state(1)[0], q0)
        top = self.gibbs.split.top
        x_top = np.array(gathered([sh.root_sums() for sh in shards]), dtype=np.int64).reshape(len(shards), -1)
        state = (x_top, top.area_sums(x_top), top.term_sums(x_top).astype(np.int64))
        work, stream = self.gibbs.top_workspace(), new_stream(np.random.default_rng(count_seed.generate_state(1)[0]))
        stats = np.zeros(3, np.int64)
        seconds = {"refill": 0.0, "counts": 0.0, "shapes": 0.0, "sizes": 0.0}
        failed, total = 0, tune + draws
        timeline = np.zeros((total, len(seconds)))  # each iteration's seconds of each step
        last = began = time.perf_counter()
        for i in range(total):
            shared = self.driver.theta(stepper.state.q) | {"log_split": self.theta}
            t0 = time.perf_counter()
            try:
                self._refill(shards, state, shared)
                t1 = time.perf_counter()
                failed += self.gibbs.sweep(shards, state, work, stream, stats)
                t2 = time.perf_counter()
                summaries = joined_summaries(gathered([sh.sweep_shapes(shared) for sh in shards]))
            except OSError as err:  # an actor's worker gone: the shard's counts and shapes with it
                if self.client is None:
                    raise
                raise RuntimeError(f"dpinfer: the state scan lost a shard's worker at iteration {i + 1} of chain "
                                   f"{chain} ({err}); the scan keeps no checkpoints yet, so this chain's "
                                   "iterations are lost: run it again") from err
            t3 = time.perf_counter()
            self.driver.set_summaries(summaries)
            stepper.advance(stepper.state.done + 1)
            t4 = time.perf_counter()
            timeline[i] = t1 - t0, t2 - t1, t3 - t2, t4 - t3
            for name, dt in zip(seconds, timeline[i]):
                seconds[name] += dt
            if self.progressbar and (t4 - last > 10.0 or i + 1 == total):
                last = t4
                print(f"dpinfer: state scan, chain {chain}: {i + 1}/{total} iterations, "
                      f"{(t4 - began) / (i + 1):.3g} s each", file=sys.stderr, flush=True)
        thetas = {name: np.stack([self.driver.theta(q)[name] for q in stepper.state.draws_q])[None]
                  for name in ("county_log_size", "sd_leaf")}
        outs = gathered([sh.finish(thetas | {"log_split": np.broadcast_to(self.theta, (1, draws) + self.theta.shape)})
                         for sh in shards])
        result = stepper.result(seconds["sizes"])
        return {"outs": outs, "thetas": {k: v[0] for k, v in thetas.items()}, "stats": result,
                "seconds": seconds | {"build": build}, "timeline": timeline, "failed": failed,
                "moves": int(stats[0]), "trimmed_edges_hit": int(stats[1]), "open_box_edges_hit": int(stats[2])}


def _datatree(scan: StateScan, runs: list) -> xr.DataTree:
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
    ds = xr.Dataset(posterior, coords={"chain": np.arange(len(runs)), "geocode": np.asarray(table.leaves),
                                       "cell": np.asarray(table.cells)})
    ds.attrs["method"] = ("sharded state scan given the split concentrations: the counts by the split sweep, "
                          "each county's leaf-size shape by NUTS in its shard, the counties' sizes and their "
                          "scale by NUTS on the driver (dpinfer.io.nmf.state_scan)")
    # JSON, a list over chains: each step's seconds in all, and each iteration's (the driver's
    # refill, counts, shapes, sizes; each shard's own refill, counts, shapes)
    ds.attrs["seconds"] = json.dumps([r["seconds"] | {"shards": [o["seconds"] for o in r["outs"]]} for r in runs])
    ds.attrs["timeline"] = json.dumps([{"driver": r["timeline"].tolist(),
                                        "shards": [o["timeline"].tolist() for o in r["outs"]]} for r in runs])
    for name in ("moves_without_mass", "trimmed_edges_hit", "open_box_edges_hit"):
        ds.attrs[name] = int(sum(r["failed" if name == "moves_without_mass" else name] for r in runs))
    stats = xr.Dataset({name: (("chain", "draw"), np.stack([r["stats"].stats[name] for r in runs]))
                        for name in NUTS_STATS})
    return xr.DataTree.from_dict({"posterior": ds, "sample_stats": stats})
