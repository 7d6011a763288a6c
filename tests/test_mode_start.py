"""The chains' start around the parameters' mode with some latents held at a naive estimate
(dpinfer.inference.engines.compiled.mode_start), on a Gaussian model whose mode and curvature
are known in closed form."""

import numpy as np
import pymc as pm
import pytest

from dpinfer.inference.engines.compiled.engine import compiled_model_for
from dpinfer.inference.engines.compiled.mode_start import OVERDISPERSION, mode_starts

Y = np.array([1.3, 0.4, 2.2, 1.9, 0.8])
HELD = 3.0


@pytest.fixture(scope="module")
def gaussian():
    """a ~ N(0, 10), b ~ N(0, 10), t ~ N(a, 1) (held at HELD), y_i ~ N(a + b, 2): given t the
    log density is quadratic in (a, b) with precision P = diag(1/100) + [[1, 0], [0, 0]] +
    (n/4) [[1, 1], [1, 1]] and mode P^{-1} (t, 0) + P^{-1} (sum y / 4) (1, 1)."""
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 10.0)
        b = pm.Normal("b", 0.0, 10.0)
        pm.Normal("t", a, 1.0)
        pm.Normal("y", a + b, 2.0, observed=Y)
    compiled = compiled_model_for(model, [], [])
    precision = np.eye(2) / 100.0 + np.array([[1.0, 0.0], [0.0, 0.0]]) + len(Y) / 4.0 * np.ones((2, 2))
    mode = np.linalg.solve(precision, np.array([HELD, 0.0]) + Y.sum() / 4.0)
    return compiled, precision, mode


def _q(compiled, values: dict) -> np.ndarray:
    q = np.zeros(compiled.n)
    for name, value in values.items():
        q[compiled.slices[compiled.names.index(name)]] = value
    return q


def test_the_mode_given_the_held_value_and_starts_spread_by_the_curvature(gaussian):
    """Each start is mode + S z (z the seed's standard normal draw): regressing the starts on
    their z recovers the mode (closed form, to 1e-6) and S S' = OVERDISPERSION^2 P^{-1} (to
    1e-4, the Hessian by central differences); the held coordinate stays at its value."""
    compiled, precision, mode = gaussian
    seeds = list(range(8))
    starts, summary, metric = mode_starts(compiled, _q(compiled, {"a": 5.0, "b": -7.0, "t": HELD}), ["t"], seeds)
    assert summary["used"] and summary["converged"]
    assert summary["log_density_at_mode"] > summary["log_density_at_start"]
    index = {name: compiled.slices[compiled.names.index(name)].start for name in ("a", "b", "t")}
    np.testing.assert_array_equal([q[index["t"]] for q in starts], HELD)
    ab = np.array([[q[index["a"]], q[index["b"]]] for q in starts])
    z = np.array([np.random.default_rng(seed).standard_normal(2) for seed in seeds])
    coefficients, *_ = np.linalg.lstsq(np.column_stack([np.ones(len(seeds)), z]), ab, rcond=None)
    np.testing.assert_allclose(coefficients[0], mode, atol=1e-6)
    spread = coefficients[1:].T
    np.testing.assert_allclose(spread @ spread.T, OVERDISPERSION**2 * np.linalg.inv(precision), rtol=1e-4)
    # the chains' first metric: the normal law's variances diag(P^{-1}); none for the held coordinate
    np.testing.assert_allclose([metric[index["a"]], metric[index["b"]]], np.diag(np.linalg.inv(precision)), rtol=1e-4)
    assert metric[index["t"]] == 0.0


def test_no_better_point_leaves_the_start(gaussian):
    """Started at the mode, the optimiser finds nothing better; the chains start around it."""
    compiled, precision, mode = gaussian
    q0 = _q(compiled, {"a": mode[0], "b": mode[1], "t": HELD})
    starts, summary, _ = mode_starts(compiled, q0, ["t"], [1, 2])
    assert summary["used"]
    assert summary["log_density_at_mode"] == pytest.approx(summary["log_density_at_start"], abs=1e-9)
