r"""Baselines for nested measurements: what the tools in use today make of a tree of noisy counts.

The release is a :class:`~dpinfer.mechanisms.nested.NestedMeasurements` (or its
:class:`~dpinfer.lattice.nested.structure.NestedSums`): latent counts x[l, c] on the leaves l of
a tree of areas, area sums S_{v,c} = sum_{l under v} x[l, c], and terms at every area --
measurements y_r = sum_{c in cells_r} S_{v_r, c} + e_r (e_r the sum of ``summed`` discrete
Gaussians, Var e_r = v_r = summed * sigma^2), equalities and bounds. The quantities compared
are **targets**, linear functionals d'x (integer weights d over the n_leaves * n_cells counts:
one cell at one leaf, an area's sum of a cell, an area's sum over a set of cells) or ratios
d_A'x / d_B'x (a share: Hispanic over total) -- :class:`NestedTargets`, built by
:func:`area_cell_targets`, :func:`area_sum_targets`, :func:`ratio_targets`.

Methods (each a function below):

* :func:`nested_gls` -- the **generalised least-squares / best linear unbiased estimate**
  (the Census Bureau's GLS uncertainty evaluation of the 2020 noisy measurement files,
  uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation; the first step of BlueDown):
  ``x^ = argmin_x sum_r (y_r - t_r(x))^2 / v_r  s.t.  E x = e`` over real x (no
  non-negativity, no bounds, no integrality); Cov(x^) = Z (Z' M' V^-1 M Z)^-1 Z' with Z a basis
  of {E x = 0}; a target's sd sqrt(d' Cov d); interval estimate -+ z_{0.95} sd (1.645 sd);
  a ratio by the delta method.
* :func:`per_cell_posteriors` -- the **per-cell posterior** of the tools that treat each
  published cell alone (sbaldasty/noisyvalue and dpvalue): a flat prior on t in {0, 1, 2, ...},
  the noise pmf of the one measurement as likelihood, truncated at 0 and at the bounds
  published for that same cell; median and equal-tailed interval, exactly from the pmf.
* :func:`nested_nnls` -- the **non-negative weighted least-squares projection** (TopDown-style
  post-processing): the least-squares objective above with x >= 0, the equalities and the
  bounds as constraints; point estimates only.
* :func:`compare_nested` / :func:`nested_target_table` -- the targets' estimates and intervals
  of dpinfer's posterior draws and of every baseline, scored against the truth by group.

All of them are baselines without a model for the confidential counts: compare them with
dpinfer's posterior, never treat their intervals as calibrated.

**How the least-squares problems are solved.** With x-space matrices a measurement at the root
touches every leaf (M' V^-1 M is dense), so both GLS and NNLS work on the **augmented
system** of all area sums: variables z = S (n_areas * n_cells), the measurements local to their
area (Hessian H = A' V^-1 A block diagonal per area), the tree as constraints
S_{v,c} - sum_{u child of v} S_{u,c} = 0, and the equalities sum_{c in cells_r} S_{v_r,c} = y_r.
The KKT system ``[[H, C'], [C, 0]] [z; nu] = [A' V^-1 y; c]`` is sparse; it is factorised once
by SuperLU (``scipy.sparse.linalg.splu``) in its regularised, symmetric quasi-definite form
``[[H + eps I, C'], [C, -delta I]]`` (eps = delta = 1e-10 times the median diagonal of H; this
factorises without pivoting and tolerates redundant equalities) and every solve is corrected by
iterative refinement against the exact system until the relative residual is below 1e-10, so
the answer is the exact KKT solution up to rounding. The covariance is never formed: for a
functional g (a target's d mapped to the leaves' sums; a ratio's delta-method gradient)
Var(g'z^) = g' P g with P the z-block of the KKT inverse, since P H P = P (Cov(A'V^-1 y) = H),
obtained by one solve with right-hand side [g; 0] -- blocks of many targets share the factor.
A target whose refinement does not converge is not estimable (the data and equalities do not
determine it): its estimate is NaN and its sd inf.

**Many targets at once.** A target that is one area's sum over a cell set (a leaf's cell, a
county's cell, a county's voting-age population; a ratio of two cell sets of one area) needs only
that area's covariance, and every area's covariance comes from one **two-pass algorithm on the
tree** (:func:`_tree_pass`; the bottom-up / top-down GLS passes of the Census Bureau's GLS
evaluation, here as a Kalman filter and Rauch-Tung-Striebel smoother on the tree of sums) in
O(n_areas * n_cells^3), when every leaf's own measurements determine its cells (otherwise, and
for any other target, the KKT solves above). Both give the same numbers (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scipy.linalg
import scipy.signal
import scipy.sparse
import scipy.sparse.linalg
import scipy.stats

from dpinfer.lattice.nested.structure import NestedSums

__all__ = [
    "GLSFit",
    "NestedTargets",
    "area_cell_targets",
    "area_sum_targets",
    "compare_nested",
    "concat_targets",
    "nested_gls",
    "nested_nnls",
    "nested_target_table",
    "per_cell_posterior",
    "per_cell_posteriors",
    "ratio_targets",
]

_REFINE_TOL = 1e-10  # relative residual of the refined KKT solves
_REFINE_STEPS = 30
_REG = 1e-10  # eps and delta of the regularised factor, relative to the median diagonal of H
_TAIL_SDS = 12.0  # per-cell posterior support: the mode +- 12 sd (mass beyond < 1e-31)
_BLOCK = 128  # right-hand sides per block solve


# ---- the release ---------------------------------------------------------------------------------
def _as_sums(release) -> NestedSums:
    if isinstance(release, NestedSums):
        return release
    sums = getattr(release, "sums", None)
    if isinstance(sums, NestedSums):
        return sums
    raise TypeError(f"release must be a NestedMeasurements or NestedSums, got {type(release).__name__}")


def _area_names(release, sums: NestedSums) -> np.ndarray:
    names = getattr(release, "area_names", None)
    if names is not None and len(names) == sums.n_areas:
        return np.asarray(names, dtype=object)
    return np.arange(sums.n_areas).astype(str).astype(object)


def _cell_mask(cells, n_cells: int) -> np.ndarray:
    cells = np.asarray(cells)
    if cells.dtype == bool:
        if cells.shape != (n_cells,):
            raise ValueError(f"a cell mask must have {n_cells} entries, got shape {cells.shape}")
        mask = cells.copy()
    else:
        mask = np.zeros(n_cells, bool)
        idx = np.asarray(cells, dtype=np.int64).reshape(-1)
        if np.any((idx < 0) | (idx >= n_cells)):
            raise ValueError(f"cell indices must lie in 0 .. {n_cells - 1}")
        mask[idx] = True
    if not mask.any():
        raise ValueError("a cell set must hold at least one cell")
    return mask


# ---- targets -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NestedTargets:
    """Targets d'x or d_A'x / d_B'x of the counts x (n_leaves, n_cells), flattened row-major.

    ``numerator`` (k, n_leaves * n_cells) integer weights; ``denominator`` the same shape, all
    zero in a row for a linear target (``is_ratio`` False). ``num_area``/``num_cells`` (and
    ``den_area``/``den_cells``): the area and cell set when the numerator (denominator) is one
    area's sum over a cell set (area -1 otherwise) -- what a per-cell tool would look up as a
    published cell. ``label`` names each target, ``group`` groups them for the comparison."""

    label: np.ndarray
    group: np.ndarray
    numerator: scipy.sparse.csr_matrix
    denominator: scipy.sparse.csr_matrix
    num_area: np.ndarray
    num_cells: np.ndarray
    den_area: np.ndarray
    den_cells: np.ndarray

    def __len__(self) -> int:
        return self.label.size

    @property
    def is_ratio(self) -> np.ndarray:
        return np.diff(self.denominator.indptr) > 0

    def values(self, counts) -> np.ndarray:
        """The targets at counts (n_leaves, n_cells) -> (k,), or at draws (D, n_leaves, n_cells)
        -> (D, k); a ratio with denominator 0 is NaN."""
        x = np.asarray(counts, dtype=float)
        single = x.ndim == 2
        X = x.reshape(1 if single else x.shape[0], -1)
        num = np.asarray((self.numerator @ X.T).T)
        den = np.asarray((self.denominator @ X.T).T)
        ratio = self.is_ratio
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(ratio, num / np.where(den == 0, np.nan, den), num)
        return out[0] if single else out


def _weights(sums, under, areas, masks) -> scipy.sparse.csr_matrix:
    """Rows: 1 on (l, c) for l under areas[i] and c in masks[i]."""
    rows, cols = [], []
    for i, (v, mask) in enumerate(zip(areas, masks)):
        leaves = under[int(v)]
        cells = np.flatnonzero(mask)
        c = (leaves[:, None] * sums.n_cells + cells[None, :]).reshape(-1)
        rows.append(np.full(c.size, i))
        cols.append(c)
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    return scipy.sparse.csr_matrix((np.ones(r.size, np.int64), (r, c)),
                                   shape=(len(areas), sums.n_leaves * sums.n_cells))


def _make_targets(release, labels, group, areas, masks, den_areas=None, den_masks=None) -> NestedTargets:
    sums = _as_sums(release)
    under = sums.leaves_under()
    k = len(areas)
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    if np.any((areas < 0) | (areas >= sums.n_areas)):
        raise ValueError(f"areas must be area indices 0 .. {sums.n_areas - 1}")
    masks = np.asarray(masks, dtype=bool).reshape(k, sums.n_cells)
    num = _weights(sums, under, areas, masks)
    if den_areas is None:
        den = scipy.sparse.csr_matrix(num.shape, dtype=np.int64)
        den_areas = np.full(k, -1, np.int64)
        den_masks = np.zeros((k, sums.n_cells), bool)
    else:
        den_areas = np.asarray(den_areas, dtype=np.int64).reshape(-1)
        den_masks = np.asarray(den_masks, dtype=bool).reshape(k, sums.n_cells)
        den = _weights(sums, under, den_areas, den_masks)
    groups = np.broadcast_to(np.asarray(group, dtype=object), (k,)).copy()
    return NestedTargets(np.asarray(labels, dtype=object), groups, num, den, areas, masks, den_areas, den_masks)


def area_cell_targets(release, areas, group: str, *, cells=None) -> NestedTargets:
    """Every (area, cell) for the ``areas`` and ``cells`` (default: all cells): the count of one
    cell summed over the area's leaves (at a leaf area: one latent count)."""
    sums = _as_sums(release)
    names = _area_names(release, sums)
    cells = np.arange(sums.n_cells) if cells is None else np.flatnonzero(_cell_mask(cells, sums.n_cells))
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    a = np.repeat(areas, cells.size)
    c = np.tile(cells, areas.size)
    masks = np.zeros((a.size, sums.n_cells), bool)
    masks[np.arange(a.size), c] = True
    labels = [f"{names[v]}, cell {j}" for v, j in zip(a, c)]
    return _make_targets(release, labels, group, a, masks)


def area_sum_targets(release, areas, cells, group: str, *, name: str | None = None) -> NestedTargets:
    """Every area's sum over one cell set ``cells`` (a mask or cell indices), e.g. a county's
    voting-age population."""
    sums = _as_sums(release)
    names = _area_names(release, sums)
    mask = _cell_mask(cells, sums.n_cells)
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    what = name or group
    return _make_targets(release, [f"{names[v]}, {what}" for v in areas], group, areas,
                         np.tile(mask, (areas.size, 1)))


def ratio_targets(release, areas, numerator_cells, denominator_cells, group: str, *,
                  name: str | None = None) -> NestedTargets:
    """Every area's ratio (sum over ``numerator_cells``) / (sum over ``denominator_cells``),
    e.g. the share Hispanic."""
    sums = _as_sums(release)
    names = _area_names(release, sums)
    num = _cell_mask(numerator_cells, sums.n_cells)
    den = _cell_mask(denominator_cells, sums.n_cells)
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    what = name or group
    return _make_targets(release, [f"{names[v]}, {what}" for v in areas], group, areas,
                         np.tile(num, (areas.size, 1)), areas, np.tile(den, (areas.size, 1)))


def concat_targets(*targets: NestedTargets) -> NestedTargets:
    """The targets of several :class:`NestedTargets` in one."""
    if not targets:
        raise ValueError("give at least one NestedTargets")
    return NestedTargets(
        np.concatenate([t.label for t in targets]), np.concatenate([t.group for t in targets]),
        scipy.sparse.vstack([t.numerator for t in targets]).tocsr(),
        scipy.sparse.vstack([t.denominator for t in targets]).tocsr(),
        np.concatenate([t.num_area for t in targets]), np.concatenate([t.num_cells for t in targets]),
        np.concatenate([t.den_area for t in targets]), np.concatenate([t.den_cells for t in targets]))


# ---- the augmented least-squares system -----------------------------------------------------------
@dataclass
class _System:
    """z = S (n_areas * n_cells); H = A' V^-1 A, h = A' V^-1 y; constraint rows (tree,
    equalities) C z = c; bound rows sign * (B z) <= sign * value."""

    sums: NestedSums
    H: scipy.sparse.csr_matrix
    h: np.ndarray
    C: scipy.sparse.csr_matrix
    c: np.ndarray
    eq_rows: np.ndarray  # term indices of the equality rows (after the tree rows)
    n_tree: int
    B: scipy.sparse.csr_matrix
    b: np.ndarray
    b_sign: np.ndarray
    leaf_z: np.ndarray  # (n_leaves * n_cells,) z index of each count
    scale: float

    @property
    def N(self) -> int:
        return self.H.shape[0]


def _term_rows(sums, rows) -> scipy.sparse.csr_matrix:
    """0/1 rows over z of the terms ``rows``: (area_r, c) for c in cells_r."""
    C = sums.n_cells
    r_idx, c_idx = np.nonzero(sums.term_cells[rows])
    cols = sums.term_area[rows][r_idx] * C + c_idx
    return scipy.sparse.csr_matrix((np.ones(r_idx.size), (r_idx, cols)), shape=(len(rows), sums.n_areas * C))


def _system(sums: NestedSums) -> _System:
    C = sums.n_cells
    N = sums.n_areas * C
    measured, equal, at_most, at_least, variance = sums.term_kinds()
    rows = np.flatnonzero(measured)
    A = _term_rows(sums, rows)
    w = 1.0 / variance[rows]
    H = (A.T @ scipy.sparse.diags(w) @ A).tocsr()
    h = A.T @ (w * sums.term_value[rows])
    # tree: S_{p,c} - sum_{u: parent u = p} S_{u,c} = 0, one row per (internal p, c)
    internal = np.flatnonzero(sums.area_leaf < 0)
    row_of = np.full(sums.n_areas, -1, np.int64)
    row_of[internal] = np.arange(internal.size)
    child = np.flatnonzero(sums.parent >= 0)
    cc = np.arange(C)
    r1 = (row_of[internal][:, None] * C + cc).reshape(-1)
    k1 = (internal[:, None] * C + cc).reshape(-1)
    r2 = (row_of[sums.parent[child]][:, None] * C + cc).reshape(-1)
    k2 = (child[:, None] * C + cc).reshape(-1)
    T = scipy.sparse.csr_matrix((np.concatenate([np.ones(r1.size), -np.ones(r2.size)]),
                                 (np.concatenate([r1, r2]), np.concatenate([k1, k2]))), shape=(internal.size * C, N))
    eq = np.flatnonzero(equal)
    E = _term_rows(sums, eq)
    Cmat = scipy.sparse.vstack([T, E]).tocsr()
    c = np.concatenate([np.zeros(T.shape[0]), sums.term_value[eq].astype(float)])
    bnd = np.flatnonzero(at_most | at_least)
    B = _term_rows(sums, bnd)
    sign = np.where(at_most[bnd], 1.0, -1.0)
    d = H.diagonal()
    scale = float(np.median(d[d > 0])) if np.any(d > 0) else 1.0
    leaf_z = (sums.leaf_area[:, None] * C + cc).reshape(-1)
    return _System(sums, H, np.asarray(h, float), Cmat, c, eq, T.shape[0], B,
                   sums.term_value[bnd].astype(float), sign, leaf_z, scale)


class _KKTSolver:
    """Exact solves of [[H_FF, C_F'], [C_F, 0]] [z_F; nu] = [top; bottom] (F the free z's): a
    SuperLU factor of the regularised quasi-definite matrix plus iterative refinement (module
    docstring). Constraint rows are scaled by the median diagonal of H."""

    def __init__(self, H, C, scale: float):
        self.n, self.m = H.shape[0], C.shape[0]
        self.scale = scale
        Cs = (C * scale).tocsr()
        self.K0 = scipy.sparse.bmat([[H, Cs.T], [Cs, None]], format="csc")
        reg = _REG * scale
        D = scipy.sparse.diags(np.concatenate([np.full(self.n, reg), np.full(self.m, -reg)]))
        Kr = (self.K0 + D).tocsc()
        self.lu = scipy.sparse.linalg.splu(Kr, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                                           options={"SymmetricMode": True})

    def solve(self, top, bottom):
        """(z, nu, converged): z (n, k), nu (m, k) multipliers of the unscaled rows, converged (k,)."""
        top = np.asarray(top, float)
        one = top.ndim == 1
        top = top.reshape(self.n, -1)
        bottom = np.asarray(bottom, float).reshape(self.m, -1) * self.scale
        b = np.vstack([top, bottom])
        norm = np.maximum(np.linalg.norm(b, axis=0), 1e-300)
        u = self.lu.solve(b)
        ok = np.zeros(b.shape[1], bool)
        for _ in range(_REFINE_STEPS):
            r = b - self.K0 @ u
            rel = np.linalg.norm(r, axis=0) / norm
            ok = rel <= _REFINE_TOL
            if np.all(ok):
                break
            u = u + self.lu.solve(r)
        else:
            r = b - self.K0 @ u
            ok = np.linalg.norm(r, axis=0) / norm <= _REFINE_TOL
        z, nu = u[:self.n], u[self.n:] * self.scale
        if one:
            return z[:, 0], nu[:, 0], bool(ok[0])
        return z, nu, ok


# ---- the two-pass tree algorithm for the areas' covariances -------------------------------------
def _pinvh(M: np.ndarray) -> np.ndarray:
    w, V = np.linalg.eigh(0.5 * (M + M.T))
    keep = w > 1e-11 * max(float(np.max(np.abs(w))), 1e-300)
    return (V[:, keep] / w[keep]) @ V[:, keep].T


def _update(mu, cov, A, y, R):
    """Condition N(mu, cov) on A S = y + noise of variances R (0: exact), Kalman form with a
    pseudo-inverse (degenerate laws, redundant rows)."""
    if A.shape[0] == 0:
        return mu, cov
    CA = cov @ A.T
    Sg = A @ CA + np.diag(R)
    if np.all(R > 0):  # noisy rows: S is positive definite
        K = scipy.linalg.cho_solve(scipy.linalg.cho_factor(Sg), CA.T).T
    else:
        K = CA @ _pinvh(Sg)
    mu = mu + K @ (y - A @ mu)
    cov = cov - K @ CA.T
    return mu, 0.5 * (cov + cov.T)


def _tree_pass(sums: NestedSums):
    """(mean (n_areas, C), cov (n_areas, C, C)) of the GLS estimates of every area's sums, by two
    passes over the tree (a Kalman filter and Rauch-Tung-Striebel smoother on the tree of sums):
    up, each area's GLS estimate from the data of its subtree alone -- at a leaf from its own
    measurements (flat prior: needs them to determine all its cells), inside as the sum of its
    children's (independent: disjoint data) conditioned on its own measurements and
    equalities; down, the children's joint law given their sum S_v (m_v = sum of the children's
    up means, P_v = sum of their covariances) carries the parent's final law down:
    mu_u = mu_u^up + G (mu_v - m_v), Cov_u = Cov_u^up - G Cov_u^up + G Cov_v G', G = Cov_u^up P_v^+.
    None when a leaf's own measurements do not determine its cells (then the KKT solves serve)."""
    C = sums.n_cells
    measured, equal, _, _, variance = sums.term_kinds()
    n = sums.n_areas
    mu = np.zeros((n, C))
    cov = np.zeros((n, C, C))
    m_pre = np.zeros((n, C))
    P_pre = np.zeros((n, C, C))
    cells = sums.term_cells.astype(float)
    y_all = sums.term_value.astype(float)
    for v in sums.order:
        rows = np.arange(sums.term_ptr[v], sums.term_ptr[v + 1])
        meas, eq = rows[measured[rows]], rows[equal[rows]]
        A, y, R = cells[meas], y_all[meas], variance[meas]
        if sums.area_leaf[v] >= 0:
            J = (A.T / R) @ A
            w, V = np.linalg.eigh(J)
            if w[0] <= 1e-9 * max(float(w[-1]), 1e-300):
                return None
            c = (V / w) @ V.T
            m = c @ (A.T @ (y / R))
        else:
            kids = sums.child_area[sums.child_ptr[v]:sums.child_ptr[v + 1]]
            m = mu[kids].sum(0)
            c = cov[kids].sum(0)
            m_pre[v], P_pre[v] = m, c
            m, c = _update(m, c, A, y, R)
        mu[v], cov[v] = _update(m, 0.5 * (c + c.T), cells[eq], y_all[eq], np.zeros(eq.size))
    for v in sums.order[::-1]:
        kids = sums.child_area[sums.child_ptr[v]:sums.child_ptr[v + 1]]
        if kids.size == 0:
            continue
        Pinv = _pinvh(P_pre[v])
        d = mu[v] - m_pre[v]
        for u in kids:
            G = cov[u] @ Pinv
            mu[u] = mu[u] + G @ d
            cu = cov[u] - G @ cov[u] + G @ cov[v] @ G.T
            cov[u] = 0.5 * (cu + cu.T)
    return mu, cov


# ---- (a) GLS -----------------------------------------------------------------------------------
@dataclass
class GLSFit:
    """The GLS/BLUE fit of a nested release (:func:`nested_gls`): ``counts`` x^ (n_leaves,
    n_cells), real and possibly negative (NaN where not estimable); :meth:`targets` gives the
    estimates, sds and intervals of targets from the one factorisation."""

    counts: np.ndarray
    method: str
    _system: _System = field(repr=False)
    _solver: _KKTSolver = field(repr=False)
    _z: np.ndarray = field(repr=False)
    #: (mean, cov) of every area's sums from the two-pass tree algorithm, or None
    tree: tuple | None = field(default=None, repr=False)

    def _functionals(self, W: scipy.sparse.csr_matrix) -> scipy.sparse.csr_matrix:
        """Weights over the counts -> the same functionals over z (the leaves' sums)."""
        W = W.tocoo()
        return scipy.sparse.csr_matrix((W.data.astype(float), (W.row, self._system.leaf_z[W.col])),
                                       shape=(W.shape[0], self._system.N))

    def _variances(self, G: scipy.sparse.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
        """g' P g for the rows g of G (blocks of right-hand sides), and whether each converged."""
        k = G.shape[0]
        var = np.empty(k)
        ok = np.empty(k, bool)
        zeros = None
        for i0 in range(0, k, _BLOCK):
            Gb = G[i0:i0 + _BLOCK]
            rhs = Gb.toarray().T
            if zeros is None or zeros.shape[1] != rhs.shape[1]:
                zeros = np.zeros((self._solver.m, rhs.shape[1]))
            u, _, conv = self._solver.solve(rhs, zeros)
            var[i0:i0 + Gb.shape[0]] = np.einsum("ij,ij->j", rhs, u)
            ok[i0:i0 + Gb.shape[0]] = conv
        return np.maximum(var, 0.0), ok

    def targets(self, targets: NestedTargets, prob: float = 0.9) -> pd.DataFrame:
        """Per target: estimate d'x^ (a ratio: a^/b^), sd sqrt(d' Cov d) (a ratio: the delta
        method, g = (d_A - r^ d_B) / b^), and the interval estimate -+ z sd, z = Phi^-1((1 + prob)/2)
        (1.645 at 0.9). Not estimable: NaN estimate and inf sd. Targets of one area use the tree
        pass's covariance of that area (module docstring), the others one KKT solve each (in
        blocks of right-hand sides sharing the factor)."""
        z = scipy.stats.norm.ppf(0.5 * (1.0 + prob))
        x = self._z[self._system.leaf_z]
        num = targets.numerator @ x
        den = targets.denominator @ x
        ratio = targets.is_ratio
        with np.errstate(divide="ignore", invalid="ignore"):
            est = np.where(ratio, num / den, num)
            # delta method: g = d_A / b - a d_B / b^2
            inv = np.where(ratio, 1.0 / den, 1.0)
            r = np.where(ratio, est, 0.0)
        inv = np.where(np.isfinite(inv), inv, 0.0)
        r = np.where(np.isfinite(r), r, 0.0)
        G = (scipy.sparse.diags(inv) @ (targets.numerator.astype(float)
                                         - scipy.sparse.diags(r) @ targets.denominator)).tocsr()
        var = np.empty(len(targets))
        ok = np.ones(len(targets), bool)
        # one area's sums (a ratio: of cell sets of the same area): g' Cov_v g from the tree pass
        local = (targets.num_area >= 0) & (~ratio | (targets.den_area == targets.num_area))
        if self.tree is not None and np.any(local):
            _, cov = self.tree
            i = np.flatnonzero(local)
            g = (inv[i, None] * (targets.num_cells[i] - r[i, None] * targets.den_cells[i]))
            var[i] = np.einsum("ki,kij,kj->k", g, cov[targets.num_area[i]], g)
        rest = np.flatnonzero(~local | (self.tree is None))
        if rest.size:
            var[rest], ok[rest] = self._variances(self._functionals(G[rest]))
        var = np.maximum(var, 0.0)
        ok &= np.isfinite(est)
        sd = np.where(ok, np.sqrt(var), np.inf)
        est = np.where(ok, est, np.nan)
        return pd.DataFrame({"label": targets.label, "group": targets.group, "estimate": est, "sd": sd,
                             "lower": est - z * sd, "upper": est + z * sd})


def nested_gls(release, *, tree: bool = True) -> GLSFit:
    r"""The GLS / BLUE of the counts from the measurements under the equalities.

    ``x^ = argmin_x sum_r (y_r - t_r(x))^2 / v_r  subject to  E x = e``, x real (no
    non-negativity, bounds or integrality), v_r = summed_r * sigma_r^2 the variance of
    measurement r. With uncorrelated noise this is the best linear unbiased estimate on the
    equality subspace (Aitken's theorem), Cov(x^) = Z (Z' M' V^-1 M Z)^-1 Z', Z a basis of
    {E x = 0}; it is the estimator of the Census Bureau's GLS uncertainty evaluation of the 2020
    NMF (uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation) and BlueDown's first step.
    Solved on the augmented system of area sums by one sparse factorisation (module docstring:
    KKT system, SuperLU, iterative refinement); bounds are not used. Counts that the data do
    not determine are NaN. With ``tree`` (default) the two-pass tree algorithm also gives every
    area's covariance (``GLSFit.tree``), used by :meth:`GLSFit.targets` for one-area targets.
    """
    sums = _as_sums(release)
    system = _system(sums)
    solver = _KKTSolver(system.H, system.C, system.scale)
    z, _, ok = solver.solve(system.h, system.c)
    if not ok:
        raise RuntimeError("the GLS KKT system did not solve to 1e-10 (the equalities are inconsistent?)")
    passes = _tree_pass(sums) if tree else None
    fit = GLSFit(np.zeros((sums.n_leaves, sums.n_cells)), "KKT of the area sums (SuperLU + refinement)",
                 system, solver, z, passes)
    x = z[system.leaf_z]
    if passes is None and not _well_determined(sums):
        # counts the data may not determine: those whose variance solve does not converge
        eye = scipy.sparse.csr_matrix((np.ones(x.size), (np.arange(x.size), system.leaf_z)),
                                      shape=(x.size, system.N))
        _, conv = fit._variances(eye)
        x = np.where(conv, x, np.nan)
    fit.counts = x.reshape(sums.n_leaves, sums.n_cells)
    return fit


def _well_determined(sums) -> bool:
    """A sufficient check that every count is determined: every leaf's own measurements
    determine its cells (then M has full column rank)."""
    measured, *_ = sums.term_kinds()
    cells = sums.term_cells.astype(float)
    for v in sums.leaf_area:
        rows = np.arange(sums.term_ptr[v], sums.term_ptr[v + 1])
        A = cells[rows[measured[rows]]]
        if A.shape[0] < sums.n_cells or np.linalg.matrix_rank(A) < sums.n_cells:
            return False
    return True


# ---- (c) NNLS ----------------------------------------------------------------------------------
def nested_nnls(release, *, bounds: bool = True, max_iter: int = 100) -> np.ndarray:
    r"""The non-negative weighted least-squares projection (TopDown-style post-processing):

    ``x^ = argmin_x sum_r (y_r - t_r(x))^2 / v_r  s.t.  E x = e, x >= 0`` and, with ``bounds``,
    the published bounds ``t_r(x) <= y_r`` / ``>= y_r``; real x, point estimates only.

    Solved by block principal pivoting (Kim & Park 2011, "Fast nonnegativity-constrained least
    squares algorithm", SIAM J. Sci. Comput. 33(6); Portugal, Judice & Vicente 1994), the
    complementarity pairs being x_i >= 0 and, with ``bounds``, each bound: every step solves the
    equality-constrained problem with the active pairs as equalities (fixed counts removed,
    active bounds as rows) on the augmented KKT system of :func:`nested_gls`, and exchanges the
    pairs whose primal or multiplier sign is wrong (all of them while their number falls, with
    Kim & Park's three-step allowance, else the largest index only). Equalities to 0 fix their
    counts at 0 before the start. Ends at a KKT point (x >= 0, multipliers >= 0 to 1e-9
    relative), which is the unique minimiser when the counts are determined.
    """
    sums = _as_sums(release)
    system = _system(sums)
    n_x = system.leaf_z.size
    N = system.N
    # structural zeros: an equality to 0 fixes its counts at 0 (with x >= 0)
    fixed0 = np.zeros(N, bool)
    keep_eq = np.ones(system.eq_rows.size, bool)
    E = system.C[system.n_tree:]
    is_leaf_z = np.zeros(N, bool)
    is_leaf_z[system.leaf_z] = True
    under = None
    for i, r in enumerate(system.eq_rows):
        if sums.term_value[r] == 0:
            if under is None:
                under = sums.leaves_under()
            leaves = under[sums.term_area[r]]
            cells = np.flatnonzero(sums.term_cells[r])
            fixed0[(sums.leaf_area[leaves][:, None] * sums.n_cells + cells).reshape(-1)] = True
            keep_eq[i] = False
    n_b = system.B.shape[0] if bounds else 0
    # pairs: counts 0..n_x-1 (in leaf_z order), then bounds
    active = np.zeros(n_x + n_b, bool)
    active[:n_x] = fixed0[system.leaf_z]
    frozen = active.copy()
    base_rows = scipy.sparse.vstack([system.C[:system.n_tree], E[keep_eq]]).tocsr()
    base_c = np.concatenate([system.c[:system.n_tree], system.c[system.n_tree:][keep_eq]])
    Bs = (scipy.sparse.diags(system.b_sign) @ system.B).tocsr() if n_b else None
    bval = system.b_sign * system.b if n_b else None
    n_inf, allowance = n_x + n_b + 1, 3
    for _ in range(max_iter):
        free = np.ones(N, bool)
        free[system.leaf_z[active[:n_x]]] = False
        act_b = np.flatnonzero(active[n_x:]) if n_b else np.zeros(0, np.int64)
        rows = base_rows if act_b.size == 0 else scipy.sparse.vstack([base_rows, Bs[act_b]]).tocsr()
        rhs_c = base_c if act_b.size == 0 else np.concatenate([base_c, bval[act_b]])
        Fi = np.flatnonzero(free)
        solver = _KKTSolver(system.H[Fi][:, Fi], rows[:, Fi], system.scale)
        zF, nu, ok = solver.solve(system.h[Fi], rhs_c)
        if not ok:
            raise RuntimeError("NNLS: an equality-constrained step did not solve (the equalities, bounds "
                               "and x >= 0 may be infeasible)")
        z = np.zeros(N)
        z[Fi] = zF
        grad = system.H @ z - system.h + rows.T @ nu  # = multipliers of x >= 0 on fixed coords
        x = z[system.leaf_z]
        xtol = 1e-9 * max(1.0, float(np.max(np.abs(x))))
        gtol = 1e-9 * max(1.0, float(np.max(np.abs(system.h))), float(np.max(np.abs(system.H @ np.abs(z)))))
        bad = np.zeros(n_x + n_b, bool)
        bad[:n_x] = np.where(active[:n_x], grad[system.leaf_z] < -gtol, x < -xtol) & ~frozen[:n_x]
        if n_b:
            slack = Bs @ z - bval
            mult = np.zeros(n_b)
            mult[act_b] = nu[base_rows.shape[0]:]
            btol = 1e-9 * max(1.0, float(np.max(np.abs(bval))))
            bad[n_x:] = np.where(active[n_x:], mult < -gtol, slack > btol)
        v = np.flatnonzero(bad)
        if v.size == 0:
            out = np.maximum(x, 0.0)
            return out.reshape(sums.n_leaves, sums.n_cells)
        if v.size < n_inf:
            n_inf, allowance = v.size, 3
            flip = v
        elif allowance >= 1:
            allowance -= 1
            flip = v
        else:
            flip = v[-1:]
        active[flip] = ~active[flip]
    raise RuntimeError(f"NNLS: block principal pivoting did not end in {max_iter} steps")


# ---- (b) per-cell posteriors -------------------------------------------------------------------
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


# ---- (d) the comparison --------------------------------------------------------------------------
METHODS = ("dpinfer", "GLS", "per-cell", "per-cell aggregated", "NNLS")


def _draw_summary(targets: NestedTargets, draws: np.ndarray, a: float, b: float):
    """(median, a-quantile, b-quantile, share of the draws in [a-quantile, b-quantile]) of each
    target over the draws, in blocks of targets (one transposed copy of the draws; at most ~2e7
    target values at a time). The share is the interval's posterior mass: above b - a for
    integer targets with few values (a count of 0-3), so it, not b - a, is the coverage a
    calibrated posterior's intervals have on average."""
    XT = np.ascontiguousarray(draws.reshape(draws.shape[0], -1).T)  # (n, D)
    k = len(targets)
    out = np.full((4, k), np.nan)
    step = max(1, 20_000_000 // max(draws.shape[0], 1))
    ratio = targets.is_ratio
    for i0 in range(0, k, step):
        sl = slice(i0, min(k, i0 + step))
        num = np.asarray(targets.numerator[sl] @ XT, dtype=float)
        if np.any(ratio[sl]):
            den = np.asarray(targets.denominator[sl] @ XT, dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                num = np.where(ratio[sl, None], num / np.where(den == 0, np.nan, den), num)
        out[:3, sl] = np.nanquantile(num, [0.5, a, b], axis=1)
        out[3, sl] = np.mean((num >= out[1, sl, None]) & (num <= out[2, sl, None]), axis=1)
    return out[0], out[1], out[2], out[3]


def nested_target_table(release, truth, draws, targets: NestedTargets, *, prob: float = 0.9,
                        methods=METHODS, gls: GLSFit | None = None, nnls: np.ndarray | None = None,
                        n_draws: int = 4000, seed: int = 0) -> pd.DataFrame:
    """One row per (method, target): truth, estimate, lower, upper (NaN where the method has no
    interval or cannot give the target) and mass. dpinfer: the posterior median of the target's
    draws, the equal-tailed interval of the draws (``numpy.quantile``, as
    dpinfer.utility.compare) and its posterior mass (:func:`_draw_summary`; NaN for the others);
    GLS: :func:`nested_gls` (pass ``gls`` to reuse a fit); per-cell and per-cell aggregated:
    :func:`per_cell_posteriors`; NNLS: :func:`nested_nnls` (pass ``nnls`` to reuse it), ratios
    as ratios of the fitted sums."""
    sums = _as_sums(release)
    truth = np.asarray(truth).reshape(sums.n_leaves, sums.n_cells)
    true = targets.values(truth)
    a, b = 0.5 * (1.0 - prob), 0.5 * (1.0 + prob)
    frames = []

    def add(method, est, lo=None, hi=None, mass=None):
        k = len(targets)
        frames.append(pd.DataFrame({
            "method": method, "group": targets.group, "label": targets.label, "truth": true,
            "estimate": np.asarray(est, float),
            "lower": np.full(k, np.nan) if lo is None else np.asarray(lo, float),
            "upper": np.full(k, np.nan) if hi is None else np.asarray(hi, float),
            "mass": np.full(k, np.nan) if mass is None else np.asarray(mass, float)}))

    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose among {METHODS}")
    if "dpinfer" in methods:
        if draws is None:
            raise ValueError("draws (draws, n_leaves, n_cells) are needed for the dpinfer rows")
        draws = np.asarray(draws)
        if draws.ndim != 3 or draws.shape[1:] != (sums.n_leaves, sums.n_cells):
            raise ValueError(f"draws must have shape (draws, {sums.n_leaves}, {sums.n_cells}), got {draws.shape}")
        add("dpinfer", *_draw_summary(targets, draws, a, b))
    if "GLS" in methods:
        g = (gls or nested_gls(sums)).targets(targets, prob)
        add("GLS", g["estimate"], g["lower"], g["upper"])
    for method, agg in (("per-cell", False), ("per-cell aggregated", True)):
        if method in methods:
            p = per_cell_posteriors(sums, targets, aggregate=agg, prob=prob, n_draws=n_draws, seed=seed)
            add(method, p["estimate"], p["lower"], p["upper"])
    if "NNLS" in methods:
        fit = nested_nnls(sums) if nnls is None else nnls
        add("NNLS", targets.values(fit))
    return pd.concat(frames, ignore_index=True)


def compare_nested(release, truth, draws, targets: NestedTargets, *, prob: float = 0.9, methods=METHODS,
                   gls: GLSFit | None = None, nnls: np.ndarray | None = None, n_draws: int = 4000,
                   seed: int = 0, table: pd.DataFrame | None = None) -> pd.DataFrame:
    r"""Score every method on the targets against the truth, per (method, group): a tidy frame
    with ``targets`` (how many the method gave), ``coverage`` of the ``prob`` intervals and its
    Monte Carlo standard error sqrt(p (1 - p) / n) (NaN for a method without intervals),
    ``expected_coverage``, the mean posterior mass of dpinfer's intervals (the coverage a
    calibrated posterior gives: above ``prob`` where targets are small integers; NaN for the
    other methods), ``below`` and ``above``: the shares of targets whose truth lies below the
    interval's lower end and above its upper end (coverage + below + above = 1; misses all on
    one side mean the estimates lean the other way), ``mean_width`` of the intervals, ``mae``
    and ``rmse`` of the point estimates (dpinfer: the posterior median). ``table``: a :func:`nested_target_table` already computed."""
    if table is None:
        table = nested_target_table(release, truth, draws, targets, prob=prob, methods=methods, gls=gls,
                                    nnls=nnls, n_draws=n_draws, seed=seed)
    rows = []
    for (method, group), t in table.groupby(["method", "group"], sort=False):
        t = t[np.isfinite(t["estimate"]) & np.isfinite(t["truth"])]
        n = len(t)
        err = t["estimate"].to_numpy() - t["truth"].to_numpy()
        has = np.isfinite(t["lower"]).all() and np.isfinite(t["upper"]).all() and n > 0
        if has:
            below = float((t["truth"] < t["lower"]).mean())
            above = float((t["truth"] > t["upper"]).mean())
            p = 1.0 - below - above
            se = math.sqrt(p * (1 - p) / n)
            width = float((t["upper"] - t["lower"]).mean())
        else:
            p = se = width = below = above = np.nan
        rows.append({"method": method, "group": group, "targets": n, "coverage": p, "coverage_se": se,
                     "below": below, "above": above,
                     "expected_coverage": float(t["mass"].mean()) if n and t["mass"].notna().all() else np.nan,
                     "mean_width": width, "mae": float(np.abs(err).mean()) if n else np.nan,
                     "rmse": float(np.sqrt(np.mean(err ** 2))) if n else np.nan})
    return pd.DataFrame.from_records(rows)
