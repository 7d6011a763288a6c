"""A county model against its oracle: dpinfer's ESS per second next to the same model fitted
to the confidential counts.

The demo's model and release (``dpinfer demo``): the American Indian population of the 102
counties of Illinois (1990 census), released with double geometric noise at epsilon = 0.25
conditioned on the state total; count_i ~ Poisson(population_i exp(mu + sigma z_i)),
z_i ~ N(0, 1), mu ~ N(-6, 2), sigma ~ HalfNormal(1).

Methods, all warm (each compiled by a first call that is not timed), 2 chains x (``--tune``
tuning + ``--draws`` draws), both chains in parallel on 2 cores:

* ``dpinfer.sample``: the compiled exact Gibbs engine (per stored draw, ``nuts_per_sweep``
  NUTS transitions of the parameters given the counts with ``counts_per_sweep`` exact draws of
  the counts on the state total given the parameters between them; the defaults 3 and 2, and
  each ``--schedules NUTS,COUNTS`` pair as its own line);
* oracle, nutpie: the model with the true counts observed, by nutpie (PyMC's default NUTS when
  nutpie is installed, as it is with dpinfer), compiled once and re-run;
* oracle, PyMC's NUTS: the same with ``pm.sample(nuts_sampler="pymc")``;
* optionally (``--old``) dpinfer's PyMC engine, ``method="marginal"`` (the counts summed out by
  convolution at every gradient, PyMC's NUTS): the engine this benchmark replaced.

Reported per run: seconds, min bulk ESS over (mu, sigma) and its rate, min bulk ESS over the
102 counts (dpinfer), divergences; then each method's median over ``--repeats`` runs with
different seeds, and dpinfer's (default) rate over each method's (goal: at least 1/3 of the
oracles').

Run:  .venv/bin/python benchmarks/bench_county.py [--repeats 5] [--draws 1000] [--schedules 3,1 1,1] [--old]
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm

import dpinfer as dp
from dpinfer.demo import county_model, load_midwest

HYPER = ["mu", "sigma"]


def illinois():
    data = load_midwest()
    data = data[data["state"] == "IL"].reset_index(drop=True)
    population = data["population"].to_numpy(float)
    truth = data["american_indian"].to_numpy(np.int64)
    mechanism = dp.Conditioned(dp.DoubleGeometric(epsilon=0.25), dp.Invariants.total(len(truth)))
    release = mechanism.release(truth, np.random.default_rng(2026))
    return data["county"].str.title().tolist(), population, truth, mechanism, release


def dpinfer_model(counties, population, mechanism, release):
    model, count = county_model(population, counties)
    with model:
        mechanism.observe("release", count, observed=release, dims="county")
    return model


def rates(idata, seconds, counts=True):
    ess = az.ess(idata, var_names=HYPER + (["count"] if counts else []), method="bulk")
    row = {"seconds": seconds, "min_ess_hyper": min(float(ess[v]) for v in HYPER)}
    row["ess_per_s"] = row["min_ess_hyper"] / seconds
    if counts:
        row["min_ess_counts"] = float(ess["count"].min())
    if "diverging" in idata.sample_stats:
        row["divergences"] = int(idata.sample_stats["diverging"].values.sum())
    return row


def run_dpinfer(model, draws, tune, seed, method="auto", **options):
    t0 = time.perf_counter()
    idata = dp.sample(draws, tune=tune, chains=2, cores=2, random_seed=seed, progressbar=False,
                      model=model, method=method, **options)
    return rates(idata, time.perf_counter() - t0)


def run_nutpie(compiled, draws, tune, seed):
    import nutpie

    t0 = time.perf_counter()
    idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=2, cores=2, seed=seed,
                          progress_bar=False)
    return rates(idata, time.perf_counter() - t0, counts=False)


def run_pymc_nuts(model, draws, tune, seed):
    t0 = time.perf_counter()
    with model:
        idata = pm.sample(draws, tune=tune, chains=2, cores=2, random_seed=seed, progressbar=False,
                          nuts_sampler="pymc", compute_convergence_checks=False)
    return rates(idata, time.perf_counter() - t0, counts=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--schedules", nargs="*", default=[], metavar="NUTS,COUNTS",
                        help="also time dpinfer with these nuts_per_sweep,counts_per_sweep")
    parser.add_argument("--old", action="store_true", help="also time method='marginal' (minutes)")
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    import nutpie

    counties, population, truth, mechanism, release = illinois()
    model = dpinfer_model(counties, population, mechanism, release)
    oracle_model, count = county_model(population, counties)
    oracle = pm.observe(oracle_model, {count: truth})
    compiled_oracle = nutpie.compile_pymc_model(oracle)

    # warm-ups: compile everything once (not timed)
    run_dpinfer(model, 100, 100, 0)
    run_nutpie(compiled_oracle, 100, 100, 0)
    run_pymc_nuts(oracle, 100, 100, 0)
    methods = {
        "dpinfer.sample (compiled exact Gibbs)": lambda s: run_dpinfer(model, args.draws, args.tune, s),
        "oracle: true counts, nutpie": lambda s: run_nutpie(compiled_oracle, args.draws, args.tune, s),
        "oracle: true counts, PyMC NUTS": lambda s: run_pymc_nuts(oracle, args.draws, args.tune, s),
    }
    for schedule in args.schedules:
        k, c = (int(v) for v in schedule.split(","))
        methods[f"dpinfer.sample(nuts_per_sweep={k}, counts_per_sweep={c})"] = (
            lambda s, k=k, c=c: run_dpinfer(model, args.draws, args.tune, s, nuts_per_sweep=k,
                                            counts_per_sweep=c))
    if args.old:
        old_model = dpinfer_model(counties, population, mechanism, release)
        run_dpinfer(old_model, 20, 20, 0, method="marginal")
        methods["dpinfer.sample(method='marginal') (PyMC NUTS, convolution)"] = (
            lambda s: run_dpinfer(old_model, args.draws, args.tune, s, method="marginal"))
    rows = []
    for repeat in range(args.repeats):
        for name, run in methods.items():
            row = run(1000 + repeat)
            row.update(method=name, repeat=repeat)
            rows.append(row)
            print(f"{name:60s} run {repeat}: {row['seconds']:7.2f} s, min ESS(mu, sigma) "
                  f"{row['min_ess_hyper']:6.0f}, {row['ess_per_s']:8.1f} ESS/s", flush=True)
    table = pd.DataFrame(rows)
    summary = table.groupby("method", sort=False).median(numeric_only=True).drop(columns="repeat")
    ours = summary.loc["dpinfer.sample (compiled exact Gibbs)", "ess_per_s"]
    summary["dpinfer / method"] = ours / summary["ess_per_s"]
    print(f"\nIllinois, 102 counties, 2 chains x ({args.tune} + {args.draws}), {os.cpu_count()} CPUs, "
          f"median of {args.repeats} runs:")
    print(summary.to_string(float_format=lambda v: f"{v:.3g}"))
    return table


if __name__ == "__main__":
    main()
