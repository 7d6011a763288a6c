"""What summarising a plan's areas costs at the size of a state (issue 38, Must show 2 and 3).

A stored fit of the Iowa-size synthetic state (2,706 block-group leaves x 28 cells, 2 chains x
DRAWS draws; the draws are made up, Poisson around each leaf's published total's share, since
the cost does not depend on their values) is written with :func:`dpinfer.io.nmf.store.write_posterior`,
and a plan of PLAN_AREAS districts (runs of consecutive block groups, every block of the
state in one) is summarised with :func:`dpinfer.summarise_areas`: 55 quantities per district
and one probability. Beside it, the baseline: the same sums from the whole int64 array in
memory (what reading ``posterior.nc`` whole and summing with numpy costs), which must agree.

Each timing runs in a fresh process (``--_child``): what a user pays for ``dpinfer areas``
on a finished fit, Python start and imports included; the warm figure repeats the call in
the same process.

Run: .venv/bin/python benchmarks/bench_areas.py [--root DIR] [--draws 1000]
(DIR: Iowa-size files, ``dp.write_synthetic_nmf(DIR, **PRESETS["iowa"])``; written if absent,
~1 min).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN_AREAS = 100


def build(root: str, scratch: Path, draws: int) -> dict:
    import arviz as az
    import numpy as np
    import pandas as pd

    import dpinfer as dp
    from dpinfer.io.nmf.layout import LEVELS
    from dpinfer.io.nmf.model import published_leaf_totals
    from dpinfer.io.nmf.reading import block_geocodes
    from dpinfer.io.nmf.store import geography, tabulation_geoid, write_posterior
    from dpinfer.io.nmf.table import census_table

    table = census_table(dp.read_nmf(root, 19, levels=LEVELS[:5]), "Block_Group", "pl94-28")
    totals = published_leaf_totals(table).clip(0)
    rng = np.random.default_rng(0)
    share = rng.dirichlet(np.ones(len(table.cells)) * 2, size=len(table.leaves))
    counts = rng.poisson((totals[:, None] * share)[None, None], size=(2, draws, *share.shape))
    idata = az.from_dict({"posterior": {"counts": counts}}, dims={"counts": ["geocode", "cell"]}, coords=table.coords)
    blocks = block_geocodes(root, 19)
    geo = geography(table.leaves, "Block_Group", table.cells.names, blocks)
    start = time.perf_counter()
    store = write_posterior(scratch / "posterior.zarr", idata, geography_group=geo)
    write_seconds = time.perf_counter() - start
    np.save(scratch / "counts.npy", counts)
    leaf_of = geo["block_leaf"].values
    district = (leaf_of * PLAN_AREAS // len(table.leaves)).astype(int)
    pd.DataFrame({"GEOID20": tabulation_geoid(blocks), "district": [f"D{d:03d}" for d in district]}).to_csv(
        scratch / "plan.csv", index=False)
    size = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    return {"leaves": len(table.leaves), "cells": len(table.cells), "blocks": len(blocks), "draws": draws,
            "write_seconds": write_seconds, "store_mb": size / 1e6, "raw_int32_mb": counts.size * 4 / 1e6}


def child(scratch: Path, which: str) -> dict:
    start = time.perf_counter()
    import numpy as np
    import pandas as pd

    import dpinfer as dp

    out = {}
    if which == "store":
        summary = dp.summarise_areas(scratch / "posterior.zarr", scratch / "plan.csv",
                                     probabilities=["share_vap_hisp > 0.5"])
        out["cold_seconds"] = time.perf_counter() - start
        again = time.perf_counter()
        dp.summarise_areas(scratch / "posterior.zarr", scratch / "plan.csv", probabilities=["share_vap_hisp > 0.5"])
        out["warm_seconds"] = time.perf_counter() - again
        pop = summary.draws["pop"].values  # (chains, draws, areas)
        np.save(scratch / "pop_store.npy", pop)
        out["areas"] = int(pop.shape[-1])
    else:  # the baseline: the whole array in memory, each district's leaves summed with numpy
        counts = np.load(scratch / "counts.npy")
        plan = pd.read_csv(scratch / "plan.csv", dtype=str)
        from dpinfer.io.nmf.store import open_posterior

        with open_posterior(scratch / "posterior.zarr") as tree:
            leaf_of = tree["geography"]["block_leaf"].values
        leaf_district = pd.Series(plan["district"].to_numpy()).groupby(leaf_of).first()
        labels = pd.unique(plan["district"])
        pop = np.stack([counts[:, :, leaf_district.index[leaf_district == d]].sum(axis=(2, 3)) for d in labels], -1)
        out["cold_seconds"] = time.perf_counter() - start
        np.save(scratch / "pop_whole.npy", pop)
    out["peak_rss_gb"] = peak_rss_gb()
    return out


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM: reset by exec, unlike ru_maxrss, which a
    child started by a parent holding the draws would inherit)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=None, help="Iowa-size synthetic files (default: write them)")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--_child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        print(json.dumps(child(Path(args._child[0]), args._child[1])))
        return
    import numpy as np

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        root = args.root
        if root is None:
            import dpinfer as dp
            from dpinfer.io.nmf.synthetic import PRESETS

            root = str(scratch / "nmf")
            dp.write_synthetic_nmf(root, **PRESETS["iowa"])
        built = build(root, scratch, args.draws)
        runs = {}
        for which in ("whole", "store"):
            done = subprocess.run([sys.executable, __file__, "--_child", str(scratch), which], check=True,
                                  capture_output=True, text=True)
            runs[which] = json.loads(done.stdout.strip().splitlines()[-1])
        same = np.array_equal(np.load(scratch / "pop_store.npy"), np.load(scratch / "pop_whole.npy"))
    print(f"stored fit: {built['leaves']:,} leaves x {built['cells']} cells, {built['blocks']:,} blocks, 2 chains x "
          f"{built['draws']:,} draws: {built['store_mb']:,.0f} MB on disk ({built['raw_int32_mb']:,.0f} MB as int32), "
          f"written in {built['write_seconds']:.1f} s")
    print(f"{PLAN_AREAS} districts' populations equal to the baseline's: {same}")
    print("| method | fresh process (cold) | warm | peak RSS | ratio (cold) |")
    print("|---|---:|---:|---:|---:|")
    base = runs["whole"]["cold_seconds"]
    print(f"| baseline: every draw in memory (int64), numpy sums of 1 quantity | {base:.1f} s | | "
          f"{runs['whole']['peak_rss_gb']:.2f} GB | 1.00 |")
    s = runs["store"]
    print(f"| dp.summarise_areas on the Zarr store: 55 quantities + 1 probability, with R-hat and ESS | "
          f"{s['cold_seconds']:.1f} s | {s['warm_seconds']:.1f} s | {s['peak_rss_gb']:.2f} GB | "
          f"{s['cold_seconds'] / base:.2f} |")


if __name__ == "__main__":
    main()
