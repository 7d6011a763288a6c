"""PyMC distributions used as release likelihoods, written as PyMC's own are: a
``RandomVariable`` for draws plus a ``Discrete`` class with logp, logcdf and logccdf."""

from dpinfer.distributions.discrete_gaussian import (
    DiscreteGaussian,
    discrete_gaussian_log_normaliser,
    discrete_gaussian_variance,
)
from dpinfer.distributions.discrete_laplace import DiscreteLaplace

__all__ = [
    "DiscreteGaussian",
    "DiscreteLaplace",
    "discrete_gaussian_log_normaliser",
    "discrete_gaussian_variance",
]
