"""dpinfer's kernel decorator: one compile per argument types, whatever constants a compiled
caller passes."""

import numba
import numpy as np
from numba.core import types

from dpinfer._kernel import kernel


@kernel(nogil=True)
def _scaled_sum(a, k):
    s = 0.0
    for i in range(a.size):
        s += a[i] * k
    return s


@numba.njit  # not cached: compiled here, so it types its calls of _scaled_sum every run
def _calls_with_constants(a):
    n = 0
    for _ in range(a.size):
        n += 1
    return _scaled_sum(a, 0) + _scaled_sum(a, 1) + _scaled_sum(a, n) + _scaled_sum(a, True)


def test_constants_from_compiled_code_share_one_compile():
    assert _calls_with_constants(np.arange(3.0)) == 0.0 + 3.0 + 9.0 + 3.0
    # plain numba.njit compiles Literal[int](0), Literal[int](1), int64 and Literal[bool](True)
    assert sorted(map(str, _scaled_sum.signatures)) == sorted(
        map(str, [(types.float64[::1], types.int64), (types.float64[::1], types.boolean)]))
