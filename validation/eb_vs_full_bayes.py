"""Empirical Bayes against full Bayes on NMF tables where both run (issue 37, "Must show" 2).

For synthetic states of Iowa-shaped counties (:data:`dpinfer.io.nmf.synthetic.PRESETS`
``"iowa"`` with 3 and 10 counties, two truths each: seeds 2020 and 7 at 3 counties, 2020 and 8
at 10; at 10 counties seed 7's full Bayes did not finish in 2 hours, twice: one chain fell far
behind the other), read down to block
groups with 28 coarse cells (``census_table(..., "Block_Group", "pl94-28")``), the same model
(:func:`dpinfer.io.nmf.model.census_model` with the leaf sizes at their published totals, the
model ``dpinfer nmf`` runs) is fitted twice:

* **full Bayes**: ``dp.sample`` with every concentration sampled (NUTS with the counts' exact
  moves), run until it converges (R-hat <= 1.01, bulk and tail ESS >= 400 over every parameter
  and count; a fit that has not is reported as such and not used as the reference);
* **empirical Bayes**: ``dp.sample(inference="empirical-bayes")``, the concentrations at the
  mode of their marginal posterior, then the counts given them, with the concentrations held
  there (``uncertainty="none"``) or drawn every 5 draws (5 count draws after each, ``dp.sample``'s
  defaults) from the normal approximation of
  their marginal posterior (``"normal"``, ``dpinfer nmf``'s default).

With ``--leaves Block --leaf-sizes estimated`` a third fit, ``state-scan``: the sharded state
scan (:class:`dpinfer.io.nmf.state_scan.StateScan`, a shard a county up to 2, the same model
with iid leaf sizes), its split concentrations estimated by empirical Bayes from the shards'
scores, then 2,000 draws a chain given them: the state-scale method judged by the same bar.

With ``--leaves Block`` (issue 38, "Must show" 1) the states are small ones read down to blocks
(:data:`BLOCK_STATE`: 3-4 tracts a county, 2-3 block groups a tract, 6-10 blocks a block group
of ~60 persons; ``--states 1:2020 2:2020``), the same model with blocks as leaves (a fifth level
of concentrations). ``--leaf-sizes estimated``: the leaf sizes are parameters of the fit (the
model ``dpinfer nmf`` runs at block leaves; results in a file of their own).

Targets: every (area, coarse cell) and every area's voting-age population, share Hispanic and
share non-Hispanic white alone, at block group, tract and county level (and block, at block
leaves, where also DISTRICTS random contiguous unions of blocks that cross tract lines and cut
block groups are judged, drawn as in ``validation/districts_side_by_side.py`` but of 1-2 block
groups' worth of blocks). Per target and
quantile p in (0.05, 0.5, 0.95): the difference |q_EB - q_FB| against the bar 0.1 x the full-
Bayes 90% interval's width (q_0.95 - q_0.05) plus Monte Carlo error. Counts and populations are
whole numbers, whose ordinary quantiles jump by one where the cumulative probability crosses p
(a count that is 0 in 94% of one method's draws and 96% of the other's has 95% quantiles 1 and 0,
width 0): they are compared by the quantiles of the count jittered by U(-1/2, 1/2)
(:func:`jittered_quantile`), continuous in p. A share of an area of fewer than MIN_PERSONS
persons (full Bayes's median) takes a few values (0, 1/2, 1 for two persons), where quantiles
jump as the probabilities cross p: such shares are listed but not judged (the counts they are
ratios of are judged as cells). The Monte Carlo error of a
quantile estimate: the p +- sqrt(p (1 - p) / ESS) quantiles of the draws (Vehtari et al. 2021,
section 4.4: the quantile's standard error through the ESS of its indicator; here the smaller of
the target's bulk and tail ESS), half their distance a standard error; the two methods' errors
added in quadrature, and a difference is beyond Monte Carlo error when it exceeds the bar by
more than 2 combined standard errors.

Also checked: the input of ``dpinfer nmf``'s full-Bayes time predictor, the slowest
hyperparameter's ESS per draw predicted from the estimate's missing information, against the
full-Bayes fit's.

Run:  .venv/bin/python validation/eb_vs_full_bayes.py [--states 3:2020 3:7 10:2020 10:8] [--leaves Block]
      [--methods full-bayes empirical-bayes ...]  (default: all that apply)
      [--fits DIR]   (DIR keeps the fits as netCDF: a rerun reads them instead of refitting)
      [--kept-only]  (only the states whose full-Bayes fit DIR keeps; empirical-Bayes fits
                      missing there are made)
Writes validation/results/eb_vs_full_bayes.md (eb_vs_full_bayes-blocks.md with --leaves Block,
-estimated-sizes and -state-scan added to the name with those).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

RESULTS = Path(__file__).parent / "results" / "eb_vs_full_bayes.md"
LEVELS = ("County", "Tract", "Block_Group", "Block")
#: the synthetic states read down to blocks (write_synthetic_nmf's arguments but the counties and seed)
BLOCK_STATE = {"state_fips": "19", "tracts_per_county": (3, 4), "block_groups_per_tract": (2, 3),
               "blocks_per_block_group": (6, 10), "aian_tracts": 0, "mean_block_population": 60.0}
DISTRICTS = 3  # unions of blocks judged at block leaves: 1-2 block groups' worth of blocks each
QUANTILES = (0.05, 0.5, 0.95)
BAR = 0.1  # share of the full-Bayes 90% interval's width
MIN_PERSONS = 10  # shares of areas with fewer persons (full Bayes's median) are not judged: discrete
Z = 2.0  # Monte Carlo standard errors allowed beyond the bar


def derived_targets(table, leaves: str = "Block_Group"):
    """Every area's cells, voting-age population, share Hispanic and share non-Hispanic white
    alone at the levels down to ``leaves`` (NestedTargets, groups "<level> <kind>"); at block
    leaves also DISTRICTS random unions of blocks across tract lines, their cells and the same
    quantities."""
    from dpinfer.utility.baselines.nested.targets import (
        area_cell_targets,
        area_sum_targets,
        concat_targets,
        ratio_targets,
    )

    cells = list(table.cells)
    adult = [i for i, c in enumerate(cells) if c[0] == "18 and over"]
    hispanic = [i for i, c in enumerate(cells) if c[1] == "Hispanic or Latino"]
    white = [i for i, c in enumerate(cells) if c[1] == "Not Hispanic or Latino" and c[2] == "white alone"]
    everyone = list(range(len(cells)))
    out = []
    for level in LEVELS[:LEVELS.index(leaves) + 1]:
        rows = np.flatnonzero(table.areas.level.to_numpy() == level)
        name = level.replace("_", " ").lower()
        out += [area_cell_targets(table.release, rows, f"{name} cells"),
                area_sum_targets(table.release, rows, adult, f"{name} voting-age population"),
                ratio_targets(table.release, rows, hispanic, everyone, f"{name} share Hispanic"),
                ratio_targets(table.release, rows, white, everyone, f"{name} share non-Hispanic white")]
    if leaves == "Block":
        from districts_side_by_side import districts

        from dpinfer.io.nmf.areas import area_targets

        n = len(cells)
        mask = [np.isin(np.arange(n), c) for c in (adult, hispanic, white)]
        one = [(f"cell {i}", np.arange(n) == i, None) for i in range(n)]
        leaf_area = districts(table.leaves, np.random.default_rng(1), n=DISTRICTS, span=(1, 2))
        names = np.array([f"D{k}" for k in range(DISTRICTS)])
        for kind, chosen in (("cells", one), ("voting-age population", [("vap", mask[0], None)]),
                             ("share Hispanic", [("share Hispanic", mask[1], np.ones(n, bool))]),
                             ("share non-Hispanic white", [("share nh white", mask[2], np.ones(n, bool))])):
            t = area_targets(leaf_area, names, chosen, n_cells=n)
            out.append(type(t)(t.label, np.full(len(t), f"district {kind}", dtype=object), t.numerator,
                               t.denominator, t.num_area, t.num_cells, t.den_area, t.den_cells))
    return concat_targets(*out)


def quantiles_with_error(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(quantiles (3, k), their Monte Carlo standard errors (3, k)) of target draws (chains,
    draws, k) (module docstring); the targets where ``counts`` (k,) is True are whole numbers,
    jittered (:func:`jittered_quantile`)."""
    from dpinfer.inference.convergence import diagnostics, tail_ess

    chains, draws, k = values.shape
    finite = np.where(np.isfinite(values), values, 0.0)
    _, bulk = diagnostics(finite)
    ess = np.maximum(np.fmin(bulk, tail_ess(finite)), 1.0)
    pooled = values.reshape(chains * draws, k)
    q, se = np.empty((len(QUANTILES), k)), np.empty((len(QUANTILES), k))
    for i in range(k):
        column = pooled[:, i][np.isfinite(pooled[:, i])]
        for j, p in enumerate(QUANTILES):
            s = math.sqrt(p * (1 - p) / ess[i])
            q[j, i], low, high = (jittered_quantile(column, x, counts[i])
                                  for x in (p, max(p - s, 0.0), min(p + s, 1.0)))
            se[j, i] = (high - low) / 2
    return q, se


def jittered_quantile(draws: np.ndarray, p: float, whole: bool) -> float:
    """The p-quantile of ``draws``: for whole numbers, of the count jittered by a uniform on
    (-1/2, 1/2) (the continuous extension of a discrete law; Machado & Santos Silva 2005,
    "Quantiles for counts"), computed exactly: the inverse of the piecewise-linear CDF through
    (x - 1/2, P(X < x)) and (x + 1/2, P(X <= x)) at the values x drawn. Where an integer's
    ordinary quantile jumps by one as the probability crosses p (a count that is 0 in 94% of one
    method's draws and 96% of the other's has 95% quantiles 1 and 0, a 90% interval of width 0),
    this moves continuously, and a point mass has a 90% interval of width 0.9. Shares
    (``whole`` False): NumPy's linear quantile. NaN without draws."""
    if draws.size == 0:
        return math.nan
    if not whole:
        return float(np.quantile(draws, p))
    support, counts = np.unique(draws, return_counts=True)
    after = np.cumsum(counts) / draws.size
    before = after - counts / draws.size
    return float(np.interp(p, np.column_stack([before, after]).reshape(-1),
                           np.column_stack([support - 0.5, support + 0.5]).reshape(-1)))


def compare(table, full, empirical, leaves: str = "Block_Group") -> pd.DataFrame:
    """Per target: the full-Bayes and empirical-Bayes quantiles, the bar and the excess."""
    targets = derived_targets(table, leaves)
    rows = {}
    for name, idata in (("fb", full), ("eb", empirical)):
        draws = idata.posterior["counts"].values
        chains, n = draws.shape[:2]
        flat = draws.reshape(chains * n, *draws.shape[2:])
        values = targets.values(flat).reshape(chains, n, -1)
        rows[name] = quantiles_with_error(values, ~targets.is_ratio)
        if name == "fb":  # each share's denominator (the area's persons), full Bayes's median
            persons = np.median(np.asarray(targets.denominator @ flat.reshape(len(flat), -1).T), axis=1)
    (q_fb, se_fb), (q_eb, se_eb) = rows["fb"], rows["eb"]
    width = q_fb[2] - q_fb[0]
    diff = np.abs(q_eb - q_fb)
    mc = np.sqrt(se_fb**2 + se_eb**2)
    excess = diff - BAR * width - Z * mc  # > 0: beyond the bar and Monte Carlo error
    frame = pd.DataFrame({"group": targets.group, "target": targets.label, "fb_width": width})
    for j, p in enumerate(QUANTILES):
        frame[f"fb_q{int(p * 100):02d}"] = q_fb[j]
        frame[f"eb_q{int(p * 100):02d}"] = q_eb[j]
        with np.errstate(divide="ignore", invalid="ignore"):
            frame[f"diff_over_width_q{int(p * 100):02d}"] = np.where(width > 0, diff[j] / width,
                                                                     np.where(diff[j] > 0, np.inf, 0.0))
    frame["worst_excess"] = excess.max(axis=0)
    frame["meets_bar"] = frame["worst_excess"] <= 0
    frame["judged"] = ~(targets.is_ratio & (persons < MIN_PERSONS))
    return frame


METHODS = {  # name -> dp.sample options; each samples on until converged, within its max_minutes
    "full-bayes": {"inference": "full-bayes", "draws": 3000, "tune": 1000, "max_minutes": 180},
    "empirical-bayes": {"inference": "empirical-bayes", "draws": 2000, "max_minutes": 60,
                        "empirical_bayes": {"uncertainty": "none"}},
    "empirical-bayes-normal": {"inference": "empirical-bayes", "draws": 2000, "max_minutes": 60,
                               "empirical_bayes": {"uncertainty": "normal"}},
    "state-scan": {"draws": 2000},  # StateScan, theta by empirical Bayes (blocks, leaf sizes estimated)
}


def fit_all(root: str, fits: Path | None, tag: str, seed: int, leaves: str = "Block_Group",
            leaf_sizes: str = "published", methods=tuple(METHODS)):
    """(table, {method: (fit, seconds)}) for ``methods`` (of METHODS), each fit read from
    ``fits`` where an earlier run kept it; ``leaf_sizes`` as census_model's."""
    import arviz as az

    import dpinfer as dp
    from dpinfer.io.nmf.model import census_model, empirical_bayes_settings
    from dpinfer.io.nmf.table import census_table

    nmf = dp.read_nmf(root, 19, levels=("US", "State", *LEVELS[:LEVELS.index(leaves) + 1]))
    table = census_table(nmf, leaves, "pl94-28")
    out = {}
    for method in methods:
        options = METHODS[method]
        path = fits / f"{tag}-{method}.nc" if fits is not None else None
        if path is not None and path.exists():
            idata = az.from_netcdf(path)
            out[method] = (idata, float(idata.posterior.attrs.get("validation_seconds", np.nan)))
            continue
        start = time.perf_counter()
        if method == "state-scan":
            from dpinfer.io.nmf.state_scan import StateScan

            n_counties = int(np.sum(table.areas.level.to_numpy() == "County"))
            idata = StateScan(table, shards=min(n_counties, 2)).run(chains=2, random_seed=seed, **options)
            seconds = time.perf_counter() - start
            idata.posterior.attrs["validation_seconds"] = seconds
            if path is not None:
                idata.to_netcdf(path)
            out[method] = (idata, seconds)
            continue
        model = census_model(table, leaf_sizes=leaf_sizes)
        if "empirical_bayes" in options:  # as dpinfer nmf sets it (the leaf sizes drawn at blocks)
            options = options | {"empirical_bayes": empirical_bayes_settings(
                model, leaves, options["empirical_bayes"]["uncertainty"])}
        idata = dp.sample(model=model, chains=2, random_seed=seed, progressbar=True, **options)
        seconds = time.perf_counter() - start
        idata.posterior.attrs["validation_seconds"] = seconds
        if path is not None:
            idata.to_netcdf(path)
        out[method] = (idata, seconds)
    return table, out


def predictor_check(full, empirical) -> str:
    """The full-Bayes time predictor's input against the full-Bayes fit: the slowest
    hyperparameter's ESS per draw predicted from the estimate's missing information
    (:func:`dpinfer.inference.engines.compiled.engine.full_bayes_seconds`, 2 count draws a
    draw) and measured."""
    from dpinfer.inference.convergence import diagnostics, tail_ess

    estimate = json.loads(empirical.posterior.attrs["dpinfer_empirical_bayes"])
    conditional = np.asarray(estimate["conditional_sd"]["log_split"]).ravel()
    marginal = np.asarray(estimate["posterior_sd"]["log_split"]).ravel()
    rho = np.clip(1 - (conditional / marginal) ** 2, 0, 0.999) ** 2
    predicted = (1 - rho) / (1 + rho)
    values = full.posterior["log_split"].values
    chains, draws = values.shape[:2]
    values = values.reshape(chains, draws, -1)
    _, bulk = diagnostics(values)
    measured = np.fmin(bulk, tail_ess(values)) / (chains * draws)
    return (f"slowest hyperparameter's ESS per draw: predicted {predicted.min():.3f}, measured {measured.min():.3f} "
            f"(rank correlation of the two over the {predicted.size} concentrations "
            f"{pd.Series(predicted).corr(pd.Series(measured), method='spearman'):.2f})")


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    groups = frame[frame.judged].groupby("group", sort=False)
    return pd.DataFrame({
        "targets": groups.size(),
        "not judged (shares of < 10 persons)": frame[~frame.judged].groupby("group", sort=False).size().reindex(
            groups.size().index, fill_value=0),
        "meet the bar": groups["meets_bar"].mean().round(3),
        "miss it": groups["meets_bar"].apply(lambda meets: int((~meets).sum())),
        "median abs q50 diff / FB width": groups["diff_over_width_q50"].median().round(3),
        "max abs q diff / FB width": groups[[c for c in frame if c.startswith("diff_over")]].max().max(axis=1).round(3),
        "largest excess (persons or share)": groups["worst_excess"].max().round(4),
    })


def _state(text: str) -> tuple[int, int]:
    """``COUNTIES:SEED`` as (counties, seed)."""
    try:
        counties, seed = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected COUNTIES:SEED (e.g. 10:8), got {text!r}") from None
    return counties, seed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=_state, nargs="+", default=[(3, 2020), (3, 7), (10, 2020), (10, 8)],
                        metavar="COUNTIES:SEED", help="the synthetic states (default 3:2020 3:7 10:2020 10:8)")
    parser.add_argument("--leaves", default="Block_Group", choices=("Block_Group", "Block"),
                        help="Block: the small states of BLOCK_STATE read down to blocks (give --states)")
    parser.add_argument("--leaf-sizes", default="published", choices=("published", "estimated"),
                        help="census_model's leaf sizes (estimated: dpinfer nmf's default at block leaves; "
                             "results to a file of their own)")
    parser.add_argument("--methods", nargs="+", choices=tuple(METHODS), default=None,
                        help="the fits to make and compare (default: all that apply; state-scan only with "
                             "--leaves Block --leaf-sizes estimated)")
    parser.add_argument("--fits", type=Path, default=None)
    parser.add_argument("--kept-only", action="store_true",
                        help="compare only the states whose full-Bayes fit --fits already keeps "
                             "(the empirical-Bayes fits missing there are made)")
    args = parser.parse_args(argv)
    import dpinfer as dp
    from dpinfer.io.nmf.synthetic import PRESETS

    if args.fits is not None:
        args.fits.mkdir(parents=True, exist_ok=True)
    elif args.kept_only:
        parser.error("--kept-only compares with the full-Bayes fits kept in --fits DIR: give --fits")
    blocks = args.leaves == "Block"
    scan = blocks and args.leaf_sizes == "estimated"
    methods = args.methods or [m for m in METHODS if m != "state-scan" or scan]
    if "state-scan" in methods and not scan:
        parser.error("state-scan fits the model with the leaf sizes estimated at blocks: give --leaves Block "
                     "--leaf-sizes estimated")
    if "full-bayes" not in methods or len(methods) < 2:
        parser.error("--methods must include full-bayes (the reference) and a method to compare with it")
    results = RESULTS.with_name(f"{RESULTS.stem}-blocks.md") if blocks else RESULTS
    if args.leaf_sizes == "estimated":
        results = results.with_name(f"{results.stem}-estimated-sizes.md")
    if "state-scan" in methods:
        results = results.with_name(f"{results.stem}-state-scan.md")
    levels = ("US", "State", *LEVELS[:LEVELS.index(args.leaves) + 1])
    sections = []
    for counties, seed in args.states:
        tag = f"blocks{counties}-seed{seed}" if blocks else f"iowa{counties}-seed{seed}"
        tag += "-estimated-sizes" if args.leaf_sizes == "estimated" else ""
        if args.kept_only and not (args.fits / f"{tag}-full-bayes.nc").exists():
            print(f"{tag}: no full-Bayes fit kept in {args.fits}; skipped", flush=True)
            continue
        with tempfile.TemporaryDirectory() as root:
            state = BLOCK_STATE if blocks else PRESETS["iowa"]
            dp.write_synthetic_nmf(root, **(state | {"n_counties": counties, "seed": seed}), levels=levels)
            table, fits = fit_all(root, args.fits, tag, seed=11, leaves=args.leaves, leaf_sizes=args.leaf_sizes,
                                  methods=methods)
        full = fits["full-bayes"][0]
        rows = {}
        for method in methods[1:] if methods[0] == "full-bayes" else [m for m in methods if m != "full-bayes"]:
            rows[method] = summary(compare(table, full, fits[method][0], args.leaves))
            print(tag, method, rows[method].to_string(), flush=True)
        estimated = next((fits[m][0] for m in ("empirical-bayes", "state-scan") if m in fits), None)
        sections.append((tag, len(table.leaves), fits, rows,
                         predictor_check(full, estimated) if estimated is not None else "not run"))
        results.write_text(report(sections, args.leaves, args.leaf_sizes))  # after every state: a long run keeps what it has done
        print(f"wrote {results} ({len(sections)} states)", flush=True)


def verdict(idata) -> dict:
    """The fit's convergence verdict; for a fit kept by a version of dpinfer that did not judge
    tail ESS, recomputed from its draws over the same quantities."""
    from dpinfer.inference.convergence import check

    v = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    if "min_ess_tail" in v:
        return v
    redone = check(idata, list(idata.posterior.data_vars), subject=v.get("subject", "parameters and counts"))
    if redone.quantities != v["quantities"]:
        raise ValueError(f"recomputing the verdict judged {redone.quantities} quantities, the fit's {v['quantities']}")
    return redone.as_dict()


def report(sections, leaves: str = "Block_Group", leaf_sizes: str = "published") -> str:
    from dpinfer.inference.sample import EMPIRICAL_BAYES as EB

    unit = "block groups" if leaves == "Block_Group" else "blocks"
    lines = ["# Empirical Bayes against full Bayes on NMF tables (" + (
                 "issue 37, Must show 2)" if leaves == "Block_Group" else "issue 38, Must show 1: blocks as leaves)"), "",
             "Written by `validation/eb_vs_full_bayes.py"
             + (" --leaves Block" if leaves == "Block" else "")
             + (" --leaf-sizes estimated" if leaf_sizes == "estimated" else "")
             + (" --methods " + " ".join(sections[0][2]) if sections and "state-scan" in sections[0][2] else "")
             + "` (its docstring has the method), "
             f"the leaf sizes {'estimated (parameters of the fit)' if leaf_sizes == 'estimated' else 'at their published totals'}. "
             "Bar: every "
             f"quantile (5%, 50%, 95%) of every target within {BAR:g} x the full-Bayes 90% interval's width "
             f"of full Bayes's, beyond {Z:g} combined Monte Carlo standard errors. Compared with full Bayes: "
             + "; ".join(text for method, text in (
                 ("empirical-bayes", "`empirical-bayes`, the hyperparameters held at their estimate (`none`)"),
                 ("empirical-bayes-normal", f"`empirical-bayes-normal`, drawn every {EB['every']} draws, "
                                            f"{EB['burn']} count draws after each, from the normal approximation of "
                                            "their posterior (`dpinfer nmf`'s default)"),
                 ("state-scan", "`state-scan`, the sharded state scan (a shard a county, up to 2), its "
                                "concentrations estimated by empirical Bayes from the shards' scores and held there"))
                         if any(method in fits for _, _, fits, _, _ in sections)) + ".", ""]
    for tag, n_leaves, fits, rows, predictor in sections:
        lines += [f"## {tag} ({n_leaves} {unit} x 28 cells: {28 * n_leaves:,} counts)", ""]
        for method, (idata, seconds) in fits.items():
            v = verdict(idata)
            latent = v.get("latent_rhat") or {}
            rhat = (f"max R-hat {v['max_rhat']:.4f}" if np.isfinite(v["max_rhat"]) else "no parameter judged") + (
                f", the latents' max R-hat {latent['rhat']:.4f} (bound {latent['bound']:.4f} for {latent['quantities']:,})"
                if latent else "")
            lines.append(f"- {method}: {'converged' if v['converged'] else 'NOT CONVERGED'}, {rhat}, min bulk ESS {v['min_ess_bulk']:,.0f}, min tail ESS "
                         f"{v['min_ess_tail']:,.0f} over {v['quantities']:,} {v['subject']}, "
                         f"{idata.posterior.sizes['draw']:,} draws a chain, "
                         + (f"{seconds:,.0f} s" if np.isfinite(seconds) else
                            f"{idata.posterior.attrs['sampling_time']:,.0f} s of sampling (the fit was kept "
                            "without its whole time)"))
        lines += [f"- the full-Bayes time predictor: {predictor}", ""]
        for method, table in rows.items():
            judged, missed = int(table["targets"].sum()), int(table["miss it"].sum())
            lines += [f"### {method}", "", f"{missed:,} of the {judged:,} judged targets miss the bar.", "",
                      "| group | " + " | ".join(table.columns) + " |",
                      "|---|" + "---:|" * len(table.columns)]
            lines += [f"| {group} | " + " | ".join(f"{value:g}" for value in row) + " |"
                      for group, row in zip(table.index, table.to_numpy(float))]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
