"""Why ``dpinfer.sample`` gave up: the message of the error it raises when latent counts still
fail after the last widening of their windows (:func:`message`), naming for each the release,
the cause and the counts involved, with numbers.

The causes, from the last fit's report entries and bounds (:mod:`dpinfer.inference.sample`,
step 3):

* a nested release (:mod:`~dpinfer.inference.planning.nested`) whose draws reached the edges
  of their boxes: the counts on an edge (or nearest one), each with its box, its draws, the
  pilot and its measurements (the entry's ``cells_at_box_edges``);
* a nested release whose moves had no mass: given the parameters, the law of a move, trimmed
  60 nats below its peak, is zero wherever the equalities and bounds hold, so wider boxes
  cannot help; each equality or bound with its published value and the sum the measurements
  alone give it (the entry's ``exact_terms``);
* cells of the compiled engine held (not updated) in most draws of a chain (an infinite bound
  there, :func:`~dpinfer.inference.engines.compiled.engine.held_too_often`);
* a window's bound on the likelihood mass it neglects above ``tol`` (PyMC engine, and the
  compiled engine's windows without exact tails): the bound reached against ``tol``, infinite
  when the windowed likelihood was 0 at some draw.

For each, the counts' prior at the parameters the chains visited: draws of the counts'
distribution given the last posterior draws of the parameters (``pm.sample_posterior_predictive``
without the counts in the trace), against the published values. A prior far from every
release of the counts is the usual cause.
"""

from __future__ import annotations

import numpy as np

SHOWN = 5  # counts or terms listed per latent
PRIOR_DRAWS = 100  # posterior draws of the parameters the prior's draws are taken at


def message(model, plans: list, failed: dict, report: dict, idata, *, engine: str, tol: float,
            widenings: int) -> str:
    """The error message for the latents in ``failed`` (name -> bound of the last fit) after
    ``widenings`` widenings (module docstring)."""
    latents = [p.latent_name for p in plans]
    parts = []
    for plan in plans:
        if plan.latent_name not in failed:
            continue
        prior = _prior_draws(model, idata, plan.latent_name, latents)
        if plan.kind == "nested":
            parts.append(_nested(plan, report[plan.latent_name], prior, widenings))
        else:
            parts.append(_windowed(plan, failed[plan.latent_name], idata, prior, engine=engine, tol=tol,
                                   widenings=widenings))
    return f"dpinfer.sample stopped after {widenings} widenings:\n" + "\n".join(parts)


def _prior_draws(model, idata, latent: str, latents: list):
    """(draws (n, *shape) of the counts ``latent`` from their prior at the last posterior draws
    of the parameters, or None; why not, or None)."""
    import pymc as pm
    import xarray as xr

    posterior = idata.posterior.to_dataset() if hasattr(idata.posterior, "to_dataset") else idata.posterior
    posterior = posterior.drop_vars([n for n in latents if n in posterior])
    try:
        if not posterior.data_vars:  # no parameters: the prior itself
            return np.asarray(pm.draw(model[latent], draws=PRIOR_DRAWS, random_seed=0)), None
        posterior = posterior.isel(chain=[0], draw=slice(-PRIOR_DRAWS, None))
        draws = pm.sample_posterior_predictive(xr.DataTree.from_dict({"posterior": posterior}), model=model,
                                               var_names=[latent], random_seed=0, progressbar=False)
    except Exception as err:  # evidence for a message: say why it is missing, and raise the real error
        return None, f"{type(err).__name__}: {err}"
    values = draws.posterior_predictive[latent].values
    return values.reshape(-1, *values.shape[2:]), None


def _range(values) -> str:
    """'q05..q95' of draws of counts, rounded."""
    lo, hi = np.quantile(np.asarray(values, dtype=float), [0.05, 0.95])
    return f"{lo:.0f}..{hi:.0f}"


def _prior_text(prior, index) -> str:
    draws, why = prior
    if draws is None:
        return f"the prior's draws could not be made ({why})"
    return f"the prior at the posterior's parameters {_range(draws.reshape(draws.shape[0], -1)[:, index])} (5%..95%)"


def _nested(plan, entry: dict, prior, widenings: int) -> str:
    name, release = plan.latent_name, entry["release"]
    lines = []
    if "cells_at_box_edges" in entry:
        stored = entry["stored_draws_on_box_edges"]
        where = (f"on an edge in {stored} stored draws" if stored else
                 "none on an edge in the stored draws (the edges were reached between them); nearest")
        cells = [f"  - {text}; {_prior_text(prior, leaf * plan.sums.n_cells + cell)}"
                 for text, (leaf, cell) in zip(entry["cells_at_box_edges"], entry["cells_at_box_edges_index"])]
        lines.append(
            f"the counts {name!r} of the nested release {release!r} reached the edges of their boxes after "
            f"tuning ({entry['box_edges_hit_after_tuning']} moves onto an edge), with boxes of up to "
            f"±{entry['box_half_width_sds']} pilot sds: the posterior puts them beyond every box tried. Counts "
            f"{where}:\n" + "\n".join(cells[:SHOWN]))
    if entry["moves_without_mass_after_tuning"]:
        terms = [f"  - {text}; {_term_prior(plan, prior, text)}" for text in entry["exact_terms"][:SHOWN]]
        lines.append(
            f"the counts {name!r} of the nested release {release!r}: {entry['moves_without_mass_after_tuning']} "
            f"moves after tuning had no mass, with boxes of up to ±{entry['box_half_width_sds']} pilot sds: at "
            "the parameters the chains visit, the law of a move (trimmed 60 nats below its peak) is zero "
            "wherever the release's equalities and bounds hold, so the counts cannot move there and wider "
            "boxes do not help. Its equalities and bounds:\n" + "\n".join(terms))
    lines.append("Check the model's prior for these counts (rates far from the data, a support that excludes "
                 "them) and the release's values")
    return "\n".join(lines)


def _term_prior(plan, prior, text: str) -> str:
    """The prior's draws of an exact term's sum (the term named at the start of ``text``)."""
    draws, why = prior
    if draws is None:
        return f"the prior's draws could not be made ({why})"
    sums = plan.sums
    r = next(i for i, n in enumerate(sums.term_name) if text.startswith(str(n)))
    values = [sums.term_sums(x)[r] for x in draws.reshape(-1, sums.n_leaves, sums.n_cells)]
    return f"the prior at the posterior's parameters puts this sum at {_range(values)} (5%..95%)"


def _window(plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(lo, hi, published value (NaN: none), half-width) per cell of a windowed plan."""
    if plan.kind == "fibre":
        value = plan.released_values()
        return plan.lo, plan.lo + plan.width - 1, value, plan.half_width
    w = plan.window
    centres = w.centres.reshape(-1)
    return centres - w.half_width, centres + w.half_width, plan.release_value.reshape(-1), w.half_width


def _windowed(plan, bound: float, idata, prior, *, engine: str, tol: float, widenings: int) -> str:
    name = plan.latent_name
    release = [e.record.name for e in plan.entries] if plan.kind == "fibre" else plan.record.name
    lo, hi, value, half = _window(plan)
    draws = np.asarray(idata.posterior[name].values)
    chains = draws.reshape(draws.shape[0], draws.shape[1], -1)
    flat = chains.reshape(-1, chains.shape[-1])
    held = engine == "compiled" and bound == np.inf
    if held:  # a held cell keeps one value through a chain
        stuck = np.any(np.ptp(chains, axis=1) == 0, axis=0)
        cells = np.flatnonzero(stuck)[:SHOWN]
        cause = (f"cells of {name!r} (release {release!r}, compiled engine) were held, not updated, in most "
                 f"draws of a chain, with windows of up to ±{half}: at the parameters the chains visit their "
                 "windows hold almost none of the counts' conditional law. Either the chains have not reached "
                 "the posterior (raise tune) or the model puts the counts far from the release")
        listed = "Cells that kept one value through a chain"
    else:
        gap = np.minimum(flat.min(axis=0) - lo, hi - flat.max(axis=0))
        cells = np.argsort(gap, kind="stable")[:SHOWN]
        what = ("infinite: the windowed likelihood was 0 at some posterior draws (the windows hold none of "
                "the counts' posterior)" if bound == np.inf else f"{bound:.3g}, above tol = {tol:g}")
        cause = (f"the counts {name!r} (release {release!r}, {engine} engine): the bound on the likelihood mass "
                 f"neglected outside their windows (of up to ±{half}) was {what}")
        listed = "Cells nearest their windows' edges"
    lower, upper = plan.support
    lo = lo if lower is None else np.maximum(lo, lower)
    hi = hi if upper is None else np.minimum(hi, upper)
    shape = draws.shape[2:]
    rows = [f"  - {name}[{', '.join(str(int(k)) for k in np.unravel_index(i, shape))}]: "
            + (f"published {value[i]}, " if not np.isnan(value[i]) else "")
            + f"window {lo[i]}..{hi[i]}, posterior draws {flat[:, i].min()}..{flat[:, i].max()}, "
            + _prior_text(prior, i) for i in cells]
    return (f"{cause}. {listed}:\n" + "\n".join(rows)
            + "\nCheck the model's prior for these counts (rates far from the data) and the release's values")
