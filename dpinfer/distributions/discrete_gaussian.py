"""Discrete Gaussian distribution N_Z(mu, sigma^2), the law of the discrete Gaussian
mechanism's release given the true count (Canonne, Kamath & Steinke 2020, "The Discrete
Gaussian for Differential Privacy", Def. 1)."""

from __future__ import annotations

import math

import numpy as np
import pytensor.tensor as pt
from pymc.distributions.dist_math import check_parameters
from pymc.distributions.distribution import Discrete
from pymc.distributions.shape_utils import rv_size_is_none
from pytensor.tensor.random.op import RandomVariable

from dpinfer._validation import check_positive
from dpinfer.distributions._params import as_float64, as_integer_location, symmetric_log_tails

__all__ = ["DiscreteGaussian", "discrete_gaussian_log_normaliser", "discrete_gaussian_variance"]

# Terms kept in the normaliser series. Direct branch (sigma < 1): the first omitted term is
# below exp(-13^2 / 2) = 2e-37 relative to the k = 0 term. Poisson-summation branch (sigma >= 1): the
# first omitted term is exp(-2 pi^2 13^2) ~ 1e-1449. Both are far below float64 resolution.
_SERIES_TERMS = 12
_TWO_PI_SQ = 2.0 * math.pi**2
_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
MAX_SIGMA = 1e75  # sigma^4 (the variance's series) stays finite in float64 below ~1e77
# Tail-sum length: ceil(_TAIL_SIGMAS * sigma) + _TAIL_EXTRA pmf terms (see DiscreteGaussian).
_TAIL_SIGMAS = 9.0
_TAIL_EXTRA = 2


def discrete_gaussian_log_normaliser(sigma) -> float:
    r"""log Z(sigma), Z(sigma) = sum_{k in Z} exp(-k^2 / (2 sigma^2)), to ~1e-16 relative accuracy.

    For sigma < 1 the direct series is summed, log Z = log1p(2 sum_{k>=1} e^{-k^2/(2 sigma^2)});
    for sigma >= 1 the Poisson-summation (Jacobi theta) dual is used,
    log Z = log(sqrt(2 pi) sigma) + log1p(2 sum_{j>=1} e^{-2 pi^2 sigma^2 j^2})
    (reference notes §3.4). Each series is a small correction written with ``log1p``, so the
    result keeps full relative precision, and 12 terms exceed float64 resolution (see
    ``_SERIES_TERMS``).
    """
    sigma = _checked_sigma(sigma)
    j = np.arange(1, _SERIES_TERMS + 1, dtype=np.float64)
    if sigma < 1.0:
        return float(np.log1p(2.0 * np.sum(np.exp(-(j**2) / (2.0 * sigma**2)))))
    return float(
        _HALF_LOG_TWO_PI + math.log(sigma) + np.log1p(2.0 * np.sum(np.exp(-_TWO_PI_SQ * sigma**2 * j**2)))
    )


def discrete_gaussian_variance(sigma) -> float:
    r"""Var of N_Z(0, sigma^2) = sum_k k^2 e^{-k^2/(2 sigma^2)} / Z(sigma).

    Direct series for sigma < 1. For sigma >= 1, differentiating the Poisson-summation form of
    log Z in sigma^2 (Var = 2 sigma^4 d log Z / d sigma^2) gives
    Var = sigma^2 - 8 pi^2 sigma^4 sum_{j>=1} j^2 q^{j^2} / (1 + 2 sum_{j>=1} q^{j^2}),
    q = exp(-2 pi^2 sigma^2): slightly below sigma^2, as Canonne, Kamath & Steinke (2020) show.
    """
    sigma = _checked_sigma(sigma)
    j = np.arange(1, _SERIES_TERMS + 1, dtype=np.float64)
    if sigma < 1.0:
        w = np.exp(-(j**2) / (2.0 * sigma**2))
        return float(2.0 * np.sum(j**2 * w) / (1.0 + 2.0 * np.sum(w)))
    w = np.exp(-_TWO_PI_SQ * sigma**2 * j**2)
    return float(sigma**2 - 4.0 * _TWO_PI_SQ * sigma**4 * np.sum(j**2 * w) / (1.0 + 2.0 * np.sum(w)))


def _checked_sigma(sigma) -> float:
    """sigma > 0 and at most MAX_SIGMA (beyond it sigma^4 overflows float64 in the series)."""
    sigma = check_positive("sigma", sigma)
    if sigma > MAX_SIGMA:
        raise ValueError(f"sigma must be at most {MAX_SIGMA:g} (float64 arithmetic of the discrete Gaussian's "
                         f"normaliser and variance overflows beyond), got {sigma!r}")
    return sigma


def _log_normaliser(sigma):
    """Symbolic twin of :func:`discrete_gaussian_log_normaliser` (same two series, same
    switch at sigma = 1). Both branches are finite for every sigma > 0, so gradients stay finite."""
    j = pt.arange(1, _SERIES_TERMS + 1, dtype="float64")
    s = pt.shape_padright(sigma)
    direct = pt.log1p(2.0 * pt.sum(pt.exp(-(j**2) / (2.0 * s**2)), axis=-1))
    dual = _HALF_LOG_TWO_PI + pt.log(sigma) + pt.log1p(2.0 * pt.sum(pt.exp(-_TWO_PI_SQ * s**2 * j**2), axis=-1))
    return pt.switch(pt.lt(sigma, 1.0), direct, dual)


def sample_discrete_gaussian_float(mu, sigma, size, rng: np.random.Generator) -> np.ndarray:
    r"""mu + N_Z(0, sigma^2) draws by the rejection sampler of Canonne, Kamath & Steinke 2020
    (Alg. 3) in floating point: propose Y ~ DiscreteLaplace(t), t = floor(sigma) + 1, accept
    with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)). The accepted law is exactly
    N_Z(0, sigma^2); only the arithmetic is floating point, so this serves predictive
    simulation, while curators release with :mod:`dpinfer.mechanisms.exact_sampling`."""
    mu, sigma = np.asarray(mu), np.asarray(sigma, dtype=np.float64)
    shape = np.broadcast_shapes(mu.shape, sigma.shape) if size is None else tuple(np.atleast_1d(size))
    sigma = np.broadcast_to(sigma, shape).ravel()
    t = np.floor(sigma) + 1.0
    p = -np.expm1(-1.0 / t)
    out = np.empty(sigma.size, dtype=np.int64)
    todo = np.arange(sigma.size)
    while todo.size:
        y = rng.geometric(p[todo]) - rng.geometric(p[todo])
        s, tt = sigma[todo], t[todo]
        accept = rng.random(todo.size) < np.exp(-((np.abs(y) - s**2 / tt) ** 2) / (2.0 * s**2))
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return (mu + out.reshape(shape)).astype(np.int64)


class DiscreteGaussianRV(RandomVariable):
    name = "discrete_gaussian"
    signature = "(),()->()"
    dtype = "int64"
    _print_name = ("DiscreteGaussian", "\\operatorname{DiscreteGaussian}")

    @classmethod
    def rng_fn(cls, rng, mu, sigma, size):
        return sample_discrete_gaussian_float(mu, sigma, size, rng)


discrete_gaussian = DiscreteGaussianRV()


class DiscreteGaussian(Discrete):
    R"""Discrete Gaussian distribution on the integers (Canonne, Kamath & Steinke 2020).

    The pmf of this distribution is

    .. math::

        f(k \mid \mu, \sigma) = \frac{e^{-(k - \mu)^2 / (2\sigma^2)}}{Z(\sigma)}, \qquad
        Z(\sigma) = \sum_{j \in \mathbb{Z}} e^{-j^2 / (2\sigma^2)},

    with :math:`\log Z` from :func:`discrete_gaussian_log_normaliser` (direct series for
    sigma < 1, Poisson summation for sigma >= 1).

    The cdf has no closed form. With :math:`j = \lfloor x - \mu \rfloor` the smaller tail is
    :math:`T(m) = P(Y - \mu \ge m)` with :math:`m = -j` (for j < 0, by symmetry
    :math:`P(Y \le x) = T(-j)`) or :math:`m = j + 1` (for j >= 0, :math:`P(Y > x) = T(j + 1)`),
    so always :math:`m \ge 1`; the other tail is ``log1mexp`` of it, so both tails are accurate.
    :math:`T(m)` is a log-sum-exp of the first :math:`n = \lceil 9\sigma \rceil + 2` pmf terms
    :math:`m, \dots, m + n - 1`. Truncation error: for :math:`m \ge 0` and every :math:`i \ge 0`
    the term ratio is :math:`f(m+i+n)/f(m+i) = e^{-(2(m+i)n + n^2)/(2\sigma^2)} \le
    e^{-n^2/(2\sigma^2)}`, so the omitted remainder is at most :math:`e^{-n^2/(2\sigma^2)}
    \le e^{-40.5} = 2.6 \times 10^{-18}` times the tail itself, below float64 resolution. The
    grid has length :math:`n` for the largest sigma in the batch, so memory is n per value.

    ========  ==========================================================
    Support   :math:`k \in \mathbb{Z}`
    Mean      :math:`\mu`
    Variance  slightly below :math:`\sigma^2`: :func:`discrete_gaussian_variance`
    ========  ==========================================================

    Parameters
    ----------
    mu : tensor_like of int
        Location (an integer: a true count, possibly a latent ``pm.Poisson``).
    sigma : tensor_like of float
        Scale parameter (sigma > 0); cast to float64.
    """

    rv_op = discrete_gaussian

    @classmethod
    def dist(cls, mu, sigma, *args, **kwargs):
        return super().dist([as_integer_location("mu", mu), as_float64("sigma", sigma)], *args, **kwargs)

    def support_point(rv, size, mu, sigma):
        return mu if rv_size_is_none(size) else pt.full(size, mu)

    def logp(value, mu, sigma):
        k = pt.cast(value - mu, "float64")
        res = -(k**2) / (2.0 * sigma**2) - _log_normaliser(sigma)
        return check_parameters(res, sigma > 0, msg="sigma > 0")

    def logcdf(value, mu, sigma):
        return check_parameters(_log_tails(value, mu, sigma)[0], sigma > 0, msg="sigma > 0")

    def logccdf(value, mu, sigma):
        return check_parameters(_log_tails(value, mu, sigma)[1], sigma > 0, msg="sigma > 0")


def _log_tails(value, mu, sigma):
    """P(Y - mu >= m) for m >= 1 as a sum of pmf terms over a grid of m .. m + n - 1 (see the
    DiscreteGaussian docstring for the grid length n)."""

    def log_tail(m):
        n = pt.cast(pt.ceil(_TAIL_SIGMAS * pt.max(sigma)), "int64") + _TAIL_EXTRA
        k = pt.shape_padright(m) + pt.arange(n, dtype="float64")
        s = pt.shape_padright(sigma)
        return pt.logsumexp(-(k**2) / (2.0 * s**2), axis=-1) - _log_normaliser(sigma)

    return symmetric_log_tails(value, mu, log_tail)
