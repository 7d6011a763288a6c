r"""The Gaussian mechanism with the analytic calibration of Balle & Wang (2018, "Improving the
Gaussian mechanism for differential privacy", Thm 8; seed 004 note §3.4 Theorem 5, eq. (3)).

release = x + N(0, σ²) is (ε, δ)-DP for a query of l2 sensitivity Δ **iff**

.. math::

    δ(ε; σ) = Φ\left(\frac{Δ}{2σ} - \frac{εσ}{Δ}\right)
              - e^ε Φ\left(-\frac{Δ}{2σ} - \frac{εσ}{Δ}\right) \le δ,

the hockey-stick divergence between N(0, σ²) and N(Δ, σ²) (the privacy profile). It is
decreasing in σ and in ε, so the smallest σ for a target (ε, δ) and the smallest ε for a given
(σ, δ) are found by bisection (seed 004 §4 algorithms B and C), keeping the end of the final
bracket on the private side. The classical σ = Δ sqrt(2 log(1.25/δ)) / ε is proven only for
ε < 1 and is not private at large ε (seed 004 §3.4); it is not used.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm

from dpinfer._math import log1mexp
from dpinfer._validation import check_delta, check_epsilon, check_positive, check_probability
from dpinfer.distributions._params import as_float64
from dpinfer.mechanisms.base import AdditiveMechanism, PrivacyAudit, PrivacyGuarantee, check_neighbour
from dpinfer.privacy import smallest_private_epsilon, smallest_private_scale
from dpinfer.mechanisms.laplace import check_noise_distance

__all__ = ["Gaussian"]

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
# Searches aim at δ (1 - 1e-10), not δ: eq. (3) evaluated in float64 is off by up to ~1e-13
# relative (cancellation in 1 - e^{ε + log Φ(a - u) - log Φ(a)}; checked against mpmath), so
# the margin keeps the returned σ or ε private in exact arithmetic, at a cost of ~1e-11 in σ.
_LOG_ROUNDING_MARGIN = math.log1p(-1e-10)


def _log_delta(epsilon: float, sigma: float, sensitivity: float) -> float:
    """log δ(ε; σ) of eq. (3): with a = u/2 - ε/u, u = Δ/σ, δ = Φ(a) (1 - e^{ε + log Φ(a - u) - log Φ(a)}),
    every factor in log space (scipy's ``log_ndtr``), so deep tails do not underflow."""
    u = sensitivity / sigma
    a = 0.5 * u - epsilon / u
    from scipy.special import log_ndtr  # scipy.special loads in 0.1-0.2 s: on first use

    log_phi_a = float(log_ndtr(a))
    return log_phi_a + log1mexp(epsilon + float(log_ndtr(a - u)) - log_phi_a)


def calibrate_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ with δ(ε; σ) <= δ (Balle & Wang 2018, Thm 8 / Alg. 1 done by bisection on
    log σ): a doubling bracket from the Laplace scale Δ/ε, then bisection to adjacent floats,
    returning the conservative end, so δ(ε; σ) <= δ holds at the returned σ (with the
    rounding margin ``_LOG_ROUNDING_MARGIN``)."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    log_target = math.log(delta) + _LOG_ROUNDING_MARGIN

    def too_loose(sigma: float) -> bool:
        return _log_delta(epsilon, sigma, sensitivity) > log_target

    return smallest_private_scale(too_loose, start=sensitivity / epsilon)


class Gaussian(AdditiveMechanism):
    r"""Gaussian mechanism, analytically calibrated: release = x + N(0, σ²), σ the smallest
    scale with δ(ε; σ) <= δ (module docstring; Balle & Wang 2018, Thm 8).

    The guarantee holds for the l2 sensitivity Δ (isotropic noise on a vector query, by
    rotation invariance; Balle & Wang 2018). Var(e) = σ², P(|e| <= q) = 2Φ(q/σ) - 1.

    **SIMULATION-GRADE sampler.** Releases use ``numpy``'s floating-point normal sampler, which
    like floating-point Laplace sampling can leak through low-order bits (Mironov 2012); this
    is for simulation studies (``exact_sampler = False``). For publishing integer counts use
    the discrete Gaussian mechanism, which samples exactly in integer arithmetic.

    Parameters
    ----------
    epsilon : float
        Privacy parameter, finite and > 0.
    delta : float
        Privacy parameter in (0, 1).
    sensitivity : float
        l2 sensitivity Δ > 0.
    neighbour : {"add-remove", "substitution"}
        Neighbour relation under which ``sensitivity`` holds.
    """

    discrete = False
    exact_sampler = False

    def __init__(self, epsilon, delta, sensitivity=1.0, neighbour="add-remove"):
        epsilon, delta = check_epsilon(epsilon), check_delta(delta)
        sensitivity = check_positive("sensitivity", sensitivity)
        self._set(epsilon, delta, sensitivity, check_neighbour(neighbour),
                  sigma=calibrate_sigma(epsilon, delta, sensitivity))

    def _set(self, epsilon: float, delta: float, sensitivity: float, neighbour: str, sigma: float):
        self._epsilon, self._delta = epsilon, delta
        self.sensitivity, self.neighbour, self.sigma = sensitivity, neighbour, sigma

    @classmethod
    def from_sigma(cls, sigma, sensitivity=1.0, delta=1e-6, neighbour="add-remove") -> Gaussian:
        """The mechanism with noise scale ``sigma`` exactly, claiming (ε, δ)-DP with ε the
        smallest value that holds at this δ (:meth:`epsilon_for_delta`)."""
        mech = cls.__new__(cls)
        mech._set(
            0.0,
            check_delta(delta),
            check_positive("sensitivity", sensitivity),
            check_neighbour(neighbour),
            sigma=check_positive("sigma", sigma),
        )
        mech._epsilon = mech.epsilon_for_delta(delta)
        return mech

    # --- privacy ----------------------------------------------------------------------------
    @property
    def privacy(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            self._epsilon,
            self._delta,
            self.sensitivity,
            self.neighbour,
            norm="l2",
            note=f"analytic Gaussian, sigma = {self.sigma:.10g}; simulation-grade sampler",
        )

    def delta_for_epsilon(self, epsilon) -> float:
        """The exact privacy profile δ(ε; σ) of eq. (3) (the tight δ at this ε)."""
        return math.exp(_log_delta(check_epsilon(epsilon), self.sigma, self.sensitivity))

    def renyi_divergence(self, alpha) -> float:
        """D_alpha(N(0, σ²) || N(Δ, σ²)) = alpha Δ² / (2σ²) (Mironov 2017, Table II); so the
        mechanism is rho-zCDP with rho = Δ² / (2σ²) exactly (Bun & Steinke 2016, Prop. 1.6)."""
        alpha = check_positive("alpha", alpha)
        if alpha <= 1.0:
            raise ValueError(f"alpha must be > 1, got {alpha}")
        return alpha * self.sensitivity**2 / (2.0 * self.sigma**2)

    def epsilon_for_delta(self, delta) -> float:
        """Smallest ε >= 0 with δ(ε; σ) <= δ (seed 004 §4 algorithm C): 0 if already
        δ(0; σ) = 2Φ(Δ/(2σ)) - 1 <= δ, else a doubling bracket and bisection to adjacent
        floats, returning the conservative (larger) end."""
        log_target = math.log(check_delta(delta)) + _LOG_ROUNDING_MARGIN

        def too_loose(eps: float) -> bool:
            return _log_delta(eps, self.sigma, self.sensitivity) > log_target

        return smallest_private_epsilon(too_loose)

    def audit(self) -> PrivacyAudit:
        r"""Hockey-stick divergence H_ε(N(0, σ²) || N(Δ, σ²)) = ∫ (p - e^ε q)_+ by quadrature.

        The integrand is positive exactly for y < y* = Δ/2 - εσ²/Δ (where log p - log q > ε),
        so the integral runs over (-inf, y*], written as p(y) (1 - e^{ε + log q - log p}) to
        keep tiny values accurate. By symmetry H_ε(Q || P) is the same. ``measured_delta`` is the
        quadrature; the closed form δ(ε; σ) is printed next to it, and ``measured_epsilon`` is
        the exact ε at the claimed δ from the profile.
        """
        from scipy import integrate

        sigma, d, eps = self.sigma, self.sensitivity, self._epsilon
        y_star = 0.5 * d - eps * sigma**2 / d

        def integrand(y: float) -> float:
            log_p = -0.5 * (y / sigma) ** 2 - _HALF_LOG_TWO_PI - math.log(sigma)
            log_q = -0.5 * ((y - d) / sigma) ** 2 - _HALF_LOG_TWO_PI - math.log(sigma)
            return math.exp(log_p) * -math.expm1(min(eps + log_q - log_p, 0.0))

        # The integrand is negligible (< e^-1250 of its peak) below y* - 50σ.
        lower = min(y_star, 0.0) - 50.0 * sigma
        measured, _ = integrate.quad(integrand, lower, y_star, points=[y_star - sigma],
                                     epsabs=0.0, epsrel=1e-12, limit=500)
        closed = math.exp(_log_delta(eps, sigma, d))
        return PrivacyAudit(
            eps,
            self._delta,
            self.epsilon_for_delta(self._delta),
            measured,
            f"hockey-stick quadrature = {measured:.12g}; closed form (Balle-Wang eq. 3) = {closed:.12g}",
        )

    # --- noise law ---------------------------------------------------------------------------
    def noise_logpdf(self, noise) -> np.ndarray:
        return -0.5 * (np.asarray(noise) / self.sigma) ** 2 - _HALF_LOG_TWO_PI - math.log(self.sigma)

    @property
    def noise_shape(self) -> tuple[float, float, int]:
        """log f(e) = -log(sigma sqrt(2 pi)) - e^2/(2 sigma^2)."""
        return -_HALF_LOG_TWO_PI - math.log(self.sigma), 0.5 / self.sigma**2, 2

    def sample_noise(self, shape: tuple, rng: np.random.Generator) -> np.ndarray:
        return rng.normal(0.0, self.sigma, size=shape)

    @property
    def noise_variance(self) -> float:
        return self.sigma**2

    def noise_log_sup_beyond(self, k) -> np.ndarray:
        """log f(k): the density is decreasing in |e|, so sup_{|e| > k} f(e) = f(k) (not attained)."""
        return self.noise_logpdf(check_noise_distance(k))

    def noise_interval(self, prob: float = 0.9) -> tuple[float, float]:
        """(-q, q) with q = σ Φ^{-1}((1 + prob)/2), the exact central quantile."""
        from scipy.special import ndtri  # on first use (see _log_delta_term)
        q = self.sigma * float(ndtri(0.5 + 0.5 * check_probability(prob)))
        return -q, q

    def dist(self, true_values):
        """``pm.Normal.dist(mu=true_values, sigma=σ)`` with float64 parameters."""
        return pm.Normal.dist(mu=as_float64("true_values", true_values), sigma=np.float64(self.sigma))
