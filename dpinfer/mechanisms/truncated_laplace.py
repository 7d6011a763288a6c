"""Laplace noise on a bounded release: renormalised truncation and boundary-inflated truncation.

Source: F. Liu, "Statistical Properties of Sanitized Results from Differentially Private
Laplace Mechanism with Univariate Bounding Constraints" (seed 002; team note
``reference/seed-002-truncated-bit-laplace.md``, cited below as "seed 002 §...").

Notation (seed 002 §0): true statistic x (the paper's s), public data-independent bounds
[l, u], width D = u - l, sensitivity Δ, Laplace scale b, Laplace CDF F(r; x, b).
For a true value x write x_c = clip(x, l, u), α = (x_c - l)/b, γ = (u - x_c)/b, and

    m_l = 1 - e^{-α} = P(1, α),   m_r = 1 - e^{-γ} = P(1, γ)

(P(k, ·) the regularised lower incomplete gamma function), so that
2 (F(u; x_c, b) - F(l; x_c, b)) = m_l + m_r with no cancellation (seed 002 §3.3, pitfall P9).

* :class:`TruncatedLaplace` — release ~ Laplace(x, b) conditioned on [l, u] (seed 002 Eq (4)).
  Its normaliser depends on x, so the paper's b = Δ/ε is NOT ε-DP (seed 002 §2.5, erratum
  E8, pitfall P2); the default scale here is the smallest b that is.
* :class:`BITLaplace` — release = clamp(x + Laplace(0, b), l, u) (seed 002 Eq (5)): ε-DP with
  b = Δ/ε by post-processing, with point masses at the bounds.

Both samplers are inverse-CDF transforms of one uniform draw (constant time; rejection
sampling would leak 1/C(x) through its running time, pitfall P3) in float64 arithmetic:
simulation-grade, not curator-grade (``exact_sampler = False``).
"""

from __future__ import annotations

import abc
import math
import numbers
import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from scipy.special import gammainc, gammaincc

from dpinfer._validation import (
    as_real_array,
    check_bounds,
    check_epsilon,
    check_positive,
    check_probability,
    check_same_shape,
    check_within,
)
from dpinfer.mechanisms.base import Mechanism, PrivacyAudit, PrivacyGuarantee, check_neighbour
from dpinfer.privacy import max_privacy_loss

LOG2 = math.log(2.0)


# --- shared Laplace maths --------------------------------------------------------------------
def _laplace_logcdf(z: np.ndarray) -> np.ndarray:
    """log F(z) for the standard Laplace(0, 1): z - log 2 for z < 0, log1p(-e^{-z}/2) otherwise."""
    return np.where(z < 0, z - LOG2, np.log1p(-0.5 * np.exp(-np.maximum(z, 0.0))))


def _two_c(alpha, gamma):
    """2 C(x_c) = m_l + m_r = P(1, α) + P(1, γ): twice the Laplace mass of [l, u], no cancellation."""
    return -np.expm1(-alpha) - np.expm1(-gamma)


def _bounded_laplace_quantile(q, centre, b, m_l, m_r, lower, upper) -> np.ndarray:
    """Inverse CDF of Laplace(centre, b) restricted to [centre - A, centre + G], where
    m_l = 1 - e^{-A/b} and m_r = 1 - e^{-G/b} (m = 1 for an unrestricted side), then clipped to
    [lower, upper].

    With t = q (m_l + m_r) - m_l in [-m_l, m_r] the quantile is
    centre - b sign(t) log1p(-|t|): for m_l = m_r = 1 (t = 2q - 1) the plain Laplace quantile,
    otherwise the renormalised truncation. The final clip is the BIT clamp, and for the
    truncated law only a guard against rounding at the bounds.
    """
    t = q * (m_l + m_r) - m_l
    with np.errstate(divide="ignore"):
        r = centre - b * np.sign(t) * np.log1p(-np.abs(t))
    return np.clip(r, lower, upper)


def _check_finite_real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _check_support(support) -> tuple[float, float]:
    if support is None:
        return -math.inf, math.inf
    try:
        lo, hi = (float(v) for v in support)
    except (TypeError, ValueError):
        raise TypeError(f"support must be a pair (lowest, highest) of numbers, got {support!r}") from None
    if math.isnan(lo) or math.isnan(hi) or not lo <= hi:
        raise ValueError(f"support must satisfy lowest <= highest, got {support!r}")
    return lo, hi


class _BoundedLaplace(Mechanism):
    """Shared facets of the two bounded Laplace mechanisms: bounds, release validation, the
    inverse-CDF sampler, the PyMC wrapper (``pm.Truncated`` or ``pm.Censored`` around
    ``pm.Laplace``), moments, central intervals and the tail bound for windows."""

    discrete = False
    exact_sampler = False
    _pymc_bounding = None  # pm.Truncated or pm.Censored

    def __init__(self, lower: float, upper: float, scale: float, sensitivity: float, neighbour: str):
        self.lower = lower
        self.upper = upper
        self.scale = scale
        self.sensitivity = sensitivity
        self.neighbour = check_neighbour(neighbour)

    # --- helpers ---------------------------------------------------------------------------
    def _reduced(self, x: np.ndarray):
        """x_c = clip(x, l, u), α = (x_c - l)/b, γ = (u - x_c)/b (γ = inf for a one-sided bound)."""
        x_c = np.clip(x, self.lower, self.upper)
        return x_c, (x_c - self.lower) / self.scale, (self.upper - x_c) / self.scale

    def check_release(self, release) -> np.ndarray:
        """Finite reals in [lower, upper]; anything else cannot be a release of this mechanism."""
        release = as_real_array("release", release)
        check_within("release", release, self.lower, self.upper)
        return release

    def _log_likelihood_inputs(self, release, true_values):
        """(release, true values) broadcast; a release outside [lower, upper] is an error (it
        cannot be a release of this mechanism), as for every bounded mechanism."""
        release = self.check_release(release)
        true_values = as_real_array("true_values", true_values)
        check_same_shape("release", release, "true_values", true_values)
        return np.broadcast_arrays(release, true_values)

    # --- release -------------------------------------------------------------------------------
    @abc.abstractmethod
    def _quantile(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Inverse CDF (left-continuous) of the release law given true values x."""

    def release(self, true_values, rng: np.random.Generator) -> np.ndarray:
        """One release per true value: the inverse CDF of one uniform draw (constant time)."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        true_values = as_real_array("true_values", true_values)
        return self._quantile(rng.random(true_values.shape), true_values)

    def release_interval(self, true_values, prob: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """Central interval: the (1 - prob)/2 and (1 + prob)/2 quantiles of the release law
        (with atoms, as for BIT, the interval holds the release with probability >= prob)."""
        prob = check_probability(prob)
        true_values = as_real_array("true_values", true_values)
        return self._quantile(0.5 * (1 - prob), true_values), self._quantile(0.5 * (1 + prob), true_values)

    # --- likelihood ----------------------------------------------------------------------------
    def dist(self, true_values):
        """``pm.Truncated`` / ``pm.Censored`` of ``pm.Laplace.dist(mu=true_values, b=scale)`` on
        [lower, upper], all parameters float64 (pymc6 note §3.1: literals would become float32)."""
        mu = pt.as_tensor_variable(true_values)
        if mu.dtype != "float64":
            mu = pt.cast(mu, "float64")
        upper = None if math.isinf(self.upper) else np.float64(self.upper)
        base = pm.Laplace.dist(mu=mu, b=np.float64(self.scale))
        return type(self)._pymc_bounding.dist(base, lower=np.float64(self.lower), upper=upper)

    @abc.abstractmethod
    def _log_likelihood_limit(self, release: np.ndarray, direction: int) -> np.ndarray:
        """lim log p(release | x) as x -> direction * infinity."""

    def log_likelihood_bound_outside(self, release, k, *, support=None) -> np.ndarray:
        """log sup{ p(release | x) : integer x in ``support``, |x - release| > k } — exact.

        For both mechanisms p(r | x) is monotone in x on each side of r (truncated: increasing
        for x < r, decreasing for x > r, because |d log C/dx| <= 1/b; BIT interior: Laplace;
        BIT atom at l: decreasing in x; atom at u: increasing). So the supremum over each side
        {x <= ceil(r - k) - 1} and {x >= floor(r + k) + 1}, cut to ``support``, is attained at
        one of its two ends (an infinite end as a limit).

        Beware: a true value beyond a bound is barely distinguishable from the bound itself
        (truncated: f_T(r | x) = f_T(r | clip(x, l, u)); BIT: P(r = l | x) -> 1 as x -> -inf),
        so over all integers the bound does not decay in k for every r. Pass the true values'
        support, e.g. ``support=(0, np.inf)`` for counts, to get the bound that windows need.
        (The simpler bound e^{-|r-x|/b} / (2b min C) of the brief holds only for x in [l, u].)
        """
        release = self.check_release(release)
        k = _check_finite_real("k", k)
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k!r}")
        lo, hi = _check_support(support)
        lo, hi = math.ceil(lo) if math.isfinite(lo) else lo, math.floor(hi) if math.isfinite(hi) else hi
        # innermost integers with |x - r| > k (r +- k may round onto an integer: test both)
        left_hi, right_lo = np.ceil(release - k), np.floor(release + k)
        left_hi = np.minimum(np.where(release - left_hi > k, left_hi, left_hi - 1), hi)
        right_lo = np.maximum(np.where(right_lo - release > k, right_lo, right_lo + 1), lo)
        candidates = [(np.full_like(release, lo), lo <= left_hi), (left_hi, lo <= left_hi),
                      (right_lo, right_lo <= hi), (np.full_like(release, hi), right_lo <= hi)]
        best = np.full(release.shape, -np.inf)
        for x, valid in candidates:
            finite = np.isfinite(x)
            value = self.log_likelihood(release, np.where(finite, x, 0.0))
            value = np.where(finite, value, self._log_likelihood_limit(release, np.sign(x)))
            best = np.where(valid, np.maximum(best, value), best)
        return best

    # --- utility -------------------------------------------------------------------------------
    @abc.abstractmethod
    def _moments(self, alpha: np.ndarray, gamma: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(E[r - x_c], E[(r - x_c)^2]) given the true values x (α, γ as in ``_reduced``)."""

    def bias(self, true_values) -> np.ndarray:
        """E[r] - x = (x_c - x) + E[r - x_c]."""
        x = as_real_array("true_values", true_values)
        x_c, alpha, gamma = self._reduced(x)
        return (x_c - x) + self._moments(alpha, gamma, x)[0]

    def variance(self, true_values) -> np.ndarray:
        """Var[r] = E[(r - x_c)^2] - E[r - x_c]^2 (the shift to x_c keeps it well conditioned
        when x lies far outside [l, u])."""
        x = as_real_array("true_values", true_values)
        _, alpha, gamma = self._reduced(x)
        m1, m2 = self._moments(alpha, gamma, x)
        return m2 - m1**2


class TruncatedLaplace(_BoundedLaplace):
    """Renormalised truncated Laplace mechanism (seed 002 Eq (4), §2.4(a)).

    Release law, for r in [l, u] (0 elsewhere)::

        f_T(r | x) = e^{-|r - x|/b} / (2b C(x)),   C(x) = F(u; x, b) - F(l; x, b).

    For x outside [l, u] the law equals the one at x_c = clip(x, l, u) (memoryless tails,
    seed 002 §2.4(a) and §2.5 item 4), so everything is computed at x_c, with
    2 C(x_c) = m_l + m_r (stable CDF difference; pitfall P9):

        log f_T(r | x) = -log b - |r - x_c|/b - log(m_l + m_r).

    Privacy (seed 002 §2.5, correcting the paper's claim that b = Δ/ε is ε-DP, erratum E8).
    The privacy loss of output r between true values s, s' is
    L = (|r - s'| - |r - s|)/b + log C(s') - log C(s). Derivation of its supremum over all
    s, s' in R with |s - s'| <= Δ and r in [l, u]:

    1. f_T depends on s only through clip(s, l, u), and clipping is 1-Lipschitz, so take
       s, s' in [l, u] with t = |s - s'| <= Δ_e := min(Δ, D).
    2. For fixed s < s' the r-part is at most t/b, attained at r = l (any r <= s).
    3. C is concave and positive on [l, u], so log C is concave; hence
       log C(s + t) - log C(s) is non-increasing in s: take s = l.
    4. d/dt [t/b + log C(l + t)] = 1/b + C'/C >= 0, since b C' + C = 1 - e^{-(u - s)/b} >= 0;
       take t = Δ_e.

    So ε_eff(b) = Δ_e/b + log ΔC(b), with
    ΔC(b) = C(l + Δ_e)/C(l) = (2 - e^{-Δ_e/b} - e^{-(D - Δ_e)/b}) / (1 - e^{-D/b}).
    For Δ < D this is the note's formula; for Δ >= D (which the note's formula mishandles: its
    D - Δ term turns negative) the worst pair is s = l, s' = u, ΔC = 1 and ε_eff = D/b.
    ε < ε_eff(Δ/ε) <= 2ε, and ε_eff is decreasing in b.

    Parameters
    ----------
    epsilon : float > 0
        The privacy budget asked for.
    lower, upper : float
        Public, data-independent bounds, lower < upper.
    sensitivity : float > 0
        Δ, the largest change of the true statistic between neighbours.
    scale : None, float > 0, "paper" or "conservative"
        None (default): the smallest b with ε_eff(b) <= ε (bisection on [Δ_e/ε, 2Δ_e/ε],
        returning the conservative end, so ε_eff(b) = ε to rounding). "paper": the paper's
        b = Δ/ε; "conservative": b = 2Δ/ε; a number: that b. Unless the default is used,
        ``privacy`` reports the TRUE ε_eff(b), not the asked ε, with a note (and a warning if
        it exceeds the asked ε).
    neighbour : "add-remove" or "substitution"
        The relation under which ``sensitivity`` holds (recorded in ``privacy``).
    """

    _pymc_bounding = pm.Truncated

    def __init__(self, epsilon, lower, upper, sensitivity=1.0, scale=None, neighbour="add-remove"):
        self.asked_epsilon = check_epsilon(epsilon)
        lower, upper = check_bounds(lower, upper)
        sensitivity = check_positive("sensitivity", sensitivity)
        if scale is None:
            b = self.optimal_scale(self.asked_epsilon, lower, upper, sensitivity)
        elif isinstance(scale, str):
            rules = {"paper": 1.0, "conservative": 2.0}
            if scale not in rules:
                raise ValueError(
                    f"scale must be None, a number > 0, 'paper' or 'conservative', got {scale!r}"
                )
            b = rules[scale] * sensitivity / self.asked_epsilon
        else:
            b = check_positive("scale", scale)
        self.scale_rule = "optimal" if scale is None else (scale if isinstance(scale, str) else "given")
        super().__init__(lower, upper, b, sensitivity, neighbour)
        self.effective_epsilon = self.epsilon_effective(b, lower, upper, sensitivity)
        if self.scale_rule != "optimal" and self.effective_epsilon > self.asked_epsilon * (1 + 1e-9):
            warnings.warn(
                f"TruncatedLaplace with scale={b:.6g} is only {self.effective_epsilon:.6g}-DP, not the "
                f"asked {self.asked_epsilon:.6g}-DP: the renormalisation leaks (seed 002 §2.5, P2)",
                UserWarning,
                stacklevel=2,
            )

    # --- privacy ---------------------------------------------------------------------------------
    @staticmethod
    def epsilon_effective(scale, lower, upper, sensitivity=1.0) -> float:
        """Exact worst-case privacy loss ε_eff(b) = Δ_e/b + log ΔC(b), Δ_e = min(Δ, D)
        (derivation in the class docstring; seed 002 §2.5 for Δ < D)."""
        b = check_positive("scale", scale)
        lower, upper = check_bounds(lower, upper)
        width = upper - lower
        step = min(check_positive("sensitivity", sensitivity), width)
        two_c_moved = -math.expm1(-step / b) - math.expm1(-(width - step) / b)  # 2 C(l + Δ_e)
        two_c_bound = -math.expm1(-width / b)  # 2 C(l)
        return step / b + math.log(two_c_moved) - math.log(two_c_bound)

    @classmethod
    def optimal_scale(cls, epsilon, lower, upper, sensitivity=1.0) -> float:
        """Smallest b with ε_eff(b) <= ε, by bisection on [Δ_e/ε, 2Δ_e/ε] (ε_eff(Δ_e/ε) >= ε
        >= ε_eff(2Δ_e/ε)) down to adjacent floats; returns the conservative (upper) end."""
        epsilon = check_epsilon(epsilon)
        lower, upper = check_bounds(lower, upper)
        step = min(check_positive("sensitivity", sensitivity), upper - lower)
        lo, hi = step / epsilon, 2 * step / epsilon
        while True:
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:
                return hi
            if cls.epsilon_effective(mid, lower, upper, step) <= epsilon:
                hi = mid
            else:
                lo = mid

    @property
    def privacy(self) -> PrivacyGuarantee:
        if self.scale_rule == "optimal":
            epsilon = self.asked_epsilon
            note = f"scale b = {self.scale:.10g}, the smallest with ε_eff(b) <= ε"
        else:
            epsilon = self.effective_epsilon
            note = (
                f"scale b = {self.scale:.10g} ({self.scale_rule}) asked for epsilon = "
                f"{self.asked_epsilon:.6g}; the true worst-case loss of the renormalised truncation "
                f"is ε_eff = {epsilon:.6g} (seed 002 §2.5)"
            )
        if self.sensitivity >= self.upper - self.lower:
            note += "; sensitivity >= upper - lower, so the worst case is s = lower, s' = upper"
        return PrivacyGuarantee(epsilon, 0.0, self.sensitivity, self.neighbour, note=note)

    def audit(self, n_true: int = 201, n_release: int = 401) -> PrivacyAudit:
        """Worst-case loss by a dense grid of log-ratios over (s, s ± Δ, r) — s on a grid over
        [l - Δ, u + Δ] containing l, u, l + Δ, u - Δ; r on a grid over [l, u] with both ends —
        and by the closed form ε_eff(b); the larger of the two is compared with the claim."""
        lo, hi, step = self.lower, self.upper, self.sensitivity
        s = np.union1d(np.linspace(lo - step, hi + step, n_true), [lo, hi, lo + step, hi - step])
        pairs = [(a, a + sign * step) for a in s for sign in (-1.0, 1.0)]
        grid = max_privacy_loss(self.log_likelihood, pairs, np.linspace(lo, hi, n_release))
        closed = self.effective_epsilon
        return PrivacyAudit(
            claimed_epsilon=self.privacy.epsilon,
            claimed_delta=0.0,
            measured_epsilon=max(grid, closed),
            measured_delta=0.0,
            method=f"closed form ε_eff(b) = {closed:.12g}; grid over {len(pairs)} neighbour pairs "
            f"x {n_release} releases: {grid:.12g}",
        )

    # --- likelihood --------------------------------------------------------------------------------
    def log_normaliser(self, true_values) -> np.ndarray:
        """log C(x) = log(F(u; x, b) - F(l; x, b)), stable for every real x:
        log C(x) = log((m_l + m_r)/2) - dist(x, [l, u])/b."""
        x = as_real_array("true_values", true_values)
        x_c, alpha, gamma = self._reduced(x)
        return np.log(0.5 * _two_c(alpha, gamma)) - np.abs(x - x_c) / self.scale

    def log_likelihood(self, release, true_values) -> np.ndarray:
        """log f_T(r | x) = -log b - |r - x_c|/b - log(m_l + m_r) on [l, u]; a release outside
        [l, u] is an error (it cannot be data)."""
        release, x = self._log_likelihood_inputs(release, true_values)
        x_c, alpha, gamma = self._reduced(x)
        logf = -math.log(self.scale) - np.abs(release - x_c) / self.scale - np.log(_two_c(alpha, gamma))
        return logf

    def _log_likelihood_limit(self, release, direction):
        return self.log_likelihood(release, np.where(direction < 0, self.lower, self.upper))

    # --- release -------------------------------------------------------------------------------------
    def _quantile(self, q, x):
        x_c, alpha, gamma = self._reduced(x)
        m_l, m_r = -np.expm1(-alpha), -np.expm1(-gamma)
        return _bounded_laplace_quantile(q, x_c, self.scale, m_l, m_r, self.lower, self.upper)

    # --- utility -------------------------------------------------------------------------------------
    def _moments(self, alpha, gamma, x):
        """Seed 002 §3.3 (stable incomplete-gamma forms), at x_c:
        E[r - x_c] = b [P(2,γ) - P(2,α)] / [P(1,α) + P(1,γ)],
        E[(r - x_c)^2] = 2b^2 [P(3,α) + P(3,γ)] / [P(1,α) + P(1,γ)]."""
        norm = gammainc(1, alpha) + gammainc(1, gamma)
        # P(2,γ) - P(2,α) = Q(2,α) - Q(2,γ): subtract the smaller pair (Q when both P near 1)
        far = np.minimum(alpha, gamma) > 1.0
        diff = np.where(
            far, gammaincc(2, alpha) - gammaincc(2, gamma), gammainc(2, gamma) - gammainc(2, alpha)
        )
        m1 = self.scale * diff / norm
        m2 = 2 * self.scale**2 * (gammainc(3, alpha) + gammainc(3, gamma)) / norm
        return m1, m2


class BITLaplace(_BoundedLaplace):
    """Boundary-inflated truncated (clamped) Laplace mechanism (seed 002 Eq (5), §2.4(b)):
    r = clamp(x + Laplace(0, b), l, u) with b = Δ/ε — ε-DP, clamping being post-processing
    (seed 002 §2.5 item 1). ``upper=None`` clamps on one side only: r = max(l, x + noise), as
    common DP libraries do for counts.

    The release law has atoms at the bounds; its density is taken w.r.t. Lebesgue measure on
    (l, u) plus unit point masses at l and u (seed 002 §2.4(b); so log-likelihoods of
    boundary releases are log probabilities and are not comparable with a truncated model's,
    pitfall P13)::

        log p(r | x) = log F(l; x, b)                 r == l
                     = -log(2b) - |r - x|/b           l < r < u
                     = log(1 - F(u; x, b))            r == u
                     = -inf                           otherwise

    valid for every real x (log CDFs in stable form, pitfall P9). Atoms are detected by exact
    equality with the bounds (pitfall P5: do not round releases).
    """

    _pymc_bounding = pm.Censored

    def __init__(self, epsilon, lower, upper=None, sensitivity=1.0, neighbour="add-remove"):
        self._epsilon = check_epsilon(epsilon)
        if upper is None:
            lower, upper = _check_finite_real("lower", lower), math.inf
        else:
            lower, upper = check_bounds(lower, upper)
        sensitivity = check_positive("sensitivity", sensitivity)
        super().__init__(lower, upper, sensitivity / self._epsilon, sensitivity, neighbour)

    @property
    def privacy(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(self._epsilon, 0.0, self.sensitivity, self.neighbour,
                                note=f"Laplace scale b = {self.scale:.10g}, clamped (post-processing)")

    def audit(self, n_true: int = 201, n_release: int = 401) -> PrivacyAudit:
        """Largest log-ratio over neighbours (s, s ± Δ), s on a grid over [l - 2Δ, u + 2Δ]
        (one-sided: up to l + 10 b) and releases on a grid over [l, u] that includes the atoms."""
        lo, step = self.lower, self.sensitivity
        hi = self.upper if math.isfinite(self.upper) else lo + 10 * self.scale
        s = np.linspace(lo - 2 * step, hi + 2 * step, n_true)
        pairs = [(a, a + sign * step) for a in s for sign in (-1.0, 1.0)]
        grid = max_privacy_loss(self.log_likelihood, pairs, np.linspace(lo, hi, n_release))
        method = f"grid over {len(pairs)} neighbour pairs x {n_release} releases incl. atoms"
        return PrivacyAudit(self._epsilon, 0.0, grid, 0.0, method=method)

    def log_likelihood(self, release, true_values) -> np.ndarray:
        release, x = self._log_likelihood_inputs(release, true_values)
        b = self.scale
        interior = -math.log(2 * b) - np.abs(release - x) / b
        at_upper = np.where(release == self.upper, _laplace_logcdf((x - self.upper) / b), interior)
        logp = np.where(release == self.lower, _laplace_logcdf((self.lower - x) / b), at_upper)
        return logp

    def _log_likelihood_limit(self, release, direction):
        bound = np.where(direction < 0, self.lower, self.upper)
        return np.where(release == bound, 0.0, -np.inf)

    def _quantile(self, q, x):
        return _bounded_laplace_quantile(q, x, self.scale, 1.0, 1.0, self.lower, self.upper)

    def _moments(self, alpha, gamma, x):
        """About x_c (seed 002 §3.3, extended to x outside [l, u]):
        E[r - x_c] = (b/2)(e^{-α'} - e^{-γ'}) with α' = |x - l|/b, γ' = |u - x|/b;
        E[(r - x_c)^2] = b^2 [P(2,α) + P(2,γ)] for x in [l, u] (= the note's
        b^2 [P(3,α) + P(3,γ)] + a^2 e^{-α}/2 + c^2 e^{-γ}/2), and, for x at distance d below l
        (mirror above u), E[(r - l)^2] = int_0^D 2t P(r - l > t) dt
        = int_0^D t e^{-(d + t)/b} dt = b^2 e^{-d/b} P(2, D/b)."""
        b = self.scale
        a_out = np.abs(x - self.lower) / b
        g_out = np.abs(self.upper - x) / b
        m1 = 0.5 * b * (np.exp(-a_out) - np.exp(-g_out))
        outside = np.abs(x - np.clip(x, self.lower, self.upper)) / b
        m2 = np.where(
            outside > 0,
            b**2 * np.exp(-outside) * gammainc(2, (self.upper - self.lower) / b),
            b**2 * (gammainc(2, alpha) + gammainc(2, gamma)),
        )
        return m1, m2
