"""Fit county counts released with noise conditioned on each state's total.

    .venv/bin/python models/midwest_state_totals/fit.py            # Illinois populations (102 counties)
    .venv/bin/python models/midwest_state_totals/fit.py --states all
    .venv/bin/python models/midwest_state_totals/fit.py --counts american_indian --states all

Populations: population_i ~ Poisson(exp(log_rate_i)), log_rate_i ~ N(mu_state, sigma), mu ~ N(10, 3),
sigma ~ HalfNormal(2) (centred: the data pin each log_rate_i, a non-centred z_i would make a
ridge along mu + sigma z_i); the release is p(s | x) = prod_i f(s_i - x_i) / P(sum e = 0) on
{x : state totals of x = state totals of s}, f double geometric with epsilon = 0.192.
American Indian counts (small; non-negativity binds): the demo's model,
count_i ~ Poisson(population_i exp(mu + sigma z_i)), with the same release law.
dpinfer sums the counts out exactly by convolution over each state (NUTS on mu, sigma, log_rate)
and draws them exactly on the fibre for every posterior draw.
"""

import argparse
import os
import time
from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm

import dpinfer as dp
from dpinfer.demo import county_model, load_midwest
from dpinfer.utility.baselines import (
    noise_only_intervals,
    nonnegative_least_squares,
    round_to_invariants,
)

HERE = Path(__file__).parent
EPSILON = 0.192


def population_model(data: pd.DataFrame) -> tuple[pm.Model, object]:
    states, state_index = np.unique(data["state"], return_inverse=True)
    coords = {"county": data["county"] + ", " + data["state"], "state": states}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", 10.0, 3.0, dims="state")
        sigma = pm.HalfNormal("sigma", 2.0)
        log_rate = pm.Normal("log_rate", mu[state_index], sigma, dims="county")
        population = pm.Poisson("population", pm.math.exp(log_rate), dims="county")
    return model, population


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--states", default="IL", help="comma-separated states, or 'all'")
    parser.add_argument("--counts", default="population", choices=["population", "american_indian"])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes for the 2 chains (default: 2 if there are 2 CPUs; PyMC's "
                             "own default assumes hyper-threading and would run 1 on 2 CPUs)")
    args = parser.parse_args(argv)
    data = pd.read_csv(HERE / f"release_{args.counts}.csv")
    if args.states != "all":
        data = data[data["state"].isin(args.states.split(","))].reset_index(drop=True)
    mechanism = dp.Conditioned(dp.DoubleGeometric(EPSILON), dp.Invariants.groups(data["state"]))
    if args.counts == "population":
        model, counts = population_model(data)
    else:
        model, counts = county_model(data["population"].to_numpy(float),
                                     (data["county"] + ", " + data["state"]).tolist())
    start = time.perf_counter()
    with model:
        mechanism.observe("release", counts, data["release"].to_numpy(), dims="county")
        idata = dp.sample(args.draws, random_seed=args.seed, cores=args.cores)
    elapsed = time.perf_counter() - start
    print(f"\nfitted {len(data)} counties of {sorted(set(data['state']))} in {elapsed:.0f} s")
    print(az.summary(idata, var_names=["mu", "sigma"], ci_prob=0.9, ci_kind="eti").to_string())

    draws = idata.posterior[counts.name]
    lo, med, hi = (draws.quantile(q, dim=("chain", "draw")).values for q in (0.05, 0.5, 0.95))
    groups = data["state"].to_numpy()
    point = round_to_invariants(nonnegative_least_squares(data["release"].to_numpy(), groups=groups),
                                groups=groups)
    base_lo, base_hi = noise_only_intervals(point, mechanism.base, 0.9)
    table = data[["county", "state", "release"]].assign(
        post_processed=point,
        median=med.astype(int), lower90=lo.astype(int), upper90=hi.astype(int),
        baseline_lower90=base_lo.astype(int), baseline_upper90=base_hi.astype(int),
    )
    print("\nPosterior of the true counts, median and 90% interval, next to the baseline (the "
          "non-negative least-squares projection, rounded, ± the noise's 90% interval); the 12 "
          "smallest releases:")
    print(table.sort_values("release").head(12).to_string(index=False))
    # the confidential counts are public here (1990 census extract), so coverage can be shown
    truth = data[["pid"]].merge(load_midwest(), on="pid", how="left")[args.counts].to_numpy()
    cover = np.mean((lo <= truth) & (truth <= hi))
    base_cover = np.mean((base_lo <= truth) & (truth <= base_hi))
    print(f"\n90% intervals: dpinfer covers {cover:.1%} of the true counts, mean width "
          f"{np.mean(hi - lo):.1f}; baseline covers {base_cover:.1%}, width {np.mean(base_hi - base_lo):.1f}")
    codes, states = pd.factorize(data["state"])
    draw_totals = np.stack([draws.values[..., codes == g].sum(-1) for g in range(len(states))], -1)
    release_totals = data.groupby("state", sort=False)["release"].sum().to_numpy()
    print("every draw keeps each state's total:", bool(np.all(draw_totals == release_totals)))


if __name__ == "__main__":
    main()
