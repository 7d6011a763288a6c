"""``dpinfer nmf``: the noisy measurement files of a state in, a posterior of its coarse counts
at every level out (a report with the convergence verdict first, figures per level, and a tidy
CSV of posterior summaries per geography and cell).

The model (:func:`census_model`) is a log-linear model for the coarse counts x[l, c] on the
leaves, with leaf-by-cell heterogeneity summed out in closed form:

    x[l, c] ~ NegativeBinomial(mean exp(a_c + u_{k(l), c} + v_l), shape r)
            = Poisson(exp(a_c + u_{k(l), c} + v_l) g[l, c]),  g[l, c] ~ Gamma(r, r) (mean 1),
    a_c ~ Normal(log(mean count), 2),  u_{k, c} ~ StudentT(3, 0, s_u),
    v ~ ZeroSumNormal(s_v) over the leaves,  s_u, s_v ~ HalfNormal(1),  log r ~ Normal(2, 1.5),

with k(l) the parent geography of leaf l (its county for tract leaves): a cell profile, a
parent-by-cell interaction with Student-t(3) tails (a county unlike the others, such as an AIAN
area's race profile, is not pulled to the state's profile), a leaf size (left out when every
leaf is its own parent group) and a leaf-by-cell multiplier g of relative sd 1/sqrt(r), each
shrunk. The effects are centred (the counts of a county's cell are in the hundreds or more,
where the data, not the prior, pin the effect down).

Why g is summed out: a weakly measured cell (e.g. "two or more races", a sum of 57 published
race codes, noise sd ~90 at block-group level) is pinned by its own rate, and a rate per
(leaf, cell) is pinned by its count; a sampler that alternates between the two moves by
1/sqrt(count) on the log scale per step (data augmentation with nearly all the information
missing). A log-normal w[l, c] (the model of commit 0df493d) left R-hat 1.32 and a bulk ESS
of 6 after 2 x 1000 draws on the shipped state's block groups; the negative binomial, with
the same role and one shape parameter, gave R-hat 1.014 and ESS 113 after 2 x 500.
The leaf sizes v sum to zero: with v_l ~ Normal(0, s_v) free, every a_c up and every v_l down
by the same amount leaves every rate as it is, a ridge of 28 + n_leaves coordinates that only
the priors bound; on 3 Iowa-shaped counties (81 block groups, whose sizes vary: s_v ~ 2) NUTS
gave the cell profile a bulk ESS of 8-15 per 1,000 draws even with the counts known, and 94-319
with v summing to zero.

The release is every usable measurement and constraint of the files
(:func:`~dpinfer.io.nmf.table.census_table`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse

from dpinfer.io.nmf.layout import LEVELS
from dpinfer.io.nmf.reading import read_nmf
from dpinfer.io.nmf.table import CensusTable, census_table


def census_model(table: CensusTable, *, name: str = "counts"):
    """The PyMC model of the module docstring, with ``table.release`` observed."""
    import pymc as pm

    group_of, groups = _parent_index(table)
    pilot_mean = max(float(np.mean(np.abs(table.release.values))) / 10.0, 1.0)
    coords = table.coords | {"group": np.asarray(groups)}
    with pm.Model(coords=coords) as model:
        a = pm.Normal("cell_effect", math.log(pilot_mean), 2.0, dims="cell")
        s_u = pm.HalfNormal("sd_group_cell", 1.0)
        u = pm.StudentT("group_cell", nu=3.0, mu=0.0, sigma=s_u, dims=("group", "cell"))
        log_shape = pm.Normal("log_shape", 2.0, 1.5)
        log_rate = a[None, :] + u[group_of]
        if len(table.leaves) > len(groups):
            s_v = pm.HalfNormal("sd_leaf", 1.0)
            z = pm.Normal("leaf_effect_z", 0.0, s_v, shape=len(table.leaves) - 1)
            v = pm.Deterministic("leaf_effect", _zero_sum(z), dims="geocode")
            log_rate = log_rate + v[:, None]
        counts = pm.NegativeBinomial(name, mu=pm.math.exp(log_rate), alpha=pm.math.exp(log_shape),
                                     dims=("geocode", "cell"))
        table.release.observe("nmf", counts)
    return model


def _zero_sum(z):
    """The n-vector v summing to 0 whose coordinates in an orthonormal basis of that subspace
    are z (n - 1): PyMC's ZeroSumTransform taken backwards (an isometry), so z ~ N(0, s^2 I)
    gives v ~ N(0, s^2 (I - 11'/n)), PyMC's ZeroSumNormal. Not pm.ZeroSumNormal itself because
    the compiled engine does not take one with dims yet (its value variable's shape is left
    without an input when the dims are frozen); with ``shape=`` it does."""
    from pymc.distributions.transforms import ZeroSumTransform

    return ZeroSumTransform([-1]).backward(z)


def _parent_index(table: CensusTable):
    """(index of each leaf's parent geography, the parents' geocodes)."""
    areas = table.areas
    leaf_rows = table.release.sums.leaf_area
    parents = areas.parent.to_numpy()[leaf_rows]
    unique, index = np.unique(parents, return_inverse=True)
    return index, areas.geocode.to_numpy()[unique]


def area_draws(table: CensusTable, draws: np.ndarray, level: str) -> tuple[np.ndarray, np.ndarray]:
    """(geocodes of ``level``, their sums (chains, draws, n_areas, n_cells)) from leaf draws
    (chains, draws, n_leaves, n_cells)."""
    areas = table.areas
    rows = np.flatnonzero(areas.level.to_numpy() == level)
    parent = areas.parent.to_numpy()
    leaf_area = table.release.sums.leaf_area
    member = np.full(len(areas), -1)
    member[rows] = np.arange(rows.size)
    leaf_to = np.empty(leaf_area.size, dtype=np.int64)
    for i, v in enumerate(leaf_area):
        while member[v] < 0:
            v = parent[v]
        leaf_to[i] = member[v]
    M = scipy.sparse.csr_matrix((np.ones(leaf_to.size), (leaf_to, np.arange(leaf_to.size))),
                                shape=(rows.size, leaf_to.size))
    chains, n, L, C = draws.shape
    flat = draws.reshape(chains * n, L, C).transpose(1, 0, 2).reshape(L, -1)
    out = (M @ flat).reshape(rows.size, chains * n, C).transpose(1, 0, 2).reshape(chains, n, rows.size, C)
    return areas.geocode.to_numpy()[rows], out


def summaries(table: CensusTable, idata, *, name: str = "counts", truth=None) -> pd.DataFrame:
    """A tidy table per (level, geocode, cell): posterior mean, sd, median, 5% and 95%
    quantiles, R-hat and bulk ESS (:func:`dpinfer.inference.convergence.diagnostics`), the
    cell "total" over cells, and the truth where given ((n_leaves, n_cells) counts)."""
    from dpinfer.inference.convergence import diagnostics

    draws = idata.posterior[name].values
    levels = [lv for lv in LEVELS if lv in set(table.areas.level)]
    labels = list(table.coords["cell"]) + ["total"]
    frames = []
    for level in levels:
        geocodes, sums = area_draws(table, draws, level)
        sums = np.concatenate([sums, sums.sum(-1, keepdims=True)], axis=-1).astype(float)
        c, n, A, K = sums.shape
        flat = sums.reshape(c, n, A * K)
        rhat, ess = diagnostics(flat)
        pooled = flat.reshape(c * n, A * K)
        q05, q50, q95 = np.quantile(pooled, [0.05, 0.5, 0.95], axis=0)
        frame = pd.DataFrame({
            "level": level, "geocode": np.repeat(geocodes, K), "cell": np.tile(labels, A),
            "mean": pooled.mean(0), "sd": pooled.std(0), "median": q50, "q05": q05, "q95": q95,
            "r_hat": rhat, "ess_bulk": ess})
        if truth is not None:
            _, true_sums = area_draws(table, np.asarray(truth)[None, None], level)
            true_sums = np.concatenate([true_sums, true_sums.sum(-1, keepdims=True)], axis=-1)
            frame["truth"] = true_sums.reshape(-1)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def fit_nmf(root, state, *, leaves: str = "Tract", cells="pl94-28", out=None, draws: int = 1000,
            tune: int = 1000, chains: int = 2, seed: int = 0, truth=None, progressbar: bool = True) -> Path:
    """Read ``state``'s files under ``root`` down to ``leaves``, fit :func:`census_model` with
    ``dpinfer.sample`` and write ``summary.csv``, ``report.md``, one figure per level and
    ``posterior.nc`` into ``out`` (default ``nmf-<state>-<leaves>``). ``truth``: a parquet file
    of the true histogram (geocode, cell, count; a synthetic file's ``truth.parquet``), added
    to the summaries and the figures. Returns ``out``."""
    import dpinfer as dp

    out = Path(out or f"nmf-{state}-{leaves}")
    out.mkdir(parents=True, exist_ok=True)
    levels = LEVELS[: LEVELS.index(leaves) + 1] if leaves in LEVELS else None
    if levels is None:
        raise ValueError(f"leaves must be one of {LEVELS}, got {leaves!r}")
    start = time.perf_counter()
    nmf = read_nmf(root, state, levels=levels)
    table = census_table(nmf, leaves, cells)
    read_seconds = time.perf_counter() - start
    true_counts = None
    if truth is not None:
        t = pd.read_parquet(truth)
        true_counts = table.aggregate(t["geocode"], t["cell"], t["count"])
    model = census_model(table)
    idata = dp.sample(model=model, draws=draws, tune=tune, chains=chains, random_seed=seed,
                      progressbar=progressbar)
    seconds = time.perf_counter() - start
    summary = summaries(table, idata, truth=true_counts)
    summary.to_csv(out / "summary.csv", index=False)
    idata.to_netcdf(out / "posterior.nc")
    figures = _figures(summary, out)
    verdict = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    (out / "report.md").write_text(_report(root, state, nmf, table, summary, verdict, figures,
                                           read_seconds, seconds))
    return out


def _figures(summary: pd.DataFrame, out: Path) -> list[str]:
    """One PNG per level: every geography's total population, posterior median and 90%
    interval (and the truth where known), geographies in order of their median."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for level, rows in summary[summary.cell == "total"].groupby("level", sort=False):
        rows = rows.sort_values("median")
        fig, ax = plt.subplots(figsize=(7, 3.2))
        x = np.arange(len(rows))
        ax.errorbar(x, rows["median"], yerr=[rows["median"] - rows["q05"], rows["q95"] - rows["median"]],
                    fmt="o", ms=3, lw=1, label="posterior median, 90% interval")
        if "truth" in rows:
            ax.plot(x, rows["truth"], "x", ms=4, color="black", label="truth")
        ax.set_xlabel(f"{level} (ordered by median)")
        ax.set_ylabel("persons")
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"{level.lower()}_totals.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def _report(root, state, nmf, table, summary, verdict, figures, read_seconds, seconds) -> str:
    converged = verdict["converged"]
    head = ("**Converged**" if converged else "**NOT CONVERGED: not a result yet**") + (
        f": max R-hat {verdict['max_rhat']:.4f} ({verdict['worst_rhat']}), min bulk ESS "
        f"{verdict['min_ess_bulk']:.0f} ({verdict['worst_ess']}) over {verdict['quantities']} "
        f"parameters and counts, {verdict.get('divergences', 0)} divergences (targets R-hat <= "
        f"{verdict['targets']['rhat']}, ESS >= {verdict['targets']['ess_bulk']}, no divergences).")
    if not converged:
        head += " Run again with more draws and tune (`--draws`, `--tune`)."
    privacy = nmf.privacy()
    lines = [f"# Noisy measurement files: state {state}, leaves {table.leaf_level}", "", head, "",
             f"Read {len(nmf.files)} files from `{root}` ({read_seconds:.1f} s); fit in {seconds:.0f} s in all. "
             f"{len(table.leaves)} leaves x {len(table.cells)} cells; {table.release}. "
             f"The measurements read are rho = {privacy.rho:.4g} zCDP by composition.", ""]
    if "truth" in summary:
        lines += ["## Against the truth", "", "| level | geographies x cells | 90% coverage | mean width | "
                  "mean abs error of the median |", "|---|---:|---:|---:|---:|"]
        for level, rows in summary.groupby("level", sort=False):
            inside = (rows.truth >= rows.q05) & (rows.truth <= rows.q95)
            lines.append(f"| {level} | {len(rows)} | {inside.mean():.3f} | {(rows.q95 - rows.q05).mean():.1f} | "
                         f"{(rows['median'] - rows.truth).abs().mean():.2f} |")
        lines.append("")
    lines += ["## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    lines += ["## What was used", "", _markdown(table.usage), ""]
    return "\n".join(lines)


def _markdown(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join([head, rule, *rows])
