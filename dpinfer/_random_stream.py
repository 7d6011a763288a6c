"""A per-chain random stream for numba kernels, carried as four ``uint64`` words.

xoshiro256** (D. Blackman, S. Vigna, "Scrambled linear pseudorandom number generators", ACM
TOMS 47(4), 2021), seeded from a ``numpy.random.Generator`` (all-zero state excluded); uniforms
from the top 53 bits, standard normals by the Box-Muller transform. A numba call that takes a
``numpy.random.Generator`` spends 12-17 µs converting it on every call (measured), more than a
whole NUTS transition of a small model; four words cost nothing to pass.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel


def new_stream(rng: np.random.Generator) -> np.ndarray:
    """A fresh xoshiro256** state drawn from ``rng``."""
    while True:
        state = rng.integers(0, 2**64, size=4, dtype=np.uint64)
        if np.any(state):
            return state


@kernel(nogil=True, inline="always")
def _rotl(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@kernel(nogil=True)
def next_u64(s):
    result = _rotl(s[1] * np.uint64(5), 7) * np.uint64(9)
    t = s[1] << np.uint64(17)
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= t
    s[3] = _rotl(s[3], 45)
    return result


@kernel(nogil=True)
def uniform(s):
    """Uniform on [0, 1) with 53 random bits."""
    return float(next_u64(s) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@kernel(nogil=True)
def uniform_open(s):
    """Uniform on (0, 1]."""
    return 1.0 - uniform(s)


@kernel(nogil=True)
def standard_normal(s):
    """Box-Muller: sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1]."""
    return math.sqrt(-2.0 * math.log(uniform_open(s))) * math.cos(2.0 * math.pi * uniform(s))


@kernel(nogil=True)
def below(s, n):
    """Uniform integer in 0 .. n-1 (n >= 1), by rejection (no modulo bias)."""
    un = np.uint64(n)
    limit = np.uint64(0xFFFFFFFFFFFFFFFF) - (np.uint64(0xFFFFFFFFFFFFFFFF) % un)
    while True:
        r = next_u64(s)
        if r < limit:
            return int(r % un)
