"""dpinfer's PyMC engine: ``pm.sample`` on a rewritten model, with dpinfer's steps for the
latent counts that cannot be summed out.

* Cells and totals plans: the model is rewritten so the counts are summed out of their release
  over the plan's window (:func:`dpinfer.inference.engines.pymc.marginal.marginalise`; the release stays an
  observed variable, so log-likelihoods and predictive draws work), PyMC's NUTS runs on the
  parameters, then the counts are drawn exactly for every posterior draw.
* Children plans: :class:`~dpinfer.inference.engines.pymc.gibbs.WindowedCountGibbs` next to NUTS.
* Fibre plans: :class:`~dpinfer.inference.engines.pymc.fibre.FibreGibbs` next to NUTS.

The rewritten model is kept on the original model, so refits with new data (``pm.set_data``
on the original model) reuse its compiled functions while the windows keep their widths.
PyMC's own NUTS runs (``nuts_sampler="pymc"`` unless the caller says otherwise): the rewritten
model holds dpinfer's Python Ops (convolution likelihood, normalisers), which nutpie, PyMC's
default when it is installed, cannot run.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import xarray as xr

from dpinfer.inference.engines.pymc.gibbs import WindowedCountGibbs
from dpinfer.inference.engines.pymc.marginal import compile_window_log_weights, marginalise
from dpinfer.inference.report import window_entry
from dpinfer.inference.window import neglected_log_mass
from dpinfer.lattice.convolution import log_convolution_at, sample_given_sums

_MARGINAL = "_dpinfer_marginal_fit"
_CHUNK_ELEMENTS = 4_000_000  # window log-weights evaluated per call (32 MB)

METHODS = {
    "cells": ("exact marginalisation over a proven window (NUTS on parameters) + exact "
              "conditional draws of the counts"),
    "totals": ("exact marginalisation over group totals by convolution (NUTS on parameters) + "
               "exact joint draws of the counts on the fibre"),
    "children": ("windowed exact Gibbs updates of each count (the counts have other children), "
                 "NUTS on the continuous parameters"),
    "fibre": ("exact Gibbs updates along Markov-basis moves of the fibre, NUTS on the continuous "
              "parameters"),
}


class MarginalFit:
    """The rewritten model and the compiled pieces kept with it: the window log-weights of
    the summed-out latents, the windowed Gibbs steps and the fibre step."""

    def __init__(self, model, plans):
        self.plans = plans
        self.half_widths = [p.window.half_width for p in plans]
        self.model = marginalise(model, plans)
        self._log_weights = {}
        self._gibbs = {}
        self._fibre = None

    def log_weights(self, plan):
        if plan.latent_name not in self._log_weights:
            self._log_weights[plan.latent_name] = compile_window_log_weights(self.model, plan)
        return self._log_weights[plan.latent_name]

    def gibbs_step(self, plan) -> WindowedCountGibbs:
        """The windowed Gibbs step of a latent, kept (its functions compiled once) and given
        the plan's current window."""
        step = self._gibbs.get(plan.latent_name)
        if step is None or step.window.half_width != plan.window.half_width:
            step = WindowedCountGibbs(
                [self.model[plan.latent_name]],
                model=self.model,
                release_rv=self.model[plan.record.name],
                children=plan.children,
                window=plan.window,
                support=plan.support,
            )
            self._gibbs[plan.latent_name] = step
        step.window = plan.window
        return step

    def fibre_step(self, plans):
        """The fibre step of the fibre latents: its compiled prior tables are kept while the
        windows' widths are unchanged; everything that depends on the releases is refreshed."""
        # imported here: the fibre machinery (scipy.sparse, Markov bases) loads only for
        # models with fibre latents, not with every dp.sample
        from dpinfer.inference.engines.pymc.fibre import FibreGibbs

        key = tuple((p.latent_name, p.half_width) for p in plans)
        if self._fibre is None or self._fibre[0] != key:
            step = FibreGibbs([self.model[p.latent_name] for p in plans], model=self.model, plans=plans)
            self._fibre = (key, step)
        else:
            self._fibre[1].update(plans)  # new releases (pm.set_data) move the boxes and tables
        return self._fibre[1]

    def widths(self) -> dict:
        """Window half-widths in use, by latent name (summed-out, Gibbs and fibre latents)."""
        widths = {p.latent_name: p.window.half_width for p in self.plans}
        widths.update({name: step.window.half_width for name, step in self._gibbs.items()})
        if self._fibre is not None:
            widths.update(dict(self._fibre[0]))
        return widths

    def sync_data(self, model, plans) -> None:
        """Copy the current value of every pm.Data variable of ``model`` (new releases,
        covariates, other observed data) into the kept rewritten model, whose data are copies."""
        for var in model.data_vars:
            if hasattr(var, "get_value"):
                self.model[var.name].set_value(var.get_value())
        self.plans = plans


def marginal_fit(model, plans) -> MarginalFit:
    """The kept rewritten model for these summed-out plans, rebuilt if their widths changed."""
    fit = getattr(model, _MARGINAL, None)
    if fit is None or fit.half_widths != [p.window.half_width for p in plans]:
        fit = MarginalFit(model, plans)
        setattr(model, _MARGINAL, fit)
    else:
        fit.sync_data(model, plans)
    return fit


def kept_widths(model) -> dict:
    """Window half-widths of the kept rewritten model (empty if none): a refit keeps them when
    they are wide enough, so it needs no new compilation."""
    fit = getattr(model, _MARGINAL, None)
    return fit.widths() if fit is not None else {}


def run(model, plans, *, draws: int, tune: int, chains: int, cores, seed: int, rng, tol: float,
        progressbar: bool, sample_kwargs: dict):
    """One fit with the plans' current windows. Returns (DataTree, report, failed, fit):
    ``failed`` maps each latent whose bound exceeded ``tol`` to the largest bound reached."""
    summed = [p for p in plans if p.kind in ("cells", "totals")]
    children = [p for p in plans if p.kind == "children"]
    fibres = [p for p in plans if p.kind == "fibre"]
    fit = marginal_fit(model, summed)
    steps = [fit.gibbs_step(p) for p in children]
    kwargs = dict(sample_kwargs)
    if fit.model.free_RVs:
        start = fit.model.initial_point()
        initvals = {s.latent_name: s.initial_value(start) for s in steps}
        if fibres:
            steps.append(fit.fibre_step(fibres))
            initvals.update({p.latent_name: p.start.reshape(p.shape) for p in fibres})
        initvals.update(kwargs.pop("initvals", None) or {})
        kwargs.setdefault("nuts_sampler", "pymc")
        with fit.model:
            idata = pm.sample(draws, tune=tune, chains=chains, cores=cores, random_seed=seed,
                              progressbar=progressbar, step=steps or None,
                              initvals=initvals or None, **kwargs)
    else:  # nothing continuous left: the counts' posterior is the window weights, i.i.d.
        coords = {"chain": np.arange(chains), "draw": np.arange(draws)}
        idata = xr.DataTree.from_dict({"posterior": xr.Dataset(coords=coords)})
    report, failed = _draw_summed(idata, fit, model, tol, rng, progressbar)
    for plan in children:
        bound = float(np.max(idata.sample_stats["neglected_mass_bound"].values))
        report[plan.latent_name] = window_entry(plan, METHODS["children"], bound, tol)
        if not bound <= tol:
            failed[plan.latent_name] = bound
    for plan in fibres:
        report[plan.latent_name], bound = _fibre_report(idata, plan, tol)
        if not bound <= tol:
            failed[plan.latent_name] = bound
    return idata, report, failed, fit


def _draw_summed(idata, fit, model, tol, rng, progressbar):
    """Exact draws of every summed-out latent given each posterior draw (each plan's
    ``draw``), added to the posterior. Returns (report, failed)."""
    posterior = idata.posterior.to_dataset()
    values = [posterior[rv.name].values for rv in fit.model.free_RVs]
    n_chains, n_draws = posterior.sizes["chain"], posterior.sizes["draw"]
    n = n_chains * n_draws
    flat_values = [v.reshape((n, *v.shape[2:])) for v in values]
    report, failed = {}, {}
    for plan in fit.plans:
        if progressbar:
            print(f"dpinfer: exact draws of {plan.latent_name!r} given each posterior draw")
        log_weights = fit.log_weights(plan)
        grid = plan.window.grid()
        cells = grid.shape[1:]
        draws_out = np.empty((n,) + cells, dtype=np.int64)
        worst = -np.inf
        chunk = max(1, _CHUNK_ELEMENTS // grid.size)
        for start in range(0, n, chunk):
            part = slice(start, min(n, start + chunk))
            # (draws, W, *cells); with no parameters the weights are the same for every draw
            lw = log_weights(*[v[part] for v in flat_values]) if values else np.broadcast_to(
                log_weights(), (part.stop - part.start, *grid.shape))
            draws_out[part], log_bound = _draw_counts(plan, lw, rng)
            worst = max(worst, log_bound)
        dims = model.named_vars_to_dims.get(plan.latent_name) or [
            f"{plan.latent_name}_dim_{i}" for i in range(len(cells))
        ]
        coords = {dim: np.asarray(model.coords[dim]) for dim in dims if model.coords.get(dim)}
        posterior[plan.latent_name] = xr.DataArray(
            draws_out.reshape((n_chains, n_draws) + cells), dims=("chain", "draw", *dims), coords=coords
        )
        bound = float(np.expm1(worst)) if np.isfinite(worst) else float("inf")
        report[plan.latent_name] = window_entry(plan, METHODS[plan.kind], bound, tol)
        if not bound <= tol:
            failed[plan.latent_name] = bound
    idata["posterior"] = xr.DataTree(posterior)  # attribute assignment would not replace the node
    return report, failed


def _draw_counts(plan, log_weights, rng) -> tuple[np.ndarray, float]:
    """Exact draws of a summed-out latent's counts, one per posterior draw, from their window
    weights (draws, W, *cells), and the largest log1p bound on the neglected relative mass:
    cell by cell (cells plan) or jointly on the totals (totals plan)."""
    if plan.kind == "totals":
        return _draw_on_totals(plan, log_weights, rng)
    grid = plan.window.grid()
    log_l = np.logaddexp.reduce(log_weights, axis=1)
    worst = float(np.max(neglected_log_mass(plan.window.log_eta, log_l)))
    cdf = np.cumsum(np.exp(log_weights - log_l[:, None]), axis=1)
    u = rng.random((cdf.shape[0], 1) + cdf.shape[2:]) * cdf[:, -1:]
    index = np.minimum(np.sum(cdf < u, axis=1), grid.shape[0] - 1)
    return np.take_along_axis(grid[None, ...], index[:, None, ...], axis=1)[:, 0], worst


def _draw_on_totals(plan, log_weights, rng) -> tuple[np.ndarray, float]:
    """Exact joint draws on the totals, one per posterior draw (backward sampling through the
    convolution tree, inference notes §2), and the largest log1p bound on the neglected
    relative mass.

    For group g with window sums L_i, tail bounds eta_i and in-window convolution V_g, the
    fibre mass with some cell outside its window is at most sum_i eta_i prod_{j != i}
    (L_j + eta_j) (drop the total constraint, which only adds mass), so the relative error is
    at most exp(sum_j log(L_j + eta_j) - log V_g) sum_i eta_i / (L_i + eta_i)."""
    n, width = log_weights.shape[0], log_weights.shape[1]
    codes = plan.group_codes
    log_l = np.logaddexp.reduce(log_weights, axis=1)
    log_g = log_weights.reshape(n, width, -1).transpose(0, 2, 1)
    lower = plan.window.centres.reshape(-1) - plan.window.half_width
    targets = np.bincount(codes, weights=plan.release_value.reshape(-1) - lower).astype(np.int64)
    draws = lower + sample_given_sums(log_g, codes, targets, rng)
    eta = plan.window.log_eta.reshape(-1)
    log_tot = np.logaddexp(log_l.reshape(n, -1), eta)
    worst = -np.inf
    for b in range(n):
        log_v, _ = log_convolution_at(log_g[b], codes, targets)
        total = 0.0
        for g in range(codes.max() + 1):
            cells = codes == g
            log_ratio = (np.logaddexp.reduce(eta[cells] - log_tot[b, cells])
                         + np.sum(log_tot[b, cells]) - log_v[g])
            total += np.log1p(np.exp(min(log_ratio, 700.0)))
        worst = max(worst, total)
    return draws.reshape((n, *log_weights.shape[2:])), worst


def _fibre_report(idata, plan, tol) -> tuple[dict, float]:
    """A fibre latent's report and its largest per-sweep bound (the fibre statistics are
    shared by all fibre latents of a model)."""
    stats = idata.sample_stats
    bound = float(np.max(stats["fibre_neglected_mass_bound"].values))
    constraint = plan.constraint
    entry = {
        "release": [e.record.name for e in plan.entries],
        "mechanism": [repr(e.record.mechanism) for e in plan.entries],
        "method": METHODS["fibre"],
        "invariants": constraint.kind if constraint is not None else "none",
        "markov_moves": len(plan.moves),
        "connectivity": _connectivity(constraint),
        "window_half_width": plan.half_width,
        "share_of_updates_that_moved": float(np.mean(stats["fibre_moves_changed"].values)),
        "max_relative_error_bound": bound,
        "tol": tol,
    }
    if plan.normaliser is not None:
        entry["nonnegativity"] = {
            "normaliser_log_range_on_window": plan.normaliser_range,
            "metropolis_corrected": plan.normaliser_corrected,
            "block_acceptance": float(np.mean(stats["fibre_block_acceptance"].values)),
            "note": (
                "log P(A e = 0, x + e >= 0) varies by the stated range over the window; "
                + ("above tol, so palindromic blocks of line updates are accepted by "
                   "Metropolis-Hastings on the normaliser ratio" if plan.normaliser_corrected
                   else "within tol: non-negativity cannot bind there and the normaliser "
                   "is treated as constant")
            ),
        }
    return entry, bound


def _connectivity(constraint) -> str:
    if constraint is None:
        return "unit moves: every box is connected"
    return {
        "total": "pair moves: a Markov basis for a total",
        "groups": "pair moves within groups: a Markov basis for group totals",
        "margins": "Markov basis of the margins (all basic 2x2 moves for two-way margins)",
    }.get(constraint.kind, "Markov basis computed by 4ti2")
