"""What a fresh install pays for numba's first compile of dpinfer's kernels, beside a baseline
commit: a selection of the test suite run in one fresh process with an empty kernel cache and an
empty model cache, numba's compile events timed (each kernel's own time, its nested compiles
subtracted), for this checkout and for ``--baseline`` (a git ref, checked out in a temporary
worktree). Prints per checkout the selection's wall time, the compile time and the number of
signatures compiled, then the kernels that cost most.

    .venv/bin/python benchmarks/bench_kernel_compile.py [--baseline REF] [--after-compile] [--top N] [TESTS ...]

``--after-compile`` runs the selection once more after ``dpinfer compile`` (dpinfer/warm_up.py)
in an emptied cache: what the set-up's compile takes, and what compiling is left to the tests.

Needs git for ``--baseline``; the two runs take a few minutes each (one after the other, so
that neither slows the other).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ["tests/test_inference.py", "tests/test_exact_counts.py", "tests/test_nested_sums.py",
             "tests/test_record_sums.py", "tests/test_truncated_laplace.py"]

CHILD = r'''
import collections, json, sys, time
from numba.core import event
own = collections.defaultdict(float); count = collections.Counter(); stack = []

class Timer(event.Listener):
    def on_start(self, ev):
        stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        start, nested = stack.pop()
        elapsed = time.perf_counter() - start
        f = ev.data["dispatcher"].py_func
        own[f"{f.__module__}.{f.__qualname__}"] += elapsed - nested
        count[f"{f.__module__}.{f.__qualname__}"] += 1
        if stack:
            stack[-1][1] += elapsed

event.register("numba:compile", Timer())
import pytest
t0 = time.perf_counter()
code = pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]])
print("RESULT " + json.dumps({"code": int(code), "wall": time.perf_counter() - t0, "own": own, "count": count}))
'''


def run(checkout: Path, tests: list, compile_first: bool = False) -> dict:
    """The selection in a fresh process on ``checkout``'s dpinfer, every cache empty; with
    ``compile_first``, after ``dpinfer compile`` (timed, in a fresh process of its own)."""
    for pattern in ("*.nbi", "*.nbc"):
        for f in (checkout / "dpinfer").rglob(pattern):
            f.unlink()
    with tempfile.TemporaryDirectory(prefix="dpinfer-bench-compile-") as cache:
        env = os.environ | {"DPINFER_CACHE_DIR": cache, "PYTHONPATH": str(checkout)}
        compiled = None
        if compile_first:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "from dpinfer.warm_up import warm_up; warm_up(force=True)"],
                           cwd=checkout, env=env, check=True, capture_output=True, timeout=3600)
            compiled = time.perf_counter() - t0
        out = subprocess.run([sys.executable, "-c", CHILD, *tests], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=3600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"the selection did not run on {checkout}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    if result["code"]:
        raise RuntimeError(f"tests failed on {checkout} (pytest exit {result['code']}):\n{out.stdout[-2000:]}")
    return result | {"compile_first": compiled}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a git ref to compare with (default: none)")
    parser.add_argument("--top", type=int, default=12, help="kernels listed (default 12)")
    parser.add_argument("--after-compile", action="store_true",
                        help="also run the selection after `dpinfer compile` in an emptied cache (both timed)")
    parser.add_argument("tests", nargs="*", default=SELECTION, help="pytest arguments (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top must be >= 1 (got {args.top})")
    if args.baseline and subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                                         f"{args.baseline}^{{commit}}"], capture_output=True).returncode:
        parser.error(f"--baseline {args.baseline!r} is not a commit of this repository")
    runs = {"this checkout": run(ROOT, args.tests)}
    if args.after_compile:
        runs["this checkout, after `dpinfer compile`"] = run(ROOT, args.tests, compile_first=True)
    if args.baseline:
        worktree = Path(tempfile.mkdtemp(prefix="dpinfer-baseline-"))
        try:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline],
                           check=True, capture_output=True, text=True)
            runs[f"baseline {args.baseline}"] = run(worktree, args.tests)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)
            shutil.rmtree(worktree, ignore_errors=True)
    print("| checkout | `dpinfer compile` first | selection wall | numba compile in it (own time) | signatures compiled in it |")
    print("|---|---:|---:|---:|---:|")
    for name, r in runs.items():
        first = "" if r["compile_first"] is None else f"{r['compile_first']:.1f} s"
        print(f"| {name} | {first} | {r['wall']:.1f} s | {sum(r['own'].values()):.1f} s | {sum(r['count'].values())} |")
    for name, r in runs.items():
        print(f"\n{name}: the {args.top} kernels that cost most (own time, signatures)")
        for kernel, t in sorted(r["own"].items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {t:6.1f} s  {r['count'][kernel]:3d}  {kernel}")


if __name__ == "__main__":
    main()
