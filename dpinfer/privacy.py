"""Exact privacy checks on small domains, shared by every mechanism's ``audit()``.

Pure DP (Dwork et al. 2006): a mechanism M is epsilon-DP iff for all neighbouring inputs
x ~ x' and all outputs y, log p(y | x) - log p(y | x') <= epsilon. For a query of sensitivity
Delta the neighbouring true values are the pairs (x, x') with |x - x'| <= Delta.

Approximate DP: (epsilon, delta)-DP iff for all neighbours the hockey-stick divergence
H_eps(P || Q) = sum_y max(0, p(y) - e^eps q(y)) <= delta (Balle & Wang 2018, Thm 5; for
continuous outputs the sum is an integral).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np


def max_privacy_loss(
    log_likelihood: Callable[[np.ndarray, np.ndarray], np.ndarray],
    neighbour_pairs: Iterable[tuple[float, float]],
    outputs: np.ndarray,
) -> float:
    """Largest |log p(y | x) - log p(y | x')| over the given neighbour pairs and outputs.

    ``log_likelihood(release, true_values)`` is evaluated elementwise. Outputs impossible under
    both inputs are ignored; an output possible under one input only gives +inf (no pure DP).
    """
    outputs = np.asarray(outputs)
    worst = 0.0
    for x, x_prime in neighbour_pairs:
        a = log_likelihood(outputs, np.full(outputs.shape, x, dtype=float))
        b = log_likelihood(outputs, np.full(outputs.shape, x_prime, dtype=float))
        possible = np.isfinite(a) | np.isfinite(b)
        if not np.any(possible):
            continue
        a, b = a[possible], b[possible]
        if np.any(np.isfinite(a) != np.isfinite(b)):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(a - b))))
    return worst


def hockey_stick(log_p: np.ndarray, log_q: np.ndarray, epsilon: float) -> float:
    """sum over enumerated outputs of max(0, p - e^eps q), computed as
    sum p * max(0, 1 - exp(eps + log q - log p)) to keep tiny terms accurate."""
    log_p = np.asarray(log_p, dtype=float)
    log_q = np.asarray(log_q, dtype=float)
    keep = np.isfinite(log_p)
    log_p, log_q = log_p[keep], log_q[keep]
    gap = -np.expm1(np.minimum(epsilon + log_q - log_p, 0.0))
    return float(np.sum(np.exp(log_p) * gap))


def integer_neighbour_pairs(lower: int, upper: int, sensitivity: int) -> list[tuple[int, int]]:
    """All ordered pairs (x, x') of integers in [lower, upper] with 0 < |x - x'| <= sensitivity."""
    pairs = []
    for x in range(lower, upper + 1):
        for step in range(1, sensitivity + 1):
            for x_prime in (x - step, x + step):
                if lower <= x_prime <= upper:
                    pairs.append((x, x_prime))
    return pairs


# --- calibration by bisection, always returning the private side ------------------------------

_MAX_DOUBLINGS = 2000


def bisect_private_end(too_loose: Callable[[float], bool], lo: float, hi: float) -> float:
    """For a monotone predicate with too_loose(lo) and not too_loose(hi), shrink [lo, hi] to
    adjacent floats and return hi, the end on the private side."""
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return hi
        if too_loose(mid):
            lo = mid
        else:
            hi = mid


def smallest_private_scale(too_loose: Callable[[float], bool], start: float) -> float:
    """Smallest noise scale s > 0 with ``too_loose(s)`` False (the predicate is true below a
    threshold and false above it): a doubling bracket on log s around ``start``, then
    bisection to adjacent floats, returning the private end."""
    lo = hi = math.log(start)
    for _ in range(_MAX_DOUBLINGS):
        if not too_loose(math.exp(hi)):
            break
        lo, hi = hi, hi + math.log(2.0)
    else:
        raise RuntimeError("no private scale found: the privacy target is unreachable")
    for _ in range(_MAX_DOUBLINGS):
        if lo != hi and too_loose(math.exp(lo)):
            break
        lo, hi = lo - math.log(2.0), lo
    else:
        raise RuntimeError("no scale is too small for this privacy target")
    return math.exp(bisect_private_end(lambda v: too_loose(math.exp(v)), lo, hi))


def smallest_private_epsilon(too_loose: Callable[[float], bool]) -> float:
    """Smallest epsilon >= 0 at which ``too_loose(epsilon)`` is False (delta(epsilon) within
    its target; delta is non-increasing in epsilon): 0 if already there, else a doubling
    bracket and bisection to adjacent floats, returning the private (larger) end."""
    if not too_loose(0.0):
        return 0.0
    hi = 1.0
    for _ in range(_MAX_DOUBLINGS):
        if not too_loose(hi):
            return bisect_private_end(too_loose, 0.0, hi)
        hi *= 2.0
    raise RuntimeError("no epsilon reaches this delta")
