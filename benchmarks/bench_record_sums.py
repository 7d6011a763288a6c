"""The law of the sum against data augmentation on the privatised regression of issue 39: records
x ~ N(0, 1) (p covariates), y = 1 + x'b + N(0, 1) with b = 2 / sqrt(p) each, clamped to
[-5, 5], the regression statistic released with Laplace noise (epsilon 1, sensitivity that
of the clamped records' statistic: 25 per entry), beta ~ N(0, 5), 2 chains x 500 + 500 draws
(``--tune``, ``--draws``).
Each fit runs in a fresh Python process (a new model object, timed from outside): the first
figure with an empty compile cache (DPINFER_CACHE_DIR a new directory: what a first-time user
pays), then warm; at n = 10^6 warm, three fits in one process, each a new model object of new
data (the first pays the process's imports inside dp.sample: arviz is imported lazily). Prints
one row per fit: n, p, method, its place in its process, wall time of the process, dp.sample's
time, min ESS, max R-hat of beta, beta's posterior mean and sd, the normal law's measured error.

    .venv/bin/python benchmarks/bench_record_sums.py [--quick | --wide] [--tune 500] [--draws 500]

``--wide``: only p = 5 and p = 10 covariates at n = 10^6 by the law of the sum, three fits in
one fresh process with an empty compile cache (the first compiles the structure; the second and
third are what a user pays for each new model object after that).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)

CHILD = r'''
import json, sys, time
t0 = time.time()
sys.path.insert(0, sys.argv[5])  # benchmarks/: regression_release
import dpinfer as dp
import arviz as az
from regression_release import regression_model
n, p, method, fits = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tune, draws = int(sys.argv[6]), int(sys.argv[7])
for fit in range(fits):  # each fit a new model object of new data
    t1 = time.time()
    model = regression_model(n, p, 1 + fit)
    t2 = time.time()
    idata = dp.sample(draws, tune=tune, random_seed=1, progressbar=False, records=method, model=model)
    t3 = time.time()
    report = json.loads(idata.posterior.attrs["dpinfer"])["s"]
    conv = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    summary = az.summary(idata, var_names=["beta"], kind="diagnostics")
    post = idata.posterior["beta"]
    print(json.dumps({"sample_s": t3 - t2, "build_s": t2 - t1, "import_s": t1 - t0 if fit == 0 else 0.0,
                      "ess_beta": float(summary["ess_bulk"].min()), "rhat_beta": float(summary["r_hat"].max()),
                      "converged": conv["converged"], "min_ess_all": conv.get("min_ess_bulk"),
                      "mean": post.mean(("chain", "draw")).values.round(4).tolist(),
                      "sd": post.std(("chain", "draw")).values.round(4).tolist(),
                      "error": report.get("approximation_error", {}).get("max_abs_skewness_of_sum")}), flush=True)
'''


def run(n: int, p: int, method: str, cache: str, fits: int = 1, tune: int = 500, draws: int = 500) -> list[dict]:
    """``fits`` fits (new model objects of new data) in one fresh process: one dict each."""
    start = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(p), method, str(fits), HERE, str(tune), str(draws)],
                         capture_output=True,
                         text=True, env=os.environ | {"DPINFER_CACHE_DIR": cache}, timeout=3600)
    wall = time.time() - start
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return [json.loads(line) | {"wall_s": wall} for line in out.stdout.strip().splitlines() if line.startswith("{")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="fewer rows (p = 1 only, no 10^5)")
    group.add_argument("--wide", action="store_true", help="only p = 5 and 10 at n = 10^6")
    parser.add_argument("--tune", type=int, default=500, help="tuning iterations per chain (default 500)")
    parser.add_argument("--draws", type=int, default=500, help="draws per chain (default 500)")
    args = parser.parse_args(argv)
    quick = args.quick
    cache = tempfile.mkdtemp(prefix="dpinfer-bench-cache-")
    if args.wide:
        rows = [(10**6, p, "law-of-the-sum", "cold, then warm", 3) for p in (5, 10)]
        _print(rows, cache, args.tune, args.draws)
        return
    rows = [(10**6, 1, "law-of-the-sum", "cold", 1)]
    rows += [(n, 1, "law-of-the-sum", "warm", 1) for n in ((10**4,) if quick else (10**4, 10**5))]
    rows += [(10**6, 1, "law-of-the-sum", "warm", 3)]
    rows += [(10**4, 1, "data-augmentation", "cold", 1)]
    if not quick:
        rows += [(10**4, 1, "data-augmentation", "warm", 1)]
        rows += [(10**5, 5, "law-of-the-sum", "cold", 1), (10**5, 5, "law-of-the-sum", "warm", 1)]
    _print(rows, cache, args.tune, args.draws)


def _print(rows: list, cache: str, tune: int, draws: int) -> None:
    print(f"2 chains x ({tune} tuning + {draws} draws) per fit\n")
    print("| n | p | method | cache | fit in its process | process wall | dp.sample | min ESS beta | max R-hat beta "
          "| verdict | beta mean | beta sd | sum's skewness |")
    print("|---:|---:|---|---|---|---:|---:|---:|---:|---|---|---|---:|")
    for n, p, method, state, fits in rows:
        for k, r in enumerate(run(n, p, method, cache, fits, tune, draws), 1):
            skew = f"{r['error']:.4f}" if r["error"] is not None else ""
            print(f"| {n:,} | {p} | {method} | {state} | {k} of {fits} | {r['wall_s']:.1f} s | {r['sample_s']:.1f} s "
                  f"| {r['ess_beta']:.0f} | {r['rhat_beta']:.3f} | {'converged' if r['converged'] else 'NOT converged'} "
                  f"| {r['mean']} | {r['sd']} | {skew} |", flush=True)


if __name__ == "__main__":
    main()
