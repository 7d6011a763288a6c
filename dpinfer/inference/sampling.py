"""``dpinfer.sample``: posterior sampling for models whose latent true counts are privatised.

Two engines, chosen per model (``method="auto"``) and named in the result's report:

* the **compiled exact Gibbs engine** (:mod:`dpinfer.inference.engine`), wherever every latent
  count vector is released once, as itself, with no other child (independent cells or cells
  conditioned on group totals) and every other free variable is continuous: each sweep draws
  the counts exactly given the parameters (no window error: exact tails for additive noise),
  then makes one compiled NUTS transition of the parameters given the counts;
* the **PyMC engine** otherwise (or with ``method="marginal"`` / ``"fibre"``), described below.

What the PyMC engine does for each release recorded by ``Mechanism.observe`` (inference notes
§1):

1. choose a window of true counts around the release whose neglected likelihood mass is
   provably below ``tol`` relative to the windowed likelihood;
2. if the release is the counts' only child, rewrite the model so the counts are summed out
   over the window (the release stays an observed variable) and run NUTS on the continuous
   parameters only, then draw the counts exactly given each posterior draw (or i.i.d. from
   their exact posterior when no parameter is left);
3. otherwise (other discrete children, further releases, Deterministics of the counts) update
   the counts with the exact windowed Gibbs step of :mod:`dpinfer.inference.gibbs` next to
   NUTS;
4. check the neglected-mass bound on every posterior draw (or step); if it fails anywhere,
   widen the window and refit.

The method, windows and bounds are written into ``idata.posterior.attrs``.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pymc as pm
import xarray as xr

from dpinfer._validation import check_probability
from dpinfer.lattice.convolution import log_convolution_at, sample_given_sums
from dpinfer.inference.fibre import (
    MOVES_PER_CELL,
    FibreGibbs,
    entries_from,
    initial_half_width_for,
    plan_fibre,
    respects_invariants,
    widened_half_width,
)
from dpinfer.inference.gibbs import WindowedCountGibbs
from dpinfer.inference.marginal import (
    MarginalPlan,
    compile_window_log_weights,
    marginalise,
    plan_marginalisation,
)
from dpinfer.inference.chains import SamplingError
from dpinfer.inference.compiled import NotCompilableError
from dpinfer.inference.count_blocks import (
    CellTables,
    GroupTotals,
    IndependentCells,
    has_exact_tails,
    tail_half_width,
)
from dpinfer.inference.engine import compiled_model_for, fit as fit_compiled
from dpinfer.inference.queries import resolve_query
from dpinfer.mechanisms.records import releases_of
from dpinfer.inference.window import (
    initial_half_width,
    make_window,
    neglected_log_mass,
    window_centres,
)

MAX_WIDENINGS = 4
METHODS = ("auto", "marginal", "fibre")
COMPILED_OPTIONS = ("initvals", "target_accept", "max_treedepth")
_CHUNK_ELEMENTS = 4_000_000  # window log-weights evaluated per call (32 MB)
_MARGINAL = "_dpinfer_marginal_fit"


def sample(
    draws: int = 1000,
    *,
    tune: int = 1000,
    chains: int = 2,
    cores: int | None = None,
    random_seed: int | None = None,
    tol: float = 1e-10,
    progressbar: bool = True,
    model=None,
    log_likelihood: bool = False,
    method: str = "auto",
    **sample_kwargs,
):
    """Sample the posterior of a model with privatised releases of latent counts.

    Parameters
    ----------
    draws, tune, chains, cores, random_seed, progressbar
        As in ``pm.sample`` (NUTS runs on the continuous parameters).
    tol
        Bound on the relative error of the windowed likelihood, checked on every posterior
        draw: sum_i log1p(eta_i / L_i(theta)) <= tol (inference notes §1).
    log_likelihood
        Also compute the per-cell marginal log-likelihood of each release (for LOO/WAIC).
    method
        ``"auto"``: the compiled exact Gibbs engine where the model allows it (module
        docstring), else the PyMC engine (counts summed out where they are a release's only
        child, exact convolution for group totals, fibre moves for other invariants and linear
        queries, windowed Gibbs for counts with other children). ``"marginal"``: the PyMC
        engine with counts summed out wherever possible. ``"fibre"``: the PyMC engine with
        fibre moves wherever there are invariants or queries (e.g. to compare the samplers).
    sample_kwargs
        Passed to ``pm.sample`` (PyMC engine); the compiled engine takes ``initvals``,
        ``target_accept`` (0.8) and ``max_treedepth`` (10), as PyMC's NUTS.

    Returns
    -------
    xarray.DataTree with the parameters and the exact draws of the latent counts in
    ``posterior``; ``posterior.attrs["dpinfer"]`` (JSON) records, per release, the method,
    window half-width, the largest neglected-mass bound over draws and the widenings made.
    """
    tol = check_probability(tol, "tol")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    model = pm.modelcontext(model)
    records = releases_of(model)
    if not records:
        raise ValueError(
            "the model has no release registered with Mechanism.observe(...); use pm.sample"
        )
    rng = np.random.default_rng(random_seed)
    plans, fibre_plans = _plans(model, records, allow_convolution=method != "fibre")
    reason = _compiled_engine_refusal(model, plans, fibre_plans, method)
    if reason is None:
        try:
            compiled = compiled_model_for(model, [model[p.latent_name] for p in plans],
                                          [p.record.release_rv for p in plans])
        except NotCompilableError as err:
            reason = str(err)
        else:
            unknown = sorted(set(sample_kwargs) - set(COMPILED_OPTIONS))
            if unknown:
                raise TypeError(
                    f"dpinfer.sample got {unknown}, which the compiled engine does not take (it "
                    f"takes {COMPILED_OPTIONS}); pass method='marginal' to run PyMC's pm.sample "
                    "with them"
                )
            return _sample_compiled(model, compiled, plans, draws=draws, tune=tune, chains=chains,
                                    cores=cores, rng=rng, tol=tol, progressbar=progressbar,
                                    log_likelihood=log_likelihood, **sample_kwargs)
    cached = getattr(model, _MARGINAL, None)
    cached_widths = cached.widths() if cached else {}
    for plan in plans:
        # keep the compiled model if its windows are wide enough
        k = max(_initial_half_width(plan, tol), cached_widths.get(plan.latent_name, 0))
        plan.window = make_window(plan.mechanism, plan.release_value, plan.support, k)
    for plan in fibre_plans:
        plan.tol = tol
        plan.half_width = max(
            initial_half_width_for(plan, tol, np.log(1e8 * MOVES_PER_CELL)),
            cached_widths.get(plan.latent_name, 0),
        )

    seeds = rng.integers(2**31, size=MAX_WIDENINGS + 1)
    for attempt in range(MAX_WIDENINGS + 1):
        fit = _marginal_fit(model, [p for p in plans if p.method == "marginal"])
        gibbs_plans = [p for p in plans if p.method == "gibbs"]
        steps = [fit.gibbs_step(p) for p in gibbs_plans]
        if fit.model.free_RVs:
            start = fit.model.initial_point()
            initvals = {s.latent_name: s.initial_value(start) for s in steps}
            if fibre_plans:
                steps.append(fit.fibre_step(fibre_plans))
                initvals.update({p.latent_name: p.start().reshape(p.shape) for p in fibre_plans})
            initvals.update(sample_kwargs.pop("initvals", None) or {})
            # PyMC's own NUTS: the rewritten model holds dpinfer's Python Ops (convolution
            # likelihood, normalisers), which nutpie (PyMC's default when installed) cannot run
            sample_kwargs.setdefault("nuts_sampler", "pymc")
            with fit.model:
                idata = pm.sample(
                    draws,
                    tune=tune,
                    chains=chains,
                    cores=cores,
                    random_seed=int(seeds[attempt]),
                    progressbar=progressbar,
                    step=steps or None,
                    initvals=initvals or None,
                    **sample_kwargs,
                )
        else:  # nothing continuous left: the counts' posterior is the window weights, i.i.d.
            coords = {"chain": np.arange(chains), "draw": np.arange(draws)}
            idata = xr.DataTree.from_dict({"posterior": xr.Dataset(coords=coords)})
        report, failed = _draw_latents(idata, fit, model, tol, rng, progressbar)
        for extra in (_gibbs_report(idata, gibbs_plans, tol), _fibre_report(idata, fibre_plans, tol)):
            report.update(extra[0])
            failed.update(extra[1])
        if not failed:
            break
        if attempt == MAX_WIDENINGS:
            raise RuntimeError(
                f"the window bound still exceeds tol={tol} after {MAX_WIDENINGS} widenings for "
                f"{sorted(failed)}; the posterior puts mass where the likelihood is tiny - check the model"
            )
        for plan in plans:
            if plan.latent_name in failed:
                plan.window = _widened(plan, failed[plan.latent_name], tol)
        for plan in fibre_plans:
            if plan.latent_name in failed:
                plan.half_width = widened_half_width(plan, failed[plan.latent_name], tol)
        if progressbar:
            print(f"dpinfer: widening the windows of {sorted(failed)} and refitting")

    for entry in report.values():
        entry["widenings"] = attempt
        entry["engine"] = "pymc"
        entry["engine_reason"] = reason
    idata.posterior.attrs["dpinfer"] = json.dumps(report)
    if log_likelihood:
        with fit.model:
            pm.compute_log_likelihood(idata, progressbar=progressbar)
    return idata


_EXACT_GIBBS_METHOD = (
    "exact Gibbs (compiled): the counts drawn exactly given the parameters, then one NUTS "
    "transition of the parameters given the counts"
)
_EXACT_TOTALS_METHOD = (
    "exact Gibbs (compiled): the counts drawn exactly and jointly on the group totals given the "
    "parameters, then one NUTS transition of the parameters given the counts"
)


def _compiled_engine_refusal(model, plans, fibre_plans, method: str) -> str | None:
    """Why the compiled engine cannot fit this model (None: it can)."""
    if method != "auto":
        return f"method={method!r} selects the PyMC engine"
    if fibre_plans:
        return ("latent counts with invariants other than group totals, linear queries or a "
                "release conditioned on non-negativity take fibre moves (PyMC engine)")
    for plan in plans:
        if plan.method != "marginal":
            return (f"the counts {plan.latent_name!r} have children besides their release "
                    "(windowed Gibbs, PyMC engine)")
        if plan.group_codes is not None and not has_exact_tails(plan.mechanism):
            return f"the release of {plan.latent_name!r} has no exact tail envelope"
    latents = {p.latent_name for p in plans}
    for rv in model.free_RVs:
        if rv.name not in latents and rv.type.dtype.startswith(("int", "uint", "bool")):
            return (f"the discrete free variable {rv.name!r} is not a latent count behind a "
                    "release (PyMC's step methods sample it)")
    return None


def _sample_compiled(model, compiled, plans, *, draws, tune, chains, cores, rng, tol,
                     progressbar, log_likelihood, initvals=None, target_accept=0.8,
                     max_treedepth=10):
    """The compiled exact Gibbs engine (module docstring); windows without exact tails are
    checked against ``tol`` on every draw and widened as on the PyMC engine."""
    target_accept = check_probability(target_accept, "target_accept")
    if int(max_treedepth) != max_treedepth or max_treedepth < 1:
        raise ValueError(f"max_treedepth must be a whole number >= 1, got {max_treedepth!r}")
    for name, value in (("draws", draws), ("tune", tune), ("chains", chains)):
        if int(value) != value or value < (1 if name != "tune" else 0):
            raise ValueError(f"{name} must be a whole number >= {1 if name != 'tune' else 0}, got {value!r}")
    cores = min(chains, cores if cores is not None else (os.cpu_count() or 1))
    widths = {p.latent_name: None for p in plans}
    for attempt in range(MAX_WIDENINGS + 1):
        blocks, starts = [], {}
        for plan in plans:
            mech = plan.mechanism
            exact = has_exact_tails(mech)
            if widths[plan.latent_name] is None:
                widths[plan.latent_name] = tail_half_width(mech) if exact else _initial_half_width(plan, tol)
            k = widths[plan.latent_name]
            plan.window = make_window(mech, plan.release_value, plan.support, k)
            tables = CellTables.build(mech, plan.release_value, plan.support, k,
                                      log_eta=None if exact else plan.window.log_eta)
            offset = compiled.latent_slices[plan.latent_name].start
            prior = compiled.prior_tables[plan.latent_name]
            centres = plan.window.centres.reshape(-1)
            if plan.group_codes is None:
                blocks.append(IndependentCells(plan.latent_name, offset, tables, prior))
                starts[plan.latent_name] = centres
            else:
                codes = np.asarray(plan.group_codes).reshape(-1)
                targets = np.rint(np.bincount(codes, weights=plan.release_value.reshape(-1))).astype(np.int64)
                blocks.append(GroupTotals(plan.latent_name, offset, tables, prior, codes, targets))
                starts[plan.latent_name] = point_on_totals(centres, codes, targets, plan.support,
                                                           plan.latent_name)
        try:
            idata, _ = fit_compiled(model, compiled, blocks, starts, draws=draws, tune=tune,
                                    chains=chains, cores=cores, rng=rng, progressbar=progressbar,
                                    max_tree_depth=max_treedepth, target_accept=target_accept,
                                    initvals=initvals)
        except SamplingError as err:
            raise RuntimeError(f"dpinfer.sample: {err}") from err
        report, failed = {}, {}
        stats = idata.sample_stats
        for plan, block in zip(plans, blocks):
            exact = has_exact_tails(plan.mechanism)
            held = stats[block.stat_names[1]].values
            entry = _report_entry(plan, _EXACT_GIBBS_METHOD if plan.group_codes is None
                                  else _EXACT_TOTALS_METHOD, 0.0, tol)
            entry.update(engine="compiled", exact_tails=exact,
                         held_cells_after_tuning=int(held.sum()),
                         draws_with_held_cells=int(np.count_nonzero(held)))
            if plan.group_codes is not None:
                entry["mean_tries_per_sweep"] = float(stats[block.stat_names[0]].values.mean())
                entry["blocks_kept_after_tuning"] = int(stats[block.stat_names[2]].values.sum())
            if not exact:
                bound = float(np.max(stats[block.stat_names[0]].values))
                entry["max_relative_error_bound"] = bound
                if not bound <= tol:
                    failed[plan.latent_name] = bound
            report[plan.latent_name] = entry
        if not failed:
            break
        if attempt == MAX_WIDENINGS:
            raise RuntimeError(
                f"the window bound still exceeds tol={tol} after {MAX_WIDENINGS} widenings for "
                f"{sorted(failed)}; the posterior puts mass where the likelihood is tiny - check the model"
            )
        for plan in plans:
            if plan.latent_name in failed:
                widths[plan.latent_name] = _widened(plan, failed[plan.latent_name], tol).half_width
        if progressbar:
            print(f"dpinfer: widening the windows of {sorted(failed)} and refitting")
    for entry in report.values():
        entry["widenings"] = attempt
    idata.posterior.attrs["dpinfer"] = json.dumps(report)
    if log_likelihood:
        fit = _marginal_fit(model, plans)
        with fit.model:
            pm.compute_log_likelihood(idata, progressbar=progressbar)
    return idata


def point_on_totals(centres, codes, targets, support, name: str) -> np.ndarray:
    """Counts near ``centres`` inside ``support`` whose group sums equal ``targets``: each
    group's surplus taken from (or deficit added to) its cells in turn, largest first."""
    lower, upper = support
    lo = -np.inf if lower is None else lower
    hi = np.inf if upper is None else upper
    x = np.clip(np.asarray(centres, dtype=np.int64), lo, hi).astype(np.int64)
    for g, target in enumerate(targets):
        cells = np.flatnonzero(codes == g)
        cells = cells[np.argsort(-x[cells], kind="stable")]
        diff = int(x[cells].sum() - target)
        for i in cells:
            if diff == 0:
                break
            room = x[i] - lo if diff > 0 else hi - x[i]
            step = int(min(abs(diff), room))
            x[i] += -step if diff > 0 else step
            diff += -step if diff > 0 else step
        if diff != 0:
            raise ValueError(
                f"the released total {int(target)} of group {g} of {name!r} is outside what its "
                f"cells can reach in their support {support}"
            )
    return x


_MARGINAL_METHOD = (
    "exact marginalisation over a proven window (NUTS on parameters) "
    "+ exact conditional draws of the counts"
)
_CONVOLUTION_METHOD = (
    "exact marginalisation over group totals by convolution (NUTS on parameters) "
    "+ exact joint draws of the counts on the fibre"
)
_FIBRE_METHOD = (
    "exact Gibbs updates along Markov-basis moves of the fibre, NUTS on the continuous parameters"
)
_GIBBS_METHOD = (
    "windowed exact Gibbs updates of each count (the counts have other children), "
    "NUTS on the continuous parameters"
)


def _report_entry(plan, method: str, bound: float, tol: float) -> dict:
    return {
        "release": plan.record.name,
        "mechanism": repr(plan.record.mechanism),
        "method": method,
        "window_half_width": plan.window.half_width,
        "max_relative_error_bound": bound,
        "tol": tol,
    }


def _widened(plan, bound: float, tol: float):
    """A window whose bound should come out 10 times below ``tol``: every bound here is
    proportional to the tail bound eta for small values, so shrink eta by tol / (10 bound);
    double the width where the bound is infinite (a window that held no mass)."""
    mech, s, k = plan.mechanism, plan.release_value, plan.window.half_width
    if np.isfinite(bound):
        target = float(np.max(plan.window.log_eta)) + np.log(tol / (10.0 * bound))
        k = max(k + 1, initial_half_width(mech, s, log_target=target, support=plan.support))
    else:
        k = 2 * k
    return make_window(mech, s, plan.support, k)


def _plans(model, records, *, allow_convolution: bool):
    """One plan per latent. Latents whose releases are all of the counts themselves get the
    window plans of the foundation (the first release sets the window, further releases are
    children in the windowed Gibbs step); latents with a conditioned release or a release of a
    linear query get a fibre plan, or a convolution plan for group totals."""
    plans, fibre_plans = [], []
    for latent, entries in entries_from(model, records, resolve_query).items():
        special = [e for e in entries if respects_invariants(e.record.mechanism) or e.query is not None]
        if not special:
            plans.append(plan_marginalisation(model, entries[0].record))
            continue
        plan = plan_fibre(model, latent, entries, allow_convolution=allow_convolution)
        if plan.method == "fibre":
            fibre_plans.append(plan)
            continue
        mech = plan.record.mechanism
        plans.append(MarginalPlan(
            record=plan.record, latent_name=plan.latent_name,
            release_value=entries[0].value.reshape(plan.shape), support=plan.support,
            method="marginal", cell_mechanism=mech.base,
            group_codes=mech.invariants.group_codes,
        ))
    return plans, fibre_plans


def _fibre_report(idata, plans, tol):
    """Report of the fibre latents: the largest per-sweep bound over all steps and the share
    of line updates that moved the counts (one statistic shared by all fibre latents)."""
    report, failed = {}, {}
    if not plans:
        return report, failed
    stats = idata.sample_stats
    bound = float(np.max(stats["fibre_neglected_mass_bound"].values))
    moved = float(np.mean(stats["fibre_moves_changed"].values))
    for plan in plans:
        constraint = plan.constraint
        report[plan.latent_name] = {
            "release": [e.record.name for e in plan.entries],
            "mechanism": [repr(e.record.mechanism) for e in plan.entries],
            "method": _FIBRE_METHOD,
            "invariants": constraint.kind if constraint is not None else "none",
            "markov_moves": len(plan.moves),
            "connectivity": _connectivity(constraint),
            "window_half_width": plan.half_width,
            "share_of_updates_that_moved": moved,
            "max_relative_error_bound": bound,
            "tol": tol,
        }
        if plan.normaliser is not None:
            report[plan.latent_name]["nonnegativity"] = {
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
        if not bound <= tol:
            failed[plan.latent_name] = bound
    return report, failed


def _connectivity(constraint) -> str:
    if constraint is None:
        return "unit moves: every box is connected"
    return {
        "total": "pair moves: a Markov basis for a total",
        "groups": "pair moves within groups: a Markov basis for group totals",
        "margins": "Markov basis of the margins (all basic 2x2 moves for two-way margins)",
    }.get(constraint.kind, "Markov basis computed by 4ti2")


def _gibbs_report(idata, plans, tol):
    """Report of the windowed Gibbs latents: the largest bound over all steps (every chain and
    draw, tuning excluded). With several Gibbs latents the stat is their largest."""
    report, failed = {}, {}
    for plan in plans:
        bound = float(np.max(idata.sample_stats["neglected_mass_bound"].values))
        report[plan.latent_name] = _report_entry(plan, _GIBBS_METHOD, bound, tol)
        if not bound <= tol:
            failed[plan.latent_name] = bound
    return report, failed


def _initial_half_width(plan, tol: float) -> int:
    """Start where each cell's tail bound is tol / (n_cells 1e4) of the likelihood at its
    window centre; every posterior draw is checked afterwards against the actual windowed
    likelihood (the prior rarely puts less than 1e-4 of its mass near the release)."""
    mech, s = plan.mechanism, plan.release_value
    centre = window_centres(s, plan.support)
    log_peak = float(np.min(mech.log_likelihood(s, centre)))
    # with group totals the bound is relative to the convolution V = P(S = t) prod_j L_j under
    # the cells' product law: 1 / P(S = t) ~ sqrt(2 pi n) sd / phi(z) for a group of n cells,
    # z the total's standardised distance, so the margin grows with sqrt(n) (inference notes
    # §2; a fixed 1e3 made the 5-state midwest fit, 437 counties, widen and refit once)
    if plan.group_codes is not None:
        margin = np.log(1e4) + np.log(1e3) + 0.5 * np.log(np.max(np.bincount(plan.group_codes)))
    else:
        margin = np.log(1e4)
    target = np.log(tol) - np.log(np.size(s)) - margin + log_peak
    return initial_half_width(mech, s, log_target=target, support=plan.support)


class _MarginalFit:
    """A marginalised model kept on the original model, so refits with new data
    (pm.set_data on the original model) reuse its compiled functions."""

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
        """Window half-widths in use, by latent name (marginalised, Gibbs and fibre latents)."""
        widths = {p.latent_name: p.window.half_width for p in self.plans}
        widths.update({name: step.window.half_width for name, step in self._gibbs.items()})
        if self._fibre is not None:
            widths.update(dict(self._fibre[0]))
        return widths

    def sync_data(self, model, plans) -> None:
        """Copy the current value of every pm.Data variable of ``model`` (new releases,
        covariates, other observed data) into the kept marginal model, whose data are copies."""
        for var in model.data_vars:
            if hasattr(var, "get_value"):
                self.model[var.name].set_value(var.get_value())
        self.plans = plans


def _marginal_fit(model, plans) -> _MarginalFit:
    fit = getattr(model, _MARGINAL, None)
    if fit is None or fit.half_widths != [p.window.half_width for p in plans]:
        fit = _MarginalFit(model, plans)
        setattr(model, _MARGINAL, fit)
    else:
        fit.sync_data(model, plans)
    return fit


def _draw_latents(idata, fit, model, tol, rng, progressbar):
    """Exact draws of each latent given each posterior draw.

    Returns (report, failed): ``failed`` maps each latent whose window bound exceeded ``tol``
    on some draw to the largest bound reached."""
    posterior = idata.posterior.to_dataset()
    values = [posterior[rv.name].values for rv in fit.model.free_RVs]
    n_chains, n_draws = posterior.sizes["chain"], posterior.sizes["draw"]
    report, failed = {}, {}
    for plan in fit.plans:
        if progressbar:
            print(f"dpinfer: exact draws of {plan.latent_name!r} given each posterior draw")
        log_weights = fit.log_weights(plan)
        grid = plan.window.grid()
        cells = grid.shape[1:]
        flat_values = [v.reshape((n_chains * n_draws, *v.shape[2:])) for v in values]
        draws_out = np.empty((n_chains * n_draws,) + cells, dtype=np.int64)
        worst = -np.inf
        chunk = max(1, _CHUNK_ELEMENTS // grid.size)
        for start in range(0, n_chains * n_draws, chunk):
            part = slice(start, start + chunk)
            n_part = len(range(n_chains * n_draws)[part])
            # (draws, W, *cells); with no parameters the weights are the same for every draw
            lw = log_weights(*[v[part] for v in flat_values]) if values else np.broadcast_to(
                log_weights(), (n_part, *grid.shape)
            )
            log_l = np.logaddexp.reduce(lw, axis=1)
            if plan.group_codes is None:
                worst = max(worst, float(np.max(neglected_log_mass(plan.window.log_eta, log_l))))
                draws_out[part] = _categorical(grid, lw - log_l[:, None], rng)
            else:
                log_bound, draws = _draw_on_totals(plan, lw, log_l, rng)
                worst = max(worst, log_bound)
                draws_out[part] = draws.reshape((n_part, *cells))
        draws_out = draws_out.reshape((n_chains, n_draws) + cells)
        dims = model.named_vars_to_dims.get(plan.latent_name) or [
            f"{plan.latent_name}_dim_{i}" for i in range(len(cells))
        ]
        coords = {dim: np.asarray(model.coords[dim]) for dim in dims if model.coords.get(dim)}
        posterior[plan.latent_name] = xr.DataArray(
            draws_out, dims=("chain", "draw", *dims), coords=coords
        )
        bound = float(np.expm1(worst)) if np.isfinite(worst) else float("inf")
        method = _MARGINAL_METHOD if plan.group_codes is None else _CONVOLUTION_METHOD
        report[plan.latent_name] = _report_entry(plan, method, bound, tol)
        if not bound <= tol:
            failed[plan.latent_name] = bound
    idata["posterior"] = xr.DataTree(posterior)  # attribute assignment would not replace the node
    return report, failed


def _draw_on_totals(plan, lw, log_l, rng):
    """Exact joint draws of counts conditioned on group totals, one per posterior draw
    (backward sampling through the convolution tree, inference notes §2), and the largest
    log1p bound on the neglected relative mass over the draws.

    For group g with window sums L_i, tail bounds eta_i and in-window convolution V_g, the
    fibre mass with some cell outside its window is at most sum_i eta_i prod_{j != i}
    (L_j + eta_j) (drop the total constraint, which only adds mass), so the relative error
    is at most exp(sum_j log(L_j + eta_j) - log V_g) sum_i eta_i / (L_i + eta_i)."""
    n, width = lw.shape[0], lw.shape[1]
    codes = plan.group_codes
    log_g = lw.reshape(n, width, -1).transpose(0, 2, 1)
    lower = plan.window.centres.reshape(-1) - plan.window.half_width
    targets = np.bincount(codes, weights=plan.release_value.reshape(-1) - lower).astype(np.int64)
    draws = lower + sample_given_sums(log_g, codes, targets, rng)
    eta = plan.window.log_eta.reshape(-1)
    log_tot = np.logaddexp(log_l.reshape(n, -1), eta)
    worst = -np.inf
    n_groups = codes.max() + 1
    for b in range(n):
        log_v, _ = log_convolution_at(log_g[b], codes, targets)
        total = 0.0
        for g in range(n_groups):
            cells = codes == g
            log_ratio = (np.logaddexp.reduce(eta[cells] - log_tot[b, cells])
                         + np.sum(log_tot[b, cells]) - log_v[g])
            total += np.log1p(np.exp(min(log_ratio, 700.0)))
        worst = max(worst, total)
    return worst, draws


def _categorical(grid: np.ndarray, log_p: np.ndarray, rng) -> np.ndarray:
    """One draw per (draw, cell) from probabilities exp(log_p) of shape (draws, W, *cells)
    over the window grid (W, *cells), by inversion of the cumulative sums."""
    cdf = np.cumsum(np.exp(log_p), axis=1)
    u = rng.random((cdf.shape[0], 1) + cdf.shape[2:]) * cdf[:, -1:]
    index = np.minimum(np.sum(cdf < u, axis=1), grid.shape[0] - 1)
    return np.take_along_axis(grid[None, ...], index[:, None, ...], axis=1)[:, 0]


def marginal_model(model=None, tol: float = 1e-10):
    """``model`` with its latent counts summed out over proven windows, releases still
    observed (the model :func:`sample`'s PyMC engine fits). Use it for
    ``pm.sample_posterior_predictive`` of releases and ``pm.compute_log_likelihood``
    (per-cell marginal log-likelihoods). Built on first use for models fitted by the
    compiled engine, with windows whose tail bound is ``tol``."""
    model = pm.modelcontext(model)
    fit = getattr(model, _MARGINAL, None)
    if fit is None:
        records = releases_of(model)
        if not records:
            raise ValueError("the model has no release registered with Mechanism.observe(...)")
        plans, fibre_plans = _plans(model, records, allow_convolution=True)
        if fibre_plans:
            raise ValueError(
                "latents on fibres (invariants beyond group totals, queries) have no marginal model"
            )
        for plan in plans:
            plan.window = make_window(plan.mechanism, plan.release_value, plan.support,
                                      _initial_half_width(plan, tol))
        fit = _marginal_fit(model, [p for p in plans if p.method == "marginal"])
    return fit.model


def warn_if_latent(var) -> None:
    """Called by PyMC's step assignment (via :class:`LatentCountGuard`) for every variable."""
    name = getattr(var.tag, "dpinfer_release", None)
    if name is not None:
        warnings.warn(
            f"{var.name!r} are true counts behind the privatised release {name!r}: PyMC's default "
            "Metropolis mixes poorly on them. Use dpinfer.sample() instead of pm.sample(), which "
            "sums them out exactly and draws them exactly.",
            UserWarning,
            stacklevel=2,
        )
