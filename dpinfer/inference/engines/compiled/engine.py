"""dpinfer's compiled Gibbs engine: fit a model whose latent counts have exact conditional
draws, with NUTS on everything continuous (and plain compiled NUTS for a model without
latent counts).

It runs cells and totals plans (:mod:`dpinfer.inference.planning.cells`) of models whose
other free variables are all continuous; :func:`refusal` says why a model cannot take it. A
sweep draws every latent's counts given the parameters (each plan's block,
:mod:`~dpinfer.inference.engines.compiled.count_blocks`) and makes ``nuts_per_sweep`` NUTS
transitions of the parameters given the counts, with ``counts_per_sweep`` count draws
alternating with them (:mod:`~dpinfer.inference.engines.compiled.chains`). The compiled model
(:mod:`~dpinfer.inference.engines.compiled.model`) is kept on the PyMC model and reused by
later fits, the model's data handed over afresh each time (``pm.set_data``); a new model
object of a structure compiled before loads its functions from the model cache
(:mod:`~dpinfer.inference.engines.compiled.cache`).

The result is an ``xarray.DataTree`` like ``pm.sample``'s: ``posterior`` (free variables in
their constrained space, Deterministics, latent counts, with the model's dims and coords) and
``sample_stats`` (NUTS statistics under PyMC's names, and each block's).
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import sys
import time

import numpy as np
import xarray as xr

from dpinfer.inference.checkpoint import model_hash
from dpinfer.inference.engines.compiled.chains import (
    COUNTS_PER_SWEEP,
    MAX_TREE_DEPTH,
    NUTS_PER_SWEEP,
    SamplingError,
    run_chains,
)
from dpinfer.inference.engines.compiled.count_blocks import (
    CellTables,
    GroupTotals,
    IndependentCells,
    NestedCounts,
)
from dpinfer.inference.engines.compiled.mode_start import mode_starts
from dpinfer.inference.engines.compiled.model import NotCompilableError, compile_model
from dpinfer.inference.report import window_entry

_COMPILED = "_dpinfer_compiled_model"
OPTIONS = ("initvals", "target_accept", "max_treedepth", "nuts_per_sweep", "counts_per_sweep", "reserve_per_draw")
AFTER_SAMPLING = 2.0  # the work after sampling (draws gathered, report, verdict) per value, in verdict costs
METHODS = {
    "cells": ("exact Gibbs (compiled): the counts drawn exactly given the parameters, alternating "
              "with NUTS transitions of the parameters given the counts (counts_per_sweep and "
              "nuts_per_sweep per draw, in sample_stats.attrs)"),
    "totals": ("exact Gibbs (compiled): the counts drawn exactly and jointly on the group totals "
               "given the parameters, alternating with NUTS transitions of the parameters given the "
               "counts (counts_per_sweep and nuts_per_sweep per draw, in sample_stats.attrs)"),
    "nested": ("exact Gibbs (compiled): the counts moved by exact sum-tree draws along every cell "
               "and random pairs of cells (dpinfer.lattice.nested) given the parameters, "
               "alternating with NUTS transitions of the parameters given the counts"),
}
HELD_METHOD = ("empirical Bayes (compiled): the counts drawn exactly given the parameters held at their "
               "empirical-Bayes estimate (posterior.attrs['dpinfer_empirical_bayes']), counts_per_sweep draws "
               "per stored draw, no NUTS")
DRAWN_METHOD = ("empirical Bayes (compiled): the counts drawn exactly and the parameters drawn with them "
                "(empirical_bayes['drawn']) moved by NUTS, given the other parameters held at their empirical-Bayes "
                "estimate (posterior.attrs['dpinfer_empirical_bayes'])")
STUCK_SHARE = 0.5  # a chain holding cells in more than this share of its draws is stuck


def refusal(model, plans, method: str) -> str | None:
    """Why the compiled engine cannot fit this model with these plans (None: it can)."""
    if method != "auto":
        return f"method={method!r} selects another engine"
    for plan in plans:
        if plan.kind == "fibre":
            return (f"the counts {plan.latent_name!r} have invariants other than group totals, "
                    "releases of linear queries or of parts of them, or a release conditioned on "
                    "non-negativity: they take fibre moves (PyMC engine)")
        if plan.kind == "children":
            return (f"the counts {plan.latent_name!r} have children besides their release "
                    "(windowed Gibbs, PyMC engine)")
    latents = {p.latent_name for p in plans}
    for rv in model.free_RVs:
        if rv.name not in latents and rv.type.dtype.startswith(("int", "uint", "bool")):
            return (f"the discrete free variable {rv.name!r} is not a latent count behind a "
                    "release (PyMC's step methods sample it)")
    return None


def compile_for(model, plans):
    """The compiled model for these plans (kept on ``model``), or the reason it cannot be
    built (an Op without a numba implementation): (compiled, None) or (None, reason)."""
    try:
        return compiled_model_for(model, [model[p.latent_name] for p in plans],
                                  [p.record.release_rv for p in plans]), None
    except NotCompilableError as err:
        return None, str(err)


def compiled_model_for(model, latents: list, releases: list):
    """The compiled model kept on ``model`` if it was built for the same latents and the
    model still matches it (:meth:`~dpinfer.inference.engines.compiled.model.CompiledModel.matches`);
    otherwise a new one (kept), its functions from the model cache where they were compiled
    before (:mod:`dpinfer.inference.engines.compiled.cache`)."""
    key = (tuple(rv.name for rv in latents), tuple(rv.name for rv in releases))
    cached = getattr(model, _COMPILED, None)
    if cached is not None and cached[0] == key and cached[1].matches(model):
        cached[1].refresh()
        return cached[1]
    compiled = compile_model(model, latents, releases)
    setattr(model, _COMPILED, (key, compiled))
    return compiled


def run(model, compiled, plans, *, draws: int, tune: int, chains: int, cores: int,
        rng: np.random.Generator, tol: float, progressbar: bool, initvals=None,
        target_accept: float = 0.8, max_treedepth: int = MAX_TREE_DEPTH,
        nuts_per_sweep: int = NUTS_PER_SWEEP, counts_per_sweep: int | None = None, checkpoint=None,
        held=None, deadline: float | None = None, spread: dict | None = None, start=None,
        reserve_per_draw: float = 0.0, mode_start: list | None = None):
    """One fit with the plans' current windows: (DataTree, report, failed), ``failed`` mapping
    each latent whose window (without exact tails) missed ``tol`` to its largest bound.
    ``counts_per_sweep`` defaults to min(COUNTS_PER_SWEEP, nuts_per_sweep). ``checkpoint``: a
    function of the model's hash returning the fit's
    :class:`~dpinfer.inference.checkpoint.Checkpoint` (or None). ``held``: an
    :class:`~dpinfer.inference.empirical_bayes.Estimate` whose parameters are held while the
    counts are drawn given them (``counts_per_sweep`` draws per stored draw, default 1; the
    chains start from its counts; no NUTS); ``spread`` ({"every": K, "burn": B}): the held
    parameters drawn afresh from the normal law of the estimate's mode and approximate posterior
    sds every K stored draws, B count draws after each (empirical Bayes with the parameters'
    uncertainty). ``start``: an estimate whose parameters and counts start the chains of a
    full-Bayes fit. ``mode_start``: names of variables held at their start values while the
    others start around their mode (:mod:`~dpinfer.inference.engines.compiled.mode_start`;
    its summary in ``posterior.attrs["dpinfer_start"]``). ``deadline`` (``time.monotonic()``
    seconds): while
    the draws miss the convergence targets and time is left, the chains sample on
    (:func:`sample_on`), and they stop in time for the work on their draws that follows: the
    fit's own (AFTER_SAMPLING x :func:`~dpinfer.inference.convergence.seconds_per_value` per
    value stored, and with ``held`` parameters not spread a gradient per draw for
    :func:`hyperparameter_scores`), and ``reserve_per_draw`` seconds per draw of every chain
    for the caller's."""
    if held is not None and not held.drawn.any():
        nuts_per_sweep, counts_per_sweep = 0, 1 if counts_per_sweep is None else counts_per_sweep
    counts_per_sweep = _counts_per_sweep(counts_per_sweep, nuts_per_sweep)
    if deadline is not None:
        from dpinfer.inference.convergence import seconds_per_value

        reserve_per_draw += chains * (compiled.n_counts + compiled.n) * AFTER_SAMPLING * seconds_per_value()
        if held is not None and spread is None and np.isfinite(held.gradient_seconds):
            reserve_per_draw += chains * held.gradient_seconds  # the scores (at most SCORED_DRAWS a chain)
    blocks = [count_block(plan, compiled) for plan in plans]
    starts = {plan.latent_name: plan.start for plan in plans}
    try:
        idata = _fit(model, compiled, blocks, starts, draws=draws, tune=tune, chains=chains,
                     cores=cores, rng=rng, progressbar=progressbar, max_tree_depth=max_treedepth,
                     stop_when=edge_watch(plans, blocks, compiled),
                     target_accept=target_accept, initvals=initvals, nuts_per_sweep=nuts_per_sweep,
                     counts_per_sweep=counts_per_sweep, checkpoint=checkpoint, held=held, start=start,
                     deadline=deadline, reserve_per_draw=reserve_per_draw, mode_start=mode_start,
                     more=None if deadline is None else sample_on(compiled, held, deadline, progressbar,
                                                                  reserve_per_draw),
                     spread=None if spread is None else (held.q, held.posterior_sd, spread["every"], spread["burn"]))
    except SamplingError as err:
        raise type(err)(f"dpinfer.sample: {err}") from err
    report, failed = {}, {}
    for plan, block in zip(plans, blocks):
        report[plan.latent_name], bound = plan_report(plan, idata, block, tol)
        if held is not None:
            report[plan.latent_name]["method"] = DRAWN_METHOD if held.drawn.any() else HELD_METHOD
        if bound is not None:
            failed[plan.latent_name] = bound
    return idata, report, failed


def sample_on(compiled, held, deadline: float, progressbar: bool, reserve_per_draw: float = 0.0):
    """The ``more`` of :func:`~dpinfer.inference.engines.compiled.chains.run_chains`: how many
    more draws the chains make to meet the convergence targets over the counts and the
    parameters unless ``held`` (an empirical-Bayes estimate, or None; those it draws with the
    counts are judged as latents with them) (:func:`dpinfer.inference.convergence.draws_to_add`;
    the counts' R-hat against the latents' bound when parameters are judged beside them), within the
    time left before ``deadline`` less ``reserve_per_draw`` seconds per draw (of every chain)
    for the work after sampling; says what it does."""
    from dpinfer.inference.convergence import draws_to_add

    drawn = np.zeros(compiled.n, bool) if held is None else held.drawn.copy()
    scalars = np.zeros(compiled.n, bool)  # a drawn scalar stays a parameter (sample.latent_names' rule)
    for sl in compiled.slices:
        scalars[sl] = sl.stop - sl.start == 1
    judged = scalars & drawn if held is not None else np.ones(compiled.n, bool)
    drawn &= ~scalars

    def more(states, seconds_per_draw):
        draws = states[0].draws_q.shape[0]
        step = 2048
        parameters = [np.stack([s.draws_q[:, judged] for s in states])] if judged.any() else []
        n_counts = states[0].draws_counts.shape[1]
        counts = (np.stack([s.draws_counts[:, i:i + step] for s in states]).astype(float)  # a block at a time
                  for i in range(0, n_counts, step))
        # as the verdict judges them: the counts as latents beside the parameters or the parameters drawn
        # with them (per-area effects: latents too, scalars parameters), or alone (held)
        family = (held is None or held.drawn.any()) and n_counts > 1
        if drawn.any():
            counts = itertools.chain([np.stack([s.draws_q[:, drawn] for s in states])], counts)
        extra = draws_to_add(itertools.chain(parameters, () if family else counts), draws,
                             seconds_per_draw + reserve_per_draw, deadline - time.monotonic() - reserve_per_draw * draws,
                             latents=counts if family else (), n_latents=n_counts + int(drawn.sum()))
        if progressbar:
            left = (deadline - time.monotonic()) / 60
            print(f"dpinfer: {f'sampling on: {extra} more draws per chain' if extra else 'no more draws'} "
                  f"({max(left, 0):.1f} min left of max_minutes)", file=sys.stderr, flush=True)
        return extra

    return more


SCORED_DRAWS = 500  # per chain, evenly spaced: the draws hyperparameter_scores evaluates


def hyperparameter_scores(compiled, results, estimated: np.ndarray) -> np.ndarray:
    """(chains, draws, estimated parameters): the complete-data score g(q, x) = d/dq log p(q,
    x, y) (the gradient NUTS uses) in the ``estimated`` coordinates (a mask of q's), at the
    parameters q and the counts x of every SCORED_DRAWS-th-spaced draw of the chains'
    ``results`` (the estimate held, and the parameters drawn with the counts where some are),
    NaN at the others. Its covariance with a quantity of the counts over the draws is the
    derivative of that quantity's posterior mean in the estimated parameters (the score
    identity), which :func:`dpinfer.io.nmf.fit.summaries` turns into the variance their
    uncertainty would add (the delta method)."""
    from dpinfer.inference.engines.compiled.nuts import log_density_at

    chains, draws = len(results), results[0].q.shape[0]
    out = np.full((chains, draws, int(np.sum(estimated))), np.nan)
    buffer = np.zeros(compiled.n_counts, np.int64)
    env = compiled.environment(buffer)
    grad = np.empty(compiled.n)
    for d in np.unique(np.linspace(0, draws - 1, min(draws, SCORED_DRAWS)).round().astype(int)):
        for c, result in enumerate(results):
            buffer[:] = result.counts[d]
            if np.isfinite(log_density_at(compiled.logp_grad_address, np.array(result.q[d]), grad, env)):
                out[c, d] = grad[estimated]
    return out


LEAPFROG_STEPS = 15  # per NUTS transition, in full_bayes_seconds (census tables: ~45 per draw of 3)


def full_bayes_seconds(compiled, estimate, *, chains: int, tune: int, nuts_per_sweep: int = NUTS_PER_SWEEP,
                       counts_per_sweep: int | None = None, ess: float = 400.0) -> tuple[float, str]:
    """(seconds, why): a prediction of the time full Bayes needs to reach a bulk ESS of ``ess``
    over the parameters, from an empirical-Bayes estimate. Data augmentation moves a parameter
    whose fraction of missing information is rho (the estimate's
    :attr:`~dpinfer.inference.empirical_bayes.Estimate.missing_information`) with lag-1
    autocorrelation rho per count draw (a Gaussian target), so a stored draw with c count
    draws has autocorrelation r = rho^c and ESS (1 - r) / (1 + r) per draw; the slowest
    parameter needs 1.25 ``ess`` / (chains x that) draws per chain. A tuning iteration is one
    count draw and one NUTS transition, a stored draw c count draws and ``nuts_per_sweep``
    transitions, each transition LEAPFROG_STEPS gradients; the count draws and gradients take
    what they took in the estimate. Conservative where the estimate's missing information is
    noisy (it overstates the slowest parameter's: validation/results/eb_vs_full_bayes.md);
    parameters the estimate drew with the counts, whose missing information it does not
    measure, are left out (their NUTS transitions are in its draw times)."""
    c = _counts_per_sweep(counts_per_sweep, nuts_per_sweep)
    rho = np.clip(np.nan_to_num(estimate.missing_information, nan=0.0), 0.0, 0.999)  # NaN: drawn, not estimated
    slowest = int(np.argmax(rho))
    r = rho[slowest] ** c
    per_draw = (1.0 - r) / (1.0 + r)
    draws = math.ceil(1.25 * ess / (chains * per_draw))
    sweep, gradient = estimate.draw_seconds, estimate.gradient_seconds
    seconds = tune * (sweep + LEAPFROG_STEPS * gradient) + draws * (c * sweep + nuts_per_sweep * LEAPFROG_STEPS * gradient)
    why = (f"full Bayes predicted to need {seconds / 60:.1f} min: its slowest parameter, "
           f"{parameter_label(compiled, slowest)}, has {rho[slowest]:.0%} of its information missing given the "
           f"counts, so about {per_draw:.3f} ESS per draw and {draws} draws per chain for ESS {ess:.0f}, at "
           f"{sweep:.2g} s a count draw and {gradient * 1000:.2g} ms a gradient")
    return seconds, why


def parameter_label(compiled, i: int) -> str:
    """The name and index of coordinate ``i`` of the unconstrained parameters q."""
    for name, sl, shape in zip(compiled.names, compiled.slices, compiled.shapes):
        if sl.start <= i < sl.stop:
            index = np.unravel_index(i - sl.start, shape) if len(shape) else ()
            return f"{name}[{', '.join(map(str, index))}]" if index else name
    raise IndexError(i)


def estimate_parameters(model, compiled, plans, *, chains: int, cores: int, rng: np.random.Generator,
                        progressbar: bool, initvals=None, drawn: list | tuple = (), **options):
    """The parameters' empirical-Bayes estimate (:func:`dpinfer.inference.empirical_bayes.estimate`,
    ``options`` its settings) from chains of the counts at the plans' starts, the parameters
    from PyMC's initial point (or ``initvals``), with a progress line every 10 s. ``drawn``:
    value variables (names in ``compiled.names``) drawn with the counts by NUTS in each
    E-step instead of estimated (the module docstring's)."""
    from dpinfer.inference import empirical_bayes
    from dpinfer.inference.engines.compiled.chains import Stepper, fresh_state, stat_columns
    from dpinfer.inference.engines.compiled.mode_start import held_coordinates

    blocks = [count_block(plan, compiled) for plan in plans]
    counts0 = compiled.counts_vector({plan.latent_name: plan.start for plan in plans})
    start_seeds, streams = chain_seeds(rng, chains)
    n_stats = len(stat_columns(blocks)[0])
    q0 = compiled.initial_q(start_seeds[0], model, per_chain(initvals, chains)[0])
    moving = held_coordinates(compiled, list(drawn))
    # an E-step with parameters drawn is a tuning iteration (the chain's NUTS step size adapting), at most one
    # per iteration of the estimate; without, no iteration runs (Stepper.e_step draws the counts only)
    tune = options.get("iterations") or options.get("max_iterations", empirical_bayes.MAX_ITERATIONS)
    steppers = [Stepper(compiled, blocks, fresh_state(compiled, n_stats, draws=1, rng=streams[c], q0=q0,
                                                      counts0=counts0, target_accept=0.8),
                        tune=tune if moving.any() else 0, draws=1, nuts_per_sweep=1, counts_per_sweep=1,
                        moving=moving, warm_start=0, adapt_metric=False)  # the estimate sets the metric
                for c in range(chains)]
    began = time.perf_counter()
    last = [began]
    watch = BoxWatch(plans, compiled, steppers)

    def progress(iteration, phase, q, settled):
        widened = watch.look(iteration)
        if progressbar and widened:
            print(f"dpinfer: empirical Bayes: iteration {iteration}: widened the boxes of "
                  + ", ".join(f"{len(pairs)} counts of {name!r}" for name, pairs in widened.items())
                  + " (their draws came within a pilot sd of an edge)", file=sys.stderr, flush=True)
        now = time.perf_counter()
        if progressbar and now - last[0] >= 10.0:
            last[0] = now
            print(f"dpinfer: empirical Bayes: {iteration} iterations ({phase}), {now - began:.0f} s, "
                  f"{(now - began) / iteration:.2g} s an iteration, {settled:.0%} of the parameters' "
                  "estimates within tolerance", file=sys.stderr, flush=True)

    try:
        held = empirical_bayes.estimate(steppers, q0, rng=rng.spawn(1)[0], cores=cores, progress=progress,
                                        **options)
    except SamplingError as err:
        raise RuntimeError(f"dpinfer.sample: {err}") from err
    last = watch.last_look()
    if progressbar and last:
        print("dpinfer: empirical Bayes: widened the boxes of "
              + ", ".join(f"{len(pairs)} counts of {name!r}" for name, pairs in last.items())
              + " before the draws given the estimate (their draws went more than half-way to an edge)",
              file=sys.stderr, flush=True)
    held.widened = watch.widened
    return held


class BoxWatch:
    """The boxes of nested count plans, watched while an empirical-Bayes estimate draws the
    counts: each count's range over the chains' draws is kept, and every ``EVERY`` iterations
    the counts whose range came within their pilot sd of an open edge of their box have their
    boxes widened alone (:meth:`~dpinfer.inference.planning.nested.NestedPlan.counts_near_edges`,
    :meth:`~dpinfer.inference.planning.nested.NestedPlan.widen_counts`) and the chains go on
    with the wider boxes. The draws given the estimate then start with boxes the estimate's own
    draws have tested (hundreds of draws a chain at a county's size), instead of learning after
    all of their draws that a heavy-tailed count reached its box and fitting again. The
    estimate's iterations before a widening drew the counts in the narrower boxes: a truncation
    of a tail the draws had barely reached, which its later iterations no longer have. Same
    seed, same iterations, same widenings: a resumed fit repeats them."""

    EVERY = 10
    LAST_SHARE = 0.5  # at the end: a count whose draws went this share of the way to an edge

    def __init__(self, plans: list, compiled, steppers: list):
        self.plans, self.compiled, self.steppers = plans, compiled, steppers
        self.watched = [p for p in plans if p.kind == "nested"]
        self.low = [None] * len(self.watched)
        self.high = [None] * len(self.watched)
        self.widened: dict = {}

    def look(self, iteration: int) -> dict:
        """Note the chains' current counts; on every ``EVERY``-th iteration widen as above.
        Returns the counts widened now (name -> (leaf, cell) pairs), empty if none."""
        now: dict = {}
        if not self.watched:
            return now
        for i, plan in enumerate(self.watched):
            sl = self.compiled.latent_slices[plan.latent_name]
            for s in self.steppers:
                x = s.state.counts[sl].reshape(plan.pilot.shape)
                if self.low[i] is None:
                    self.low[i], self.high[i] = x.copy(), x.copy()
                np.minimum(self.low[i], x, out=self.low[i])
                np.maximum(self.high[i], x, out=self.high[i])
        if iteration % self.EVERY:
            return now
        return self._widen(0.0)

    def last_look(self) -> dict:
        """At the end of the estimate, widen also the counts whose draws went more than
        ``LAST_SHARE`` of the way from the pilot to an open edge of their box (the draws given
        the estimate, several times as many, reach further into a heavy tail). Returns the
        counts widened (name -> (leaf, cell) pairs). The steppers are not told: their chains
        have ended."""
        if not self.watched or self.low[0] is None:
            return {}
        return self._widen(self.LAST_SHARE, tell=False)

    def _widen(self, share: float, tell: bool = True) -> dict:
        now: dict = {}
        for i, plan in enumerate(self.watched):
            _, gap = box_gaps(plan.window.gibbs, np.stack([self.low[i], self.high[i]]))
            near = plan.counts_near_edges(gap, share)
            if near.size:
                plan.widen_counts(near)
                now[plan.latent_name] = near.tolist()
                self.widened.setdefault(plan.latent_name, []).extend(now[plan.latent_name])
        if now and tell:
            blocks = [count_block(plan, self.compiled) for plan in self.plans]
            for s in self.steppers:
                s.use_blocks(blocks)
        return now


def _counts_per_sweep(counts_per_sweep: int | None, nuts_per_sweep: int) -> int:
    return min(COUNTS_PER_SWEEP, nuts_per_sweep) if counts_per_sweep is None else counts_per_sweep


def settings(sample_kwargs: dict) -> dict:
    """The sampler settings a fit with ``sample_kwargs`` (:data:`OPTIONS`) runs with: the
    given ones over :func:`run`'s defaults."""
    defaults = {name: p.default for name, p in inspect.signature(run).parameters.items() if name in OPTIONS}
    out = defaults | sample_kwargs
    out["counts_per_sweep"] = _counts_per_sweep(out["counts_per_sweep"], out["nuts_per_sweep"])
    out.pop("reserve_per_draw")  # when the chains stop, not what they draw (a resume may differ)
    return out


def count_block(plan, compiled):
    """The count block of a plan: its window's tables (a nested plan: its boxes) and the prior's."""
    offset = compiled.latent_slices[plan.latent_name].start
    if plan.kind == "nested":
        mixing = None
        if plan.mixing_tables is not None:
            mixing = (compiled.group_mixing[plan.latent_name].address, plan.mixing_tables, plan.mixing_areas,
                      plan.mixing_groups, plan.mixing_parents)
        return NestedCounts(plan.latent_name, offset, plan.window.gibbs, compiled.prior_tables[plan.latent_name],
                            mixing)
    tables = CellTables.build(plan.mechanism, plan.release_value, plan.support,
                              plan.window.half_width,
                              log_eta=None if plan.exact_tails else plan.window.log_eta)
    prior = compiled.prior_tables[plan.latent_name]
    if plan.kind == "totals":
        return GroupTotals(plan.latent_name, offset, tables, prior, plan.group_codes, plan.targets)
    return IndependentCells(plan.latent_name, offset, tables, prior)


def plan_report(plan, idata, block, tol: float) -> tuple[dict, float | None]:
    """(the plan's report entry, the largest neglected-mass bound if it exceeds tol, else None;
    infinite when cells were held too often: :func:`held_too_often`, or, for a nested plan,
    when a draw after tuning reached an edge of its box: :func:`_nested_report`)."""
    if plan.kind == "nested":
        return _nested_report(plan, idata, block)
    stats = idata.sample_stats
    held = stats[block.stat_names[1]].values
    entry = window_entry(plan, METHODS[plan.kind], 0.0, tol)
    entry.update(exact_tails=plan.exact_tails, held_cells_after_tuning=int(held.sum()),
                 draws_with_held_cells=int(np.count_nonzero(held)))
    if plan.kind == "totals":
        entry.update(mean_tries_per_sweep=float(stats[block.stat_names[0]].values.mean()),
                     blocks_kept_after_tuning=int(stats[block.stat_names[2]].values.sum()))
    if held_too_often(held):
        return entry, math.inf
    if plan.exact_tails:
        return entry, None
    bound = float(np.max(stats[block.stat_names[0]].values))
    entry["max_relative_error_bound"] = bound
    return entry, (None if bound <= tol else bound)


def _nested_report(plan, idata, block) -> tuple[dict, float | None]:
    """A nested plan's entry. Its boxes are a truncation: a count on a box edge the support
    does not make, after tuning, means the posterior reaches the box, so the fit is redone with
    wider boxes (bound inf), and so is a fit where moves had no mass. Trimmed message edges
    reached are reported (and warned of).

    Box edges are seen two ways: the kernel counts a count that a move puts on an edge
    (``box_edges_hit_after_tuning``), and the stored draws are checked
    (``stored_draws_on_box_edges``), because a count pushed against an edge stays there by
    moves of 0, which the kernel does not count again. The entry then names the counts
    involved, with their boxes, draws and measurements
    (:meth:`~dpinfer.inference.planning.nested.NestedPlan.describe_count`; at most 10 in
    ``cells_at_box_edges``, their (leaf, cell) in ``cells_at_box_edges_index``): those on an
    edge in the stored draws or, when none is (an edge reached and left between two stored
    draws: a sweep makes many moves and ``counts_per_sweep`` sweeps run per stored draw), those
    that came nearest one. ``counts_near_box_edges`` lists every count whose stored draws
    reached its box's edge or came within its pilot sd of one, the counts a widening widens
    alone (:meth:`~dpinfer.inference.planning.nested.NestedPlan.counts_near_edges`; absent when
    no stored draw came so near: the whole latent is widened). With moves without mass (the law of a move, trimmed ``trim`` nats
    below its peak, is zero at every value the equalities and bounds allow), ``exact_terms``
    lists the release's equalities and bounds
    (:meth:`~dpinfer.inference.planning.nested.NestedPlan.exact_terms_evidence`)."""
    trimmed, edges, empty = (int(idata.sample_stats[name].values.sum()) for name in block.stat_names)
    g = plan.window.gibbs
    draws = idata.posterior[plan.latent_name].values.reshape(-1, *g.box_lo.shape)
    stored, nearest = box_gaps(g, draws)
    entry = window_entry(plan, METHODS["nested"], 0.0, math.inf)
    entry.update(box_half_width_sds=plan.window.half_width, box_edges_hit_after_tuning=edges,
                 stored_draws_on_box_edges=stored, trimmed_edges_hit_after_tuning=trimmed,
                 moves_without_mass_after_tuning=empty)
    if plan.mixing_tables is not None:
        G, C = plan.mixing_tables.shape
        entry["group_rates_summed_out"] = (f"GroupedNegativeBinomial: the gamma rates of the {G} x {C} (group, cell) pairs "
                                           "summed out, a factor on each group's sum in the sum-tree draws")
    if edges or stored:
        order = np.argsort(nearest, axis=None, kind="stable")[:10]
        if stored:
            order = order[nearest.reshape(-1)[order] == 0]
        index = [[int(k) for k in np.unravel_index(i, nearest.shape)] for i in order]
        entry["cells_at_box_edges"] = [plan.describe_count(leaf, cell, draws) for leaf, cell in index]
        entry["cells_at_box_edges_index"] = index
        near = plan.counts_near_edges(nearest)
        if near.size:
            entry["counts_near_box_edges"] = near.tolist()
    if empty:
        entry["exact_terms"] = plan.exact_terms_evidence()
    if trimmed:
        import warnings

        warnings.warn(f"{plan.latent_name}: {trimmed} nested-sum draws after tuning landed on an edge "
                      f"of a message trimmed at {plan.window.gibbs.trim:g} nats: the rest of the tree pulls "
                      "some area sums far from their own evidence; check the model", RuntimeWarning,
                      stacklevel=2)
    return entry, (math.inf if edges or stored or empty else None)


def edge_watch(plans, blocks, compiled):
    """:func:`~dpinfer.inference.engines.compiled.chains.run_chains`'s ``stop_when`` for the
    nested plans (None without one): the draws stored since the last look are checked as
    :func:`_nested_report` will check them, a count on an open edge of its box or a move the
    kernel counted on an edge or without mass, and the first such draw stops the chains (the
    fit fails, its boxes are widened and it runs again, with the time a run to the end would
    have spent). A heavy-tailed count that reaches its box early in the draws no longer costs
    the whole time box."""
    from dpinfer.inference.engines.compiled.chains import stat_columns

    watched = [(plan, block) for plan, block in zip(plans, blocks) if plan.kind == "nested"]
    if not watched:
        return None
    names = stat_columns(blocks)[0]
    columns = [names.index(block.stat_names[i]) for _, block in watched for i in (1, 2)]
    slices = [compiled.latent_slices[plan.latent_name] for plan, _ in watched]
    checked = [0]

    def stop_when(states, kept):
        first, checked[0] = checked[0], max(checked[0], kept)
        if kept <= first:
            return None
        if any(np.any(s.draws_stats[first:kept, columns] > 0) for s in states):
            return "a count's move reached an edge of its box (or had no mass): its box is widened"
        for (plan, _), sl in zip(watched, slices):
            g = plan.window.gibbs
            for s in states:
                stored, _ = box_gaps(g, s.draws_counts[first:kept, sl].reshape(-1, *g.box_lo.shape))
                if stored:
                    return f"a stored draw of {plan.latent_name!r} is on an edge of its box: its box is widened"
        return None

    return stop_when


def box_gaps(g, draws: np.ndarray, chunk_bytes: float = 5e7) -> tuple[int, np.ndarray]:
    """(how many stored draws have a count on an open edge of its box, each count's smallest
    distance to an open edge over the draws: inf where its box has none) for ``draws``
    (draws, leaves, cells) in boxes ``g`` (a box of one value, a structural zero, has no edge
    to reach), ``chunk_bytes`` of float distances at a time (a state's draws are not copied
    whole)."""
    lo = np.where(g.lo_open & (g.box_hi > g.box_lo), g.box_lo, -np.inf)
    hi = np.where(g.hi_open & (g.box_hi > g.box_lo), g.box_hi, np.inf)
    stored, nearest = 0, np.full(g.box_lo.shape, np.inf)
    step = max(1, int(chunk_bytes // (8 * max(g.box_lo.size, 1))))
    for d0 in range(0, draws.shape[0], step):
        part = draws[d0:d0 + step]
        gap = np.minimum(part - lo, hi - part)
        stored += int(np.count_nonzero(np.any(gap == 0, axis=(1, 2))))
        np.minimum(nearest, gap.min(axis=0), out=nearest)
    return stored, nearest


def held_too_often(held) -> bool:
    """True if some chain (rows of ``held``, the held cells per stored draw) held cells in
    more than ``STUCK_SHARE`` of its draws. The hold rule of the exact draws
    (:mod:`~dpinfer.inference.engines.compiled.exact_counts`) leaves p(x | theta) invariant,
    but where the posterior puts a cell far outside its window (a release far from anything
    the prior allows) the cell is held at every sweep and never leaves its start: the chain is
    not ergodic. ``dpinfer.sample`` then widens the windows and fits again."""
    held = np.asarray(held).reshape(-1, np.shape(held)[-1])
    return bool(np.any(np.mean(held > 0, axis=1) > STUCK_SHARE))


def _fit(model, compiled, blocks, initial_counts: dict, *, draws: int, tune: int, chains: int,
         cores: int, rng: np.random.Generator, progressbar: bool, max_tree_depth: int,
         target_accept: float, initvals: dict | None, nuts_per_sweep: int,
         counts_per_sweep: int, checkpoint=None, held=None, more=None, spread=None, start=None, deadline=None,
         reserve_per_draw: float = 0.0, mode_start: list | None = None, stop_when=None):
    """Run the chains and return the DataTree. ``initial_counts`` maps each latent to a start
    on its fibre; the parameters start at PyMC's jittered initial point, or at ``initvals``
    where given (constrained values by variable name, one dict for every chain or a list of
    one per chain, as for ``pm.sample``). ``checkpoint``
    ``held`` and ``start``: as :func:`run`'s (every chain at the estimate's parameters and its
    own counts from the estimate), ``mode_start``: as :func:`run`'s."""
    counts0 = compiled.counts_vector(initial_counts)
    start_seeds, streams = chain_seeds(rng, chains)
    starts = [(compiled.initial_q(seed, model, values), counts0)
              for seed, values in zip(start_seeds, per_chain(initvals, chains))]
    begin = held if held is not None else start
    found = metric = None
    moving = None
    if begin is not None:  # each chain at the estimate and (where some are drawn) its own parameters
        starts = [(begin.points[c % len(begin.points)], begin.counts[c % len(begin.counts)]) for c in range(chains)]
        if held is not None and held.drawn.any():  # NUTS on the drawn ones, their metric from the estimate's
            moving, metric = held.drawn, held.inv_mass
    elif mode_start is not None:
        qs, found, metric = mode_starts(compiled, starts[0][0], mode_start, start_seeds)
        starts = [(q, counts0) for q in qs]
    if checkpoint is not None:
        checkpoint = checkpoint(model_hash(compiled.key, compiled.data.values, counts0))
    start = time.perf_counter()
    results = run_chains(compiled, blocks, chains=chains, cores=cores, tune=tune, draws=draws,
                         seeds=streams, starts=starts, progressbar=progressbar,
                         max_tree_depth=max_tree_depth, target_accept=target_accept,
                         nuts_per_sweep=nuts_per_sweep, counts_per_sweep=counts_per_sweep,
                         checkpoint=checkpoint, more=more, spread=spread, count_dtype=count_dtype(blocks),
                         deadline=deadline, reserve_per_draw=reserve_per_draw, inv_mass0=metric,
                         moving=moving, adapt_metric=moving is None, stop_when=stop_when)
    seconds = time.perf_counter() - start
    if checkpoint is not None:
        seconds = max(seconds, max(r.seconds for r in results))  # a resumed fit: its chains' whole time
    scores = (hyperparameter_scores(compiled, results, ~held.drawn)
              if held is not None and spread is None else None)
    idata = datatree(model, compiled, results, tune=tune, seconds=seconds,
                     max_tree_depth=max_tree_depth, nuts_per_sweep=nuts_per_sweep,
                     counts_per_sweep=counts_per_sweep)
    if scores is not None:
        idata["sample_stats"] = idata.sample_stats.to_dataset().assign(
            hyperparameter_score=(("chain", "draw", "hyperparameter"), scores))
    if found is not None:
        idata.posterior.attrs["dpinfer_start"] = json.dumps(found | {"held": list(mode_start)})
    return idata


def per_chain(initvals, chains: int) -> list:
    """``initvals`` as one entry per chain: a dict (or None) for every chain, or a list of
    ``chains`` dicts (as ``pm.sample`` takes them); anything else is refused."""
    if isinstance(initvals, (list, tuple)):
        if len(initvals) != chains or not all(isinstance(v, dict) for v in initvals):
            raise ValueError(f"initvals must be one dict for every chain or a list of {chains} dicts (one per "
                             f"chain), got a {type(initvals).__name__} of {len(initvals)}")
        return list(initvals)
    if initvals is not None and not isinstance(initvals, dict):
        raise ValueError(f"initvals must be one dict for every chain or a list of {chains} dicts (one per chain), "
                         f"got {type(initvals).__name__}")
    return [initvals] * chains


def count_dtype(blocks):
    """The stored counts' dtype: int32 where every block is nested and its boxes end below
    2^31 (the counts cannot leave them), else int64 (windows with exact tails bound nothing;
    a model without counts stores none, and int64 saves its sampler a compile of its own:
    the kernel is specialised on this dtype)."""
    bounded = bool(blocks) and all(b.kind == "nested" for b in blocks) and all(
        int(b.gibbs.box_hi.max(initial=0)) < np.iinfo(np.int32).max for b in blocks)
    return np.int32 if bounded else np.int64


def chain_seeds(rng: np.random.Generator, chains: int) -> tuple[list, list]:
    """What a fit takes from ``rng``: each chain's seed for its jittered start, and each
    chain's generator for its random stream (one place, so that a resumed fit replaying an
    earlier widening takes the same)."""
    return [int(rng.integers(2**31)) for _ in range(chains)], rng.spawn(chains)


def datatree(model, compiled, results, *, tune: int, seconds: float,
              max_tree_depth: int, nuts_per_sweep: int, counts_per_sweep: int) -> xr.DataTree:
    chains, draws = len(results), results[0].q.shape[0]
    q = np.stack([r.q for r in results]).reshape(chains * draws, compiled.n)
    counts = np.empty((chains, draws, results[0].counts.shape[1]), results[0].counts.dtype)
    for c, r in enumerate(results):  # a chain at a time, each released once copied (peak memory)
        counts[c], r.counts = r.counts, None
    counts = counts.reshape(chains * draws, -1)
    values = compiled.expand(q, counts)
    for name in compiled.latents:
        values[name] = counts[:, compiled.latent_slices[name]].reshape(
            (chains * draws, *compiled.latent_shapes[name]))
    coords = {"chain": np.arange(chains), "draw": np.arange(draws)}
    posterior = {}
    for name, value in values.items():
        value = np.asarray(value).reshape((chains, draws, *np.shape(value)[1:]))
        dims = list(model.named_vars_to_dims.get(name) or
                    [f"{name}_dim_{i}" for i in range(value.ndim - 2)])
        for dim in dims:
            if model.coords.get(dim) is not None:
                coords[dim] = np.asarray(model.coords[dim])
        posterior[name] = (("chain", "draw", *dims), value)
    stats = {}
    for name in results[0].stats:
        value = np.stack([r.stats[name] for r in results])
        if name in ("diverging",):
            value = value.astype(bool)
        elif name in ("tree_depth", "n_steps"):
            value = value.astype(np.int64)
        stats[name] = (("chain", "draw"), value)
    if "tree_depth" in stats:
        stats["reached_max_treedepth"] = (("chain", "draw"), stats["tree_depth"][1] >= max_tree_depth)
    attrs = {"sampling_time": seconds, "tuning_steps": tune, "inference_library": "dpinfer",
             "nuts_per_sweep": nuts_per_sweep, "counts_per_sweep": counts_per_sweep}
    if results[0].stopped:  # stop_when ended the draws early (the fit fails and runs again)
        attrs["stopped_early"] = results[0].stopped
    if any(r.resumed_at for r in results):  # continued from a checkpoint: iterations done there, per chain
        attrs["resumed_at_iterations"] = json.dumps([r.resumed_at for r in results])
    return xr.DataTree.from_dict({
        "posterior": xr.Dataset(posterior, coords=coords, attrs=attrs),
        "sample_stats": xr.Dataset(stats, coords={"chain": coords["chain"], "draw": coords["draw"]},
                                   attrs=attrs),
    })
