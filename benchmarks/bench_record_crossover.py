"""Where records='auto' should switch from data augmentation to the law of the sum (issue 39):
both methods side by side at few records, in effective draws per second of the parameters.

Cases from ``validation/record_sums_vs_augmentation.py`` (the same releases): the regression of
issue 39 with one covariate, and a clamped mean and variance (power sums of degree 2). For each
case, method and n, two fits of new model objects of the same release in one fresh process with
an empty model cache (DPINFER_CACHE_DIR a new directory; dpinfer's engine kernels compiled by
earlier runs): the first pays the compile of any structure not yet compiled, the second is what
a user pays after that. dp.sample's defaults (2 chains x 1000 + 1000 draws). ESS/s is the
second fit's smallest bulk ESS over the parameters (not the records) per second of dp.sample;
"verdict" is dp.sample's own (parameters and latents).

    .venv/bin/python benchmarks/bench_record_crossover.py [--sizes 10 30 100 300 1000] [--cases ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[4])
import arviz as az, numpy as np
import dpinfer as dp
from record_sums_vs_augmentation import CASES
case, n, method = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for fit in (1, 2):
    model, names = CASES[case](n)
    start = time.perf_counter()
    idata = dp.sample(random_seed=fit, progressbar=False, records=method, model=model)
    seconds = time.perf_counter() - start
    verdict = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    ess = az.ess(idata, var_names=names)
    print(json.dumps({"fit": fit, "seconds": seconds, "converged": verdict["converged"],
                      "min_ess": float(min(float(ess[v].min()) for v in names))}), flush=True)
'''
VALIDATION = Path(__file__).resolve().parent.parent / "validation"
DEFAULT_CASES = ("regression, p = 1", "clamped mean and variance (power sums)")


def run(case: str, n: int, method: str, cache: str) -> list[dict]:
    """The two fits (dicts) of ``case`` at ``n`` records by ``method`` in one fresh process."""
    out = subprocess.run([sys.executable, "-c", CHILD, case, str(n), method, str(VALIDATION)], capture_output=True,
                         text=True, env=os.environ | {"DPINFER_CACHE_DIR": cache}, timeout=3600)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 100, 300, 1000])
    sys.path.insert(0, str(VALIDATION))
    from record_sums_vs_augmentation import CASES

    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES), metavar="CASE",
                        help=f"one or more of {list(CASES)}")
    args = parser.parse_args(argv)
    if min(args.sizes) < 2:
        parser.error(f"--sizes must be at least 2 records each, got {args.sizes}")
    cache = tempfile.mkdtemp(prefix="dpinfer-bench-cache-")
    print("| case | n | data augmentation: first, again, ESS/s, verdict | law of the sum: first, again, ESS/s, verdict "
          "| law / augmentation ESS/s |")
    print("|---|---:|---|---|---:|")
    for case in args.cases:
        for n in args.sizes:
            cells, rates = [], []
            for method in ("data-augmentation", "law-of-the-sum"):
                first, again = run(case, n, method, cache)
                rate = again["min_ess"] / again["seconds"]
                rates.append(rate)
                verdict = "converged" if again["converged"] else "NOT converged"
                cells.append(f"{first['seconds']:.1f} s, {again['seconds']:.1f} s, {rate:.0f}, {verdict}")
            print(f"| {case} | {n:,} | {cells[0]} | {cells[1]} | {rates[1] / rates[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
