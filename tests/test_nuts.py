"""The compiled NUTS transition (dpinfer.inference.engines.compiled.nuts) leaves its target invariant, and the
compiled chain's diagonal metric is the one documented.

Invariance is tested the direct way: N independent exact draws of a non-Gaussian target, one
transition each, and the N results must again be exact draws (a wrong weight in the
multinomial or progressive sampling, or an asymmetric U-turn check, moves the law)."""

import math

import numba
import numpy as np
import pytest
from scipy import stats

from dpinfer._random_stream import new_stream
from dpinfer.inference.engines.compiled.native import LOGP_GRAD
from dpinfer.inference.engines.compiled.nuts import log_density_at, metric_windows, nuts_transition

B = 0.5  # banana: x1 ~ N(0, 1), x2 | x1 ~ N(x1^2, B^2)


@numba.cfunc(LOGP_GRAD)
def banana(q_ptr, g_ptr, data_ptr):
    q = numba.carray(q_ptr, (2,), dtype=np.float64)
    g = numba.carray(g_ptr, (2,), dtype=np.float64)
    r = (q[1] - q[0] * q[0]) / B
    g[0] = -q[0] + 2.0 * q[0] * r / B
    g[1] = -r / B
    return -0.5 * q[0] * q[0] - 0.5 * r * r


@numba.njit
def _one_transition_each(address, draws, eps, inv_mass, max_depth, state):
    data = np.zeros(1, np.int64)
    out = np.empty_like(draws)
    depths = np.empty(draws.shape[0])
    g = np.empty(draws.shape[1])
    for k in range(draws.shape[0]):
        q = draws[k].copy()
        lp = log_density_at(address, q, g, data)
        _, depth, _, _, _, _, _ = nuts_transition(address, data, q, g, lp, eps, inv_mass, max_depth, state)
        out[k] = q
        depths[k] = depth
    return out, depths


@pytest.mark.parametrize("eps, inv_mass, min_depth", [
    (0.3, (1.0, 1.0), 1.5),  # long trajectories, several doublings
    (0.15, (0.5, 2.0), 2.0),  # a non-unit metric
    (0.8, (2.0, 0.5), 0.5),  # a step too large for the curved part: many divergences
])
def test_one_transition_preserves_the_banana(eps, inv_mass, min_depth):
    rng = np.random.default_rng(2026)
    n = 200_000
    x1 = rng.standard_normal(n)
    draws = np.column_stack([x1, x1**2 + B * rng.standard_normal(n)])
    out, depths = _one_transition_each(banana.address, draws, eps, np.array(inv_mass), 10, new_stream(rng))
    assert depths.mean() > min_depth
    moved = np.mean(np.abs(out[:, 0] - draws[:, 0]) > 0.1)
    assert moved > 0.1  # not the identity
    # the law after one transition: x1 ~ N(0, 1) and (x2 - x1^2)/B ~ N(0, 1), independent
    assert stats.kstest(out[:, 0], "norm").pvalue > 1e-3
    assert stats.kstest((out[:, 1] - out[:, 0] ** 2) / B, "norm").pvalue > 1e-3
    # a few moments, with their Monte Carlo standard errors (draws are i.i.d. across rows)
    for value, mean, var in ((out[:, 0] ** 2, 1.0, 2.0), (out[:, 1], 1.0, 2.0 + B**2),
                             (out[:, 0] * out[:, 1], 0.0, 15.0 + B**2)):
        assert abs(value.mean() - mean) < 4.5 * math.sqrt(var / n)


def test_metric_windows_double_and_end_at_the_terminal_buffer():
    assert metric_windows(1000) == [49, 99, 199, 399, 899]  # terminal buffer tune / 10
    assert metric_windows(2000) == [49, 99, 199, 399, 799, 1799]
    assert metric_windows(500) == [49, 99, 199, 449]
    assert metric_windows(100) == [49]
    assert metric_windows(60) == [53]  # 15 % initial buffer, 10 % terminal, one window
    assert metric_windows(10) == []


def test_the_metric_sits_a_quarter_of_the_way_from_nutpies_to_stans():
    """Var q^(5/8) / Var grad^(3/8): for a Gaussian coordinate independent of the others (Var
    grad = 1 / Var q) its variance, as nutpie's and Stan's; for one of marginal variance 4 and
    conditional variance 1 (Var grad = 1) 2^(5/4), between nutpie's 2 and Stan's 4; Var q where
    the gradient does not vary. (m2: sums of squared deviations of 101 points.)"""
    from dpinfer.inference.engines.compiled.chains import METRIC_TOWARD_DRAWS, _metric_variance

    assert METRIC_TOWARD_DRAWS == 0.25
    assert _metric_variance(400.0, 25.0, 101.0) == pytest.approx(4.0, rel=1e-14)
    assert _metric_variance(100.0 * 0.09, 100.0 / 0.09, 101.0) == pytest.approx(0.09, rel=1e-14)
    assert _metric_variance(400.0, 100.0, 101.0) == pytest.approx(2.0 ** 1.25, rel=1e-14)
    assert _metric_variance(400.0, 0.0, 101.0) == 4.0
