"""The nation on one machine: a county table of the whole US, and the time-against-cells curve.

Synthetic data shaped like the US county table: 3,143 counties in the 50 states and DC, with
each state's number of counties as in the 2010 census
(``COUNTIES_PER_STATE``), county populations log-normal (median 26,000, log sd 1.3, clipped to
[90, 10^7], like the real ones), and a small subgroup: rate exp(mu_state + sigma z_i) with
mu_state ~ N(-5, 0.6), sigma = 0.6, so that most counts are small (median about 150, a
quarter below 50, many below 10). The counts are released with double geometric noise,
epsilon = 0.25, conditioned on every state's total (the state totals are invariant).

Model (hierarchical Poisson, centred, as suits counts this informative: a median count of
140 pins each county's log rate to about 0.1, and the non-centred form, tried first, made NUTS
take 255 leapfrog steps per draw at step size 0.016 because mu_state, sigma and the county
effects are then strongly correlated):
    mu0 ~ N(-5, 2), tau ~ HalfNormal(1), mu_state ~ N(mu0, tau),
    sigma ~ HalfNormal(1), log_rate_i ~ N(mu_state(i), sigma),
    x_i ~ Poisson(population_i exp(log_rate_i))
(one state: mu ~ N(-5, 2) without mu0 and tau),
fitted with ``dpinfer.sample`` (2 chains x (1000 tuning + 1000 draws), both chains in
parallel), cold: a new process, so every model function is compiled in the timed call (the
numba kernels of the sampler come from numba's disk cache after their first compilation on the
machine; ``--cold-kernels`` clears that cache first to time a fresh machine).

Reported per size: cells, states, seconds (compilation and sampling), peak memory of the
process (resident set), min bulk ESS over the hyperparameters (mu0, tau, sigma), over the
states' mu and over every count (with the slowest count's posterior mean and how many counts
have ESS below 400), and the largest R-hat over the parameters. The curve runs 100 cells (one state), 3,143 (the
nation) and 30,000 (each county split into about 10 tract-sized cells, still grouped by state).

Run:  .venv/bin/python benchmarks/bench_nation.py [--sizes 100 3143 30000] [--cold-kernels]
Each size runs in its own subprocess (cold, and its memory measured alone).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

# Counties (and county equivalents) per state in the 2010 census, 50 states + DC (3,143).
COUNTIES_PER_STATE = {
    "AL": 67, "AK": 29, "AZ": 15, "AR": 75, "CA": 58, "CO": 64, "CT": 8, "DE": 3, "DC": 1,
    "FL": 67, "GA": 159, "HI": 5, "ID": 44, "IL": 102, "IN": 92, "IA": 99, "KS": 105, "KY": 120,
    "LA": 64, "ME": 16, "MD": 24, "MA": 14, "MI": 83, "MN": 87, "MS": 82, "MO": 115, "MT": 56,
    "NE": 93, "NV": 17, "NH": 10, "NJ": 21, "NM": 33, "NY": 62, "NC": 100, "ND": 53, "OH": 88,
    "OK": 77, "OR": 36, "PA": 67, "RI": 5, "SC": 46, "SD": 66, "TN": 95, "TX": 254, "UT": 29,
    "VT": 14, "VA": 134, "WA": 39, "WV": 55, "WI": 72, "WY": 23,
}
EPSILON = 0.25


def synthetic_table(n_cells: int, seed: int = 2026):
    """(populations, true counts, state codes) for ``n_cells`` cells: 100 -> one state of 100
    counties; 3143 -> the nation; more -> every county split into tract-sized cells."""
    rng = np.random.default_rng(seed)
    sizes = np.array(list(COUNTIES_PER_STATE.values()))
    assert sizes.sum() == 3143
    if n_cells <= 3143:
        if n_cells == 3143:
            states = np.repeat(np.arange(len(sizes)), sizes)
        else:
            states = np.zeros(n_cells, np.int64)
    else:
        per_county = rng.multinomial(n_cells - 3143, np.full(3143, 1 / 3143)) + 1
        states = np.repeat(np.repeat(np.arange(len(sizes)), sizes), per_county)
    n_states = states.max() + 1
    population = np.clip(np.exp(rng.normal(np.log(26_000), 1.3, size=states.size)), 90, 1e7)
    if n_cells > 3143:
        population = np.maximum(population / 10.0, 20.0)  # tract-sized
    mu_state = rng.normal(-5.0, 0.6, size=n_states)
    rate = population * np.exp(mu_state[states] + 0.6 * rng.standard_normal(states.size))
    return population, rng.poisson(rate), states


def build(n_cells: int):
    import pymc as pm

    import dpinfer as dp

    population, truth, states = synthetic_table(n_cells)
    n_states = int(states.max() + 1)
    invariants = dp.Invariants.groups(states) if n_states > 1 else dp.Invariants.total(len(truth))
    mechanism = dp.Conditioned(dp.DoubleGeometric(epsilon=EPSILON), invariants)
    release = mechanism.release(truth, np.random.default_rng(7))
    with pm.Model(coords={"cell": np.arange(len(truth)), "state": np.arange(n_states)}) as model:
        if n_states > 1:
            mu0 = pm.Normal("mu0", -5.0, 2.0)
            tau = pm.HalfNormal("tau", 1.0)
            mu = pm.Normal("mu", mu0, tau, dims="state")
        else:
            mu = pm.Normal("mu", -5.0, 2.0, dims="state")
        sigma = pm.HalfNormal("sigma", 1.0)
        log_rate = pm.Normal("log_rate", mu[states], sigma, dims="cell")
        x = pm.Poisson("x", population * pm.math.exp(log_rate), dims="cell")
        mechanism.observe("release", x, observed=release, dims="cell")
    return model, truth, release


def hyperparameters(model) -> list:
    return [v for v in ("mu0", "tau", "sigma") if v in model.named_vars]


def one_size(n_cells: int, draws: int, tune: int) -> dict:
    import arviz as az

    import dpinfer as dp

    t0 = time.perf_counter()
    model, truth, release = build(n_cells)
    built = time.perf_counter() - t0
    idata = dp.sample(draws, tune=tune, chains=2, cores=2, random_seed=1, progressbar=False, model=model)
    seconds = time.perf_counter() - t0
    hyper = hyperparameters(model)
    ess = az.ess(idata, var_names=hyper + ["mu", "x"], method="bulk")
    rhat = az.rhat(idata, var_names=hyper + ["mu", "log_rate"])
    draws_x = idata.posterior["x"].values.reshape(-1, len(truth))
    lo, hi = np.quantile(draws_x, [0.05, 0.95], axis=0)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    return {
        "cells": n_cells,
        "states": int(model["mu"].shape.eval()[0]),
        "seconds": round(seconds, 1),
        "sampling_seconds": round(float(idata.posterior.attrs["sampling_time"]), 1),
        "build_seconds": round(built, 1),
        "peak_memory_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0),
        "min_ess_hyper": round(min(float(ess[v]) for v in hyper)),
        "min_ess_state_mu": round(float(ess["mu"].min())),
        "min_ess_counts": round(float(ess["x"].min())),
        # the slowest count's posterior mean: small counts near 0 mix slowest
        "slowest_count_mean": round(float(draws_x[:, int(ess["x"].argmin())].mean()), 2),
        "counts_ess_below_400": int((ess["x"] < 400).sum()),
        "max_rhat": round(max(float(rhat[v].max()) for v in hyper + ["mu", "log_rate"]), 4),
        "divergences": int(idata.sample_stats["diverging"].values.sum()),
        "coverage_90": round(float(np.mean((lo <= truth) & (truth <= hi))), 3),
        "totals_exact": bool(np.all(draws_x.sum(axis=1) == release.sum())),
        "engine": report["engine"],
        "held_cells_after_tuning": report["held_cells_after_tuning"],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 3143, 30000])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--cold-kernels", action="store_true",
                        help="clear numba's cache of dpinfer's kernels first (a fresh machine)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # run one size, print JSON
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_size(args.one, args.draws, args.tune)))
        return
    import pandas as pd

    rows = []
    for n in args.sizes:
        if args.cold_kernels:
            from pathlib import Path

            import dpinfer

            for path in Path(dpinfer.__file__).parent.rglob("*.nb[ic]"):
                path.unlink()
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--draws", str(args.draws),
                              "--tune", str(args.tune)], capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    table = pd.DataFrame(rows).set_index("cells")
    print(f"\n2 chains x ({args.tune} + {args.draws}), epsilon {EPSILON}, state totals invariant, cold "
          f"process{' and kernels' if args.cold_kernels else ''}:")
    print(table.to_string())


if __name__ == "__main__":
    main()
