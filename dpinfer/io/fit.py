"""``dpinfer fit``: a release file in, a posterior and its report out.

``fit_release(path, model=..., out=...)`` reads the release (values + manifest,
:mod:`dpinfer.io.release`), builds the model of the true counts from a template or a
user's model file (:mod:`dpinfer.io.templates`), fits it with ``dp.sample`` and writes the
report (:mod:`dpinfer.io.report`): the posterior as netCDF, a summary table, the counts
beside the release, the post-processed baseline and the truth where the release file has it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpinfer.inference import sample
from dpinfer.io.release import read_release
from dpinfer.io.report import write_report
from dpinfer.io.templates import build
from dpinfer.mechanisms import RandomizedResponse
from dpinfer.utility.baselines import nonnegative_least_squares, round_to_invariants


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


def _column(release, name: str, what: str) -> np.ndarray:
    table = release.table
    if name not in table.columns:
        raise ValueError(f"--{what}: the release's values file has no column {name!r}; its "
                         f"columns are {list(table.columns)}")
    return table[name].to_numpy(dtype=np.float64)


def fit_release(path, *, model: str = "auto", out=None, draws: int = 1000,
                tune: int = 1000, chains: int = 2, seed: int | None = None,
                exposure: str | None = None, truth: str | None = None,
                progressbar: bool = True) -> Path:
    """Fit ``model`` to the release file at ``path`` and write the report into ``out``
    (default: ``<release name>-fit`` beside the manifest). ``exposure`` and ``truth`` name
    columns of the release's values file. Returns the path of the report's index.html."""
    release = read_release(path)
    per_true_value = release.per_true_value()
    if per_true_value is None:
        raise ValueError("dpinfer fit: the release declares a [query] (its values are sums of the "
                         "true counts); the report sets one released value beside each true "
                         "count, so fit it in Python with release.observe(counts) and dp.sample")
    exposure_values = _column(release, exposure, "exposure") if exposure else None
    truth_values = _column(release, truth, "truth") if truth else None
    pm_model, latent = build(model, release, exposure_values)
    idata = sample(draws, tune=tune, chains=chains, random_seed=seed, progressbar=progressbar,
                   model=pm_model)
    out = Path(out) if out is not None else Path(path).with_name(f"{release.name}-fit")
    shown, labels = per_true_value
    return write_report(
        out, idata, latent=latent, release=shown, labels=labels,
        baseline=baseline(release), truth=truth_values,
        title=f"dpinfer fit: {release.name} with model {Path(model).name}",
        description=(f"{release.description} Mechanism: {release.mechanism!r}. "
                     + ("The release shown is level 0, the least private level; the others are "
                        "post-processing of it and say nothing more about the counts. "
                        if release.values.shape != np.shape(shown) else "")
                     + f"{chains} chains x {draws} draws after {tune} tuning steps."))
