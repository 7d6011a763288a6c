"""numba glue for the compiled sampler: raw pointers and model functions called by address (the
per-chain random stream is :mod:`dpinfer._random_stream`).

Why not the obvious objects: a numba call that takes a ``cfunc`` object or a
``numpy.random.Generator`` spends 12-17 µs converting it on every call (measured), more than a
whole NUTS transition of a small model. The sampler calls its kernels once per iteration, so
it passes model functions as integer addresses (:func:`function_at`, 0.7 µs per call) and
carries its random state as four ``uint64`` words.
"""

from __future__ import annotations

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
# the same on a flat list of candidates: f(q, env, grid, rows, out, K, hoisted)
#   grid (K,) int64 candidates, rows (K,) int64 the cell of each -> out (K,) float64
PRIOR_FLAT = types.void(types.voidptr, types.voidptr, types.voidptr, types.voidptr, types.voidptr,
                        types.intp, types.voidptr)
_PRIOR_FLAT_TYPE = types.FunctionType(PRIOR_FLAT)
# the prior log pmf of one cell at one value: logp = f(q, env, cell, value)
PRIOR_POINT = types.float64(types.voidptr, types.voidptr, types.intp, types.int64)
_PRIOR_POINT_TYPE = types.FunctionType(PRIOR_POINT)

# a GroupedNegativeBinomial's parameters per group and cell: f(q, env, out), out (G * C, 3)
# float64 rows (alpha_g, A, M)
GROUP_MIXING = types.void(types.voidptr, types.voidptr, types.voidptr)
_GROUP_MIXING_TYPE = types.FunctionType(GROUP_MIXING)


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
prior_flat_at = _function_at(_PRIOR_FLAT_TYPE)
prior_point_at = _function_at(_PRIOR_POINT_TYPE)
group_mixing_at = _function_at(_GROUP_MIXING_TYPE)
