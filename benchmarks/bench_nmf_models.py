"""Parameterisations of ``dpinfer nmf``'s count model, side by side with the library's
:func:`dpinfer.io.nmf.model.census_model` (the baseline): which one lets the counts of weakly
measured cells mix.

The trouble being studied (issue 23, Must show 5 and 6): a cell such as "17 and under x two or
more races" is a sum of 57 published race codes, measured with noise sd ~30-90, so its counts
are pinned by their rate and the rate by the counts (data augmentation); a Gibbs sweep moves the
pair slowly. The variants change how each parent geography's cell profile is modelled:

* ``census_model``: the library's (since issue 23's nested groupings: the rates of every level
  between the leaves and the state gamma-distributed and Dirichlet-split down the levels, all
  summed out by :func:`dpinfer.GroupedNegativeBinomial`, a shape per level and cell);
* ``student-t``: the library's model before that (Student-t(3) parent-by-cell effects as
  parameters, one scale, negative binomial counts);
* ``normal``: the same with Normal effects;
* ``cell-scales``: ``student-t`` with one scale per cell (HalfNormal(1) each) instead of one
  for all cells, so that a cell whose mix varies much between geographies (e.g. the Hispanic
  cells) is not shrunk with the scale of those that vary little;
* ``cell-scales-nc``: ``cell-scales`` with a cell's parent effects non-centred (effect = scale x
  Student-t(3)) where the least-squares pilot of the counts gives the cell fewer than
  ``RARE`` persons per parent (its effects are then set by the prior more than by the data);
* ``anova``: the parent-by-cell effect split into its ANOVA terms over the cell axes
  (votingage, hispanic, race: parent x each axis, parent x each pair, parent x all three),
  each term summing to zero over its axes (PyMC's ZeroSumTransform) with its own HalfNormal(1)
  scale, centred; a weakly measured cell then borrows its rate from the margins it shares
  with well-measured cells (every "two or more races" cell, every Hispanic cell);
* ``anova-nc``: the same, non-centred (effect = scale x standard normal);
* ``anova-fixed``: ``anova`` with the interaction terms' scales fixed at 0.5 (no hyperparameter,
  no funnel), the axis terms' scales hierarchical;
* ``grouped``, ``grouped-cells``, ``grouped-county``, ``grouped-scaled``: the parent-by-cell
  rates gamma-distributed and summed out by the engine (:func:`dpinfer.GroupedNegativeBinomial`
  with one grouping: no parent-by-cell parameter for the counts to wait on), the leaves' split
  of a parent's count Dirichlet (:func:`_grouped`).

Every variant from ``student-t`` to ``anova-fixed`` keeps the cell profile, zero-sum leaf sizes
and negative binomial counts of ``student-t``; all observe the same release. Cases: ``tract``
(the shipped synthetic state at tract leaves: the command-line example; 10 tracts in 4 parent
counties), ``shipped-bg`` (the same at block-group leaves: the side by side's table,
validation/census_nmf_study.py), ``bgN`` (an Iowa-shaped synthetic state of N counties at
block-group leaves). Each (case, variant) runs in a fresh
process; reported: seconds of ``dp.sample``, leapfrog steps per draw, max R-hat (and where),
divergences, min bulk ESS over the counts and over the parameters, 90% coverage of the cells
against the truth per level.

Run:  .venv/bin/python benchmarks/bench_nmf_models.py --case tract --variants census_model anova \\
          [--draws 3000 --tune 1000 --sweep 1 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import tempfile
import time

import numpy as np
from fresh_process import child_result, report

VARIANTS = ("census_model", "student-t", "normal", "cell-scales", "cell-scales-nc", "anova", "anova-nc", "anova-fixed",
            "grouped", "grouped-cells", "grouped-county", "grouped-scaled")
RARE = 30.0
SHIPPED = "models/synthetic_state_nmf"


def _table(case: str):
    import pandas as pd

    import dpinfer as dp
    from dpinfer.io.nmf.synthetic import PRESETS
    from dpinfer.io.nmf.table import census_table

    if case in ("tract", "shipped-bg"):
        leaves = "Tract" if case == "tract" else "Block_Group"
        nmf = dp.read_nmf(SHIPPED, 19, levels=("US", "State", "County", "Tract", "Block_Group")[:4 + (case != "tract")])
        table = census_table(nmf, leaves, "pl94-28")
        truth = pd.read_parquet(f"{SHIPPED}/truth.parquet")
    elif case.startswith("bg") and case[2:].isdigit():
        with tempfile.TemporaryDirectory() as root:
            dp.write_synthetic_nmf(root, **(PRESETS["iowa"] | {"n_counties": int(case[2:])}))
            nmf = dp.read_nmf(root, 19, levels=("US", "State", "County", "Tract", "Block_Group"))
            table = census_table(nmf, "Block_Group", "pl94-28")
            truth = pd.read_parquet(f"{root}/truth.parquet")
    else:
        raise SystemExit(f"--case must be 'tract', 'shipped-bg' or 'bgN' (N counties), got {case!r}")
    return table, table.aggregate(truth["geocode"], truth["cell"], truth["count"])


def _model(table, variant: str):
    import pymc as pm

    from dpinfer.io.nmf.model import _zero_sum, census_model

    if variant == "census_model":
        return census_model(table)
    group_of, groups = _parent_index(table)
    if variant.startswith("grouped"):
        return _grouped(table, group_of, groups, variant)
    pilot_mean = max(float(np.mean(np.abs(table.release.values))) / 10.0, 1.0)
    with pm.Model(coords=table.coords | {"group": np.asarray(groups)}) as model:
        a = pm.Normal("cell_effect", math.log(pilot_mean), 2.0, dims="cell")
        if variant in ("student-t", "normal"):
            s_u = pm.HalfNormal("sd_group_cell", 1.0)
            u = (pm.StudentT("group_cell", nu=3.0, mu=0.0, sigma=s_u, dims=("group", "cell")) if variant == "student-t"
                 else pm.Normal("group_cell", 0.0, s_u, dims=("group", "cell")))
        elif variant == "cell-scales":
            s_u = pm.HalfNormal("sd_group_cell", 1.0, dims="cell")
            u = pm.StudentT("group_cell", nu=3.0, mu=0.0, sigma=s_u, dims=("group", "cell"))
        elif variant == "cell-scales-nc":
            rare = _per_parent_pilot(table, group_of, len(groups)) < RARE
            s_u = pm.HalfNormal("sd_group_cell", 1.0, dims="cell")
            raw = pm.StudentT("group_cell_raw", nu=3.0, mu=0.0, sigma=pm.math.where(rare, 1.0, s_u),
                              dims=("group", "cell"))
            u = pm.Deterministic("group_cell", pm.math.where(rare, s_u * raw, raw), dims=("group", "cell"))
        else:
            u = _anova_effects(table, len(groups), variant)
        log_rate = a[None, :] + u[group_of]
        s_v = pm.HalfNormal("sd_leaf", 1.0)
        z = pm.Normal("leaf_effect_z", 0.0, s_v, shape=len(table.leaves) - 1)
        v = pm.Deterministic("leaf_effect", _zero_sum(z), dims="geocode")
        log_shape = pm.Normal("log_shape", 2.0, 1.5)
        counts = pm.NegativeBinomial("counts", mu=pm.math.exp(log_rate + v[:, None]),
                                     alpha=pm.math.exp(log_shape), dims=("geocode", "cell"))
        table.release.observe("nmf", counts)
    return model


def _grouped(table, group_of, groups, variant):
    """Parent-by-cell rates gamma-distributed and summed out (dp.GroupedNegativeBinomial):
    mu[l, c] = exp(a_c + v_l), the parent's rate of cell c Gamma(shape alpha_g, mean sum of mu
    over its leaves), its split Dirichlet(A pi); alpha_g one for all cells (``grouped``,
    ``grouped-county``) or one per cell (``grouped-cells``), log alpha_g ~ Normal(1, 1.5),
    log A ~ Normal(2, 1.5). ``grouped-county`` adds, where the parents have more than one
    parent themselves (block-group leaves: tracts in counties), a Student-t(3) county-by-cell
    effect on log mu (one HalfNormal(1) scale) for areas unlike the others. ``grouped-scaled``:
    the shape grows with the parent's expected count, log alpha[g, c] = b0 + b1 log M[g, c]
    (b0 ~ Normal(1, 1.5), b1 ~ Normal(0.5, 0.5)): small cells may vary more, relatively, than
    large ones."""
    import pymc as pm

    import dpinfer as dp
    from dpinfer.io.nmf.model import _zero_sum

    pilot_mean = max(float(np.mean(np.abs(table.release.values))) / 10.0, 1.0)
    with pm.Model(coords=table.coords) as model:
        a = pm.Normal("cell_effect", math.log(pilot_mean), 2.0, dims="cell")
        log_rate = a[None, :]
        if len(table.leaves) > len(groups):
            s_v = pm.HalfNormal("sd_leaf", 1.0)
            z = pm.Normal("leaf_effect_z", 0.0, s_v, shape=len(table.leaves) - 1)
            log_rate = log_rate + pm.Deterministic("leaf_effect", _zero_sum(z), dims="geocode")[:, None]
        if variant == "grouped-county":
            rows = {g: i for i, g in enumerate(table.areas.geocode)}
            county, county_of = np.unique(table.areas.parent.to_numpy()[[rows[g] for g in groups]],
                                          return_inverse=True)
            if county.size > 1:
                s_u = pm.HalfNormal("sd_county_cell", 1.0)
                u = pm.StudentT("county_cell", nu=3.0, mu=0.0, sigma=s_u, shape=(county.size, len(table.cells)))
                log_rate = log_rate + u[county_of[group_of]]
        if variant == "grouped-scaled":  # log alpha[g, c] = b0 + b1 log M[g, c]
            b0 = pm.Normal("group_shape_intercept", 1.0, 1.5)
            b1 = pm.Normal("group_shape_slope", 0.5, 0.5)
            size = pm.math.log(pm.math.exp(log_rate).T @ np.eye(len(groups))[group_of]).T  # log M (G, C)
            log_a = b0 + b1 * size
        else:
            log_a = pm.Normal("log_group_shape", 1.0, 1.5, **({"dims": "cell"} if variant == "grouped-cells" else {}))
        log_leaf = pm.Normal("log_leaf_shape", 2.0, 1.5)
        counts = dp.GroupedNegativeBinomial("counts", pm.math.exp(log_rate), pm.math.exp(log_leaf),
                                            pm.math.exp(log_a), group_of, dims=("geocode", "cell"))
        table.release.observe("nmf", counts)
    return model


def _parent_index(table):
    """(index of each leaf's parent geography, the parents' geocodes)."""
    areas = table.areas
    parents = areas.parent.to_numpy()[table.release.sums.leaf_area]
    unique, index = np.unique(parents, return_inverse=True)
    return index, areas.geocode.to_numpy()[unique]


def _per_parent_pilot(table, group_of, n_groups) -> np.ndarray:
    """Per cell, the mean over parents of the least-squares pilot's count of the parent and cell."""
    from dpinfer.inference.planning.nested import pilot_estimate

    pilot = pilot_estimate(table.release.sums, (0, None)).reshape(len(table.leaves), len(table.cells))
    per_parent = np.zeros((n_groups, pilot.shape[1]))
    np.add.at(per_parent, group_of, pilot)
    return per_parent.mean(axis=0)


def _anova_effects(table, n_groups, variant):
    """(n_groups, n_cells): the sum over every non-empty set S of cell axes of a term
    u_S[group, levels of S] summing to zero over each axis in S."""
    import pymc as pm
    from pymc.distributions.transforms import ZeroSumTransform

    from dpinfer.io.nmf.layout import AXES

    shape = table.coarse.shape
    names = [a for a, s in zip(AXES, table.coarse.axes) if s != "*"]
    levels = np.array(np.unravel_index(np.arange(int(np.prod(shape))), shape)).T
    total = 0.0
    for r in range(1, len(shape) + 1):
        for S in itertools.combinations(range(len(shape)), r):
            name = "group_" + "_".join(names[i] for i in S)
            scale = 0.5 if (variant == "anova-fixed" and r >= 2) else pm.HalfNormal("sd_" + name, 1.0)
            coords_shape = (n_groups, *[shape[i] - 1 for i in S])
            if variant == "anova-nc":
                z = pm.Normal(name + "_z", 0.0, 1.0, shape=coords_shape)
                term = scale * ZeroSumTransform(list(range(-r, 0))).backward(z)
            else:
                z = pm.Normal(name + "_z", 0.0, scale, shape=coords_shape)
                term = ZeroSumTransform(list(range(-r, 0))).backward(z)
            total = total + term[(slice(None), *(levels[:, i] for i in S))]
    return total


def child(case: str, variant: str, draws: int, tune: int, sweep: tuple, seed: int) -> None:
    import dpinfer as dp
    from dpinfer.inference.convergence import diagnostics
    from dpinfer.io.nmf.fit import summaries

    table, truth = _table(case)
    model = _model(table, variant)
    start = time.perf_counter()
    idata = dp.sample(model=model, draws=draws, tune=tune, chains=2, random_seed=seed, progressbar=False,
                      nuts_per_sweep=sweep[0], counts_per_sweep=sweep[1])
    seconds = time.perf_counter() - start
    post, stats = idata.posterior, idata.sample_stats
    ess = {}
    for name in post.data_vars:
        values = post[name].values
        ess[name] = float(np.nanmin(diagnostics(values.reshape(values.shape[0], values.shape[1], -1))[1]))
    verdict = json.loads(post.attrs["dpinfer_convergence"])
    summary = summaries(table, idata, truth=truth)
    cells = summary[summary.cell != "total"]
    coverage = {level: round(float(((r.q05 <= r.truth) & (r.truth <= r.q95)).mean()), 3)
                for level, r in cells.groupby("level", sort=False)}
    report({
        "case": case, "variant": variant, "counts": int(truth.size), "seconds": round(seconds, 1),
        "steps_per_draw": round(float(stats["n_steps"].values.mean()), 1),
        "max_rhat": round(verdict["max_rhat"], 3), "worst": verdict["worst_rhat"],
        "divergences": int(stats["diverging"].values.sum()), "min_ess_counts": round(ess["counts"]),
        "min_ess_params": round(min(v for k, v in ess.items() if k != "counts")), "coverage": coverage})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="tract", help="'tract', 'shipped-bg' (the shipped state at block-group "
                        "leaves: the side by side's table) or 'bgN' (N Iowa-shaped counties)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--sweep", type=int, nargs=2, default=(1, 1), metavar=("NUTS", "COUNTS"),
                        help="NUTS transitions and count draws per stored draw (dp.sample's defaults: 3 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--_child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        case, variant, draws, tune, nuts, counts, seed = args._child
        return child(case, variant, int(draws), int(tune), (int(nuts), int(counts)), int(seed))
    rows = []
    for variant in args.variants:
        print(f"--- {args.case}, {variant}, 2 chains x ({args.tune} + {args.draws}), sweep {args.sweep}", flush=True)
        rows.append(child_result(__file__, [args.case, variant, args.draws, args.tune, *args.sweep, args.seed],
                                 variant))
    print("\n| variant | dp.sample | steps/draw | max R-hat (where) | divergences | min ESS counts | "
          "min ESS params | 90% coverage of cells by level |")
    print("|---|---:|---:|---|---:|---:|---:|---|")
    for r in rows:
        cover = ", ".join(f"{k} {v}" for k, v in r["coverage"].items())
        print(f"| {r['variant']} | {r['seconds']:.0f} s | {r['steps_per_draw']:.0f} | {r['max_rhat']:.3f} "
              f"({r['worst']}) | {r['divergences']} | {r['min_ess_counts']} | {r['min_ess_params']} | {cover} |")


if __name__ == "__main__":
    main()
