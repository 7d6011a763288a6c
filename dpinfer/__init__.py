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
from dpinfer._lazy import lazy_exports

clear_if_stale()  # before any cached kernel is loaded

__version__ = "0.1.0"

# Names are imported on first use (PEP 562), so that ``import dpinfer`` costs little more
# than ``import pymc`` and a script pays only for what it uses (ArviZ's plots, Dask, the
# adapters' libraries stay unloaded until asked for).
_EXPORTS = {
    "dpinfer.batch": (
        "FitJob", "fit_many"
    ),
    "dpinfer.distributions.grouped_negative_binomial": (
        "GroupedNegativeBinomial",
    ),
    "dpinfer.inference": (
        "marginal_model", "sample"
    ),
    "dpinfer.inference.recovery": (
        "RecoveryWarning", "recoveries_of"
    ),
    "dpinfer.inference.sharded": (
        "sample_sharded",
    ),
    "dpinfer.io": (
        "NoisyMeasurements", "Release", "ReleaseFileError", "UnsupportedMechanismError",
        "from_diffprivlib", "from_opendp", "read_noisy_measurements", "read_release",
        "write_release"
    ),
    "dpinfer.io.nmf": (
        "read_nmf", "read_plan", "summarise_areas", "write_synthetic_nmf"
    ),
    "dpinfer.lattice.invariants": (
        "Invariants",
    ),
    "dpinfer.mechanisms": (
        "BITLaplace", "ClampedGeometric", "Conditioned", "DiscreteGaussian", "DoubleGeometric",
        "Gaussian", "GeneralizedGaussian", "GeneralizedLaplace", "Laplace", "Logistic",
        "Mechanism", "MultiLevelGeometric", "NestedMeasurements", "RandomizedResponse", "PrivacyAudit",
        "PrivacyGuarantee", "Subbotin", "TruncatedLaplace"
    ),
    "dpinfer.statistics": (
        "clamp", "power_sums", "power_sums_labels", "regression_statistic", "regression_statistic_labels"
    ),
    "dpinfer.utility": (
        "imputations", "posterior_predictive_releases", "ppc_pvalues", "rubin", "Consumer",
        "PrivacyTarget", "calibrate", "compare", "equal_privacy_table", "is_derivable",
        "mechanism_matrix", "minimax_risk", "optimal_mechanism", "optimal_remap"
    ),
}
_SUBPACKAGES = ("batch", "demo", "distributions", "inference", "io", "lattice", "mechanisms",
                "privacy", "statistics", "utility")
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBPACKAGES)
