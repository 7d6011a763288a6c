"""The decorator of dpinfer's compiled kernels: ``numba.njit(cache=True)``, one specialisation
per argument *types*.

numba compiles a function once per signature it is called with, and a call from other compiled
code types a constant argument (``f(x, 0)``, ``g(..., True)``, a module constant) as a literal:
one signature, hence one more compile, per value. Type inference also meets a variable that
starts at a constant (``total = 0``, then ``total += ...`` in a loop) first as that literal and
compiles the callee for it before it settles on int64. Each such specialisation is a whole
compile of the callee and of everything it calls that LLVM then inlines, and it goes to the
on-disk cache: a fresh install paid for them (with ``numba.njit``, 53 of the 188 signatures
that a workload of the test suite compiled were literal specialisations, and
``noise_gibbs._walk_out`` was compiled eight times). With this decorator,
``benchmarks/bench_kernel_compile.py`` measured 94.2 s of compile against 160.1 s, 250
signatures against 285 (benchmarks/README.md, "Kernel compile"). None is faster than its plain
version by more than a folded constant.

A :func:`kernel` is typed, when called from compiled code, with its arguments' plain types
(:func:`numba.core.types.unliteral`), so one compile serves every value. Calls from Python are
typed from values, never as literals, as before.
"""

from __future__ import annotations

import numba
from numba.core import types
from numba.core.registry import CPUDispatcher


class _Kernel(CPUDispatcher):
    """numba's CPU dispatcher, with literal argument types widened before a call from compiled
    code is resolved (and compiled)."""

    def get_call_template(self, args, kws):
        return super().get_call_template(tuple(types.unliteral(a) for a in args),
                                         {k: types.unliteral(v) for k, v in kws.items()})


def kernel(**options):
    """``numba.njit(cache=True, **options)`` for a function compiled once per argument types
    (module docstring). ``NUMBA_DISABLE_JIT`` leaves the function as it is, as numba's does."""

    def decorate(function):
        if numba.config.DISABLE_JIT:
            return function
        dispatcher = _Kernel(py_func=function, locals={},
                             targetoptions={"nopython": True, "boundscheck": None, **options})
        dispatcher.enable_caching()
        return dispatcher

    return decorate
