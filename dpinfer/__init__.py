"""dpinfer: differentially private releases as transparent likelihoods for PyMC.

    import dpinfer as dp
    mech = dp.DoubleGeometric(epsilon=0.5)          # curator and analyst share this object
    noisy = mech.release(true_counts, rng)            # exact sampler
    with pm.Model():
        x = pm.Poisson("x", lam, shape=n)
        mech.observe("release", x, observed=noisy)    # p(release | x) as a PyMC likelihood
        idata = dp.sample()                           # counts summed out / drawn exactly
    dp.fit_many(jobs, "fits/", executor=client)      # many independent fits, one file each
    dp.calibrate("Gaussian", dp.PrivacyTarget.approximate(1.0, 1e-5))  # equal privacy
"""

from dpinfer._kernel_cache import clear_if_stale

clear_if_stale()  # before any cached kernel is loaded

from dpinfer.batch import FitJob, fit_many  # noqa: E402
from dpinfer.inference import marginal_model, sample  # noqa: E402
from dpinfer.io import (  # noqa: E402
    NoisyMeasurements,
    Release,
    ReleaseFileError,
    UnsupportedMechanismError,
    from_diffprivlib,
    from_opendp,
    read_noisy_measurements,
    read_release,
    write_release,
)
from dpinfer.lattice.invariants import Invariants  # noqa: E402
from dpinfer.mechanisms import (  # noqa: E402
    BITLaplace,
    ClampedGeometric,
    Conditioned,
    DiscreteGaussian,
    DoubleGeometric,
    Gaussian,
    GeneralizedGaussian,
    GeneralizedLaplace,
    Laplace,
    Logistic,
    Mechanism,
    MultiLevelGeometric,
    RandomizedResponse,
    PrivacyAudit,
    PrivacyGuarantee,
    Subbotin,
    TruncatedLaplace,
)
from dpinfer.statistics import clamp, regression_statistic, regression_statistic_labels  # noqa: E402
from dpinfer.utility import (  # noqa: E402
    imputations,
    posterior_predictive_releases,
    ppc_pvalues,
    rubin,
    Consumer,
    PrivacyTarget,
    calibrate,
    compare,
    equal_privacy_table,
    is_derivable,
    mechanism_matrix,
    minimax_risk,
    optimal_mechanism,
    optimal_remap,
)

__version__ = "0.1.0"

__all__ = [
    "BITLaplace",
    "ClampedGeometric",
    "Conditioned",
    "Consumer",
    "DiscreteGaussian",
    "DoubleGeometric",
    "FitJob",
    "Gaussian",
    "GeneralizedGaussian",
    "GeneralizedLaplace",
    "Invariants",
    "Laplace",
    "Logistic",
    "Mechanism",
    "MultiLevelGeometric",
    "NoisyMeasurements",
    "PrivacyAudit",
    "PrivacyGuarantee",
    "PrivacyTarget",
    "RandomizedResponse",
    "Release",
    "ReleaseFileError",
    "Subbotin",
    "TruncatedLaplace",
    "UnsupportedMechanismError",
    "calibrate",
    "clamp",
    "compare",
    "equal_privacy_table",
    "fit_many",
    "from_diffprivlib",
    "from_opendp",
    "imputations",
    "is_derivable",
    "marginal_model",
    "mechanism_matrix",
    "minimax_risk",
    "optimal_mechanism",
    "optimal_remap",
    "posterior_predictive_releases",
    "ppc_pvalues",
    "read_noisy_measurements",
    "read_release",
    "regression_statistic",
    "regression_statistic_labels",
    "rubin",
    "sample",
    "write_release",
]
