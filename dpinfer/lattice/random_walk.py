r"""Random-walk Metropolis on an integer kernel lattice, its L-lag coupling and the coupling
bound on the total-variation distance to the target (seed 001, Algorithms 1-3; reference note
001 §7).

The target is a law on the lattice ``Lambda = {z in Z^d : A z = 0} = {C w : w in Z^m}``
(``C``: :meth:`dpinfer.Invariants.kernel_basis`), given by an unnormalised log pmf
``log_target(z)``. The chain lives on the coordinates ``w``:

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
  ``tau``. Runs are capped at ``max_iterations`` and reported as censored.
* **TV bound** (Biswas, Jacob & Vanetti 2019, Theorem 2.5):
  ``TV(law of the chain at iteration l, target) <= E[max(0, ceil((tau - L - l) / L))]``,
  estimated by the average over independent runs.

The estimate is an estimate: it is not a proof of convergence and it is only as good as the
number of runs (see :func:`tv_upper_bound` for the confidence limit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable

import numba
import numpy as np
import scipy.sparse
from scipy.stats import norm

from dpinfer._validation import check_rng

LogTarget = Callable[[np.ndarray], np.ndarray]  # e.g. a LatticeTarget


# --- targets ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LatticeTarget:
    """An unnormalised log pmf on the lattice, row-wise: ``kind`` 0 is ``-scale ||z||_1``,
    1 is ``-scale ||z||_2``, 2 is ``-||z||_2^2 * scale`` (scale = 1 / (2 sigma^2)). Known kinds
    let :meth:`LatticeWalk.run` use its compiled kernel; any other callable works too."""

    kind: int
    scale: float

    def __call__(self, z: np.ndarray) -> np.ndarray:
        if self.kind == 0:
            return -self.scale * np.abs(z).sum(axis=-1)
        if self.kind == 1:
            return -self.scale * np.sqrt(np.square(z, dtype=float).sum(axis=-1))
        return -self.scale * np.square(z, dtype=float).sum(axis=-1)


def laplace_log_target(epsilon: float, norm_name: str) -> LatticeTarget:
    """``log q(z) = -epsilon ||z||`` in the l1 or l2 norm (seed 001, Eq. 5), row-wise."""
    epsilon = _positive("epsilon", epsilon)
    if norm_name not in ("l1", "l2"):
        raise ValueError(f"norm must be 'l1' or 'l2', got {norm_name!r}")
    return LatticeTarget(0 if norm_name == "l1" else 1, epsilon)


def gaussian_log_target(sigma: float) -> LatticeTarget:
    """``log q(z) = -||z||_2^2 / (2 sigma^2)``: the lattice Gaussian centred at 0 (seed 001, Eq. 8)."""
    sigma = _positive("sigma", sigma)
    return LatticeTarget(2, 1.0 / (2.0 * sigma * sigma))


@numba.njit(cache=True)
def _log_target_of(z, kind, scale):
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


@numba.njit(cache=True)
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
        Returns (z (n_chains, d), acceptance rate over all steps). For the targets of
        :func:`laplace_log_target` and :func:`gaussian_log_target` the steps run in a compiled
        kernel (chain by chain, the state z updated through the nonzeros of the proposal's
        columns of C); other targets step all chains together in numpy."""
        rng = check_rng(rng)
        n_chains, n_steps = _count("n_chains", n_chains, 1), _count("n_steps", n_steps, 0)
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
        lag = _count("lag", lag, 1)
        n_runs = _count("n_runs", n_runs, 1)
        max_iterations = _count("max_iterations", max_iterations, lag + 1)
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


@dataclass(frozen=True)
class MeetingTimes:
    """Meeting times of independent L-lag coupled runs (``tau = -1``: not met by ``max_iterations``)."""

    tau: np.ndarray
    lag: int
    max_iterations: int

    @property
    def n_censored(self) -> int:
        return int(np.sum(self.tau < 0))

    def tv_upper_bound(self, iterations, *, level: float = 0.95) -> TVBound:
        """Biswas et al. (2019) Theorem 2.5 at each iteration ``l``:
        TV(l) <= E[max(0, ceil((tau - L - l) / L))], estimated by the mean over the runs.

        Upper confidence limit: the mean plus ``z_level`` standard errors (normal approximation
        for the mean of the i.i.d. terms); where no run has a positive term it is the exact
        Clopper-Pearson upper limit of P(term >= 1), 1 - (1 - level)^(1/N), a floor for the
        mean's limit and the best available without a tail assumption. A censored run's term is
        unknown (at least its value at the cap), so with censored runs the estimate is a lower
        bound and the confidence limit is infinite at every ``l`` the cap could affect."""
        ls = np.atleast_1d(np.asarray(iterations, dtype=np.int64))
        if np.any(ls < 0):
            raise ValueError("iterations must be >= 0")
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must lie in (0, 1), got {level!r}")
        L, tau = self.lag, self.tau
        cap = np.where(tau < 0, self.max_iterations + 1, tau)
        terms = np.maximum(0, np.ceil((cap[None, :] - L - ls[:, None]) / L))  # (n_l, N)
        n = tau.size
        mean = terms.mean(axis=1)
        se = terms.std(axis=1, ddof=1) / math.sqrt(n) if n > 1 else np.full(ls.size, np.inf)
        ucl = mean + norm.ppf(level) * se
        floor = 1.0 - (1.0 - level) ** (1.0 / n)
        ucl = np.where(terms.max(axis=1) == 0, floor, ucl)
        if self.n_censored:
            affected = self.max_iterations + 1 - L - ls > 0
            ucl = np.where(affected, np.inf, ucl)
        return TVBound(iterations=ls, estimate=mean, upper=ucl, level=level, n_runs=n,
                       n_censored=self.n_censored)

    def iterations_for(self, target_tv: float, *, level: float = 0.95) -> int:
        """The smallest iteration l whose upper confidence limit on TV is <= ``target_tv``."""
        if not 0.0 < target_tv < 1.0:
            raise ValueError(f"target_tv must lie in (0, 1), got {target_tv!r}")
        taus = np.where(self.tau < 0, self.max_iterations + 1, self.tau)
        hi = int(taus.max())
        # scan l in chunks: the (len(l), runs) table of terms for every l at once could take
        # gigabytes when the meeting times reach 10^6
        chunk = max(1, 2_000_000 // taus.size)
        for start in range(0, hi + 1, chunk):
            ls = np.arange(start, min(start + chunk, hi + 1))
            ok = np.flatnonzero(self.tv_upper_bound(ls, level=level).upper <= target_tv)
            if ok.size:
                return int(ls[ok[0]])
        raise ValueError(
            f"no iteration reaches an upper limit of {target_tv} with {self.tau.size} runs: the "
            f"Clopper-Pearson floor is {1 - (1 - level) ** (1 / self.tau.size):.3g}; use more runs"
        )


@dataclass(frozen=True)
class TVBound:
    """Coupling estimates of the TV distance to the target after each of ``iterations``."""

    iterations: np.ndarray
    estimate: np.ndarray
    upper: np.ndarray
    level: float
    n_runs: int
    n_censored: int

    def plot(self, ax=None, *, label: str | None = None):
        """Estimate and upper confidence limit against the iteration (log x axis)."""
        import matplotlib.pyplot as plt

        ax = ax or plt.gca()
        x = np.maximum(self.iterations, 1)
        line, = ax.plot(x, self.estimate, label=label or "coupling estimate")
        ax.plot(x, np.minimum(self.upper, 1.0), ls="--", color=line.get_color(),
                label=f"{self.level:.0%} upper limit ({self.n_runs} runs)")
        ax.set_xscale("log")
        ax.set_xlabel("iteration")
        ax.set_ylabel("TV bound")
        ax.set_ylim(0, 1.05)
        ax.legend()
        return ax


def _positive(name: str, value) -> float:
    value = float(value)
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
