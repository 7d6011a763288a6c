r"""The equalities and bounds that cannot all hold: an irreducible infeasible subset.

For rows ``lower <= A x <= upper`` (A sparse; a row with lower == upper an equality, an
infinite side no bound) and boxes ``lo <= x <= hi`` over real x, :func:`conflicting_rows`
says whether some x meets them all (a linear programme, HiGHS through
``scipy.optimize.linprog``) and, if none does, returns an **irreducible infeasible subset**
(IIS) of the rows: together with the boxes they cannot all hold, but with any one of them left
out the others can. An error that names these rows names the conflict, not the rows that
happen to be violated at some trial point.

Found in two steps (Chinneck, *Feasibility and Infeasibility in Optimization*, 2008, ch. 6):

1. **A sparsest certificate.** By Farkas' lemma the rows cannot all hold within the boxes
   iff multipliers y of the rows (>= 0 on a row's upper side, <= 0 on its lower side, free on
   an equality) give g = A'y with min over the boxes of g'x > y'b, b each side's bound. The
   rows with y_i != 0 then cannot all hold either (the same y certifies them), so the
   certificate of least sum |y_i| with min g'x - y'b >= 1 is found (a linear programme; the
   boxes' own multipliers cost nothing, so a structural zero is not used where x >= 0 already
   serves, as a plain phase-1 dual would do in a degenerate vertex).
2. **Deletion filter.** Each row of that set in turn is left out for good if the others still
   cannot all hold; what remains is irreducible. Each test is a programme over the columns its
   rows touch only (the other columns are free in their boxes). The filter solves one
   programme per row of the set, so it runs only when the set has at most ``MAX_FILTERED``
   rows; a larger set (a parent's total against the lower bounds of its thousands of blocks)
   is returned as the certificate gives it: rows that cannot all hold, without the proof that
   each is needed.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.sparse

__all__ = ["conflicting_rows"]

_DUAL_TOL = 1e-9
MAX_FILTERED = 100  # the deletion filter's largest set (module docstring)


def conflicting_rows(A, lower, upper, lo, hi) -> np.ndarray | None:
    """None if some real x with ``lo <= x <= hi`` meets ``lower <= A x <= upper``, else the
    indices (sorted) of an irreducible infeasible subset of the rows (module docstring; a set
    of more than ``MAX_FILTERED`` rows is the certificate's, not filtered).

    ``A`` (m, n) sparse or dense; ``lower``, ``upper`` (m,) with -inf / +inf for no bound;
    ``lo``, ``hi`` (n,) with lo <= hi (checked)."""
    A = scipy.sparse.csr_array(A, dtype=np.float64)
    lower = np.asarray(lower, dtype=np.float64).reshape(-1)
    upper = np.asarray(upper, dtype=np.float64).reshape(-1)
    lo = np.asarray(lo, dtype=np.float64).reshape(-1)
    hi = np.asarray(hi, dtype=np.float64).reshape(-1)
    m, n = A.shape
    if lower.size != m or upper.size != m or lo.size != n or hi.size != n:
        raise ValueError(f"lower and upper must have one entry per row ({m}), lo and hi one per column "
                         f"({n}); got {lower.size}, {upper.size}, {lo.size}, {hi.size}")
    if np.any(lo > hi) or np.any(np.isnan(lo) | np.isnan(hi)):
        raise ValueError("the boxes must have lo <= hi in every column")
    if np.any(np.isnan(lower) | np.isnan(upper)):
        raise ValueError("lower and upper must not be NaN")
    if _feasible(A, lower, upper, lo, hi):
        return None
    keep = list(_certificate(A, lower, upper, lo, hi))
    for r in list(keep) if len(keep) <= MAX_FILTERED else ():
        trial = [k for k in keep if k != r]
        if trial and not _feasible(A[trial], lower[trial], upper[trial], lo, hi, restrict=True):
            keep = trial
    return np.array(sorted(keep), dtype=np.int64)


def _pieces(A, lower, upper):
    """(A_ub, b_ub, rows of A_ub, A_eq, b_eq, rows of A_eq): the rows as HiGHS inequalities
    (an upper side as A_i x <= upper_i, a lower side as -A_i x <= -lower_i) and equalities."""
    eq = lower == upper
    up = np.flatnonzero(~eq & np.isfinite(upper))
    low = np.flatnonzero(~eq & np.isfinite(lower))
    eqs = np.flatnonzero(eq)
    A_ub = scipy.sparse.vstack([A[up], -A[low]], format="csr")
    b_ub = np.concatenate([upper[up], -lower[low]])
    return A_ub, b_ub, np.concatenate([up, low]), A[eqs], lower[eqs], eqs


def _solve(c, A_ub, b_ub, A_eq, b_eq, bounds, method: str):
    res = scipy.optimize.linprog(c, A_ub=A_ub if A_ub.shape[0] else None, b_ub=b_ub if A_ub.shape[0] else None,
                                 A_eq=A_eq if A_eq.shape[0] else None, b_eq=b_eq if A_eq.shape[0] else None,
                                 bounds=bounds, method=method)
    if res.status not in (0, 2):
        raise RuntimeError(f"HiGHS could not decide whether the equalities and bounds can hold: {res.message}")
    return res


def _feasible(A, lower, upper, lo, hi, restrict: bool = False) -> bool:
    if restrict:  # columns no row touches are free in their boxes
        cols = np.unique(A.indices)
        A, lo, hi = A[:, cols], lo[cols], hi[cols]
    A_ub, b_ub, _, A_eq, b_eq, _ = _pieces(A, lower, upper)
    res = _solve(np.zeros(A.shape[1]), A_ub, b_ub, A_eq, b_eq, np.column_stack([lo, hi]), "highs")
    return res.status == 0


def _certificate(A, lower, upper, lo, hi) -> np.ndarray:
    """The rows of a sparsest Farkas certificate (module docstring, step 1)."""
    A_ub, b_ub, ub_rows, A_eq, b_eq, eq_rows = _pieces(A, lower, upper)
    n, k_ub, k_eq = A.shape[1], A_ub.shape[0], A_eq.shape[0]
    # variables u (k_ub), v+ and v- (k_eq each), g+ and g- (n each), all >= 0
    balance = scipy.sparse.hstack([A_ub.T, A_eq.T, -A_eq.T, -scipy.sparse.eye(n), scipy.sparse.eye(n)],
                                  format="csr")
    lo_c, hi_c = np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(hi), hi, 0.0)
    gap = -np.concatenate([lo_c, -hi_c, -b_ub, -b_eq, b_eq])
    gap = scipy.sparse.csr_array(np.concatenate([gap[2 * n:], gap[:2 * n]])[None, :])
    c = np.concatenate([np.ones(k_ub + 2 * k_eq), np.zeros(2 * n)])
    bounds = np.column_stack([np.zeros(c.size), np.concatenate([
        np.full(k_ub + 2 * k_eq, np.inf), np.where(np.isfinite(lo), np.inf, 0.0),
        np.where(np.isfinite(hi), np.inf, 0.0)])])
    res = _solve(c, gap, np.array([-1.0]), balance, np.zeros(n), bounds, "highs-ds")
    if res.status != 0:
        raise RuntimeError(f"HiGHS found no certificate of the infeasibility it reported: {res.message}")
    y = res.x[: k_ub + 2 * k_eq]
    used = y > _DUAL_TOL * max(float(y.max()), 1.0)
    return np.unique(np.concatenate([ub_rows[used[:k_ub]], eq_rows[used[k_ub:k_ub + k_eq]],
                                     eq_rows[used[k_ub + k_eq:]]]))
