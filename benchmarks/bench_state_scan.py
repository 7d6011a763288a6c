"""A state's counts at blocks on workers, the whole iteration (dpinfer.io.nmf.state_scan): the
count sweep split by county, the counties' shapes in the shards, the sizes on the driver, given
the split concentrations. Measured in this process and on a Dask cluster, with the cost model's
prediction of the cluster's time from the in-process run beside it.

The table: a synthetic state of ``--counties`` counties shaped like the "iowa" preset of
:func:`dpinfer.io.nmf.synthetic.write_synthetic_nmf` (4-14 tracts a county, 3 block groups a
tract, 1-3 blocks a block group of ~760 persons) read at Block leaves; theta = log_split fixed
at 2 (the prior's centre).

The cost model of an iteration on W workers, shard k on worker k mod W (round robin), from the
in-process run's seconds (each shard's own work in each step, and the driver's):

    refill:  max_w sum_{k on w} refill_k + the driver's part + one call round trip
    counts:  max_w sum_{k on w} counts_k + the driver's part + directions x the round trip
    shapes:  max_w sum_{k on w} shapes_k + one call round trip
    sizes:   the driver's NUTS (unchanged)

with the round trip a no-op call to every shard and back (median of 200, measured on the
cluster before the run). Printed: seconds an iteration (the steps' sum; building the shards,
their models compiled or loaded, apart), each step, measured and predicted, and their ratio;
then the model's figure for a state of ``--scale-counties`` such counties on 1, 2, 4 and 16
workers, a shard each (a shard's work the run's average per county times its counties, the
driver's parts scaled by the counties, the round trip to W shards a line through the measured
ones).

With ``--estimate``, also theta's empirical-Bayes estimate (``log_split=None``, two chains in
lock step, the default settings) on one shard in this process and on the workers with the
first of ``--shards``: iterations to settle, seconds in all and an iteration (per chain), the
score's share, beside a plain iteration of the same two chains at fixed theta.

Run:  .venv/bin/python benchmarks/bench_state_scan.py [--counties 12] [--shards 2 4 12]
      [--workers 2] [--draws 30] [--tune 100] [--scale-counties 99] [--estimate]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import pandas as pd

import dpinfer as dp
from dpinfer.io.nmf.model import groupings_levels
from dpinfer.io.nmf.state_scan import StateScan
from dpinfer.io.nmf.synthetic import write_synthetic_nmf
from dpinfer.io.nmf.table import census_table

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]
STEPS = ("refill", "counts", "shapes", "sizes")


def state_table(n_counties: int, root: str):
    write_synthetic_nmf(root, n_counties=n_counties, tracts_per_county=(4, 14), block_groups_per_tract=3,
                        blocks_per_block_group=(1, 3), aian_tracts=0, mean_block_population=760.0, seed=2020)
    return census_table(dp.read_nmf(root, 19, levels=LEVELS), "Block")


def measured(table, shards: int, client, draws: int, tune: int) -> dict:
    """Seconds an iteration of each step and each shard's own work in it, averaged over the
    ``draws`` iterations after ``tune`` (a run of 1 + 1 first loads the kernels everywhere)."""
    theta = np.full((len(groupings_levels(table)), len(table.cells)), 2.0)
    scan = StateScan(table, theta, shards=shards, client=client, store_counts=False, progressbar=False)
    scan.run(draws=1, tune=1, chains=1, random_seed=0)  # compiles and loads everywhere
    directions = scan.gibbs.directions_swept
    out = scan.run(draws=draws, tune=tune, chains=1, random_seed=1)
    timeline = json.loads(out.posterior.attrs["timeline"])[0]
    driver = np.array(timeline["driver"])[tune:].mean(0)  # the draws' iterations, after tuning
    per_shard = pd.DataFrame([np.array(t)[tune:].mean(0) for t in timeline["shards"]],
                             columns=["refill", "counts", "shapes"])
    steps = dict(zip(STEPS, driver))
    return {"iteration": sum(steps.values()), **steps, "per_shard": per_shard,
            "build": json.loads(out.posterior.attrs["seconds"])[0]["build"],
            "directions": (scan.gibbs.directions_swept - directions) / (draws + tune), "shards": shards,
            "blocks": len(table.leaves)}


def round_trip(table, shards: int, client, calls: int = 200) -> float:
    """Median seconds of a no-op call to every shard and back (their roots' sums)."""
    from dpinfer.lattice.nested.split import gathered

    theta = np.full((len(groupings_levels(table)), len(table.cells)), 2.0)
    scan = StateScan(table, theta, shards=shards, client=client, store_counts=False, progressbar=False)
    start = scan.driver.theta(scan.driver.compiled.initial_q(0, scan.sizes_model)) | {"log_split": theta}
    actors = scan._shards([(1, 2)] * shards, start, start | {"log_split": theta + 0.5}, 1, 1)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        gathered([a.root_sums() for a in actors])
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def estimate_cost(table, shards: int, client) -> dict:
    """Theta's empirical-Bayes estimate with two chains: its iterations, its seconds (building
    apart), each step's seconds an iteration per chain (the scores' reading among them), and
    the same two chains' plain iteration at the estimate (the draws after it)."""
    import warnings

    scan = StateScan(table, shards=shards, client=client, store_counts=False, progressbar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 30 draws: not converged
        out = scan.run(draws=30, chains=2, random_seed=1)
    estimate = json.loads(out.posterior.attrs["dpinfer_empirical_bayes"])
    n = estimate["iterations"]
    timelines = [np.array(t["driver"]) for t in json.loads(out.posterior.attrs["timeline"])]
    during = np.mean([t[:n] for t in timelines], axis=(0, 1))  # (refill, counts, shapes, sizes, scores)
    after = np.mean([t[-30:] for t in timelines], axis=(0, 1))
    return {"iterations": n, "settled": estimate["settled"], "seconds": estimate["seconds"],
            "during": during, "after": after}


def predicted(local: dict, workers: int, trip: float) -> dict:
    """The cost model (module docstring) from the in-process run ``local``."""
    per = local["per_shard"]
    busiest = per.groupby(np.arange(len(per)) % workers).sum().max()
    return _model(busiest, local, 1.0, trip)


def _model(busiest, local: dict, scale: float, trip: float) -> dict:
    driver = {step: max(local[step] - local["per_shard"][step].sum(), 0.0) * scale
              for step in ("refill", "counts", "shapes")}
    out = {"refill": busiest["refill"] + driver["refill"] + trip,
           "counts": busiest["counts"] + driver["counts"] + local["directions"] * trip,
           "shapes": busiest["shapes"] + driver["shapes"] + trip,
           "sizes": local["sizes"] * scale}
    out["iteration"] = sum(out.values())
    return out


def scaled(local: dict, counties: int, target: int, workers: int, trip: float) -> float:
    """The model's seconds an iteration for ``target`` such counties on ``workers`` workers, a
    shard each: a shard's work the run's average per county times ceil(target / workers), the
    driver's parts times target / counties, the round trip ``trip``."""
    busiest = local["per_shard"].sum() / counties * int(np.ceil(target / workers))
    return _model(busiest, local, target / counties, trip)["iteration"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counties", type=int, default=12)
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 4, 12])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--tune", type=int, default=100)
    parser.add_argument("--scale-counties", type=int, default=99)
    parser.add_argument("--estimate", action="store_true", help="also theta's empirical-Bayes estimate")
    args = parser.parse_args()
    import distributed

    with tempfile.TemporaryDirectory() as root:
        began = time.perf_counter()
        table = state_table(args.counties, root)
    print(f"table: {args.counties} counties, {len(table.leaves)} blocks, {len(table.cells)} cells, read in "
          f"{time.perf_counter() - began:.1f} s", flush=True)
    one = measured(table, 1, None, args.draws, args.tune)
    print(f"one shard, this process: {one['iteration']:.3f} s an iteration "
          + ", ".join(f"{s} {one[s]:.3f}" for s in STEPS), flush=True)
    rows, figures = [], []
    with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        for shards in args.shards:
            local = measured(table, shards, None, args.draws, args.tune)
            trip = round_trip(table, shards, client)
            there = measured(table, shards, client, args.draws, args.tune)
            model = predicted(local, args.workers, trip)
            for step in ("iteration",) + STEPS:
                rows.append({"shards": shards, "step": step, "one shard, this process": one[step],
                             f"{shards} shards, this process": local[step],
                             f"on {args.workers} workers, measured": there[step],
                             "predicted": model[step], "measured / predicted": there[step] / model[step]})
            print(pd.DataFrame(rows[-5:]).to_string(index=False, float_format="{:.4g}".format), flush=True)
            print(f"  round trip {trip * 1e3:.2f} ms, {local['directions']:.0f} directions an iteration; building "
                  f"the shards {there['build']:.1f} s on the workers, {local['build']:.1f} s here", flush=True)
            figures.append((shards, local, trip))
        if args.estimate:
            estimates = [("one shard, this process", estimate_cost(table, 1, None)),
                         (f"{args.shards[0]} shards on {args.workers} workers",
                          estimate_cost(table, args.shards[0], client))]
    print(f"\nOne iteration (s): {args.counties} Iowa-shaped counties, {len(table.leaves)} blocks, "
          f"{args.workers} workers, the mean of {args.draws} iterations after {args.tune} of tuning")
    print(pd.DataFrame(rows).to_string(index=False, float_format="{:.4g}".format))
    # the round trip to W shards, a line through the measured ones (it grows with the shards called)
    fit = np.polyfit([f[0] for f in figures], [f[2] for f in figures], 1) if len(figures) > 1 else None
    out = []
    for shards, local, trip in figures:
        row = {"from the run with shards": shards}
        for w in (1, 2, 4, 16):
            t = trip if fit is None else max(float(np.polyval(fit, w)), 0.0)
            row[f"{w} workers"] = scaled(local, args.counties, args.scale_counties, w, 0.0 if w == 1 else t)
        out.append(row)
    print(f"\nThe model's seconds an iteration for {args.scale_counties} such counties, a shard a worker "
          f"(round trip to W shards: {'the measured' if fit is None else 'a line through the measured'}):")
    print(pd.DataFrame(out).to_string(index=False, float_format="{:.4g}".format))
    if args.estimate:
        print("\nTheta's empirical-Bayes estimate, 2 chains in lock step (s an iteration per chain):")
        rows = [{"where": where, "iterations": e["iterations"], "settled": e["settled"],
                 "estimate s": e["seconds"], "iteration during": e["during"].sum(),
                 "of it the scores": e["during"][4], "iteration after (draws)": e["after"].sum(),
                 "during / after": e["during"].sum() / e["after"].sum()} for where, e in estimates]
        print(pd.DataFrame(rows).to_string(index=False, float_format="{:.4g}".format))


if __name__ == "__main__":
    main()
