r"""A consumer's optimal use of a released count, and the optimal mechanism tailored to it
(seed 003: Gupte & Sundararajan, PODS 2010, §2.4.3 and §2.5; reference note §4, A4, A5, A8).

A consumer who sees a release r of a deployed mechanism Y (rows the true counts 0..n) may
report r' in {0..n} with any row-stochastic remap T (T[r, r'] = P(report r' | release r)); the
mechanism it experiences is X = Y T. Minimax consumers need randomised remaps in general (note
pitfall P6); Bayesian consumers never do (note §4.3, A8).

Theorem 1 (universality): for every monotone minimax consumer,
``optimal_remap(geometric_matrix(n, alpha), c).risk == optimal_mechanism(n, alpha, c).risk``
(the paper's proof, through Lemma 5, covers symmetric losses l(i, r) = f_i(|i - r|); for
asymmetric monotone losses, note pitfall P7 (b), it holds in every numerical check: note §9
test 8 and tests/test_minimax.py);
Ghosh, Roughgarden & Sundararajan (2009) give the Bayesian analogue,
``bayes_remap(G, p, l).risk == bayes_optimal_mechanism(n, alpha, p, l).risk``.
The linear programs are solved with scipy.optimize.linprog(method="highs") on sparse
constraint matrices with feasibility tolerances 1e-10 (HiGHS's default 1e-7 visibly moves the
optimal values when alpha is small).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from dpinfer._validation import check_count
from dpinfer.utility.consumers import (
    Consumer,
    as_mechanism_matrix,
    check_consumer,
    as_prior,
    loss_matrix,
    row_risks,
)
from dpinfer.utility.derivability import check_alpha

__all__ = [
    "DesignedMechanism",
    "Remap",
    "bayes_optimal_mechanism",
    "bayes_remap",
    "best_deterministic_remap",
    "optimal_mechanism",
    "optimal_remap",
]

# best_deterministic_remap enumerates (n+1)^k maps: n <= 8 and k <= 9 outputs.
MAX_ENUMERATION_N = 8
# HiGHS's default feasibility tolerances (1e-7) let DP constraints with small alpha be violated
# enough to move optimal values by ~1e-6 relative; 1e-10 keeps them at round-off level.
_HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
# Elements per block of the enumeration (8 bytes each).
_BLOCK = 1 << 22


@dataclass(frozen=True)
class Remap:
    """A consumer's post-processing of a deployed mechanism Y: ``transform`` T (k x (n+1),
    row-stochastic, T[r, r'] = P(report r' | release r)), the ``mechanism`` X = Y T it
    experiences and its ``risk`` (minimax or Bayes, as the function says) computed from X."""

    transform: np.ndarray
    mechanism: np.ndarray
    risk: float


@dataclass(frozen=True)
class DesignedMechanism:
    """An optimal alpha-DP mechanism for one consumer: its (n+1) x (n+1) ``matrix``
    x[i, r] = P(release r | true count i) and its ``risk``."""

    matrix: np.ndarray
    risk: float


def _solve(c, A_ub, b_ub, A_eq, b_eq, bounds) -> np.ndarray:
    res = linprog(
        c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs", options=_HIGHS_OPTIONS
    )
    if res.status != 0:
        raise RuntimeError(f"HiGHS did not solve the linear program: {res.message}")
    return res.x


def _rows_sum_to_one(rows: int, cols: int) -> sparse.csr_array:
    """Equality rows sum_c v[r*cols + c] = 1 for every r (row-stochastic matrix variable)."""
    return sparse.csr_array(sparse.kron(sparse.eye_array(rows), np.ones((1, cols))))


def _dp_constraints(m: int, alpha: float) -> sparse.csr_array:
    """Rows of A x <= 0 for alpha-DP of x (flattened i*m + r), for ALL adjacent rows i, i+1 of
    {0..n} (note §4.2 and pitfall P3): alpha x[i+1, r] - x[i, r] <= 0 and
    alpha x[i, r] - x[i+1, r] <= 0 (paper Definition 2)."""
    this, following = sparse.eye_array(m - 1, m), sparse.eye_array(m - 1, m, k=1)  # pick x[i], x[i+1]
    down = alpha * following - this
    up = alpha * this - following
    eye = sparse.eye_array(m)
    return sparse.csr_array(sparse.vstack([sparse.kron(down, eye), sparse.kron(up, eye)]))


def _with_risk_column(A, column) -> sparse.csr_array:
    """[A | column]: the epigraph variable d appended as the last variable."""
    return sparse.csr_array(sparse.hstack([A, sparse.csr_array(np.asarray(column, float).reshape(-1, 1))]))


def optimal_remap(Y, consumer: Consumer) -> Remap:
    r"""The minimax consumer's optimal (randomised) remap of a deployed mechanism Y: LP A4 of
    the note (§4.1; paper §2.4.3):

        minimize d  s.t.  sum_{r, r'} Y[i, r] l(i, r') T[r, r'] <= d   for i in S,
                          sum_{r'} T[r, r'] = 1,  T >= 0.

    ``Y``: (n+1) x k row-stochastic (rows the true counts). Rows of T for releases that no
    i in S can produce are left as the solver returns them (any distribution is optimal).
    Table 1 (note §7): Y = G_{3,1/4}, absolute loss, S = N gives risk 168/415 with
    T[0] = [68/83, 15/83, 0, 0].
    """
    consumer = check_consumer(consumer)
    Y = as_mechanism_matrix("Y", Y)
    m, k = Y.shape
    L = consumer.loss_matrix(m - 1)
    S = consumer.side_set(m - 1)
    risk_rows = (Y[S][:, :, None] * L[S][:, None, :]).reshape(S.size, k * m)  # T flattened r*m + r'
    c = np.zeros(k * m + 1)
    c[-1] = 1.0
    x = _solve(
        c,
        _with_risk_column(sparse.csr_array(risk_rows), -np.ones(S.size)),
        np.zeros(S.size),
        _with_risk_column(_rows_sum_to_one(k, m), np.zeros(k)),
        np.ones(k),
        [(0.0, None)] * (k * m) + [(None, None)],
    )
    T = x[:-1].reshape(k, m)
    X = Y @ T
    return Remap(T, X, float(np.max(row_risks(X, L)[S])))


def optimal_mechanism(n, alpha, consumer: Consumer) -> DesignedMechanism:
    r"""The alpha-DP mechanism on {0..n} with the least minimax risk for the consumer: LP A5
    of the note (§4.2; paper §2.5):

        minimize d  s.t.  sum_r l(i, r) x[i, r] <= d           for i in S,
                          alpha x[i+1, r] <= x[i, r],  alpha x[i, r] <= x[i+1, r]
                                                       for ALL i in 0..n-1 and r (pitfall P3),
                          sum_r x[i, r] = 1,  x >= 0.

    The optimum need not be unique and an arbitrary optimum need not be derivable from G
    (pitfall P4): compare values, not matrices. Table 1: n = 3, alpha = 1/4, absolute loss,
    S = N gives 168/415.
    """
    consumer = check_consumer(consumer)
    n = check_count("n", n, 1)
    alpha = check_alpha(alpha)
    m = n + 1
    L = consumer.loss_matrix(n)
    S = consumer.side_set(n)
    risk_rows = sparse.csr_array(
        (L[S].ravel(), (np.repeat(np.arange(S.size), m), (S[:, None] * m + np.arange(m)).ravel())),
        shape=(S.size, m * m),
    )
    dp = _dp_constraints(m, alpha)
    c = np.zeros(m * m + 1)
    c[-1] = 1.0
    x = _solve(
        c,
        sparse.vstack(
            [_with_risk_column(risk_rows, -np.ones(S.size)), _with_risk_column(dp, np.zeros(dp.shape[0]))]
        ),
        np.zeros(S.size + dp.shape[0]),
        _with_risk_column(_rows_sum_to_one(m, m), np.zeros(m)),
        np.ones(m),
        [(0.0, None)] * (m * m) + [(None, None)],
    )
    X = x[:-1].reshape(m, m)
    return DesignedMechanism(X, float(np.max(row_risks(X, L)[S])))


def bayes_remap(Y, prior, loss) -> Remap:
    r"""The Bayesian consumer's optimal remap (Ghosh, Roughgarden & Sundararajan 2009; note
    §4.3 and A8): deterministic,

        T[r, argmin_{r'} sum_i p_i Y[i, r] l(i, r')] = 1,

    ties broken towards the smallest r' (releases of zero probability map to 0). ``risk`` is
    the Bayes risk sum_i p_i sum_{r'} l(i, r') (Y T)[i, r'] = sum_r min_{r'} (...).
    ``loss`` as :func:`~dpinfer.utility.consumers.loss_matrix`; any loss is allowed (the
    universality of G for Bayesian consumers needs a monotone one).
    """
    Y = as_mechanism_matrix("Y", Y)
    m, k = Y.shape
    p = as_prior(prior, m - 1)
    L = loss_matrix(loss, m - 1)
    posterior_loss = (p[:, None] * Y).T @ L  # [r, r'] = sum_i p_i Y[i, r] l(i, r')
    T = np.zeros((k, m))
    T[np.arange(k), np.argmin(posterior_loss, axis=1)] = 1.0
    X = Y @ T
    return Remap(T, X, float(p @ row_risks(X, L)))


def bayes_optimal_mechanism(n, alpha, prior, loss) -> DesignedMechanism:
    r"""The alpha-DP mechanism on {0..n} with the least Bayes risk for prior p and loss l
    (Ghosh, Roughgarden & Sundararajan 2009; note §4.3):

        minimize sum_i p_i sum_r l(i, r) x[i, r]  s.t. alpha-DP for all adjacent rows
        (as in :func:`optimal_mechanism`), sum_r x[i, r] = 1, x >= 0.
    """
    n = check_count("n", n, 1)
    alpha = check_alpha(alpha)
    m = n + 1
    p = as_prior(prior, n)
    L = loss_matrix(loss, n)
    dp = _dp_constraints(m, alpha)
    x = _solve(
        (p[:, None] * L).ravel(), dp, np.zeros(dp.shape[0]), _rows_sum_to_one(m, m), np.ones(m),
        [(0.0, None)] * (m * m),
    )
    X = x.reshape(m, m)
    return DesignedMechanism(X, float(p @ row_risks(X, L)))


def _undominated_reports(LS: np.ndarray) -> np.ndarray:
    """Reports r' whose loss column over S is not dominated: no r'' with l(i, r'') <= l(i, r')
    for all i in S, strictly somewhere or r'' < r' (a tie keeps the smallest). Replacing a
    dominated report by its dominator never raises a row risk, because Y >= 0."""
    m = LS.shape[1]
    keep = []
    for a in range(m):
        col = LS[:, [a]]
        no_worse = np.all(LS <= col, axis=0)
        better = np.any(LS < col, axis=0) | (np.arange(m) < a)
        if not np.any(no_worse & better):
            keep.append(a)
    return np.array(keep)


def _enumerate(cost: np.ndarray, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All assignments of the reports to ``outputs``: (risks (|S|, A^h), choices (h, A^h))
    with cost[s, o, a] the risk contribution of output o reported as the a-th report."""
    A, h = cost.shape[2], outputs.size
    codes = np.arange(A**h)
    choices = (codes[None, :] // A ** np.arange(h)[:, None]) % A
    risks = np.zeros((cost.shape[0], codes.size))
    for j, o in enumerate(outputs):
        risks += cost[:, o, choices[j]]
    return risks, choices


def best_deterministic_remap(Y, consumer: Consumer) -> Remap:
    r"""The best deterministic remap f: outputs -> {0..n} for a minimax consumer,
    min_f max_{i in S} sum_r Y[i, r] l(i, f(r)), by exhaustive search (note §8, §9 test 11).

    The search is exact: releases that no i in S can produce are mapped to the first kept
    report (they never enter the risk); dominated reports are dropped (see
    ``_undominated_reports``); the remaining maps are split into two halves whose partial
    risks are enumerated, and half-maps whose lower bound max_i (head_i + min tail_i) cannot
    beat the best map found are skipped. Refuses n > 8 or more than 9 outputs, where the
    (n+1)^k maps are too many: use :func:`optimal_remap` (randomised, any n).
    """
    consumer = check_consumer(consumer)
    Y = as_mechanism_matrix("Y", Y)
    m, k = Y.shape
    if m - 1 > MAX_ENUMERATION_N or k > MAX_ENUMERATION_N + 1:
        raise ValueError(
            f"best_deterministic_remap enumerates (n+1)^k maps and accepts n <= {MAX_ENUMERATION_N} "
            f"and k <= {MAX_ENUMERATION_N + 1} outputs; got n = {m - 1}, k = {k} "
            "(optimal_remap solves the randomised problem for any n)"
        )
    L = consumer.loss_matrix(m - 1)
    S = consumer.side_set(m - 1)
    reports = _undominated_reports(L[S])
    seen = np.flatnonzero(Y[S].sum(axis=0) > 0)
    cost = Y[S][:, :, None] * L[S][:, None, reports]  # [s, r, a]
    head, tail = seen[: (seen.size + 1) // 2], seen[(seen.size + 1) // 2 :]
    head_risk, head_choice = _enumerate(cost, head)
    tail_risk, tail_choice = _enumerate(cost, tail)
    bound = np.max(head_risk + tail_risk.min(axis=1, keepdims=True), axis=0)
    order = np.argsort(bound, kind="stable")
    block = max(1, _BLOCK // (tail_risk.shape[1] * S.size))
    best, best_pair = np.inf, (order[0], 0)
    for start in range(0, order.size, block):
        idx = order[start : start + block]
        idx = idx[bound[idx] < best]
        if idx.size == 0:
            break
        worst = np.max(head_risk[:, idx, None] + tail_risk[:, None, :], axis=0)
        flat = int(np.argmin(worst))
        if worst.flat[flat] < best:
            best, best_pair = worst.flat[flat], (idx[flat // worst.shape[1]], flat % worst.shape[1])
    choice = np.full(k, reports[0])
    choice[head] = reports[head_choice[:, best_pair[0]]]
    choice[tail] = reports[tail_choice[:, best_pair[1]]]
    T = np.zeros((k, m))
    T[np.arange(k), choice] = 1.0
    X = Y @ T
    return Remap(T, X, float(np.max(row_risks(X, L)[S])))
