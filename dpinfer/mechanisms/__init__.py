"""Privacy mechanisms: one class per mechanism, each with its privacy guarantee and exact
audit, a sampler, its likelihood (numpy and PyMC) and its utility.

Names load on first use (PEP 562): ``dp.DoubleGeometric`` imports its own module, not the
lattice machinery behind ``Conditioned`` and ``GeneralizedLaplace``."""

from dpinfer._lazy import lazy_exports

_EXPORTS = {
    "dpinfer.mechanisms.base": ("AdditiveMechanism", "Mechanism", "PrivacyAudit", "PrivacyGuarantee"),
    "dpinfer.mechanisms.conditioned": ("Conditioned",),
    "dpinfer.mechanisms.discrete_gaussian": ("DiscreteGaussian",),
    "dpinfer.mechanisms.gaussian": ("Gaussian",),
    "dpinfer.mechanisms.geometric": ("ClampedGeometric", "DoubleGeometric"),
    "dpinfer.mechanisms.laplace": ("Laplace",),
    "dpinfer.mechanisms.logconcave": ("Logistic", "Subbotin", "log_concave_delta"),
    "dpinfer.mechanisms.multilevel": ("MultiLevelAudit", "MultiLevelGeometric"),
    "dpinfer.mechanisms.nested": ("NestedMeasurements",),
    "dpinfer.mechanisms.randomized_response": ("RandomizedResponse",),
    "dpinfer.mechanisms.generalized_gaussian": ("GeneralizedGaussian", "PrivacyUnverifiedError"),
    "dpinfer.mechanisms.subspace": ("GeneralizedLaplace",),
    "dpinfer.mechanisms.truncated_laplace": ("BITLaplace", "TruncatedLaplace"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
