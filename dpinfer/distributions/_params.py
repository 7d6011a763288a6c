"""Parameter conversion shared by dpinfer's PyMC distributions.

PyTensor turns Python float literals that are exact in float32 into float32 constants (and
small ints into int8), which costs about 1e-8 relative precision in normalising constants
(reference notes §3.1). Every real parameter therefore goes through :func:`as_float64`, and
every integer location through :func:`as_integer_location`.
"""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.graph.basic import Variable

from dpinfer._validation import as_integer_array, as_real_array


def as_float64(name: str, value):
    """A float64 tensor: numbers and arrays must be finite reals (checked in numpy), symbolic
    inputs are cast."""
    if isinstance(value, Variable):
        value = pt.as_tensor_variable(value)
        return value if value.dtype == "float64" else pt.cast(value, "float64")
    return pt.as_tensor_variable(as_real_array(name, value))


def as_integer_location(name: str, value):
    """An int64 tensor for an integer location parameter.

    Numbers and arrays must hold whole numbers (checked, never rounded); symbolic inputs must
    have an integer dtype, e.g. a latent ``pm.Poisson`` count.
    """
    if isinstance(value, Variable):
        value = pt.as_tensor_variable(value)
        if not value.dtype.startswith(("int", "uint")):
            raise TypeError(
                f"{name} must be an integer tensor (e.g. a latent count), got dtype {value.dtype}"
            )
        return value if value.dtype == "int64" else pt.cast(value, "int64")
    return pt.as_tensor_variable(as_integer_array(name, value))


def symmetric_log_tails(value, mu, log_tail):
    """(log P(Y <= value), log P(Y > value)) for an integer law symmetric about integer mu.

    With j = floor(value - mu), the smaller of the two tails is P(Y - mu >= m) with m = -j for
    j < 0 and m = j + 1 for j >= 0 (so m >= 1); ``log_tail(m)`` gives its log accurately and
    the other tail is its log1mexp, so both tails stay accurate far out.
    """
    j = pt.floor(pt.cast(value - mu, "float64"))
    left = pt.lt(j, 0)
    small = log_tail(pt.switch(left, -j, j + 1))
    large = pt.log1mexp(small)
    return pt.switch(left, small, large), pt.switch(left, large, small)
