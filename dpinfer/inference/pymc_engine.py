"""dpinfer's PyMC engine: ``pm.sample`` on a rewritten model, with dpinfer's steps for the
latent counts that cannot be summed out.

* Cells and totals plans: the model is rewritten so the counts are summed out of their release
  over the plan's window (:func:`dpinfer.inference.marginal.marginalise`; the release stays an
  observed variable, so log-likelihoods and predictive draws work), PyMC's NUTS runs on the
  parameters, then the counts are drawn exactly for every posterior draw.
* Children plans: :class:`~dpinfer.inference.gibbs.WindowedCountGibbs` next to NUTS.
* Fibre plans: :class:`~dpinfer.inference.fibre.FibreGibbs` next to NUTS.

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

from dpinfer.inference.fibre import FibreGibbs, FibrePlan
from dpinfer.inference.gibbs import WindowedCountGibbs
from dpinfer.inference.marginal import compile_window_log_weights, marginalise
from dpinfer.inference.plans import ChildrenPlan

_MARGINAL = "_dpinfer_marginal_fit"
_CHUNK_ELEMENTS = 4_000_000  # window log-weights evaluated per call (32 MB)

FIBRE_METHOD = (
    "exact Gibbs updates along Markov-basis moves of the fibre, NUTS on the continuous parameters"
)


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
                window=plan.window,
                support=plan.support,
            )
            self._gibbs[plan.latent_name] = step
        step.window = plan.window
        return step

    def fibre_step(self, plans) -> FibreGibbs:
        """The fibre step of the fibre latents: its compiled prior tables are kept while the
        windows' widths are unchanged; everything that depends on the releases is refreshed."""
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
    children = [p for p in plans if isinstance(p, ChildrenPlan)]
    fibres = [p for p in plans if isinstance(p, FibrePlan)]
    fit = marginal_fit(model, summed)
    steps = [fit.gibbs_step(p) for p in children]
    kwargs = dict(sample_kwargs)
    if fit.model.free_RVs:
        start = fit.model.initial_point()
        initvals = {s.latent_name: s.initial_value(start) for s in steps}
        if fibres:
            steps.append(fit.fibre_step(fibres))
            initvals.update({p.latent_name: p.start().reshape(p.shape) for p in fibres})
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
        report[plan.latent_name] = plan.report_entry(plan.pymc_method, bound, tol)
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
            draws_out[part], log_bound = plan.draw(lw, rng)
            worst = max(worst, log_bound)
        dims = model.named_vars_to_dims.get(plan.latent_name) or [
            f"{plan.latent_name}_dim_{i}" for i in range(len(cells))
        ]
        coords = {dim: np.asarray(model.coords[dim]) for dim in dims if model.coords.get(dim)}
        posterior[plan.latent_name] = xr.DataArray(
            draws_out.reshape((n_chains, n_draws) + cells), dims=("chain", "draw", *dims), coords=coords
        )
        bound = float(np.expm1(worst)) if np.isfinite(worst) else float("inf")
        report[plan.latent_name] = plan.report_entry(plan.pymc_method, bound, tol)
        if not bound <= tol:
            failed[plan.latent_name] = bound
    idata["posterior"] = xr.DataTree(posterior)  # attribute assignment would not replace the node
    return report, failed


def _fibre_report(idata, plan, tol) -> tuple[dict, float]:
    """A fibre latent's report and its largest per-sweep bound (the fibre statistics are
    shared by all fibre latents of a model)."""
    stats = idata.sample_stats
    bound = float(np.max(stats["fibre_neglected_mass_bound"].values))
    constraint = plan.constraint
    entry = {
        "release": [e.record.name for e in plan.entries],
        "mechanism": [repr(e.record.mechanism) for e in plan.entries],
        "method": FIBRE_METHOD,
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
