"""What the inference engine needs to know about a latent count vector before planning: the
support of its prior, the current value of a release's data, and the error raised when the
counts cannot be handled."""

from __future__ import annotations

import numpy as np
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import graph_inputs

from dpinfer._graphs import evaluate

# Lowest count each of PyMC's count distributions supports (RandomVariable.name -> value).
_SUPPORT_LOWER = {
    "poisson": 0,
    "binomial": 0,
    "negative_binomial": 0,
    "beta_binomial": 0,
    "hypergeometric": 0,
    "geometric": 1,
    "bernoulli": 0,
}


class NotMarginalisableError(ValueError):
    """The latent counts of a release cannot be handled exactly (not an elementwise count
    distribution, a release of something else, an unsupported combination of releases)."""


def prior_support(node) -> tuple:
    """(lowest, highest) count the prior supports, where known: the lower end from the
    distribution, the upper end from a Binomial's or BetaBinomial's constant n."""
    lower = _SUPPORT_LOWER.get(node.op.name)
    upper = None
    if node.op.name == "bernoulli":
        upper = 1
    if node.op.name in ("binomial", "beta_binomial"):
        n = node.op.dist_params(node)[0]
        if all(isinstance(v, Constant) for v in graph_inputs([n])):  # n is fixed: evaluate it
            upper = int(np.max(evaluate(n)))
    return lower, upper


def current_value(var) -> np.ndarray:
    """The numeric value of an observed variable's data (constant or pm.Data, possibly behind
    the dtype casts PyMC inserts: observed integer data become int32, then int64 counts)."""
    if hasattr(var, "get_value"):
        return np.asarray(var.get_value())
    if hasattr(var, "data"):
        return np.asarray(var.data)
    return evaluate(var)
