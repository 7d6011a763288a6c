"""BLAS threads while chains run side by side in threads.

NumPy's and SciPy's OpenBLAS run each call on as many threads as the machine has cores, and
numba's compiled log densities call them (``np.dot``, Cholesky factors, triangular solves).
With two chains in two threads, each chain's BLAS calls then spread over every core while the
other chain's do the same: four busy threads on two cores. Measured on this 2-core VM (the law
of the sum at p = 10 covariates and 10^6 records, 77 x 77 covariance matrices, 2 chains x
(200 + 200), one process's fits 1-3), 2026-12-02: in a busy period (the same script alternated
between the two figures over an hour with no change to the code) 19.7, 20.3 and 21.9 s of
sampling with OpenBLAS's own thread count, 5.0, 5.3 and 6.2 s with ``OPENBLAS_NUM_THREADS=1``,
and 5.3, 5.0 and 6.0 s with the limit below; in quiet periods the two are the same
(``benchmarks/bench_blas_threads.py``: 0.80 ms a leapfrog step with OpenBLAS's threads, 0.82
with the limit, a difference inside the fits' spread of 0.78-0.85).

:func:`blas_threads_for` gives each of the ``parallel`` chains its share of the cores
(threadpoolctl, which scikit-learn uses for the same purpose) while they run. A limit set
before OpenBLAS's first threaded product of the process did not hold for the first fit
(measured in the busy period: 20.9 s, the later fits 4.9 and 5.7 s); with one product of 300 x
300 matrices in each copy first, it held from the first fit (5.3 s). Why is not known (the
threads exist from import); so that product is made first, once a process (10-40 ms)."""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
from scipy.linalg import blas
from threadpoolctl import threadpool_limits

_STARTER = 300  # the side of the product measured to start OpenBLAS (dpinfer._blas's docstring)


@contextlib.contextmanager
def blas_threads_for(parallel: int):
    """BLAS limited to max(1, cores // ``parallel``) threads inside the block, where
    ``parallel`` threads each run a chain (no limit for one); restored after it."""
    if parallel <= 1:
        yield
        return
    _start_blas_threads()
    with threadpool_limits(limits=max(1, (os.cpu_count() or 1) // parallel), user_api="blas"):
        yield


@functools.cache
def _start_blas_threads() -> None:
    """One threaded product in NumPy's OpenBLAS and one in SciPy's (numba's compiled code calls
    SciPy's), so that both have started their threads before a limit is set."""
    a = np.ones((_STARTER, _STARTER), order="F")
    a @ a
    blas.dgemm(1.0, a, a)
