"""Values of PyTensor graphs that have no free inputs (shapes, constants behind casts), and
observed data PyMC would store in too narrow a type.

``Variable.eval()`` compiles with PyTensor's default backend, numba, which takes a fraction of
a second per graph (0.2-0.4 s, measured), far more than evaluating a shape; the Python
backend compiles such a graph in milliseconds. Static shapes are read without evaluating.
"""

from __future__ import annotations

import numpy as np


def evaluate(var) -> np.ndarray:
    """The value of ``var`` (a graph without free inputs), by PyTensor's Python backend."""
    return np.asarray(var.eval(mode="FAST_COMPILE"))


def shape_of(var) -> tuple:
    """The shape of ``var``: its static shape where the type knows it, else evaluated."""
    static = getattr(var.type, "shape", None)
    if static is not None and all(d is not None for d in static):
        return tuple(int(d) for d in static)
    return tuple(int(d) for d in evaluate(var.shape))


def observed_integers(values):
    """``values`` as the observed data of an integer PyMC variable without loss. PyMC casts
    integer observed data (arrays, constants, ``pm.Data``) to int32
    (``pymc.pytensorf.smarttypeX``), which wraps a value beyond 2^31 - 1 silently (a state's
    group-quarters upper bound, 99999 x its housing units, is ~3e9), while float64 data are
    kept and then cast to the variable's int64 exactly. So an integer array with such values is
    passed as float64 (exact below 2^53, checked); anything else is returned as it is (a
    ``pm.Data`` of such integers is wrapped by PyMC when it is made: make it float64)."""
    array = np.asarray(values) if not hasattr(values, "owner") and not hasattr(values, "get_value") else None
    if array is None or array.dtype.kind not in "iu" or not array.size:
        return values
    largest = int(np.abs(array).max())
    if largest <= np.iinfo(np.int32).max:
        return values
    if largest >= 2**53:
        raise ValueError(f"observed values must be below 2^53 in absolute value to be kept exactly, got {largest}")
    return array.astype(np.float64)
