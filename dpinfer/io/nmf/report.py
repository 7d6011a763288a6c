"""``dpinfer nmf``'s report: ``report.html`` and a figure per level.

The page opens with what a reader must know before any number: the method that ran (full or
empirical Bayes, and why: ``posterior.attrs["dpinfer_inference"]``; the empirical-Bayes
estimate's method and Monte Carlo error), the convergence verdict (a fit that has not
converged says so first and is not a result), every recovery the fit made (windows widened, a
resume), and the table's size. Then, per level, every
area's total population with dpinfer's posterior median and 90% interval beside the GLS
estimate +- 1.645 sd (the Census Bureau's GLS on the same measurements) and the truth where
known (and the same for every area's share Hispanic, where the two differ visibly); against
the truth, the coverage, width and error of both per level and quantity; and which published
measurements and constraints were used.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dpinfer.io.report import recoveries_html

Z90 = 1.6448536269514722  # the standard normal's 95% quantile: GLS +- Z90 sd is a 90% interval


def write_report(out: Path, *, root, state, nmf, table, idata, summary: pd.DataFrame, seconds: dict) -> Path:
    """Write the figures and ``report.html`` into ``out`` (module docstring); returns the page."""
    figures = level_figures(summary, out)
    page = out / "report.html"
    page.write_text(report_html(root=root, state=state, nmf=nmf, table=table, attrs=dict(idata.posterior.attrs),
                                summary=summary, figures=figures, seconds=seconds,
                                recoveries=recoveries_html(idata)))
    return page


def verdict_text(verdict: dict) -> str:
    """One sentence: converged or not (and then that it is not a result), the worst R-hat and
    the smallest bulk and tail ESS with the quantities they belong to, against the targets."""
    converged = verdict["converged"]
    unsettled = verdict.get("estimate_not_settled")
    rhat = (f"max R-hat {verdict['max_rhat']:.4f} ({verdict['worst_rhat']})" if math.isfinite(verdict["max_rhat"])
            else "no parameters' R-hat")
    latent = verdict.get("latent_rhat")
    if latent:  # the many latents judged as a family (dpinfer.inference.convergence.latent_rhat_bound)
        rhat += (f", the {latent['quantities']:,} latents' R-hat {'within' if latent['ok'] else 'OVER'} their "
                 f"bound for so many (nearest it: {latent['worst']} {latent['rhat']:.4f}, bound {latent['bound']:.4f})")
    text = ("Converged" if converged else "NOT CONVERGED: not a result yet") + (
        f" ({unsettled}; the draws given it)" if unsettled else "") + (
        f": {rhat}, min bulk ESS "
        f"{verdict['min_ess_bulk']:.0f} ({verdict['worst_ess']}), min tail ESS "
        f"{verdict.get('min_ess_tail', float('nan')):.0f} ({verdict.get('worst_ess_tail', '')}) over "
        f"{verdict['quantities']} {verdict.get('subject', 'parameters and counts')}, "
        f"{verdict.get('divergences', 0)} divergences (targets R-hat <= {verdict['targets']['rhat']}, bulk "
        f"and tail ESS >= {verdict['targets']['ess_bulk']}, no divergences).")
    if not converged:
        text += " Run again with a larger --max-minutes (or more --draws)."
    return text


def method_text(attrs: dict) -> str:
    """What ran and why (``dpinfer_inference``) and the empirical-Bayes estimate's method."""
    chosen = json.loads(attrs.get("dpinfer_inference", "{}"))
    used = chosen.get("inference", "full-bayes")
    text = f"{'Full Bayes' if used == 'full-bayes' else 'Empirical Bayes'} ({chosen.get('why', 'asked for')})."
    estimate = json.loads(attrs.get("dpinfer_empirical_bayes", "{}"))
    if estimate:
        text += (f" Hyperparameters' estimate: {estimate['method']}; {estimate['iterations']} iterations, "
                 f"{'settled' if estimate['settled'] else 'NOT SETTLED'} (Monte Carlo error at most "
                 f"{estimate['tolerance']:g} of each hyperparameter's approximate posterior sd).")
        if used == "empirical-bayes":
            text += (" An approximation: its cost against full Bayes is measured in "
                     "validation/results/eb_vs_full_bayes.md.")
    return text


def truth_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Against the truth, per level and kind of quantity (cells, total, voting-age population,
    shares): 90% coverage, mean width and mean absolute error of dpinfer (median) and GLS."""
    kinds = summary.cell.where(summary.cell.isin(["total", "voting-age population", "share Hispanic",
                                                  "share non-Hispanic white alone"]), "cells")
    rows = []
    for (level, kind), part in summary.assign(kind=kinds).groupby(["level", "kind"], sort=False):
        part = part[part.truth.notna() & part["median"].notna()]
        if part.empty:
            continue
        row = {"level": level, "quantity": kind, "targets": len(part),
               "dpinfer coverage": ((part.q05 <= part.truth) & (part.truth <= part.q95)).mean(),
               "dpinfer width": (part.q95 - part.q05).mean(),
               "dpinfer MAE": (part["median"] - part.truth).abs().mean()}
        if "gls" in part:
            lo, hi = part.gls - Z90 * part.gls_sd, part.gls + Z90 * part.gls_sd
            row |= {"GLS coverage": ((lo <= part.truth) & (part.truth <= hi)).mean(),
                    "GLS width": (hi - lo).mean(), "GLS MAE": (part.gls - part.truth).abs().mean()}
        rows.append(row)
    return pd.DataFrame(rows)


FIGURE_QUANTITIES = ("total", "share Hispanic")  # a panel each, where the summaries have them


def level_figures(summary: pd.DataFrame, out: Path) -> list[str]:
    """One PNG per level, a panel per quantity of FIGURE_QUANTITIES the summaries have (every
    area's total population; its share Hispanic, where the intervals differ visibly): dpinfer's
    posterior median and 90% interval beside GLS +- 1.645 sd and the truth where known, areas
    in order of the median (at most 200 areas shown: evenly spaced in that order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    wanted = [q for q in FIGURE_QUANTITIES if q in set(summary.cell)]
    for level, part in summary.groupby("level", sort=False):
        fig, axes = plt.subplots(len(wanted), 1, figsize=(8, 3.0 * len(wanted)), squeeze=False)
        for ax, quantity in zip(axes[:, 0], wanted):
            rows = part[part.cell == quantity].dropna(subset=["median"]).sort_values("median")
            shown = len(rows) > 200
            if shown:
                rows = rows.iloc[np.unique(np.linspace(0, len(rows) - 1, 200).round().astype(int))]
            x = np.arange(len(rows))
            ax.errorbar(x - 0.15, rows["median"], yerr=[rows["median"] - rows["q05"], rows["q95"] - rows["median"]],
                        fmt="o", ms=3, lw=1, label="dpinfer: posterior median, 90% interval")
            if "gls" in rows:
                ax.errorbar(x + 0.15, rows["gls"], yerr=Z90 * rows["gls_sd"], fmt="s", ms=2, lw=0.8, alpha=0.7,
                            label="GLS estimate +- 1.645 sd")
            if "truth" in rows:
                ax.plot(x, rows["truth"], "x", ms=4, color="black", label="truth")
            ax.set_xlabel(f"{level} (ordered by the posterior median{'; 200 shown' if shown else ''})")
            ax.set_ylabel("persons" if quantity == "total" else quantity)
            ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{level.lower()}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def report_html(*, root, state, nmf, table, attrs: dict, summary: pd.DataFrame, figures: list,
                seconds: dict, recoveries: str = "") -> str:
    """The page (module docstring); ``recoveries``: the fit's recoveries section
    (:func:`dpinfer.io.report.recoveries_html`), after the verdict."""
    esc = html.escape
    verdict = json.loads(attrs["dpinfer_convergence"])
    converged = verdict["converged"]
    sums = table.release.sums
    privacy = nmf.privacy()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>dpinfer nmf: state {esc(str(state))}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}"
        ".converged{color:#1a6b1a}.not-converged{color:#b00020}table{border-collapse:collapse;font-size:90%}"
        "td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>",
        f"<h1>Noisy measurement files: state {esc(str(state))}, {esc(table.leaf_level)} leaves</h1>",
        f"<p id='method'><b>Method.</b> {esc(method_text(attrs))}</p>",
        f"<h2 id='verdict' class='{'converged' if converged else 'not-converged'}'>"
        f"{esc(verdict_text(verdict))}</h2>",
        recoveries,
        f"<p id='sizes'><b>Table.</b> {len(table.leaves):,} leaves x {len(table.cells)} cells = "
        f"{len(table.leaves) * len(table.cells):,} latent counts; {sums.term_value.size:,} terms "
        f"(measurements, equalities, bounds) from {len(nmf.files)} files under {esc(str(root))} (levels "
        f"{esc(', '.join(nmf.levels))}); rho = {privacy.rho:.4g} zCDP by composition for the measurements "
        f"read. Fitted in {seconds['fit']:.0f} s, {seconds['all']:.0f} s in all.</p>",
        "<h2>Every area's total and share Hispanic, level by level</h2>",
    ]
    parts += [f"<p><img src='{esc(f)}' alt='{esc(f)}'></p>" for f in figures]
    if "truth" in summary:
        parts += ["<h2>Against the truth</h2>",
                  truth_table(summary).to_html(index=False, float_format=lambda v: f"{v:.3g}")]
    parts += ["<h2>What was used</h2>", table.usage.to_html(index=False), "</body></html>"]
    return "\n".join(parts)
