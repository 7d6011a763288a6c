"""``dpinfer nmf`` at state size as a user runs it: the command, cold, on synthetic files in
the published layout, with its time, memory and verdict, and the GLS baseline's time on the
same files beside it.

The state: :func:`dpinfer.write_synthetic_nmf` with the ``"iowa"`` preset (99 counties, 4-14
tracts each, 3 block groups a tract; ``--counties`` for fewer), every level down to block
groups, written first (not timed; or ``--root`` to reuse files). Then, in a fresh process
(``dpinfer nmf ROOT --state 19 ...``: a new interpreter, numba's kernel cache and
the model cache as they are), the command reads the files, builds the table, fits (its
``--inference`` and ``--max-minutes``), summarises every level beside GLS and writes its
report; its progress lines are shown as they come. Reported: the command's wall time and
phases (from its own lines), the child's peak resident memory (``getrusage``), the verdict
(max R-hat, min bulk and tail ESS over the counts), the method that ran, and the 90% coverage
of block-group cells against the truth for dpinfer and GLS. The GLS baseline alone
(``nested_gls`` and every summary quantity's estimate and sd) is timed in this process on the
same files.

Run:  .venv/bin/python benchmarks/bench_nmf_command.py [--counties 99] [--max-minutes 20]
      [--inference auto] [--uncertainty normal] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def gls_seconds(root: str) -> float:
    """Seconds of the GLS baseline alone: the fit and every summary quantity's estimate and sd."""
    import dpinfer as dp
    from dpinfer.io.nmf.fit import gls_summary
    from dpinfer.io.nmf.table import census_table
    from dpinfer.utility.baselines.nested.gls import nested_gls

    table = census_table(dp.read_nmf(root, 19, levels=("US", "State", "County", "Tract", "Block_Group")),
                         "Block_Group", "pl94-28")
    start = time.perf_counter()
    gls_summary(table, nested_gls(table.release))
    return time.perf_counter() - start


def run_command(root: str, out: Path, args) -> dict:
    """The command in a fresh process, its stderr echoed; (seconds, peak RSS GB, its lines)."""
    command = [sys.executable, "-c", "import sys; from dpinfer.cli import main; main(sys.argv[1:])",
               "nmf", root, "--state", "19", "--out", str(out),
               "--inference", args.inference, "--max-minutes", str(args.max_minutes), "--uncertainty",
               args.uncertainty, "--truth", str(Path(root) / "truth.parquet"), "--seed", str(args.seed)]
    print("$ dpinfer", " ".join(command[3:]), flush=True)
    start = time.perf_counter()
    child = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in child.stderr:
        if line.startswith("dpinfer"):
            print(line, end="", flush=True)
            lines.append(line.strip())
    stdout = child.stdout.read()
    if child.wait():
        raise SystemExit(f"the command failed (exit {child.returncode}):\n{stdout}\n" + "\n".join(lines[-5:]))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KB -> GB
    return {"seconds": seconds, "peak_rss_gb": peak, "lines": lines + stdout.splitlines()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, default=99)
    parser.add_argument("--max-minutes", type=float, default=20.0)
    parser.add_argument("--inference", default="auto", choices=("auto", "full-bayes", "empirical-bayes"))
    parser.add_argument("--uncertainty", default="normal", choices=("normal", "none"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default=None, help="synthetic files already written (default: write them)")
    args = parser.parse_args(argv)
    import numpy as np
    import pandas as pd

    import dpinfer as dp
    from dpinfer.io.nmf.store import open_posterior
    from dpinfer.io.nmf.synthetic import PRESETS

    with tempfile.TemporaryDirectory() as scratch:
        root = args.root
        if root is None:
            root = f"{scratch}/nmf"
            dp.write_synthetic_nmf(root, **(PRESETS["iowa"] | {"n_counties": args.counties}),
                                   levels=("US", "State", "County", "Tract", "Block_Group"))
        out = Path(scratch) / "out"
        row = run_command(root, out, args)
        with open_posterior(out / "posterior.zarr") as tree:
            verdict = json.loads(tree.posterior.attrs["dpinfer_convergence"])
            chosen = json.loads(tree.posterior.attrs["dpinfer_inference"])
            draws = tree.posterior.sizes["draw"]
        summary = pd.read_csv(out / "summary.csv", dtype={"geocode": str})
        row["gls_seconds"] = gls_seconds(root)
    cells = summary[(summary.level == "Block_Group") & ~summary.cell.isin(
        ["total", "voting-age population", "share Hispanic", "share non-Hispanic white alone"])]
    inside = (cells.q05 <= cells.truth) & (cells.truth <= cells.q95)
    gls_inside = (cells.gls - 1.645 * cells.gls_sd <= cells.truth) & (cells.truth <= cells.gls + 1.645 * cells.gls_sd)
    phases = {m.group(1): float(m.group(2)) for line in row["lines"]
              if (m := re.match(r"dpinfer nmf: \[(\d)/4\].*\((\d+) s;", line))}
    began = phases.get("3", np.nan)
    print("\n| counties | counts | method | draws per chain | in all (cold) | read, table, model | fit, summaries, "
          "GLS, report | peak RSS | max R-hat | min bulk ESS | min tail ESS | converged | BG cells 90% cover "
          "(dpinfer / GLS) | GLS alone |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    print(f"| {args.counties} | {len(cells):,} | {chosen['inference']} ({args.uncertainty}) | {draws} | "
          f"{row['seconds']:.0f} s | {began:.0f} s | {row['seconds'] - began:.0f} s | {row['peak_rss_gb']:.2f} GB | "
          f"{verdict['max_rhat']:.4f} | {verdict['min_ess_bulk']:.0f} | {verdict['min_ess_tail']:.0f} | "
          f"{verdict['converged']} | {inside.mean():.3f} / {gls_inside.mean():.3f} | {row['gls_seconds']:.0f} s |")
    print(f"method: {chosen['why']}")


if __name__ == "__main__":
    main()
