"""Normal-Laplace distribution, the law of a release S = Y + L of a continuous latent
Y ~ N(mu, sigma^2) through the Laplace mechanism (L ~ Laplace(0, b)); it is the
normal-Laplace law of Reed & Jorgensen (2004, "The double Pareto-lognormal distribution - a
new parametric model for size distributions", Comm. Statist. Theory Methods 33(8)) with
alpha = beta = 1/b. Also exact draws of the latent Y given the release, for the Laplace and
the Gaussian mechanism.

Derivation. Write z = (s - mu)/sigma and r = sigma/b. Splitting the convolution integral
f(s) = int N(y; mu, sigma^2) e^{-|s - y|/b} / (2b) dy at y = s and completing the square,

* on y < s the Laplace factor is e^{(y - s)/b}, and
  N(y; mu, sigma^2) e^{(y - s)/b} = e^{r^2/2 - z r} N(y; mu + sigma^2/b, sigma^2), whose
  integral over y < s is e^{A}, A = r^2/2 - z r + log Phi(z - r);
* on y > s the factor is e^{(s - y)/b}, and
  N(y; mu, sigma^2) e^{(s - y)/b} = e^{r^2/2 + z r} N(y; mu - sigma^2/b, sigma^2), whose
  integral over y > s is e^{B}, B = r^2/2 + z r + log Phi(-z - r).

So f(s) = (e^A + e^B) / (2b), and the posterior of Y given S = s is the mixture, with
weights e^A : e^B, of N(mu + sigma^2/b, sigma^2) truncated to (-inf, s] and
N(mu - sigma^2/b, sigma^2) truncated to [s, inf).

Numerics. A is a function of (z, r) alone, A = T(z, r), and B = T(-z, r). With
w = z - r, for w < 0 the identity log Phi(w) = log(erfcx(-w/sqrt 2)/2) - w^2/2 turns T into
T(z, r) = -z^2/2 + log(erfcx((r - z)/sqrt 2)/2): the large terms r^2/2 - z r and -w^2/2
cancel algebraically instead of in floating point, and erfcx keeps full relative accuracy
for every argument >= 0 (so the lower tail of Phi never underflows). For w >= 0,
T(z, r) = r^2/2 - z r + log1p(-erfc(w/sqrt 2)/2), where erfc is accurate in its upper tail.
Both branches are exact to ~1e-15 relative and compile in PyTensor's C and NUMBA modes (erfcx
is lowered to scipy's ``cython_special.erfcx``). PyMC's ``dist_math.normal_lcdf`` is not
used: it builds sqrt(2.0) from a float32 constant, which costs ~1.7e-8 absolute in log Phi
(and ~z^2 times that in its upper tail). Gradients come from PyTensor's erfcx derivative,
erfcx'(u) = 2u erfcx(u) - 2/sqrt(pi), which cancels for large u and so loses about u^2 eps
relative accuracy (~1e-12 at u = 50, u = (r -+ z)/sqrt 2): harmless for HMC.
"""

from __future__ import annotations

import math

import numpy as np
import pytensor.tensor as pt
from pymc.distributions.dist_math import check_parameters
from pymc.distributions.distribution import Continuous
from pymc.distributions.shape_utils import rv_size_is_none
from pytensor.tensor.random.op import RandomVariable

from dpinfer._validation import as_real_array, check_rng
from dpinfer.distributions._params import as_float64

__all__ = [
    "NormalLaplace",
    "draw_normal_given_gaussian_release",
    "draw_normal_given_laplace_release",
    "normal_laplace_logpdf",
]

_INV_SQRT2 = 1.0 / math.sqrt(2.0)  # not exact in float32, so PyTensor keeps it float64


# --- the two log terms A = T(z, r), B = T(-z, r) -------------------------------------------
def _log_term_np(z, r):
    """T(z, r) = r^2/2 - z r + log Phi(z - r), in numpy (see the module docstring)."""
    from scipy.special import erfc, erfcx  # scipy.special loads in 0.1-0.2 s: on first use

    w = z - r
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        left = -0.5 * z * z + np.log(0.5 * erfcx(-w * _INV_SQRT2))
        right = r * (0.5 * r - z) + np.log1p(-0.5 * erfc(w * _INV_SQRT2))
    return np.where(w < 0, left, right)


def _log_term_pt(z, r):
    """Symbolic twin of :func:`_log_term_np`. Each branch gets a placeholder argument where it
    is not selected (w = -1 and w = 0), so neither overflows and gradients stay finite."""
    w = z - r
    neg = pt.lt(w, 0.0)
    w_left = pt.switch(neg, w, -1.0)
    w_right = pt.switch(neg, 0.0, w)
    left = -0.5 * pt.sqr(z) + pt.log(0.5 * pt.erfcx(-w_left * _INV_SQRT2))
    right = r * (0.5 * r - z) + pt.log1p(-0.5 * pt.erfc(w_right * _INV_SQRT2))
    return pt.switch(neg, left, right)


# --- argument checks for the numpy functions -----------------------------------------------
def _positive(name: str, value) -> np.ndarray:
    arr = as_real_array(name, value)
    if np.any(arr <= 0):
        bad = arr[arr <= 0].ravel()[:3]
        raise ValueError(f"{name} must be > 0; found {bad.tolist()}")
    return arr


def _law_args(s, mu, sigma, scale, scale_name):
    s = as_real_array("s", s)
    mu = as_real_array("mu", mu)
    sigma = _positive("sigma", sigma)
    scale = _positive(scale_name, scale)
    try:
        shape = np.broadcast_shapes(s.shape, mu.shape, sigma.shape, scale.shape)
    except ValueError:
        raise ValueError(
            f"s, mu, sigma and {scale_name} must broadcast together; got shapes "
            f"{s.shape}, {mu.shape}, {sigma.shape} and {scale.shape}"
        ) from None
    return s, mu, sigma, scale, shape


def _log_terms(s, mu, sigma, b):
    z = (s - mu) / sigma
    r = sigma / b
    return _log_term_np(z, r), _log_term_np(-z, r)


# --- the law -------------------------------------------------------------------------------
def normal_laplace_logpdf(s, mu, sigma, b):
    r"""log density of S = Y + L, Y ~ N(mu, sigma^2), L ~ Laplace(0, b) (broadcasting).

    log f(s) = logaddexp(A, B) - log(2b) with A, B as in :class:`NormalLaplace`, computed
    in log space so both tails are accurate (module docstring). Returns a float for scalar
    inputs. Raises ``ValueError`` unless s and mu are finite and sigma, b finite and > 0.
    """
    s, mu, sigma, b, _ = _law_args(s, mu, sigma, b, "b")
    log_a, log_b = _log_terms(s, mu, sigma, b)
    out = np.logaddexp(log_a, log_b) - np.log(2.0 * b)
    return float(out) if out.ndim == 0 else out


class NormalLaplaceRV(RandomVariable):
    name = "normal_laplace"
    signature = "(),(),()->()"
    dtype = "float64"
    _print_name = ("NormalLaplace", "\\operatorname{NormalLaplace}")

    @classmethod
    def rng_fn(cls, rng, mu, sigma, b, size):
        """A normal draw plus an independent Laplace draw."""
        mu, sigma, b = (np.asarray(x, dtype=np.float64) for x in (mu, sigma, b))
        if size is None:
            size = np.broadcast_shapes(mu.shape, sigma.shape, b.shape)
        return rng.normal(mu, sigma, size=size) + rng.laplace(0.0, b, size=size)


normal_laplace = NormalLaplaceRV()


class NormalLaplace(Continuous):
    R"""Normal-Laplace distribution: the law of S = Y + L with Y ~ N(mu, sigma^2) and
    independent L ~ Laplace(0, b), i.e. a normal latent released by the Laplace mechanism
    with the latent summed out (Reed & Jorgensen 2004, the normal-Laplace law with
    alpha = beta = 1/b).

    The pdf of this distribution is, with :math:`z = (s - \mu)/\sigma` and
    :math:`r = \sigma / b`,

    .. math::

        f(s \mid \mu, \sigma, b) = \frac{1}{2b}\Big[
            e^{r^2/2 - z r}\, \Phi(z - r) + e^{r^2/2 + z r}\, \Phi(-z - r) \Big]
        = \frac{e^{A} + e^{B}}{2b},

    obtained by splitting the convolution integral at y = s (module docstring). The log
    density is ``logaddexp(A, B) - log(2b)``; for :math:`z - r < 0`,
    :math:`A = -z^2/2 + \log(\operatorname{erfcx}((r - z)/\sqrt2)/2)` (and B likewise with
    z -> -z), so both tails are accurate to ~1e-15 relative far beyond where Phi underflows.
    The graph uses ``erfc``, ``erfcx``, ``log`` and ``log1p`` only and compiles in PyTensor's
    C and NUMBA modes (so nutpie can sample models that observe it).

    ========  ==========================================================
    Support   :math:`s \in \mathbb{R}`
    Mean      :math:`\mu`
    Variance  :math:`\sigma^2 + 2 b^2`
    ========  ==========================================================

    Parameters
    ----------
    mu : tensor_like of float
        Mean of the normal latent (possibly itself a latent variable).
    sigma : tensor_like of float
        Standard deviation of the normal latent (sigma > 0).
    b : tensor_like of float
        Scale of the Laplace noise (b > 0); b = sensitivity / epsilon for the Laplace
        mechanism.
    """

    rv_op = normal_laplace

    @classmethod
    def dist(cls, mu, sigma, b, *args, **kwargs):
        return super().dist(
            [as_float64("mu", mu), as_float64("sigma", sigma), as_float64("b", b)], *args, **kwargs
        )

    def support_point(rv, size, mu, sigma, b):
        mu = pt.broadcast_arrays(mu, sigma, b)[0]
        return mu if rv_size_is_none(size) else pt.full(size, mu)

    def logp(value, mu, sigma, b):
        z = (value - mu) / sigma
        r = sigma / b
        res = pt.logaddexp(_log_term_pt(z, r), _log_term_pt(-z, r)) - pt.log(2.0 * b)
        return check_parameters(res, sigma > 0, b > 0, msg="sigma > 0, b > 0")


# --- exact draws of the latent given the release --------------------------------------------
def _upper_truncated_normal(mean, sd, upper, rng):
    """Draws of N(mean, sd^2) truncated to (-inf, upper], by inversion in log space:
    Y = mean + sd * Phi^{-1}(U Phi(c)), c = (upper - mean)/sd, U ~ U(0, 1], with
    log(U Phi(c)) = log U + log_ndtr(c) and Phi^{-1}(e^x) = ``ndtri_exp(x)``, both accurate
    for arguments deep in the lower tail; the result is clipped to upper against rounding."""
    from scipy.special import log_ndtr, ndtri_exp  # on first use, as in _log_term_np

    c = (upper - mean) / sd
    log_u = np.log1p(-rng.random(np.shape(c)))  # log of U = 1 - V, V ~ U[0, 1), so U > 0
    return np.minimum(mean + sd * ndtri_exp(log_u + log_ndtr(c)), upper)


def draw_normal_given_laplace_release(s, mu, sigma, b, rng: np.random.Generator) -> np.ndarray:
    r"""Exact draws of the latent Y ~ N(mu, sigma^2) given the Laplace-mechanism release
    S = Y + L = s, L ~ Laplace(0, b); one draw per element of the broadcast shape of
    (s, mu, sigma, b).

    The posterior is the mixture with weights proportional to e^A and e^B (the two terms of
    :class:`NormalLaplace`'s density) of N(mu + sigma^2/b, sigma^2) truncated to (-inf, s]
    and N(mu - sigma^2/b, sigma^2) truncated to [s, inf) (module docstring). The component is
    chosen by comparing log V, V ~ U(0, 1), with A - logaddexp(A, B), and each truncated
    normal is drawn by inversion in log space (``log_ndtr`` / ``ndtri_exp``), accurate when
    s lies far in either tail. Vectorised; returns a float64 array.
    """
    rng = check_rng(rng)
    s, mu, sigma, b, shape = _law_args(s, mu, sigma, b, "b")
    s, mu, sigma, b = (np.broadcast_to(x, shape) for x in (s, mu, sigma, b))
    log_a, log_b = _log_terms(s, mu, sigma, b)
    log_w_left = log_a - np.logaddexp(log_a, log_b)
    left = np.log(rng.random(shape)) < log_w_left
    shift = sigma * sigma / b
    # Right component by reflection: Y >= s with Y ~ N(mu - shift, sigma^2) is
    # -Y' with Y' ~ N(shift - mu, sigma^2) truncated to (-inf, -s].
    mean = np.where(left, mu + shift, shift - mu)
    upper = np.where(left, s, -s)
    draws = _upper_truncated_normal(mean, sigma, upper, rng)
    return np.asarray(np.where(left, draws, -draws), dtype=np.float64)


def draw_normal_given_gaussian_release(s, mu, sigma, tau, rng: np.random.Generator) -> np.ndarray:
    r"""Exact draws of the latent Y ~ N(mu, sigma^2) given the Gaussian-mechanism release
    S = Y + E = s, E ~ N(0, tau^2); one draw per element of the broadcast shape.

    Conjugate update: Y | s ~ N(mu + k (s - mu), sigma tau / sqrt(sigma^2 + tau^2)) with
    k = sigma^2 / (sigma^2 + tau^2), i.e. mean (mu tau^2 + s sigma^2) / (sigma^2 + tau^2).
    (The release's marginal law is ``pm.Normal(mu, sqrt(sigma^2 + tau^2))``.)
    """
    rng = check_rng(rng)
    s, mu, sigma, tau, shape = _law_args(s, mu, sigma, tau, "tau")
    k = 1.0 / (1.0 + (tau / sigma) ** 2)
    mean = mu + k * (s - mu)
    sd = sigma * tau / np.hypot(sigma, tau)
    return np.asarray(mean + sd * rng.standard_normal(shape), dtype=np.float64)
