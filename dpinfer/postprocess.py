r"""The post-processing baseline: what an analyst *without* a likelihood does with a release.

Census-style post-processing (Abowd et al. 2022, "The 2020 Census Disclosure Avoidance System
TopDown Algorithm", Harvard Data Science Review, Special Issue 2; inference notes §5 use it as the
baseline) turns a noisy release into tables that look like counts:

1. **Least-squares projection** onto the invariants,
   ``x_hat = argmin ||x - s||_2^2  s.t.  A x = a, x >= 0``  (:func:`nonnegative_least_squares`),
   generalised to several linear-query releases ``s_r = Q_r x + e_r`` with ``Var(e_r) = v_r``,
   ``x_hat = argmin sum_r ||Q_r x - s_r||^2 / v_r  s.t.  A x = a, x >= 0``
   (:func:`generalized_least_squares`, the generalised least-squares estimate);
2. **Integer rounding** that keeps the invariants exactly: a non-negative integer ``x_int`` with
   ``A x_int = a`` minimising ``||x_int - x_hat||_1`` (:func:`round_to_invariants`);
3. **Noise-only intervals** ``[x_point + lo, x_point + hi]`` with ``(lo, hi)`` the central interval
   of the noise law (:func:`noise_only_intervals`).

These are point estimates and intervals with no model for the confidential data: compare them
with dpinfer's posteriors, never treat them as calibrated. In particular the noise-only interval
has its nominal coverage only around the raw release; around a projected or rounded estimate the
error is no longer the mechanism's noise (invariants shrink it; where non-negativity binds, small
counts are pushed up and the others down to keep the totals) and coverage is not guaranteed.

Methods (all exact, no penalty or iteration-to-tolerance approximations):

* One total, or disjoint group totals, with ``Q = I``: the projection onto a scaled simplex
  ``{x >= 0, sum x = t}`` has the closed form ``x_i = max(s_i - tau, 0)`` with the threshold
  ``tau = (sum_{j <= rho} u_j - t) / rho``, ``u`` = the group's values sorted decreasingly and
  ``rho = max{j : u_j - (sum_{k <= j} u_k - t) / j > 0}`` (Held, Wolfe & Crowder 1974;
  Michelot 1986; Duchi et al. 2008, ICML). Vectorised over groups: O(d log d).
* General ``A`` and/or general queries: a strictly convex quadratic programme solved by a primal
  active-set method (Nocedal & Wright 2006, *Numerical Optimization*, 2nd ed., Algorithm 16.3).
  Each step solves the equality-constrained sub-problem on the free cells exactly (Cholesky of
  ``H_FF + rho C_F^T C_F`` plus a Schur complement for the multipliers; with a diagonal ``H``, as
  for ``Q = I``, only an m x m system), so the answer is exact up to floating-point rounding.
  Feasibility is decided by a linear programme (HiGHS). The starting working set comes from a few
  primal-dual active-set sweeps (Hintermueller, Ito & Kunisch 2002), which usually hit the optimal
  set, so the active-set method only confirms it. The result is then checked against the KKT
  conditions; see :data:`KKT_TOLERANCE`. Cost per step O(d^3) for a dense ``H``: fine for hundreds
  to a few thousand cells, not for millions.
* Rounding: for disjoint group totals the largest-remainder (Hamilton) method — floor every cell,
  then give the ``t - sum floor`` missing units to the largest fractional parts (ties: lowest
  index) — which minimises the L1 distance when ``x_hat >= 0`` sums to ``t`` in each group.
  Otherwise a mixed-integer programme (``scipy.optimize.milp``, HiGHS, zero optimality gap):
  ``min sum u  s.t.  u >= x - x_hat, u >= x_hat - x, A x = a, x >= 0 integer``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.sparse

from dpinfer._validation import as_integer_array, as_real_array, check_probability
from dpinfer.lattice.invariants import greedy_independent_rows

__all__ = [
    "KKT_TOLERANCE",
    "generalized_least_squares",
    "noise_only_intervals",
    "nonnegative_least_squares",
    "round_to_invariants",
]

#: Relative tolerances of the KKT check applied to every general-QP solution. With
#: ``g = H x - h`` the gradient of ``1/2 sum_r ||Q_r x - s_r||^2 / v_r``:
#: primal ``|A x - a| <= 1e-9 * max(1, max_k sum_j |A_kj x_j|, max |a|)`` and ``x >= 0`` exactly;
#: dual: some ``lambda`` gives ``mu = g - A^T lambda`` with ``|mu_i| <= 1e-8 * G`` where
#: ``x_i > 0`` and ``mu_i >= -1e-8 * G`` where ``x_i = 0``, ``G = max(1, max(|H| |x|), max |h|)``.
KKT_TOLERANCE = {"primal": 1e-9, "dual": 1e-8}


# --- argument checks ---------------------------------------------------------------------------


def _as_vector(name: str, values) -> np.ndarray:
    arr = as_real_array(name, values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of cell values, got shape {arr.shape}")
    return arr


def _as_matrix(name: str, values, d: int) -> np.ndarray:
    """An integer matrix with d columns (a 1-D array is one row)."""
    arr = np.asarray(values)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        real = as_real_array(name, arr)
        if np.any(real != np.round(real)):
            bad = real[real != np.round(real)].ravel()[:3]
            raise ValueError(f"{name} must hold whole numbers (integer coefficients); found {bad.tolist()}")
    arr = as_integer_array(name, arr)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != d or arr.shape[0] == 0:
        raise ValueError(
            f"{name} must be an integer matrix with {d} columns (one per cell) and at least one row, "
            f"got shape {np.shape(values)}"
        )
    return arr


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _group_codes(groups, d: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(groups)
    if g.dtype == object and all(isinstance(v, str) for v in g.ravel()):
        g = g.astype(str)  # pandas string columns arrive as object arrays
    if g.ndim != 1 or g.shape[0] != d:
        raise ValueError(f"groups must be a 1-D array of {d} labels (one per cell), got shape {g.shape}")
    if g.dtype.kind not in "iubUS":
        raise TypeError(f"groups must hold integer or string labels, got dtype {g.dtype}")
    labels, codes = np.unique(g, return_inverse=True)
    return labels, codes.astype(np.int64)


def _group_totals(invariant_values, labels: np.ndarray) -> np.ndarray:
    """Totals aligned with the sorted labels, from a mapping or a 1-D array."""
    if isinstance(invariant_values, Mapping):
        wanted = labels.tolist()
        if set(invariant_values) != set(wanted):
            raise ValueError(
                "invariant_values, given as a mapping, must have exactly one total per group label "
                f"{wanted[:10]}{' ...' if len(wanted) > 10 else ''}; got keys "
                f"{sorted(invariant_values, key=str)[:10]}"
            )
        values = [invariant_values[k] for k in wanted]
    else:
        values = invariant_values
    totals = as_real_array("invariant_values", values)
    if totals.ndim == 0:
        totals = totals[None]
    if totals.shape != labels.shape:
        raise ValueError(
            f"invariant_values must give one total per group ({labels.size} groups, in the order of "
            f"the sorted labels {labels.tolist()[:10]}), got shape {totals.shape}"
        )
    return totals


def _invariant_vector(invariant_values, m: int) -> np.ndarray:
    a = as_real_array("invariant_values", invariant_values)
    if a.ndim == 0:
        a = a[None]
    if a.shape != (m,):
        raise ValueError(
            f"invariant_values must have one value per row of invariants_matrix ({m}), got shape {a.shape}"
        )
    return a


def _constraint_basis(A: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An orthonormal-row system C x = c with the same solutions as A x = a (SVD).

    Raises ValueError if A x = a has no real solution (redundant rows with contradictory values)."""
    Af = A.astype(np.float64)
    U, S, Vt = np.linalg.svd(Af, full_matrices=False)
    tol = S.max() * max(Af.shape) * np.finfo(float).eps if S.size else 0.0
    r = int(np.sum(S > tol))
    C = Vt[:r]
    c = (U[:, :r].T @ a) / S[:r]
    resid = Af @ (C.T @ c) - a
    scale = max(1.0, float(np.max(np.abs(a))))
    if np.max(np.abs(resid)) > 1e-9 * scale:
        raise ValueError(
            "invariant_values is not consistent with invariants_matrix: no real x satisfies A x = a "
            f"(least-squares residual {np.max(np.abs(resid)):.3g}; redundant rows of A must carry "
            "matching values)"
        )
    return C, c


def _group_structure(A: np.ndarray) -> np.ndarray | None:
    """Row index per column (-1: in no row) if A's non-zero rows are disjoint 0/1 group
    indicators, else None."""
    if np.any((A != 0) & (A != 1)) or np.any(A.sum(axis=0) > 1):
        return None
    codes = np.full(A.shape[1], -1, dtype=np.int64)
    rows, cols = np.nonzero(A)
    codes[cols] = rows
    return codes


# --- closed form: projection onto scaled simplices ---------------------------------------------


def _project_groups(s: np.ndarray, codes: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """argmin ||x - s||^2 s.t. x >= 0 and sum_{codes == g} x = totals[g]; cells with code -1 are
    unconstrained apart from x >= 0 (clip at 0). Sort-and-threshold, vectorised over groups."""
    x = np.maximum(s, 0.0)
    covered = codes >= 0
    if not np.any(covered):
        return x
    sc, cc = s[covered], codes[covered]
    n_groups = totals.size
    sizes = np.bincount(cc, minlength=n_groups)
    order = np.lexsort((-sc, cc))  # by group, then decreasing value
    u, cu = sc[order], cc[order]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.arange(u.size) - starts[cu] + 1
    # within-group running sums, each group's sum taken relative to the group's largest value
    # (reduces cancellation in the global cumulative sum)
    top = np.zeros(n_groups)
    top[cu[rank == 1]] = u[rank == 1]
    shifted = u - top[cu]
    cs = np.cumsum(shifted)
    before = np.concatenate([[0.0], cs])[starts]
    running = cs - before[cu] + rank * top[cu]
    positive = u - (running - totals[cu]) / rank > 0  # true for ranks 1..rho, false after
    live = totals > 0  # a zero total forces the whole group to 0
    rho = np.bincount(cu, weights=positive, minlength=n_groups).astype(np.int64)
    rho = np.maximum(rho, live.astype(np.int64))  # rank 1 always qualifies when t > 0
    tau = np.zeros(n_groups)
    in_support = rank <= rho[cu]
    sums = np.bincount(cu, weights=np.where(in_support, u, 0.0), minlength=n_groups)
    tau[live] = (sums[live] - totals[live]) / rho[live]
    # Michelot's fixed point: re-derive the support from tau (guards the rounding in the sums)
    for _ in range(3):
        support = sc > tau[cc]
        count = np.bincount(cc, weights=support, minlength=n_groups)
        ok = live & (count > 0)
        new = tau.copy()
        new[ok] = (np.bincount(cc, weights=np.where(support, sc, 0.0), minlength=n_groups)[ok]
                   - totals[ok]) / count[ok]
        if np.array_equal(new, tau):
            break
        tau = new
    xc = np.maximum(sc - tau[cc], 0.0)
    xc[~live[cc]] = 0.0
    x[covered] = xc
    gap = np.abs(np.bincount(cc, weights=xc, minlength=n_groups) - totals)
    if np.any(gap > KKT_TOLERANCE["primal"] * np.maximum(1.0, np.abs(totals))):
        raise RuntimeError(f"simplex projection missed a group total by {gap.max():.3g} (not expected)")
    return x


# --- general QP: primal active set ---------------------------------------------------------------


class _QP:
    """min 1/2 x^T H x - h^T x  s.t.  C x = c (orthonormal rows), x >= 0 (optional).

    ``H`` is a 1-D array (a positive diagonal: Q = I, or queries on disjoint cells; each step
    then costs O(d m^2)) or a dense symmetric matrix (each step: a Cholesky factorisation of the
    free block, O(|F|^3))."""

    def __init__(self, H, h, C, c):
        self.h, self.C, self.c = h, C, c
        self.d = h.size
        if H.ndim == 1:
            self.diag, self.H = H, None
            self.rho = max(1.0, float(np.max(H)))
        else:
            self.diag, self.H = None, H
            self.rho = max(1.0, float(np.max(np.abs(np.diag(H)))))
        self.abs_h = float(np.max(np.abs(h)))

    def gradient(self, x: np.ndarray) -> np.ndarray:
        return (self.diag * x if self.diag is not None else self.H @ x) - self.h

    def gradient_scale(self, x: np.ndarray) -> float:
        hx = self.diag * np.abs(x) if self.diag is not None else np.abs(self.H) @ np.abs(x)
        return max(1.0, float(np.max(hx)), self.abs_h)

    def eqp(self, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Minimiser over the free cells (the others fixed at 0) subject to C x = c, and the
        multipliers lambda of C x = c (H y - h = C^T lambda on the free cells)."""
        h_f = self.h[free]
        C_f = self.C[:, free]
        if self.diag is not None:  # y = D^-1 (h + C^T lam),  C D^-1 C^T lam = c - C D^-1 h
            D = self.diag[free]
            y = h_f / D
            if self.C.shape[0] == 0:
                return y, np.zeros(0)
            CDi = C_f / D
            lam = np.linalg.lstsq(CDi @ C_f.T, self.c - C_f @ y, rcond=1e-12)[0]
            return y + CDi.T @ lam, lam
        # augmented Lagrangian form: K = H_FF + rho C_F^T C_F is positive definite when the
        # estimate is identified, and has the same constrained minimiser
        H_ff = self.H[np.ix_(free, free)]
        K = H_ff + self.rho * (C_f.T @ C_f)
        rhs = h_f + self.rho * (C_f.T @ self.c)
        try:
            factor = scipy.linalg.cho_factor(K, check_finite=False)
        except np.linalg.LinAlgError:
            raise RuntimeError(
                "quadratic-programme solver failed: the reduced Hessian is not positive definite "
                "(numerically unidentifiable estimate)"
            ) from None
        y = scipy.linalg.cho_solve(factor, rhs, check_finite=False)
        if self.C.shape[0] == 0:
            return y, np.zeros(0)
        KiCt = scipy.linalg.cho_solve(factor, C_f.T, check_finite=False)
        nu = np.linalg.lstsq(C_f @ KiCt, C_f @ y - self.c, rcond=1e-12)[0]
        return y - KiCt @ nu, -nu

    def solve(self, x0: np.ndarray, fixed0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """From a feasible x0 with x0 = 0 on ``fixed0``: (x, lambda, free set) at the optimum
        (Nocedal & Wright 2006, Algorithm 16.3, with bounds x_i >= 0 as the inequalities)."""
        x = np.maximum(x0, 0.0)
        fixed = fixed0.copy()
        x[fixed] = 0.0
        max_iter = 20 * (self.d + self.C.shape[0]) + 100
        for _ in range(max_iter):
            free = ~fixed
            idx = np.flatnonzero(free)
            y, lam = self.eqp(free)
            p = y - x[free]
            scale = max(1.0, float(np.max(np.abs(x))), float(np.max(np.abs(y), initial=0.0)))
            if np.max(np.abs(p), initial=0.0) <= 1e-11 * scale:
                x[free] = np.maximum(y, 0.0)  # y >= 0 up to rounding here
                x[fixed] = 0.0
                if not np.any(fixed):
                    return x, lam, free
                mu = self.gradient(x) - self.C.T @ lam
                fixed_idx = np.flatnonzero(fixed)
                j = int(np.argmin(mu[fixed_idx]))
                if mu[fixed_idx[j]] >= -1e-10 * self.gradient_scale(x):
                    return x, lam, free
                fixed[fixed_idx[j]] = False  # release the most negative multiplier
                continue
            xf = x[free]
            blocking = p < 0
            ratios = np.full(p.size, np.inf)
            ratios[blocking] = xf[blocking] / -p[blocking]
            k = int(np.argmin(ratios))
            if ratios[k] >= 1.0:
                x[free] = y
                continue
            x[free] = np.maximum(xf + ratios[k] * p, 0.0)
            x[idx[k]] = 0.0
            fixed[idx[k]] = True  # the first bound hit joins the working set
        raise RuntimeError(
            f"quadratic-programme solver failed: no convergence within {max_iter} active-set steps"
        )


def _feasible_point(A: np.ndarray, a: np.ndarray, zero: np.ndarray | None = None) -> np.ndarray | None:
    """Some x >= 0 with A x = a (and x = 0 where ``zero``), by linear programming; None if none."""
    d = A.shape[1]
    upper = np.full(d, np.inf)
    if zero is not None:
        upper[zero] = 0.0
    res = scipy.optimize.linprog(np.zeros(d), A_eq=A.astype(float), b_eq=a,
                                 bounds=np.column_stack([np.zeros(d), upper]), method="highs")
    if res.status == 2:
        return None
    if res.status != 0:
        raise RuntimeError(f"feasibility linear programme failed: {res.message}")
    return np.maximum(res.x, 0.0)


def _check_kkt(qp: _QP, A, a, x, lam, free, *, nonnegative: bool = True) -> None:
    """Verify the KKT conditions to KKT_TOLERANCE with the multipliers ``lam`` of C x = c
    (``range(C^T) = range(A^T)``) and the free set ``free``; RuntimeError if they fail."""
    if nonnegative and (np.any(x < 0) or np.any(x[~free] != 0)):
        raise RuntimeError("quadratic-programme solver failed: negative or non-zero fixed cell")
    if A is not None:
        Af = A.astype(float)
        pscale = max(1.0, float(np.max(np.abs(Af) @ np.abs(x))), float(np.max(np.abs(a))))
        presid = float(np.max(np.abs(Af @ x - a)))
        if presid > KKT_TOLERANCE["primal"] * pscale:
            raise RuntimeError(
                f"quadratic-programme solver failed: |A x - a| = {presid:.3g} exceeds the tolerance "
                f"{KKT_TOLERANCE['primal'] * pscale:.3g}"
            )
    mu = qp.gradient(x) - qp.C.T @ lam
    dual_tol = KKT_TOLERANCE["dual"] * qp.gradient_scale(x)
    bad_free = float(np.max(np.abs(mu[free]), initial=0.0))
    bad_sign = float(-np.min(mu[~free], initial=0.0))
    if bad_free > dual_tol or bad_sign > dual_tol:
        raise RuntimeError(
            "quadratic-programme solver failed the KKT check: stationarity residual "
            f"{bad_free:.3g}, most negative bound multiplier {-bad_sign:.3g} (tolerance {dual_tol:.3g})"
        )


def _warm_start(qp: _QP, A, a, guess: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A feasible start (x0, fixed set) for the active-set method. A few primal-dual active-set
    sweeps (fix the cells that are negative, free those whose multiplier is negative) usually
    find the optimal set outright; the active-set method then only confirms it. This only
    chooses the starting point: the answer is decided by the active-set method and its KKT check."""
    d = qp.d
    fixed = guess.copy()
    for _ in range(30):
        y, lam = qp.eqp(~fixed)
        x = np.zeros(d)
        x[~fixed] = y
        mu = qp.gradient(x) - qp.C.T @ lam
        new = np.where(fixed, mu > 0, x < 0)
        if np.array_equal(new, fixed):
            break
        fixed = new
    x = np.zeros(d)
    y, _ = qp.eqp(~fixed)
    x[~fixed] = y
    if np.all(x >= 0):
        if A is None:
            return x, fixed
        Af = A.astype(float)
        scale = max(1.0, float(np.max(np.abs(Af) @ np.abs(x))), float(np.max(np.abs(a))))
        if np.max(np.abs(Af @ x - a)) <= 1e-10 * scale:
            return x, fixed
    if A is None:
        return np.maximum(x, 0.0), fixed
    x0 = _feasible_point(A, a, zero=fixed)
    if x0 is not None:
        return x0, fixed
    return _feasible_point(A, a), np.zeros(d, dtype=bool)


def _solve_qp(H: np.ndarray, h: np.ndarray, A: np.ndarray | None, a: np.ndarray | None,
              *, nonnegative: bool = True, dense: bool = False, warm: bool = True) -> np.ndarray:
    """argmin 1/2 x^T H x - h^T x s.t. A x = a (if A given), x >= 0 (if nonnegative); exact
    primal active set, KKT-checked. For least squares ||M x - b||^2: H = M^T M, h = M^T b.

    ``H``: 1-D (a diagonal) or 2-D; a diagonal 2-D H is used as 1-D unless ``dense``. H must be
    positive definite on the null space of A (checked: ValueError otherwise). ``warm=False``
    starts the active-set method from a vertex of the feasible set (for testing the method)."""
    d = h.size
    if H.ndim == 2 and not dense:
        diag = np.diag(H)
        if np.all(diag > 0) and np.count_nonzero(H - np.diag(diag)) == 0:
            H = diag.copy()
    if A is not None:
        C, c = _constraint_basis(A, a)
    else:
        C, c = np.zeros((0, d)), np.zeros(0)
    if H.ndim == 1:
        if np.any(H <= 0):
            raise ValueError("the diagonal of the least-squares Hessian must be > 0")
    else:
        Hn = H / max(1e-300, float(np.max(np.abs(H))))
        rank = np.linalg.matrix_rank(Hn + C.T @ C, hermitian=True)
        if rank < d:
            raise ValueError(
                f"the queries and invariants do not determine the {d} cells (rank {rank} < {d}): "
                "the least-squares estimate is not unique; add queries or invariants"
            )
    qp = _QP(H, h, C, c)
    everything = np.ones(d, dtype=bool)
    y0, lam0 = qp.eqp(everything)
    if not nonnegative:
        _check_kkt(qp, A, a, y0, lam0, everything, nonnegative=False)
        return y0
    if A is not None and _feasible_point(A, a) is None:
        raise ValueError(
            "infeasible invariants: no x >= 0 satisfies invariants_matrix @ x = invariant_values"
        )
    if np.all(y0 >= 0):
        x, lam, free = y0, lam0, everything
    else:
        if warm:
            x0, fixed0 = _warm_start(qp, A, a, y0 < 0)
        else:
            x0 = np.zeros(d) if A is None else _feasible_point(A, a)
            fixed0 = np.zeros(d, dtype=bool)
        x, lam, free = qp.solve(x0, fixed0)
    _check_kkt(qp, A, a, x, lam, free)
    return x


# --- public API ----------------------------------------------------------------------------------


def nonnegative_least_squares(release, *, invariants_matrix=None, invariant_values=None,
                              groups=None) -> np.ndarray:
    r"""Least-squares projection of a release onto the invariants and the non-negative orthant.

    ``x_hat = argmin_x ||x - s||_2^2  subject to  A x = a,  x >= 0``  (real-valued), the first step
    of Census TopDown-style post-processing (Abowd et al. 2022, "The 2020 Census Disclosure
    Avoidance System TopDown Algorithm"; inference notes §5: the likelihood-free baseline).

    Parameters
    ----------
    release : 1-D array of d finite numbers
        The noisy release ``s``.
    invariants_matrix : integer matrix (m, d), optional
        ``A``; a 1-D array is one row. Mutually exclusive with ``groups``. When its non-zero rows
        are disjoint 0/1 group indicators the closed form below is used; otherwise the general
        exact QP solver (primal active set, KKT-checked to :data:`KKT_TOLERANCE`).
    invariant_values : optional
        ``a``. With ``invariants_matrix``: m numbers, default ``A @ release`` (the release of a
        mechanism conditioned on the invariants satisfies them). With ``groups``: one total per
        group, either a mapping ``{label: total}`` or an array in the order of the sorted labels
        (``numpy.unique(groups)``); default the per-group sums of ``release``.
    groups : 1-D array of d integer or string labels, optional
        One exact total per group (disjoint groups; a single label = a single grand total). Solved
        by the closed-form projection onto a scaled simplex, per group ``g`` with total ``t_g``:
        ``x_i = max(s_i - tau_g, 0)``, ``tau_g = (sum_{j<=rho} u_j - t_g)/rho`` with ``u`` the
        group's values sorted decreasingly and ``rho = max{j : u_j > (sum_{k<=j} u_k - t_g)/j}``
        (Held, Wolfe & Crowder 1974; Duchi et al. 2008). O(d log d).

    With neither ``invariants_matrix`` nor ``groups`` there is no equality constraint and the
    projection is just ``max(s, 0)`` (clip at zero).

    Returns
    -------
    float64 array of shape (d,), ``>= 0``, with ``A x_hat = a`` to rounding (relative 1e-9).

    Raises
    ------
    ValueError
        Bad shapes; NaN/inf; ``A`` with non-whole entries; both ``groups`` and
        ``invariants_matrix``; ``invariant_values`` without either; ``a`` not consistent with
        ``A`` (no real solution); no ``x >= 0`` with ``A x = a`` (e.g. a negative total).
    TypeError
        Non-numeric input; group labels neither integers nor strings.
    RuntimeError
        The general solver did not converge or failed its KKT check (not expected).
    """
    s = _as_vector("release", release)
    d = s.size
    if groups is not None and invariants_matrix is not None:
        raise ValueError("give either groups or invariants_matrix, not both")
    if groups is not None:
        labels, codes = _group_codes(groups, d)
        if invariant_values is None:
            totals = np.bincount(codes, weights=s, minlength=labels.size)
        else:
            totals = _group_totals(invariant_values, labels)
        _check_group_totals(totals, labels)
        return _project_groups(s, codes, totals)
    if invariants_matrix is None:
        if invariant_values is not None:
            raise ValueError("invariant_values was given without invariants_matrix or groups")
        return np.maximum(s, 0.0)
    A = _as_matrix("invariants_matrix", invariants_matrix, d)
    a = A @ s if invariant_values is None else _invariant_vector(invariant_values, A.shape[0])
    _constraint_basis(A, a)  # consistency (ValueError)
    codes = _group_structure(A)
    if codes is not None:
        totals = a.astype(np.float64)
        _check_group_totals(totals, np.arange(A.shape[0]))
        return _project_groups(s, codes, totals)
    return _solve_qp(np.ones(d), s, A, a, nonnegative=True)


def _check_group_totals(totals: np.ndarray, labels: np.ndarray) -> None:
    if np.any(totals < 0):
        bad = [(lab, float(t)) for lab, t in zip(labels.tolist(), totals) if t < 0][:5]
        raise ValueError(
            f"infeasible invariants: no x >= 0 has these group totals, some are negative: {bad} "
            "(group label, total)"
        )


def generalized_least_squares(queries, releases, variances, *, invariants_matrix=None,
                              invariant_values=None, nonnegative=True) -> np.ndarray:
    r"""Generalised least-squares estimate of the cells from several linear-query releases.

    ``x_hat = argmin_x sum_r ||Q_r x - s_r||_2^2 / v_r  subject to  A x = a  (if A given),
    x >= 0  (if nonnegative)``: the TopDown-style estimate combining releases of different
    queries (Abowd et al. 2022, "The 2020 Census Disclosure Avoidance System TopDown Algorithm";
    inference notes §5). With ``nonnegative=False`` it is the best linear unbiased estimate (with
    or without the equality invariants) when the noises are uncorrelated with variances ``v_r``;
    non-negativity makes it non-linear and biased for small counts.

    Parameters
    ----------
    queries : sequence of integer matrices ``Q_r`` of shape (n_r, d)
        A 1-D array is one query row (e.g. the total ``np.ones(d)``). All share the d columns.
    releases : sequence of 1-D arrays ``s_r`` of length n_r (a number for a single row)
    variances : sequence of noise variances ``v_r`` > 0, one per release
        (a number, or an array of n_r per-entry variances). Use ``mechanism.noise_variance``.
        A query released without noise is an invariant: pass it as ``invariants_matrix``.
    invariants_matrix, invariant_values : optional
        Exact constraints ``A x = a`` (A an integer (m, d) matrix; ``invariant_values`` required
        with it).
    nonnegative : bool
        Impose ``x >= 0`` (default True).

    Method: if every ``Q_r = I`` with a scalar variance and ``A`` is absent or disjoint 0/1 group
    indicators, the objective equals ``(sum_r 1/v_r) ||x - s_bar||^2`` + const with
    ``s_bar = sum_r (s_r/v_r) / sum_r (1/v_r)`` and the closed-form simplex projection applies
    (without non-negativity: ``x_i = s_bar_i - (sum_g s_bar - t_g)/n_g``). Otherwise the exact
    primal active-set QP solver, KKT-checked to :data:`KKT_TOLERANCE`.

    Returns
    -------
    float64 array of shape (d,).

    Raises
    ------
    ValueError
        Mismatched lengths or shapes; variances not > 0; ``Q_r`` or ``A`` with non-whole entries;
        ``a`` missing or not consistent with ``A``; no ``x >= 0`` with ``A x = a``; queries plus
        invariants that do not determine x (rank < d).
    TypeError
        Queries/releases/variances not lists or tuples; non-numeric entries; non-bool flag.
    RuntimeError
        The solver did not converge or failed its KKT check (not expected).
    """
    nonnegative = _check_flag("nonnegative", nonnegative)
    for name, value in (("queries", queries), ("releases", releases), ("variances", variances)):
        if isinstance(value, (str, bytes, np.ndarray)) or not isinstance(value, Sequence):
            raise TypeError(
                f"{name} must be a list or tuple with one entry per release, got {type(value).__name__}"
            )
    if len(queries) == 0:
        raise ValueError("queries must hold at least one query matrix")
    if not (len(queries) == len(releases) == len(variances)):
        raise ValueError(
            f"queries, releases and variances must have the same length, got {len(queries)}, "
            f"{len(releases)} and {len(variances)}"
        )
    first = np.asarray(queries[0])
    d = first.shape[-1] if first.ndim in (1, 2) else -1
    if d <= 0:
        raise ValueError(f"queries[0] must be an integer matrix (n_0, d), got shape {first.shape}")
    Qs, ss, ws = [], [], []
    for r, (Q, s, v) in enumerate(zip(queries, releases, variances)):
        Q = _as_matrix(f"queries[{r}]", Q, d)
        s = as_real_array(f"releases[{r}]", s)
        if s.ndim == 0:
            s = s[None]
        if s.shape != (Q.shape[0],):
            raise ValueError(
                f"releases[{r}] must have one value per row of queries[{r}] ({Q.shape[0]}), "
                f"got shape {s.shape}"
            )
        if isinstance(v, bool):
            raise TypeError(f"variances[{r}] must be a number > 0, got {v!r}")
        v = as_real_array(f"variances[{r}]", v)
        if v.ndim > 1 or (v.ndim == 1 and v.shape != s.shape):
            raise ValueError(
                f"variances[{r}] must be one number or one per entry of releases[{r}] "
                f"({s.size}), got shape {v.shape}"
            )
        if np.any(v <= 0):
            raise ValueError(
                f"variances[{r}] must be > 0, got {v.tolist()}; an exactly known query belongs in "
                "invariants_matrix"
            )
        Qs.append(Q)
        ss.append(s)
        ws.append(v)
    if invariants_matrix is None:
        if invariant_values is not None:
            raise ValueError("invariant_values was given without invariants_matrix")
        A = a = None
    else:
        A = _as_matrix("invariants_matrix", invariants_matrix, d)
        if invariant_values is None:
            raise ValueError("invariant_values is required with invariants_matrix (the exact values a)")
        a = _invariant_vector(invariant_values, A.shape[0])
        _constraint_basis(A, a)  # consistency (ValueError)

    identity = all(Q.shape == (d, d) and w.ndim == 0 and np.count_nonzero(Q) == d and np.all(np.diag(Q) == 1)
                   for Q, w in zip(Qs, ws))
    codes = None if A is None else _group_structure(A)
    if identity and (A is None or codes is not None):
        weights = np.array([1.0 / float(w) for w in ws])
        s_bar = sum(wt * s for wt, s in zip(weights, ss)) / weights.sum()
        if A is None:
            return np.maximum(s_bar, 0.0) if nonnegative else s_bar
        totals = a.astype(np.float64)
        if nonnegative:
            _check_group_totals(totals, np.arange(A.shape[0]))
            return _project_groups(s_bar, codes, totals)
        x = s_bar.copy()
        covered = codes >= 0
        n = np.bincount(codes[covered], minlength=totals.size)
        shift = np.zeros(totals.size)
        has = n > 0
        shift[has] = (np.bincount(codes[covered], weights=s_bar[covered], minlength=totals.size)[has]
                      - totals[has]) / n[has]
        x[covered] -= shift[codes[covered]]
        return x

    # H = sum_r Q_r^T V_r^-1 Q_r,  h = sum_r Q_r^T V_r^-1 s_r
    H = sum(Q.T @ (Q / (w[:, None] if w.ndim else float(w))) for Q, w in zip(Qs, ws))
    h = sum(Q.T @ (s / w) for Q, s, w in zip(Qs, ss, ws))
    return _solve_qp(H, h, A, a, nonnegative=nonnegative)


def _largest_remainder(x: np.ndarray, codes: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Floor every cell, then one extra unit to the ``t_g - sum floor`` largest remainders of each
    group (ties: lowest index). Requires x >= 0 and group sums equal to the totals (to < 1)."""
    base = np.floor(x)
    frac = x - base
    out = base.astype(np.int64)
    covered = codes >= 0
    cc = codes[covered]
    missing = totals - np.bincount(cc, weights=base[covered], minlength=totals.size).astype(np.int64)
    idx = np.flatnonzero(covered)
    order = np.lexsort((idx, -frac[covered], cc))  # by group, then remainder desc, then index
    ordered_groups = cc[order]
    sizes = np.bincount(cc, minlength=totals.size)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.arange(order.size) - starts[ordered_groups]
    bump = rank < missing[ordered_groups]
    out[idx[order[bump]]] += 1
    return out


def _greedy_groups(x: np.ndarray, codes: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """L1-closest integer x >= 0 with disjoint group sums = totals, for any real x_hat.

    Start from the per-cell minimiser r = max(rint(x_hat), 0); a group short of its total by k
    takes the k cheapest unit moves in one direction. The objective is separable and convex, so
    this greedy choice is optimal (Ibaraki & Katoh 1988, Resource Allocation Problems, ch. 4).
    The first move of a cell costs 1 - 2|x_hat - r| (towards x_hat) or 1 (away); every further
    move costs 1, so after the cheap first moves any remaining units can go anywhere allowed."""
    r = np.maximum(np.rint(x), 0.0).astype(np.int64)
    out = r.copy()
    covered = np.flatnonzero(codes >= 0)
    if covered.size == 0:
        return out
    cc, xc, rc = codes[covered], x[covered], r[covered]
    n_groups = totals.size
    k = totals - np.bincount(cc, weights=rc, minlength=n_groups).astype(np.int64)
    sizes = np.bincount(cc, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    up = k[cc] > 0
    cost = np.where(up, 1.0 - 2.0 * np.maximum(xc - rc, 0.0),
                    np.where(rc >= 1, 1.0 - 2.0 * np.maximum(rc - xc, 0.0), np.inf))
    need = np.abs(k)
    # cheap first moves: within each group by cost, then index
    order = np.lexsort((covered, cost, cc))
    rank = np.arange(order.size) - starts[cc[order]]
    first = np.zeros(covered.size, dtype=np.int64)
    first[order] = (rank < need[cc[order]]) & np.isfinite(cost[order])
    step = np.where(up, 1, -1)
    out[covered] += step * first
    # remaining units, all at cost 1: increments spread evenly (lowest indices get the
    # remainder); decrements taken in index order from the cells' remaining counts
    extra = need - np.bincount(cc, weights=first, minlength=n_groups).astype(np.int64)
    by_index = np.lexsort((covered, cc))
    index_rank = np.empty(covered.size, dtype=np.int64)
    index_rank[by_index] = np.arange(covered.size) - starts[cc[by_index]]
    q, rem = np.divmod(extra[cc], sizes[cc])
    out[covered] += np.where(up, q + (index_rank < rem), 0)
    capacity = np.where(up, 0, rc - first)
    cap_sorted = capacity[by_index]
    cum = np.cumsum(cap_sorted)
    before = cum - cap_sorted - np.concatenate([[0], cum])[starts[cc[by_index]]]
    take = np.zeros(covered.size, dtype=np.int64)
    take[by_index] = np.clip(extra[cc[by_index]] - before, 0, cap_sorted)
    out[covered] += step * take
    return out


def _nearly_integer(name: str, values: np.ndarray, *, exact: bool = False) -> np.ndarray:
    """Whole numbers as int64: exactly (given values: never rounded silently) or to 1e-6
    relative (defaults computed from x_hat in floating point)."""
    rounded = np.rint(values)
    tol = 0.0 if exact else 1e-6 * np.maximum(1.0, np.abs(values))
    if np.any(np.abs(values - rounded) > tol):
        bad = values[np.abs(values - rounded) > tol][:3]
        raise ValueError(
            f"{name} must be whole numbers (an integer table has integer totals), found "
            f"{bad.tolist()}; pass integer invariant_values"
        )
    return rounded.astype(np.int64)


def round_to_invariants(x_hat, *, invariants_matrix=None, invariant_values=None,
                        groups=None) -> np.ndarray:
    r"""Integer table closest in L1 to ``x_hat`` that satisfies the invariants exactly.

    ``x_int = argmin ||x - x_hat||_1  over integers x >= 0 with A x = a``, the rounding step of
    TopDown-style post-processing (Abowd et al. 2022, "The 2020 Census Disclosure Avoidance
    System TopDown Algorithm"; inference notes §5).

    * No invariants: each cell rounded to the nearest integer >= 0 (halves to even).
    * Disjoint group totals (``groups``, or an ``invariants_matrix`` whose non-zero rows are
      disjoint 0/1 indicators), when ``x_hat >= 0`` and each group of ``x_hat`` sums to its total
      (as :func:`nonnegative_least_squares` returns): largest-remainder (Hamilton) method — floor,
      then one unit more for the ``t_g - sum floor(x_hat)`` cells with the largest fractional parts
      (ties to the lowest index). This is L1-optimal. For other ``x_hat`` (negative cells, or
      group sums off the totals, e.g. rounding a raw release to published totals): start from
      ``max(rint(x_hat), 0)`` and make the cheapest unit moves towards each total (optimal for
      this separable convex objective).
    * Otherwise: mixed-integer programme ``min sum_i u_i  s.t.  u >= x - x_hat,  u >= x_hat - x,
      A x = a,  x >= 0 integer`` (``scipy.optimize.milp``, HiGHS, zero gap); the answer is
      re-verified in integer arithmetic.

    The optimum need not be unique (ties); one optimal table is returned.

    Parameters
    ----------
    x_hat : 1-D array of d finite numbers
    invariants_matrix, invariant_values, groups
        As in :func:`nonnegative_least_squares`. ``a`` must be whole numbers; its default is
        ``A @ x_hat`` (resp. the group sums of ``x_hat``), which must then be whole numbers to
        within 1e-6 relative.

    Returns
    -------
    int64 array of shape (d,), ``>= 0``, with ``A @ x_int == a`` exactly.

    Raises
    ------
    ValueError
        Bad shapes; ``A`` or given ``a`` with non-whole entries (never rounded); ``a``
        inconsistent with ``A``; no non-negative integer x with ``A x = a`` (one can exist in the
        reals but not in the integers).
    TypeError
        Non-numeric input; group labels neither integers nor strings.
    RuntimeError
        The MILP solver stopped without an optimal, exactly feasible answer.
    """
    x = _as_vector("x_hat", x_hat)
    d = x.size
    if groups is not None and invariants_matrix is not None:
        raise ValueError("give either groups or invariants_matrix, not both")
    if groups is None and invariants_matrix is None:
        if invariant_values is not None:
            raise ValueError("invariant_values was given without invariants_matrix or groups")
        return np.maximum(np.rint(x), 0.0).astype(np.int64)
    if groups is not None:
        labels, codes = _group_codes(groups, d)
        sums = np.bincount(codes, weights=x, minlength=labels.size)
        if invariant_values is None:
            totals = _nearly_integer("the group sums of x_hat (default invariant_values)", sums)
        else:
            totals = _nearly_integer("invariant_values", _group_totals(invariant_values, labels), exact=True)
        _check_group_totals(totals, labels)
        A = scipy.sparse.csr_array((np.ones(d, dtype=np.int64), (codes, np.arange(d))), shape=(labels.size, d))
    else:
        A = _as_matrix("invariants_matrix", invariants_matrix, d)
        if invariant_values is None:
            totals = _nearly_integer("A @ x_hat (default invariant_values)", A @ x)
        else:
            totals = _nearly_integer("invariant_values", _invariant_vector(invariant_values, A.shape[0]),
                                     exact=True)
        _constraint_basis(A, totals.astype(np.float64))  # consistency (ValueError)
        codes = _group_structure(A)
        if codes is not None:
            _check_group_totals(totals, np.arange(A.shape[0]))
    if codes is not None:
        covered = codes >= 0
        sums = np.bincount(codes[covered], weights=x[covered], minlength=totals.size)
        tol = 1e-9 * np.maximum(1.0, np.abs(totals))
        if np.all(x >= -1e-12 * max(1.0, float(np.max(np.abs(x))))) and np.all(np.abs(sums - totals) <= tol):
            out = _largest_remainder(np.maximum(x, 0.0), codes, totals)
            out[~covered] = np.maximum(np.rint(x[~covered]), 0).astype(np.int64)
            if np.all(out >= 0) and np.array_equal(A @ out, totals):
                return out
        out = _greedy_groups(x, codes, totals)
        if np.all(out >= 0) and np.array_equal(A @ out, totals):
            return out
    return _milp_round(x, A, totals)


def _milp_round(x: np.ndarray, A: np.ndarray, a: np.ndarray) -> np.ndarray:
    """min sum u s.t. u >= x - x_hat, u >= x_hat - x, A x = a, x >= 0 integer (sparse rows).

    Linearly dependent rows of ``A`` (consistent ones: the callers check) are dropped first:
    HiGHS can stop with "Solve error" on redundant equalities (seen with both margins of a
    3 x 3 table, whose 6 rows have rank 5)."""
    d = x.size
    keep = greedy_independent_rows(scipy.sparse.csr_array(A))
    m = keep.size
    eye = scipy.sparse.eye_array(d, format="csr")
    A_sp = scipy.sparse.csr_array(A, dtype=np.float64)[keep]
    constraints = [
        scipy.optimize.LinearConstraint(scipy.sparse.hstack([A_sp, scipy.sparse.csr_array((m, d))]),
                                        a[keep], a[keep]),
        scipy.optimize.LinearConstraint(scipy.sparse.hstack([eye, -eye]), -np.inf, x),  # x - u <= x_hat
        scipy.optimize.LinearConstraint(scipy.sparse.hstack([-eye, -eye]), -np.inf, -x),  # x_hat - x <= u
    ]
    res = scipy.optimize.milp(
        np.concatenate([np.zeros(d), np.ones(d)]),
        constraints=constraints,
        integrality=np.concatenate([np.ones(d), np.zeros(d)]),
        bounds=scipy.optimize.Bounds(0.0, np.inf),
        options={"mip_rel_gap": 0.0},
    )
    if res.status == 2:
        raise ValueError(
            "infeasible invariants: no non-negative integer x satisfies invariants_matrix @ x = "
            "invariant_values"
        )
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"integer rounding (MILP) failed: {res.message}")
    out = np.rint(res.x[:d]).astype(np.int64)
    if np.any(out < 0) or not np.array_equal(A @ out, a):
        raise RuntimeError("integer rounding (MILP) returned a table that does not meet A x = a exactly")
    return out


def noise_only_intervals(point, mechanism, prob=0.9, *, clip_at_zero=False) -> tuple[np.ndarray, np.ndarray]:
    r"""The likelihood-free analyst's interval: ``[x_point + lo, x_point + hi]``.

    ``(lo, hi) = mechanism.noise_interval(prob)`` is the central interval of the noise law,
    ``(-q, q)`` with ``P(|e| <= q) >= prob`` (the baseline of Abowd et al. 2022-style
    post-processed releases; inference notes §5). Around the raw release (``point = release``)
    it covers each true count with probability >= ``prob``; around a projected or rounded
    estimate that guarantee is gone (the estimate's error is not the mechanism's noise).

    Parameters
    ----------
    point : array of finite numbers (any shape)
        The point estimates ``x_point`` (release, projection or rounding).
    mechanism : object with ``noise_interval(prob) -> (lo, hi)``
        e.g. :class:`dpinfer.DoubleGeometric`.
    prob : float in (0, 1)
    clip_at_zero : bool, default False
        If True, both ends are replaced by ``max(end, 0)``: counts are non-negative, so this never
        removes a possible true value. Off by default so that the interval is exactly the
        textbook ``point ± q`` and its width shows the noise scale.

    Returns
    -------
    (lower, upper) : float64 arrays shaped like ``point``.
    """
    x = as_real_array("point", point)
    prob = check_probability(prob)
    clip_at_zero = _check_flag("clip_at_zero", clip_at_zero)
    method = getattr(mechanism, "noise_interval", None)
    if not callable(method):
        raise TypeError(
            "mechanism must provide noise_interval(prob) -> (lo, hi) (a dpinfer mechanism), got "
            f"{type(mechanism).__name__}"
        )
    bounds = method(prob)
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise TypeError(f"mechanism.noise_interval({prob}) must return a pair (lo, hi), got {bounds!r}") from None
    for name, value in (("lo", lo), ("hi", hi)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
            raise ValueError(f"mechanism.noise_interval returned a non-finite or non-real {name}: {value!r}")
    if not float(lo) <= 0.0 <= float(hi):
        raise ValueError(f"mechanism.noise_interval must return lo <= 0 <= hi, got ({lo!r}, {hi!r})")
    lower, upper = x + float(lo), x + float(hi)
    if clip_at_zero:
        lower, upper = np.maximum(lower, 0.0), np.maximum(upper, 0.0)
    return lower, upper
