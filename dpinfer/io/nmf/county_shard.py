"""One shard of the sharded state scan (:mod:`dpinfer.io.nmf.state_scan`): a run of
counties, their counts at the leaves (a piece of the split sweep) and their leaf-size shapes
(NUTS on :func:`~dpinfer.io.nmf.county_sizes.county_shapes_model`), built where it runs (in
the driver's process or as a Dask actor on one worker). Between iterations it fills its
leaves' priors and its areas' group factors from its own leaf sizes, and, for the
empirical-Bayes estimate of the split concentrations, reads the score of its levels' splits
(:func:`~dpinfer.io.nmf.split_score.split_score`).
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import numpy as np

from dpinfer._kernel import kernel
from dpinfer.inference.checkpoint import replaced_privately
from dpinfer.inference.empirical_bayes import PROBE
from dpinfer.inference.shard import Shard
from dpinfer.io.nmf.county_sizes import SUMMARIES, county_leaves, county_shapes_model
from dpinfer.io.nmf.split_score import split_score
from dpinfer.lattice.nested.split import ShardCounts

SECONDS = ("build", "refill", "counts", "shapes")  # a shard's seconds, by step
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
        self.n_levels, self.county_level = len(groupings), county_level
        self._table_size = int(self.counts.gibbs.prior_start[-1])
        self.draws = []
        self.seconds = {"build": time.perf_counter() - began, "refill": 0.0, "counts": 0.0, "shapes": 0.0}
        self.timeline = []  # each iteration's seconds of (refill, counts, shapes) here
        self._so_far = [0.0, 0.0, 0.0]  # those steps' seconds up to the last iteration

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
        self.timeline.append(np.subtract(so_far, self._so_far))
        self._so_far = so_far
        return out

    def _write_counts(self) -> None:
        data = self.shapes.compiled.data.values
        for j in self._count_data:
            data[j][...] = self.counts.x

    def split_score(self, log_split, seed: int) -> tuple:
        """For the empirical-Bayes estimate of theta = ``log_split``, at the shard's counts and
        leaf sizes: the score and curvature of its levels' splits (those up to the counties';
        :func:`~dpinfer.io.nmf.split_score.split_score`), each (county_level + 1, n_cells), and
        the information about theta that flows through the counties' shapes, C of
        :mod:`dpinfer.inference.empirical_bayes` (sum_j H_j^2 / D_j over the shapes zeta_j):
        ((g(zeta + h w) - g(zeta)) / h)^2 with w = u sqrt(m), u Rademacher from ``seed`` and m
        the shapes' NUTS metric, their variances given the counts (1 / D)."""
        state = self.shapes.steppers[0].state
        groups = [index for _, index in self._levels[:self.county_level + 1]]
        theta = np.asarray(log_split, dtype=float)[:self.county_level + 1]
        v = self._leaf_effect(state.q, state.counts)[0]
        score, curvature = split_score(v, self.counts.x, groups, theta)
        u = np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), size=state.q.size)
        moved = self._leaf_effect(state.q + PROBE * u * np.sqrt(state.inv_mass), state.counts)[0]
        coupling = ((split_score(moved, self.counts.x, groups, theta)[0] - score) / PROBE) ** 2
        return score, curvature, coupling

    def restart(self, tune: int, draws: int) -> None:
        """The shapes' chain continued under a fresh warm-up of ``tune`` iterations, then
        ``draws`` kept (after the empirical-Bayes estimate: its point, metric and random stream
        carried over); the counts kept from then on."""
        self.shapes.restart(tune, draws)
        self.tune, self.draws = tune, []

    def save(self, path: str) -> None:
        """The shard's state between two iterations, into the directory ``path`` (owner-only):
        its counts, their random stream and statistics, the counts kept so far and its
        seconds (``counts.npz``, data only) and its shapes' chain (``shapes/``,
        :meth:`~dpinfer.inference.shard.Shard.save`). Everything else is refilled before it is
        read."""
        path = Path(path)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.shapes.save(str(path / "shapes"))
        kept = np.stack(self.draws) if self.draws else np.zeros((0,) + self.counts.x.shape, np.int32)
        with replaced_privately(path / "counts.npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, x=self.counts.x, stream=self.counts.stream, stats=self.counts.stats, kept=kept,
                         timeline=np.array(self.timeline).reshape(-1, 3), tune=self.tune,
                         seconds=np.array([self.seconds[k] for k in SECONDS]),
                         so_far=np.asarray(self._so_far, dtype=float))

    def restore(self, path: str) -> None:
        """Continue from the state :meth:`save` wrote to ``path`` (the same shard of the same
        scan, built from the same seeds)."""
        path = Path(path)
        with np.load(path / "counts.npz", allow_pickle=False) as saved:
            self.counts.set_counts(saved["x"])
            self.counts.stream[...] = saved["stream"]
            self.counts.stats[...] = saved["stats"]
            self.draws = list(saved["kept"])
            self.timeline = list(saved["timeline"])
            self.tune = int(saved["tune"])
            self.seconds.update(zip(SECONDS, saved["seconds"].tolist()))
            self._so_far = saved["so_far"].tolist()
        self.shapes.restore(str(path / "shapes"))

    def finish(self, thetas: dict) -> dict:
        """The kept counts (draws, n_leaves, n_cells) (None unless ``store_counts``), the leaf
        sizes' draws (from the shape model, at each draw's sizes ``thetas``) and the seconds spent."""
        posterior = self.shapes.finish(thetas)["posterior"]
        return {"counts": np.stack(self.draws) if self.draws else None,
                "leaf_effect": posterior["leaf_effect"].values[0], "seconds": dict(self.seconds),
                "timeline": np.array(self.timeline), "sweep_seconds": self.shapes.sweep_seconds}
