r"""The discrete Gaussian mechanism (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian
for Differential Privacy", arXiv:2004.00010).

release = x + Y, Y ~ N_Z(0, sigma^2) with pmf p(y) = exp(-y^2 / (2 sigma^2)) / Z(sigma) on the
integers; log Z from :func:`dpinfer.distributions.discrete_gaussian_log_normaliser` (direct
series for sigma < 1, Poisson summation for sigma >= 1; reference notes §3.4).

Privacy, for an integer query with |x - x'| <= Delta (Delta a whole number):

* rho-zCDP with rho = Delta^2 / (2 sigma^2) (CKS Theorem 4);
* (epsilon, delta)-DP exactly for (CKS Theorem 7)

      delta(epsilon) = P[Y > epsilon sigma^2/Delta - Delta/2] - e^epsilon P[Y > epsilon sigma^2/Delta + Delta/2],

  the hockey-stick divergence between x + Y and x + Delta + Y (the privacy loss at output y is
  L(y) = (Delta^2 - 2 y Delta)/(2 sigma^2) for the pair (0, Delta), which exceeds epsilon
  exactly for y < Delta/2 - epsilon sigma^2/Delta; by symmetry of Y the formula above follows).
  delta(epsilon) is decreasing in epsilon, and the guarantee for |x - x'| < Delta is no worse.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer import privacy
from dpinfer._validation import (
    check_delta,
    check_epsilon,
    check_integer_sensitivity,
    check_positive,
    check_probability,
)
from dpinfer.distributions.discrete_gaussian import DiscreteGaussian as DiscreteGaussianDistribution
from dpinfer.distributions.discrete_gaussian import (
    discrete_gaussian_log_normaliser,
    discrete_gaussian_variance,
)
from dpinfer.mechanisms.base import AdditiveMechanism, PrivacyAudit, PrivacyGuarantee, check_neighbour
from dpinfer.privacy import smallest_private_epsilon, smallest_private_scale
from dpinfer.mechanisms.exact_sampling import sample_discrete_gaussian
from dpinfer.mechanisms.laplace import check_noise_distance

__all__ = ["DiscreteGaussian"]

# Sums over the pmf run this many sigmas (+ _TAIL_EXTRA terms) past their first term: the
# omitted remainder is below exp(-40^2/2) = e^-800 of the largest included term.
_TAIL_SIGMAS = 40.0
_TAIL_EXTRA = 10
# Searches aim at delta * (1 - 1e-10): the termwise delta sum is accurate to ~1e-14 relative
# (tested against mpmath), so the returned epsilon / sigma stay private in exact arithmetic.
_ROUNDING_MARGIN = 1e-10


MAX_SIGMA = 1e6  # the exact privacy profile (_delta_for_epsilon) sums ~40 sigma pmf terms
MIN_SIGMA = 1e-100  # ... each divided by sigma^2 (which must not underflow to 0)


def _tail_length(sigma: float) -> int:
    return math.ceil(_TAIL_SIGMAS * sigma) + _TAIL_EXTRA


def _delta_for_epsilon(epsilon: float, sigma: float, sensitivity: int, log_norm: float) -> float:
    r"""CKS Theorem 7 written termwise: with c = epsilon sigma^2/Delta - Delta/2 and the shift
    y -> y + Delta in the second tail,

        delta = sum_{y > c} p(y) (1 - exp(epsilon - (2 y Delta + Delta^2)/(2 sigma^2))),

    every term in [0, p(y)] (for y > c the loss of y + Delta vs y exceeds epsilon), so the sum
    has no cancellation. Terms from y = max(floor(c) + 1, -(40 sigma + 10)) up to max(that, 0) +
    40 sigma + 10 (beyond 40 sigma + 10 from 0, p(y) < e^-800 is 0 in float64)."""
    first = math.floor(epsilon * sigma**2 / sensitivity - 0.5 * sensitivity) + 1
    first = max(first, -_tail_length(sigma))  # p(y) underflows to 0 below -40 sigma - 10
    y = np.arange(first, max(first, 0) + _tail_length(sigma), dtype=np.float64)
    log_p = -(y**2) / (2.0 * sigma**2) - log_norm
    excess = epsilon - (2.0 * y * sensitivity + sensitivity**2) / (2.0 * sigma**2)
    return float(np.sum(np.exp(log_p) * -np.expm1(np.minimum(excess, 0.0))))


class DiscreteGaussian(AdditiveMechanism):
    r"""Discrete Gaussian mechanism: release = x + Y, Y ~ N_Z(0, sigma^2) (CKS 2020).

    Claims (epsilon, delta)-DP at the given ``delta`` with epsilon the smallest value allowed
    by the exact profile of CKS Theorem 7 (:meth:`epsilon_for_delta`), for an integer query
    whose value changes by at most ``sensitivity`` between neighbours; it is also rho-zCDP
    with rho = sensitivity^2/(2 sigma^2) (:attr:`rho`). Var(Y) is the exact sum
    sum_y y^2 p(y), slightly below sigma^2. Releases are exact (CKS Algorithm 3 in integer
    arithmetic, sigma taken at its exact binary value).

    Parameters
    ----------
    sigma : float
        Noise scale, MIN_SIGMA (10^-100) <= sigma <= MAX_SIGMA (10^6).
    sensitivity : int
        Whole number >= 1.
    delta : float
        The delta in (0, 1) at which the guarantee is stated.
    neighbour : {"add-remove", "substitution"}
    """

    discrete = True
    exact_sampler = True

    def __init__(self, sigma, sensitivity=1, delta=1e-6, neighbour: str = "add-remove"):
        self.sigma = check_positive("sigma", sigma)
        if not MIN_SIGMA <= self.sigma <= MAX_SIGMA:
            raise ValueError(f"sigma must lie in [{MIN_SIGMA:g}, {MAX_SIGMA:g}]: the exact privacy profile sums "
                             f"~40 sigma terms of the pmf, each divided by sigma^2; got {sigma!r}")
        self.sensitivity = check_integer_sensitivity(sensitivity)
        self._delta = check_delta(delta)
        self.neighbour = check_neighbour(neighbour)
        self._log_norm = discrete_gaussian_log_normaliser(self.sigma)
        self._epsilon = self.epsilon_for_delta(self._delta)

    @classmethod
    def from_privacy(cls, epsilon, delta, sensitivity=1, neighbour: str = "add-remove") -> DiscreteGaussian:
        """The smallest sigma with delta_sigma(epsilon) <= delta (exact profile, CKS Thm 7),
        found by bisection on log sigma to adjacent floats and rounded to the private end.
        The resulting mechanism's epsilon (at this delta) is <= ``epsilon``."""
        epsilon, delta = check_epsilon(epsilon), check_delta(delta)
        sensitivity = check_integer_sensitivity(sensitivity)
        target = delta * (1.0 - _ROUNDING_MARGIN)

        def too_loose(sigma: float) -> bool:
            if sigma > MAX_SIGMA:
                raise ValueError(f"epsilon={epsilon!r} at delta={delta!r} and sensitivity {sensitivity} needs "
                                 f"sigma > {MAX_SIGMA:g}, beyond what DiscreteGaussian computes exactly "
                                 "(MAX_SIGMA); give a larger epsilon or delta")
            log_norm = discrete_gaussian_log_normaliser(sigma)
            return _delta_for_epsilon(epsilon, sigma, sensitivity, log_norm) > target

        sigma = smallest_private_scale(too_loose, start=min(sensitivity / epsilon, MAX_SIGMA))
        return cls(sigma, sensitivity, delta, neighbour)

    # --- privacy -------------------------------------------------------------------------------
    @property
    def zcdp_rho(self) -> float:
        """rho = sensitivity^2 / (2 sigma^2) (CKS Theorem 4), and no smaller rho holds: with
        p(z) proportional to exp(-z^2 / (2 sigma^2)) and shift d,
        sum_z p(z)^alpha p(z - d)^(1 - alpha) = e^{alpha (alpha - 1) d^2 / (2 sigma^2)}
        theta((alpha - 1) d) / theta(0), theta(t) = sum_z e^{-(z + t)^2 / (2 sigma^2)} being
        largest at whole t, so D_alpha / alpha <= d^2 / (2 sigma^2) with equality at alpha = 2
        (derived; the numerical supremum of the summed divergences agrees in the tests)."""
        return self.sensitivity**2 / (2.0 * self.sigma**2)

    @property
    def privacy(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            self._epsilon, self._delta, self.sensitivity, self.neighbour, "l1",
            note=(
                f"discrete Gaussian, sigma = {self.sigma:.10g}; epsilon is the exact value at this "
                f"delta (CKS Thm 7, for a one-cell integer query); also rho-zCDP with "
                f"rho = {self.zcdp_rho:.6g} (CKS Thm 4)"
            ),
        )

    def delta_for_epsilon(self, epsilon) -> float:
        """The exact delta(epsilon) of CKS Theorem 7 (module docstring), for epsilon > 0."""
        return _delta_for_epsilon(check_epsilon(epsilon), self.sigma, self.sensitivity, self._log_norm)

    def epsilon_for_delta(self, delta) -> float:
        """Smallest epsilon >= 0 with delta(epsilon) <= delta: 0 if already
        delta(0) = P(-Delta/2 < Y <= Delta/2) <= delta, else a doubling bracket and bisection to
        adjacent floats, returning the conservative (larger) end."""
        target = check_delta(delta) * (1.0 - _ROUNDING_MARGIN)

        def too_loose(eps: float) -> bool:
            return _delta_for_epsilon(eps, self.sigma, self.sensitivity, self._log_norm) > target

        return smallest_private_epsilon(too_loose)

    def audit(self) -> PrivacyAudit:
        """Exact hockey-stick divergence by enumeration: the pmfs of the releases for true
        values 0 and d (d = 1..sensitivity; translation invariance covers every pair) over the
        outputs -K..sensitivity + K, K = 40 sigma + 10 (omitted mass < e^-800), both
        directions, through :func:`dpinfer.privacy.hockey_stick`. It equals
        ``delta_for_epsilon(epsilon)`` and is <= delta. ``measured_epsilon`` is the claimed
        epsilon at which the divergence is taken."""
        k = _tail_length(self.sigma)
        outputs = np.arange(-k, self.sensitivity + k + 1)
        log_p0 = self.log_likelihood(outputs, np.zeros(outputs.shape))
        measured = 0.0
        for d in range(1, self.sensitivity + 1):
            log_pd = self.log_likelihood(outputs, np.full(outputs.shape, d))
            measured = max(
                measured,
                privacy.hockey_stick(log_p0, log_pd, self._epsilon),
                privacy.hockey_stick(log_pd, log_p0, self._epsilon),
            )
        closed = self.delta_for_epsilon(self._epsilon)
        return PrivacyAudit(
            self._epsilon, self._delta, self._epsilon, measured,
            f"enumerated hockey-stick over outputs {-k}..{self.sensitivity + k} = {measured:.12g}; "
            f"CKS Thm 7 closed form = {closed:.12g}",
        )

    # --- noise law -------------------------------------------------------------------------------
    def noise_logpdf(self, noise) -> np.ndarray:
        """log p(e) = -e^2/(2 sigma^2) - log Z(sigma) on the integers, -inf elsewhere."""
        e = np.asarray(noise, dtype=float)
        return np.where(e == np.round(e), -(e**2) / (2.0 * self.sigma**2) - self._log_norm, -np.inf)

    @property
    def noise_shape(self) -> tuple[float, float, int]:
        """log p(e) = -log Z(sigma) - e^2/(2 sigma^2)."""
        return -self._log_norm, 1.0 / (2.0 * self.sigma**2), 2

    def sample_noise(self, shape: tuple, rng: np.random.Generator) -> np.ndarray:
        return sample_discrete_gaussian(self.sigma, shape, rng)

    @property
    def noise_variance(self) -> float:
        """sum_y y^2 p(y) (exact series, :func:`discrete_gaussian_variance`), < sigma^2."""
        return discrete_gaussian_variance(self.sigma)

    def noise_log_sup_beyond(self, k) -> np.ndarray:
        """log p(floor(k) + 1) = log max_{|e| > k} p(e) (p is symmetric, unimodal at 0)."""
        return self.noise_logpdf(np.floor(check_noise_distance(k)) + 1.0)

    def noise_interval(self, prob: float = 0.9) -> tuple[float, float]:
        """(-q, q) for the smallest whole q with P(|e| > q) = 2 sum_{y > q} p(y) <= 1 - prob
        (tail sums accumulated from the far end, K = 40 sigma + 10 terms)."""
        prob = check_probability(prob)
        y = np.arange(0, _tail_length(self.sigma) + 1, dtype=np.float64)
        pmf = np.exp(self.noise_logpdf(y))
        at_least = np.cumsum(pmf[::-1])[::-1]  # P(e >= q) for q = 0..K
        beyond = 2.0 * np.append(at_least[1:], 0.0)  # P(|e| > q) = 2 P(e >= q + 1)
        q = int(np.argmax(beyond <= 1.0 - prob))
        return float(-q), float(q)

    # --- likelihood ------------------------------------------------------------------------------
    def dist(self, true_values):
        """``dpinfer.distributions.DiscreteGaussian.dist(mu=true_values, sigma=sigma)``."""
        return DiscreteGaussianDistribution.dist(mu=true_values, sigma=np.float64(self.sigma))
