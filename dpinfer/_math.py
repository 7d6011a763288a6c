"""Small numerical helpers shared across modules."""

from __future__ import annotations

import math

import numpy as np


def log1mexp(x):
    """log(1 - e^x) for x <= 0, accurate on both sides of -log 2 (Maechler 2012); -inf at 0.
    Accepts scalars and arrays; returns a float for a scalar."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore"):
        out = np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))
    return float(out) if out.ndim == 0 else out
