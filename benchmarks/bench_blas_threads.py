"""BLAS threads while two chains run side by side (dpinfer._blas): dp.sample as it is, beside the
same fits with OpenBLAS left at its own thread count (as before the limit), each setting in
fresh processes, alternating, in one run.

The case: the privatised regression of issue 39 by the law of the sum (records x ~ N(0, 1), p
covariates, y = 1 + x'b + N(0, 1), clamped to [-5, 5], the regression statistic released with
Laplace noise at epsilon 1; beta ~ N(0, 5)), whose log density factors a d x d covariance
matrix at every gradient (d = 77 at p = 10). Each process fits ``--fits`` new model objects (2
chains x (``--tune`` + ``--draws``), seeds 1, 2, ...) with the user's compile cache (warm after
the first run of this structure). Prints per fit: dp.sample's wall time, the chains' sampling
time and their leapfrog steps; then the median sampling time per step of each setting over
every fit after each process's first, and their ratio.

    .venv/bin/python benchmarks/bench_blas_threads.py [--n 1000000] [--p 10] [--fits 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)

CHILD = r'''
import contextlib, json, sys, time, warnings
sys.path.insert(0, sys.argv[7])  # benchmarks/: regression_release
import dpinfer as dp
import dpinfer.inference.sample as sampling
from regression_release import regression_model
n, p, fits, tune, draws, setting = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                    int(sys.argv[5]), sys.argv[6])
if setting == "default-threads":  # dpinfer before the limit: OpenBLAS's own thread count
    sampling.blas_threads_for = lambda parallel: contextlib.nullcontext()
warnings.simplefilter("ignore")
for fit in range(fits):
    model = regression_model(n, p, 1 + fit)
    t = time.perf_counter()
    idata = dp.sample(draws, tune=tune, chains=2, cores=2, random_seed=1 + fit, progressbar=False,
                      records="law-of-the-sum", model=model)
    stats = idata.sample_stats
    print(json.dumps({"fit": fit + 1, "dp.sample": time.perf_counter() - t,
                      "sampling": stats.attrs["sampling_time"], "steps": int(stats["n_steps"].values.sum())}),
          flush=True)
'''

SETTINGS = ("dpinfer", "default-threads")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=positive, default=1_000_000, help="records (default 10^6)")
    parser.add_argument("--p", type=positive, default=10, help="covariates (default 10)")
    parser.add_argument("--fits", type=positive, default=3, help="new model objects per process (default 3)")
    parser.add_argument("--rounds", type=positive, default=2, help="processes per setting, alternating (default 2)")
    parser.add_argument("--tune", type=positive, default=200)
    parser.add_argument("--draws", type=positive, default=200)
    args = parser.parse_args()
    per_step = {s: [] for s in SETTINGS}
    print(f"n = {args.n:,}, p = {args.p}, 2 chains x ({args.tune} + {args.draws}), {args.fits} fits per process")
    print(f"{'setting':<16} {'round':>5} {'fit':>3} {'dp.sample s':>11} {'sampling s':>10} {'steps':>7}")
    for r in range(1, args.rounds + 1):
        for setting in SETTINGS:
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.n), str(args.p), str(args.fits),
                                  str(args.tune), str(args.draws), setting, HERE], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"the {setting} process failed:\n{out.stderr[-3000:]}")
            for row in (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")):
                print(f"{setting:<16} {r:>5} {row['fit']:>3} {row['dp.sample']:>11.2f} {row['sampling']:>10.2f} "
                      f"{row['steps']:>7,}", flush=True)
                if row["fit"] > 1 or args.fits == 1:
                    per_step[setting].append(row["sampling"] / row["steps"])
    medians = {s: statistics.median(v) for s, v in per_step.items()}
    print("median sampling ms per leapfrog step (fits after each process's first): "
          + ", ".join(f"{s} {1000 * m:.3f}" for s, m in medians.items())
          + f"; default threads / dpinfer = {medians['default-threads'] / medians['dpinfer']:.2f}")


if __name__ == "__main__":
    main()
