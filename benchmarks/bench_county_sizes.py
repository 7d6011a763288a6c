"""A state's leaf sizes at blocks, counties sharded: the scan of dpinfer.io.nmf.county_sizes
(each county's shape given the sizes on the workers, the sizes and their scale on the driver)
through dp.sample_sharded, against the same scan with every county in one shard in this
process (the one-machine baseline), the counts given. The shards are runs of counties of about
equal numbers of blocks (``weights``).

The table: a synthetic state (``--counties`` counties of ``--tracts`` tracts of 3 block groups
of 15-25 blocks, :func:`dpinfer.io.nmf.synthetic.write_synthetic_nmf`) read at Block leaves;
the counts its truth summed to the table's leaves and coarse cells; the split concentrations
fixed at log 2 + 0 (the prior's centre, exp(2) ~ 7.4), as given by an estimate. Printed, per
run: the shards' build (compile) time, the first sweep, seconds per sweep after it, max R-hat,
min bulk ESS over the sizes (L), their scale (s) and the leaf sizes (v), and ESS per second of
sampling; then the ratios sharded / one process.

Run:  .venv/bin/python benchmarks/bench_county_sizes.py [--counties 12] [--tracts 4]
      [--shards 2 4] [--workers 2] [--draws 500] [--tune 500] [--level Tract] [--in-process]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings

import numpy as np
import pandas as pd

import dpinfer as dp
from dpinfer.io.nmf.county_sizes import SUMMARIES, county_leaves, county_shapes_model, county_sizes_model
from dpinfer.io.nmf.model import groupings_levels, spine_groupings
from dpinfer.io.nmf.synthetic import write_synthetic_nmf
from dpinfer.io.nmf.table import census_table

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]


def state_table(n_counties: int, tracts: int, root: str):
    write_synthetic_nmf(root, n_counties=n_counties, tracts_per_county=tracts, block_groups_per_tract=3,
                        blocks_per_block_group=(15, 25), aian_tracts=0, mean_block_population=60.0, seed=2020)
    table = census_table(dp.read_nmf(root, 19, levels=LEVELS), "Block")
    truth = pd.read_parquet(f"{root}/truth.parquet")
    counts = table.aggregate(truth["geocode"], truth["cell"], truth["count"])
    return table, counts


def run(table, counts, shards: int, client, draws: int, tune: int, level: str = "County") -> dict:
    """One sample_sharded fit of the scan: ``shards`` runs of the areas of ``level`` (counties,
    or tracts: the same split one level down) of about equal blocks."""
    groupings = spine_groupings(table)
    county_level = groupings_levels(table).index(level)
    county = groupings[county_level]
    n_counties = int(county.max()) + 1
    log_split = np.full((len(groupings), counts.shape[1]), 2.0)

    def build(groups):
        leaves, _ = county_leaves(county, np.array(groups))
        return county_shapes_model(groupings, county_level, groups, counts[leaves], log_split,
                                   np.zeros(n_counties), 1.0)

    start = {name: np.ones((n_counties, counts.shape[1]) if name == "county_counts" else n_counties)
             for name in SUMMARIES}
    shared = county_sizes_model(groupings, county_level, log_split, start)
    began = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = dp.sample_sharded(build, shared, list(range(n_counties)), shards=shards, client=client,
                                  weights=np.bincount(county), draws=draws, tune=tune, chains=2, random_seed=1,
                                  progressbar=False)
    wall = time.perf_counter() - began
    import arviz as az

    stats = idata.sample_stats.attrs
    sampling = float(stats["sampling_time"])
    ess = {name: float(az.ess(idata, var_names=[name])[name].min()) for name in
           ("county_log_size", "sd_leaf", "leaf_effect")}
    rhat = max(float(az.rhat(idata, var_names=[name])[name].max()) for name in ess)
    build_s = max(s["build_seconds"] for s in json.loads(stats["shards"]))
    return {"shards": shards, "leaves": county.size, "counties": n_counties, "wall_s": wall, "build_s": build_s,
            "first_sweep_s": float(stats["first_sweep_time"]),
            "s_per_sweep": (sampling - float(stats["first_sweep_time"])) / (draws + tune - 1),
            "max_rhat": rhat, **{f"ess_{k}": v for k, v in ess.items()},
            **{f"ess_per_s_{k}": v / sampling for k, v in ess.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counties", type=int, default=12)
    parser.add_argument("--tracts", type=int, default=4)
    parser.add_argument("--shards", type=int, nargs="+", default=[2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--level", choices=["County", "Tract"], default="County",
                        help="the areas whose shapes are moved apart (Tract: the split one level down)")
    parser.add_argument("--in-process", action="store_true", help="the shards in this process, no cluster")
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--tune", type=int, default=500)
    args = parser.parse_args()
    import distributed

    with tempfile.TemporaryDirectory() as root:
        began = time.perf_counter()
        table, counts = state_table(args.counties, args.tracts, root)
        print(f"table: {len(table.leaves)} blocks, {counts.shape[1]} cells, read in "
              f"{time.perf_counter() - began:.1f} s", flush=True)
    rows = [run(table, counts, 1, None, args.draws, args.tune, args.level)]
    print(pd.Series(rows[0]).to_string(), flush=True)
    where = "this process" if args.in_process else f"{args.workers} workers"
    if args.in_process:
        rows += [run(table, counts, shards, None, args.draws, args.tune, args.level) for shards in args.shards]
    else:
        with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                      dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
            rows += [run(table, counts, shards, client, args.draws, args.tune, args.level) for shards in args.shards]
    out = pd.DataFrame(rows, index=["one shard"] + [f"{k} shards, {where}" for k in args.shards]).T
    for column in out.columns[1:]:
        out[f"{column.split(',')[0]} / one"] = out[column] / out["one shard"]
    with pd.option_context("display.float_format", "{:.4g}".format):
        print(out.to_string())


if __name__ == "__main__":
    main()
