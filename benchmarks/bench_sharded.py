"""One posterior on several workers: the nation's table sharded by state
(:func:`dpinfer.sample_sharded`, validation/sharded_nation.py's model) on a LocalCluster of
1, 2 and 4 worker processes, beside the one-machine engine (``dpinfer.sample``, 2 chains on 2
cores), each in a fresh process (cold: the model built and compiled in the timed call; the
workers compile their shards in parallel).

Reported per run: seconds in all and sampling alone, the speedup of the sampling against one
worker, the first sweep (when every process loads or compiles the sampler's kernels), then per
later sweep: its time, the slowest shard's own time and what the sweep costs beyond it
(synchronisation: the driver's NUTS on the shared parameters and the round trips to the
actors), the shards' time per cell, the bytes of parameters and summaries sent per sweep,
each worker's peak memory (resident set of its process) and the smallest bulk ESS over the
hyperparameters. From the measured parts, ``--cost-model`` prints the time of a fit on N
machines for larger tables (benchmarks/README.md works the national tract and block-group
tables through).

Run:  .venv/bin/python benchmarks/bench_sharded.py [--cells 30000] [--workers 1 2 4]
      [--draws 150 --tune 150] [--no-baseline] [--us-per-cell-sweep 9.9]
(about 20 minutes with the baseline; --rows FILE reprints the table and cost model of the
JSON rows a run printed, without running anything)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))


def one_run(cells: int, workers: int, draws: int, tune: int) -> dict:
    import arviz as az
    import sharded_nation

    import dpinfer as dp

    t0 = time.perf_counter()
    nation = sharded_nation.NationShards(cells)
    if workers == 0:  # the one-machine engine
        idata = dp.sample(draws, tune=tune, chains=2, cores=2, random_seed=1, model=nation.full_model(),
                          progressbar=False)
        total = time.perf_counter() - t0
        ess = az.ess(idata, var_names=list(sharded_nation.HYPER), method="bulk")
        return {"run": "one machine (dp.sample, 2 cores)", "workers": 0, "total_s": round(total, 1),
                "sampling_s": round(float(idata.posterior.attrs["sampling_time"]), 1),
                "worker_peak_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "min_ess_hyper": round(min(float(ess[v]) for v in sharded_nation.HYPER))}
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        idata = dp.sample_sharded(nation, nation.shared_model(), nation.groups, client=client, draws=draws,
                                  tune=tune, chains=2, random_seed=2, weights=nation.cells_per_state,
                                  progressbar=False)
    total = time.perf_counter() - t0
    attrs = idata.sample_stats.attrs
    shards = json.loads(attrs["shards"])
    sweeps = draws + tune
    steady = [(s["sweep_seconds"] - s["first_sweep_seconds"]) / (sweeps - 1) for s in shards]  # per sweep
    wall = (attrs["sampling_time"] - attrs["first_sweep_time"]) / (sweeps - 1)
    ess = az.ess(idata, var_names=list(sharded_nation.HYPER), method="bulk")
    return {"run": f"sharded, {workers} worker{'s' * (workers > 1)}", "workers": workers, "total_s": round(total, 1),
            "sampling_s": round(attrs["sampling_time"], 1), "first_sweep_s": round(attrs["first_sweep_time"], 1),
            "ms_per_sweep": round(1000 * wall, 1), "slowest_shard_ms_per_sweep": round(1000 * max(steady), 1),
            "sync_ms_per_sweep": round(1000 * (wall - max(steady)), 1),
            "shard_us_per_cell_sweep": round(1e6 * sum(steady) / cells, 3),
            "bytes_per_sweep": attrs["bytes_per_sweep"],
            "worker_peak_MB": round(max(s["peak_memory_MB"] for s in shards)),
            "cells_per_shard": max(s["cells"] for s in shards),
            "min_ess_hyper": round(min(float(ess[v]) for v in sharded_nation.HYPER))}


def cost_model(rows: list, cells: list, machines: list, us_per_cell_sweep: float | None) -> None:
    """Time of 2 x (1000 + 1000) sweeps on N machines (2 cores each, 2 shards per machine):
    sweeps x (cost per cell-sweep x cells per shard + synchronisation per sweep), the
    synchronisation the largest measured; memory per worker from the measured peaks against
    cells per shard (linear above the process's base). ``us_per_cell_sweep``: the shards' cost
    per cell and sweep (2 chains) to project with; default the smallest measured here, which
    in short runs is dominated by tuning's deep trees (a long run's is several times less)."""
    import pandas as pd

    sharded = [r for r in rows if r["workers"] > 0]
    measured = min(r["shard_us_per_cell_sweep"] for r in sharded)
    per_cell = (us_per_cell_sweep or measured) / 1e6  # s per cell per sweep, 2 chains
    sync = max(r["sync_ms_per_sweep"] for r in sharded) / 1000
    big, small = max(sharded, key=lambda r: r["cells_per_shard"]), min(sharded, key=lambda r: r["cells_per_shard"])
    slope = (big["worker_peak_MB"] - small["worker_peak_MB"]) / max(big["cells_per_shard"] - small["cells_per_shard"], 1)
    base = big["worker_peak_MB"] - slope * big["cells_per_shard"]
    out = []
    for n_cells in cells:
        for n in machines:
            shard_cells = n_cells / (2 * n)
            minutes = 2000 * (per_cell * shard_cells + sync) / 60
            out.append({"cells": n_cells, "machines": n, "workers": 2 * n, "minutes": round(minutes, 1),
                        "worker_GB": round((base + slope * shard_cells) / 1024, 2)})
    print(f"\ncost model (2 x (1000 + 1000) sweeps; {per_cell * 1e6:.3f} us per cell-sweep, {sync * 1000:.1f} ms "
          f"synchronisation per sweep, worker memory {base:.0f} MB + {slope * 1024:.1f} kB per cell):")
    print(pd.DataFrame(out).to_string(index=False))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=30000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--draws", type=int, default=150)
    parser.add_argument("--tune", type=int, default=150)
    parser.add_argument("--no-baseline", action="store_true", help="skip the one-machine run")
    parser.add_argument("--us-per-cell-sweep", type=float,
                        help="the cost per cell and sweep (2 chains) for the cost model (default: measured)")
    parser.add_argument("--rows", help="a file of the JSON rows a run printed: reprint, run nothing")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # run one config, print JSON
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one_run(args.cells, args.one, args.draws, args.tune)))
        return
    import pandas as pd

    rows = []
    if args.rows:
        with open(args.rows) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
    for workers in [] if args.rows else ([] if args.no_baseline else [0]) + args.workers:
        out = subprocess.run([sys.executable, __file__, "--one", str(workers), "--cells", str(args.cells),
                              "--draws", str(args.draws), "--tune", str(args.tune)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    table = pd.DataFrame(rows).set_index("run")
    one = next((r for r in rows if r["workers"] == 1), None)
    if one is not None:
        table["speedup_sampling"] = (one["sampling_s"] / table["sampling_s"]).round(2)
        table["speedup_total"] = (one["total_s"] / table["total_s"]).round(2)
    print(f"\n{args.cells} cells, 2 chains x ({args.tune} + {args.draws}), cold processes, this machine's cores: "
          f"{__import__('os').cpu_count()}")
    print(table.to_string())
    if any(r["workers"] > 0 for r in rows):
        cost_model(rows, [30000, 85000, 240000], [1, 2, 4, 8, 16], args.us_per_cell_sweep)


if __name__ == "__main__":
    main()
