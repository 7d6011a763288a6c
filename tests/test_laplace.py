"""Laplace mechanism: closed forms (Dwork et al. 2006), scipy in the bulk, Monte Carlo with a
fixed seed."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from scipy import stats

from dpinfer.mechanisms.laplace import Laplace


def test_scale_guarantee_and_labels():
    mech = Laplace(0.5, sensitivity=2.0)
    assert mech.scale == 4.0
    assert (mech.epsilon, mech.delta, mech.privacy.sensitivity) == (0.5, 0.0, 2.0)
    assert not mech.discrete and not mech.exact_sampler
    doc = Laplace.__doc__
    assert "SIMULATION-GRADE" in doc and "Mironov 2012" in doc and "DoubleGeometric" in doc


def test_audit_attains_epsilon():
    audit = Laplace(0.7, sensitivity=3.0).audit()
    assert audit.holds
    assert audit.measured_epsilon == pytest.approx(0.7, rel=1e-12)
    assert audit.measured_delta == 0.0


def test_likelihood_matches_closed_form_and_pymc():
    mech = Laplace(0.5, sensitivity=2.0)  # b = 4
    x = np.array([0.0, 3.0, -2.5, 10.0])
    y = np.array([1.5, -60.0, -2.5, 400.0])
    expected = -np.abs(y - x) / 4.0 - math.log(8.0)
    np.testing.assert_allclose(mech.log_likelihood(y, x), expected, rtol=1e-15)
    np.testing.assert_allclose(mech.log_likelihood(y, x), stats.laplace.logpdf(y, x, 4.0), rtol=1e-14)
    rv = mech.dist(x)
    assert [inp.type.dtype for inp in rv.owner.inputs[2:]] == ["float64", "float64"]
    np.testing.assert_allclose(pm.logp(rv, y).eval(), expected, rtol=1e-15)


def test_observe_with_latent_counts():
    mech = Laplace(1.0)
    released = np.array([3.2, 7.9, -0.4])
    with pm.Model() as model:
        x = pm.Poisson("x", np.float64(4.0), shape=3)
        mech.observe("y", x, observed=released)
    counts = np.array([3, 8, 0])
    got = model.compile_logp()({"x": counts})
    expected = stats.poisson.logpmf(counts, 4.0).sum() + stats.laplace.logpdf(released, counts, 1.0).sum()
    assert got == pytest.approx(expected, rel=1e-13)


def test_releases_follow_the_law():
    mech = Laplace(0.8, sensitivity=1.5)
    x = np.full(200_000, 12.0)
    noise = mech.release(x, np.random.default_rng(20240607)) - x
    assert stats.kstest(noise, stats.laplace(scale=mech.scale).cdf).pvalue > 1e-3
    # Var = 2 b^2; the variance estimate's s.e. is sqrt((mu4 - sigma^4)/n) = sqrt(5/n) * 2 b^2.
    assert noise.var() == pytest.approx(mech.noise_variance, abs=5 * math.sqrt(5 / x.size) * mech.noise_variance)


def test_utility_facets():
    mech = Laplace(0.5)  # b = 2
    assert mech.noise_variance == 8.0
    np.testing.assert_array_equal(mech.mse([1.0, 2.0]), [8.0, 8.0])
    lo, hi = mech.noise_interval(0.9)
    assert hi == pytest.approx(2.0 * math.log(10.0), rel=1e-15) and lo == -hi
    assert stats.laplace.cdf(hi, scale=2.0) - stats.laplace.cdf(lo, scale=2.0) == pytest.approx(0.9, rel=1e-14)
    np.testing.assert_allclose(mech.noise_log_sup_beyond([0, 5]), [-math.log(4.0), -2.5 - math.log(4.0)], rtol=1e-15)
    np.testing.assert_allclose(
        mech.log_likelihood_bound_outside([1.5, 2.5], 5), np.full(2, -2.5 - math.log(4.0)), rtol=1e-15
    )


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"epsilon": 0.0}, ValueError, "epsilon"),
        ({"epsilon": -1.0}, ValueError, "epsilon"),
        ({"epsilon": math.nan}, ValueError, "epsilon"),
        ({"epsilon": math.inf}, ValueError, "epsilon"),
        ({"epsilon": "1"}, TypeError, "epsilon"),
        ({"epsilon": 1.0, "sensitivity": 0.0}, ValueError, "sensitivity"),
        ({"epsilon": 1.0, "neighbour": "swap"}, ValueError, "neighbour"),
    ],
)
def test_bad_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        Laplace(**kwargs)


def test_bad_call_arguments():
    mech = Laplace(1.0)
    with pytest.raises(ValueError, match="shape"):
        mech.log_likelihood(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="prob"):
        mech.noise_interval(1.0)
    with pytest.raises(ValueError, match="k"):
        mech.noise_log_sup_beyond(-1)
    with pytest.raises(ValueError, match="true_values"):
        mech.release([1.0, math.nan], np.random.default_rng(0))
