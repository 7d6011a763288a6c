r"""Exact samplers for discrete noise, in integer arithmetic, vectorised with numpy.

Canonne, Kamath & Steinke (2020), "The Discrete Gaussian for Differential Privacy"
(arXiv:2004.00010), §5: Algorithm 1 (Bernoulli(exp(-gamma)) for rational gamma), Algorithm 2
(discrete Laplace via a fast geometric sampler) and Algorithm 3 (discrete Gaussian by rejection
from a discrete Laplace proposal). Every random decision is an integer comparison: a
Bernoulli(n/d) draw is ``rng.integers(0, d) < n``, so no floating-point rounding can bias a
release. Parameters given as floats are converted *exactly* with ``Fraction(float)``; a float
such as 0.1 then stands for its binary value 3602879701896397 / 2**55, not for 1/10.

Vectorisation: each algorithm runs on a whole batch at once, the loops iterating over the
indices of draws still running (their loop counts are geometric, so a batch finishes after a
few dozen numpy calls).

Integer range: values stay in int64 while every intermediate magnitude is provably below
2**62 (checked from the actual batch before each step). Otherwise the step runs on numpy
object arrays of Python integers (unbounded, slower but still vectorised), where a
Bernoulli(n/d) draw compares a uniform U in [0, 1) with n/d 62 bits at a time. The discrete
Gaussian with a float sigma always takes that route for its acceptance step, because
sigma^2 = Fraction(sigma)**2 has a denominator of about 2**100.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dpinfer._validation import check_rng

__all__ = [
    "sample_bernoulli",
    "sample_bernoulli_exp",
    "sample_geometric_exp",
    "sample_discrete_laplace",
    "sample_discrete_gaussian",
]

# int64 arithmetic is used only while every intermediate magnitude is below this bound.
_SAFE = 1 << 62
# Largest scale / sigma accepted: draws beyond 2**63 would then need |noise| > 2**23 scales,
# an event of probability below exp(-2**23).
_MAX_SCALE = 1 << 40


# --- argument checks ---------------------------------------------------------------------


def _as_fraction(name: str, value) -> Fraction:
    """The exact rational value of a finite real number (floats via Fraction(float))."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (int, float or Fraction), got {value!r}")
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return Fraction(value)


def _positive_scale(name: str, value) -> Fraction:
    value = _as_fraction(name, value)
    if not 0 < value <= _MAX_SCALE:
        raise ValueError(f"{name} must be > 0 and <= 2**40 (so that draws fit in int64), got {value}")
    return value


def _shape(size) -> tuple[int, ...]:
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = (size,)
    if not isinstance(size, tuple) or not all(
        isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in size
    ):
        raise TypeError(f"size must be an int or a tuple of ints, got {size!r}")
    if any(s < 0 for s in size):
        raise ValueError(f"size must not contain negative entries, got {size!r}")
    return tuple(int(s) for s in size)


# --- integer helpers -----------------------------------------------------------------------


def _max_abs(values: np.ndarray) -> int:
    return int(np.max(np.abs(values))) if values.size else 0


def _exact_ints(values: np.ndarray, bound: int) -> np.ndarray:
    """``values`` as int64 when ``bound`` (>= every magnitude the caller will compute from
    them) is below 2**62, else as an object array of Python ints."""
    return values.astype(np.int64 if bound < _SAFE else object)


def _to_int64(values: np.ndarray) -> np.ndarray:
    if values.dtype == object and values.size and _max_abs(values) >= 2**63:
        raise OverflowError("a draw does not fit in int64; use a smaller scale / sigma")
    return values.astype(np.int64)


def _fill_by_rejection(n: int, draw: Callable[[int], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """n accepted values: ``draw(m)`` returns m proposals and their acceptance mask; rejected
    slots are proposed again until all n are filled."""
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        values, accepted = draw(todo.size)
        if out.dtype != values.dtype:
            out = out.astype(values.dtype)
        out[todo[accepted]] = values[accepted]
        todo = todo[~accepted]
    return out


def _uniform_below(high: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """m uniform integers in {0, ..., high - 1} (int64, or object for high > 2**62, built from
    62-bit words by rejection)."""
    if high <= _SAFE:
        return rng.integers(0, high, size=m)
    nbits = (high - 1).bit_length()
    words = -(-nbits // 62)

    def draw(k):
        chunks = rng.integers(0, _SAFE, size=(k, words)).astype(object)
        value = np.zeros(k, dtype=object)
        for i in range(words):
            value = (value << 62) + chunks[:, i]
        value = value >> (62 * words - nbits)
        return value, np.asarray(value < high, dtype=bool)

    return _fill_by_rejection(m, draw)


# --- Bernoulli samplers (CKS Alg. 1) ------------------------------------------------------


def _bernoulli(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(num/den) elementwise, 0 <= num <= den, den >= 1: the event U < num/den for U
    uniform on [0, 1). With int64 inputs U is rng.integers(0, den)/den; with object inputs U's
    base-2**62 digits are drawn one at a time and compared with those of num/den (long
    division), stopping at the first digit that differs."""
    if num.dtype != object and den.dtype != object:
        return rng.integers(0, den) < num
    out = np.zeros(num.size, dtype=bool)
    todo = np.arange(num.size)
    rem, den = num.astype(object), den.astype(object)
    while todo.size:
        scaled = rem[todo] * _SAFE
        digit = scaled // den[todo]
        rem[todo] = scaled - digit * den[todo]
        digit = digit.astype(np.int64)
        u = rng.integers(0, _SAFE, size=todo.size)
        out[todo] = u < digit
        todo = todo[u == digit]
    return out


def _bernoulli_exp_unit(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-gamma)) for gamma = num/den in [0, 1] (CKS Alg. 1, first case): draw
    A_k ~ Bernoulli(gamma/k) for k = 1, 2, ... until the first A_K = 0; return [K odd].
    P(K = k) = gamma^(k-1)/(k-1)! - gamma^k/k!, so P(K odd) = sum_j (-gamma)^j/j! = exp(-gamma)."""
    result = np.empty(num.size, dtype=bool)
    todo = np.arange(num.size)
    den_max = _max_abs(den)
    k = 1
    while todo.size:
        bound = den_max * k
        go_on = _bernoulli(_exact_ints(num[todo], bound), _exact_ints(den[todo], bound) * k, rng)
        result[todo[~go_on]] = k % 2 == 1
        todo = todo[go_on]
        k += 1
    return result


def _bernoulli_exp1(m: int, rng: np.random.Generator) -> np.ndarray:
    ones = np.ones(m, dtype=np.int64)
    return _bernoulli_exp_unit(ones, ones, rng)


def _bernoulli_exp(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-gamma)) for gamma = num/den >= 0 (CKS Alg. 1): floor(gamma) independent
    Bernoulli(exp(-1)) draws (stopping at the first failure), then Bernoulli(exp(-frac(gamma)))."""
    whole = num // den
    frac = num - whole * den
    alive = np.ones(num.size, dtype=bool)
    todo = np.flatnonzero(np.asarray(whole > 0, dtype=bool))
    j = 0
    while todo.size:
        ok = _bernoulli_exp1(todo.size, rng)
        alive[todo[~ok]] = False
        j += 1
        todo = todo[ok]
        todo = todo[np.asarray(whole[todo] > j, dtype=bool)]
    idx = np.flatnonzero(alive)
    alive[idx] = _bernoulli_exp_unit(frac[idx], den[idx], rng)
    return alive


# --- geometric, discrete Laplace, discrete Gaussian -----------------------------------------


def _count_exp1_successes(m: int, rng: np.random.Generator) -> np.ndarray:
    """Number of Bernoulli(exp(-1)) successes before the first failure: P(v) = (1 - e^-1) e^-v."""
    v = np.zeros(m, dtype=np.int64)
    todo = np.arange(m)
    while todo.size:
        todo = todo[_bernoulli_exp1(todo.size, rng)]
        v[todo] += 1
    return v


def _geometric_exp(m: int, gamma: Fraction, rng: np.random.Generator) -> np.ndarray:
    """m draws with P(k) = (1 - e^-gamma) e^(-gamma k), k >= 0, gamma = s/t > 0 (CKS Alg. 2,
    the geometric part): U uniform on {0..t-1} accepted with probability exp(-U/t), V counts
    Bernoulli(exp(-1)) successes; X = U + t V has P(X = x) proportional to exp(-x/t), and
    floor(X/s) is the geometric draw."""
    s, t = gamma.numerator, gamma.denominator

    def draw_u(k):
        u = _uniform_below(t, k, rng)
        return u, _bernoulli_exp(u, np.full(k, t, dtype=u.dtype), rng)

    u = _fill_by_rejection(m, draw_u)
    v = _count_exp1_successes(m, rng)
    bound = max(t * (_max_abs(v) + 1), s)
    x = _exact_ints(u, bound) + _exact_ints(v, bound) * t
    return _to_int64(x // s)


def _discrete_laplace(m: int, scale: Fraction, rng: np.random.Generator) -> np.ndarray:
    """m draws with P(k) proportional to exp(-|k|/scale) (CKS Alg. 2): a geometric magnitude
    with gamma = 1/scale and a fair sign, rejecting 'negative zero' so 0 is not counted twice."""
    gamma = 1 / scale

    def draw(k):
        magnitude = _geometric_exp(k, gamma, rng)
        negative = rng.integers(0, 2, size=k).astype(bool)
        return np.where(negative, -magnitude, magnitude), ~(negative & (magnitude == 0))

    return _fill_by_rejection(m, draw)


def sample_bernoulli(p, size, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(p) draws (bool array of shape ``size``) for a rational p in [0, 1] (a float is
    taken at its exact binary value): ``rng.integers(0, d) < n`` for p = n/d."""
    p = _as_fraction("p", p)
    if not 0 <= p <= 1:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    shape, rng = _shape(size), check_rng(rng)
    n = math.prod(shape)
    bound = p.denominator
    num = _exact_ints(np.full(n, p.numerator, dtype=object), bound)
    den = _exact_ints(np.full(n, p.denominator, dtype=object), bound)
    return _bernoulli(num, den, rng).reshape(shape)


def sample_bernoulli_exp(gamma, size, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-gamma)) draws (bool array) for a rational gamma >= 0, exactly
    (Canonne, Kamath & Steinke 2020, Algorithm 1)."""
    gamma = _as_fraction("gamma", gamma)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    shape, rng = _shape(size), check_rng(rng)
    n = math.prod(shape)
    bound = max(gamma.numerator, gamma.denominator)
    num = _exact_ints(np.full(n, gamma.numerator, dtype=object), bound)
    den = _exact_ints(np.full(n, gamma.denominator, dtype=object), bound)
    return _bernoulli_exp(num, den, rng).reshape(shape)


def sample_geometric_exp(gamma, size, rng: np.random.Generator) -> np.ndarray:
    """Geometric draws (int64) with P(k) = (1 - e^-gamma) e^(-gamma k), k = 0, 1, ..., for a
    rational gamma > 0 (Canonne, Kamath & Steinke 2020, Algorithm 2, geometric part)."""
    gamma = _as_fraction("gamma", gamma)
    if not gamma >= Fraction(1, _MAX_SCALE):
        raise ValueError(f"gamma must be >= 2**-40 (so that draws fit in int64), got {gamma}")
    shape, rng = _shape(size), check_rng(rng)
    return _geometric_exp(math.prod(shape), gamma, rng).reshape(shape)


def sample_discrete_laplace(scale, size, rng: np.random.Generator) -> np.ndarray:
    """Discrete Laplace draws (int64) with P(k) = (1 - a)/(1 + a) a^|k|, a = exp(-1/scale),
    for a rational scale > 0 (a float is converted exactly with Fraction(float)).

    Canonne, Kamath & Steinke (2020), Algorithm 2. For the geometric mechanism with privacy
    epsilon and sensitivity Delta, scale = Delta/epsilon.
    """
    scale = _positive_scale("scale", scale)
    shape, rng = _shape(size), check_rng(rng)
    return _discrete_laplace(math.prod(shape), scale, rng).reshape(shape)


def sample_discrete_gaussian(sigma, size, rng: np.random.Generator) -> np.ndarray:
    r"""Discrete Gaussian draws (int64) with P(k) = exp(-k^2/(2 sigma^2)) / Z(sigma), for a
    rational sigma > 0 (a float is converted exactly; sigma^2 = Fraction(sigma)**2).

    Canonne, Kamath & Steinke (2020), Algorithm 3: with t = floor(sigma) + 1 propose
    Y ~ discrete Laplace(scale t) and accept with probability
    exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)). Writing sigma^2 = p/q, the exponent is the exact
    fraction (|Y| q t - p)^2 / (2 p q t^2).
    """
    sigma = _positive_scale("sigma", sigma)
    shape, rng = _shape(size), check_rng(rng)
    sigma2 = sigma**2
    p, q = sigma2.numerator, sigma2.denominator
    t = math.floor(sigma) + 1
    den_value = 2 * p * q * t * t

    def draw(k):
        y = _discrete_laplace(k, Fraction(t), rng)
        bound = max((_max_abs(y) * q * t + p) ** 2, den_value)
        abs_y = _exact_ints(np.abs(y), bound)
        num = (abs_y * (q * t) - p) ** 2
        den = _exact_ints(np.full(k, den_value, dtype=object), bound)
        return y, _bernoulli_exp(num, den, rng)

    return _fill_by_rejection(math.prod(shape), draw).reshape(shape)
