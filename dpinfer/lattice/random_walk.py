r"""Random-walk Metropolis on an integer kernel lattice and its L-lag coupling (seed 001,
Algorithms 1-3; reference note 001 §7).

The target is a law on the lattice ``Lambda = {z in Z^d : A z = 0} = {C w : w in Z^m}``
(``C``: :meth:`dpinfer.Invariants.kernel_basis`), given by an unnormalised log pmf
``log_target(z)`` (a :class:`~dpinfer.lattice.targets.LatticeTarget` or any callable). The
chain lives on the coordinates ``w``:

* **Algorithm 1 (one step).** Propose ``w' = w + e`` with ``e_j`` i.i.d. double geometric,
  ``eta(e) = (1 - a)/(1 + a) a^|e|`` (symmetric, so the Metropolis ratio is the target ratio),
  and accept the whole vector at once with probability ``min(1, q(C w') / q(C w))``. One joint
  accept per sweep, as in the paper (note §7.2: a per-coordinate accept would be a different
  sampler). The chains of a batch are independent and advance together (vectorised over
  chains). The start is the paper's ``pi_0 = g``: ``w_0 = e``, a proposal draw from 0.
* **Algorithm 2 (coupled step).** Two chains ``v`` (leading) and ``w`` (lagging). Per coordinate,
  the proposals ``v_j + e`` and ``w_j + e'`` are maximally coupled: ``X = v_j + e``; keep
  ``Y = X`` if ``s eta(X - v_j) <= eta(X - w_j)``, else draw ``Y = w_j + e'`` until
  ``s' eta(Y - w_j) > eta(Y - v_j)`` (s, s' uniform). A common uniform decides both Metropolis
  accepts, so once ``v = w`` the chains stay together, and each chain's marginal kernel is
  Algorithm 1's.
* **Algorithm 3 (meeting time).** ``v`` runs ``L`` steps of Algorithm 1 from its own draw of
  ``pi_0``; then coupled steps from ``(v_L, w_0)`` until ``v_t = w_{t-L}``: the meeting time
  ``tau``. Runs are capped at ``max_iterations`` and reported as censored. The meeting times
  give the coupling bound on the TV distance to the target
  (:class:`~dpinfer.lattice.coupling.MeetingTimes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np
import scipy.sparse

from dpinfer._kernel import kernel
from dpinfer._validation import check_count, check_rng
from dpinfer.lattice.coupling import MeetingTimes
from dpinfer.lattice.targets import LatticeTarget

LogTarget = Callable[[np.ndarray], np.ndarray]  # e.g. a LatticeTarget


@kernel()
def _log_target_of(z, kind, scale):
    """A :class:`LatticeTarget` of ``kind`` and ``scale`` at one lattice point z (compiled)."""
    total = 0.0
    for i in range(z.shape[0]):
        v = float(z[i])
        total += abs(v) if kind == 0 else v * v
    if kind == 1:
        total = math.sqrt(total)
    return -scale * total


def _proposal_cdf(a: float) -> np.ndarray:
    """P(e <= k) of the double geometric proposal for k = -K..K, K where a^K < 1e-17 (below the
    2^-53 resolution of a uniform draw, so inversion through this table loses nothing a
    floating-point inversion could produce); symmetric, so the Metropolis ratio is unchanged."""
    K = max(1, int(math.ceil(math.log(1e-17) / math.log(a))))
    k = np.arange(-K, K + 1)
    pmf = (1 - a) / (1 + a) * a ** np.abs(k)
    cdf = np.cumsum(pmf)
    return cdf / cdf[-1]


@kernel()
def _walk_kernel(w, z, indptr, indices, data, kind, scale, cdf, n_steps, seed):
    """Algorithm 1 for every chain (rows of w, z = C w, updated in place): double geometric
    proposals per coordinate by inversion of the tabulated cdf (:func:`_proposal_cdf`), one
    joint accept per step. Returns the number of accepted steps."""
    np.random.seed(seed)
    n_chains, m = w.shape
    d = z.shape[1]
    K = (cdf.shape[0] - 1) // 2
    proposal = np.empty(d, dtype=np.int64)
    e = np.empty(m, dtype=np.int64)
    accepted = 0
    for c in range(n_chains):
        log_q = _log_target_of(z[c], kind, scale)
        for _ in range(n_steps):
            for i in range(d):
                proposal[i] = z[c, i]
            for j in range(m):
                e[j] = np.searchsorted(cdf, np.random.random(), side="right") - K
                if e[j] != 0:
                    for p in range(indptr[j], indptr[j + 1]):
                        proposal[indices[p]] += e[j] * data[p]
            log_q_new = _log_target_of(proposal, kind, scale)
            if math.log(1.0 - np.random.random()) <= log_q_new - log_q:
                log_q = log_q_new
                accepted += 1
                for j in range(m):
                    w[c, j] += e[j]
                for i in range(d):
                    z[c, i] = proposal[i]
    return accepted


# --- proposals -------------------------------------------------------------------------------
def double_geometric_draws(a: float, shape, rng) -> np.ndarray:
    """eta(e) = (1 - a)/(1 + a) a^|e|: difference of two geometric variables on {0, 1, ...}
    (numpy's start at 1; the offsets cancel)."""
    return rng.geometric(1.0 - a, shape) - rng.geometric(1.0 - a, shape)


def _log_eta(e: np.ndarray, log_a: float) -> np.ndarray:
    """log eta(e) up to the constant log((1 - a)/(1 + a)), which cancels in every comparison."""
    return np.abs(e) * log_a


@dataclass(frozen=True)
class LatticeWalk:
    """Algorithm 1 on the lattice spanned by the columns of ``basis`` (d, m) for ``log_target``,
    with double geometric proposals of parameter ``a`` in (0, 1) per coordinate of ``w``."""

    basis: np.ndarray
    log_target: LogTarget
    a: float

    def __post_init__(self):
        C = np.asarray(self.basis)
        if C.ndim != 2 or C.shape[1] < 1 or not np.issubdtype(C.dtype, np.integer):
            raise ValueError(f"basis must be an integer matrix (d, m) with m >= 1, got {C.dtype} {C.shape}")
        if not 0.0 < float(self.a) < 1.0:
            raise ValueError(f"a (the proposal's double geometric parameter) must lie in (0, 1), got {self.a!r}")
        object.__setattr__(self, "basis", C.astype(np.int64))

    @property
    def n_coordinates(self) -> int:
        return self.basis.shape[1]

    def to_lattice(self, w: np.ndarray) -> np.ndarray:
        """z = C w, row-wise: (n, m) -> (n, d)."""
        return w @ self.basis.T

    def initial(self, n: int, rng) -> np.ndarray:
        """n independent draws of pi_0 = g: w_0 = e (a proposal from 0)."""
        return double_geometric_draws(self.a, (n, self.n_coordinates), rng)

    def step(self, w: np.ndarray, log_q: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step of every chain. Returns (w, log q(C w), accepted) — arrays are not modified."""
        proposal = w + double_geometric_draws(self.a, w.shape, rng)
        log_q_new = self.log_target(self.to_lattice(proposal))
        accept = np.log(rng.random(w.shape[0])) <= log_q_new - log_q
        return np.where(accept[:, None], proposal, w), np.where(accept, log_q_new, log_q), accept

    def run(self, n_chains: int, n_steps: int, rng, w0: np.ndarray | None = None):
        """``n_chains`` independent chains, ``n_steps`` steps each, from ``w0`` or pi_0.
        Returns (z (n_chains, d), acceptance rate over all steps). For a
        :class:`~dpinfer.lattice.targets.LatticeTarget` the steps run in a compiled
        kernel (chain by chain, the state z updated through the nonzeros of the proposal's
        columns of C); other targets step all chains together in numpy."""
        rng = check_rng(rng)
        n_chains, n_steps = check_count("n_chains", n_chains, 1), check_count("n_steps", n_steps, 0)
        w = self.initial(n_chains, rng) if w0 is None else np.array(w0, dtype=np.int64)
        if isinstance(self.log_target, LatticeTarget) and n_steps:
            z = self.to_lattice(w)
            csc = scipy.sparse.csc_array(self.basis)
            accepted = _walk_kernel(w, z, csc.indptr.astype(np.int64), csc.indices.astype(np.int64),
                                    csc.data.astype(np.int64), self.log_target.kind,
                                    float(self.log_target.scale), _proposal_cdf(self.a), n_steps,
                                    int(rng.integers(2**62)))
            return z, accepted / (n_chains * n_steps)
        log_q = self.log_target(self.to_lattice(w))
        accepted = 0
        for _ in range(n_steps):
            w, log_q, acc = self.step(w, log_q, rng)
            accepted += int(acc.sum())
        rate = accepted / (n_chains * n_steps) if n_steps else math.nan
        return self.to_lattice(w), rate

    def coupled_step(self, v, log_qv, w, log_qw, rng):
        """Algorithm 2 for pairs of chains (row i of v with row i of w). Returns the new
        (v, log q(v), w, log q(w))."""
        log_a = math.log(self.a)
        v_prop = v + double_geometric_draws(self.a, v.shape, rng)
        # X = v_prop: keep it for w when s eta(X - v) <= eta(X - w)
        same = np.log(rng.random(v.shape)) + _log_eta(v_prop - v, log_a) <= _log_eta(v_prop - w, log_a)
        w_prop = np.where(same, v_prop, 0)
        todo = np.flatnonzero(~same.ravel())
        flat_w, flat_v, out = w.ravel(), v.ravel(), w_prop.ravel()
        while todo.size:  # residual of w's proposal by rejection, vectorised over open entries
            y = flat_w[todo] + double_geometric_draws(self.a, todo.size, rng)
            ok = np.log(rng.random(todo.size)) + _log_eta(y - flat_w[todo], log_a) > _log_eta(y - flat_v[todo], log_a)
            out[todo[ok]] = y[ok]
            todo = todo[~ok]
        w_prop = out.reshape(w.shape)
        log_u = np.log(rng.random(v.shape[0]))  # common random number for both accepts
        log_qv_new = self.log_target(self.to_lattice(v_prop))
        log_qw_new = self.log_target(self.to_lattice(w_prop))
        acc_v = log_u <= log_qv_new - log_qv
        acc_w = log_u <= log_qw_new - log_qw
        return (np.where(acc_v[:, None], v_prop, v), np.where(acc_v, log_qv_new, log_qv),
                np.where(acc_w[:, None], w_prop, w), np.where(acc_w, log_qw_new, log_qw))

    def meeting_times(self, lag: int, n_runs: int, rng, *, max_iterations: int = 10**6,
                      progress: Callable[[str], None] | None = None) -> MeetingTimes:
        """Algorithm 3 for ``n_runs`` independent pairs (vectorised over the pairs still apart).
        ``tau`` is the iteration of the leading chain at which it meets the lagging one."""
        rng = check_rng(rng)
        lag = check_count("lag", lag, 1)
        n_runs = check_count("n_runs", n_runs, 1)
        max_iterations = check_count("max_iterations", max_iterations, lag + 1)
        v = self.initial(n_runs, rng)
        log_qv = self.log_target(self.to_lattice(v))
        for _ in range(lag):
            v, log_qv, _ = self.step(v, log_qv, rng)
        w = self.initial(n_runs, rng)
        log_qw = self.log_target(self.to_lattice(w))
        tau = np.full(n_runs, -1, dtype=np.int64)
        active = np.arange(n_runs)
        next_report = 10_000
        for t in range(lag + 1, max_iterations + 1):
            v, log_qv, w, log_qw = self.coupled_step(v, log_qv, w, log_qw, rng)
            met = np.all(v == w, axis=1)
            if met.any():
                tau[active[met]] = t
                keep = ~met
                active, v, log_qv, w, log_qw = active[keep], v[keep], log_qv[keep], w[keep], log_qw[keep]
            if not active.size:
                break
            if progress is not None and t >= next_report:
                progress(f"coupling: iteration {t}, {active.size} of {n_runs} pairs still apart")
                next_report += 10_000
        return MeetingTimes(tau=tau, lag=lag, max_iterations=max_iterations)


