"""Run one measurement of a benchmark script in a fresh Python process (cold: a new
interpreter, numba's kernel cache and the model cache as they are) and collect its result.

The script is called again as ``python <script> --_child <args>``; its child prints one line
``RESULT <json>``, which :func:`child_result` parses."""

from __future__ import annotations

import json
import subprocess
import sys


def report(row: dict) -> None:
    """What a child prints: the line :func:`child_result` reads."""
    print("RESULT " + json.dumps(row), flush=True)


def child_result(script: str, args: list, what: str) -> dict:
    """Run ``script --_child *args`` in a fresh process; its ``RESULT`` row, echoed. Stops with
    the child's stderr, naming ``what``, if it failed or printed no result."""
    done = subprocess.run([sys.executable, script, "--_child", *map(str, args)], capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        print(done.stderr[-3000:])
        raise SystemExit(f"{what} failed (exit {done.returncode})")
    row = json.loads(lines[-1][len("RESULT "):])
    print(json.dumps(row), flush=True)
    return row
