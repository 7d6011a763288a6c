"""``dpinfer nmf``'s fit at state size: time, memory and convergence against the number of
counties, on synthetic noisy measurement files in the published layout.

Each size is a synthetic state written by :func:`dpinfer.write_synthetic_nmf` with the "iowa"
preset's shape (4-14 tracts per county, 3 block groups per tract, 1-3 blocks per block group,
~760 persons a block) and ``n_counties`` counties: one county, ten counties and Iowa's 99. In
a fresh process (cold: a new model object, numba's kernel cache and the model cache as they
are) the files are read down to block groups (``dp.read_nmf``), turned into one release of 28
coarse cells with every level's usable measurements and constraints
(``census_table(..., "Block_Group", "pl94-28")``), fitted with ``dpinfer nmf``'s model
(:func:`dpinfer.io.nmf.model.census_model`) by ``dp.sample`` (2 chains in parallel x (tune +
draws)) and summarised at every level (:func:`dpinfer.io.nmf.fit.summaries`).

Reported per size: latent counts, terms of the release, seconds to read and build the table,
seconds of ``dp.sample`` (planning, compilation and sampling), seconds in all, peak resident
memory from reading the files to the summaries (and, apart, while writing the synthetic files:
the writer holds every block's 2,016-cell histogram and noisy queries; Linux only, VmHWM reset
in between), min bulk ESS over the counts, over the hyperparameters (``HYPER``: the leaf sizes'
scale and the concentrations per level and cell) and over every parameter, max R-hat, and the 90% coverage
of the block-group cells against the truth.

Also reported: leapfrog steps per stored draw (mean) and the largest tree depth after tuning.

Run:  .venv/bin/python benchmarks/bench_nmf_state.py [--counties 1 10 99] [--draws 300] [--tune 300]
      [--nuts-per-sweep 3] [--counts-per-sweep 2] [--leaf-sizes estimated|published]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
from fresh_process import child_result, report

from dpinfer.io.nmf.model import LEAF_SIZES  # census_model's leaf_sizes

HYPER = ("sd_leaf", "log_split")  # census_model's hyperparameters: the leaf sizes' scale, the concentrations


def one_size(n_counties: int, draws: int, tune: int, seed: int, nuts_per_sweep: int = 3,
             counts_per_sweep: int = 2, leaf_sizes: str = "estimated") -> dict:
    import pandas as pd

    import dpinfer as dp
    from dpinfer.inference.convergence import diagnostics
    from dpinfer.io.nmf.fit import summaries
    from dpinfer.io.nmf.model import census_model
    from dpinfer.io.nmf.synthetic import PRESETS
    from dpinfer.io.nmf.table import census_table

    with tempfile.TemporaryDirectory() as root:
        preset = PRESETS["iowa"] | {"n_counties": n_counties}
        start = time.perf_counter()
        dp.write_synthetic_nmf(root, **preset)
        written = time.perf_counter() - start
        writing_peak = _peak_rss_gb()
        _reset_peak_rss()  # what follows (read, table, fit, summaries) is measured on its own
        start = time.perf_counter()
        nmf = dp.read_nmf(root, int(preset["state_fips"]),
                          levels=("US", "State", "County", "Tract", "Block_Group"))
        table = census_table(nmf, "Block_Group", "pl94-28")
        truth_long = pd.read_parquet(f"{root}/truth.parquet")
    truth = table.aggregate(truth_long["geocode"], truth_long["cell"], truth_long["count"])
    read = time.perf_counter() - start
    start = time.perf_counter()
    model = census_model(table, leaf_sizes=leaf_sizes)
    idata = dp.sample(model=model, draws=draws, tune=tune, chains=2, random_seed=seed, progressbar=True,
                      nuts_per_sweep=nuts_per_sweep, counts_per_sweep=counts_per_sweep)
    sampled = time.perf_counter() - start
    start = time.perf_counter()
    summary = summaries(table, idata, truth=truth)
    summarised = time.perf_counter() - start
    post = idata.posterior
    stats = idata.sample_stats
    ess = {}
    for name in post.data_vars:
        values = post[name].values
        _, e = diagnostics(values.reshape(values.shape[0], values.shape[1], -1))
        ess[name] = float(np.min(e))
    verdict = json.loads(post.attrs["dpinfer_convergence"])
    leaves = summary[(summary.level == "Block_Group") & (summary.cell != "total")]
    return {
        "counties": n_counties, "leaf_sizes": leaf_sizes, "leaves": len(table.leaves), "counts": int(truth.size),
        "terms": int(table.release.sums.term_value.size), "write_s": written, "read_s": read,
        "sample_s": sampled, "summaries_s": summarised,
        "min_ess_counts": ess["counts"], "min_ess_hyper": min(ess[n] for n in HYPER if n in ess),
        "min_ess_params": min(v for k, v in ess.items() if k != "counts"),
        "max_rhat": verdict["max_rhat"], "converged": verdict["converged"],
        "coverage_bg_cells": float(((leaves.q05 <= leaves.truth) & (leaves.truth <= leaves.q95)).mean()),
        "widenings": json.loads(post.attrs["dpinfer"])["counts"]["widenings"],
        "steps_per_draw": float(stats["n_steps"].mean()), "max_tree_depth": int(stats["tree_depth"].max()),
        "peak_rss_gb": _peak_rss_gb(), "writing_peak_rss_gb": writing_peak,
    }


def _peak_rss_gb() -> float:
    """The process's peak resident memory since the last :func:`_reset_peak_rss` (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20


def _reset_peak_rss() -> None:
    """Reset the peak (Linux: writing 5 to /proc/self/clear_refs resets VmHWM)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(argv) -> None:
    n_counties, draws, tune, seed, nuts_per_sweep, counts_per_sweep = map(int, argv[:6])
    start = time.perf_counter()
    row = one_size(n_counties, draws, tune, seed, nuts_per_sweep, counts_per_sweep, argv[6])
    row["total_s"] = time.perf_counter() - start
    report(row)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, nargs="+", default=[1, 10, 99])
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--tune", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nuts-per-sweep", type=int, default=3, help="NUTS transitions per draw (dp.sample's 3)")
    parser.add_argument("--counts-per-sweep", type=int, default=2, help="count draws per draw (dp.sample's 2)")
    parser.add_argument("--leaf-sizes", choices=LEAF_SIZES, default="estimated",
                        help="census_model's leaf sizes: parameters (the command's model) or the published totals")
    parser.add_argument("--_child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        return child(args._child)
    rows = []
    for k in args.counties:
        print(f"--- {k} counties, 2 chains x ({args.tune} + {args.draws}), {args.nuts_per_sweep} NUTS transitions "
              f"and {args.counts_per_sweep} count draws per draw, leaf sizes {args.leaf_sizes}, fresh process",
              flush=True)
        rows.append(child_result(__file__, [k, args.draws, args.tune, args.seed, args.nuts_per_sweep,
                                            args.counts_per_sweep, args.leaf_sizes], f"the {k}-county run"))
    head = ("| counties | leaves | counts | terms | read + table | dp.sample | in all | peak RSS (writing files) | "
            "min ESS counts | min ESS hyper | min ESS params | max R-hat | BG cells 90% cover | "
            "leapfrog steps per draw | max tree depth |")
    print("\n" + head)
    print("|" + "---:|" * (head.count("|") - 1))
    for r in rows:
        print(f"| {r['counties']} | {r['leaves']} | {r['counts']:,} | {r['terms']:,} | {r['read_s']:.0f} s | "
              f"{r['sample_s']:.0f} s | {r['total_s']:.0f} s | {r['peak_rss_gb']:.2f} GB "
              f"({r['writing_peak_rss_gb']:.2f} GB) | "
              f"{r['min_ess_counts']:.0f} | {r['min_ess_hyper']:.0f} | {r['min_ess_params']:.0f} | "
              f"{r['max_rhat']:.3f} | {r['coverage_bg_cells']:.3f} | {r['steps_per_draw']:.0f} | "
              f"{r['max_tree_depth']} |")


if __name__ == "__main__":
    main()
