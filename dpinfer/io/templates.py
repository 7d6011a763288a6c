"""Model templates for ``dpinfer fit``: a PyMC model of the true counts behind a release file.

Each template is ``build(release, exposure=None) -> (model, latent_name)``: a model whose
latent counts carry the release (``release.observe``, invariants included). The counts have
the release's true shape (:attr:`~dpinfer.io.release.Release.true_shape`: one per row of
a multi-level release), and templates centre their priors on the release, per true value.

* ``poisson-hierarchical``: for any release of counts (one value per cell, any shape),
  x_i ~ Poisson(e_i exp(mu + sigma z_i)), z_i ~ N(0, 1), mu ~ N(log(m / e), 2) centred on the
  release's mean m per unit of exposure, sigma ~ HalfNormal(1); e_i = 1 or an exposure column
  of the release file (e.g. population). The demo's county model (README "The demo").
* ``binomial-hierarchical``: counts out of a known number of trials N_i,
  x_i ~ Binomial(N_i, logistic(mu + sigma z_i)), mu ~ N(logit(m / N), 2), sigma ~ HalfNormal(1);
  N_i an exposure column or, by default, the mechanism's public upper bound (TruncatedLaplace,
  BITLaplace, ClampedGeometric). A TruncatedLaplace likelihood is flat for true values beyond
  its bounds (they are clipped first, seed 002), so only a prior bounded by them makes the
  windows of the counts finite: this is its template.
* ``loglinear``: for a two-way table, x_ij ~ Poisson(exp(a + r_i + c_j + tau z_ij)) with
  a ~ N(log m, 1), r_i, c_j ~ N(0, 1), z_ij ~ N(0, 1), tau ~ HalfNormal(1) (the gallery's
  delinquent-children model, models/delinquent_children_4x4).
* ``dirichlet-multinomial``: for a randomised-response table of n records' reports,
  p ~ Dirichlet(1, ..., 1), t ~ Multinomial(n, p) the true table (``dp.sample`` sums t out and
  draws it exactly given p; dapper's vignette model, B2).
* ``auto`` (the default): ``dirichlet-multinomial`` for randomised response,
  ``binomial-hierarchical`` for TruncatedLaplace, else ``poisson-hierarchical``.

A user's model file (``dpinfer fit RELEASE --model my_model.py``) defines
``build_model(release) -> (model, latent_name)`` the same way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pymc as pm

from dpinfer.mechanisms import BITLaplace, ClampedGeometric, RandomizedResponse, TruncatedLaplace

TEMPLATES = {
    "auto": "dirichlet-multinomial for randomised response, binomial-hierarchical for "
            "TruncatedLaplace, else poisson-hierarchical",
    "poisson-hierarchical": "hierarchical Poisson counts (any shape), optional exposure column",
    "binomial-hierarchical": "hierarchical binomial counts out of N trials (an exposure column, "
                             "or the mechanism's upper bound)",
    "loglinear": "two-way table: row, column and cell effects on the log rate",
    "dirichlet-multinomial": "randomised-response table: Dirichlet cell probabilities, "
                             "multinomial true table",
}


def _released_mean(release) -> float:
    per_value = release.per_true_value()
    values = release.values if per_value is None else per_value[0]
    return float(np.mean(values))


def _centre(release, exposure) -> float:
    """log of the release's mean per unit of exposure, floored at 0.5 count per cell."""
    mean = max(_released_mean(release), 0.5)
    return float(np.log(mean / (np.mean(exposure) if exposure is not None else 1.0)))


def _not_a_table(release, name: str) -> None:
    if isinstance(release.mechanism, RandomizedResponse):
        raise ValueError(f"model {name!r} is for noisy counts; a randomised-response release is a "
                         "table of reports: use --model dirichlet-multinomial")


def poisson_hierarchical(release, exposure=None):
    _not_a_table(release, "poisson-hierarchical")
    shape = release.true_shape
    with pm.Model() as model:
        mu = pm.Normal("mu", _centre(release, exposure), 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=shape)
        rate = pm.math.exp(mu + sigma * z)
        if exposure is not None:
            rate = np.asarray(exposure, dtype=np.float64).reshape(shape) * rate
        counts = pm.Poisson("counts", rate, shape=shape)
        release.observe(counts)
    return model, "counts"


def binomial_hierarchical(release, exposure=None):
    _not_a_table(release, "binomial-hierarchical")
    shape = release.true_shape
    if exposure is None:
        mechanism = release.mechanism
        if not isinstance(mechanism, (TruncatedLaplace, BITLaplace, ClampedGeometric)) or mechanism.upper is None:
            raise ValueError("model 'binomial-hierarchical' needs the number of trials: an "
                             "--exposure column, or a mechanism with a public upper bound "
                             "(TruncatedLaplace, BITLaplace, ClampedGeometric)")
        exposure = np.full(shape, mechanism.upper)
    trials = np.asarray(exposure, dtype=np.float64).reshape(shape)
    if np.any(trials < 0) or np.any(trials != np.rint(trials)):
        raise ValueError("model 'binomial-hierarchical': the numbers of trials must be whole "
                         "numbers >= 0")
    share = np.clip(_released_mean(release) / max(float(np.mean(trials)), 1.0), 0.01, 0.99)
    with pm.Model() as model:
        mu = pm.Normal("mu", float(np.log(share / (1 - share))), 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=shape)
        counts = pm.Binomial("counts", trials.astype(np.int64), pm.math.sigmoid(mu + sigma * z), shape=shape)
        release.observe(counts)
    return model, "counts"


def loglinear(release, exposure=None):
    _not_a_table(release, "loglinear")
    shape = release.true_shape
    if len(shape) != 2:
        raise ValueError(f"model 'loglinear' needs a two-way table; the release has shape {shape}")
    if exposure is not None:
        raise ValueError("model 'loglinear' takes no exposure")
    rows, cols = shape
    with pm.Model() as model:
        a = pm.Normal("a", _centre(release, None), 1.0)
        r = pm.Normal("r", 0.0, 1.0, shape=rows)
        c = pm.Normal("c", 0.0, 1.0, shape=cols)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=(rows, cols))
        counts = pm.Poisson("counts", pm.math.exp(a + r[:, None] + c[None, :] + tau * z))
        release.observe(counts)
    return model, "counts"


def dirichlet_multinomial(release, exposure=None):
    if not isinstance(release.mechanism, RandomizedResponse):
        raise ValueError("model 'dirichlet-multinomial' is for randomised-response releases; "
                         f"this release is from {type(release.mechanism).__name__}")
    if exposure is not None:
        raise ValueError("model 'dirichlet-multinomial' takes no exposure")
    values = np.asarray(release.values)
    with pm.Model() as model:
        p = pm.Dirichlet("p", np.ones(values.size))
        table = pm.Multinomial("counts", n=int(values.sum()), p=p)
        release.observe(table)
    return model, "counts"


def auto(release, exposure=None):
    if isinstance(release.mechanism, RandomizedResponse):
        return dirichlet_multinomial(release, exposure)
    if isinstance(release.mechanism, TruncatedLaplace):
        return binomial_hierarchical(release, exposure)
    return poisson_hierarchical(release, exposure)


_BUILDERS = {"auto": auto, "poisson-hierarchical": poisson_hierarchical,
             "binomial-hierarchical": binomial_hierarchical, "loglinear": loglinear,
             "dirichlet-multinomial": dirichlet_multinomial}


def build(model: str, release, exposure=None):
    """(model, latent name) from a template name or a user's model file (module docstring)."""
    if model in _BUILDERS:
        return _BUILDERS[model](release, exposure)
    path = Path(model)
    if path.suffix != ".py":
        raise ValueError(f"--model must be one of {sorted(TEMPLATES)} or a Python file defining "
                         f"build_model(release); got {model!r}")
    if not path.is_file():
        raise FileNotFoundError(f"--model: no such file {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"dpinfer_user_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    builder = getattr(module, "build_model", None)
    if builder is None:
        raise ValueError(f"--model {str(path)!r} defines no build_model(release) function")
    result = builder(release)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], pm.Model)
            and isinstance(result[1], str)):
        raise TypeError(f"{str(path)!r}: build_model(release) must return (pm.Model, latent name)")
    if result[1] not in result[0].named_vars:
        raise ValueError(f"{str(path)!r}: the model has no variable {result[1]!r}")
    return result
