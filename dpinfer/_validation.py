"""Argument checks shared by every public entry point.

Each check raises ``ValueError`` or ``TypeError`` naming the argument and the allowed values;
nothing is clipped or rounded silently.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_positive(name: str, value, *, allow_inf: bool = False) -> float:
    """A finite (or, if allowed, infinite) real number > 0, returned as float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number > 0, got {value!r} ({type(value).__name__})")
    value = float(value)
    if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
        allowed = "a number > 0" if allow_inf else "a finite number > 0"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


def check_epsilon(value, name: str = "epsilon") -> float:
    """Privacy parameter epsilon: finite and > 0."""
    return check_positive(name, value)


def check_delta(value, name: str = "delta") -> float:
    """Privacy parameter delta: strictly inside (0, 1)."""
    return check_probability(value, name)


def check_epsilon_or_zero(value, name: str = "epsilon") -> float:
    """Privacy parameter epsilon where 0 is allowed: a finite real >= 0 ((0, delta) is a
    valid guarantee for delta > 0, seed 004 note P4)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number >= 0, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_delta_or_zero(value, name: str = "delta") -> float:
    """Privacy parameter delta where 0 (pure DP) is allowed: a real in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in [0, 1), got {value!r} ({type(value).__name__})")
    value = float(value)
    if not (0.0 <= value < 1.0):
        raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
    return value


def check_integer_sensitivity(value, name: str = "sensitivity") -> int:
    """Sensitivity of an integer-valued query: a whole number >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a whole number >= 1, got {value!r}")
    if not float(value).is_integer() or not 1 <= value <= 2**53:
        raise ValueError(f"{name} must be a whole number in [1, 2**53] for a discrete mechanism (an integer "
                         f"that float64 holds exactly), got {value!r}")
    return int(value)


def check_bounds(lower, upper, *, integer: bool = False) -> tuple:
    """Public, data-independent bounds with lower < upper (whole numbers if ``integer``)."""
    for name, v in (("lower", lower), ("upper", upper)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v!r}")
        if integer and not float(v).is_integer():
            raise ValueError(f"{name} must be a whole number for a discrete mechanism, got {v!r}")
    if not lower < upper:
        raise ValueError(f"lower must be < upper, got lower={lower!r}, upper={upper!r}")
    if integer:
        return int(lower), int(upper)
    return float(lower), float(upper)


def as_real_array(name: str, values) -> np.ndarray:
    """Finite real values as a float64 array."""
    arr = np.asarray(values)
    if arr.dtype == object or np.issubdtype(arr.dtype, np.complexfloating) or \
            not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must be numeric (real numbers), got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite; found NaN or infinite entries")
    return arr


def refuse_bools(name: str, values, allowed: str) -> None:
    """True and False are not numbers here: a TypeError saying what ``name`` allows."""
    if isinstance(values, (bool, np.bool_)) or np.asarray(values).dtype == bool:
        raise TypeError(f"{name} must be {allowed}, got {values!r}")


def as_integer_array(name: str, values) -> np.ndarray:
    """Whole-number values as an int64 array; non-integers are an error, never rounded."""
    arr = np.asarray(values)
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.int64)
    real = as_real_array(name, arr)
    if not np.all(real == np.round(real)):
        bad = real[real != np.round(real)].ravel()[:3]
        raise ValueError(f"{name} must hold whole numbers (a discrete mechanism); found {bad.tolist()}")
    if np.any(np.abs(real) > 2**53):
        raise ValueError(f"{name} has entries too large to represent exactly (|value| > 2**53)")
    return real.astype(np.int64)


def check_within(name: str, values: np.ndarray, lower, upper) -> None:
    """All values inside the closed interval [lower, upper]."""
    outside = (values < lower) | (values > upper)
    if np.any(outside):
        bad = np.asarray(values)[outside].ravel()[:3]
        raise ValueError(f"{name} must lie in [{lower}, {upper}]; found {bad.tolist()}")


def check_same_shape(name_a: str, a: np.ndarray, name_b: str, b: np.ndarray) -> None:
    """Two arrays that broadcast to each other (release vs. true values)."""
    try:
        np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        raise ValueError(
            f"{name_a} has shape {np.shape(a)} and {name_b} has shape {np.shape(b)}; they must match"
        ) from None


def check_probability(value, name: str = "prob") -> float:
    """A probability strictly inside (0, 1) (interval levels, tolerances)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in (0, 1), got {value!r}")
    value = float(value)
    if not (0.0 < value < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return value


def check_count(name: str, value, minimum: int) -> int:
    """A whole number >= ``minimum`` (chains, steps, sweeps, runs, lags), returned as int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a whole number >= {minimum}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def check_rng(rng) -> np.random.Generator:
    """Randomness only through a numpy Generator passed in (reproducible)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_flag(name: str, value) -> bool:
    """True or False (a number or a string is refused: ``progressbar="no"`` is not False)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_seed(value, name: str = "random_seed") -> int | None:
    """None or a whole number >= 0 (a bool is not a seed)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be None or a whole number >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be None or a whole number >= 0, got {value!r}")
    return int(value)


def check_path(name: str, value):
    """None or a non-empty path (a str or an os.PathLike), returned as a pathlib.Path."""
    import os
    from pathlib import Path

    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or str(value) == "":
        raise TypeError(f"{name} must be None or a directory path (a str or pathlib.Path), got {value!r}")
    return Path(value)
