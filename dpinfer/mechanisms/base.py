"""The mechanism object: one class per privacy mechanism, the single source of truth.

A mechanism knows its privacy guarantee (and can audit it exactly), produces releases, gives
the likelihood p(release | true values) in numpy and as a PyMC distribution, and reports its
utility. The curator releases with the same object the analyst conditions on.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import pymc as pm
from pymc.distributions.shape_utils import convert_dims

from dpinfer import privacy
from dpinfer._graphs import observed_integers, shape_of
from dpinfer._validation import (
    as_integer_array,
    as_real_array,
    check_positive,
    check_rng,
    check_same_shape,
)
from dpinfer.mechanisms.guard import install as install_guard
from dpinfer.mechanisms.records import check_latent_type, latent_candidates, record_release

NEIGHBOUR_RELATIONS = ("add-remove", "substitution")


def check_neighbour(value) -> str:
    if not isinstance(value, str) or value not in NEIGHBOUR_RELATIONS:
        raise ValueError(f"neighbour must be one of {NEIGHBOUR_RELATIONS}, got {value!r}")
    return value


@dataclass(frozen=True)
class PrivacyGuarantee:
    """What a mechanism promises: (epsilon, delta)-DP for a query whose values change by at
    most ``sensitivity`` (in the mechanism's norm) between neighbouring data sets."""

    epsilon: float
    delta: float
    sensitivity: float
    neighbour: str
    norm: str = "l1"
    note: str = ""

    def __str__(self) -> str:
        d = "0" if self.delta == 0 else f"{self.delta:.3g}"
        text = (
            f"({self.epsilon:.6g}, {d})-DP under {self.neighbour} neighbours "
            f"for a query of {self.norm} sensitivity {self.sensitivity:g}"
        )
        return text + (f"; {self.note}" if self.note else "")


@dataclass(frozen=True)
class PrivacyAudit:
    """Result of an exact privacy check on a small domain.

    ``measured_epsilon`` is the largest privacy loss found (pure DP: max log-ratio over
    neighbouring inputs and all outputs); ``measured_delta`` the exact hockey-stick divergence
    at the claimed epsilon (0 for pure-DP mechanisms whose loss never exceeds epsilon).
    """

    claimed_epsilon: float
    claimed_delta: float
    measured_epsilon: float
    measured_delta: float
    method: str

    @property
    def holds(self) -> bool:
        """True when the measured privacy is no worse than the claim (relative slack 1e-9)."""
        if self.claimed_delta == 0:
            return self.measured_epsilon <= self.claimed_epsilon * (1 + 1e-9) + 1e-12
        return self.measured_delta <= self.claimed_delta * (1 + 1e-9) + 1e-15


class Mechanism(abc.ABC):
    """Base class. Subclasses set ``discrete`` (integer releases), ``exact_sampler``
    (curator-grade: the sampler draws exactly from the stated law, in integer arithmetic where
    the noise is discrete; otherwise simulation-grade) and implement the abstract facets.
    ``keeps_invariants``: a release keeps invariants exactly, A s = A x (``dpinfer.sample``
    plans its latent counts on the fibre of the invariants)."""

    discrete: bool = True
    exact_sampler: bool = True
    keeps_invariants: bool = False

    # --- privacy ---------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def privacy(self) -> PrivacyGuarantee:
        """The guarantee this mechanism claims."""

    @property
    def epsilon(self) -> float:
        return self.privacy.epsilon

    @property
    def delta(self) -> float:
        return self.privacy.delta

    @abc.abstractmethod
    def audit(self) -> PrivacyAudit:
        """Exact check of the claimed guarantee on a small domain (enumeration or closed form)."""

    # --- release -----------------------------------------------------------------------
    @abc.abstractmethod
    def release(self, true_values, rng: np.random.Generator) -> np.ndarray:
        """Draw a privatised release of ``true_values``."""

    # --- likelihood ----------------------------------------------------------------------
    @abc.abstractmethod
    def log_likelihood(self, release, true_values) -> np.ndarray:
        """Elementwise log p(release | true values) (log pmf, or log density for continuous
        releases, with point masses as log probabilities)."""

    @abc.abstractmethod
    def dist(self, true_values):
        """PyMC distribution (unregistered, ``.dist`` form) of the release given symbolic
        true values."""

    @abc.abstractmethod
    def log_likelihood_bound_outside(
        self, release, k: int, *, support=(-np.inf, np.inf)
    ) -> np.ndarray:
        """Elementwise log of an upper bound on
        sup { p(release | x) : integer x in [support[0], support[1]], |x - release| > k }.

        This is what makes exact marginalisation over a finite window of true counts provably
        accurate (inference notes §1): the mass neglected outside the window is at most this
        bound times the prior mass outside it, which is at most 1.
        """

    def observe(self, name: str, true_values, observed, *, dims=None, model=None):
        """Register the release ``observed`` of ``true_values`` as an observed variable of the
        current PyMC model, and record it so that :func:`dpinfer.sample` can marginalise or
        Gibbs-sample the latent true values exactly. ``true_values`` is latent counts x or a
        linear query of them (``Q @ x``, margins, totals), or, for a continuous mechanism, a
        real-valued latent statistic (then an ordinary observed variable for NUTS); a discrete
        mechanism on a continuous latent is refused. ``dims``: as PyMC's (a name, or a tuple
        of names, one per axis of the release)."""
        model = pm.modelcontext(model)
        dims = _as_dims(dims)
        check_latent_type(model, true_values, self, name)
        if hasattr(observed, "get_value"):  # pm.Data: validate its value, keep it symbolic
            value = self.check_release(observed.get_value())
        else:
            observed = value = self.check_release(observed)
        rv = self.dist(true_values)
        true_shape = shape_of(rv)
        if value.shape != true_shape:
            raise ValueError(
                f"observed has shape {value.shape} but true_values has shape {true_shape}; "
                "each true value needs exactly one released value"
            )
        rv = model.register_rv(rv, name, observed=observed_integers(observed), dims=dims)
        if hasattr(true_values, "owner"):  # tag the latent counts (also behind a query Q @ x)
            latents = latent_candidates(model, true_values)
            if len(latents) == 1:  # otherwise not latent counts: dpinfer.sample reports it
                latents[0].tag.dpinfer_release = name
                install_guard()  # plain pm.sample on these counts warns
        record_release(model, name=name, release_rv=rv, latent=true_values, mechanism=self)
        return rv

    def check_release(self, release) -> np.ndarray:
        """Validated release values: whole numbers for discrete mechanisms, finite reals
        otherwise; bounded mechanisms add a range check."""
        if self.discrete:
            return as_integer_array("release", release)
        return as_real_array("release", release)

    def _check_pair(self, release, true_values) -> tuple[np.ndarray, np.ndarray]:
        release = self.check_release(release)
        true_values = as_real_array("true_values", true_values)
        check_same_shape("release", release, "true_values", true_values)
        return release, true_values

    # --- utility ---------------------------------------------------------------------------
    @abc.abstractmethod
    def bias(self, true_values) -> np.ndarray:
        """E[release] - true value."""

    @abc.abstractmethod
    def variance(self, true_values) -> np.ndarray:
        """Var[release] given the true value."""

    def mse(self, true_values) -> np.ndarray:
        """E[(release - true value)^2] = variance + bias^2."""
        return self.variance(true_values) + self.bias(true_values) ** 2

    @abc.abstractmethod
    def release_interval(self, true_values, prob: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper): an interval holding the release with probability >= ``prob`` given
        the true values (central for continuous laws; for discrete laws the narrowest interval
        symmetric about the truth, clipped to the release's support)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.privacy})"


class AdditiveMechanism(Mechanism):
    """release = true value + noise, the noise independent of the data and identically
    distributed per cell, with a law symmetric about 0. Subclasses give the noise law."""

    @abc.abstractmethod
    def noise_logpdf(self, noise: np.ndarray) -> np.ndarray:
        """log f(e): log pmf (discrete noise) or log density (continuous noise)."""

    @property
    @abc.abstractmethod
    def noise_shape(self) -> tuple[float, float, int] | None:
        """(c0, c1, p) with log f(e) = c0 - c1 |e|^p on the noise's support (the integers for
        discrete noise): p = 1 for Laplace and double geometric noise, p = 2 for Gaussian and
        discrete Gaussian noise. Every such law is log-concave, which gives the geometric
        envelopes of the exact count draws (:mod:`dpinfer.inference.engines.compiled.exact_counts`). None for
        laws without that form (Logistic, Subbotin r not in {1, 2}): count draws then use
        windows bounded by ``log_likelihood_bound_outside``."""

    @abc.abstractmethod
    def sample_noise(self, shape: tuple, rng: np.random.Generator) -> np.ndarray:
        """Noise draws of the given shape."""

    @property
    @abc.abstractmethod
    def noise_variance(self) -> float:
        """Var(e)."""

    @abc.abstractmethod
    def noise_log_sup_beyond(self, k) -> np.ndarray:
        """log max_{|e| > k} f(e) (the noise law is symmetric and unimodal at 0)."""

    @abc.abstractmethod
    def noise_interval(self, prob: float = 0.9) -> tuple[float, float]:
        """(-q, q) with P(|e| <= q) >= prob: the smallest such q for discrete noise, the exact
        central quantile for continuous noise."""

    # --- privacy profile: what equal-privacy comparisons calibrate (dpinfer.utility) --------
    @abc.abstractmethod
    def delta_for_epsilon(self, epsilon) -> float:
        """The tight delta at ``epsilon``: the hockey-stick divergence
        sum_y max(0, p(y | x) - e^epsilon p(y | x')) (an integral for continuous noise) at the
        worst neighbouring pair, |x - x'| = sensitivity for these symmetric log-concave laws
        (seed 004 Lemma 18(a)); 0 where the privacy loss never exceeds epsilon."""

    def renyi_divergence(self, alpha) -> float:
        r"""Rényi divergence of order alpha > 1 between the releases at neighbouring true values,
        D_alpha = 1/(alpha - 1) log sum_e f(e)^alpha f(e - d)^(1 - alpha) (an integral for
        continuous noise), at the largest shift d = sensitivity (for integer noise the largest
        over d = 1..sensitivity). Summed over the integers or integrated by adaptive quadrature
        (:func:`dpinfer.privacy.sum_over_integers`, :func:`~dpinfer.privacy.integral_over_reals`),
        to float precision; subclasses with a closed form override it. inf where the integral
        diverges (noise whose privacy loss grows faster than linearly at large alpha)."""
        alpha = check_positive("alpha", alpha)
        if alpha <= 1.0:
            raise ValueError(f"alpha must be > 1, got {alpha}")

        def log_term(e, d):
            with np.errstate(invalid="ignore"):
                value = alpha * self.noise_logpdf(e) + (1.0 - alpha) * self.noise_logpdf(e - d)
            return np.where(np.isnan(value), -np.inf, value)

        if self.discrete:
            shifts = range(1, int(self.sensitivity) + 1)
            log_sums = [privacy.sum_over_integers(lambda e, d=d: log_term(e, d)) for d in shifts]
            return max(log_sums) / (alpha - 1.0)
        d = float(self.sensitivity)
        log_integral = privacy.integral_over_reals(lambda x: float(log_term(x, d)), (0.0, d))
        return log_integral / (alpha - 1.0)

    @property
    def zcdp_rho(self) -> float:
        """The smallest rho for which the mechanism is rho-zCDP, sup_alpha D_alpha / alpha
        (Bun & Steinke 2016, Definition 1.1; :func:`dpinfer.privacy.zcdp_rho`); inf where no
        rho holds."""
        return privacy.zcdp_rho(self.renyi_divergence)

    def release(self, true_values, rng: np.random.Generator) -> np.ndarray:
        true_values = (as_integer_array if self.discrete else as_real_array)("true_values", true_values)
        return true_values + self.sample_noise(true_values.shape, check_rng(rng))

    def log_likelihood(self, release, true_values) -> np.ndarray:
        release, true_values = self._check_pair(release, true_values)
        return self.noise_logpdf(release - true_values)

    def log_likelihood_bound_outside(self, release, k, *, support=(-np.inf, np.inf)) -> np.ndarray:
        # {x integer : |x - s| > k} gives |e| > k for every noise value e = s - x, whatever
        # the support of x.
        release = self.check_release(release)
        return np.broadcast_to(self.noise_log_sup_beyond(k), np.shape(release)).astype(float)

    def bias(self, true_values) -> np.ndarray:
        return np.zeros(np.shape(as_real_array("true_values", true_values)))

    def variance(self, true_values) -> np.ndarray:
        return np.full(np.shape(as_real_array("true_values", true_values)), self.noise_variance)

    def release_interval(self, true_values, prob: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        true_values = as_real_array("true_values", true_values)
        lo, hi = self.noise_interval(prob)
        return true_values + lo, true_values + hi


def _as_dims(dims):
    """``dims`` in PyMC's meaning (:func:`pymc.distributions.shape_utils.convert_dims`: one name
    is a one-axis tuple), refusing what PyMC would misread (a non-string name)."""
    if dims is None or isinstance(dims, str):
        return convert_dims(dims)
    if isinstance(dims, (tuple, list)) and all(isinstance(d, str) or d is None for d in dims):
        return convert_dims(tuple(dims))
    raise TypeError(f"dims must be a dimension name or a tuple of names (one per axis of the release), "
                    f"got {dims!r}")
