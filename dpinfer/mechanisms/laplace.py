"""The Laplace mechanism (Dwork, McSherry, Nissim & Smith 2006): release = x + Laplace(0, b),
b = sensitivity / epsilon, which is (epsilon, 0)-DP for a query of l1 sensitivity Δ."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm

from dpinfer._validation import as_real_array, check_epsilon, check_positive, check_probability
from dpinfer.distributions._params import as_float64
from dpinfer.mechanisms.base import AdditiveMechanism, PrivacyAudit, PrivacyGuarantee, check_neighbour
from dpinfer.privacy import max_privacy_loss

__all__ = ["Laplace"]


def check_noise_distance(k) -> np.ndarray:
    """Distances k >= 0 from the centre of the noise law, as float64."""
    k = as_real_array("k", k)
    if np.any(k < 0):
        raise ValueError(f"k must be >= 0; found {k[k < 0].ravel()[:3].tolist()}")
    return k


class Laplace(AdditiveMechanism):
    r"""Continuous Laplace mechanism: release = x + e, e ~ Laplace(0, b), b = Δ / ε.

    Noise density :math:`f(e) = e^{-|e|/b} / (2b)`. For neighbours with
    :math:`|x - x'| \le Δ`, :math:`|\log f(y - x) - \log f(y - x')| \le |x - x'|/b \le ε` with
    equality for every y outside (x, x'), so the mechanism is (ε, 0)-DP and no better
    (Dwork et al. 2006, Prop. 1). Var(e) = 2b², P(|e| <= q) = 1 - e^{-q/b}.

    **SIMULATION-GRADE sampler.** Releases are drawn with ``numpy``'s floating-point Laplace
    sampler. Floating-point Laplace samples leak the true value through their low-order bits
    (Mironov 2012, "On significance of the least significant bits for differential privacy"),
    so this sampler is for simulation studies, not for publishing data
    (``exact_sampler = False``). Curators should release integer counts with
    :class:`~dpinfer.mechanisms.geometric.DoubleGeometric` (exact integer sampling).

    Parameters
    ----------
    epsilon : float
        Privacy parameter, finite and > 0.
    sensitivity : float
        l1 sensitivity Δ > 0 of the query under the chosen neighbour relation.
    neighbour : {"add-remove", "substitution"}
        Neighbour relation under which ``sensitivity`` holds.
    """

    discrete = False
    exact_sampler = False

    def __init__(self, epsilon, sensitivity=1.0, neighbour="add-remove"):
        self._epsilon = check_epsilon(epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        self.neighbour = check_neighbour(neighbour)
        self.scale = self.sensitivity / self._epsilon

    @property
    def privacy(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            self._epsilon, 0.0, self.sensitivity, self.neighbour, note="simulation-grade sampler"
        )

    def audit(self, n_outputs: int = 4001) -> PrivacyAudit:
        """Largest log-density ratio between inputs 0 and Δ (both orders) over ``n_outputs``
        release values spanning 20 scales beyond both inputs, next to the closed-form supremum
        Δ/b (attained for every release outside (0, Δ)); the larger one is reported."""
        b, delta_x = self.scale, self.sensitivity
        outputs = np.linspace(-20 * b - delta_x, delta_x + 20 * b + delta_x, n_outputs)
        grid = max_privacy_loss(self.log_likelihood, [(0.0, delta_x), (delta_x, 0.0)], outputs)
        closed_form = delta_x / b
        return PrivacyAudit(
            self._epsilon,
            0.0,
            max(grid, closed_form),
            0.0,
            f"max log-density ratio on {n_outputs} outputs = {grid:.12g}; closed-form sup Δ/b = {closed_form:.12g}",
        )

    def delta_for_epsilon(self, epsilon) -> float:
        """Tight delta(epsilon) = 1 - exp((epsilon - u)/2) for epsilon < u = Δ/b, else 0 (the
        profile behind seed 004 Theorem 3, reference note §3.4: the Neyman-Pearson set is the
        half-line below (u + epsilon)/2 in units of b)."""
        u = self.sensitivity / self.scale
        epsilon = check_epsilon(epsilon)
        return 0.0 if epsilon >= u else float(-math.expm1(0.5 * (epsilon - u)))

    def renyi_divergence(self, alpha) -> float:
        """D_alpha = 1/(alpha - 1) log(alpha/(2 alpha - 1) e^{(alpha - 1) u}
        + (alpha - 1)/(2 alpha - 1) e^{-alpha u}), u = Δ/b, alpha > 1 (Mironov 2017, "Rényi
        differential privacy", Table II), in log space."""
        alpha = check_positive("alpha", alpha)
        if alpha <= 1.0:
            raise ValueError(f"alpha must be > 1, got {alpha}")
        u = self.sensitivity / self.scale
        log_sum = np.logaddexp(math.log(alpha / (2.0 * alpha - 1.0)) + (alpha - 1.0) * u,
                               math.log((alpha - 1.0) / (2.0 * alpha - 1.0)) - alpha * u)
        return float(log_sum) / (alpha - 1.0)

    # --- noise law -------------------------------------------------------------------------
    def noise_logpdf(self, noise) -> np.ndarray:
        return -np.abs(noise) / self.scale - math.log(2.0 * self.scale)

    @property
    def noise_shape(self) -> tuple[float, float, int]:
        """log f(e) = -log(2 b) - |e| / b."""
        return -math.log(2.0 * self.scale), 1.0 / self.scale, 1

    def sample_noise(self, shape: tuple, rng: np.random.Generator) -> np.ndarray:
        return rng.laplace(0.0, self.scale, size=shape)

    @property
    def noise_variance(self) -> float:
        return 2.0 * self.scale**2

    def noise_log_sup_beyond(self, k) -> np.ndarray:
        """log f(k): the density is decreasing in |e|, so sup_{|e| > k} f(e) = f(k) (not attained)."""
        return self.noise_logpdf(check_noise_distance(k))

    def noise_interval(self, prob: float = 0.9) -> tuple[float, float]:
        """(-q, q) with q = -b log(1 - prob), the exact central quantile."""
        q = -self.scale * math.log1p(-check_probability(prob))
        return -q, q

    def dist(self, true_values):
        """``pm.Laplace.dist(mu=true_values, b=b)`` with float64 parameters."""
        return pm.Laplace.dist(mu=as_float64("true_values", true_values), b=np.float64(self.scale))
