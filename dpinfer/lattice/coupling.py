r"""The coupling bound on the total-variation distance of an MCMC chain to its target, from the
meeting times of L-lag coupled pairs (Biswas, Jacob & Vanetti 2019, "Estimating convergence of
Markov chains with L-lag couplings", NeurIPS; seed 001's Algorithm 3, reference note 001 §7).

A pair of chains X (leading by ``L`` iterations) and Y, each with the sampler's own kernel,
that stay together once they meet, has a meeting time ``tau`` (X's iteration at which
``X_tau = Y_{tau - L}``). Theorem 2.5:

    TV(law of the chain at iteration l, target) <= E[max(0, ceil((tau - L - l) / L))],

estimated by the average over independent runs. The estimate is an estimate: it is not a
proof of convergence and it is only as good as the number of runs (see
:meth:`MeetingTimes.tv_upper_bound` for the confidence limit). The couplings themselves live
with their samplers: :meth:`dpinfer.lattice.random_walk.LatticeWalk.meeting_times`,
:meth:`dpinfer.lattice.noise_gibbs.NoiseGibbs.meeting_times` and
:func:`dpinfer.lattice.independence_sampler.independence_meeting_times`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri


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
        ucl = mean + ndtri(level) * se
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
