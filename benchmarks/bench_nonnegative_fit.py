"""Fit time of a release conditioned on non-negativity: the normaliser kept per count vector.

Seed 000's 2 x 23 sex-by-age table (models/sex_by_age_congenial/release.toml: double geometric
noise at epsilon 0.5 conditioned on three totals and a non-negative release) under the
``poisson-hierarchical`` template of ``dpinfer fit``. Its likelihood carries
log P(A e = 0, x + e >= 0), a function of the counts x alone, computed by convolutions over the
noise classes (dpinfer/lattice/class_convolution.py). NUTS evaluates the model many times per
transition of the parameters while x stays fixed, so dpinfer keeps the last value
(``_LogNormaliserOp``); the baseline here is the same Op computing it at every evaluation (the
behaviour before 2026-11-26), swapped in by this script.

Both are compiled by a warm-up call, then timed on ``--repeats`` runs each (2 chains x
(``--tune`` + ``--draws``) run one after the other in this process, so that the swapped Op is
the one sampled; PyMC engine with fibre moves). Printed: seconds, normaliser
computations, min bulk ESS of the counts and the parameters, ESS/s, ratio of the medians.

Run:  .venv/bin/python benchmarks/bench_nonnegative_fit.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd

import dpinfer as dp
from dpinfer.io.templates import poisson_hierarchical
from dpinfer.mechanisms import conditioned

RELEASE = Path(__file__).resolve().parents[1] / "models" / "sex_by_age_congenial" / "release.toml"
KEPT_PERFORM = conditioned._LogNormaliserOp.perform


def perform_every_time(self, node, inputs, output_storage):
    """The baseline: the normaliser computed at every evaluation."""
    x = np.asarray(inputs[0])
    value = self.mechanism.log_normaliser(x) if np.all(x >= 0) else np.inf
    output_storage[0][0] = np.asarray(value, dtype=np.float64)


def run(model, mechanism, args, seed):
    calls = {"n": 0}
    original = type(mechanism).log_normaliser

    def counted(self, true_values=None):
        calls["n"] += 1
        return original(self, true_values)

    type(mechanism).log_normaliser = counted
    try:
        start = time.perf_counter()
        idata = dp.sample(args.draws, tune=args.tune, chains=2, cores=1, random_seed=seed,
                          progressbar=False, model=model)
        seconds = time.perf_counter() - start
    finally:
        type(mechanism).log_normaliser = original
    ess = az.ess(idata, var_names=["counts", "mu", "sigma"])
    min_ess = min(float(ess[v].min()) for v in ("counts", "mu", "sigma"))
    return {"seconds": seconds, "normaliser computations": calls["n"], "min ESS": min_ess,
            "ESS/s": min_ess / seconds}


def measure(perform, args) -> pd.DataFrame:
    conditioned._LogNormaliserOp.perform = perform
    try:
        release = dp.read_release(RELEASE)
        model, _ = poisson_hierarchical(release)
        run(model, release.mechanism, argparse.Namespace(draws=20, tune=20), 0)  # compile
        return pd.DataFrame([run(model, release.mechanism, args, seed)
                             for seed in range(1, args.repeats + 1)])
    finally:
        conditioned._LogNormaliserOp.perform = KEPT_PERFORM


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--tune", type=int, default=200)
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    rows = {"baseline: normaliser at every evaluation": measure(perform_every_time, args),
            "dpinfer: normaliser kept per count vector": measure(KEPT_PERFORM, args)}
    table = pd.DataFrame({name: df.median() for name, df in rows.items()}).T
    with pd.option_context("display.width", 200, "display.max_columns", None,
                           "display.float_format", "{:.4g}".format):
        print(f"median of {args.repeats} runs, 2 chains x ({args.tune} + {args.draws}):")
        print(table)
    ratio = table["seconds"].iloc[0] / table["seconds"].iloc[1]
    print(f"\nwall time baseline / dpinfer = {ratio:.1f}x")


if __name__ == "__main__":
    main()
