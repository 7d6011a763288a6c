"""dp.fit_many on a Dask LocalCluster with 1, 2 and 4 workers: wall time and speedup.

A replication study of a county-sized model: 100 synthetic counties (populations
exp(N(10, 1)), true counts from the demo's hierarchical Poisson model with mu = -6,
sigma = 0.3), released ``--fits`` times with fresh double geometric noise (epsilon = 0.25)
conditioned on the state total; each replication is fitted with the demo's model
(:func:`dpinfer.demo.county_model`; dpinfer's compiled engine: counts drawn exactly on the
total, NUTS on mu, sigma, z). All jobs share one ``model_key``, so each worker builds and
compiles the model once (its warm-up: importing dpinfer and compiling the model, ~10-30 s)
and then only sets the new release with ``pm.set_data``.

For each number of workers (``threads_per_worker=1``, one process each) the table gives the
wall time of ``fit_many`` (workers start cold: warm-up included), fits per minute, the
speedup against 1 worker, the mean warm-up (first fit of each worker) and the median time of
the other fits. Fits use the same seeds in every run, and the script checks that the draws
are identical whatever the number of workers.

    .venv/bin/python benchmarks/bench_dask.py [--fits 16] [--workers 1 2 4] [--draws 1000] [--tune 1000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pymc as pm
import xarray as xr
from distributed import Client, LocalCluster

import dpinfer as dp
from dpinfer.demo import county_model

N_COUNTIES, EPSILON, MU, SIGMA = 100, 0.25, -6.0, 0.3
MECHANISM = dp.Conditioned(dp.DoubleGeometric(EPSILON), dp.Invariants.total(N_COUNTIES))


def build(population: np.ndarray, release: np.ndarray) -> pm.Model:
    """The demo's county model with ``release`` observed as pm.Data (set per replication)."""
    model, count = county_model(population, np.arange(len(population)))
    with model:
        MECHANISM.observe("release", count, observed=pm.Data("release_data", release))
    return model


def replications(n_fits: int, draws: int, tune: int, chains: int, seed: int) -> list[dp.FitJob]:
    rng = np.random.default_rng(seed)
    population = np.round(np.exp(rng.normal(10.0, 1.0, N_COUNTIES)))
    truth = rng.poisson(population * np.exp(MU + SIGMA * rng.normal(size=N_COUNTIES)))
    releases = [MECHANISM.release(truth, rng) for _ in range(n_fits)]
    return [dp.FitJob(f"rep{i:03d}", partial(build, population, releases[0]),
                      {"draws": draws, "tune": tune, "chains": chains, "random_seed": seed + i},
                      data={"release_data": release}, model_key="county")
            for i, release in enumerate(releases)]


def run(jobs: list[dp.FitJob], n_workers: int, out_dir: Path) -> dict:
    start = time.perf_counter()
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        started = time.perf_counter()
        table = dp.fit_many(jobs, out_dir, executor=client, progressbar=False)
        wall = time.perf_counter() - started
    first = table[~table["model_reused"]]
    return {
        "workers": n_workers,
        "cluster start s": started - start,
        "wall s": wall,
        "fits/min": 60 * len(jobs) / wall,
        "warm-up s (first fit per worker)": first["seconds"].mean(),
        "other fits s (median)": table.loc[table["model_reused"], "seconds"].median(),
        "workers used": table["pid"].nunique(),
        "engine": ",".join(sorted(set(table["engine"]))),
    }


def posterior_mu(path: Path) -> np.ndarray:
    with xr.open_datatree(path, engine="h5netcdf") as idata:
        return idata.posterior["mu"].values


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)
    jobs = replications(args.fits, args.draws, args.tune, args.chains, args.seed)
    print(f"dp.fit_many on a Dask LocalCluster: {args.fits} replications of a {N_COUNTIES}-county "
          f"model, {args.chains} chains x ({args.tune} tune + {args.draws} draws) each, one "
          f"process per worker; this machine has {os.cpu_count()} cores")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            rows.append(run(jobs, n, Path(tmp) / f"workers{n}"))
            print(f"  {n} worker(s): {rows[-1]['wall s']:.1f} s", flush=True)
        identical = all(
            np.array_equal(posterior_mu(Path(tmp) / f"workers{args.workers[0]}" / f"{job.name}.nc"),
                           posterior_mu(Path(tmp) / f"workers{n}" / f"{job.name}.nc"))
            for n in args.workers[1:] for job in jobs)
    table = pd.DataFrame(rows)
    table.insert(4, f"speedup vs {args.workers[0]}", table["wall s"].iloc[0] / table["wall s"])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(f"draws identical whatever the number of workers: {identical}")
    return table


if __name__ == "__main__":
    main()
