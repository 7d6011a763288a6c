"""Districts side by side on synthetic states with a known truth (issue 38, "Must show" 4, at
block-group leaves).

For each synthetic truth of :mod:`dpinfer.io.nmf.persons` (the model-like ``hierarchical`` and
the four the model does not generate: ``segregated``, ``structural-zeros``, ``large-facility``,
``urban``), a state of 3 Iowa-shaped counties is written in the published layout with exact
discrete Gaussian noise and fitted as ``dpinfer nmf`` fits it when full Bayes does not fit the
time (``census_model``, leaf sizes at their published totals, empirical Bayes with the
hyperparameters drawn from the normal approximation of their posterior, sampling on until
converged). Then DISTRICTS random contiguous districts: disjoint runs of 2-8 consecutive block
groups in the spine's order (so a run stays in a tract or continues into the next one, and may
cross a county line), each crossing at least one tract line. Per district the quantities of
:func:`dpinfer.io.nmf.areas.area_quantities` that redistricting asks for (pop, vap, vap_hisp,
vap_nh_white, vap_nh_black, share_vap_hisp, share_vap_nh_white) and its 28 cells are scored
against the truth (:func:`dpinfer.utility.baselines.nested.comparison.compare_nested`):

* dpinfer: the posterior median and 90% interval of the district's quantity over the joint
  draws (the same numbers ``dp.summarise_areas`` reports);
* GLS +- 1.645 sd: the district's sum with the covariance of its leaves (a share by the delta
  method), what ``dpinfer nmf --areas`` puts beside;
* per-cell aggregated: the leaves' per-cell posteriors (flat prior, truncated discrete
  Gaussian) summed as independent, what a user of the per-cell tools gets for a district.

Coverage with its binomial Monte Carlo standard error (the targets of one state treated as
independent: a rough guide), the posterior's own expected coverage, width, MAE; per quantity
and pooled over the truths. Every truth of a seed gets the same noise draw, and GLS's error is
a linear function of the noise alone (its estimate is unbiased and linear in the
measurements), so GLS's rows are the same for every truth of a seed; the other methods'
depend on the truth (per-cell posteriors truncate at 0; dpinfer's prior pools).

Run:  .venv/bin/python validation/districts_side_by_side.py [--truths ...] [--seed 2020]
Writes validation/results/districts_side_by_side.md (seed 2020) or districts_side_by_side-seed<S>.md
(~8 min on a 2-core VM): each seed is another draw of the persons and the noise.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

RESULTS = Path(__file__).parent / "results" / "districts_side_by_side.md"
TRUTHS = ("hierarchical", "segregated", "structural-zeros", "large-facility", "urban")
LEVELS = ("County", "Tract", "Block_Group")
DISTRICTS = 10
DRAWS = 1500
ASKED = ("pop", "vap", "vap_hisp", "vap_nh_white", "vap_nh_black", "share_vap_hisp", "share_vap_nh_white")


def districts(leaves, rng, n: int = DISTRICTS) -> np.ndarray:
    """Each leaf's district (-1: none): ``n`` disjoint runs of 2-8 consecutive leaves, each
    spanning two tracts or more (a block group's geocode is its tract's plus one digit)."""
    leaves = np.asarray(leaves, dtype=str)
    tract = np.array([g[:-1] for g in leaves])
    out = np.full(leaves.size, -1)
    for _ in range(10_000):
        k = int(out.max()) + 1
        if k == n:
            return out
        length = int(rng.integers(2, 9))
        start = int(rng.integers(0, leaves.size - length + 1))
        run = slice(start, start + length)
        if np.all(out[run] < 0) and np.unique(tract[run]).size > 1:
            out[run] = k
    raise RuntimeError(f"could not place {n} districts of 2-8 block groups across tract lines in "
                       f"{leaves.size} block groups")


def score(root: str, seed: int):
    import dpinfer as dp
    from dpinfer.io.nmf.areas import area_quantities, area_targets
    from dpinfer.io.nmf.model import census_model
    from dpinfer.io.nmf.table import census_table
    from dpinfer.utility.baselines.nested.comparison import compare_nested
    from dpinfer.utility.baselines.nested.targets import concat_targets

    table = census_table(dp.read_nmf(root, 19, levels=("US", "State", *LEVELS)), "Block_Group", "pl94-28")
    truth_long = pd.read_parquet(Path(root) / "truth.parquet")
    truth = table.aggregate(truth_long["geocode"], truth_long["cell"], truth_long["count"])
    idata = dp.sample(model=census_model(table, leaf_sizes="published"), draws=DRAWS, tune=DRAWS, chains=2,
                      random_seed=seed, progressbar=False, inference="empirical-bayes",
                      empirical_bayes={"uncertainty": "normal"}, max_minutes=15)
    counts = idata.posterior["counts"].values
    leaf_area = districts(table.leaves, np.random.default_rng(seed))
    names = [f"D{k}" for k in range(DISTRICTS)]
    wanted = area_quantities(table.coords["cell"], table.cells.names)
    asked = [q for q in wanted if q[0] in ASKED]
    cells = [q for q in wanted if q[0] not in ASKED and q[2] is None and q[1].sum() == 1]
    parts = []
    for group, chosen in [(f"district {q[0]}", [q]) for q in asked] + [("district cells", cells)]:
        t = area_targets(leaf_area, np.array(names), chosen, n_cells=len(table.cells))
        parts.append(type(t)(t.label, np.full(len(t), group, dtype=object), t.numerator, t.denominator,
                             t.num_area, t.num_cells, t.den_area, t.den_cells))
    targets = concat_targets(*parts)
    scores = compare_nested(table.release, truth, counts.reshape(-1, *counts.shape[2:]), targets,
                            methods=("dpinfer", "GLS", "per-cell aggregated"), seed=seed)
    sizes = np.bincount(leaf_area[leaf_area >= 0])
    return scores, json.loads(idata.posterior.attrs["dpinfer_convergence"]), len(table.leaves), sizes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--truths", nargs="+", default=list(TRUTHS), choices=TRUTHS)
    parser.add_argument("--seed", type=int, default=2020)
    args = parser.parse_args(argv)
    import dpinfer as dp
    from dpinfer.io.nmf.synthetic import PRESETS

    sections = []
    for truth in args.truths:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as root:
            dp.write_synthetic_nmf(root, **(PRESETS["iowa"] | {"n_counties": 3, "seed": args.seed}), truth=truth,
                                   levels=("US", "State", *LEVELS))
            scores, verdict, leaves, sizes = score(root, seed=11)
        sections.append((truth, scores, verdict, time.perf_counter() - start, leaves, sizes))
        print(truth, verdict["converged"], f"{time.perf_counter() - start:.0f} s", flush=True)
        path = RESULTS if args.seed == 2020 else RESULTS.with_name(f"{RESULTS.stem}-seed{args.seed}.md")
        path.write_text(report(sections, args))
    print(path.read_text())


def report(sections, args) -> str:
    lines = ["# Districts side by side (issue 38, Must show 4; block-group leaves)", "",
             f"Written by `validation/districts_side_by_side.py --seed {args.seed}` (its docstring has the method): "
             f"{DISTRICTS} random contiguous districts of 2-8 block groups across tract lines per state; their "
             f"quantities ({', '.join(ASKED)}) and cells scored against the truth. Expected coverage: the mean "
             "posterior mass of dpinfer's 90% intervals (above 0.9 where targets are small integers).", ""]
    pooled = []
    for truth, scores, v, seconds, leaves, sizes in sections:
        head = "converged" if v["converged"] else "NOT CONVERGED (not a result yet)"
        lines += [f"## {truth}", "",
                  f"{leaves} block groups; districts of {sizes.min()}-{sizes.max()} block groups; the fit {head} "
                  f"(max R-hat {v['max_rhat']:.4f}, min bulk ESS {v['min_ess_bulk']:,.0f}); {seconds:.0f} s in all.", "",
                  "| group | method | targets | 90% coverage (MC se) | truth below / above | expected coverage | "
                  "mean width | MAE |", "|---|---|---:|---|---|---:|---:|---:|"]
        for r in scores.sort_values(["group", "method"]).itertuples():
            lines.append(_row(r))
        lines.append("")
        pooled.append(scores.assign(truth=truth))
    if len(pooled) > 1:
        every = pd.concat(pooled)
        lines += ["## Every truth together", "", "| group | method | targets | 90% coverage (MC se) | mean width | MAE |",
                  "|---|---|---:|---|---:|---:|"]
        for (group, method), t in every.groupby(["group", "method"]):
            n = int(t["targets"].sum())
            p = float((t["coverage"] * t["targets"]).sum() / n)
            lines.append(f"| {group} | {method} | {n} | {p:.3f} ({np.sqrt(p * (1 - p) / n):.3f}) | "
                         f"{float((t['mean_width'] * t['targets']).sum() / n):.3g} | "
                         f"{float((t['mae'] * t['targets']).sum() / n):.3g} |")
        lines.append("")
    return "\n".join(lines)


def _row(r) -> str:
    cov = "" if np.isnan(r.coverage) else f"{r.coverage:.3f} ({r.coverage_se:.3f})"
    sides = "" if np.isnan(r.coverage) else f"{r.below:.3f} / {r.above:.3f}"
    expected = "" if np.isnan(r.expected_coverage) else f"{r.expected_coverage:.3f}"
    width = "" if np.isnan(r.mean_width) else f"{r.mean_width:.3g}"
    return f"| {r.group} | {r.method} | {r.targets} | {cov} | {sides} | {expected} | {width} | {r.mae:.3g} |"


if __name__ == "__main__":
    main()
