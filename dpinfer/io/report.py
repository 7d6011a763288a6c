"""The report of a fit: posterior (netCDF), summary table (CSV) and an HTML page with figures.

``write_report(directory, idata, ...)`` writes

* ``posterior.nc``: the ``dp.sample`` result (ArviZ/xarray DataTree, netCDF via h5netcdf);
* ``summary.csv``: ``arviz.summary`` of every parameter (90% equal-tailed intervals, R-hat,
  bulk and tail ESS, Monte Carlo standard errors);
* ``counts.csv``: per released cell the release, the post-processed baseline (least-squares
  projection onto the invariants, then integer rounding: :mod:`dpinfer.utility.baselines`), the
  truth where known, and the posterior median and 90% interval of the true count;
* ``counts.png``: those intervals beside the release, the baseline and the truth;
* ``parameters.png``: the posterior of each scalar parameter (histogram per chain);
* ``index.html``: at the top, whether the fit converged (the largest R-hat and the smallest
  bulk and tail ESS over every parameter and count, with the quantities they belong to, and the
  divergent transitions, against R-hat <= 1.01, ESS >= 400 and none) and, if it did not, what
  to do; the exposure used, the template's parameterisation and every fit ``dpinfer fit``
  made; every recovery the fit made (windows widened, a resume); then all of the above with the diagnostics (divergences, the largest R-hat and the
  smallest ESS, dpinfer's report: engine, method, windows and their bounds).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd

SCALAR_LIMIT = 12  # parameters shown in parameters.png


def count_table(idata, latent: str, release: np.ndarray, labels, *, baseline=None,
                truth=None, prob: float = 0.9) -> pd.DataFrame:
    """Per cell: release, baseline, truth (where given), posterior median and central
    ``prob`` interval of the latent counts (``latent`` in ``idata.posterior``)."""
    draws = idata.posterior[latent]
    flat = draws.values.reshape(draws.shape[0] * draws.shape[1], -1)
    lo, med, hi = np.quantile(flat, [(1 - prob) / 2, 0.5, (1 + prob) / 2], axis=0)
    table = pd.DataFrame({"cell": [str(v) for v in labels], "release": np.asarray(release).reshape(-1)})
    if baseline is not None:
        table["baseline"] = np.asarray(baseline).reshape(-1)
    if truth is not None:
        table["truth"] = np.asarray(truth).reshape(-1)
    table["posterior median"] = med
    table[f"lower {prob:.0%}"] = lo
    table[f"upper {prob:.0%}"] = hi
    if truth is not None:
        table["covered"] = (lo <= table["truth"]) & (table["truth"] <= hi)
    return table


def _counts_figure(table: pd.DataFrame, path: Path, max_cells: int = 60) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = table.head(max_cells)
    y = np.arange(len(shown))
    fig, ax = plt.subplots(figsize=(8, max(3, 0.22 * len(shown) + 1)))
    lo_col, hi_col = [c for c in table.columns if c.startswith(("lower", "upper"))]
    release = shown["release"].to_numpy(dtype=float)  # everything is drawn relative to it
    ax.axvline(0.0, color="tab:red", lw=1, label="release")
    ax.hlines(y, shown[lo_col] - release, shown[hi_col] - release, color="tab:blue", lw=2,
              label=f"posterior {lo_col[6:]} interval")
    ax.plot(shown["posterior median"] - release, y, "|", color="tab:blue", ms=8)
    if "baseline" in shown:
        ax.plot(shown["baseline"] - release, y, "s", mfc="none", color="tab:green", ms=4,
                label="post-processed baseline")
    if "truth" in shown:
        ax.plot(shown["truth"] - release, y, "o", color="black", ms=3, label="truth")
    ax.set_yticks(y, [f"{c} ({r:g})" for c, r in zip(shown["cell"], release)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("true count minus the release (cell labels give the release)")
    title = "true counts given the release"
    if len(table) > max_cells:
        title += f" (first {max_cells} of {len(table)} cells)"
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parameters_figure(idata, names: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(names))
    rows = int(np.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names):
        values = idata.posterior[name].values
        for chain in values:
            ax.hist(chain.ravel(), bins=40, histtype="step", density=True)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(names):]:
        ax.set_visible(False)
    fig.suptitle("posterior of the parameters (one line per chain)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scalar_parameters(idata, exclude=()) -> list[str]:
    """Names of the scalar variables of the posterior (hyperparameters), in order."""
    return [name for name, var in idata.posterior.data_vars.items()
            if var.ndim == 2 and name not in exclude]


def diagnostics(idata) -> dict:
    """Divergences, the largest R-hat and the smallest bulk/tail ESS over every variable."""
    import arviz as az

    stats = idata.sample_stats
    divergent = int(np.asarray(stats["diverging"]).sum()) if "diverging" in stats else 0
    summary = az.summary(idata, kind="diagnostics")
    return {"divergences": divergent,
            "max R-hat": float(summary["r_hat"].max()),
            "min bulk ESS": float(summary["ess_bulk"].min()),
            "min tail ESS": float(summary["ess_tail"].min()),
            "chains": int(idata.posterior.sizes["chain"]),
            "draws per chain": int(idata.posterior.sizes["draw"])}


def write_report(directory, idata, *, latent: str, release, labels, title: str, convergence,
                 verdict: str, baseline=None, truth=None, description: str = "", advice=None,
                 rounds=None, exposure: str | None = None, template: dict | None = None) -> Path:
    """Write the files of the module docstring into ``directory`` (created); returns the
    path of ``index.html``. ``convergence`` (a
    :class:`~dpinfer.inference.convergence.Convergence` over every variable of the posterior),
    ``verdict`` (its one-line statement), ``advice`` (sentences: what to do when it has not
    converged), ``rounds`` (each fit made, as dicts), ``exposure`` (which was used) and
    ``template`` (:func:`dpinfer.io.templates.template_report`) make the top of the page."""
    import arviz as az

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    idata.to_netcdf(out / "posterior.nc")
    params = scalar_parameters(idata, exclude=(latent,))
    summary = az.summary(idata, ci_prob=0.9, ci_kind="eti")
    summary.to_csv(out / "summary.csv")
    table = count_table(idata, latent, release, labels, baseline=baseline, truth=truth)
    table.to_csv(out / "counts.csv", index=False)
    _counts_figure(table, out / "counts.png")
    if params:
        _parameters_figure(idata, params[:SCALAR_LIMIT], out / "parameters.png")
    diag = diagnostics(idata)
    report = json.loads(idata.posterior.attrs.get("dpinfer", "{}"))
    top = _top(convergence, verdict, advice or [], rounds or [], exposure, template) + recoveries_html(idata)
    page = _html(title, description, table, summary.loc[[i for i in summary.index if i in params]]
                 if params else None, diag, report, has_parameters=bool(params), top=top)
    (out / "index.html").write_text(page, encoding="utf-8")
    return out / "index.html"


def _top(convergence, verdict: str, advice: list, rounds: list, exposure, template) -> str:
    """The head of the page: converged or not (id "verdict", class "converged" or
    "not-converged"), what to do, the exposure, the parameterisation and the fits made."""
    esc = html.escape
    c = convergence
    rhat = (f"max R-hat <b>{c.max_rhat:.3f}</b> ({esc(c.worst_rhat)})" if np.isfinite(c.max_rhat)
            else esc(c.rhat_text))
    if c.latents is not None:  # the parameters' max R-hat, and the latents' against their bound
        rhat = f"{rhat} over the parameters, {esc(c.latents.text())}"
    figures = (f"{rhat}, min bulk ESS <b>{c.min_ess:.0f}</b> ({esc(c.worst_ess)}), min tail ESS "
               f"<b>{c.min_tail_ess:.0f}</b> ({esc(c.worst_tail_ess)}) over {c.quantities} {esc(c.subject)}, "
               f"{c.divergences} divergent transitions; targets: R-hat &le; "
               f"{c.rhat_target}, bulk and tail ESS &ge; {c.ess_target:.0f}, no divergences.")
    if c.converged:
        head = f"<h2>Converged</h2><p>{figures}</p>"
    else:
        items = "".join(f"<li>{esc(a)}</li>" for a in advice)
        head = (f"<h2>NOT CONVERGED: not a result yet</h2><p>{figures}</p>"
                f"<p>What to do:</p><ul>{items}</ul>")
    lines = [f"<p class=\"verdict-line\"><code>{esc(verdict)}</code></p>"]
    if exposure is not None:
        lines.append(f"<p>Exposure: {esc(exposure)}.</p>")
    if template is not None:
        text = template.get("parameterisation_text")
        lines.append(f"<p>Template: {esc(template['template'])}"
                     + (f"; {esc(text)}." if text else ".") + "</p>")
    if len(rounds) > 1:
        rows = "".join(
            f"<tr><td>{i + 1}</td><td>{r['chains']} x {r['draws']}</td><td>{r['tune']}</td>"
            f"<td>{r['target_accept'] if r['target_accept'] is not None else 'default'}</td>"
            f"<td>{r['max_rhat']:.3f}</td><td>{r['min_ess_bulk']:.0f}</td>"
            f"<td>{r['divergences']}</td><td>{r['seconds']:.0f}</td></tr>" for i, r in enumerate(rounds))
        lines.append("<p>Fits made (each afresh, the last is reported):</p><table><tr><th>fit</th>"
                     "<th>chains x draws</th><th>tune</th><th>target_accept</th><th>max R-hat</th>"
                     f"<th>min bulk ESS</th><th>divergences</th><th>seconds</th></tr>{rows}</table>")
    status = "converged" if c.converged else "not-converged"
    return f'<section id="verdict" class="{status}">{head}{"".join(lines)}</section>'


def recoveries_html(idata) -> str:
    """A section (id "recoveries") listing every recovery the fit made
    (:mod:`dpinfer.inference.recovery`: windows widened, a resume, lost workers), or "" if none."""
    from dpinfer.inference.recovery import recoveries_of

    entries = recoveries_of(idata)
    if not entries:
        return ""
    items = "".join(f"<li>{html.escape(r['kind'])}: {html.escape(r['message'])}</li>" for r in entries)
    return (f'<section id="recoveries"><h2>Recoveries ({len(entries)})</h2><p>The fit went on after these '
            f"(also in <code>sample_stats.attrs[\"dpinfer_recoveries\"]</code>):</p><ul>{items}</ul></section>")


def _html(title, description, table, parameters, diag, report, *, has_parameters, top="") -> str:
    esc = html.escape
    coverage = ""
    if "covered" in table:
        coverage = (f"<p>90% intervals cover {int(table['covered'].sum())} of {len(table)} true "
                    "counts.</p>")
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v:.4g}</td></tr>" if isinstance(v, float)
                   else f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in diag.items())
    engine = "".join(
        f"<h3>{esc(name)}</h3><table>" + "".join(
            f"<tr><th>{esc(str(k))}</th><td>{esc(json.dumps(v) if not isinstance(v, str) else v)}</td></tr>"
            for k, v in entry.items()) + "</table>"
        for name, entry in report.items())
    params_html = (parameters.to_html(float_format=lambda v: f"{v:.4g}", border=0)
                   if parameters is not None and len(parameters) else "<p>(no scalar parameters)</p>")
    figure = '<img src="parameters.png" alt="posterior of the parameters">' if has_parameters else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; max-width: 70em; margin: 2em auto; line-height: 1.4; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: right; }}
th {{ text-align: left; }}
img {{ max-width: 100%; }}
#verdict {{ border: 2px solid; padding: 0 1em 0.5em; margin: 1em 0; }}
#verdict.converged {{ border-color: #2a7d2a; background: #eef8ee; }}
#verdict.not-converged {{ border-color: #b22222; background: #fbeeee; }}
</style>
<script>
// records how many images decoded (data-images="loaded/total"): the browser check reads it
window.addEventListener("load", () => {{
  const images = Array.from(document.images);
  const loaded = images.filter((i) => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.images = loaded + "/" + images.length;
}});
</script></head><body>
<h1>{esc(title)}</h1>
{top}
<p>{esc(description)}</p>
<h2>True counts given the release</h2>
{coverage}
<img src="counts.png" alt="posterior intervals of the true counts beside the release">
<details><summary>every cell (also counts.csv)</summary>
{table.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)}
</details>
<h2>Parameters</h2>
{figure}
{params_html}
<h2>Diagnostics</h2>
<table>{rows}</table>
<h2>What dpinfer did</h2>
{engine}
<p>Files: <a href="posterior.nc">posterior.nc</a> (the posterior, netCDF),
<a href="summary.csv">summary.csv</a>, <a href="counts.csv">counts.csv</a>.</p>
</body></html>
"""
