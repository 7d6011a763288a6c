r"""Least-squares baselines: the projection of one release, or the generalised least-squares
estimate from several linear-query releases, onto the invariants and ``x >= 0``.

* One total, or disjoint group totals, with ``Q = I``: the projection onto a scaled simplex
  ``{x >= 0, sum x = t}`` has the closed form ``x_i = max(s_i - tau, 0)`` with the threshold
  ``tau = (sum_{j <= rho} u_j - t) / rho``, ``u`` = the group's values sorted decreasingly and
  ``rho = max{j : u_j - (sum_{k <= j} u_k - t) / j > 0}`` (Held, Wolfe & Crowder 1974;
  Michelot 1986; Duchi et al. 2008, ICML). Vectorised over groups: O(d log d).
* General ``A`` and/or general queries: the exact quadratic programme of
  :mod:`~dpinfer.utility.baselines.qp` (primal active set, KKT-checked).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpinfer._validation import as_real_array
from dpinfer.utility.baselines.inputs import (
    _as_matrix,
    _as_vector,
    _check_flag,
    _check_group_totals,
    _constraint_basis,
    _group_codes,
    _group_structure,
    _group_totals,
    _invariant_vector,
)
from dpinfer.utility.baselines.qp import KKT_TOLERANCE, _solve_qp


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
