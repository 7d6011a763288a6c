"""Privacy mechanisms: one class per mechanism, each with its privacy guarantee and exact
audit, a sampler, its likelihood (numpy and PyMC) and its utility."""

from dpinfer.mechanisms.base import AdditiveMechanism, Mechanism, PrivacyAudit, PrivacyGuarantee
from dpinfer.mechanisms.conditioned import Conditioned
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian
from dpinfer.mechanisms.gaussian import Gaussian
from dpinfer.mechanisms.geometric import ClampedGeometric, DoubleGeometric
from dpinfer.mechanisms.laplace import Laplace
from dpinfer.mechanisms.logconcave import Logistic, Subbotin, log_concave_delta
from dpinfer.mechanisms.multilevel import MultiLevelAudit, MultiLevelGeometric
from dpinfer.mechanisms.randomized_response import RandomizedResponse
from dpinfer.mechanisms.generalized_gaussian import GeneralizedGaussian, PrivacyUnverifiedError
from dpinfer.mechanisms.subspace import GeneralizedLaplace
from dpinfer.mechanisms.truncated_laplace import BITLaplace, TruncatedLaplace

__all__ = [
    "AdditiveMechanism",
    "BITLaplace",
    "ClampedGeometric",
    "Conditioned",
    "DiscreteGaussian",
    "DoubleGeometric",
    "Gaussian",
    "GeneralizedGaussian",
    "GeneralizedLaplace",
    "PrivacyUnverifiedError",
    "Laplace",
    "Logistic",
    "Mechanism",
    "MultiLevelAudit",
    "MultiLevelGeometric",
    "RandomizedResponse",
    "PrivacyAudit",
    "PrivacyGuarantee",
    "Subbotin",
    "TruncatedLaplace",
    "log_concave_delta",
]
