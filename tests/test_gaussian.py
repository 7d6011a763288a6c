"""Analytic Gaussian mechanism: calibration against the seed-004 §6 T3 table and Balle & Wang
(2018), the profile against mpmath, the audit's quadrature against the closed form."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pymc as pm
import pytest
from scipy import stats

from dpinfer.mechanisms.gaussian import Gaussian, calibrate_sigma

MPMATH_DPS = 40  # mpmath precision of every test here (tests/conftest.py)

# seed-004 note §6 T3 (Δ = 1): sigma(ε, δ), 8 significant digits.
T3 = {
    (1, 1e-5): 3.7306316,
    (0.5, 1e-5): 7.0318267,
    (0.1, 1e-5): 30.749566,
    (0.01, 1e-5): 243.78544,
    (1, 1e-4): 3.1857032,
    (0.1, 1e-4): 24.508106,
    (1, 1e-10): 5.8677777,
    (0.01, 1e-4): 172.573996,
    (1, 1e-8): 5.1003088,
    (2, 1e-6): 2.2304763,
    (5, 1e-5): 0.8918683,
    (10, 1e-5): 0.4998886,
    (0.5, 1e-3): 4.6101280,
}


def mp_delta(epsilon, sigma, sensitivity=1.0):
    """Eq. (3) in 40-digit arithmetic: Φ(Δ/2σ - εσ/Δ) - e^ε Φ(-Δ/2σ - εσ/Δ)."""
    e, s, d = mp.mpf(epsilon), mp.mpf(sigma), mp.mpf(sensitivity)
    return mp.ncdf(d / (2 * s) - e * s / d) - mp.exp(e) * mp.ncdf(-d / (2 * s) - e * s / d)


def test_known_value():
    assert round(Gaussian(1.0, 1e-6).sigma, 4) == 4.2247


@pytest.mark.parametrize("eps_delta", T3)
def test_calibration_table_and_replug(eps_delta):
    epsilon, delta = eps_delta
    sigma = Gaussian(epsilon, delta).sigma
    assert sigma == pytest.approx(T3[eps_delta], rel=1e-6)
    # The conservative end, in exact arithmetic: private at sigma, and sigma is minimal to 1e-9
    # (the search aims 1e-10 below delta to absorb float rounding).
    at_sigma = float(mp_delta(epsilon, sigma))
    assert at_sigma <= delta and at_sigma == pytest.approx(delta, rel=1e-9)
    assert float(mp_delta(epsilon, sigma * (1 - 1e-9))) > delta


def test_profile_matches_mpmath_in_the_tails():
    mech = Gaussian(1.0, 1e-10)
    for eps in (0.01, 1.0, 5.0, 30.0):
        assert mech.delta_for_epsilon(eps) == pytest.approx(float(mp_delta(eps, mech.sigma)), rel=1e-11)


def test_scaling_and_monotonicity():
    # Lemma 2 (seed 004 §6 T8): sigma scales with the sensitivity.
    assert calibrate_sigma(0.5, 1e-6, 3.0) == pytest.approx(3 * calibrate_sigma(0.5, 1e-6), rel=1e-13)
    sigmas = [calibrate_sigma(eps, 1e-6) for eps in (0.1, 0.5, 1.0, 4.0)]
    assert all(a > b for a, b in zip(sigmas, sigmas[1:]))
    sigmas = [calibrate_sigma(1.0, d) for d in (1e-12, 1e-8, 1e-4, 1e-2)]
    assert all(a > b for a, b in zip(sigmas, sigmas[1:]))


def test_from_sigma_inverts_calibration():
    mech = Gaussian(1.3, 1e-7, sensitivity=2.0)
    back = Gaussian.from_sigma(mech.sigma, sensitivity=2.0, delta=1e-7)
    assert back.sigma == mech.sigma
    assert back.epsilon == pytest.approx(1.3, rel=1e-9) and back.delta == 1e-7
    # Conservative: the profile at the reported epsilon is within delta.
    assert float(mp_delta(back.epsilon, back.sigma, 2.0)) <= 1e-7
    assert back.epsilon_for_delta(1e-5) < back.epsilon < back.epsilon_for_delta(1e-9)


@pytest.mark.parametrize("epsilon, delta, sensitivity", [(1.0, 1e-6, 1.0), (0.1, 1e-10, 1.0), (8.0, 1e-3, 2.5)])
def test_audit_quadrature_matches_closed_form(epsilon, delta, sensitivity):
    mech = Gaussian(epsilon, delta, sensitivity)
    audit = mech.audit()
    assert audit.holds and audit.measured_delta <= delta * (1 + 1e-9)
    assert audit.measured_delta == pytest.approx(float(mp_delta(epsilon, mech.sigma, sensitivity)), rel=1e-9)
    assert audit.measured_epsilon == pytest.approx(epsilon, rel=1e-9)


def test_classical_bound_fails_at_large_epsilon():
    """seed-004 §3.4: sigma = Δ sqrt(2 log(1.25/δ)) / ε is proven only for ε < 1. With Δ = 1,
    δ = 1e-5 it gives 0.48448 at ε = 10 (true δ = 2.27e-5) and 0.24224 at ε = 20 (true δ =
    1.53e-3): not private. At ε = 0.5 it is private but looser than the analytic sigma."""
    delta = 1e-5

    def classical(eps):
        return math.sqrt(2 * math.log(1.25 / delta)) / eps

    for eps, minimal, true_delta in ((10.0, 0.49989, 2.27e-5), (20.0, 0.29004, 1.53e-3)):
        assert classical(eps) == pytest.approx(0.48448 * 10 / eps, rel=1e-4)
        assert calibrate_sigma(eps, delta) == pytest.approx(minimal, rel=1e-4)
        achieved = Gaussian.from_sigma(classical(eps), delta=delta)
        assert achieved.delta_for_epsilon(eps) == pytest.approx(true_delta, rel=5e-3)
        assert achieved.epsilon > eps
    assert classical(0.5) > calibrate_sigma(0.5, delta)


def test_likelihood_dist_and_draws():
    mech = Gaussian(1.0, 1e-5, sensitivity=2.0)
    x = np.array([0.0, 4.0, -3.0])
    y = np.array([1.0, 40.0, -3.0])
    expected = stats.norm.logpdf(y, x, mech.sigma)
    np.testing.assert_allclose(mech.log_likelihood(y, x), expected, rtol=1e-14)
    rv = mech.dist(x)
    assert [inp.type.dtype for inp in rv.owner.inputs[2:]] == ["float64", "float64"]
    np.testing.assert_allclose(pm.logp(rv, y).eval(), expected, rtol=1e-14)
    noise = mech.release(np.zeros(200_000), np.random.default_rng(11)) - 0.0
    assert stats.kstest(noise, stats.norm(scale=mech.sigma).cdf).pvalue > 1e-3
    assert not mech.exact_sampler and "SIMULATION-GRADE" in Gaussian.__doc__


def test_utility_facets():
    mech = Gaussian.from_sigma(3.0, delta=1e-6)
    assert mech.noise_variance == 9.0
    lo, hi = mech.noise_interval(0.95)
    assert hi == pytest.approx(3.0 * 1.959963984540054, rel=1e-14) and lo == -hi
    np.testing.assert_allclose(mech.noise_log_sup_beyond(6), stats.norm.logpdf(6, scale=3.0), rtol=1e-15)


@pytest.mark.parametrize(
    "args, error, name",
    [
        ((0.0, 1e-6), ValueError, "epsilon"),
        ((math.nan, 1e-6), ValueError, "epsilon"),
        ((1.0, 0.0), ValueError, "delta"),
        ((1.0, 1.0), ValueError, "delta"),
        ((1.0, math.nan), ValueError, "delta"),
        ((1.0, "1e-6"), TypeError, "delta"),
        ((1.0, 1e-6, -2.0), ValueError, "sensitivity"),
    ],
)
def test_bad_arguments(args, error, name):
    with pytest.raises(error, match=name):
        Gaussian(*args)


def test_bad_from_sigma_and_call_arguments():
    with pytest.raises(ValueError, match="sigma"):
        Gaussian.from_sigma(0.0)
    with pytest.raises(ValueError, match="delta"):
        Gaussian.from_sigma(1.0, delta=2.0)
    mech = Gaussian(1.0, 1e-6)
    with pytest.raises(ValueError, match="epsilon"):
        mech.delta_for_epsilon(-1.0)
    with pytest.raises(ValueError, match="shape"):
        mech.log_likelihood(np.zeros((2, 3)), np.zeros(2))
