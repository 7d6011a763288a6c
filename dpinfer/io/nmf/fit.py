"""``dpinfer nmf``: the noisy measurement files of a state in, a posterior of its coarse counts
at every level out (a report with the convergence verdict first, figures per level, and a tidy
CSV of posterior summaries per geography and cell).

The model (:func:`census_model`) is a Poisson model for the coarse counts x[l, c] on the
leaves whose rates vary between geographies at every level of the spine, with every rate
summed out (:func:`dpinfer.GroupedNegativeBinomial` with nested groupings): for block-group
leaves in tracts in counties in the state (or its parts) in the nation,

    the nation's rate of cell c ~ Gamma(shape 1/2, mean m0),
    each area's rate of cell c split among its children ~ Dirichlet(A_k[c] x their shares w),
        k the area's level (nation, state, county, tract),
    x[l, c] ~ Poisson(the block group's rate),
    w_l = softmax(v)_l summed over the child's leaves,  v ~ ZeroSumNormal(s_v) over the leaves,
    s_v ~ HalfNormal(1),  log A_k[c] ~ Normal(2, 1.5),

m0 = the mean absolute published value / 10 x the number of leaves (an order of magnitude; the
shape 1/2 gives the nation's log rate an sd of 2.2, so m0 hardly matters). The leaf sizes w
are shared by the cells; how far a cell's share strays from them between the counties of a
state, the tracts of a county and the block groups of a tract is learnt per cell and level: a
race group present in a few counties only gets a small A_county[c], a common cell a large one,
without one cell's spread setting another's.

Why summed out: a weakly measured cell (e.g. "two or more races", a sum of 57 published race
codes, noise sd ~90 at block-group level) is pinned by its geography's rate, and a rate per
(geography, cell) as a parameter is pinned by its counts; a sampler that alternates between
the two (data augmentation with nearly all the information missing) crawls. The previous model
(Student-t parent-by-cell effects as parameters and a cell profile, negative binomial counts;
the ``student-t`` variant of ``benchmarks/bench_nmf_models.py``) stuck on the shipped state's
block groups with one NUTS transition and one count draw per draw (R-hat 1.835, ESS 3 after
2 x (1000 + 2000)), and it needed ~28,000 parameters at the size of Iowa, this one ~2,800
(leaf sizes and 4 x 28 concentrations). With the rates summed out the engine's count moves are
exact given the concentrations (:mod:`dpinfer.lattice.nested`), and NUTS sees no parameter
that a single count pins down. (A cell profile as a parameter, the nation's rate of each cell,
was the slowest to mix once the rest was summed out: R-hat 1.017, ESS 321 after 2 x (1000 +
1000) on the shipped state's block groups; summed out, 1.0057 and 680.) A gamma at the parent
level alone with one shape for all cells mixed as well but undercovered (block-group cells
0.927 against 0.969 expected): one shape had to fit both the county-wide race profiles and the
small differences between a county's tracts, settled near 0.04 and put small cells' rates
near zero. The leaf sizes v sum to zero (softmax ignores a common shift, which would otherwise
be a direction only the prior bounds).

The release is every usable measurement and constraint of the files
(:func:`~dpinfer.io.nmf.table.census_table`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse

from dpinfer.io.nmf.layout import LEVELS
from dpinfer.io.nmf.reading import read_nmf
from dpinfer.io.nmf.table import CensusTable, census_table


ROOT_SHAPE = 0.5  # the nation's rate of a cell: Gamma(0.5, mean m0), log sd 2.2 (module docstring)


LEAF_SIZES = ("estimated", "published")


def census_model(table: CensusTable, *, name: str = "counts", leaf_sizes: str = "estimated"):
    """The PyMC model of the module docstring, with ``table.release`` observed.

    ``leaf_sizes``: "estimated" (the default: the zero-sum leaf sizes v ~ ZeroSumNormal(s_v) of
    the module docstring, parameters of the fit) or "published" (w_l ∝ max(T_l, 1), T_l the
    leaf's most precise published total, :func:`published_leaf_totals`: an empirical-Bayes
    plug-in, no leaf-size parameter; the totals then enter both the prior and the
    likelihood, which should matter little where their noise is small against the leaves'
    size, e.g. sd 1.8 persons at block groups of several hundred, but is not yet checked by
    SBC: a study case of issue 23 (benchmarks/README.md), not the command's model)."""
    import pymc as pm
    import pytensor.tensor as pt

    import dpinfer as dp

    if leaf_sizes not in LEAF_SIZES:
        raise ValueError(f"leaf_sizes must be one of {LEAF_SIZES}, got {leaf_sizes!r}")
    groupings = spine_groupings(table)
    n_leaves = len(table.leaves)
    root_mean = max(float(np.mean(np.abs(table.release.values))) / 10.0, 1.0) * n_leaves
    with pm.Model(coords=table.coords | {"spine_level": groupings_levels(table)}) as model:
        share = pt.ones(1)
        if leaf_sizes == "published":
            totals = np.maximum(published_leaf_totals(table), 1.0)
            share = pt.as_tensor(totals / totals.sum())
        elif n_leaves > 1:
            s_v = pm.HalfNormal("sd_leaf", 1.0)
            z = pm.Normal("leaf_effect_z", 0.0, s_v, shape=n_leaves - 1)
            share = pt.special.softmax(pm.Deterministic("leaf_effect", _zero_sum(z), dims="geocode"))
        log_split = pm.Normal("log_split", 2.0, 1.5, dims=("spine_level", "cell"))
        mu = root_mean * share[:, None] * pt.ones((1, len(table.cells)))
        counts = dp.GroupedNegativeBinomial(name, mu, [pm.math.exp(log_split[k]) for k in range(len(groupings))],
                                            ROOT_SHAPE, groupings, dims=("geocode", "cell"))
        table.release.observe("nmf", counts)
    return model


def published_leaf_totals(table: CensusTable) -> np.ndarray:
    """Each leaf's published total population (n_leaves,): its exact total where a constraint
    fixes it, else the value of its most precise measurement of all the cells (the smallest
    noise variance, summed noises counted). Raises if a leaf has neither."""
    sums = table.release.sums
    leaf = sums.area_leaf[sums.term_area]
    best = np.full(len(table.leaves), np.inf)
    total = np.full(len(table.leaves), np.nan)
    for r in np.flatnonzero((leaf >= 0) & sums.term_cells.all(axis=1)):
        kind, sigma2, m = sums.tables.params(int(sums.term_table[r]))
        variance = 0.0 if kind == "eq" else sigma2 * m if kind == "dg" else np.inf
        if variance < best[leaf[r]]:
            best[leaf[r]], total[leaf[r]] = variance, float(sums.term_value[r])
    missing = np.flatnonzero(np.isnan(total))
    if missing.size:
        raise ValueError(f"leaf_sizes='published' needs every leaf's total; leaves "
                         f"{list(table.leaves[missing[:5]])} have no measurement or equality of all the cells")
    return total


def _spine_parents(table: CensusTable) -> list[np.ndarray]:
    """Rows (in ``table.areas``) of each leaf's ancestors, level by level from its parent up to
    the root (the leaf itself when it is the root)."""
    parent = table.areas.parent.to_numpy()
    leaves = table.release.sums.leaf_area
    chain = [parent[leaves] if np.all(parent[leaves] >= 0) else leaves]
    while np.all(parent[chain[-1]] >= 0):
        chain.append(parent[chain[-1]])
    return chain


def spine_groupings(table: CensusTable) -> list[np.ndarray]:
    """Each leaf's group at each level of the spine above the leaves up to the root (finest
    first): the groupings of :func:`census_model`'s GroupedNegativeBinomial."""
    return [np.unique(rows, return_inverse=True)[1].astype(np.int64) for rows in _spine_parents(table)]


def groupings_levels(table: CensusTable) -> list[str]:
    """The spine level of each of :func:`spine_groupings` (e.g. ["Tract", "County", "State", "US"])."""
    level = table.areas.level.to_numpy()
    return [str(level[rows[0]]) for rows in _spine_parents(table)]


def _zero_sum(z):
    """The n-vector v summing to 0 whose coordinates in an orthonormal basis of that subspace
    are z (n - 1): PyMC's ZeroSumTransform taken backwards (an isometry), so z ~ N(0, s^2 I)
    gives v ~ N(0, s^2 (I - 11'/n)), PyMC's ZeroSumNormal. Not pm.ZeroSumNormal itself because
    the compiled engine does not take one with dims yet (its value variable's shape is left
    without an input when the dims are frozen); with ``shape=`` it does."""
    from pymc.distributions.transforms import ZeroSumTransform

    return ZeroSumTransform([-1]).backward(z)


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
            tune: int = 1000, chains: int = 2, seed: int = 0, truth=None, progressbar: bool = True,
            checkpoint_every: int | None = None) -> Path:
    """Read ``state``'s files under ``root`` down to ``leaves``, fit :func:`census_model` with
    ``dpinfer.sample`` and write ``summary.csv``, ``report.md``, one figure per level and
    ``posterior.nc`` into ``out`` (default ``nmf-<state>-<leaves>``). ``truth``: a parquet file
    of the true histogram (geocode, cell, count; a synthetic file's ``truth.parquet``), added
    to the summaries and the figures. ``checkpoint_every``: save the chains every this many
    iterations in ``out/checkpoint`` (``dpinfer.sample(checkpoint=...)``), and continue from
    there if an earlier run of the same fit was interrupted; removed once the outputs are
    written. Returns ``out``."""
    import dpinfer as dp
    from dpinfer.inference.checkpoint import resume_or_start

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
    checkpoint = out / "checkpoint"
    idata = dp.sample(model=model, draws=draws, tune=tune, chains=chains, random_seed=seed,
                      progressbar=progressbar,
                      **(resume_or_start(checkpoint, checkpoint_every) if checkpoint_every else {}))
    seconds = time.perf_counter() - start
    summary = summaries(table, idata, truth=true_counts)
    summary.to_csv(out / "summary.csv", index=False)
    idata.to_netcdf(out / "posterior.nc")
    figures = _figures(summary, out)
    verdict = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    (out / "report.md").write_text(_report(root, state, nmf, table, summary, verdict, figures,
                                           read_seconds, seconds))
    shutil.rmtree(checkpoint, ignore_errors=True)  # the fit is in posterior.nc now
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
