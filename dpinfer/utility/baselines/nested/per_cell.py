r"""The per-cell posterior of the tools that treat each published cell alone
(sbaldasty/noisyvalue and dpvalue): a flat prior on t in {0, 1, 2, ...}, the noise pmf of the
one measurement as likelihood, truncated at 0 and at the bounds published for that same cell;
median and equal-tailed interval, exactly from the pmf (:func:`per_cell_posterior`). A target
not published as one cell is the sum of its leaves' per-cell posteriors treated as independent,
by exact convolution (:func:`per_cell_posteriors` with ``aggregate``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import scipy.signal

from dpinfer.lattice.nested.structure import NestedSums
from dpinfer.utility.baselines.nested.inputs import _as_sums, _cell_mask
from dpinfer.utility.baselines.nested.targets import NestedTargets

__all__ = ["per_cell_posterior", "per_cell_posteriors"]

_TAIL_SDS = 12.0  # per-cell posterior support: the mode +- 12 sd (mass beyond < 1e-31)


def _table_log(meta, inv2v, values, k: int, e: np.ndarray) -> np.ndarray:
    """log w_k(e), vectorised (the rule of dpinfer.lattice.nested.terms.term_log)."""
    lo, n, off, left, right = meta[k]
    j = e - lo
    out = np.empty(e.shape, float)
    inside = (j >= 0) & (j < n)
    out[inside] = values[off + j[inside]]
    for side, mask, edge, mode in ((0, j < 0, lo, left), (1, j >= n, lo + n - 1, right)):
        if not np.any(mask):
            continue
        w = values[off + (0 if side == 0 else n - 1)]
        if mode == 0:
            out[mask] = -np.inf
        elif mode == 1:
            out[mask] = w
        else:
            ee = e[mask].astype(float)
            out[mask] = w - (ee * ee - float(edge) ** 2) * inv2v[k]
    return out


class _PerCell:
    """Per (area, cell set): the published measurement, equality and bounds of exactly that
    cell set, and the per-cell posterior (cached)."""

    def __init__(self, sums: NestedSums):
        self.sums = sums
        self.measured, self.equal, self.at_most, self.at_least, self.variance = sums.term_kinds()
        self.meta, self.inv2v, self.values = sums.tables.arrays()
        self.index: dict = {}
        for r in range(sums.term_area.size):
            self.index.setdefault((int(sums.term_area[r]), sums.term_cells[r].tobytes()), []).append(r)
        self.cache: dict = {}
        self.by_area: dict = {}
        for (v, key) in self.index:
            self.by_area.setdefault(v, []).append(key)

    def is_measured(self, area: int, mask: np.ndarray) -> bool:
        rows = self.index.get((int(area), mask.tobytes()), [])
        return any(self.measured[r] or self.equal[r] for r in rows)

    def posterior(self, area: int, mask: np.ndarray):
        key = (int(area), mask.tobytes())
        if key in self.cache:
            return self.cache[key]
        rows = self.index.get(key, [])
        lb, ub = 0, np.inf
        for r in rows:
            y = int(self.sums.term_value[r])
            if self.equal[r]:
                lb, ub = max(lb, y), min(ub, y)
            elif self.at_most[r]:
                ub = min(ub, y)
            elif self.at_least[r]:
                lb = max(lb, y)
        meas = [r for r in rows if self.measured[r]]
        if lb > ub:
            raise ValueError(f"the bounds published for area {area}'s cell set contradict each other")
        if lb == ub:
            out = (int(lb), np.ones(1))
        elif not meas:
            raise ValueError(f"area {area}'s cell set {np.flatnonzero(mask).tolist()} is not measured")
        else:
            r = min(meas, key=lambda q: (self.variance[q], q))  # the most precise publication
            y = int(self.sums.term_value[r])
            half = math.ceil(_TAIL_SDS * math.sqrt(self.variance[r])) + 2
            mode = min(max(y, lb), ub)
            lo = int(max(lb, mode - half))
            hi = int(min(ub, mode + half))
            t = np.arange(lo, hi + 1, dtype=np.int64)
            logp = _table_log(self.meta, self.inv2v, self.values, int(self.sums.term_table[r]), y - t)
            p = np.exp(logp - np.max(logp))
            out = (lo, p / p.sum())
        self.cache[key] = out
        return out

    def units(self, leaf_area: int, mask: np.ndarray):
        """Measured cell sets at a leaf area partitioning ``mask``: singletons first, then the
        smallest measured subsets, greedily (ValueError when they do not cover it)."""
        need = mask.copy()
        chosen = []
        for c in np.flatnonzero(mask):
            single = np.zeros_like(mask)
            single[c] = True
            if self.is_measured(leaf_area, single):
                chosen.append(single)
                need[c] = False
        if need.any():
            cands = []
            for key in self.by_area.get(int(leaf_area), []):
                m = np.frombuffer(key, dtype=bool)
                if m.sum() > 1 and not np.any(m & ~need) and self.is_measured(leaf_area, m):
                    cands.append(m)
            for m in sorted(cands, key=lambda q: int(q.sum())):
                if not np.any(m & ~need):
                    chosen.append(m.copy())
                    need &= ~m
            if need.any():
                raise ValueError(f"leaf area {leaf_area}: cells {np.flatnonzero(need).tolist()} are not a union of "
                                 "published cells there")
        return chosen


def per_cell_posterior(release, area: int, cells) -> tuple[int, np.ndarray]:
    r"""The per-cell posterior of one published (area, cell set), as sbaldasty/noisyvalue and
    dpvalue compute it: flat prior on t in {0, 1, ...}, the one measurement's noise pmf as
    likelihood, truncated at 0 and the bounds published for the same cell set,

        p(t | y) = f(y - t) 1{max(0, lower) <= t <= upper} / sum_s f(y - s) 1{...}

    (f the discrete Gaussian pmf, or that of the sum of ``summed`` of them), summed exactly over
    the mode -+ 12 sd (the mass beyond is below 1e-31, under double rounding). An equality publishes the
    value itself (a point mass); of several measurements of the same cell set the most precise
    is used. Returns (lo, pmf): pmf[j] = p(lo + j | y)."""
    sums = _as_sums(release)
    return _PerCell(sums).posterior(int(area), _cell_mask(cells, sums.n_cells))


def _quantile(lo: int, cdf: np.ndarray, p) -> np.ndarray:
    """q(p) = min{t : F(t) >= p} (tolerant to rounding in F)."""
    return lo + np.minimum(np.searchsorted(cdf, np.asarray(p) - 1e-12, side="left"), cdf.size - 1)


def _convolve_all(parts: list) -> tuple[int, np.ndarray]:
    """The law of a sum of independent integer variables, each (lo, pmf), by balanced pairwise
    convolution: direct (``numpy.convolve``, sums of non-negative terms) up to 10^6 products,
    FFT beyond (entries below 1e-16 of the peak, FFT rounding, set to 0); tails of cumulative
    mass < 1e-20 trimmed after every step."""
    parts = list(parts)
    if not parts:
        return 0, np.ones(1)
    while len(parts) > 1:
        nxt = []
        for i in range(0, len(parts) - 1, 2):
            (l1, p1), (l2, p2) = parts[i], parts[i + 1]
            if p1.size * p2.size <= 1_000_000:
                p = np.convolve(p1, p2)
            else:
                p = scipy.signal.fftconvolve(p1, p2)
                p[p < 1e-16 * p.max()] = 0.0
            p = p / p.sum()
            first = int(np.searchsorted(np.cumsum(p), 1e-20, side="left"))
            last = p.size - 1 - int(np.searchsorted(np.cumsum(p[::-1]), 1e-20, side="left"))
            first, last = min(first, p.size - 1), max(last, min(first, p.size - 1))
            p = p[first:last + 1]
            nxt.append((l1 + l2 + first, p / p.sum()))
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def _scaled(lo: int, pmf: np.ndarray, w: int) -> tuple[int, np.ndarray]:
    """The law of w T for T ~ (lo, pmf), w a non-zero integer."""
    if w == 1:
        return lo, pmf
    if w < 0:
        lo, pmf = -(lo + pmf.size - 1), pmf[::-1]
        w = -w
    out = np.zeros((pmf.size - 1) * w + 1)
    out[::w] = pmf
    return lo * w, out


def _leaf_units(pc: _PerCell, sums, num_row, den_row):
    """The published leaf cell sets a target sums, with the weights (w_num, w_den) of each."""
    C = sums.n_cells
    weights: dict = {}
    for row, slot in ((num_row, 0), (den_row, 1)):
        for col, w in zip(row.indices, row.data):
            weights.setdefault(int(col), [0, 0])[slot] = int(w)
    by_leaf: dict = {}
    for col, (a, b) in weights.items():
        by_leaf.setdefault((col // C, a, b), []).append(col % C)
    units = []
    for (leaf, a, b), cells in by_leaf.items():
        mask = np.zeros(C, bool)
        mask[cells] = True
        area = int(sums.leaf_area[leaf])
        for m in pc.units(area, mask):
            units.append((area, m, a, b))
    return units


def _inverse_cdf_draws(rng, lo, pmf, n):
    cdf = np.cumsum(pmf)
    return lo + np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), pmf.size - 1)


def per_cell_posteriors(release, targets: NestedTargets, *, aggregate: bool, prob: float = 0.9,
                        n_draws: int = 4000, seed: int = 0) -> pd.DataFrame:
    r"""Estimates and intervals of the targets from the per-cell posteriors
    (:func:`per_cell_posterior`): the median and the equal-tailed interval
    [q((1 - prob)/2), q((1 + prob)/2)], q(p) = min{t : F(t) >= p}, computed exactly from the pmf.

    What the per-cell tools (sbaldasty/noisyvalue, dpvalue) give depends on how the quantity is
    published:

    * ``aggregate=False`` -- a target that is itself a published cell (an area measured
      directly for that cell set: a county's count of one cell, the county's total) gets the
      posterior of that one measurement alone, which is what the tools give for an area measured
      directly. Targets that are not one published cell get NaN (``measured`` False).
    * ``aggregate=True`` -- the target is computed from the leaf cells it sums, their per-cell
      posteriors treated as independent: the law of sum_i w_i T_i by exact convolution. This is
      what a user of the per-cell tools gets for a quantity not published as such (a derived
      area, a custom sum of cells), or who builds an area's count from its leaves.

    The unit is a measurement as the release holds it: where :mod:`dpinfer.io.nmf` summed finer
    published cells into one term (``summed`` > 1), the flat prior and the truncation at 0 apply
    to that sum, not to each published cell in it -- kinder to the per-cell tools than applying
    them per published cell and convolving, which adds the truncated posteriors' upward shift
    once per (mostly zero) published cell.

    A ratio (d_A'x / d_B'x) is summarised by Monte Carlo with ``n_draws`` draws (``seed``):
    without ``aggregate`` the two published cells are drawn independently; with it the leaf
    units are drawn once and summed into both (draws where the denominator is 0 are dropped).
    """
    sums = _as_sums(release)
    pc = _PerCell(sums)
    a, b = 0.5 * (1.0 - prob), 0.5 * (1.0 + prob)
    rng = np.random.default_rng(seed)
    k = len(targets)
    est, lower, upper = np.full(k, np.nan), np.full(k, np.nan), np.full(k, np.nan)
    ratio = targets.is_ratio
    for i in range(k):
        if not aggregate:
            if targets.num_area[i] < 0 or not pc.is_measured(targets.num_area[i], targets.num_cells[i]):
                continue
            lo, pmf = pc.posterior(targets.num_area[i], targets.num_cells[i])
            if not ratio[i]:
                q = _quantile(lo, np.cumsum(pmf), [0.5, a, b])
                est[i], lower[i], upper[i] = q
                continue
            if targets.den_area[i] < 0 or not pc.is_measured(targets.den_area[i], targets.den_cells[i]):
                continue
            dlo, dpmf = pc.posterior(targets.den_area[i], targets.den_cells[i])
            num = _inverse_cdf_draws(rng, lo, pmf, n_draws)
            den = _inverse_cdf_draws(rng, dlo, dpmf, n_draws)
        else:
            units = _leaf_units(pc, sums, targets.numerator[i], targets.denominator[i])
            if not ratio[i]:
                parts = [_scaled(*pc.posterior(v, m), wa) for v, m, wa, _ in units if wa != 0]
                lo, pmf = _convolve_all(parts)
                q = _quantile(lo, np.cumsum(pmf), [0.5, a, b])
                est[i], lower[i], upper[i] = q
                continue
            num = np.zeros(n_draws)
            den = np.zeros(n_draws)
            for v, m, wa, wb in units:
                d = _inverse_cdf_draws(rng, *pc.posterior(v, m), n_draws)
                num += wa * d
                den += wb * d
        keep = den != 0
        r = num[keep] / den[keep]
        if r.size:
            est[i] = np.median(r)
            lower[i], upper[i] = np.quantile(r, [a, b])
    return pd.DataFrame({"label": targets.label, "group": targets.group, "estimate": est,
                         "lower": lower, "upper": upper, "measured": np.isfinite(est)})

