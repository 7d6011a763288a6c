"""``dpinfer.sample``: posterior sampling for models whose latent true values are privatised.

One pipeline, for the releases recorded by ``Mechanism.observe``:

1. **plan** (:mod:`dpinfer.inference.planning`): latents summed out in closed form, one plan
   per latent count vector (independent cells, cells on group totals, cells with further
   children, cells on a fibre), and the releases of continuous latents (no plan: NUTS);
2. **engine** (:mod:`dpinfer.inference.engines`), one per fit, chosen from the plans and
   ``method``: the compiled exact Gibbs engine (``"auto"``) where every count plan is cells
   or totals and every other free variable is continuous, with latents summed out in closed
   form when there are no latent counts; nutpie (``method="nutpie"``) for models without
   latent counts; else the PyMC engine, which also runs every plan (``"marginal"``,
   ``"fibre"``). Why an engine was not taken is recorded;
3. **sample**: each plan's first window (exact tails on the compiled engine, a window proven
   to within ``tol`` otherwise), the engine's fit, every bound checked against ``tol`` on
   every draw, and the windows of a latent that missed it widened and the model fitted
   again; latents summed out in closed form are drawn exactly given each posterior draw;
4. **report**: ``idata.posterior.attrs["dpinfer"]`` (JSON) records per latent the engine and
   why, the method, the window, the bounds reached and the widenings made;
   ``idata.posterior.attrs["dpinfer_convergence"]`` the largest R-hat and smallest bulk and tail ESS
   over the parameters and the counts, also printed as one line at the end of the fit (and a
   ``ConvergenceWarning`` when they miss R-hat <= 1.01 or ESS >= 400:
   :mod:`dpinfer.inference.convergence`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pymc as pm
import xarray as xr

from dpinfer._blas import blas_threads_for
from dpinfer._graphs import evaluate
from dpinfer._validation import check_count, check_flag, check_path, check_probability, check_seed
from dpinfer.inference import checkpoint as checkpoints
from dpinfer.inference import convergence, failures, planning, recovery
from dpinfer.inference.engines import closed_form
from dpinfer.inference.engines import nutpie as nutpie_engine
from dpinfer.inference.engines.compiled import engine as compiled_engine
from dpinfer.inference.engines.compiled import cache as compiled_cache
from dpinfer.inference.engines.compiled.cache import describe
from dpinfer.inference.engines.compiled.chains import NUTS_PER_SWEEP, TimeUpError
from dpinfer.inference.engines.pymc import engine as pymc_engine
from dpinfer.inference.latents import NotMarginalisableError
from dpinfer.mechanisms.records import releases_of

MAX_WIDENINGS = 4
EDGES_SHOWN = 3  # counts on box edges named in a widening's warning, of each latent
ESTIMATE_NAMES_SHOWN = 5  # parameters over the tolerance named in an unsettled estimate's line
METHODS = ("auto", "marginal", "fibre", "nutpie")
INFERENCES = ("full-bayes", "empirical-bayes", "auto")
UNCERTAINTIES = ("none", "normal")
EMPIRICAL_BAYES = {"uncertainty": "none", "every": 5, "burn": 5, "tune": 20, "drawn": []}  # empirical_bayes= defaults
ESTIMATE_KEYS = ("burn_in", "max_iterations", "tolerance", "copies")  # empirical_bayes.estimate's
EMPIRICAL_BAYES_KEYS = (*ESTIMATE_KEYS, *EMPIRICAL_BAYES)
ESTIMATE_SHARE = 0.25  # of the time left under max_minutes, at most, for the empirical-Bayes estimate
TIMED_MAX_ITERATIONS = 10_000  # the estimate's max_iterations under max_minutes (its time box bounds it)
CONTINUOUS_METHOD = ("NUTS on the continuous latent with the release observed (its exact "
                     "likelihood; nothing to marginalise)")


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
    checkpoint=None,
    checkpoint_every: int = 100,
    resume=None,
    inference: str = "full-bayes",
    empirical_bayes: dict | None = None,
    max_minutes: float | None = None,
    records: str = "auto",
    **sample_kwargs,
):
    """Sample the posterior of a model with privatised releases of latent counts, of
    continuous latent statistics (a mean, a sum) or of statistics of latent records (a
    regression's sufficient statistics), released by continuous mechanisms (report entries
    under the release's name).

    Parameters
    ----------
    draws, tune, chains, cores, random_seed, progressbar
        As in ``pm.sample`` (NUTS runs on the continuous parameters; the engines run the
        chains on ``cores`` cores, by default all).
    tol
        Bound on the relative error of a windowed likelihood, checked on every posterior draw:
        sum_i log1p(eta_i / L_i(theta)) <= tol (inference notes §1). The compiled engine's
        draws of additive noise releases are exact beyond their windows and need no bound.
    log_likelihood
        Also compute the per-cell marginal log-likelihood of each release (for LOO/WAIC).
    checkpoint, checkpoint_every
        A new (or empty) directory where the compiled engine saves each chain's state every
        ``checkpoint_every`` iterations, when a chain ends and when the fit is interrupted
        (Ctrl-C stops the chains after their running iterations, saves them and raises
        :class:`~dpinfer.inference.checkpoint.Interrupted`; a killed process leaves the last
        periodic checkpoint). Data only (netCDF and JSON), readable by its owner only: it
        holds draws of the confidential counts (:mod:`dpinfer.inference.checkpoint`).
    resume
        A checkpoint directory to continue from (and to keep saving to): the fit must be the
        same (model, data, releases, draws, tune, chains, sampler settings, dpinfer and
        library versions; ``random_seed`` the same or None) or it is refused saying what
        differs. The resumed fit's draws equal those of the fit run without interruption.
    method
        ``"auto"``: the compiled engine where the model allows it (module docstring), else
        the PyMC engine (counts summed out where they are a release's only child, exact
        convolution for group totals, fibre moves for other invariants and linear queries,
        windowed Gibbs for counts with other children). ``"nutpie"``: nutpie's NUTS for a
        model without latent counts. ``"marginal"``: the PyMC engine with counts summed out
        wherever possible. ``"fibre"``: the PyMC engine with fibre moves wherever there are
        invariants or queries (e.g. to compare the samplers).
    inference
        ``"full-bayes"`` (the default): every parameter sampled with the counts.
        ``"empirical-bayes"`` (compiled engine, models with latent counts): the continuous
        parameters first set to the mode of their marginal posterior, the counts summed out
        (a stochastic-approximation EM with the engine's exact count draws,
        :mod:`dpinfer.inference.empirical_bayes`), then held there while the counts are drawn
        given them: an approximation that ignores the parameters' uncertainty, named in the
        report, with the estimate, its Monte Carlo error and approximate posterior sds in
        ``posterior.attrs["dpinfer_empirical_bayes"]``; the convergence verdict is the
        counts'. Each stored draw is ``counts_per_sweep`` (1) draws of the counts, after
        ``empirical_bayes["tune"]`` (20) burn-in iterations (not ``tune``: the counts start from
        the estimate's, already drawn given it). ``"auto"`` (needs ``max_minutes``): the estimate
        first, then full Bayes started from it if it is predicted to converge in the time left
        (:func:`~dpinfer.inference.engines.compiled.engine.full_bayes_seconds`), else empirical
        Bayes; ``posterior.attrs["dpinfer_inference"]`` says which ran and why.
    records
        How a release of a record-additive statistic of latent records
        (``dpinfer.regression_statistic``, ``dpinfer.power_sums``) is fitted
        (:mod:`dpinfer.inference.planning.record_sums`): ``"data-augmentation"`` (the records
        sampled with the parameters: exact, cost growing faster than n),
        ``"law-of-the-sum"`` (the records replaced by the normal law of their sum with exact
        moments: an approximation whose cost does not depend on n, its measured error in the
        report; refused, saying why, where the records' model is not one it takes), or
        ``"auto"`` (the default: the law of the sum from
        :data:`~dpinfer.inference.planning.record_sums.CROSSOVER_RECORDS` records where it
        applies). The report (``posterior.attrs["dpinfer"]``) names the method used.
    max_minutes
        Compiled engine: the fit's time. While the draws miss the convergence targets (R-hat
        <= 1.01, bulk and tail ESS >= 400 over what the verdict judges), **sample on**: every
        chain continues with more draws (about what the shortfall needs, at least twice as
        many while R-hat misses); the chains stop in time for the work on their draws (the
        verdict, and ``reserve_per_draw`` below) to end this many minutes after the call, with
        the draws every chain has made by then (fewer than ``draws`` if time ran out first: the
        verdict judges what there is). None (the default): ``draws`` draws, however long.
    empirical_bayes
        Settings of the estimate (``burn_in``, ``max_iterations``, ``tolerance``, ``copies``:
        :func:`dpinfer.inference.empirical_bayes.estimate`; with ``max_minutes`` the estimate
        stops when settled or at a quarter of the time left, ``max_iterations`` 10,000 unless
        given) and of what follows it:
        ``tune`` (the counts' burn-in, above), ``uncertainty`` ``"none"`` (the default: the
        parameters held at the estimate) or
        ``"normal"`` (drawn afresh every ``every`` (5) stored draws from the normal law of the
        estimate and its approximate posterior sds, each draw followed by ``burn`` (5) count
        draws: the parameters' uncertainty propagated to the counts, approximately), and
        ``drawn`` (a name or a list of names of continuous parameters; default none): parameters
        drawn with the counts, by NUTS, instead of estimated, in the estimate's E-steps (summed
        out with the counts) and in the draws given it, e.g. per-area effects that are not
        hyperparameters (:mod:`dpinfer.inference.empirical_bayes`); the verdict then judges them
        with the counts.
    sample_kwargs
        Passed to ``pm.sample`` (PyMC engine); nutpie takes ``target_accept`` and
        ``max_treedepth``; the compiled engine takes ``initvals`` (one dict for every chain or a
        list of one per chain, constrained values by name), ``target_accept`` (0.8) and
        ``max_treedepth`` (10), as PyMC's NUTS, and ``nuts_per_sweep`` (3) and
        ``counts_per_sweep`` (2, at most ``nuts_per_sweep``): NUTS transitions of the
        parameters and exact draws of the counts per stored draw, which alternate
        (:mod:`dpinfer.inference.engines.compiled.chains`), and ``reserve_per_draw`` (0):
        with ``max_minutes``, seconds per draw (of every chain) kept back from it for the
        caller's work on the draws afterwards (the fit keeps back what its own verdict will
        take, measured on this machine: :func:`~dpinfer.inference.convergence.seconds_per_value`).

    Returns
    -------
    xarray.DataTree with the parameters and the draws of the latent counts in ``posterior``
    and the samplers' statistics in ``sample_stats``; ``posterior.attrs["dpinfer"]`` and
    ``["dpinfer_convergence"]`` are the report of step 4 of the module docstring.
    """
    tol = check_probability(tol, "tol")
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    deadline = None
    if max_minutes is not None:
        if isinstance(max_minutes, bool) or not isinstance(max_minutes, (int, float)) or not (
                math.isfinite(max_minutes) and max_minutes >= 0):
            raise ValueError(f"max_minutes must be a finite number of minutes >= 0, got {max_minutes!r}")
        deadline = time.monotonic() + 60.0 * max_minutes
    if not isinstance(inference, str) or inference not in INFERENCES:
        raise ValueError(f"inference must be one of {INFERENCES}, got {inference!r}")
    if empirical_bayes is not None and (inference == "full-bayes" or not isinstance(empirical_bayes, dict)):
        raise TypeError(f"empirical_bayes takes a dict of settings {EMPIRICAL_BAYES_KEYS} and inference="
                        f"'empirical-bayes' or 'auto'; got {empirical_bayes!r} with inference={inference!r}")
    empirical_bayes = _empirical_bayes_settings(empirical_bayes or {})
    draws, tune, chains = (check_count(name, value, least)
                           for name, value, least in (("draws", draws, 1), ("tune", tune, 0), ("chains", chains, 1)))
    progressbar, log_likelihood = check_flag("progressbar", progressbar), check_flag("log_likelihood", log_likelihood)
    checkpoint, resume = check_path("checkpoint", checkpoint), check_path("resume", resume)
    checkpoint_every = check_count("checkpoint_every", checkpoint_every, 1)
    model = pm.modelcontext(model)
    releases = releases_of(model)
    if not releases:
        raise ValueError("the model has no release registered with Mechanism.observe(...); use pm.sample")
    seed = _seed_sequence(random_seed, resume)
    rng = np.random.default_rng(seed)
    cores = min(chains, check_count("cores", cores, 1) if cores is not None else (os.cpu_count() or 1))

    plan = planning.plan_model(model, releases, method=method, record_method=records)  # 1. plan
    with compiled_cache.notices(progressbar):
        engine, fitted, compiled, reason = _engine(model, plan, method, sample_kwargs)  # 2. engine
    if inference == "auto" and deadline is None:
        raise ValueError("inference='auto' chooses full Bayes where it is predicted to converge within "
                         "max_minutes: give max_minutes")
    if "reserve_per_draw" in sample_kwargs and deadline is None:
        raise ValueError("reserve_per_draw keeps time back from max_minutes for the work after sampling: "
                         "give max_minutes")
    if inference in ("empirical-bayes", "auto"):
        _check_empirical_bayes(engine, plan, compiled, reason)
        empirical_bayes["drawn"] = _drawn_values(model, plan, empirical_bayes["drawn"])
    if deadline is not None and engine != "compiled":
        raise ValueError(f"max_minutes (sampling on until converged) needs the compiled engine; this model is "
                         f"fitted by the {engine} engine ({reason or 'method= chose it'})")
    options = dict(draws=draws, tune=tune, chains=chains, cores=cores, rng=rng, tol=tol,
                   progressbar=progressbar,
                   checkpoint=_fit_checkpoint(engine, checkpoint, checkpoint_every, resume, seed, sample_kwargs,
                                              draws=draws, tune=tune, chains=chains, tol=tol, inference=inference,
                                              empirical_bayes=empirical_bayes))
    with blas_threads_for(cores):  # the chains run side by side in threads: one BLAS thread each (dpinfer._blas)
        if engine == "nutpie":  # 3. sample
            idata = nutpie_engine.run(fitted, compiled, seed=int(rng.integers(2**31)), **_without(
                options, "rng", "tol", "checkpoint"), **sample_kwargs)
            recovery.record(idata, [])
            report, widenings, fit = {}, 0, None
        else:
            sample_kwargs, mode_start = _naive_start(model, fitted, plan, engine, sample_kwargs)
            with compiled_cache.notices(progressbar):
                idata, report, widenings, fit = _sample_counts(model, fitted, plan, engine, compiled,
                                                                sample_kwargs, inference=inference,
                                                                empirical_bayes=empirical_bayes,
                                                                deadline=deadline, mode_start=mode_start, **options)
    summed = plan.summed if fitted is not model else []
    if log_likelihood:  # per-cell marginal log-likelihoods, on windows proven to within tol
        ll_model = fitted if summed else marginal_model(model, tol) if engine == "compiled" else fit.model
        with ll_model:
            pm.compute_log_likelihood(idata, progressbar=progressbar)
    if summed:
        _add_latents(model, idata, closed_form.draw_latents(model, summed, idata.posterior, rng))
    for item in summed:  # 4. report
        report[item.record.name] = {"release": item.record.name,
                                    "mechanism": repr(item.record.mechanism), "method": item.method}
        if not item.draws_latent:
            report[item.record.name]["approximation_error"] = item.measured_error(idata.posterior, rng)
            report[item.record.name]["start"] = _start_entry(idata.posterior.attrs.get("dpinfer_start"))
    for record in plan.continuous:
        report.setdefault(record.name, {"release": record.name, "mechanism": repr(record.mechanism),
                                        "method": CONTINUOUS_METHOD})
        if record.name in plan.augmented:
            report[record.name]["records"] = plan.augmented[record.name]
    for entry in report.values():
        entry.update(engine=engine, widenings=widenings)
        if reason is not None:
            entry["engine_reason"] = reason
    idata.posterior.attrs["dpinfer"] = json.dumps(report)
    used = json.loads(idata.posterior.attrs.get("dpinfer_inference", "{}")).get("inference", inference)
    drawn = {rv.name for rv in model.free_RVs if model.rvs_to_values[rv].name in empirical_bayes["drawn"]}
    held = ({rv.name for rv in model.free_RVs} - {p.latent_name for p in plan.latents} - drawn
            if used == "empirical-bayes" else set())
    statistics = [name for s in summed if not s.draws_latent for name in s.nuisance_names]
    return _with_convergence(model, idata, progressbar, exclude=held, statistics=statistics)


def _seed_sequence(random_seed, resume) -> np.random.SeedSequence:
    """The fit's seed; resuming without ``random_seed``, the checkpointed fit's."""
    random_seed = check_seed(random_seed)
    if resume is not None and random_seed is None:
        return np.random.SeedSequence(int(checkpoints.read_identity(resume)["entropy"]))
    return np.random.SeedSequence(random_seed)


def _fit_checkpoint(engine: str, checkpoint, every, resume, seed, sample_kwargs: dict, **settings):
    """The fit's :class:`~dpinfer.inference.checkpoint.FitCheckpoint`, or None without one."""
    if checkpoint is None and resume is None:
        return None
    if checkpoint is not None and resume is not None and Path(checkpoint) != Path(resume):
        raise ValueError(f"give checkpoint= or resume=, not both (resume={str(resume)!r} keeps saving there)")
    if engine != "compiled":
        raise ValueError(f"checkpoint= and resume= need the compiled engine; this model is fitted by "
                         f"the {engine} engine (posterior.attrs['dpinfer'] says why)")
    options = compiled_engine.settings(sample_kwargs)
    if options["initvals"] is not None:
        options["initvals"] = hashlib.sha256(repr(describe(options["initvals"])).encode()).hexdigest()
    return checkpoints.FitCheckpoint(resume if resume is not None else checkpoint, every=every,
                                     resume=resume is not None, settings=settings | options,
                                     entropy=seed.entropy)


def _engine(model, plan, method: str, sample_kwargs: dict):
    """(engine name, the model it fits, its compiled model or None, why the engines before it
    were not taken or None): step 2 of the module docstring. Latents are summed out in closed
    form for the NUTS engines when there are no latent counts; randomised-response tables
    must be."""
    summable = not plan.latents and method in ("auto", "nutpie")
    if plan.tables and not summable:
        raise NotMarginalisableError(
            f"randomised-response releases {sorted(t.record.name for t in plan.tables)} are fitted "
            "with their tables summed out, which needs a model without latent counts and "
            "method='auto' or 'nutpie'")
    fitted = closed_form.summed_out_model(model, plan.summed) if summable and plan.summed else model
    if method == "nutpie":
        refused = nutpie_engine.refusal(fitted, plan)
        if refused is not None:
            raise ValueError(f"method='nutpie' cannot fit this model: {refused}")
        _check_options(sample_kwargs, nutpie_engine.OPTIONS, "nutpie")
        return "nutpie", fitted, nutpie_engine.compiled_for(fitted), None
    reason = compiled_engine.refusal(fitted, plan.latents, method)
    if reason is None:
        compiled, reason = compiled_engine.compile_for(fitted, plan.latents)
        if compiled is not None:
            _check_options(sample_kwargs, compiled_engine.OPTIONS, "the compiled engine")
            if not plan.latents:  # only continuous latents: plain NUTS, one transition per draw
                sample_kwargs.setdefault("nuts_per_sweep", 1)
            return "compiled", fitted, compiled, None
    if fitted is not model:
        raise NotMarginalisableError(
            f"latents {sorted(s.latent_name for s in plan.summed)} are summed out in closed form for "
            f"the compiled engine, which cannot fit this model: {reason}")
    nested = sorted(p.latent_name for p in plan.latents if p.kind == "nested")
    if nested:
        raise ValueError(f"the counts {nested} behind nested measurements are drawn by the compiled "
                         f"engine only, which cannot fit this model: {reason}")
    return "pymc", model, None, reason


def _check_empirical_bayes(engine: str, plan, compiled, reason) -> None:
    """inference='empirical-bayes' needs the compiled engine, latent counts and parameters."""
    if engine != "compiled":
        raise ValueError(f"inference='empirical-bayes' needs the compiled engine; this model is fitted by the "
                         f"{engine} engine ({reason or 'method= chose it'})")
    if not plan.latents:
        raise ValueError("inference='empirical-bayes' estimates the parameters with the latent counts summed "
                         "out; this model has no latent counts behind a release: use full Bayes")
    if compiled.n == 0:
        raise ValueError("inference='empirical-bayes' needs continuous parameters to estimate; this model "
                         "has none (its counts' posterior is what full Bayes draws)")


def _drawn_values(model, plan, drawn: list) -> list:
    """``empirical_bayes["drawn"]`` (names of continuous free variables) as the compiled model's
    value variables, checked; it may not be every parameter (nothing would be estimated)."""
    latents = {p.latent_name for p in plan.latents}
    allowed = [rv.name for rv in model.free_RVs if rv.name not in latents]
    unknown = [name for name in drawn if name not in allowed]
    if unknown:
        raise ValueError(f"empirical_bayes['drawn'] names {unknown}, which are not continuous parameters of the "
                         f"model; it takes names among {allowed}")
    if drawn and set(drawn) == set(allowed):
        raise ValueError(f"empirical_bayes['drawn'] names every parameter ({allowed}): nothing is left to estimate; "
                         "draw them all with inference='full-bayes'")
    return [model.rvs_to_values[model[name]].name for name in drawn]


def _check_options(options: dict, allowed: tuple, engine: str) -> None:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"dpinfer.sample got {unknown}, which {engine} does not take (it takes "
                        f"{allowed}); pass method='marginal' to run PyMC's pm.sample with them")
    check_sampler_options(options)


def check_sampler_options(options: dict) -> None:
    """The values of the NUTS and sweep options given: ``target_accept`` a probability,
    ``max_treedepth``, ``nuts_per_sweep`` and ``counts_per_sweep`` whole numbers >= 1, and
    ``counts_per_sweep`` at most ``nuts_per_sweep``."""
    if "target_accept" in options:
        check_probability(options["target_accept"], "target_accept")
    for name in ("max_treedepth", "nuts_per_sweep", "counts_per_sweep"):
        value = options.get(name, 1)
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    reserve = options.get("reserve_per_draw", 0.0)
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not (np.isfinite(reserve) and reserve >= 0):
        raise ValueError(f"reserve_per_draw must be a finite number of seconds >= 0, got {reserve!r}")
    nuts = options.get("nuts_per_sweep", NUTS_PER_SWEEP)
    if options.get("counts_per_sweep", 1) > nuts:
        raise ValueError(f"counts_per_sweep must be at most nuts_per_sweep ({nuts}): each draw "
                         f"of the counts is followed by a NUTS transition; got "
                         f"{options['counts_per_sweep']!r}")


def _naive_start(model, fitted, plan, engine: str, sample_kwargs: dict) -> tuple[dict, list | None]:
    """(sample_kwargs, the variables held by the mode start or None): for releases fitted by
    the law of the sum on the compiled engine without the user's ``initvals``, the chains start
    around the mode (:mod:`~dpinfer.inference.engines.compiled.mode_start`), a true statistic T
    that is a free latent held at its release (the naive estimate) while the parameters find
    their mode given it."""
    items = [item for item in plan.summed if not item.draws_latent] if fitted is not model else []
    if engine != "compiled" or not items or sample_kwargs.get("initvals") is not None:
        return sample_kwargs, None
    kept = [item for item in items if item.keeps_statistic]
    initvals = {item.latent_name: evaluate(model.rvs_to_values[item.record.release_rv]) for item in kept}
    return sample_kwargs | {"initvals": initvals or None}, [item.latent_name for item in kept]


def _start_entry(found: str | None) -> str:
    """The report's account of where a law-of-the-sum fit's chains started."""
    if found is None:
        return "the user's initvals, or the engine's default start (no search for the mode: another engine)"
    found = json.loads(found)
    held = f"{', '.join(found['held'])} at the release (the naive estimate), " if found["held"] else ""
    if not found["used"]:
        return (f"PyMC's jittered initial point ({held}the search for the parameters' mode found no better "
                f"point in {found['iterations']} L-BFGS iterations)")
    return (f"{held}the parameters at overdispersed draws around their mode given it (L-BFGS, "
            f"{found['iterations']} iterations{'' if found['converged'] else ', NOT converged'}; log density "
            f"{found['log_density_at_start']:.6g} at PyMC's initial point, {found['log_density_at_mode']:.6g} "
            "at the mode)")


def _sample_counts(model, fitted, plan, engine: str, compiled, sample_kwargs: dict, *, draws,
                   tune, chains, cores, rng, tol, progressbar, checkpoint, inference, empirical_bayes,
                   deadline, mode_start=None):
    """The fit on the compiled or PyMC engine, widening windows that miss ``tol`` (step 3):
    (DataTree, report, widenings made, the PyMC engine's kept fit or None). Resuming, the
    widenings the checkpointed fit had made are replayed without refitting. Empirical Bayes:
    the parameters' estimate first, on the first windows (wider ones truncate the counts less;
    the estimate and its counts serve them too), then the counts given it."""
    plans = plan.latents
    planning.first_windows(plans, tol, exact_tails=engine == "compiled",
                           at_least={} if engine == "compiled" else pymc_engine.kept_widths(model))
    held = spread = start = None
    used, why = inference, "asked for"
    if inference in ("empirical-bayes", "auto"):
        held, used, why = _estimate_and_choose(fitted, compiled, plans, inference, empirical_bayes, sample_kwargs,
                                               chains=chains, cores=cores, tune=tune, rng=rng, deadline=deadline,
                                               progressbar=progressbar, checkpoint=checkpoint)
        if used == "full-bayes":
            held, start = None, held
        else:
            tune = empirical_bayes["tune"]  # the counts start from the estimate's, in equilibrium given it
            if empirical_bayes["uncertainty"] == "normal":
                spread = {"every": empirical_bayes["every"], "burn": empirical_bayes["burn"]}
    seeds = rng.integers(2**31, size=MAX_WIDENINGS + 1)
    replay, replay_counts = checkpoint.widenings_to_replay() if checkpoint is not None else ([], [])
    fit, recoveries = None, []
    estimate = held if held is not None else start
    widened = estimate.widened if estimate is not None else {}
    if widened:
        recovery.announce(recoveries, "windows widened", _estimate_widening_message(widened),
                          during="empirical-Bayes estimate",
                          counts_widened={name: len(c) for name, c in widened.items()})
    for attempt in range(MAX_WIDENINGS + 1):
        if attempt < len(replay):
            compiled_engine.chain_seeds(rng, chains)  # what the fit took from rng
            planning.widen(plans, replay[attempt], tol, replay_counts[attempt])
            recovery.announce(recoveries, "windows widened",
                              _widening_message(replay[attempt], counts=replay_counts[attempt]), warn=False,
                              bounds=recovery.bounds_of(replay[attempt]), replayed=True,
                              counts_widened={name: len(c) for name, c in replay_counts[attempt].items()})
            continue
        if engine == "compiled":
            try:
                idata, report, failed = compiled_engine.run(
                    fitted, compiled, plans, draws=draws, tune=tune, chains=chains, cores=cores,
                    rng=rng, tol=tol, progressbar=progressbar, checkpoint=checkpoint, held=held,
                    deadline=deadline, spread=spread, start=start, mode_start=mode_start, **sample_kwargs)
            except TimeUpError as err:
                if attempt == 0:
                    raise
                raise TimeUpError(_refit_out_of_time(failed, err, checkpoint)) from err
        else:
            idata, report, failed, fit = pymc_engine.run(
                model, plans, draws=draws, tune=tune, chains=chains, cores=cores,
                seed=int(seeds[attempt]), rng=rng, tol=tol, progressbar=progressbar,
                sample_kwargs=sample_kwargs)
        resumed_at = idata["sample_stats"].attrs.get("resumed_at_iterations") if "sample_stats" in idata.children \
            else None
        if resumed_at is not None:  # this attempt's chains continued from the checkpoint
            recovery.announce(recoveries, "resumed", f"dpinfer: resumed the fit from the checkpoint "
                              f"{str(checkpoint.path)!r} at iterations {json.loads(resumed_at)} (per chain); "
                              f"{len(replay)} widening(s) of windows replayed", checkpoint=str(checkpoint.path),
                              iterations=json.loads(resumed_at))
        if not failed:
            recovery.record(idata, recoveries)
            if estimate is not None:
                idata.posterior.attrs["dpinfer_empirical_bayes"] = json.dumps(_estimate_entry(compiled, estimate, spread))
            idata.posterior.attrs["dpinfer_inference"] = json.dumps({"inference": used, "asked": inference,
                                                                     "why": why})
            return idata, report, attempt, fit
        if attempt == MAX_WIDENINGS:
            raise RuntimeError(failures.message(model, plans, failed, report, idata, engine=engine, tol=tol,
                                                widenings=MAX_WIDENINGS))
        counts = {name: report[name]["counts_near_box_edges"] for name in failed
                  if "counts_near_box_edges" in (report or {}).get(name, {})}
        planning.widen(plans, failed, tol, counts)
        if checkpoint is not None:
            checkpoint.widened(failed, counts)
        evidence = _edge_evidence(failed, report)
        stopped = idata["sample_stats"].attrs.get("stopped_early") if "sample_stats" in idata.children else None
        if stopped:  # the chains stopped at the first draw that failed the windows
            evidence["stopped_early"] = stopped
        recovery.announce(recoveries, "windows widened", _widening_message(failed, evidence, counts),
                          bounds=recovery.bounds_of(failed), replayed=False,
                          counts_widened={name: len(c) for name, c in counts.items()}, **evidence)


def _refit_out_of_time(failed: dict, err: TimeUpError, checkpoint) -> str:
    """Why a fit under max_minutes ended without draws after its windows were widened."""
    resume = (f"; resuming from the checkpoint {str(checkpoint.path)!r} replays the widening and carries on"
              if checkpoint is not None else "")
    return (f"dpinfer.sample: the windows of {sorted(failed)} missed tol (bounds reached: "
            f"{recovery.bounds_of(failed)}) when the chains stopped, so they were widened and the fit run "
            f"again, and then {str(err).removeprefix('dpinfer.sample: ')}. The draws of the fit before the "
            "widening are not a result (its windows may cut off more than tol of the posterior): give more "
            f"time (max_minutes){resume}")


def _widening_message(failed: dict, evidence: dict | None = None, counts: dict | None = None) -> str:
    """The warning of a widening; with ``evidence`` (:func:`_edge_evidence`), the counts that
    reached their boxes' edges (at most EDGES_SHOWN of each latent); ``counts``: the counts
    widened alone (name -> (leaf, cell) pairs), the whole latent for the others."""
    cells = (evidence or {}).get("cells_at_box_edges", {})
    shown = "".join(f"; {name}: " + "; ".join(texts[:EDGES_SHOWN]) for name, texts in cells.items())
    if (evidence or {}).get("stopped_early"):
        shown += f" (the chains {evidence['stopped_early']})"
    which = ", ".join(f"only the {len(c)} counts of {name!r} at or near their boxes' edges" for name, c
                      in (counts or {}).items())
    return (f"dpinfer: the windows of {sorted(failed)} missed tol (bounds reached: {recovery.bounds_of(failed)}); "
            f"widened them{f' ({which})' if which else ''} and fitted again{shown}")


def _estimate_widening_message(widened: dict) -> str:
    """The warning of boxes widened while the empirical-Bayes estimate ran (``widened``: name
    -> the (leaf, cell) pairs, a pair once for each doubling)."""
    parts = "; ".join(f"{name!r}: {len({tuple(c) for c in pairs})} counts ({len(pairs)} doublings of a box)"
                      for name, pairs in widened.items())
    return ("dpinfer: the empirical-Bayes estimate's count draws came within a pilot sd of their boxes' "
            "edges (or, by its end, more than half-way to them), so those counts' boxes were widened before "
            f"the draws given it: {parts}")


def _edge_evidence(failed: dict, report: dict | None) -> dict:
    """The counts of the failed latents that reached their boxes' edges, as the failed fit's
    report names them (nested releases: their boxes, stored draws, pilot and measurements),
    for the recovery's record; empty when there are none."""
    cells = {name: report[name]["cells_at_box_edges"] for name in sorted(failed)
             if report is not None and "cells_at_box_edges" in report.get(name, {})}
    return {"cells_at_box_edges": cells} if cells else {}


def _empirical_bayes_settings(given: dict) -> dict:
    """``empirical_bayes=`` over EMPIRICAL_BAYES's defaults, checked."""
    unknown = sorted(set(given) - set(EMPIRICAL_BAYES_KEYS))
    if unknown:
        raise TypeError(f"empirical_bayes got {unknown}; its settings are {EMPIRICAL_BAYES_KEYS}")
    settings = EMPIRICAL_BAYES | given
    if settings["uncertainty"] not in UNCERTAINTIES:
        raise ValueError(f"empirical_bayes['uncertainty'] must be one of {UNCERTAINTIES}, "
                         f"got {settings['uncertainty']!r}")
    for name, least in (("every", 1), ("burn", 0), ("tune", 0)):
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"empirical_bayes[{name!r}] must be a whole number >= {least}, got {value!r}")
    drawn = (settings["drawn"],) if isinstance(settings["drawn"], str) else settings["drawn"]
    if not isinstance(drawn, (list, tuple)) or not all(isinstance(name, str) for name in drawn):
        raise ValueError(f"empirical_bayes['drawn'] must be a variable's name or a list of names, got "
                         f"{settings['drawn']!r}")
    settings["drawn"] = list(dict.fromkeys(drawn))  # a list: as a checkpoint's JSON gives it back
    return settings


def _estimate_and_choose(fitted, compiled, plans, inference: str, settings: dict, sample_kwargs: dict, *, chains,
                         cores, tune, rng, deadline, progressbar, checkpoint):
    """The parameters' empirical-Bayes estimate, and (``inference="auto"``) whether full Bayes,
    predicted from it, ends before ``deadline``: (estimate, the inference to run, why). A
    resumed fit keeps its checkpoint's choice."""
    timing = {}
    if deadline is not None:  # at most ESTIMATE_SHARE of the time left, the same iterations on a resume
        timing["deadline"] = time.monotonic() + ESTIMATE_SHARE * max(deadline - time.monotonic(), 0.0)
        if checkpoint is not None and checkpoint.resume:
            timing = {"iterations": checkpoint.decided("estimate_iterations", None)}
    held = compiled_engine.estimate_parameters(
        fitted, compiled, plans, chains=chains, cores=cores, rng=rng, progressbar=progressbar,
        initvals=sample_kwargs.get("initvals"), drawn=settings["drawn"],
        **({"max_iterations": TIMED_MAX_ITERATIONS} if deadline is not None else {})
        | {k: settings[k] for k in ESTIMATE_KEYS if k in settings}, **timing)
    if checkpoint is not None:
        checkpoint.decided("estimate_iterations", held.iterations)
    if progressbar:
        print(f"dpinfer: empirical Bayes: {_estimate_line(held, compiled)}", file=sys.stderr, flush=True)
    if inference != "auto":
        return held, inference, "asked for"
    predicted, why = compiled_engine.full_bayes_seconds(
        compiled, held, chains=chains, tune=tune,
        **{k: v for k, v in sample_kwargs.items() if k in ("nuts_per_sweep", "counts_per_sweep")})
    left = deadline - time.monotonic()
    used = "full-bayes" if predicted <= left else "empirical-bayes"
    why += (f"; {max(left, 0) / 60:.1f} min left of max_minutes: "
            + ("full Bayes, started at the empirical-Bayes estimate" if used == "full-bayes" else
               "empirical Bayes (full Bayes would not end in time)"))
    recorded = checkpoint.decided("inference", used) if checkpoint is not None else used
    if recorded != used:
        used = recorded
        why += f"; resuming a checkpointed fit that chose {used}, which continues"
    if progressbar:
        print(f"dpinfer: {why}", file=sys.stderr, flush=True)
    return held, used, why


def _estimate_entry(compiled, held, spread) -> dict:
    """The report of an empirical-Bayes estimate: the method, and per parameter (unconstrained,
    as NUTS would see it) the estimate, its Monte Carlo standard error, the approximate
    posterior sd and the sd given the counts (:class:`~dpinfer.inference.empirical_bayes.Estimate`)."""
    def by_name(values):  # the estimated parameters (those drawn with the counts are in the posterior)
        return {name: np.asarray(values[sl]).reshape(shape).tolist()
                for name, sl, shape in zip(compiled.names, compiled.slices, compiled.shapes) if not held.drawn[sl].any()}

    method = ("empirical Bayes: the continuous parameters' marginal posterior mode (counts summed out; "
              "stochastic-approximation EM-gradient with the exact count draws, dpinfer.inference.empirical_bayes)")
    drawn = [name for name, sl in zip(compiled.names, compiled.slices) if held.drawn[sl].any()]
    if drawn:
        method = method.replace("the continuous parameters' marginal posterior mode (counts summed out;",
                                f"the continuous parameters' marginal posterior mode (counts and {', '.join(drawn)} "
                                "summed out, drawn with the counts by NUTS in each E-step;")
    if held.copies:
        method = method.replace("with the exact count draws,", f"with the exact count draws, each score of "
                                f"one nested cell's counts averaged over {held.copies} redrawings of that cell "
                                "(Rao-Blackwell),")
    if spread is None:
        method += ", then held there: the counts' posterior given them, which ignores the parameters' uncertainty"
    else:
        method += (f", then drawn every {spread['every']} stored draws from the normal law of that mode and the "
                   "approximate posterior sds (Louis's observed information, or the iterates' secant where most "
                   f"of it is missing; diagonal; {spread['burn']} count "
                   "draws after each): the counts' posterior averaged over that approximation of the parameters'")
    return {"method": method, "uncertainty": "normal" if spread is not None else "none", "drawn": drawn,
            "parameters": by_name(held.q), "mc_se": by_name(held.mc_se), "posterior_sd": by_name(held.posterior_sd),
            "conditional_sd": by_name(held.conditional_sd),
            "settled": held.settled, "tolerance": held.tolerance, "burn_in": held.burn_in,
            "iterations": held.iterations, "seconds": held.seconds, "copies": held.copies,
            "rao_blackwellised": [name for name, sl in zip(compiled.names, compiled.slices)
                                  if held.rao_blackwellised[sl].any()]}


def _estimate_line(held, compiled=None) -> str:
    """One line on an empirical-Bayes estimate: iterations, time, and whether its Monte Carlo
    error met the tolerance (else the worst parameter's, and with ``compiled`` (the model's
    parameter layout) the names of those over it, at most ESTIMATE_NAMES_SHOWN)."""
    worst = held.worst
    ratio = held.mc_se[worst] / held.posterior_sd[worst]
    text = (f"parameters estimated in {held.iterations} iterations ({held.burn_in} burn-in), "
            f"{held.seconds:.0f} s; ")
    if held.settled:
        return text + (f"every Monte Carlo error within {held.tolerance:g} of the parameter's approximate "
                       f"posterior sd (largest {ratio:.3f})")
    over = np.flatnonzero(held.mc_se > held.tolerance * held.posterior_sd)
    named = ""
    if compiled is not None:
        names = coordinate_names(compiled)
        order = over[np.argsort(-(held.mc_se[over] / held.posterior_sd[over]), kind="stable")]
        shown = ", ".join(names[i] for i in order[:ESTIMATE_NAMES_SHOWN])
        named = f" ({shown}{', ...' if over.size > ESTIMATE_NAMES_SHOWN else ''})"
    return text + (f"NOT SETTLED: the largest Monte Carlo error is {ratio:.4f} of its parameter's approximate "
                   f"posterior sd, {over.size} of {int(held.estimated.sum())} parameters over the tolerance "
                   f"{held.tolerance:g}{named}; "
                   "it stopped at its time box or max_iterations: raise max_minutes or max_iterations")


def coordinate_names(compiled) -> list[str]:
    """The name of each coordinate of the compiled engine's parameter vector (unconstrained):
    ``name`` for a scalar, ``name[i, j]`` for an element of an array."""
    names = []
    for name, shape in zip(compiled.names, compiled.shapes):
        names += [name] if not shape else [f"{name}[{', '.join(map(str, i))}]" for i in np.ndindex(*shape)]
    return names


def _without(options: dict, *names) -> dict:
    return {k: v for k, v in options.items() if k not in names}


def _add_latents(model, idata, latents: dict) -> None:
    """Add drawn latents (name -> (chain, draw, *shape)) to the posterior, with their dims."""
    posterior = idata["posterior"].to_dataset()
    for name, values in latents.items():
        dims = model.named_vars_to_dims.get(name) or [f"{name}_dim_{i}" for i in range(values.ndim - 2)]
        coords = {d: np.asarray(model.coords[d]) for d in dims if model.coords.get(d) is not None}
        posterior[name] = xr.DataArray(values, dims=("chain", "draw", *dims), coords=coords)
    idata["posterior"] = posterior


def _with_convergence(model, idata, progressbar: bool, exclude=(), statistics=()):
    """``idata`` with its convergence (R-hat, bulk and tail ESS over the parameters and the latent
    counts, :mod:`dpinfer.inference.convergence`) in ``posterior.attrs["dpinfer_convergence"]``
    (JSON); the one-line verdict printed when ``progressbar``, and a ``ConvergenceWarning``
    when the fit falls short. ``exclude``: parameters held fixed (empirical Bayes; the others
    it drew with the counts are judged as latents with them);
    ``statistics``: true statistics standing for latent records (the law of the sum), judged
    with the latents."""
    names = [rv.name for rv in model.free_RVs if rv.name in idata.posterior and rv.name not in exclude]
    latents = latent_names(model) + list(statistics)
    # with exclude, the parameters drawn with the counts: per-area effects judged as latents with them
    drawn = [name for name in names if name not in latents] if exclude else []
    result = convergence.check(idata, names + list(statistics),
                               subject=f"counts{' and ' + ', '.join(drawn) if drawn else ''} given the parameters' "
                               "empirical-Bayes estimate" if exclude else "parameters and counts",
                               latents=latents + [n for n in drawn if idata.posterior[n].size > idata.posterior[n]
                                                  .sizes["chain"] * idata.posterior[n].sizes["draw"]]
                               if drawn or not exclude else ())
    if exclude:
        result = dataclasses.replace(result, unsettled=unsettled(
            json.loads(idata.posterior.attrs.get("dpinfer_empirical_bayes", "{}"))))
    idata.posterior.attrs["dpinfer_convergence"] = json.dumps(result.as_dict())
    convergence.report(result, show=progressbar)
    return idata


def latent_names(model) -> list:
    """The free variables the model's releases privatise directly -- latent counts, latent
    records -- with more than one element: reached from a release's true values without
    passing through another free variable (a regression's records x and y, not its
    coefficients beta behind y). Their R-hat is judged as a family
    (:func:`~dpinfer.inference.convergence.latent_rhat_bound`); a scalar stays a parameter."""
    from pytensor.graph.traversal import ancestors

    from dpinfer._graphs import shape_of

    free = list(model.free_RVs)
    found = []
    for record in releases_of(model):
        if not hasattr(record.latent, "owner"):
            continue
        reached = set(ancestors([record.latent], blockers=free))
        found += [v.name for v in free if v in reached and v.name not in found and int(np.prod(shape_of(v))) > 1]
    return found


def unsettled(estimate: dict) -> str:
    """Why an empirical-Bayes estimate (:func:`_estimate_entry`) has not settled, or "" if it has:
    a fit given an estimate whose Monte Carlo error misses its tolerance is not a result."""
    if not estimate or estimate.get("settled", True):
        return ""
    ratios = np.concatenate([np.ravel(np.asarray(estimate["mc_se"][k], float) / np.asarray(estimate["posterior_sd"][k],
                                                                                              float))
                             for k in estimate["mc_se"]])
    over = int(np.sum(~(ratios <= estimate["tolerance"])))
    largest = float(np.max(ratios)) if ratios.size else math.inf
    return (f"the parameters' empirical-Bayes estimate is NOT SETTLED after {estimate['iterations']} iterations "
            f"({over} of {ratios.size} parameters' Monte Carlo error over {estimate['tolerance']:g} of their "
            f"approximate posterior sd, the largest {largest:.3g})")


def marginal_model(model=None, tol: float = 1e-10):
    """``model`` with its latent counts summed out over proven windows, releases still
    observed (the model the PyMC engine fits). Use it for ``pm.sample_posterior_predictive``
    of releases and ``pm.compute_log_likelihood`` (per-cell marginal log-likelihoods). Built
    on first use for models fitted by the compiled engine, with windows whose tail bound is
    ``tol``."""
    model = pm.modelcontext(model)
    records = releases_of(model)
    if not records:
        raise ValueError("the model has no release registered with Mechanism.observe(...)")
    plans = planning.plan_releases(model, records)
    if any(p.kind == "fibre" for p in plans):
        raise ValueError("latents on fibres (invariants beyond group totals, queries) have no marginal model")
    summed = [p for p in plans if p.kind in ("cells", "totals")]
    planning.first_windows(summed, tol, exact_tails=False, at_least=pymc_engine.kept_widths(model))
    return pymc_engine.marginal_fit(model, summed).model
