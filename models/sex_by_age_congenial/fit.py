"""Fit seed 000's 2 x 23 sex-by-age table from its congenial release (Table 1).

    .venv/bin/python models/sex_by_age_congenial/fit.py
    .venv/bin/python models/sex_by_age_congenial/fit.py --compare   # also the fit that ignores non-negativity

The release (reference note 000 §4.1) is double geometric noise with epsilon = 0.5 per cell,
conditioned on the total, the female total, the voting-age (18+) total and a non-negative
release: p(s | x) = prod_i f(s_i - x_i) / P(A e = 0, x + e >= 0), whose normaliser depends on
the true counts x. Model: x_{sex, age} ~ Poisson(years_age * exp(mu + male * delta + gamma_age)),
gamma_age = sigma * z_age (non-centred: 46 small counts inform sigma weakly). dpinfer updates x
by Metropolis-corrected blocks of exact line moves on the fibre of the three invariants (the
normaliser is exact, by convolution over the four sex x voting-age classes), NUTS the rest.
The confidential table (simulated by the paper's authors) is used only to score the fit.
"""

import argparse
import json
import os
import time
from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm

import dpinfer as dp

HERE = Path(__file__).parent
EPSILON = 0.5  # per cell, the unconstrained mechanism's (seed 000 §3.2); the release is (1 + gamma) 0.5-DP


def invariants(data: pd.DataFrame) -> dp.Invariants:
    """Total, female total and voting-age total (cells in the CSV's order)."""
    adult = ~data["age"].isin(["<5", "5-9", "10-14", "15-17"]).to_numpy()
    female = (data["sex"] == "female").to_numpy()
    return dp.Invariants.from_matrix(np.vstack([np.ones(len(data)), female, adult]).astype(int))


def table_model(data: pd.DataFrame, mechanism: dp.Conditioned) -> pm.Model:
    ages = data["age"].unique().tolist()
    age_index = data["age"].map(ages.index).to_numpy()
    male = (data["sex"] == "male").to_numpy(float)
    coords = {"cell": (data["sex"] + " " + data["age"]).tolist(), "age": ages}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        delta = pm.Normal("delta", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="age")
        rate = data["age_years"].to_numpy(float) * pm.math.exp(mu + male * delta + sigma * z[age_index])
        counts = pm.Poisson("counts", rate, dims="cell")
        mechanism.observe("release", counts, data["release"].to_numpy(), dims="cell")
    return model


def fit(data, mechanism, args):
    start = time.perf_counter()
    with table_model(data, mechanism):
        idata = dp.sample(args.draws, tune=args.tune, random_seed=args.seed, cores=args.cores,
                          target_accept=0.95)
    return idata, time.perf_counter() - start


def score(name, idata, data, elapsed) -> dict:
    draws = idata.posterior["counts"]
    lo, mean, hi = (draws.quantile(0.05, dim=("chain", "draw")).values, draws.mean(("chain", "draw")).values,
                    draws.quantile(0.95, dim=("chain", "draw")).values)
    truth = data["confidential"].to_numpy()
    small = truth <= 3
    return {
        "fit": name,
        "seconds": round(elapsed),
        "covered_90": f"{int(np.sum((lo <= truth) & (truth <= hi)))}/{truth.size}",
        "mean_width_90": round(float(np.mean(hi - lo)), 2),
        "mean_abs_error": round(float(np.mean(np.abs(mean - truth))), 3),
        "mean_error_small_cells": round(float(np.mean((mean - truth)[small])), 3),
        "n_small_cells": int(small.sum()),
    }, (lo, mean, hi)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--compare", action="store_true",
                        help="also fit with the equality-only likelihood (ignoring non-negativity)")
    args = parser.parse_args(argv)
    data = pd.read_csv(HERE / "release.csv")
    inv = invariants(data)
    release = data["release"].to_numpy()
    assert np.all(inv.values(release) == inv.values(data["confidential"].to_numpy()))
    base = dp.DoubleGeometric(EPSILON)
    mechanism = dp.Conditioned(base, inv, nonnegative=True)
    print(f"mechanism: {mechanism.privacy}")

    idata, elapsed = fit(data, mechanism, args)
    report = json.loads(idata.posterior.attrs["dpinfer"])["counts"]
    print(f"\nfitted the 2 x 23 table in {elapsed:.0f} s; non-negativity: "
          f"{json.dumps(report['nonnegativity'], indent=1)}")
    print(az.summary(idata, var_names=["mu", "delta", "sigma"], ci_prob=0.9, ci_kind="eti").to_string())
    rows, (lo, mean, hi) = score("dpinfer (invariants + non-negativity)", idata, data, elapsed)
    scores = [rows]
    naive_lo, naive_hi = base.release_interval(release, 0.9)
    truth = data["confidential"].to_numpy()
    scores.append({
        "fit": "release +- base noise 90% interval",
        "covered_90": f"{int(np.sum((naive_lo <= truth) & (truth <= naive_hi)))}/{truth.size}",
        "mean_width_90": round(float(np.mean(naive_hi - naive_lo)), 2),
        "mean_abs_error": round(float(np.mean(np.abs(release - truth))), 3),
        "mean_error_small_cells": round(float(np.mean((release - truth)[truth <= 3])), 3),
        "n_small_cells": int((truth <= 3).sum()),
    })
    if args.compare:
        idata_eq, elapsed_eq = fit(data, dp.Conditioned(base, inv), args)
        scores.append(score("equality-only likelihood (ignores non-negativity)", idata_eq, data, elapsed_eq)[0])
    print("\n" + pd.DataFrame(scores).to_string(index=False))
    table = data[["sex", "age", "release", "confidential"]].assign(
        post_mean=mean.round(2), lo90=lo.astype(int), hi90=hi.astype(int))
    print("\n" + table.to_string(index=False))


if __name__ == "__main__":
    main()
