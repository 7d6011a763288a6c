"""PyMC distributions used as release likelihoods, written as PyMC's own are: a
``RandomVariable`` for draws plus a ``Discrete`` (or ``Continuous``) class with its logp; and
the exact conditional draws of a Normal latent given its release."""

from dpinfer.distributions.discrete_gaussian import (
    DiscreteGaussian,
    discrete_gaussian_log_normaliser,
    discrete_gaussian_variance,
)
from dpinfer.distributions.discrete_laplace import DiscreteLaplace
from dpinfer.distributions.normal_laplace import (
    NormalLaplace,
    draw_normal_given_gaussian_release,
    draw_normal_given_laplace_release,
    normal_laplace_logpdf,
)

__all__ = [
    "DiscreteGaussian",
    "DiscreteLaplace",
    "NormalLaplace",
    "discrete_gaussian_log_normaliser",
    "discrete_gaussian_variance",
    "draw_normal_given_gaussian_release",
    "draw_normal_given_laplace_release",
    "normal_laplace_logpdf",
]
