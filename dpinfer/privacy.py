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
import warnings
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
        if not math.isfinite(hi):
            break
        if not too_loose(hi):
            return bisect_private_end(too_loose, 0.0, hi)
        hi *= 2.0
    raise RuntimeError("no finite epsilon reaches this delta")


# --- root searches on smooth profiles, returning the private end ------------------------------
# Fewer evaluations than bisection to adjacent floats, for profiles that are costly to evaluate
# (Lemma 1 of seed 004, Rényi divergences by quadrature).

def _private_end(excess: Callable[[float], float], x: float) -> float:
    """From x near the root of a non-increasing ``excess``, the smallest float x' >= 0 with
    excess(x') <= 0: the next floats upwards while excess > 0, then downwards while the float
    below still has excess <= 0."""
    while excess(x) > 0:
        x = math.nextafter(x, math.inf)
    while (below := math.nextafter(x, 0.0)) > 0 and excess(below) <= 0:
        x = below
    return x


def _brent(excess: Callable[[float], float], lo: float, hi: float) -> float:
    """Brent's root (scipy) of a non-increasing ``excess`` with excess(lo) > 0 >= excess(hi), to
    float resolution. Only the sign matters: -inf (delta = 0) becomes -1000, and an exact 0
    (a flat private side, as for a pure-DP target) a tiny negative, so the root found is the
    edge of the private side rather than any point of it."""
    def signed(v):
        e = max(excess(v), -1e3)
        return e if e != 0.0 else -1e-300

    from scipy import optimize

    return optimize.brentq(signed, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)


def smallest_scale_by_root(excess: Callable[[float], float], start: float) -> float:
    """Smallest float scale s > 0 with excess(s) <= 0, ``excess`` non-increasing in s (e.g.
    log delta(s) - log target; seed 004 Lemma 18b): a doubling bracket on log s around
    ``start``, Brent's root in log s, then the conservative end on s itself (seed 004 note §4 B)."""
    lo = hi = math.log(start)
    for _ in range(_MAX_DOUBLINGS):
        if excess(math.exp(hi)) <= 0:
            break
        lo, hi = hi, hi + math.log(2.0)
    else:
        raise RuntimeError("no private scale found: the privacy target is unreachable")
    for _ in range(_MAX_DOUBLINGS):
        if lo != hi and excess(math.exp(lo)) > 0:
            break
        lo, hi = lo - math.log(2.0), lo
    else:
        raise RuntimeError("no scale is too small for this privacy target")
    root = _brent(lambda v: excess(math.exp(v)), lo, hi)
    return _private_end(excess, math.exp(root))


def smallest_epsilon_by_root(excess: Callable[[float], float]) -> float:
    """Smallest float epsilon >= 0 with excess(epsilon) <= 0, ``excess`` non-increasing (seed
    004 Lemma 18c): 0 if already there, else a doubling bracket from 1, Brent's root and the
    conservative end (seed 004 note §4 C)."""
    if excess(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(_MAX_DOUBLINGS):
        if excess(hi) <= 0:
            return _private_end(excess, _brent(excess, lo, hi))
        lo, hi = hi, 2.0 * hi
    raise RuntimeError("no epsilon reaches this delta")


# --- Rényi divergences and zero-concentrated DP ------------------------------------------------

_ALPHA_GRID = 1.0 + np.exp(np.linspace(math.log(1e-4), math.log(1e4), 81))  # alpha - 1 log-spaced


def zcdp_rho(renyi_divergence: Callable[[float], float]) -> float:
    """rho = sup_{alpha > 1} D_alpha(P || Q) / alpha, the smallest rho for which a mechanism
    with Rényi divergences ``renyi_divergence(alpha)`` between its release laws at neighbouring
    inputs is rho-zCDP (Bun & Steinke 2016, Definition 1.1).

    The supremum is found numerically: D_alpha / alpha on values of alpha - 1 spaced evenly in
    log from 1e-4 to 1e4 (81 of them; the scan stops once the ratio has fallen below half its
    best for 8 points running), then Brent's method (scipy) on log(alpha - 1) between the best
    grid point's neighbours. For the Gaussian the ratio is constant (Delta^2 / (2 sigma^2)); for
    pure epsilon-DP noise with privacy loss u it is about u^2 / 2 from alpha near 1 up to about
    1 / u and falls to 0 beyond, as D_alpha tends to u; its supremum may be the limit
    alpha -> 1 (the KL divergence: Laplace and Logistic noise), found by Richardson
    extrapolation from alpha - 1 = 1e-4 and 2e-4 (to ~1e-8 relative); otherwise it is
    interior and the refinement reaches it to ~1e-12 relative."""
    from scipy.optimize import minimize_scalar

    ratios = []
    for alpha in _ALPHA_GRID:
        ratios.append(renyi_divergence(float(alpha)) / alpha)
        best = int(np.argmax(ratios))
        if len(ratios) - best > 8 and max(ratios[best + 1:]) < 0.5 * ratios[best]:
            break
    k = int(np.argmax(ratios))
    if k == 0:  # the supremum is the limit alpha -> 1, the KL divergence: Richardson's
        h = _ALPHA_GRID[0] - 1.0  # extrapolation of D_alpha / alpha = KL + c h + O(h^2)
        doubled = renyi_divergence(1.0 + 2.0 * h) / (1.0 + 2.0 * h)
        return float(max(ratios[0], 2.0 * ratios[0] - doubled))
    lo = math.log(_ALPHA_GRID[max(k - 1, 0)] - 1.0)
    hi = math.log(_ALPHA_GRID[min(k + 1, len(_ALPHA_GRID) - 1)] - 1.0)
    if hi <= lo:
        return float(ratios[k])

    def negative_ratio(t):
        alpha = 1.0 + math.exp(t)
        return -renyi_divergence(alpha) / alpha

    refined = minimize_scalar(negative_ratio, bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-10})
    return float(max(ratios[k], -refined.fun))


def sum_over_integers(log_term: Callable[[np.ndarray], np.ndarray], centre: int = 0,
                      *, relative_tail: float = 1e-18) -> float:
    """log of sum over all integers e of exp(log_term(e)), for terms that are unimodal-ish
    around ``centre`` and decay at least geometrically in both tails (log-concave noise laws
    and their tilts): blocks of integers are added outwards, doubling in length, until the
    largest term of the last block on each side is below ``relative_tail`` times the sum."""
    from scipy.special import logsumexp

    total = float(logsumexp(log_term(np.arange(centre - 64, centre + 65))))
    left, right, length = centre - 64, centre + 64, 128
    for side in (-1, 1):
        edge, size = (left, right)[side > 0], length
        while True:
            block = np.arange(edge - size, edge) if side < 0 else np.arange(edge + 1, edge + 1 + size)
            terms = log_term(block)
            total = float(np.logaddexp(total, logsumexp(terms)))
            edge = block[0] if side < 0 else block[-1]
            if not np.max(terms) > total + math.log(relative_tail):
                break
            if size > 2**40:
                raise RuntimeError("the sum's terms do not decay: no finite sum")
            size *= 2
    return total


def integral_over_reals(log_term: Callable[[float], float], points: Iterable[float]) -> float:
    """log of the integral over the real line of exp(log_term(x)), for a unimodal integrand:
    scaled by its value at the mode (found by Brent's method from a bracket around
    ``points``) so that neither overflow nor underflow loses it, then integrated by adaptive
    quadrature (scipy's QUADPACK, relative tolerance 1e-12, absolute 1e-14 of the peak's mass)
    on the pieces between ``points``,
    the mode and breakpoints 1 to 64 peak widths either side of it. Returns inf where the
    mode's value is not finite."""
    from scipy import integrate
    from scipy.optimize import minimize_scalar

    points = sorted(float(p) for p in points)
    width = max(points[-1] - points[0], 1.0)
    mode = minimize_scalar(lambda x: -log_term(x), bracket=(points[0] - width, points[-1] + width)).x
    peak = log_term(mode)
    if not math.isfinite(peak):
        return math.inf
    # the peak's width from the curvature at the mode (a Laplace approximation): breakpoints at
    # 1, 4, 16 and 64 widths on each side keep every piece smooth on its own scale
    h = 1e-4 * max(1.0, abs(mode), width)
    curvature = (log_term(mode + h) - 2.0 * peak + log_term(mode - h)) / (h * h)
    spread = 1.0 / math.sqrt(-curvature) if curvature < 0 and math.isfinite(curvature) else width
    cuts = sorted(set(points + [float(mode)] + [float(mode + k * spread) for k in
                                                 (-64, -16, -4, -1, 1, 4, 16, 64)]))
    edges = [-math.inf, *cuts, math.inf]
    total = error = 0.0
    with warnings.catch_warnings():  # QUADPACK's roundoff notices: judged by its error estimate
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        for a, b in zip(edges[:-1], edges[1:]):
            value, err = integrate.quad(lambda x: math.exp(log_term(x) - peak), a, b,
                                        epsabs=1e-14 * spread, epsrel=1e-12, limit=200)
            total += value
            error += err
    if error > 1e-6 * total:  # log(total) then off by more than 1e-6
        warnings.warn(f"integral_over_reals: relative error estimate {error / total:.1e} "
                      "(the integrand loses precision far from the origin)", RuntimeWarning,
                      stacklevel=2)
    return peak + math.log(total)
