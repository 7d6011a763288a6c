r"""Seed 000's Algorithm 1: a Metropolised independence sampler for additive noise conditioned
on equality invariants and non-negativity (reference note 000 §3.1).

Target: the unconstrained mechanism's law p(s) = prod_i f(s_i - s*_i) restricted to
S* = {s in Z^d : A s = a, s >= 0} (a = A s*). A proposal draws the free cells
s_I = s*_I + e_I, e_i i.i.d. from the proposal noise f~ (double geometric with its own
epsilon~), and solves the other cells from the equalities,

    s_Ic = A_Ic^{-1} (a - A_I s_I),

exactly in integers because the solved block A_Ic is chosen unimodular (|det| = 1,
:func:`unimodular_block`). The proposal does not depend on the current state, so with
importance weights log w(s) = log p(s) - log f~(s_I - s*_I) (-inf outside S*) the move
s -> s~ is accepted with probability min(1, w(s~) / w(s)). Proposals are drawn and weighted in
vectorised batches; only the accept loop is sequential (numba).

Start. Never the confidential s* itself, which would be released unchanged until the first
acceptance at a 1-2% acceptance rate. ``start=`` takes a point of S*; ``Conditioned`` passes
``Invariants.feasible_point(A s*)``, a function of the public invariants only, so the data
enter the chain only through the proposals' weights. Without it the chain starts at the first
feasible proposal. ``burn_in`` iterations are discarded; :func:`independence_meeting_times`
estimates how many are needed for a TV bound (L-lag coupling with shared proposals).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpinfer._kernel import kernel
from dpinfer._validation import check_rng
from dpinfer.lattice.coupling import MeetingTimes


@dataclass(frozen=True)
class SolvedBlock:
    """Free cells ``free`` (proposed) and solved cells ``solved`` (k of them, A[:, solved]
    unimodular) of a full-row-rank integer A (k, d); ``inverse`` = A[:, solved]^{-1}, integer."""

    free: np.ndarray
    solved: np.ndarray
    inverse: np.ndarray

    def solve(self, A: np.ndarray, a: np.ndarray, s_free: np.ndarray) -> np.ndarray:
        """Complete rows of free values (n, d - k) to full vectors (n, d) with A s = a."""
        n = s_free.shape[0]
        out = np.empty((n, A.shape[1]), dtype=np.int64)
        out[:, self.free] = s_free
        out[:, self.solved] = (a[None, :] - s_free @ A[:, self.free].T) @ self.inverse.T
        return out


def _det_and_inverse(M: np.ndarray):
    """Exact determinant and inverse of a small integer matrix (Gauss-Jordan over Q)."""
    k = M.shape[0]
    aug = [[Fraction(int(v)) for v in row] + [Fraction(int(i == j)) for j in range(k)]
           for i, row in enumerate(M)]
    det = Fraction(1)
    for col in range(k):
        pivot = next((r for r in range(col, k) if aug[r][col] != 0), None)
        if pivot is None:
            return Fraction(0), None
        if pivot != col:
            aug[col], aug[pivot] = aug[pivot], aug[col]
            det = -det
        p = aug[col][col]
        det *= p
        aug[col] = [v / p for v in aug[col]]
        for r in range(k):
            if r != col and aug[r][col] != 0:
                f = aug[r][col]
                aug[r] = [v - f * w for v, w in zip(aug[r], aug[col])]
    return det, [row[k:] for row in aug]


def unimodular_block(A, *, prefer_solved=None, max_tries: int = 2000, rng=None) -> SolvedBlock:
    """Choose k columns of the full-row-rank integer A (k, d) whose square block has
    determinant +-1, so that solved cells are integers for every integer proposal.

    Tries ``prefer_solved`` first (e.g. seed 000's {1, 23, 46} on the 2 x 23 table), then a
    greedy pass over the columns in order, then greedy passes in random orders. Raises
    ValueError if none of ``max_tries`` attempts is unimodular (then some integer points of
    S* cannot be reached by integer proposals through any tried block)."""
    A = np.asarray(A, dtype=np.int64)
    k, d = A.shape
    rng = np.random.default_rng(0) if rng is None else check_rng(rng)
    candidates = []
    if prefer_solved is not None:
        candidates.append(list(prefer_solved))
    orders = itertools.chain([np.arange(d)], (rng.permutation(d) for _ in range(max_tries)))
    for attempt, order in enumerate(itertools.chain([None] * len(candidates), orders)):
        if attempt < len(candidates):
            cols = candidates[attempt]
        else:
            cols = []
            for j in order:
                if len(cols) == k:
                    break
                trial = cols + [int(j)]
                if _rank(A[:, trial]) == len(trial):
                    cols = trial
            if len(cols) < k:
                raise ValueError("A must have full row rank (use Invariants.matrix)")
        solved = np.array(sorted(cols), dtype=np.int64)
        det, inverse = _det_and_inverse(A[:, solved])
        if abs(det) == 1:
            inv = np.array([[int(v) for v in row] for row in inverse], dtype=np.int64)
            free = np.setdiff1d(np.arange(d), solved)
            return SolvedBlock(free=free, solved=solved, inverse=inv)
    raise ValueError(f"no unimodular k x k block of A found in {max_tries} tries")


def _rank(M: np.ndarray) -> int:
    return int(np.linalg.matrix_rank(M.astype(float)))


@kernel()
def _accept_path(log_w, log_u, start_log_w):
    """Indices of the state after each iteration of an independence sampler: proposal t is
    accepted when log_u[t] <= log_w[t] - log w(current). -1 = still the starting state."""
    n = log_w.size
    path = np.empty(n, dtype=np.int64)
    current, current_log_w = -1, start_log_w
    for t in range(n):
        if log_u[t] <= log_w[t] - current_log_w:
            current, current_log_w = t, log_w[t]
        path[t] = current
    return path


@dataclass
class IndependenceChainResult:
    draws: np.ndarray         # (n_draws, d) int64, the kept states
    acceptance: float         # share of iterations (after the start) that moved
    feasible: float           # share of proposals in S*
    iterations: int


def run_independence_chain(centre, A, log_f, log_f_proposal, sample_proposal, block: SolvedBlock,
                           *, n_iterations: int, burn_in: int, thin: int = 1, rng,
                           nonnegative: bool = True, batch: int = 100_000,
                           start=None) -> IndependenceChainResult:
    """Seed 000's Algorithm 1 around ``centre`` (s*) for invariants A s = A s* (A full row rank).

    ``log_f(e)``: the unconstrained noise's log pmf, elementwise; ``log_f_proposal(e)`` and
    ``sample_proposal(shape, rng)``: the proposal noise for the free cells. Keeps every
    ``thin``-th state after ``burn_in`` iterations (counted from the start: ``start`` if given,
    a point of S*, else the first feasible proposal)."""
    rng = check_rng(rng)
    centre = np.asarray(centre, dtype=np.int64).reshape(-1)
    A = np.asarray(A, dtype=np.int64)
    a = A @ centre
    free = block.free

    def proposals(n):
        e = sample_proposal((n, free.size), rng)
        s = block.solve(A, a, centre[free] + e)
        log_w = log_f(s - centre).sum(axis=1) - log_f_proposal(e).sum(axis=1)
        if nonnegative:
            log_w = np.where(np.all(s >= 0, axis=1), log_w, -np.inf)
        return s, log_w

    n_feasible = n_total = 0
    if start is not None:
        state = np.asarray(start, dtype=np.int64).reshape(-1)
        if np.any(A @ state != a) or (nonnegative and np.any(state < 0)):
            raise ValueError("start must satisfy the invariants A s = A s* (and s >= 0)")
        e = state - centre
        state_log_w = float(log_f(e).sum() - log_f_proposal(e[free]).sum())
    while start is None:  # the first proposal in S*
        s, log_w = proposals(min(batch, 10_000))
        n_total += s.shape[0]
        ok = np.flatnonzero(np.isfinite(log_w))
        n_feasible += ok.size
        if ok.size:
            state, state_log_w = s[ok[0]], log_w[ok[0]]
            break
        if n_total > 100 * batch:
            raise RuntimeError(f"no feasible proposal in {n_total} draws: the proposal noise is too wide "
                               "or the invariants leave almost no non-negative tables")
    kept = []
    accepted = 0
    for start in range(0, n_iterations, batch):
        n = min(batch, n_iterations - start)
        s, log_w = proposals(n)
        n_total += n
        n_feasible += int(np.isfinite(log_w).sum())
        path = _accept_path(log_w, np.log(rng.random(n)), state_log_w)
        moved = np.concatenate([[path[0] != -1], path[1:] != path[:-1]])
        accepted += int(moved.sum())
        t = np.arange(start, start + n)
        keep = (t >= burn_in) & ((t - burn_in) % thin == 0)
        idx = path[keep]
        block_draws = np.where((idx >= 0)[:, None], s[np.maximum(idx, 0)], state[None, :])
        kept.append(block_draws)
        if path[-1] >= 0:
            state, state_log_w = s[path[-1]], log_w[path[-1]]
    draws = np.concatenate(kept) if kept else np.empty((0, centre.size), np.int64)
    return IndependenceChainResult(draws=draws, acceptance=accepted / n_iterations,
                                   feasible=n_feasible / n_total, iterations=n_iterations)


def independence_meeting_times(centre, A, log_f, log_f_proposal, sample_proposal, block: SolvedBlock,
                               *, start, lag: int, n_runs: int, rng, max_iterations: int = 10**6,
                               nonnegative: bool = True, batch: int = 20_000):
    """L-lag coupling of Algorithm 1 (Biswas, Jacob & Vanetti 2019) for a TV bound on its
    convergence from ``start``: per run, chain X runs ``lag`` steps, then X and a second chain
    Y from ``start`` share every proposal and uniform (X at its step t, Y at its step t - L).
    Each chain alone is Algorithm 1; an independence sampler's state is always the start or a
    past proposal, and once both hold the same one they move together. The meeting time tau
    is X's first step t with X_t = Y_{t-L} (same proposal, a conservative test). Returns a
    :class:`dpinfer.lattice.coupling.MeetingTimes` (its ``tv_upper_bound`` and ``iterations_for``)."""
    rng = check_rng(rng)
    centre = np.asarray(centre, dtype=np.int64).reshape(-1)
    A = np.asarray(A, dtype=np.int64)
    a = A @ centre
    start = np.asarray(start, dtype=np.int64).reshape(-1)
    e0 = start - centre
    start_log_w = float(log_f(e0).sum() - log_f_proposal(e0[block.free]).sum())

    def weights(n):
        e = sample_proposal((n, block.free.size), rng)
        s = block.solve(A, a, centre[block.free] + e)
        log_w = log_f(s - centre).sum(axis=1) - log_f_proposal(e).sum(axis=1)
        if nonnegative:
            log_w = np.where(np.all(s >= 0, axis=1), log_w, -np.inf)
        return log_w

    tau = np.full(n_runs, -1, dtype=np.int64)
    for r in range(n_runs):
        # X's first lag steps, alone
        log_w = weights(lag)
        path = _accept_path(log_w, np.log(rng.random(lag)), start_log_w)
        if path[-1] < 0:  # X is still at the start, where Y begins
            tau[r] = lag
            continue
        x_log_w, y_log_w = log_w[path[-1]], start_log_w
        t = lag
        while t < max_iterations:
            n = min(batch, max_iterations - t)
            log_w = weights(n)
            log_u = np.log(rng.random(n))
            px = _accept_path(log_w, log_u, x_log_w)
            py = _accept_path(log_w, log_u, y_log_w)
            # -1 is each chain's state from before the batch: different, as they have not met
            hit = np.flatnonzero((px == py) & (px >= 0))
            if hit.size:
                tau[r] = t + int(hit[0]) + 1
                break
            if px[-1] >= 0:
                x_log_w = log_w[px[-1]]
            if py[-1] >= 0:
                y_log_w = log_w[py[-1]]
            t += n
    return MeetingTimes(tau=tau, lag=lag, max_iterations=max_iterations)
