"""Model templates for ``dpinfer fit``: a PyMC model of the true counts behind a release file.

Each template is ``build(release, exposure=None) -> (model, latent_name)``: a model whose
latent counts carry the release (``release.observe``, invariants included).

* ``poisson-hierarchical``: for any release of counts (one value per cell, any shape),
  x_i ~ Poisson(e_i exp(mu + sigma z_i)), z_i ~ N(0, 1), mu ~ N(log(m / e), 2) centred on the
  release's mean m per unit of exposure, sigma ~ HalfNormal(1); e_i = 1 or an exposure column
  of the release file (e.g. population). The demo's county model (README "The demo").
* ``loglinear``: for a two-way table, x_ij ~ Poisson(exp(a + r_i + c_j + tau z_ij)) with
  a ~ N(log m, 1), r_i, c_j ~ N(0, 1), z_ij ~ N(0, 1), tau ~ HalfNormal(1) (the gallery's
  delinquent-children model, models/delinquent_children_4x4).

A user's model file (``dpinfer fit RELEASE --model my_model.py``) defines
``build_model(release) -> (model, latent_name)`` the same way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pymc as pm

TEMPLATES = {
    "poisson-hierarchical": "hierarchical Poisson counts (any shape), optional exposure column",
    "loglinear": "two-way table: row, column and cell effects on the log rate",
}


def _centre(release, exposure) -> float:
    """log of the release's mean per unit of exposure, floored at 0.5 count per cell."""
    mean = max(float(np.mean(release.values)), 0.5)
    return float(np.log(mean / (np.mean(exposure) if exposure is not None else 1.0)))


def poisson_hierarchical(release, exposure=None):
    shape = np.shape(release.values)
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


def loglinear(release, exposure=None):
    values = np.asarray(release.values)
    if values.ndim != 2:
        raise ValueError(f"model 'loglinear' needs a two-way table; the release has shape {values.shape}")
    if exposure is not None:
        raise ValueError("model 'loglinear' takes no exposure")
    rows, cols = values.shape
    with pm.Model() as model:
        a = pm.Normal("a", _centre(release, None), 1.0)
        r = pm.Normal("r", 0.0, 1.0, shape=rows)
        c = pm.Normal("c", 0.0, 1.0, shape=cols)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=(rows, cols))
        counts = pm.Poisson("counts", pm.math.exp(a + r[:, None] + c[None, :] + tau * z))
        release.observe(counts)
    return model, "counts"


_BUILDERS = {"poisson-hierarchical": poisson_hierarchical, "loglinear": loglinear}


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
