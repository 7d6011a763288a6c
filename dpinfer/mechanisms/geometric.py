r"""The geometric mechanism (double geometric / discrete Laplace noise) and its clamped,
range-restricted form.

DoubleGeometric (Ghosh, Roughgarden & Sundararajan 2009; seed 003 Definition 1):
release = x + e with

    f(e) = (1 - a)/(1 + a) a^|e|,   a = exp(-epsilon / sensitivity),   e in Z,

which is (epsilon, 0)-DP for an integer query of l1 sensitivity ``sensitivity``: neighbouring
true values differ by at most Delta, and f(e)/f(e') <= a^{-|e - e'|} <= e^epsilon.

ClampedGeometric (seed 003 §3.11, the range-restricted geometric mechanism G_{n,alpha}):
release = clamp(x + e, lower, upper). The bounds absorb the tails (they are NOT renormalised,
seed 003 pitfall P1), e.g. P(release = lower | x) = P(e <= lower - x) = a^(x - lower)/(1 + a)
for x >= lower. With upper=None it is OpenDP's one-sided clamp of counts, max(lower, x + e).
Clamping is post-processing, so the privacy is that of the double geometric.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pymc as pm

from dpinfer import privacy
from dpinfer._math import log1mexp
from dpinfer._validation import (
    as_integer_array,
    check_bounds,
    check_epsilon,
    check_integer_sensitivity,
    check_probability,
    check_within,
)
from dpinfer.distributions import DiscreteLaplace
from dpinfer.mechanisms.base import (
    AdditiveMechanism,
    Mechanism,
    PrivacyAudit,
    PrivacyGuarantee,
    check_neighbour,
)
from dpinfer.mechanisms.exact_sampling import sample_discrete_laplace
from dpinfer.mechanisms.laplace import check_noise_distance

__all__ = ["DoubleGeometric", "ClampedGeometric"]

# Audit enumeration: outputs reach this many sensitivities beyond the true-value domain.
_AUDIT_MARGIN = 50
# Audit enumeration: true values span this many integers beyond a lower bound.
_AUDIT_SPAN = 20


def _audit_pure(mechanism: Mechanism, x_lo: int, x_hi: int, outputs: np.ndarray, note: str) -> PrivacyAudit:
    """Pure-DP audit by enumeration: the largest |log p(y|x) - log p(y|x')| over all neighbour
    pairs of true values in [x_lo, x_hi] (|x - x'| <= sensitivity) and the given outputs, and
    the largest hockey-stick divergence at the claimed epsilon over the same pairs."""
    sens = mechanism.privacy.sensitivity
    pairs = privacy.integer_neighbour_pairs(x_lo, x_hi, int(sens))
    eps = mechanism.epsilon
    loss = privacy.max_privacy_loss(mechanism.log_likelihood, pairs, outputs)
    delta = max(
        privacy.hockey_stick(
            mechanism.log_likelihood(outputs, np.full(outputs.shape, x)),
            mechanism.log_likelihood(outputs, np.full(outputs.shape, x_prime)),
            eps,
        )
        for x, x_prime in pairs
    )
    method = (
        f"enumeration: true values {x_lo}..{x_hi}, neighbours |x - x'| <= {int(sens)}, "
        f"outputs {int(outputs[0])}..{int(outputs[-1])}; {note}"
    )
    return PrivacyAudit(eps, 0.0, loss, delta, method)


class DoubleGeometric(AdditiveMechanism):
    r"""Geometric mechanism: release = x + e, e double geometric (discrete Laplace).

    f(e) = (1 - a)/(1 + a) a^|e| with a = exp(-epsilon / sensitivity) (Ghosh, Roughgarden &
    Sundararajan 2009; seed 003 Definition 1). (epsilon, 0)-DP under ``neighbour`` for an integer
    query of l1 sensitivity ``sensitivity``. Var(e) = 2a/(1 - a)^2 (seed 003 §3.2).
    Releases are drawn exactly in integer arithmetic (Canonne, Kamath & Steinke 2020, Alg. 2)
    with scale Fraction(sensitivity)/Fraction(epsilon), the exact value of the float epsilon.
    """

    discrete = True
    exact_sampler = True

    def __init__(self, epsilon, sensitivity=1, neighbour: str = "add-remove"):
        self._epsilon = check_epsilon(epsilon)
        self.sensitivity = check_integer_sensitivity(sensitivity)
        self.neighbour = check_neighbour(neighbour)
        self._rate = self._epsilon / self.sensitivity  # -log a
        self._log1p_a = math.log1p(math.exp(-self._rate))
        self._log_norm = float(log1mexp(-self._rate)) - self._log1p_a  # log((1 - a)/(1 + a))

    @property
    def alpha(self) -> float:
        """a = exp(-epsilon / sensitivity) (seed 003's alpha)."""
        return math.exp(-self._rate)

    @property
    def scale(self) -> float:
        """b = sensitivity / epsilon: f(e) is proportional to exp(-|e| / b)."""
        return self.sensitivity / self._epsilon

    @property
    def privacy(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            self._epsilon, 0.0, self.sensitivity, self.neighbour, "l1",
            note=f"double geometric noise, a = exp(-epsilon/sensitivity) = {self.alpha:.6g}",
        )

    def audit(self) -> PrivacyAudit:
        """Max log-ratio over true values 0..4*sensitivity and outputs reaching 50
        sensitivities beyond them; it equals epsilon (attained outside [x, x'])."""
        hi = 4 * self.sensitivity
        margin = _AUDIT_MARGIN * self.sensitivity
        outputs = np.arange(-margin, hi + margin + 1)
        return _audit_pure(self, 0, hi, outputs, "pmf (1-a)/(1+a) a^|e|")

    def delta_for_epsilon(self, epsilon) -> float:
        """Tight delta(epsilon) at the shift d = sensitivity (the largest, and the worst: every
        term below grows with d). With c = epsilon_0 / sensitivity the privacy loss of output
        x + z is L(z) = c(|z - d| - |z|): c d for z <= 0, c (d - 2z) for 0 < z < d, negative
        beyond, so (derived; checked against enumeration in the tests)

            delta = (1 - e^{epsilon - c d})_+ / (1 + a)
                    + sum_{0 < z < d, c (d - 2z) > epsilon} f(z) (1 - e^{epsilon - c (d - 2z)}),

        P(z <= 0) = 1 / (1 + a) being the geometric tail sum (seed 003 §3.11). 0 for
        epsilon >= epsilon_0."""
        epsilon = check_epsilon(epsilon)
        c, d = self._rate, self.sensitivity
        if epsilon >= c * d:
            return 0.0
        delta = -math.expm1(epsilon - c * d) * math.exp(-self._log1p_a)
        for z in range(1, d):
            loss = c * (d - 2 * z)
            if loss > epsilon:
                delta += math.exp(self._log_norm - c * z) * -math.expm1(epsilon - loss)
        return float(delta)

    # --- noise law -------------------------------------------------------------------------
    def noise_logpdf(self, noise) -> np.ndarray:
        """log f(e) = log((1 - a)/(1 + a)) - |e| epsilon/sensitivity; -inf off the integers."""
        e = np.asarray(noise, dtype=float)
        return np.where(e == np.round(e), self._log_norm - self._rate * np.abs(e), -np.inf)

    @property
    def noise_shape(self) -> tuple[float, float, int]:
        """log f(e) = log((1 - a)/(1 + a)) - (epsilon/sensitivity) |e|."""
        return self._log_norm, self._rate, 1

    def noise_logcdf(self, k) -> np.ndarray:
        """log P(e <= k) for real k, j = floor(k): a^{-j}/(1 + a) for j < 0 and
        1 - a^{j+1}/(1 + a) for j >= 0 (seed 003 §3.11: the tail sums to a^m/(1 + a))."""
        j = np.floor(np.asarray(k, dtype=float))
        with np.errstate(over="ignore", invalid="ignore"):
            left = self._rate * j - self._log1p_a
            right = log1mexp(-self._rate * (j + 1.0) - self._log1p_a)
        return np.where(j < 0, left, right)

    def noise_logsf(self, k) -> np.ndarray:
        """log P(e >= k) = log P(e <= -k) (symmetry)."""
        return self.noise_logcdf(-np.asarray(k, dtype=float))

    def sample_noise(self, shape: tuple, rng: np.random.Generator) -> np.ndarray:
        return sample_discrete_laplace(Fraction(self.sensitivity) / Fraction(self._epsilon), shape, rng)

    @property
    def noise_variance(self) -> float:
        """2a/(1 - a)^2."""
        return 2.0 * math.exp(-self._rate) / math.expm1(-self._rate) ** 2

    def noise_log_sup_beyond(self, k) -> np.ndarray:
        """log max_{|e| > k} f(e) = log f(floor(k) + 1) for k >= 0 (e is an integer)."""
        return self._log_norm - self._rate * (np.floor(check_noise_distance(k)) + 1.0)

    def noise_interval(self, prob: float = 0.9) -> tuple[float, float]:
        """(-q, q) for the smallest whole q with P(|e| <= q) = 1 - 2 a^{q+1}/(1 + a) >= prob."""
        prob = check_probability(prob)
        log_target = math.log1p(-prob)

        def covers(q):  # log P(|e| > q) <= log(1 - prob)
            return math.log(2.0) - self._rate * (q + 1) - self._log1p_a <= log_target

        q = max(0, math.ceil((math.log(2.0) - self._log1p_a - log_target) / self._rate - 1.0))
        while q > 0 and covers(q - 1):
            q -= 1
        while not covers(q):
            q += 1
        return float(-q), float(q)

    # --- likelihood --------------------------------------------------------------------------
    def dist(self, true_values):
        """``DiscreteLaplace.dist(mu=true_values, b=sensitivity/epsilon)``."""
        return DiscreteLaplace.dist(mu=true_values, b=np.float64(self.scale))


class ClampedGeometric(Mechanism):
    r"""Range-restricted geometric mechanism: release = clamp(x + e, lower, upper).

    e is double geometric with a = exp(-epsilon / sensitivity); the bounds absorb the tails
    (seed 003 §3.11, Definition 4; not renormalised, pitfall P1):

        P(r | x) = f(r - x)                       lower < r < upper,
        P(lower | x) = P(e <= lower - x)          (= a^(x - lower)/(1 + a) for x >= lower),
        P(upper | x) = P(e >= upper - x)          (= a^(upper - x)/(1 + a) for x <= upper).

    ``upper=None`` clamps at ``lower`` only, max(lower, x + e), as OpenDP does for counts
    (reference notes §2.1). (epsilon, 0)-DP: clamping is post-processing of the double
    geometric. Releases are whole numbers in [lower, upper].
    """

    discrete = True
    exact_sampler = True

    def __init__(self, epsilon, lower, upper=None, sensitivity=1, neighbour: str = "add-remove"):
        self.noise = DoubleGeometric(epsilon, sensitivity, neighbour)
        if upper is None:
            lower_arr = as_integer_array("lower", lower)
            if lower_arr.ndim:
                raise TypeError(f"lower must be a single whole number, got shape {lower_arr.shape}")
            self.lower, self.upper = int(lower_arr), None
        else:
            self.lower, self.upper = check_bounds(lower, upper, integer=True)

    def __repr__(self) -> str:
        return (
            f"ClampedGeometric(epsilon={self.epsilon:g}, lower={self.lower}, upper={self.upper}, "
            f"sensitivity={self.sensitivity}, neighbour={self.neighbour!r})"
        )

    @property
    def sensitivity(self) -> int:
        return self.noise.sensitivity

    @property
    def neighbour(self) -> str:
        return self.noise.neighbour

    @property
    def _top(self) -> float:
        return math.inf if self.upper is None else self.upper

    @property
    def privacy(self) -> PrivacyGuarantee:
        base = self.noise.privacy
        return PrivacyGuarantee(
            base.epsilon, 0.0, base.sensitivity, base.neighbour, "l1",
            note=f"{base.note}, clamped to [{self.lower}, {self._top}] (post-processing)",
        )

    def audit(self) -> PrivacyAudit:
        """Max log-ratio by enumeration over true values from lower - 2 sensitivity to
        min(upper, lower + 20) + 2 sensitivity (values outside the bounds included) and every
        possible output up to 50 sensitivities beyond them; it equals epsilon."""
        sens = self.sensitivity
        x_lo = self.lower - 2 * sens
        x_hi = min(self._top, self.lower + _AUDIT_SPAN) + 2 * sens
        y_hi = min(self._top, x_hi + _AUDIT_MARGIN * sens)
        outputs = np.arange(self.lower, int(y_hi) + 1)
        return _audit_pure(self, int(x_lo), int(x_hi), outputs, "clamped pmf with boundary masses")

    # --- release -------------------------------------------------------------------------------
    def release(self, true_values, rng: np.random.Generator) -> np.ndarray:
        return np.clip(self.noise.release(true_values, rng), self.lower, self.upper)

    def check_release(self, release) -> np.ndarray:
        release = super().check_release(release)
        check_within("release", release, self.lower, self._top)
        return release

    # --- likelihood --------------------------------------------------------------------------
    def log_likelihood(self, release, true_values) -> np.ndarray:
        """Elementwise log P(release | x), point masses at the bounds included (see class doc)."""
        release, x = np.broadcast_arrays(*self._check_pair(release, true_values))
        noise = self.noise
        out = noise.noise_logpdf(release - x)
        out = np.where(release == self.lower, noise.noise_logcdf(self.lower - x), out)
        if self.upper is not None:
            out = np.where(release == self.upper, noise.noise_logsf(self.upper - x), out)
        return out

    def transition_matrix(self) -> np.ndarray:
        """The (n+1) x (n+1) matrix G[i, j] = P(release = lower + j | x = lower + i), n = upper
        - lower: seed 003's G_{n,alpha} for lower = 0 (rows true values, columns releases)."""
        if self.upper is None:
            raise ValueError("transition_matrix needs a finite upper bound (upper is None)")
        values = np.arange(self.lower, self.upper + 1)
        return np.exp(self.log_likelihood(values[None, :], values[:, None]))

    def log_likelihood_bound_outside(self, release, k, *, support=(-np.inf, np.inf)) -> np.ndarray:
        """log of an upper bound on sup { P(release | x) : integer x in support, |x - release| > k }.

        Interior releases: f(k + 1) (the noise pmf is unimodal). A release at ``lower``: true
        values above it give P = a^(x - lower)/(1 + a) <= a^(k+1)/(1 + a) for x > lower + k, but
        true values far below it give P -> 1, so the bound is 1 (log 0) unless no supported x
        lies below lower - k (e.g. counts, support starting at 0 = lower). Likewise at upper.
        """
        release = self.check_release(release)
        k = np.floor(check_noise_distance(k))
        noise = self.noise
        interior = noise.noise_log_sup_beyond(k)
        tail = -noise._rate * (k + 1.0) - noise._log1p_a
        support_lower, support_upper = support
        out = np.where(release == self.lower, np.where(support_lower >= release - k, tail, 0.0), interior)
        if self.upper is not None:
            out = np.where(release == self.upper, np.where(support_upper <= release + k, tail, 0.0), out)
        return out.astype(float)

    # --- utility -------------------------------------------------------------------------------
    def _noise_moments(self, true_values) -> tuple[np.ndarray, np.ndarray]:
        r"""(E[W], Var[W]) of W = release - x = clamp(e, c, d), c = lower - x, d = upper - x,
        in closed form. Building block: for m >= 0, E[((e - m)^+)^p] = s_p a^m with
        s_1 = a/(1 - a^2), s_2 = a/(1 - a)^2.

        x in [lower, upper] (c <= 0 <= d), l = -c, u = d: W = e + (c - e)^+ - (e - d)^+ gives
            E[W] = s_1 (a^l - a^u),
            E[W^2] = 2 s_2 - s_2 (a^l + a^u) - 2 s_1 (l a^l + u a^u).
        x < lower (c > 0), n = d - c: W = c + V, V = (e - c)^+ - (e - d)^+,
            E[V] = s_1 (a^c - a^d),  E[V^2] = s_2 (a^c - a^d) - 2 n s_1 a^d.
        x > upper: the mirror image (-W has the law of clamp(e, -d, -c)).
        Each case is written with small, positive terms only, so nothing cancels.
        """
        x = as_integer_array("true_values", true_values).astype(float)
        rate = self.noise._rate
        s1 = math.exp(-rate) / -math.expm1(-2.0 * rate)
        s2 = math.exp(-rate) / math.expm1(-rate) ** 2
        c = self.lower - x
        d = self._top - x

        def a_pow(m):  # a^m, 0 at m = inf
            return np.exp(-rate * m)

        def m_a_pow(m):  # m a^m, 0 at m = inf
            return np.where(np.isfinite(m), m, 0.0) * a_pow(m)

        def beyond_lower(m, n):  # (E[V], Var[V]) for m > 0, n = d - c
            tail = a_pow(m) * -np.expm1(-rate * n)
            ev = s1 * tail
            return ev, s2 * tail - 2.0 * s1 * a_pow(m) * m_a_pow(n) - ev**2

        with np.errstate(over="ignore", invalid="ignore"):
            l, u = -c, d
            mean_in = s1 * (a_pow(l) - a_pow(u))
            var_in = 2.0 * s2 - s2 * (a_pow(l) + a_pow(u)) - 2.0 * s1 * (m_a_pow(l) + m_a_pow(u)) - mean_in**2
            ev_below, var_below = beyond_lower(c, d - c)
            ev_above, var_above = beyond_lower(-d, d - c)
            below, above = c > 0, d < 0
            mean = np.select([below, above], [c + ev_below, d - ev_above], mean_in)
            var = np.select([below, above], [var_below, var_above], var_in)
        return mean, var

    def bias(self, true_values) -> np.ndarray:
        """E[release] - x, closed form (see ``_noise_moments``); true values whole numbers."""
        return self._noise_moments(true_values)[0]

    def variance(self, true_values) -> np.ndarray:
        """Var[release | x], closed form (see ``_noise_moments``)."""
        return self._noise_moments(true_values)[1]

    def _release_cdf(self, r: np.ndarray, x: np.ndarray) -> np.ndarray:
        """P(release <= r | x) for whole r: 0 below lower, 1 from upper on, else P(e <= r - x)."""
        cdf = np.exp(self.noise.noise_logcdf(r - x))
        return np.where(r < self.lower, 0.0, np.where(r >= self._top, 1.0, cdf))

    def release_interval(self, true_values, prob: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """(clip(x - q), clip(x + q)) for the smallest whole q (per value) whose clipped
        interval holds the release with probability >= prob; q never exceeds the double
        geometric's q, because clamping is monotone."""
        prob = check_probability(prob)
        x = as_integer_array("true_values", true_values)
        q_hi = np.full(x.shape, int(self.noise.noise_interval(prob)[1]))
        q_lo = np.full(x.shape, -1)  # invariant: q_lo fails (or is empty), q_hi covers

        def clip(v):
            return np.clip(v, self.lower, self._top)

        while np.any(q_hi - q_lo > 1):
            mid = (q_lo + q_hi) // 2
            lo, hi = clip(x - mid), clip(x + mid)
            good = self._release_cdf(hi, x) - self._release_cdf(lo - 1, x) >= prob
            q_hi, q_lo = np.where(good, mid, q_hi), np.where(good, q_lo, mid)
        return clip(x - q_hi).astype(float), clip(x + q_hi).astype(float)

    def dist(self, true_values):
        """``pm.Censored(DiscreteLaplace.dist(mu=x, b=sensitivity/epsilon), lower, upper)``:
        PyMC's censoring puts P(Y <= lower) at lower and P(Y >= upper) at upper (reference
        notes §3.3), which is exactly the clamped law."""
        base = DiscreteLaplace.dist(mu=true_values, b=np.float64(self.noise.scale))
        upper = None if self.upper is None else np.int64(self.upper)
        return pm.Censored.dist(base, lower=np.int64(self.lower), upper=upper)
