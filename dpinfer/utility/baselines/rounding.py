r"""Integer rounding that keeps the invariants exactly: the non-negative integer table closest
in L1 to a (projected) estimate with ``A x_int = a``.

For disjoint group totals the largest-remainder (Hamilton) method — floor every cell, then give
the ``t - sum floor`` missing units to the largest fractional parts (ties: lowest index) — which
minimises the L1 distance when ``x_hat >= 0`` sums to ``t`` in each group. Otherwise a
mixed-integer programme (``scipy.optimize.milp``, HiGHS, zero optimality gap):
``min sum u  s.t.  u >= x - x_hat, u >= x_hat - x, A x = a, x >= 0 integer``.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.sparse

from dpinfer.lattice.invariants import greedy_independent_rows
from dpinfer.utility.baselines.inputs import (
    _as_matrix,
    _as_vector,
    _check_group_totals,
    _constraint_basis,
    _group_codes,
    _group_structure,
    _group_totals,
    _invariant_vector,
)


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
