"""The planning step of ``dpinfer.sample``: what to do with each latent, decided once before
any sampling.

:func:`plan_model` reads the releases recorded by ``Mechanism.observe`` and returns a
:class:`ModelPlan`:

* latents summed out in closed form (:mod:`~dpinfer.inference.planning.closed_form`): Normal
  latents released whole by Gaussian or Laplace noise, true tables under randomised response;
* one plan per latent count vector: independent cells, cells on group totals, cells with
  further children (:mod:`~dpinfer.inference.planning.cells`), cells on a fibre
  (:mod:`~dpinfer.inference.planning.fibre`), or counts on the leaves of a tree of areas
  measured at every level (:mod:`~dpinfer.inference.planning.nested`);
* releases of record-additive statistics of latent records fitted by the law of the sum
  (:mod:`~dpinfer.inference.planning.record_sums`), or by data augmentation (the report says why);
* the releases of continuous latents, which need no plan (NUTS samples them with the release
  observed).

Plans are data the engines read (:mod:`dpinfer.inference.engines`); the pipeline
(:mod:`dpinfer.inference.sample`) sets their windows (:func:`first_windows`) and widens them
(:func:`widen`) when an engine reports a bound above ``tol``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer.inference.planning.cells import TotalsPlan, cells_plan
from dpinfer.inference.planning.closed_form import check_tables, summable
from dpinfer.inference.planning.entries import entries_from
from dpinfer.inference.planning.queries import resolve_query
from dpinfer.inference.planning.record_sums import NotASumError, plan_record_sums
from dpinfer.mechanisms.records import ReleaseRecord, closest_free_variables


@dataclass
class ModelPlan:
    """What ``dpinfer.sample`` does with a model's latents (module docstring)."""

    records: list  # every release of the model
    summed: list  # latents summed out in closed form (for the NUTS engines), tables first, then
    # the releases of latent records fitted by the law of the sum
    tables: list  # the randomised-response tables among them: they must be summed out
    latents: list  # one plan per latent count vector
    continuous: list  # releases of continuous latents by continuous mechanisms
    augmented: dict  # record-additive releases fitted by data augmentation: name -> why


def plan_model(model, records, *, method: str = "auto", record_method: str = "auto") -> ModelPlan:
    """The plan of every latent of ``model`` behind ``records`` (module docstring);
    ``method="fibre"`` takes fibre moves where convolution on group totals would apply;
    ``record_method`` chooses between data augmentation and the law of the sum
    (:data:`~dpinfer.inference.planning.record_sums.RECORD_METHODS`)."""
    tables = check_tables(model, records)
    table_names = {t.record.name for t in tables}
    continuous = [r for r in records if is_continuous_release(model, r)]
    latents = plan_releases(model, [r for r in records if r.name not in table_names], method=method)
    sums, augmented = plan_record_sums(model, continuous, record_method)
    if sums and (latents or method not in ("auto", "nutpie")):
        why = ("the model also has latent counts" if latents else f"method={method!r} runs PyMC's own sampler")
        if record_method == "law-of-the-sum":
            raise NotASumError(f"records='law-of-the-sum' needs the NUTS engines on a model without latent counts: {why}")
        augmented |= {s.record.name: f"data augmentation: {why}" for s in sums}
        sums = []
    summed_names = {s.record.name for s in sums}
    summed = tables + summable(model, [r for r in continuous if r.name not in summed_names]) + sums
    return ModelPlan(records, summed, tables, latents, continuous, augmented)


def is_continuous_release(model, record: ReleaseRecord) -> bool:
    """A continuous mechanism's release of real-valued latents (a mean, a sum, a regression
    statistic): an ordinary observed variable of the model, which NUTS samples with the
    latent; nothing to marginalise or draw, so no plan."""
    latents = closest_free_variables(model, record.latent) if hasattr(record.latent, "owner") else []
    return (not record.mechanism.discrete and bool(latents)
            and all(not v.type.dtype.startswith(("int", "uint")) for v in latents))


def plan_releases(model, records, *, method: str = "auto") -> list:
    """One plan per latent count vector (releases of continuous latents by continuous
    mechanisms need none: :func:`is_continuous_release`). Latents whose releases are all of
    the counts themselves get a cells plan (the first release sets the window; further
    releases make it a children plan); latents with a conditioned release or a release of a
    linear query get a fibre plan, or a totals plan for group totals (``method="fibre"``: a
    fibre plan there too)."""
    plans = []
    records = [r for r in records if not is_continuous_release(model, r)]
    for latent, entries in entries_from(model, records, resolve_query).items():
        nested = [e for e in entries if hasattr(e.record.mechanism, "sums")]
        if nested:
            if len(entries) > 1:
                raise ValueError(
                    f"the counts {latent.name!r} have the nested release {nested[0].record.name!r} "
                    f"and {len(entries) - 1} more; put every measurement of them in the one "
                    "NestedMeasurements release")
            from dpinfer.inference.planning.nested import nested_plan

            plans.append(nested_plan(model, nested[0].record, latent, nested[0].value))
            continue
        special = [e for e in entries if e.record.mechanism.keeps_invariants or e.query is not None]
        if not special:
            plans.append(cells_plan(model, entries[0].record))
            continue
        # imported here: a model without invariants or queries never loads the lattice
        # machinery (scipy.sparse, Markov bases), which a fresh script would pay for
        from dpinfer.inference.planning.fibre import plan_fibre

        plan = plan_fibre(model, latent, entries, allow_convolution=method != "fibre")
        if plan.method == "fibre":
            plans.append(plan)
            continue
        plans.append(TotalsPlan(
            record=plan.record, latent_name=plan.latent_name,
            release_value=entries[0].value.reshape(plan.shape), support=plan.support,
            group_codes=np.asarray(plan.record.mechanism.invariants.group_codes).reshape(-1),
        ))
    return plans


def first_windows(plans: list, tol: float, *, exact_tails: bool, at_least: dict) -> None:
    """Each plan's first window: the engine's exact-tail window where ``exact_tails`` (the
    compiled engine), else one proven to within ``tol``; never narrower than ``at_least``
    (a kept model's widths, so that a refit compiles nothing)."""
    for plan in plans:
        plan.set_half_width(max(plan.first_half_width(tol, exact_tails), at_least.get(plan.latent_name, 0)))


def widen(plans: list, failed: dict, tol: float, counts: dict | None = None) -> None:
    """Wider windows for the latents whose bound missed ``tol`` (``failed``: name -> bound);
    ``counts`` (name -> (leaf, cell) pairs) widens only those counts of a nested latent
    (:meth:`~dpinfer.inference.planning.nested.NestedPlan.widen_counts`), the whole latent
    where it names none."""
    counts = counts or {}
    for plan in plans:
        if plan.latent_name not in failed:
            continue
        if plan.kind == "nested" and len(counts.get(plan.latent_name, ())):
            plan.widen_counts(counts[plan.latent_name])
        else:
            plan.set_half_width(plan.widened_half_width(failed[plan.latent_name], tol))
