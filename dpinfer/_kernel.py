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

Several processes on one machine (pytest-xdist's workers, Dask's, a user's pool) that need the
same kernel before any has cached it would each compile it: a :func:`kernel` compiles a new
signature holding an advisory lock on a file beside its cache index (``fcntl.flock``), and
numba's compile looks in the on-disk cache again once it has the lock, so the first process
compiles and writes it and the others load it. Calls between kernels form a call graph without
cycles, so the locks, taken caller before callee, cannot deadlock; within a process numba's
compiler lock is taken first (threads compile one at a time, as numba already makes them) and a
kernel calling itself takes its own lock once. Where no lock file can be made (a read-only
install, a platform without ``fcntl``) kernels compile as plain numba's do.
"""

from __future__ import annotations

import contextlib
import os

import numba
from numba.core import sigutils, types
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher

try:
    import fcntl
except ImportError:  # not a POSIX system: no cross-process lock
    fcntl = None

_held: dict[str, int] = {}  # lock file -> its descriptor, for the locks this process holds


class _Kernel(CPUDispatcher):
    """numba's CPU dispatcher, with literal argument types widened before a call from compiled
    code is resolved (and compiled)."""

    def get_call_template(self, args, kws):
        return super().get_call_template(tuple(types.unliteral(a) for a in args),
                                         {k: types.unliteral(v) for k, v in kws.items()})

    def compile(self, sig):
        """numba's compile of ``sig``, a new signature under the cross-process lock of the
        module docstring (numba then loads it from the on-disk cache if another process wrote
        it meanwhile)."""
        args, _ = sigutils.normalize_signature(sig)
        if tuple(args) in self.overloads:
            return super().compile(sig)
        with global_compiler_lock, _compile_lock(self):
            return super().compile(sig)


@contextlib.contextmanager
def _compile_lock(dispatcher):
    """An exclusive ``flock`` on ``<cache index>.lock``, once per process however deeply
    nested; nothing where the file cannot be made."""
    try:
        path = dispatcher._cache._cache_file._index_path + ".lock"
    except AttributeError:  # caching off or another numba's layout
        path = None
    if fcntl is None or path is None or path in _held:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[path] = fd
        yield
    finally:
        _held.pop(path, None)
        os.close(fd)  # closing the descriptor releases the lock


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
