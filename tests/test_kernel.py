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


_MODULE = '''
from dpinfer._kernel import kernel

@kernel()
def triple(x):
    return 3 * x
'''

_CALLER = '''
import sys
sys.path.insert(0, {root!r})
import tripled
assert tripled.triple(5) == 15
print(sum(tripled.triple._cache_hits.values()), sum(tripled.triple._cache_misses.values()))
'''


def test_a_process_waits_for_another_compiling_the_kernel_then_loads_it(tmp_path):
    """Two processes needing the same uncached kernel: the second waits on the compile lock
    while the first compiles and caches it, then loads it instead of compiling (a cache hit)."""
    import subprocess
    import sys
    import time

    from dpinfer._kernel import _compile_lock

    (tmp_path / "tripled.py").write_text(_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import tripled
        with _compile_lock(tripled.triple):  # this process holds the lock: the other must wait
            other = subprocess.Popen([sys.executable, "-c", _CALLER.format(root=str(tmp_path))],
                                     stdout=subprocess.PIPE, text=True)
            time.sleep(3.0)
            assert other.poll() is None, "the other process compiled without the lock"
            assert tripled.triple(5) == 15  # compiled and cached here, under the lock
            assert sum(tripled.triple._cache_misses.values()) == 1
        out, _ = other.communicate(timeout=120)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tripled", None)
    assert other.returncode == 0
    assert out.split() == ["1", "0"]  # loaded from the cache this process wrote, not compiled
