"""``dpinfer nmf``: the noisy measurement files of a state in, a posterior of its coarse counts
at every level out (a report with the convergence verdict first, figures per level, and a tidy
CSV of posterior summaries per geography and cell). The model is
:func:`~dpinfer.io.nmf.model.census_model`.
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
from dpinfer.io.nmf.model import census_model
from dpinfer.io.nmf.reading import read_nmf
from dpinfer.io.nmf.table import CensusTable, census_table


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
