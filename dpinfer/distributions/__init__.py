"""PyMC distributions used as release likelihoods, written as PyMC's own are: a
``RandomVariable`` for draws plus a ``Discrete`` (or ``Continuous``) class with its logp; and
the exact conditional draws of a Normal latent given its release; and a prior of grouped
counts whose group rates the engine integrates out (``GroupedNegativeBinomial``). Names load on first use."""

from dpinfer._lazy import lazy_exports

_EXPORTS = {
    "dpinfer.distributions.discrete_gaussian": (
        "DiscreteGaussian", "discrete_gaussian_log_normaliser", "discrete_gaussian_variance"),
    "dpinfer.distributions.discrete_laplace": ("DiscreteLaplace",),
    "dpinfer.distributions.grouped_negative_binomial": (
        "GroupedNegativeBinomial", "draw_grouped_negative_binomial", "group_mixing_of"),
    "dpinfer.distributions.normal_laplace": (
        "NormalLaplace", "draw_normal_given_gaussian_release", "draw_normal_given_laplace_release",
        "normal_laplace_logpdf"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
