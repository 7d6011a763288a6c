r"""Noise-only intervals: the likelihood-free analyst's interval, a point estimate plus the
central interval of the mechanism's noise law."""

from __future__ import annotations

import numbers

import numpy as np

from dpinfer._validation import as_real_array, check_probability
from dpinfer.utility.baselines.inputs import _check_flag


def noise_only_intervals(point, mechanism, prob=0.9, *, clip_at_zero=False) -> tuple[np.ndarray, np.ndarray]:
    r"""The likelihood-free analyst's interval: ``[x_point + lo, x_point + hi]``.

    ``(lo, hi) = mechanism.noise_interval(prob)`` is the central interval of the noise law,
    ``(-q, q)`` with ``P(|e| <= q) >= prob`` (the baseline of Abowd et al. 2022-style
    post-processed releases; inference notes §5). Around the raw release (``point = release``)
    it covers each true count with probability >= ``prob``; around a projected or rounded
    estimate that guarantee is gone (the estimate's error is not the mechanism's noise).

    Parameters
    ----------
    point : array of finite numbers (any shape)
        The point estimates ``x_point`` (release, projection or rounding).
    mechanism : object with ``noise_interval(prob) -> (lo, hi)``
        e.g. :class:`dpinfer.DoubleGeometric`.
    prob : float in (0, 1)
    clip_at_zero : bool, default False
        If True, both ends are replaced by ``max(end, 0)``: counts are non-negative, so this never
        removes a possible true value. Off by default so that the interval is exactly the
        textbook ``point ± q`` and its width shows the noise scale.

    Returns
    -------
    (lower, upper) : float64 arrays shaped like ``point``.
    """
    x = as_real_array("point", point)
    prob = check_probability(prob)
    clip_at_zero = _check_flag("clip_at_zero", clip_at_zero)
    method = getattr(mechanism, "noise_interval", None)
    if not callable(method):
        raise TypeError(
            "mechanism must provide noise_interval(prob) -> (lo, hi) (a dpinfer mechanism), got "
            f"{type(mechanism).__name__}"
        )
    bounds = method(prob)
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise TypeError(f"mechanism.noise_interval({prob}) must return a pair (lo, hi), got {bounds!r}") from None
    for name, value in (("lo", lo), ("hi", hi)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
            raise ValueError(f"mechanism.noise_interval returned a non-finite or non-real {name}: {value!r}")
    if not float(lo) <= 0.0 <= float(hi):
        raise ValueError(f"mechanism.noise_interval must return lo <= 0 <= hi, got ({lo!r}, {hi!r})")
    lower, upper = x + float(lo), x + float(hi)
    if clip_at_zero:
        lower, upper = np.maximum(lower, 0.0), np.maximum(upper, 0.0)
    return lower, upper
