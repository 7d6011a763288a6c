"""The count model of the SBC studies of invariant-respecting releases (sbc_nonnegative.py,
sbc_l2.py): mu ~ Normal(log m, 0.5), sigma ~ HalfNormal(0.5), z_i ~ Normal(0, 1),
x_i ~ Poisson(exp(mu + sigma z_i)) (non-centred), i = 1..d, with a release s of x."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm


def build(mechanism, n_cells: int, mean: float) -> pm.Model:
    """The model with ``mechanism``'s release of x observed through the data ``s_data``."""
    with pm.Model() as model:
        s_data = pm.Data("s_data", np.full(n_cells, round(mean), dtype="int64"))
        mu = pm.Normal("mu", math.log(mean), 0.5)
        sigma = pm.HalfNormal("sigma", 0.5)
        z = pm.Normal("z", 0.0, 1.0, shape=n_cells)
        x = pm.Poisson("x", pm.math.exp(mu + sigma * z), shape=n_cells)
        mechanism.observe("s", x, s_data)
    return model


def draw_truth(rng, n_cells: int, mean: float) -> dict:
    """mu, sigma and x drawn from the prior."""
    mu = rng.normal(math.log(mean), 0.5)
    sigma = abs(rng.normal(0.0, 0.5))
    x = rng.poisson(np.exp(mu + sigma * rng.normal(size=n_cells)))
    return {"mu": mu, "sigma": sigma, "x": x}
