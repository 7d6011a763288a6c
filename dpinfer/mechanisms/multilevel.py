r"""Multi-level releases of one count (seed 003: Gupte & Sundararajan, PODS 2010, Algorithm 1,
Lemmas 3 and 4; reference note §5, A7, §7, §8, pitfalls P10-P12).

One true count x is released at k privacy levels epsilon_1 > epsilon_2 > ... > epsilon_k,
i.e. a_1 > a_2 > ... > a_k with a_j = epsilon_j / sensitivity and alpha_j = exp(-a_j)
increasing (level 1 is the least private; the chain must run from less to more private,
note P10). The releases form a Markov chain of data-independent remaps:

    r_1 = x + Z,  Z double geometric(alpha_1)            (unbounded), or
    r_1 = clamp(x + Z, lower, upper)                      (clamped, G_{n,alpha_1});
    r_{j+1} ~ T_{alpha_j, alpha_{j+1}}(r_j, .),

so that every r_j has the single-level law (double geometric / G_{n,alpha_j}), and the joint
law is

    p(r_1, ..., r_k | x) = p_1(r_1 | x) * prod_{j >= 2} T_j(r_{j-1}, r_j),          (1)

with T_j free of x. Hence any coalition C of levels holding r_C learns exactly what its least
private member c_1 = min C learns: p(r_C | x) = p_{c_1}(r_{c_1} | x) * (terms free of x), and
the coalition is epsilon_{c_1}-DP, not sum_{j in C} epsilon_j-DP as independent releases would
be (Lemma 4; note §8: alpha = (0.2, 0.5, 0.8) gives ln 5 for every coalition holding level 1,
where independent releases at 0.2 and 0.5 give ln 10). r_1 is sufficient for x: a posterior
given all levels equals the posterior given r_1, and treating the levels as independent noisy
copies double counts (note §10.12).

Transition laws (alpha < beta, a = -ln alpha > b = -ln beta):

* unbounded (note A7 [derived]): r_{j+1} = r_j + W with

      W = 0 w.p. p0,  else W ~ double geometric(beta),   p0 = alpha (1 - beta)^2 / (beta (1 - alpha)^2),

  from the pgf identity DG_alpha(z) [p0 + (1 - p0) DG_beta(z)] = DG_beta(z), DG_c(z) =
  (1 - c)^2 / ((1 - c z)(1 - c/z)); 1 - p0 = (beta - alpha)(1 - alpha beta)/(beta (1 - alpha)^2).
  Equivalently W = X_1 - X_2 with X iid, X = 0 w.p. alpha (1 - beta)/(beta (1 - alpha)), else
  geometric(beta) on {0, 1, ...} (the one-sided ratio (1 - beta)(1 - alpha z)/((1 - alpha)(1 - beta z))).
  T(r, s) = w(s - r): w(0) = p0 + (1 - p0)(1 - beta)/(1 + beta),
  w(d) = (1 - p0)(1 - beta)/(1 + beta) beta^|d| for d != 0.

* clamped to [lower, upper] (Lemma 3: T = G_alpha^{-1} G_beta is stochastic; note A7's de-clamp
  sampler): row r of T is the law of clamp(Y + W, lower, upper) with Y = r inside the bounds,
  Y = lower - M at r = lower and Y = upper + M at r = upper, M ~ geometric(alpha) on {0, 1, ...}
  (given a clamped output, the unclamped value is the bound minus/plus M whatever x in
  [lower, upper] was, note §3.11). Closed form (n = upper - lower, derived from the tridiagonal
  G_alpha^{-1} of note §5 and checked against note §7's T_{1/4,1/2}):

      lower < r < upper:  T(r, s) = w(s - r) inside,  T(r, lower) = (1 - p0) beta^(r - lower)/(1 + beta),
                          T(r, upper) = (1 - p0) beta^(upper - r)/(1 + beta);
      r = lower:          T(r, lower) = (1 - alpha beta)/((1 + beta)(1 - alpha)),
                          T(r, s) = (1 - beta)/(1 + beta) beta^(s - lower - 1) (beta - alpha)/(1 - alpha)
                                    inside,
                          T(r, upper) = beta^(n - 1) (beta - alpha)/((1 + beta)(1 - alpha));

  r = upper is the mirror image. ``upper=None`` clamps at ``lower`` only (as
  :class:`~dpinfer.mechanisms.geometric.ClampedGeometric`), with the same formulas and no upper
  end. Every entry is evaluated in log space from log1p/expm1 pieces (note P12: no G^{-1}, no
  cancellation). The marginal of level j is G_{n,alpha_j} for true values in [lower, upper]
  (Lemma 3); likelihood (1) and the coalition guarantees hold for every true value.

Releases are exact (curator-grade): r_1 by the base mechanism's exact sampler, M by the exact
geometric sampler and W by exact Bernoulli draws and the exact discrete Laplace sampler of
:mod:`dpinfer.mechanisms.exact_sampling` (Canonne, Kamath & Steinke 2020), with every rate
a_j = Fraction(epsilon_j) / sensitivity, the exact value of the float epsilon.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.distributions.shape_utils import rv_size_is_none
from scipy.special import logsumexp

from dpinfer import privacy
from dpinfer._math import log1mexp
from dpinfer._validation import (
    as_integer_array,
    as_real_array,
    check_epsilon,
    check_integer_sensitivity,
    check_rng,
    check_within,
)
from dpinfer.distributions import DiscreteLaplace
from dpinfer.mechanisms.base import Mechanism, PrivacyAudit, PrivacyGuarantee, check_neighbour
from dpinfer.mechanisms.exact_sampling import (
    sample_bernoulli_exp,
    sample_discrete_laplace,
    sample_geometric_exp,
)
from dpinfer.mechanisms.geometric import ClampedGeometric, DoubleGeometric

__all__ = ["MultiLevelAudit", "MultiLevelGeometric"]

# Audit enumeration: member outputs reach this many sensitivities beyond the true values.
_AUDIT_MARGIN = 50
# Audit enumeration (clamped): true values from lower - 2 sensitivities to
# min(upper, lower + _AUDIT_SPAN sensitivities) + 2 sensitivities.
_AUDIT_SPAN = 4
# Audit enumeration: most cells of a coalition's joint pmf table per true value.
_AUDIT_CELLS = 1 << 21
# Audit enumeration: most outputs an earlier (summed-out) level ranges over.
_AUDIT_GRID = 2001
# Audit enumeration: the grid of earlier levels grows until the truncation changes no
# log-ratio by more than this.
_AUDIT_SLACK = 1e-12

# Elementwise operations of (1)'s transition terms, for numpy arrays and PyTensor graphs.
_NUMPY = SimpleNamespace(where=np.where, eq=np.equal, abs=np.abs, or_=np.logical_or)
_PYTENSOR = SimpleNamespace(where=pt.where, eq=pt.eq, abs=pt.abs, or_=pt.or_)


@dataclass(frozen=True)
class MultiLevelAudit(PrivacyAudit):
    """The audit of every non-empty coalition of levels: the fields of :class:`PrivacyAudit`
    describe the coalition of all levels; ``coalitions`` maps each coalition (a sorted tuple of
    level indices, 0 = least private) to its own audit. ``holds`` only if every coalition's
    measured loss is within its claim epsilon_{min C}."""

    coalitions: dict = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return all(audit.holds for audit in self.coalitions.values())


class _Transition:
    r"""T_{alpha,beta}: the law of the next level's release given the previous one
    (module docstring), for rates a = -ln alpha > b = -ln beta."""

    def __init__(self, a: Fraction, b: Fraction, rate_a: float, rate_b: float, lower, upper):
        self.a, self.b = a, b
        self.rate_a, self.rate_b = rate_a, rate_b
        self.lower, self.upper = lower, upper
        gap = rate_a - rate_b
        self.log_1m_alpha = log1mexp(-rate_a)  # log(1 - alpha)
        self.log_1p_beta = math.log1p(math.exp(-rate_b))  # log(1 + beta)
        self.log_c = log1mexp(-rate_b) - self.log_1p_beta  # log((1 - beta)/(1 + beta))
        self.log_beta_m_alpha = -rate_b + log1mexp(-gap)  # log(beta - alpha)
        self.log_p0 = -gap + 2.0 * log1mexp(-rate_b) - 2.0 * self.log_1m_alpha
        self.log_1m_p0 = log1mexp(-gap) + log1mexp(-(rate_a + rate_b)) - 2.0 * self.log_1m_alpha
        self.log_w0 = float(np.logaddexp(self.log_p0, self.log_1m_p0 + self.log_c))
        # log((1 - alpha beta)/((1 + beta)(1 - alpha))): staying at a bound
        self.log_stay = log1mexp(-(rate_a + rate_b)) - self.log_1p_beta - self.log_1m_alpha

    def _at_bound(self, v, ops):
        at = ops.eq(v, self.lower)
        return at if self.upper is None else ops.or_(at, ops.eq(v, self.upper))

    def log_pmf(self, r, s, ops=_NUMPY):
        """log T(r, s), elementwise (module docstring), for numpy (``ops=_NUMPY``) or PyTensor
        (``ops=_PYTENSOR``) integer values r, s in the release's range."""
        b = self.rate_b
        d = ops.abs(s - r)
        inside = ops.where(ops.eq(d, 0), self.log_w0, self.log_1m_p0 + self.log_c - b * d)
        if self.lower is None:
            return inside
        s_bound = self._at_bound(s, ops)
        to_bound = self.log_1m_p0 - self.log_1p_beta - b * d
        away = self.log_beta_m_alpha - self.log_1m_alpha - b * (d - 1)
        from_bound = ops.where(
            ops.eq(d, 0), self.log_stay, away + ops.where(s_bound, -self.log_1p_beta, self.log_c)
        )
        return ops.where(self._at_bound(r, ops), from_bound, ops.where(s_bound, to_bound, inside))

    # --- exact draws ---------------------------------------------------------------------
    def _bernoulli_ratio(self, size: int, rng) -> np.ndarray:
        """Bernoulli((1 - e^-b)/(1 - e^-a)) exactly: D ~ Bern(e^-b); D = 0 -> 1; else
        D2 ~ Bern(e^-(a-b)): D2 = 0 -> 0, D2 = 1 -> start again (memorylessness of the
        exponential: the accepted outcome is 1 with probability (1 - e^-b)/(1 - e^-a))."""
        out = np.empty(size, dtype=bool)
        todo = np.arange(size)
        while todo.size:
            d = sample_bernoulli_exp(self.b, todo.size, rng)
            out[todo[~d]] = True
            todo = todo[d]
            d2 = sample_bernoulli_exp(self.a - self.b, todo.size, rng)
            out[todo[~d2]] = False
            todo = todo[d2]
        return out

    def sample_increment(self, size: int, rng) -> np.ndarray:
        """W: 0 with probability p0 = e^-(a-b) [(1 - e^-b)/(1 - e^-a)]^2 (three independent
        exact Bernoulli draws), else an exact double geometric(beta) draw (scale 1/b)."""
        zero = sample_bernoulli_exp(self.a - self.b, size, rng)
        for _ in range(2):
            idx = np.flatnonzero(zero)
            zero[idx] = self._bernoulli_ratio(idx.size, rng)
        w = np.zeros(size, dtype=np.int64)
        moved = np.flatnonzero(~zero)
        w[moved] = sample_discrete_laplace(1 / self.b, moved.size, rng)
        return w

    def sample(self, r: np.ndarray, rng) -> np.ndarray:
        """The next level given the previous one (flat int64 array): de-clamp, add W, clamp."""
        y = r.copy()
        if self.lower is not None:
            for bound, sign in ((self.lower, -1), (self.upper, 1)):
                if bound is not None:
                    at = np.flatnonzero(r == bound)
                    y[at] += sign * sample_geometric_exp(self.a, at.size, rng)
        y += self.sample_increment(r.size, rng)
        if self.lower is not None:
            y = np.clip(y, self.lower, self.upper)
        return y

    def dist(self, r, size):
        """The same step as a PyTensor random graph (numpy floating-point draws, for
        predictive simulation)."""
        y = r
        if self.lower is not None:
            p = np.float64(-math.expm1(-self.rate_a))  # M + 1 ~ Geometric(1 - alpha) on {1, 2, ..}
            for bound, sign in ((self.lower, -1), (self.upper, 1)):
                if bound is not None:
                    m = pm.Geometric.dist(p=p, size=size) - 1
                    y = pt.where(pt.eq(r, bound), y + sign * m, y)
        moved = pm.Bernoulli.dist(p=np.float64(math.exp(self.log_1m_p0)), size=size)
        step = DiscreteLaplace.dist(mu=np.int64(0), b=np.float64(1.0 / self.rate_b), size=size)
        y = y + moved * step
        if self.lower is not None:
            y = pt.maximum(y, self.lower) if self.upper is None else pt.clip(y, self.lower, self.upper)
        return y


class MultiLevelGeometric(Mechanism):
    r"""One count released at k privacy levels as a Markov chain of data-independent remaps
    (seed 003, Algorithm 1; module docstring).

    ``epsilons`` = (epsilon_1, ..., epsilon_k), strictly decreasing: level 0 (the first entry
    of the release's last axis) is the least private, alpha_j = exp(-epsilon_j/sensitivity)
    increases along the chain (note P10). Unbounded (``lower = upper = None``): level 0 is
    :class:`DoubleGeometric` (epsilon_1) and r_{j+1} = r_j + W_j (note A7). Clamped (``lower``,
    optionally ``upper``): level 0 is :class:`ClampedGeometric` (epsilon_1, lower, upper) and
    r_{j+1} ~ T_{alpha_j, alpha_{j+1}}(r_j, .) (Lemma 3). Level j's marginal is the
    single-level mechanism at epsilon_j (:meth:`marginal`; for clamped releases given true
    values in [lower, upper]).

    Privacy: the full release is (epsilon_1, 0)-DP and any coalition C of levels is
    (epsilon_{min C}, 0)-DP (Lemma 4): p(r_C | x) = p_{min C}(r_{min C} | x) * (terms free of x).
    The likelihood is (1) of the module docstring; :meth:`observe` registers it in a PyMC model
    as the level-0 release (handled by :func:`dpinfer.sample` like any single release) plus a
    Potential holding the x-free transition terms, so the model's log-probability is the exact
    joint and the levels are never treated as independent copies.
    """

    discrete = True
    exact_sampler = True

    def __init__(self, epsilons, sensitivity=1, lower=None, upper=None, neighbour: str = "add-remove"):
        if isinstance(epsilons, (str, bytes)) or not hasattr(epsilons, "__len__"):
            raise TypeError(f"epsilons must be a sequence of privacy levels, got {epsilons!r}")
        eps = tuple(check_epsilon(e, f"epsilons[{j}]") for j, e in enumerate(epsilons))
        if not eps:
            raise ValueError("epsilons must hold at least one privacy level")
        self.sensitivity = check_integer_sensitivity(sensitivity)
        self.neighbour = check_neighbour(neighbour)
        rates = [e / self.sensitivity for e in eps]
        if any(later >= earlier for earlier, later in zip(rates, rates[1:])):
            raise ValueError(
                "epsilons must be strictly decreasing (level 0 least private: epsilon_1 > "
                "epsilon_2 > ..., so alpha = exp(-epsilon/sensitivity) increases along the chain; "
                f"seed 003 Lemma 3 needs alpha_j < alpha_(j+1)), got {list(eps)}"
            )
        if lower is None and upper is not None:
            raise ValueError("upper needs lower: give lower (and optionally upper), or neither for "
                             f"an unbounded release; got lower=None, upper={upper!r}")
        if lower is None:
            self._levels = tuple(DoubleGeometric(e, self.sensitivity, self.neighbour) for e in eps)
            self.lower = self.upper = None
        else:
            self._levels = tuple(
                ClampedGeometric(e, lower, upper, self.sensitivity, self.neighbour) for e in eps
            )
            self.lower, self.upper = self._levels[0].lower, self._levels[0].upper
        self._epsilons = eps
        exact = [Fraction(e) / self.sensitivity for e in eps]
        self._steps = tuple(
            _Transition(exact[j], exact[j + 1], rates[j], rates[j + 1], self.lower, self.upper)
            for j in range(len(eps) - 1)
        )

    def __repr__(self) -> str:
        eps = ", ".join(f"{e:g}" for e in self._epsilons)
        return (f"MultiLevelGeometric(epsilons=({eps}), sensitivity={self.sensitivity}, "
                f"lower={self.lower}, upper={self.upper}, neighbour={self.neighbour!r})")

    # --- structure -----------------------------------------------------------------------------
    @property
    def n_levels(self) -> int:
        """k, the number of levels (the length of the release's last axis)."""
        return len(self._epsilons)

    @property
    def epsilons(self) -> tuple:
        """(epsilon_1, ..., epsilon_k), strictly decreasing."""
        return self._epsilons

    @property
    def alphas(self) -> tuple:
        """(alpha_1, ..., alpha_k), alpha_j = exp(-epsilon_j / sensitivity), increasing."""
        return tuple(level.alpha if self.lower is None else level.noise.alpha for level in self._levels)

    @property
    def _top(self) -> float:
        if self.lower is None:
            return math.inf
        return math.inf if self.upper is None else self.upper

    @property
    def _bottom(self) -> float:
        return -math.inf if self.lower is None else self.lower

    def _check_level(self, level, first: int = 0) -> int:
        if isinstance(level, bool) or not isinstance(level, numbers.Integral):
            raise TypeError(f"level must be a whole number in {first}..{self.n_levels - 1}, got {level!r}")
        if not first <= level < self.n_levels:
            raise ValueError(f"level must lie in {first}..{self.n_levels - 1}, got {level}")
        return int(level)

    def marginal(self, level: int) -> Mechanism:
        """The single-level mechanism whose law release[..., level] has: DoubleGeometric or
        ClampedGeometric at epsilons[level] (for clamped releases, given true values in
        [lower, upper]; level 0 for every true value)."""
        return self._levels[self._check_level(level)]

    def log_transition(self, level: int, previous, current) -> np.ndarray:
        """log T(previous, current) = log P(release[..., level] = current | release[...,
        level - 1] = previous), level in 1..k-1 (module docstring), elementwise."""
        step = self._steps[self._check_level(level, first=1) - 1]
        r = as_integer_array("previous", previous)
        s = as_integer_array("current", current)
        for name, v in (("previous", r), ("current", s)):
            check_within(name, v, self._bottom, self._top)
        return step.log_pmf(r, s)

    def transition_matrix(self, level: int) -> np.ndarray:
        """T_{alpha_(level-1), alpha_level}[i, j] = P(release[..., level] = lower + j |
        release[..., level - 1] = lower + i), the (n+1) x (n+1) matrix G_{alpha}^{-1} G_{beta}
        of seed 003 Lemma 3 (n = upper - lower), from the closed form."""
        if self.upper is None:
            raise ValueError("transition_matrix needs finite bounds (lower and upper); "
                             f"got lower={self.lower}, upper={self.upper}")
        values = np.arange(self.lower, self.upper + 1)
        return np.exp(self.log_transition(level, values[:, None], values[None, :]))

    # --- privacy -------------------------------------------------------------------------------
    @property
    def privacy(self) -> PrivacyGuarantee:
        """(epsilon_1, 0)-DP for the full release (Lemma 4 with C = all levels)."""
        return self.coalition_privacy(range(self.n_levels))

    def _check_levels(self, levels) -> tuple:
        if isinstance(levels, (str, bytes)) or not hasattr(levels, "__iter__"):
            raise TypeError(f"levels must be a collection of level indices, got {levels!r}")
        members = tuple(sorted({self._check_level(v) for v in levels}))
        if not members:
            raise ValueError("levels must name at least one level")
        return members

    def coalition_privacy(self, levels) -> PrivacyGuarantee:
        """The guarantee of a coalition holding the releases of ``levels`` (indices into the
        release's last axis, 0 = least private): (epsilon_{min C}, 0)-DP (seed 003 Lemma 4;
        the paper's r_{c_k} is r_{c_t}, note P16)."""
        members = self._check_levels(levels)
        first = self._levels[members[0]].privacy
        return PrivacyGuarantee(
            first.epsilon, 0.0, self.sensitivity, self.neighbour, "l1",
            note=(f"levels {list(members)} of a {self.n_levels}-level Markov release "
                  f"(seed 003 Lemma 4: the privacy of level {members[0]}); {first.note}"),
        )

    def _audit_true_values(self) -> tuple[int, int]:
        """True values audited: 0..2 sensitivity unbounded (the chain commutes with shifts, so
        every range of true values gives the same ratios); clamped, values below lower and
        above upper included."""
        sens = self.sensitivity
        if self.lower is None:
            return 0, 2 * sens
        return self.lower - 2 * sens, int(min(self._top, self.lower + _AUDIT_SPAN * sens)) + 2 * sens

    def _audit_head(self, first: int, box: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, float, tuple]:
        """(log h, slack, grid ends): log h[i, m] ~ log P(level ``first`` = box[m] | x[i]),
        summing levels 0..first-1 over a grid of outputs, and a bound on how much the mass
        of paths leaving the grid can change any log-ratio of h.

        Paths leaving the grid: each level moves by at most |U_i| beyond the previous one
        (U_0 = Z, U_i = W_i; de-clamping only moves towards a bound, clamping keeps a path
        inside), so some level j < first lies beyond a grid end at distance t from the true
        values only if sum_{i < first} |U_i| > t, of probability at most
        sum_i P(|U_i| > t/first) <= first * 2 alpha^(floor(t/first) + 1), alpha that of level
        first - 1, the largest among the U_i
        (P(|DG(c)| >= m) = 2 c^m/(1 + c), and P(|W| >= m) is (1 - p0) times that). With tau
        the sum of this over the open grid ends, P(first = r | x) lies in [h, h + tau], so each
        log-ratio moves by at most log1p(tau / min h)."""
        level0 = self._levels[0]
        if first == 0:
            return level0.log_likelihood(box[None, :], x[:, None]), 0.0, (int(box[0]), int(box[-1]))
        log_alpha = -self._steps[first - 1].rate_a
        margin = int(box[-1] - x[-1]) + 10 * self.sensitivity
        while True:
            lo = int(max(self._bottom, x[0] - margin))
            hi = int(min(self._top, x[-1] + margin))
            grid = np.arange(lo, hi + 1)
            terms = []
            if lo > self._bottom:
                terms.append(min(x[0], self._top) - lo)
            if hi < self._top:
                terms.append(hi - max(x[-1], self._bottom))
            log_tau = -math.inf
            for t in terms:
                log_tau = np.logaddexp(log_tau, math.log(2 * first) + (t // first + 1) * log_alpha)
            log_h = level0.log_likelihood(grid[None, :], x[:, None])
            for j, step in enumerate(self._steps[:first]):
                target = box if j == first - 1 else grid
                log_t = step.log_pmf(grid[:, None], target[None, :])
                log_h = np.stack([logsumexp(row[:, None] + log_t, axis=0) for row in log_h])
            slack = float(np.log1p(np.exp(min(log_tau - np.min(log_h), 700.0))))
            wider = min(2 * margin, (_AUDIT_GRID - x.size) // 2)
            if slack <= _AUDIT_SLACK or wider <= margin:
                return log_h, slack, (lo, hi)
            margin = wider

    def audit_coalition(self, levels) -> PrivacyAudit:
        """Exact check of :meth:`coalition_privacy` by enumeration: the coalition's joint pmf
        p(r_C | x) = sum over the other levels of (1), tabulated on a box of outputs per
        member, for every pair of neighbouring true values in a small range; the largest
        |log-ratio| (the measured epsilon) and the hockey-stick divergence at the claimed epsilon.

        Levels before the first member are summed over a grid wide enough that the paths
        leaving it change no log-ratio by more than 1e-12 (the bound is in ``method``; two-sided
        clamped releases with a small range are summed exactly). Levels between members are
        summed over the box: those sums are free of x and the same for both true values of
        a pair, so they cancel from every ratio. Lemma 4 says the measured epsilon is
        epsilon_{min C}: sensitivity times -ln alpha_{min C}. The table holds at most 2^21
        cells per true value, which limits a coalition to about six levels."""
        members = self._check_levels(levels)
        claimed = self._epsilons[members[0]]
        x_lo, x_hi = self._audit_true_values()
        x = np.arange(x_lo, x_hi + 1)
        width = int(round(_AUDIT_CELLS ** (1.0 / len(members))))
        reach = min(_AUDIT_MARGIN * self.sensitivity, (width - x.size) // 2)
        if reach < 1:
            raise ValueError(
                f"a coalition of {len(members)} levels is too large to enumerate (its joint table "
                f"would exceed {_AUDIT_CELLS} cells per true value); audit smaller coalitions"
            )
        box = np.arange(int(max(self._bottom, x_lo - reach)), int(min(self._top, x_hi + reach)) + 1)
        head, slack, (g_lo, g_hi) = self._audit_head(members[0], box, x)
        t = len(members)
        free = np.zeros((1,) * t)  # log of the x-free factors linking consecutive members
        for i, (c, c_next) in enumerate(zip(members, members[1:])):
            log_p = self._steps[c].log_pmf(box[:, None], box[None, :])
            for step in self._steps[c + 1:c_next]:
                log_p = logsumexp(log_p[:, :, None] + step.log_pmf(box[:, None], box[None, :])[None], axis=1)
            shape = [1] * t
            shape[i] = shape[i + 1] = box.size
            free = free + log_p.reshape(shape)
        joint = [(head[i].reshape((box.size,) + (1,) * (t - 1)) + free).ravel() for i in range(x.size)]
        loss, delta = 0.0, 0.0
        for u, v in privacy.integer_neighbour_pairs(x_lo, x_hi, self.sensitivity):
            a, b = joint[u - x_lo], joint[v - x_lo]
            loss = max(loss, float(np.max(np.abs(a - b))))
            delta = max(delta, privacy.hockey_stick(a, b, claimed))
        earlier = (
            f"levels before {members[0]} summed over outputs {g_lo}..{g_hi} (the truncation moves "
            f"each log-ratio by at most {slack:.1e})" if members[0] else "no earlier levels"
        )
        method = (
            f"enumeration of the joint pmf of levels {list(members)}: true values {x_lo}..{x_hi}, "
            f"neighbours |x - x'| <= {self.sensitivity}, outputs {int(box[0])}..{int(box[-1])} per "
            f"level; {earlier}"
        )
        return PrivacyAudit(claimed, 0.0, loss, delta, method)

    def audit(self) -> MultiLevelAudit:
        """:meth:`audit_coalition` for every non-empty coalition of levels (2^k - 1 of them);
        the result's own fields are those of the coalition of all levels."""
        found = {
            members: self.audit_coalition(members)
            for size in range(1, self.n_levels + 1)
            for members in itertools.combinations(range(self.n_levels), size)
        }
        full = found[tuple(range(self.n_levels))]
        return MultiLevelAudit(
            full.claimed_epsilon, full.claimed_delta, full.measured_epsilon, full.measured_delta,
            f"every non-empty coalition of the {self.n_levels} levels; all levels: {full.method}",
            coalitions=found,
        )

    # --- release -------------------------------------------------------------------------------
    def release(self, true_values, rng: np.random.Generator) -> np.ndarray:
        """Exact draws of all levels: shape true_values.shape + (k,), level 0 first (module
        docstring; integer arithmetic throughout)."""
        rng = check_rng(rng)
        x = as_integer_array("true_values", true_values)
        r = self._levels[0].release(x, rng).reshape(-1)
        out = [r]
        for step in self._steps:
            r = step.sample(r, rng)
            out.append(r)
        return np.stack(out, axis=-1).reshape(x.shape + (self.n_levels,))

    # --- likelihood ------------------------------------------------------------------------------
    def check_release(self, release) -> np.ndarray:
        """Whole numbers in [lower, upper], with a last axis of length k (one value per level)."""
        release = as_integer_array("release", release)
        if release.ndim == 0 or release.shape[-1] != self.n_levels:
            raise ValueError(
                f"release must have a last axis of length {self.n_levels} (one value per level), "
                f"got shape {release.shape}"
            )
        check_within("release", release, self._bottom, self._top)
        return release

    def chain_log_likelihood(self, release) -> np.ndarray:
        """sum_{j >= 1} log T_j(r_{j-1}, r_j): the part of log-likelihood (1) free of the true
        values, shape release.shape[:-1]."""
        release = self.check_release(release)
        total = np.zeros(release.shape[:-1])
        for j, step in enumerate(self._steps):
            total = total + step.log_pmf(release[..., j], release[..., j + 1])
        return total

    def log_likelihood(self, release, true_values) -> np.ndarray:
        """log p(r_1, ..., r_k | x) = log p_1(r_1 | x) + sum_j log T_j(r_{j-1}, r_j), (1);
        release of shape S + (k,) against true values broadcasting with S."""
        release = self.check_release(release)
        x = as_real_array("true_values", true_values)
        try:
            np.broadcast_shapes(release.shape[:-1], x.shape)
        except ValueError:
            raise ValueError(
                f"release has shape {release.shape} (values per level last) and true_values has "
                f"shape {x.shape}; release.shape[:-1] and true_values.shape must match"
            ) from None
        return self._levels[0].log_likelihood(release[..., 0], x) + self.chain_log_likelihood(release)

    def log_likelihood_bound_outside(self, release, k: int, *, support=(-np.inf, np.inf)) -> np.ndarray:
        """Level 0's bound on sup_{|x - r_1| > k} p_1(r_1 | x) plus the x-free chain terms of
        (1), shape release.shape[:-1]."""
        release = self.check_release(release)
        bound = self._levels[0].log_likelihood_bound_outside(release[..., 0], k, support=support)
        return bound + self.chain_log_likelihood(release)

    def dist(self, true_values):
        """PyMC distribution of the whole release, shape true_values.shape + (k,): log-p is (1)
        (level 0's distribution plus the transition terms); draws follow the chain with numpy
        floating-point draws (predictive simulation; curators use :meth:`release`)."""
        level0, steps = self._levels[0], self._steps
        scale = np.float64(level0.scale if self.lower is None else level0.noise.scale)

        def random(x, size):
            size = x.shape if rv_size_is_none(size) else size  # one draw of every step per cell
            r = DiscreteLaplace.dist(mu=x, b=scale, size=size)
            if self.lower is not None:
                r = pt.maximum(r, self.lower) if self.upper is None else pt.clip(r, self.lower, self.upper)
            levels = [r]
            for step in steps:
                levels.append(step.dist(levels[-1], size))
            return pt.stack(levels, axis=-1)

        def logp(value, x):
            total = pm.logp(level0.dist(x), value[..., 0])
            for j, step in enumerate(steps):
                total = total + step.log_pmf(value[..., j], value[..., j + 1], _PYTENSOR)
            return total

        return pm.CustomDist.dist(
            true_values, dist=random, logp=logp, ndim_supp=1, signature="()->(k)", dtype="int64",
            class_name="MultiLevelGeometric",
        )

    def observe(self, name: str, true_values, observed, *, dims=None, model=None):
        """Register the release ``observed`` (shape true shape + (k,)) of ``true_values`` in
        the current PyMC model: level 0 as an observed release of the base mechanism
        (:meth:`Mechanism.observe` of ``marginal(0)``, so :func:`dpinfer.sample` marginalises
        or draws the counts exactly as for a single release), and the x-free transition terms
        of (1) as the constant ``pm.Potential(name + "_chain")`` (per cell, ``dims``), so the
        model's log-probability is the exact joint log p(r_1..r_k | x) + log prior. Returns
        the level-0 release variable. ``observed`` must be an array (not pm.Data)."""
        if hasattr(observed, "get_value") or hasattr(observed, "owner"):
            raise TypeError("observed must be an array of released values (a multi-level release "
                            f"is registered as constants), got {type(observed).__name__}")
        model = pm.modelcontext(model)
        value = self.check_release(observed)
        rv = self._levels[0].observe(name, true_values, value[..., 0], dims=dims, model=model)
        pm.Potential(f"{name}_chain", pt.constant(self.chain_log_likelihood(value)), model=model, dims=dims)
        return rv

    # --- utility -------------------------------------------------------------------------------
    def _per_level(self, facet: str, true_values) -> np.ndarray:
        if self.lower is None:
            x = as_real_array("true_values", true_values)
        else:
            x = as_integer_array("true_values", true_values)
            check_within("true_values", x, self.lower, self._top)
        return np.stack([getattr(level, facet)(x) for level in self._levels], axis=-1)

    def bias(self, true_values) -> np.ndarray:
        """E[r_j] - x for every level j, shape true_values.shape + (k,): 0 unbounded;
        ClampedGeometric's closed form at epsilon_j (level j's marginal is G_{n,alpha_j},
        Lemma 3; true values must lie in [lower, upper])."""
        return self._per_level("bias", true_values)

    def variance(self, true_values) -> np.ndarray:
        """Var[r_j | x] for every level j, shape true_values.shape + (k,): 2 alpha_j/(1 -
        alpha_j)^2 unbounded, ClampedGeometric's closed form at epsilon_j clamped (true values
        in [lower, upper])."""
        return self._per_level("variance", true_values)

    def release_interval(self, true_values, prob: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """The interval of the least private level (level 0, which is sufficient for x): that
        of DoubleGeometric / ClampedGeometric at epsilon_1."""
        return self._levels[0].release_interval(true_values, prob)
