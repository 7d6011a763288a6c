"""``dpinfer.sample``: posterior sampling for models whose latent true counts are privatised.

The pipeline, for the releases recorded by ``Mechanism.observe``:

1. **plan**: one plan per latent count vector (:mod:`dpinfer.inference.plans`): independent
   cells, cells on group totals, cells with other children, or cells on a fibre;
2. **engine**: for a model without latent counts (only continuous latents released by
   continuous mechanisms), nutpie (:mod:`dpinfer.inference.nutpie_engine`), with Normal latents
   summed out of Gaussian or Laplace releases in closed form and drawn exactly afterwards
   (:mod:`dpinfer.inference.closed_form`); otherwise the compiled exact Gibbs engine
   (:mod:`dpinfer.inference.compiled_engine`) where every plan is cells or totals and every
   other free variable is continuous, else the PyMC engine
   (:mod:`dpinfer.inference.pymc_engine`); why an engine was not taken is recorded;
3. **windows**: each plan's first window (exact tails on the compiled engine, a window proven
   to within ``tol`` otherwise);
4. **sample**: the engine's fit, with the latent counts drawn (exactly given the parameters,
   or by dpinfer's Gibbs steps);
5. **check and widen**: every bound is checked against ``tol`` on every draw; a latent whose
   window missed it gets a wider window and the model is fitted again;
6. **report**: ``idata.posterior.attrs["dpinfer"]`` (JSON) records per latent the engine and
   why, the method, the window, the bounds reached and the widenings made;
   ``idata.posterior.attrs["dpinfer_convergence"]`` the largest R-hat and smallest bulk ESS
   over the parameters and the counts, also printed as one line at the end of the fit (and a
   ``ConvergenceWarning`` when they miss R-hat <= 1.01 or ESS >= 400:
   :mod:`dpinfer.inference.convergence`).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pymc as pm
import xarray as xr

from dpinfer._validation import check_probability
from dpinfer.inference import closed_form, compiled_engine, convergence, nutpie_engine, pymc_engine
from dpinfer.inference.chains import NUTS_PER_SWEEP
from dpinfer.inference.latents import NotMarginalisableError
from dpinfer.inference.plans import is_continuous_release, plan_releases
from dpinfer.mechanisms.records import releases_of

MAX_WIDENINGS = 4
METHODS = ("auto", "marginal", "fibre")


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
    """Sample the posterior of a model with privatised releases of latent counts, of
    continuous latent statistics (a mean, a sum) or of statistics of latent records (a
    regression's sufficient statistics), released by continuous mechanisms (report entries
    under the release's name).

    Parameters
    ----------
    draws, tune, chains, cores, random_seed, progressbar
        As in ``pm.sample`` (NUTS runs on the continuous parameters; both engines run the
        chains on ``cores`` cores, by default all).
    tol
        Bound on the relative error of a windowed likelihood, checked on every posterior draw:
        sum_i log1p(eta_i / L_i(theta)) <= tol (inference notes §1). The compiled engine's
        draws of additive noise releases are exact beyond their windows and need no bound.
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
        Passed to ``pm.sample`` (PyMC engine); nutpie takes ``target_accept`` and
        ``max_treedepth``; the compiled engine takes ``initvals``,
        ``target_accept`` (0.8) and ``max_treedepth`` (10), as PyMC's NUTS, and
        ``nuts_per_sweep`` (3) and ``counts_per_sweep`` (2, at most ``nuts_per_sweep``): NUTS
        transitions of the parameters and exact draws of the counts per stored draw, which
        alternate (:mod:`dpinfer.inference.chains`).

    Returns
    -------
    xarray.DataTree with the parameters and the draws of the latent counts in ``posterior``
    and the samplers' statistics in ``sample_stats``; ``posterior.attrs["dpinfer"]`` is the
    report of step 6 of the module docstring.
    """
    tol = check_probability(tol, "tol")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, value, least in (("draws", draws, 1), ("tune", tune, 0), ("chains", chains, 1)):
        if int(value) != value or value < least:
            raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    model = pm.modelcontext(model)
    records = releases_of(model)
    if not records:
        raise ValueError("the model has no release registered with Mechanism.observe(...); use pm.sample")
    rng = np.random.default_rng(random_seed)
    tables = closed_form.check_tables(model, records)
    table_names = {t.record.name for t in tables}
    plans = plan_releases(model, [r for r in records if r.name not in table_names], method=method)
    nutpie_failure = None
    refused = nutpie_engine.refusal(model, plans, method, summed=[t.latent_name for t in tables])
    if refused is None:
        idata, nutpie_failure = _sample_with_nutpie(
            model, records, draws=draws, tune=tune, chains=chains, cores=cores, rng=rng,
            progressbar=progressbar, log_likelihood=log_likelihood, sample_kwargs=sample_kwargs)
        if idata is not None:
            return _with_convergence(model, idata, progressbar)
    if tables:
        raise NotMarginalisableError(
            f"randomised-response releases {sorted(table_names)} are fitted by nutpie with their "
            f"tables summed out, which this model does not allow: {refused or nutpie_failure}")
    reason = compiled_engine.refusal(model, plans, method)
    compiled = None
    if reason is None:
        compiled, reason = compiled_engine.compile_for(model, plans)
    if compiled is not None:
        unknown = sorted(set(sample_kwargs) - set(compiled_engine.OPTIONS))
        if unknown:
            raise TypeError(
                f"dpinfer.sample got {unknown}, which the compiled engine does not take (it takes "
                f"{compiled_engine.OPTIONS}); pass method='marginal' to run PyMC's pm.sample with them"
            )
        _check_compiled_options(sample_kwargs)
        if not plans:  # only continuous latents: plain NUTS, one transition per stored draw
            sample_kwargs.setdefault("nuts_per_sweep", 1)
    _first_windows(model, plans, tol, compiled=compiled is not None)

    seeds = rng.integers(2**31, size=MAX_WIDENINGS + 1)
    for attempt in range(MAX_WIDENINGS + 1):
        if compiled is not None:
            idata, report, failed = compiled_engine.run(
                model, compiled, plans, draws=draws, tune=tune, chains=chains,
                cores=min(chains, cores if cores is not None else (os.cpu_count() or 1)), rng=rng,
                tol=tol, progressbar=progressbar, **sample_kwargs)
        else:
            idata, report, failed, fit = pymc_engine.run(
                model, plans, draws=draws, tune=tune, chains=chains, cores=cores,
                seed=int(seeds[attempt]), rng=rng, tol=tol, progressbar=progressbar,
                sample_kwargs=sample_kwargs)
        if not failed:
            break
        if attempt == MAX_WIDENINGS:
            held = sorted(name for name, bound in failed.items() if bound == np.inf)
            if held:
                raise RuntimeError(
                    f"cells of {held} were held (not updated) in most draws after {MAX_WIDENINGS} "
                    "widenings of their windows: at the parameters the chains visit, their "
                    "windows hold almost none of the counts' conditional law. Either the chains "
                    "have not reached the posterior (raise tune) or the model puts the counts far "
                    "from the releases - check the model")
            raise RuntimeError(
                f"the window bound still exceeds tol={tol} after {MAX_WIDENINGS} widenings for "
                f"{sorted(failed)}; the posterior puts mass where the likelihood is tiny - check the model"
            )
        _widen(plans, failed, tol)
        if progressbar:
            print(f"dpinfer: widening the windows of {sorted(failed)} and refitting")

    for record in records:
        if is_continuous_release(model, record):
            report[record.name] = {
                "release": record.name, "mechanism": repr(record.mechanism),
                "method": "NUTS on the continuous latent with the release observed (its exact "
                          "likelihood; nothing to marginalise)"}
    for entry in report.values():
        entry["widenings"] = attempt
        entry["engine"] = "compiled" if compiled is not None else "pymc"
        if compiled is None:
            entry["engine_reason"] = reason
        elif nutpie_failure is not None:
            entry["engine_reason"] = nutpie_failure
    idata.posterior.attrs["dpinfer"] = json.dumps(report)
    if log_likelihood:  # per-cell marginal log-likelihoods, on windows proven to within tol
        with marginal_model(model, tol) if compiled is not None else fit.model:
            pm.compute_log_likelihood(idata, progressbar=progressbar)
    return _with_convergence(model, idata, progressbar)


def _with_convergence(model, idata, progressbar: bool):
    """``idata`` with its convergence (R-hat and bulk ESS over the parameters and the latent
    counts, :mod:`dpinfer.inference.convergence`) in ``posterior.attrs["dpinfer_convergence"]``
    (JSON); the one-line verdict printed when ``progressbar``, and a ``ConvergenceWarning``
    when the fit falls short."""
    names = [rv.name for rv in model.free_RVs if rv.name in idata.posterior]
    result = convergence.check(idata, names)
    idata.posterior.attrs["dpinfer_convergence"] = json.dumps(result.as_dict())
    convergence.report(result, show=progressbar)
    return idata


def _sample_with_nutpie(model, records, *, draws, tune, chains, cores, rng, progressbar,
                        log_likelihood, sample_kwargs):
    """(the fit of a model without latent counts, None) (:mod:`dpinfer.inference.nutpie_engine`),
    or (None, why) where nutpie cannot compile the model (an Op without a numba
    implementation: the compiled Gibbs engine or PyMC's then run it and the report says why)."""
    unknown = sorted(set(sample_kwargs) - set(nutpie_engine.OPTIONS))
    if unknown:
        raise TypeError(
            f"dpinfer.sample got {unknown}, which nutpie (the engine for models without latent "
            f"counts) does not take (it takes {nutpie_engine.OPTIONS}); pass method='marginal' "
            "to run PyMC's pm.sample with them")
    _check_compiled_options(sample_kwargs)
    summed = closed_form.summable(model, records)
    fitted = closed_form.summed_out_model(model, summed) if summed else model
    try:
        compiled = nutpie_engine.compiled_for(fitted, data_of=model)
    except Exception as err:  # noqa: BLE001 - any compilation failure: another engine runs it
        return None, f"nutpie could not compile the model ({type(err).__name__}: {err})"
    idata = nutpie_engine.run(
        fitted, compiled, draws=draws, tune=tune, chains=chains,
        cores=min(chains, cores if cores is not None else (os.cpu_count() or 1)),
        seed=int(rng.integers(2**31)), progressbar=progressbar, **sample_kwargs)
    if log_likelihood:  # of the releases given the parameters (latents summed out where they are)
        with fitted:
            pm.compute_log_likelihood(idata, progressbar=progressbar)
    latents = closed_form.draw_latents(model, summed, idata.posterior, rng)
    if latents:
        posterior = idata["posterior"].to_dataset()
        for name, values in latents.items():
            dims = model.named_vars_to_dims.get(name) or [f"{name}_dim_{i}" for i in range(values.ndim - 2)]
            coords = {d: np.asarray(model.coords[d]) for d in dims if model.coords.get(d) is not None}
            posterior[name] = xr.DataArray(values, dims=("chain", "draw", *dims), coords=coords)
        idata["posterior"] = posterior
    methods = {item.record.name: item.method for item in summed}
    report = {record.name: {"release": record.name, "mechanism": repr(record.mechanism),
                            "method": methods.get(record.name, nutpie_engine.METHOD),
                            "engine": "nutpie", "widenings": 0}
              for record in records}
    idata.posterior.attrs["dpinfer"] = json.dumps(report)
    return idata, None


def _check_compiled_options(options: dict) -> None:
    if "target_accept" in options:
        check_probability(options["target_accept"], "target_accept")
    for name in ("max_treedepth", "nuts_per_sweep", "counts_per_sweep"):
        value = options.get(name, 1)
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    nuts = options.get("nuts_per_sweep", NUTS_PER_SWEEP)
    if options.get("counts_per_sweep", 1) > nuts:
        raise ValueError(f"counts_per_sweep must be at most nuts_per_sweep ({nuts}): each draw "
                         f"of the counts is followed by a NUTS transition; got "
                         f"{options['counts_per_sweep']!r}")


def _first_windows(model, plans, tol: float, *, compiled: bool) -> None:
    """Each plan's first window; the PyMC engine keeps a kept model's wider windows (so a
    refit needs no new compilation)."""
    kept = {} if compiled else pymc_engine.kept_widths(model)
    for plan in plans:
        plan.set_half_width(max(plan.first_half_width(tol, compiled), kept.get(plan.latent_name, 0)))


def _widen(plans, failed: dict, tol: float) -> None:
    for plan in plans:
        if plan.latent_name in failed:
            plan.set_half_width(plan.widened_half_width(failed[plan.latent_name], tol))


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
    plans = plan_releases(model, records)
    if any(p.kind == "fibre" for p in plans):
        raise ValueError("latents on fibres (invariants beyond group totals, queries) have no marginal model")
    summed = [p for p in plans if p.kind in ("cells", "totals")]
    kept = pymc_engine.kept_widths(model)
    for plan in summed:
        plan.set_half_width(max(plan.first_half_width(tol, compiled=False), kept.get(plan.latent_name, 0)))
    return pymc_engine.marginal_fit(model, summed).model
