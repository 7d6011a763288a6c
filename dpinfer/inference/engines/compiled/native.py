"""numba glue for the compiled sampler: raw pointers, model functions called by address, and a
per-chain random stream.

Why not the obvious objects: a numba call that takes a ``cfunc`` object or a
``numpy.random.Generator`` spends 12-17 µs converting it on every call (measured), more than a
whole NUTS transition of a small model. The sampler calls its kernels once per iteration, so
it passes model functions as integer addresses (:func:`function_at`, 0.7 µs per call) and
carries its random state as four ``uint64`` words.

Random stream: xoshiro256** (D. Blackman, S. Vigna, "Scrambled linear pseudorandom number
generators", ACM TOMS 47(4), 2021), seeded from a ``numpy.random.Generator`` (all-zero state
excluded); uniforms from the top 53 bits, standard normals by the Box-Muller transform.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# Model functions (:mod:`dpinfer.inference.engines.compiled.model`) take an environment ``env``: an int64
# array holding the address of the chain's counts vector (m,) int64, then the address of each
# of the model's data arrays (CompiledModel.environment).
# log density and gradient of the continuous parameters given the latent counts:
#   logp = f(q, grad_out, env)  q (n,) float64, grad_out (n,) float64
LOGP_GRAD = types.float64(types.voidptr, types.voidptr, types.voidptr)
_LOGP_GRAD_TYPE = types.FunctionType(LOGP_GRAD)
# the counts' prior log pmf on a grid of candidates: f(q, env, grid, out, W, hoisted)
#   grid (d, W) int64 -> out (d, W) float64, d the latent's number of cells; ``hoisted`` the
#   address of an int64 array of buffer addresses (terms of the grid alone, computed once per
#   grid; see :class:`dpinfer.inference.engines.compiled.model.PriorTable`)
PRIOR_TABLE = types.void(types.voidptr, types.voidptr, types.voidptr, types.voidptr, types.intp,
                         types.voidptr)
_PRIOR_TABLE_TYPE = types.FunctionType(PRIOR_TABLE)
# the prior log pmf of one cell at one value: logp = f(q, env, cell, value)
PRIOR_POINT = types.float64(types.voidptr, types.voidptr, types.intp, types.int64)
_PRIOR_POINT_TYPE = types.FunctionType(PRIOR_POINT)


@intrinsic
def pointer(typingctx, address):
    """An integer address as a void pointer (numpy buffers handed to a cfunc)."""
    sig = types.voidptr(address)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))

    return sig, codegen


def _function_at(function_type):
    @intrinsic
    def function_at(typingctx, address):
        def codegen(context, builder, signature, args):
            value = cgutils.create_struct_proxy(function_type)(context, builder)
            void_ptr = context.get_value_type(types.voidptr)
            value.c_addr = builder.inttoptr(args[0], void_ptr)
            value.py_addr = void_ptr(None)
            value.jit_addr = void_ptr(None)
            return value._getvalue()

        return function_type(address), codegen

    return function_at


logp_grad_at = _function_at(_LOGP_GRAD_TYPE)
prior_table_at = _function_at(_PRIOR_TABLE_TYPE)
prior_point_at = _function_at(_PRIOR_POINT_TYPE)


# --- random stream ----------------------------------------------------------------------------
def new_stream(rng: np.random.Generator) -> np.ndarray:
    """A fresh xoshiro256** state drawn from ``rng``."""
    while True:
        state = rng.integers(0, 2**64, size=4, dtype=np.uint64)
        if np.any(state):
            return state


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def uniform(s):
    """Uniform on [0, 1) with 53 random bits."""
    return float(next_u64(s) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(cache=True, nogil=True)
def uniform_open(s):
    """Uniform on (0, 1]."""
    return 1.0 - uniform(s)


@numba.njit(cache=True, nogil=True)
def standard_normal(s):
    """Box-Muller: sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1]."""
    return math.sqrt(-2.0 * math.log(uniform_open(s))) * math.cos(2.0 * math.pi * uniform(s))


@numba.njit(cache=True, nogil=True)
def below(s, n):
    """Uniform integer in 0 .. n-1 (n >= 1), by rejection (no modulo bias)."""
    un = np.uint64(n)
    limit = np.uint64(0xFFFFFFFFFFFFFFFF) - (np.uint64(0xFFFFFFFFFFFFFFFF) % un)
    while True:
        r = next_u64(s)
        if r < limit:
            return int(r % un)
