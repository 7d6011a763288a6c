"""utility: what a mechanism costs its users at equal privacy.

``compare`` (:mod:`~dpinfer.utility.compare`): mechanisms side by side at three levels, the
release, its consumers and the analysis fitted to it. Equal privacy
(:mod:`~dpinfer.utility.equal_privacy`): every mechanism family calibrated to one
pure, approximate or zero-concentrated DP target through its exact privacy profile. Seed 003
(Gupte & Sundararajan, PODS 2010): minimax and Bayesian information consumers of a count on
{0..n} (:mod:`~dpinfer.utility.consumers`), their optimal post-processing of a release and the
optimal mechanism tailored to each (:mod:`~dpinfer.utility.remap`), and mechanism matrices and
derivability from the range-restricted geometric mechanism
(:mod:`~dpinfer.utility.derivability`). The analyst's tools on a ``dp.sample`` result
(:mod:`~dpinfer.utility.analysis`: LOO, posterior predictive checks of the releases, derived
quantities, prior sensitivity) and multiple imputation with Rubin's rules
(:mod:`~dpinfer.utility.imputation`). The likelihood-free analyst's baselines
(:mod:`~dpinfer.utility.baselines`: least-squares projection onto the invariants, integer
rounding that keeps them, noise-only intervals), to set beside ``dp.sample``'s posteriors.
"""

from dpinfer.utility.analysis import (
    PriorSensitivity,
    exceeds,
    posterior_predictive_releases,
    ppc_pvalues,
    prior_sensitivity,
    rank_probabilities,
    ranked_first,
    ranks,
    ratio,
    shares,
    with_log_likelihood,
)
from dpinfer.utility.compare import Analysis, Comparison, compare
from dpinfer.utility.consumers import (
    BUILT_IN_LOSSES,
    Consumer,
    NonMonotoneLossWarning,
    absolute_loss,
    asymmetric_linear_loss,
    bayes_risk,
    is_monotone_loss,
    minimax_risk,
    power_loss,
    risk_profile,
    squared_loss,
    threshold_loss,
    zero_one_loss,
)
from dpinfer.utility.derivability import (
    clamped_to_range,
    derivable_transform,
    geometric_inverse,
    geometric_matrix,
    is_derivable,
    mechanism_matrix,
)
from dpinfer.utility.imputation import (
    RubinResult,
    imputations,
    rubin,
    share_analysis,
    total_analysis,
)
from dpinfer.utility.equal_privacy import Calibration, PrivacyTarget, calibrate, equal_privacy_table
from dpinfer.utility.remap import (
    DesignedMechanism,
    Remap,
    bayes_optimal_mechanism,
    bayes_remap,
    best_deterministic_remap,
    optimal_mechanism,
    optimal_remap,
)

__all__ = [
    "Analysis",
    "BUILT_IN_LOSSES",
    "Calibration",
    "Comparison",
    "Consumer",
    "DesignedMechanism",
    "NonMonotoneLossWarning",
    "PriorSensitivity",
    "PrivacyTarget",
    "Remap",
    "RubinResult",
    "absolute_loss",
    "asymmetric_linear_loss",
    "bayes_optimal_mechanism",
    "bayes_remap",
    "bayes_risk",
    "best_deterministic_remap",
    "calibrate",
    "clamped_to_range",
    "compare",
    "derivable_transform",
    "equal_privacy_table",
    "exceeds",
    "geometric_inverse",
    "geometric_matrix",
    "imputations",
    "is_derivable",
    "is_monotone_loss",
    "mechanism_matrix",
    "minimax_risk",
    "optimal_mechanism",
    "optimal_remap",
    "posterior_predictive_releases",
    "power_loss",
    "ppc_pvalues",
    "prior_sensitivity",
    "rank_probabilities",
    "ranked_first",
    "ranks",
    "ratio",
    "risk_profile",
    "rubin",
    "share_analysis",
    "shares",
    "squared_loss",
    "threshold_loss",
    "total_analysis",
    "with_log_likelihood",
    "zero_one_loss",
]
