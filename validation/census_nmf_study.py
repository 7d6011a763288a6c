"""Side by side on a synthetic state with its known truth (issue 23, "Must show" 4).

The shipped synthetic state (``models/synthetic_state_nmf``: 4 counties, 10 tracts, 22 block
groups, its truth) is read down to block groups, coarsened to voting age x Hispanic origin x 7
race groups (``census_table(..., "Block_Group", "pl94-28")``), and fitted with ``dpinfer nmf``'s
model (:func:`dpinfer.io.nmf.model.census_model`). The same measurements go to the baselines of
:mod:`dpinfer.utility.baselines.nested`:

* GLS / BLUE (the Census Bureau's GLS): estimate +- 1.645 sd;
* per-cell posteriors as the per-cell tools compute them (flat prior, truncated discrete
  Gaussian, no joint totals): for each area's own published cell ("per-cell"), and with the
  leaves' per-cell posteriors summed as independent ("per-cell aggregated");
* the NNLS projection (point estimates only).

Targets: every (area, coarse cell) at block group, tract and county level; every area's
voting-age population, share Hispanic and share non-Hispanic white alone. Scored per (method, group): coverage of the 90%
intervals (with its binomial Monte Carlo standard error, which treats the targets of one state
as independent: a rough guide, since they share the state's data), mean width, MAE and RMSE of
the point estimate (dpinfer: the posterior median).

Run:  .venv/bin/python validation/census_nmf_study.py [draws]
Writes validation/results/census_nmf.md and docs/census-nmf-side-by-side.png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

import dpinfer as dp
from dpinfer.io.nmf.model import census_model
from dpinfer.io.nmf.table import census_table
from dpinfer.utility.baselines.nested.comparison import compare_nested, nested_target_table
from dpinfer.utility.baselines.nested.targets import (
    area_cell_targets,
    area_sum_targets,
    concat_targets,
    ratio_targets,
)

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "models" / "synthetic_state_nmf"
RESULTS = Path(__file__).parent / "results" / "census_nmf.md"
FIGURE = ROOT / "docs" / "census-nmf-side-by-side.png"
SEED = 20261127
LEVELS = ("County", "Tract", "Block_Group")


def run(draws: int = 3000, seed: int = SEED, *, root=STATE, leaf_sizes: str = "estimated", **sample_options):
    """Fit the state at ``root`` (block-group leaves, 28 cells; ``census_model(leaf_sizes=)``,
    ``dp.sample`` with ``draws`` draws and tune and ``sample_options``) and score it beside the
    baselines: (scores, the convergence verdict, seconds, leaves, cells)."""
    start = time.perf_counter()
    nmf = dp.read_nmf(root, 19, levels=("US", "State", *LEVELS))
    table = census_table(nmf, "Block_Group", "pl94-28")
    truth_long = pd.read_parquet(Path(root) / "truth.parquet")
    truth = table.aggregate(truth_long["geocode"], truth_long["cell"], truth_long["count"])
    model = census_model(table, leaf_sizes=leaf_sizes)
    idata = dp.sample(model=model, draws=draws, tune=draws, chains=2, random_seed=seed, progressbar=False,
                      **sample_options)
    fit_seconds = time.perf_counter() - start
    counts = idata.posterior["counts"].values
    posterior = counts.reshape(-1, *counts.shape[2:])
    release = table.release
    areas = table.areas
    cells = list(table.cells)
    adult = [i for i, c in enumerate(cells) if c[0] == "18 and over"]
    hispanic = [i for i, c in enumerate(cells) if c[1] == "Hispanic or Latino"]
    white = [i for i, c in enumerate(cells) if c[1] == "Not Hispanic or Latino" and c[2] == "white alone"]
    everyone = list(range(len(cells)))
    targets = []
    for level in LEVELS:
        rows = np.flatnonzero(areas.level.to_numpy() == level)
        name = level.replace("_", " ").lower()
        targets.append(area_cell_targets(release, rows, f"{name} cells"))
        targets.append(area_sum_targets(release, rows, adult, f"{name} voting-age population"))
        targets.append(ratio_targets(release, rows, hispanic, everyone, f"{name} share Hispanic"))
        targets.append(ratio_targets(release, rows, white, everyone, f"{name} share non-Hispanic white"))
    targets = concat_targets(*targets)
    per_target = nested_target_table(release, truth, posterior, targets, seed=seed)
    scores = compare_nested(release, truth, posterior, targets, table=per_target)
    verdict = idata.posterior.attrs["dpinfer_convergence"]
    return scores, verdict, fit_seconds, len(table.leaves), len(table.cells)


def write_report(scores: pd.DataFrame, verdict: str, seconds: float, leaves: int, cells: int) -> str:
    import json

    v = json.loads(verdict)
    head = ("converged" if v["converged"] else "NOT CONVERGED (not a result yet)") + (
        f": max R-hat {v['max_rhat']:.3f}, min bulk ESS {v['min_ess_bulk']:.0f} over {v['quantities']} "
        f"parameters and counts, {v.get('divergences', 0)} divergences")
    lines = ["# Side by side on the synthetic state (block-group leaves, 28 coarse cells)", "",
             f"{leaves} block groups x {cells} cells; dpinfer's fit and the baselines took {seconds:.0f} s "
             f"in all; dpinfer {head}.", "",
             "Expected coverage: the mean posterior mass of dpinfer's 90% intervals, the coverage a "
             "calibrated posterior gives; above 0.9 where the targets are small integers (a count "
             "that is 0, 1 or 2 in most draws). Truth below / above: the shares of targets whose "
             "truth lies below / above the interval (misses on one side: the estimates lean the other way).", "",
             "| group | method | targets | 90% coverage (MC se) | truth below / above | expected coverage | "
             "mean width | MAE | RMSE |",
             "|---|---|---:|---|---|---:|---:|---:|---:|"]
    for _, r in scores.sort_values(["group", "method"]).iterrows():
        cov = "" if np.isnan(r.coverage) else f"{r.coverage:.3f} ({r.coverage_se:.3f})"
        sides = "" if np.isnan(r.coverage) else f"{r.below:.3f} / {r.above:.3f}"
        expected = "" if np.isnan(r.expected_coverage) else f"{r.expected_coverage:.3f}"
        width = "" if np.isnan(r.mean_width) else f"{r.mean_width:.3g}"
        lines.append(f"| {r.group} | {r.method} | {r.targets} | {cov} | {sides} | {expected} | {width} | {r.mae:.3g} | "
                     f"{r.rmse:.3g} |")
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    _figure(scores)
    return text


def _figure(scores: pd.DataFrame) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cov = scores[scores.coverage.notna()]
    groups = list(dict.fromkeys(cov.group))
    methods = list(dict.fromkeys(cov.method))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        rows = cov[cov.method == m].set_index("group").reindex(groups)
        ax.bar(np.arange(len(groups)) + j * width, rows.coverage, width, yerr=1.96 * rows.coverage_se, label=m)
    ax.axhline(0.9, color="black", lw=1, ls="--")
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, groups, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("coverage of 90% intervals")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=len(methods))
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    print(write_report(*run(draws)))
