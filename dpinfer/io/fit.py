"""``dpinfer fit``: a release file in, a posterior and its report out.

``fit_release(path, model=..., out=...)`` reads the release (values + manifest,
:mod:`dpinfer.io.release`), builds the model of the true counts from a template or a
user's model file (:mod:`dpinfer.io.templates`), fits it with ``dp.sample`` until it has
converged or a time limit passes, and writes the report (:mod:`dpinfer.io.report`): the
posterior as netCDF, a summary table, the counts beside the release, the post-processed
baseline and the truth where the release file has it, and at the top whether the fit
converged. :func:`fit` does the same and returns everything (:class:`Fit`).

Exposure: by default the manifest's declared ``exposure_column`` (none if it declares none);
``exposure="COLUMN"`` (``--exposure COLUMN``) another column of the values file;
``exposure=None`` or ``"none"`` (``--exposure none``) no exposure.

Converging: after each fit the largest rank-normalised split R-hat and the smallest bulk and tail ESS
over every variable of the posterior (parameters, Deterministics such as ``log_rate``, and
every latent count: everything ``summary.csv`` lists; :mod:`dpinfer.inference.convergence`)
and the number of divergent transitions are checked against R-hat <= 1.01, bulk and tail ESS >= 400 and
none. A fit that meets them is the result. Otherwise the model is fitted afresh with more
draws (:func:`next_round`: ESS grows about linearly with the draws, so
draws x 1.25 x 400 / min ESS, at least twice and at most four times the draws, rounded up to
a hundred; tuning at least half the draws, as R-hat above target often means the adaptation
has not finished; divergences raise ``target_accept`` from 0.8 to 0.99; a
hierarchical template re-chooses its centred cells for the range of its scale the fit
visited, :func:`rechoose`) while the
next fit is expected to end within ``max_minutes`` of the start (its time predicted from the
last fit's per-iteration time, planned to take at most 90% of the time left); a fit that
would not end in time is shortened to what fits, and not run if that is shorter than the
last, or the same fit again (same draws, target_accept and centred cells). Each decision is one line on stderr.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from dpinfer._validation import check_count
from dpinfer.inference import sample
from dpinfer.inference.convergence import ConvergenceWarning, check
from dpinfer.io.release import read_release
from dpinfer.io.report import write_report
from dpinfer.io.templates import build, template_report
from dpinfer.mechanisms import RandomizedResponse
from dpinfer.utility.baselines import nonnegative_least_squares, round_to_invariants

DECLARED = "declared"  # exposure: the manifest's exposure_column
NO_EXPOSURE = "none"
MAX_MINUTES = 10.0
# after divergent transitions the next fit takes target_accept 0.99 at once: smaller steps
# follow a funnel's neck, and the steps in between cost whole fits (sex_by_age: divergences at
# 0.9 in both of two seeds, none at 0.99, for 15-30% more time per fit)
TARGET_ACCEPTS = (0.99,)
MAX_GROWTH = 4  # a new fit has at most this many times the last one's draws
SAFETY = 0.9  # a new fit is planned to end within this share of the time left
RANGE_QUANTILES = (0.01, 0.99)  # the range of the scale a fit visited (rechoose)


def baseline(release) -> np.ndarray:
    """The likelihood-free baseline, one value per true value: least-squares projection of the
    release (for randomised response its unbiased table M^{-T} s, which keeps the number of
    records; for a multi-level release its level 0) onto its invariants (where the mechanism
    declares them; randomised response: the number of records) and the non-negative counts,
    rounded to integers that keep the invariants (:mod:`dpinfer.utility.baselines`)."""
    values = np.asarray(release.per_true_value()[0], dtype=np.float64)
    mechanism = release.mechanism
    invariants = getattr(mechanism, "invariants", None)
    if isinstance(mechanism, RandomizedResponse):
        matrix, totals = np.ones((1, values.size)), np.array([values.sum()])
        values = mechanism.unbiased_table(values.astype(np.int64))
    elif invariants is not None:
        matrix = invariants.matrix
        totals = matrix @ values.reshape(-1)
    else:
        return round_to_invariants(nonnegative_least_squares(values.reshape(-1))).reshape(values.shape)
    projected = nonnegative_least_squares(values.reshape(-1), invariants_matrix=matrix,
                                          invariant_values=totals)
    return round_to_invariants(projected, invariants_matrix=matrix,
                               invariant_values=totals).reshape(values.shape)


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # platforms without sched_getaffinity
        return max(1, os.cpu_count() or 1)


def _column(release, name: str, what: str) -> np.ndarray:
    table = release.table
    if name not in table.columns:
        raise ValueError(f"--{what}: the release's values file has no column {name!r}; its "
                         f"columns are {list(table.columns)}")
    return table[name].to_numpy(dtype=np.float64)


def resolve_exposure(release, exposure=DECLARED) -> tuple[np.ndarray | None, str]:
    """(the exposure values or None, a sentence saying which were used and why) for the
    ``exposure`` argument of :func:`fit` (module docstring)."""
    if exposure is None or exposure == NO_EXPOSURE:
        declared = (f" (the manifest declares {release.exposure_column!r}, switched off by "
                    "--exposure none)" if release.exposure_column else "")
        return None, f"none{declared}"
    if not isinstance(exposure, str):
        raise TypeError(f"--exposure must be a column name, {DECLARED!r} or {NO_EXPOSURE!r}; "
                        f"got {exposure!r}")
    if exposure == DECLARED:
        if release.exposure_column is None:
            return None, "none (the manifest declares no exposure_column)"
        return release.exposure, (f"column {release.exposure_column!r} of the values file "
                                  "(the manifest's exposure_column)")
    if exposure not in release.table.columns:
        _column(release, exposure, "exposure")  # raises, naming the columns
    return (release.exposure_values(exposure, argument="--exposure"),
            f"column {exposure!r} of the values file (--exposure)")


@dataclasses.dataclass(frozen=True)
class Round:
    """One fit of the model: its size, target acceptance (None: dp.sample's default), seconds
    and convergence (:class:`~dpinfer.inference.convergence.Convergence`)."""

    draws: int
    tune: int
    chains: int
    target_accept: float | None
    seconds: float
    convergence: object

    def as_dict(self) -> dict:
        return {"draws": self.draws, "tune": self.tune, "chains": self.chains,
                "target_accept": self.target_accept, "seconds": round(self.seconds, 1),
                **self.convergence.as_dict()}


@dataclasses.dataclass
class Fit:
    """What :func:`fit` did: the report's index.html, the posterior, every round and the
    exposure sentence."""

    index: Path
    idata: object
    rounds: list
    exposure: str
    max_minutes: float

    @property
    def convergence(self):
        return self.rounds[-1].convergence

    @property
    def converged(self) -> bool:
        return self.convergence.converged

    def line(self) -> str:
        """The plain-text verdict printed at the end of ``dpinfer fit``."""
        return verdict_line(self.convergence, self.rounds, self.max_minutes)


def shortfall(convergence) -> str:
    """Why a fit falls short of the targets, e.g. "min bulk ESS 230 < 400 for mu"."""
    reasons = []
    if math.isfinite(convergence.max_rhat) and convergence.max_rhat > convergence.rhat_target:
        reasons.append(f"max R-hat {convergence.max_rhat:.3f} > {convergence.rhat_target} "
                       f"for {convergence.worst_rhat}")
    if convergence.latents is not None and not convergence.latents.ok:
        reasons.append(convergence.latents.text())
    if convergence.min_ess < convergence.ess_target:
        reasons.append(f"min bulk ESS {convergence.min_ess:.0f} < {convergence.ess_target:.0f} "
                       f"for {convergence.worst_ess}")
    if convergence.min_tail_ess < convergence.ess_target:
        reasons.append(f"min tail ESS {convergence.min_tail_ess:.0f} < {convergence.ess_target:.0f} "
                       f"for {convergence.worst_tail_ess}")
    if convergence.divergences:
        reasons.append(f"{convergence.divergences} divergent transitions")
    return "; ".join(reasons)


def next_round(convergence, draws: int, tune: int, target_accept):
    """(draws, tune, target_accept) of the next fit (module docstring)."""
    growth = 1.0
    if not convergence.ess_ok:
        growth = 1.25 * convergence.ess_target / max(min(convergence.min_ess, convergence.min_tail_ess), 1.0)
    if not convergence.rhat_ok:
        growth = max(growth, 2.0)
    if growth > 1.0:
        growth = min(max(growth, 2.0), float(MAX_GROWTH))
    new_draws = int(math.ceil(draws * growth / 100.0) * 100) if growth > 1.0 else draws
    new_tune = max(tune, new_draws // 2)
    if convergence.divergences:
        higher = [t for t in TARGET_ACCEPTS if target_accept is None or t > target_accept]
        target_accept = higher[0] if higher else target_accept
    return new_draws, new_tune, target_accept


def verdict_line(convergence, rounds, max_minutes: float) -> str:
    """One line: converged or not, the worst R-hat and ESS with their quantities, and, if not,
    what to do."""
    worst = (f"{convergence.rhat_text}, min bulk ESS {convergence.min_ess:.0f} ({convergence.worst_ess}), "
             f"min tail ESS {convergence.min_tail_ess:.0f} ({convergence.worst_tail_ess}) over "
             f"{convergence.quantities} {convergence.subject}, {convergence.divergences} divergent transitions")
    last = rounds[-1]
    spent = sum(r.seconds for r in rounds)
    history = (f"{len(rounds)} fit{'s' if len(rounds) > 1 else ''}, the last {last.chains} x "
               f"{last.draws} draws, {spent / 60:.1f} min")
    if convergence.converged:
        return f"dpinfer fit: converged: {worst} ({history})"
    return (f"dpinfer fit: NOT CONVERGED, not a result yet: {worst}; targets R-hat <= "
            f"{convergence.rhat_target}, bulk and tail ESS >= {convergence.ess_target:.0f}, no divergences "
            f"({history}). What to do: {' '.join(advice(convergence, rounds, max_minutes))}")


def advice(convergence, rounds, max_minutes: float) -> list[str]:
    """What to do about a fit that has not converged, one sentence each."""
    last = rounds[-1]
    draws, _, _ = next_round(convergence, last.draws, last.tune, last.target_accept)
    longer = max(2 * max_minutes, 2 * sum(r.seconds for r in rounds) / 60, 1)
    if convergence.modes:  # more draws will not help
        out = [f"{convergence.modes};"]
    else:
        out = [f"sample longer: --draws {draws} and a longer time limit, e.g. --max-minutes "
               f"{math.ceil(longer):d};"]
    if convergence.divergences:
        out.append("divergent transitions mean the sampler cannot follow the posterior's "
                   "geometry: a model with another parameterisation may be needed;")
    out.append("try another template (--model poisson-hierarchical, binomial-hierarchical, "
               "loglinear) or your own model file (--model my_model.py defining "
               "build_model(release)).")
    return out


def _fitting(iterations: float, tune: int) -> tuple[int, int]:
    """The largest (draws, tune) of :func:`next_round`'s shape, tune = max(last tune,
    draws // 2) and draws a multiple of 100, with draws + tune <= ``iterations``."""
    draws = int(math.floor((iterations - tune) / 100.0) * 100)
    if draws // 2 > tune:  # tuning grows with the draws: draws + draws // 2 <= iterations
        draws = int(math.floor(iterations / 1.5 / 100.0) * 100)
    return draws, max(tune, draws // 2)


def rechoose(pm_model, latent, template, idata, model, release, exposure_values, log):
    """After a fit that falls short: a hierarchical template's model rebuilt with its
    centred/non-centred choice made for the range of the scale (sigma or tau) that the fit
    visited, its 1% to 99% quantiles (:mod:`dpinfer.io.templates`), where that changes which
    cells are centred; otherwise the model unchanged (no new compilation). Returns
    (model, latent name, template report)."""
    scale = (template or {}).get("scale_variable")
    if scale is None or scale not in idata.posterior:
        return pm_model, latent, template
    low, high = (float(q) for q in np.quantile(idata.posterior[scale].values, RANGE_QUANTILES))
    if not (0 < low <= high and math.isfinite(high)):
        return pm_model, latent, template
    source = f"the last fit's {RANGE_QUANTILES[0]:.0%} to {RANGE_QUANTILES[1]:.0%} quantiles of {scale}"
    candidate, candidate_latent = build(model, release, exposure_values,
                                        spread=(low, high, source))
    chosen = template_report(candidate)
    if chosen is None or chosen.get("centred_cells") == template.get("centred_cells"):
        return pm_model, latent, template
    print(f"dpinfer fit: the fitted {scale} ranges from {low:.3g} to {high:.3g}: "
          f"{chosen['parameterisation_text']}", file=log, flush=True)
    return candidate, candidate_latent, chosen


def fit(path, *, model: str = "auto", out=None, draws: int = 1000, tune: int = 1000,
        chains: int = 2, seed: int | None = None, exposure=DECLARED, truth: str | None = None,
        progressbar: bool = True, max_minutes: float = MAX_MINUTES, cores: int | None = None,
        log=None) -> Fit:
    """Fit ``model`` to the release file at ``path`` until it converges or ``max_minutes``
    pass (module docstring), write the report into ``out`` (default: ``<release name>-fit``
    beside the manifest) and return the :class:`Fit`. ``truth`` names a column of the values
    file holding the true counts; progress lines go to ``log`` (default stderr). The chains run
    in parallel on ``cores`` cores (default: one per chain, up to the cores this process may
    use; PyMC's own default counts half the CPUs, taking the others for hyper-threads)."""
    draws, tune, chains = (check_count(f"--{name}", value, least) for name, value, least in
                           (("draws", draws, 1), ("tune", tune, 0), ("chains", chains, 1)))
    if isinstance(max_minutes, bool) or not (isinstance(max_minutes, (int, float))
                                             and math.isfinite(max_minutes) and max_minutes >= 0):
        raise ValueError(f"--max-minutes must be a finite number >= 0, got {max_minutes!r}")
    cores = min(chains, available_cores()) if cores is None else check_count("--cores", cores, 1)
    log = sys.stderr if log is None else log
    release = read_release(path)
    per_true_value = release.per_true_value()
    if per_true_value is None:
        raise ValueError("dpinfer fit: the release declares a [query] (its values are sums of the "
                         "true counts); the report sets one released value beside each true "
                         "count, so fit it in Python with release.observe(counts) and dp.sample")
    exposure_values, exposure_text = resolve_exposure(release, exposure)
    truth_values = _column(release, truth, "truth") if truth else None
    pm_model, latent = build(model, release, exposure_values)
    template = template_report(pm_model)
    if template is not None and "parameterisation_text" in template:
        print(f"dpinfer fit: {template['template']}: {template['parameterisation_text']}; "
              f"exposure: {exposure_text}", file=log, flush=True)

    start = time.monotonic()
    rounds: list[Round] = []
    size = (int(draws), int(tune), None)
    while True:
        d, t, accept = size
        began = time.monotonic()
        with warnings.catch_warnings():  # one verdict at the end, not one per fit
            warnings.simplefilter("ignore", ConvergenceWarning)
            idata = sample(d, tune=t, chains=chains, cores=int(cores),
                           random_seed=None if seed is None else seed + len(rounds),
                           progressbar=progressbar, model=pm_model,
                           **({"target_accept": accept} if accept is not None else {}))
        seconds = time.monotonic() - began
        result = check(idata, list(idata.posterior.data_vars))
        rounds.append(Round(d, t, chains, accept, seconds, result))
        if result.converged:
            break
        why = shortfall(result)
        d2, t2, accept2 = next_round(result, d, t, accept)
        per_iteration = seconds / (d + t)
        left = max_minutes * 60.0 - (time.monotonic() - start)
        late = f"would not end within --max-minutes {max_minutes:g} ({max(left, 0) / 60:.1f} min left)"
        shortened = per_iteration * (d2 + t2) > SAFETY * left
        if shortened:  # shorten it to what fits in the time left
            d2, t2 = _fitting(SAFETY * left / per_iteration, t)
            if d2 < d:
                print(f"dpinfer fit: {why}: not sampling again: a fit of {chains} x {d} draws "
                      f"{late}; the last took {seconds / 60:.1f} min", file=log, flush=True)
                break
        rebuilt = rechoose(pm_model, latent, template, idata, model, release, exposure_values, log)
        if d2 == d and accept2 == accept and rebuilt[0] is pm_model:  # the same fit again: no
            reason = (f"a fit larger than {chains} x {d} draws {late}" if shortened else
                      f"divergences persist at target_accept {accept}, as high as dpinfer fit "
                      "raises it, with the same centred cells")
            print(f"dpinfer fit: {why}: not sampling again: {reason}", file=log, flush=True)
            break
        pm_model, latent, template = rebuilt
        size = (d2, t2, accept2)
        expected = per_iteration * (d2 + t2)
        print(f"dpinfer fit: {why}: sampling again with {chains} x {d2} draws after {t2} tuning "
              f"steps" + (f", target_accept {accept2}" if accept2 != accept else "")
              + f" (about {expected / 60:.1f} min; {left / 60:.1f} of --max-minutes "
              f"{max_minutes:g} left)", file=log, flush=True)

    fitted = Fit(index=Path(), idata=idata, rounds=rounds, exposure=exposure_text,
                 max_minutes=max_minutes)
    final = rounds[-1]
    if not final.convergence.converged:
        warnings.warn(fitted.line().removeprefix("dpinfer fit: "), ConvergenceWarning, stacklevel=2)
    out = Path(out) if out is not None else Path(path).with_name(f"{release.name}-fit")
    shown, labels = per_true_value
    fitted.index = write_report(
        out, idata, latent=latent, release=shown, labels=labels,
        baseline=baseline(release), truth=truth_values,
        title=f"dpinfer fit: {release.name} with model {Path(model).name}",
        description=(f"{release.description} Mechanism: {release.mechanism!r}. "
                     + ("The release shown is level 0, the least private level; the others are "
                        "post-processing of it and say nothing more about the counts. "
                        if release.values.shape != np.shape(shown) else "")
                     + f"{final.chains} chains x {final.draws} draws after {final.tune} tuning "
                       "steps."),
        convergence=final.convergence, verdict=fitted.line(),
        advice=None if final.convergence.converged else advice(final.convergence, rounds, max_minutes),
        rounds=[r.as_dict() for r in rounds], exposure=exposure_text, template=template)
    return fitted


def fit_release(path, **options) -> Path:
    """:func:`fit` and return the path of the report's index.html (options as :func:`fit`)."""
    return fit(path, **options).index
