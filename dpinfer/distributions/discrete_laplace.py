"""Discrete Laplace (two-sided geometric) distribution, the law of the geometric mechanism's
release given the true count (Ghosh, Roughgarden & Sundararajan 2009; Canonne, Kamath &
Steinke 2020, Def. 28)."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pymc.distributions.dist_math import check_parameters
from pymc.distributions.distribution import Discrete
from pymc.distributions.shape_utils import rv_size_is_none
from pytensor.tensor.random.op import RandomVariable

from dpinfer.distributions._params import as_float64, as_integer_location, symmetric_log_tails

__all__ = ["DiscreteLaplace"]


class DiscreteLaplaceRV(RandomVariable):
    name = "discrete_laplace"
    signature = "(),()->()"
    dtype = "int64"
    _print_name = ("DiscreteLaplace", "\\operatorname{DiscreteLaplace}")

    @classmethod
    def rng_fn(cls, rng, mu, b, size):
        """mu + G1 - G2 with G1, G2 iid Geometric(p = 1 - exp(-1/b)) on {1, 2, ...}: the
        difference has pmf proportional to exp(-|k|/b). Floating-point numpy draws, for
        predictive simulation; curators release with
        :mod:`dpinfer.mechanisms.exact_sampling` instead."""
        mu, b = np.asarray(mu), np.asarray(b, dtype=np.float64)
        if size is None:
            size = np.broadcast_shapes(mu.shape, b.shape)
        p = -np.expm1(-1.0 / b)
        return (mu + rng.geometric(p, size=size) - rng.geometric(p, size=size)).astype(np.int64)


discrete_laplace = DiscreteLaplaceRV()


class DiscreteLaplace(Discrete):
    R"""Discrete Laplace (two-sided geometric) distribution on the integers.

    The pmf of this distribution is

    .. math::

        f(k \mid \mu, b) = \frac{1 - a}{1 + a}\, a^{|k - \mu|}, \qquad a = e^{-1/b},

    and for :math:`j = \lfloor x - \mu \rfloor`

    .. math::

        P(Y \le x) = \begin{cases} a^{-j}/(1 + a) & j < 0 \\ 1 - a^{j+1}/(1 + a) & j \ge 0
        \end{cases}, \qquad
        P(Y > x) = \begin{cases} 1 - a^{-j}/(1 + a) & j < 0 \\ a^{j+1}/(1 + a) & j \ge 0
        \end{cases}.

    Every branch is computed in log space (``log1mexp``/``log1pexp``), so both tails are exact
    far beyond where scipy's ``dlaplace`` underflows. This is the release law of the geometric
    mechanism with epsilon = sensitivity / b (Ghosh, Roughgarden & Sundararajan 2009).

    ========  ==========================================================
    Support   :math:`k \in \mathbb{Z}`
    Mean      :math:`\mu`
    Variance  :math:`\dfrac{2a}{(1 - a)^2} = \dfrac{1}{2\sinh^2(1/(2b))}`
    ========  ==========================================================

    Parameters
    ----------
    mu : tensor_like of int
        Location (an integer: a true count, possibly a latent ``pm.Poisson``).
    b : tensor_like of float
        Scale (b > 0); cast to float64.
    """

    rv_op = discrete_laplace

    @classmethod
    def dist(cls, mu, b, *args, **kwargs):
        return super().dist([as_integer_location("mu", mu), as_float64("b", b)], *args, **kwargs)

    def support_point(rv, size, mu, b):
        return mu if rv_size_is_none(size) else pt.full(size, mu)

    def logp(value, mu, b):
        t = 1.0 / b
        res = pt.log1mexp(-t) - pt.log1pexp(-t) - t * pt.abs(value - mu)
        return check_parameters(res, b > 0, msg="b > 0")

    def logcdf(value, mu, b):
        return check_parameters(_log_tails(value, mu, b)[0], b > 0, msg="b > 0")

    def logccdf(value, mu, b):
        return check_parameters(_log_tails(value, mu, b)[1], b > 0, msg="b > 0")


def _log_tails(value, mu, b):
    """P(Y - mu >= m) = a^m / (1 + a) for m >= 1."""
    t = 1.0 / b
    return symmetric_log_tails(value, mu, lambda m: -t * m - pt.log1pexp(-t))
