"""Districts side by side on synthetic states with a known truth (issue 38, "Must show" 1 and 4:
block-group leaves, and blocks as leaves with ``--leaves Block``).

For each synthetic truth of :mod:`dpinfer.io.nmf.persons` (the model-like ``hierarchical`` and
the four the model does not generate: ``segregated``, ``structural-zeros``, ``large-facility``,
``urban``), a state is written in the published layout with exact discrete Gaussian noise and
fitted as ``dpinfer nmf`` fits it when full Bayes does not fit the time (``census_model``, leaf
sizes at their published totals unless ``--leaf-sizes estimated``, empirical Bayes with the hyperparameters drawn from the normal
approximation of their posterior, sampling on until converged). At block-group leaves the state
has 3 Iowa-shaped counties (:data:`STATES`); at block leaves 3 counties of 3-5 tracts, 2-3 block
groups a tract and 10-20 blocks a block group of ~60 persons (~450 blocks; ``urban`` is left
out there by default: its urban county alone has ~2,800 blocks; the estimate gets up to 3,000
iterations and the fit 24 minutes, :data:`ESTIMATE`). Then DISTRICTS random
contiguous districts: disjoint runs of consecutive leaves in the spine's order (so a run stays
in a tract or continues into the next one, and may cross a county line), each crossing at least
one tract line: 2-8 block groups, or at block leaves 1-2 block groups' worth of blocks (the
mean number of blocks a block group times 1 or 2), which start and end inside block groups. Per
district the quantities of
:func:`dpinfer.io.nmf.areas.area_quantities` that redistricting asks for (pop, vap, vap_hisp,
vap_nh_white, vap_nh_black, share_vap_hisp, share_vap_nh_white) and its 28 cells are scored
against the truth (:func:`dpinfer.utility.baselines.nested.comparison.compare_nested`):

* dpinfer: the posterior median and 90% interval of the district's quantity over the joint
  draws (the same numbers ``dp.summarise_areas`` reports);
* GLS +- 1.645 sd: the district's sum with the covariance of its leaves (a share by the delta
  method), what ``dpinfer nmf --areas`` puts beside;
* per-cell aggregated: the leaves' per-cell posteriors (flat prior, truncated discrete
  Gaussian) summed as independent, what a user of the per-cell tools gets for a district.

At block leaves two more groups of targets are scored: every block's 28 cells, and the
tabulation block groups rebuilt from blocks (blocks grouped by their GEOID20's first 12 digits,
:func:`dpinfer.io.nmf.areas.tabulation_plan`) with the same quantities as the districts, and
every block's pop and vap (where the leaf sizes at their published totals would count a
block's noisy total twice, in the prior and in the likelihood).

Coverage with its binomial Monte Carlo standard error (the targets of one state treated as
independent: a rough guide), the posterior's own expected coverage, width, MAE; per quantity
and pooled over the truths. Every truth of a seed gets the same noise draw, and GLS's error is
a linear function of the noise alone (its estimate is unbiased and linear in the
measurements), so GLS's rows are the same for every truth of a seed; the other methods'
depend on the truth (per-cell posteriors truncate at 0; dpinfer's prior pools).

Run:  .venv/bin/python validation/districts_side_by_side.py [--truths ...] [--seed 2020] [--leaves Block]
      [--leaf-sizes estimated]
Writes validation/results/districts_side_by_side.md (seed 2020) or districts_side_by_side-seed<S>.md
(~8 min on a 2-core VM), with ``--leaves Block`` districts_side_by_side-blocks[-seed<S>].md (-blocks-estimated-sizes with
``--leaf-sizes estimated``): each
seed is another draw of the persons and the noise.
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
LEVELS = ("County", "Tract", "Block_Group", "Block")
#: the synthetic state at each leaf level (write_synthetic_nmf's arguments but truth and seed)
STATES = {
    "Block_Group": {"preset": "iowa", "n_counties": 3},
    "Block": {"preset": "small", "n_counties": 3, "tracts_per_county": (3, 5), "block_groups_per_tract": (2, 3),
              "blocks_per_block_group": (10, 20), "aian_tracts": 0, "mean_block_population": 60.0},
}
DISTRICTS = 10
#: each district's size in block groups' worth of leaves: 10 such runs must fit in the state
SPANS = {"Block_Group": (2, 8), "Block": (1, 2)}
#: the estimate's iterations and the fit's time: at block leaves the concentrations of the
#: blocks' split need far more than the default 300 iterations (at 300: 7 of 140 unsettled, the
#: largest Monte Carlo error 0.873 of its sd, hierarchical truth, seed 2020)
ESTIMATE = {"Block_Group": {}, "Block": {"max_iterations": 3000}}
MINUTES = {"Block_Group": 15, "Block": 24}
DRAWS = 1500
ASKED = ("pop", "vap", "vap_hisp", "vap_nh_white", "vap_nh_black", "share_vap_hisp", "share_vap_nh_white")


def districts(leaves, rng, n: int = DISTRICTS, span: tuple = (2, 8)) -> np.ndarray:
    """Each leaf's district (-1: none): ``n`` disjoint runs of consecutive leaves of 2-8 (``span``)
    block groups' worth (b x 2..8 leaves, b the mean number of leaves a block group), each spanning two
    tracts or more (NMF geocodes start with their parent's: a tract's has 11 characters, a block
    group's 12)."""
    leaves = np.asarray(leaves, dtype=str)
    tract = np.array([g[:11] for g in leaves])
    per_block_group = leaves.size / np.unique([g[:12] for g in leaves]).size
    out = np.full(leaves.size, -1)
    for _ in range(10_000):
        k = int(out.max()) + 1
        if k == n:
            return out
        length = int(round(per_block_group * int(rng.integers(span[0], span[1] + 1))))
        if length > leaves.size:
            continue
        start = int(rng.integers(0, leaves.size - length + 1))
        run = slice(start, start + length)
        if np.all(out[run] < 0) and np.unique(tract[run]).size > 1:
            out[run] = k
    raise RuntimeError(f"could not place {n} districts of {span[0]}-{span[1]} block groups' worth across tract lines in "
                       f"{leaves.size} leaves")


def score(root: str, seed: int, leaves: str, leaf_sizes: str = "published", minutes: float | None = None,
          iterations: int | None = None):
    import dpinfer as dp
    from dpinfer.io.nmf.areas import area_quantities, area_targets
    from dpinfer.io.nmf.model import census_model
    from dpinfer.io.nmf.store import tabulation_geoid
    from dpinfer.io.nmf.table import census_table
    from dpinfer.utility.baselines.nested.comparison import compare_nested
    from dpinfer.utility.baselines.nested.targets import area_cell_targets, concat_targets

    levels = LEVELS[:LEVELS.index(leaves) + 1]
    table = census_table(dp.read_nmf(root, 19, levels=("US", "State", *levels)), leaves, "pl94-28")
    truth_long = pd.read_parquet(Path(root) / "truth.parquet")
    truth = table.aggregate(truth_long["geocode"], truth_long["cell"], truth_long["count"])
    leaf_area = districts(table.leaves, np.random.default_rng(seed), span=SPANS[leaves])  # before the fit
    idata = dp.sample(model=census_model(table, leaf_sizes=leaf_sizes), draws=DRAWS, tune=DRAWS, chains=2,
                      random_seed=seed, progressbar=False, inference="empirical-bayes",
                      empirical_bayes={"uncertainty": "normal", **ESTIMATE[leaves],
                                       **({"max_iterations": iterations} if iterations else {})},
                      max_minutes=minutes or MINUTES[leaves])
    counts = idata.posterior["counts"].values
    wanted = area_quantities(table.coords["cell"], table.cells.names)
    asked = [q for q in wanted if q[0] in ASKED]
    cells = [q for q in wanted if q[0] not in ASKED and q[2] is None and q[1].sum() == 1]

    def grouped(kind, leaf_area, names, chosen_groups):
        out = []
        for group, chosen in chosen_groups:
            t = area_targets(leaf_area, np.asarray(names), chosen, n_cells=len(table.cells))
            out.append(type(t)(t.label, np.full(len(t), f"{kind} {group}", dtype=object), t.numerator,
                               t.denominator, t.num_area, t.num_cells, t.den_area, t.den_cells))
        return out

    parts = grouped("district", leaf_area, [f"D{k}" for k in range(DISTRICTS)],
                    [(q[0], [q]) for q in asked] + [("cells", cells)])
    shape = {"districts": np.bincount(leaf_area[leaf_area >= 0])}
    if leaves == "Block":
        geoid = tabulation_geoid(table.leaves)
        tabulated, leaf_bg = np.unique([g[:12] for g in geoid], return_inverse=True)
        parts += grouped("tabulation block group", leaf_bg, tabulated, [(q[0], [q]) for q in asked])
        parts += grouped("block", np.arange(len(table.leaves)), table.leaves,
                         [(q[0], [q]) for q in asked if q[0] in ("pop", "vap")])
        leaf_rows = np.flatnonzero(table.areas.level.to_numpy() == "Block")
        parts.append(area_cell_targets(table.release, leaf_rows, "block cells"))
        spine = np.unique([g[:12] for g in table.leaves], return_inverse=True)[1]
        same = sum(np.unique(spine[leaf_bg == k]).size == 1 and np.sum(spine == spine[leaf_bg == k][0])
                   == np.sum(leaf_bg == k) for k in range(tabulated.size))
        shape["tabulation block groups"] = (tabulated.size, int(same))
    scores = compare_nested(table.release, truth, counts.reshape(-1, *counts.shape[2:]), concat_targets(*parts),
                            methods=("dpinfer", "GLS", "per-cell aggregated"), seed=seed)
    return scores, json.loads(idata.posterior.attrs["dpinfer_convergence"]), len(table.leaves), shape


def main(argv=None) -> None:
    from dpinfer.io.nmf.model import LEAF_SIZES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--truths", nargs="+", default=None, choices=TRUTHS,
                        help="default: all five; at --leaves Block all but urban (its urban county alone has "
                             "~2,800 blocks)")
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--leaves", default="Block_Group", choices=("Block_Group", "Block"))
    parser.add_argument("--leaf-sizes", default="published", choices=LEAF_SIZES,
                        help="census_model's leaf sizes (default: published; dpinfer nmf's default is estimated at "
                             "Block leaves, published above)")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="each fit's time (default 15 at block-group leaves, 24 at blocks)")
    parser.add_argument("--max-iterations", type=int, default=None,
                        help="the hyperparameters' estimate's iterations at most (default: dp.sample's, 3000 at blocks)")
    args = parser.parse_args(argv)
    if args.truths is None:
        args.truths = [t for t in TRUTHS if args.leaves == "Block_Group" or t != "urban"]
    import dpinfer as dp
    from dpinfer.io.nmf.synthetic import PRESETS

    state = dict(STATES[args.leaves])
    state = PRESETS[state.pop("preset")] | state
    levels = LEVELS[:LEVELS.index(args.leaves) + 1]
    stem = (RESULTS.stem + ("-blocks" if args.leaves == "Block" else "")
            + ("-estimated-sizes" if args.leaf_sizes == "estimated" else "")
            + (f"-{args.max_minutes:g}min" if args.max_minutes else ""))
    path = RESULTS.with_name(f"{stem}.md" if args.seed == 2020 else f"{stem}-seed{args.seed}.md")
    sections = []
    for truth in args.truths:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as root:
            dp.write_synthetic_nmf(root, **(state | {"seed": args.seed}), truth=truth, levels=("US", "State", *levels))
            scores, verdict, leaves, shape = score(root, seed=11, leaves=args.leaves, leaf_sizes=args.leaf_sizes,
                                                   minutes=args.max_minutes, iterations=args.max_iterations)
        sections.append((truth, scores, verdict, time.perf_counter() - start, leaves, shape))
        print(truth, verdict["converged"], f"{time.perf_counter() - start:.0f} s", flush=True)
        path.write_text(report(sections, args))
    print(path.read_text())


def report(sections, args) -> str:
    unit = "block groups" if args.leaves == "Block_Group" else "blocks"
    lines = [f"# Districts side by side (issue 38, Must show {'4' if unit == 'block groups' else '1 and 4'}; "
             f"{unit} as leaves)", "",
             f"Written by `validation/districts_side_by_side.py --seed {args.seed}"
             + (" --leaves Block" if args.leaves == "Block" else "")
             + (f" --leaf-sizes {args.leaf_sizes}" if args.leaf_sizes != "published" else "")
             + (f" --truths {' '.join(args.truths)}" if args.truths != [t for t in TRUTHS if args.leaves ==
                                                                      "Block_Group" or t != "urban"] else "")
             + (f" --max-minutes {args.max_minutes:g}" if args.max_minutes else "")
             + (f" --max-iterations {args.max_iterations}" if args.max_iterations else "")
             + "` (its docstring has the method and the states): "
             f"{DISTRICTS} random contiguous districts of {SPANS[args.leaves][0]}-{SPANS[args.leaves][1]} block "
             f"groups' worth of {unit} across tract lines per "
             f"state; their quantities ({', '.join(ASKED)}) and cells scored against the truth"
             + (", and the same quantities of the tabulation block groups rebuilt from blocks, and every block's "
                "cells" if args.leaves == "Block" else "")
             + ". Expected coverage: the mean posterior mass of dpinfer's 90% intervals (above 0.9 where "
             "targets are small integers).", ""]
    pooled = []
    for truth, scores, v, seconds, leaves, shape in sections:
        head = "converged" if v["converged"] else "NOT CONVERGED (not a result yet)"
        sizes = shape["districts"]
        extra = ""
        if "tabulation block groups" in shape:
            n, same = shape["tabulation block groups"]
            extra = f"; {n} tabulation block groups, {same} of them the blocks of one spine block group"
        lines += [f"## {truth}", "",
                  f"{leaves} {unit}; districts of {sizes.min()}-{sizes.max()} {unit}{extra}; the fit {head} "
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
