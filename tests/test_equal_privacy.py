"""Equal privacy (dpinfer.utility.equal_privacy): every family calibrated through its exact
privacy profile, checked against closed forms, enumeration and mpmath."""

import math

import mpmath
import numpy as np
import pytest

import dpinfer as dp
from dpinfer.mechanisms.base import AdditiveMechanism
from dpinfer.mechanisms.gaussian import calibrate_sigma
from dpinfer.privacy import hockey_stick
from dpinfer.utility.equal_privacy import FAMILIES, PrivacyTarget, calibrate, equal_privacy_table


@pytest.mark.parametrize("epsilon, delta, sensitivity", [(1.0, 1e-5, 1.0), (0.3, 1e-3, 2.5), (2.0, 0.05, 1.0)])
def test_laplace_at_epsilon_delta_gets_theorem_3s_scale(epsilon, delta, sensitivity):
    # seed 004 Theorem 3: (epsilon, delta)-DP iff b >= Δ / (epsilon - 2 ln(1 - delta))
    cal = calibrate("Laplace", PrivacyTarget.approximate(epsilon, delta), sensitivity)
    assert cal.scale == pytest.approx(sensitivity / (epsilon - 2 * math.log1p(-delta)), rel=1e-8)
    assert cal.achieved <= delta


def test_gaussian_targets_match_balle_wang_and_the_zcdp_closed_form():
    target = PrivacyTarget.approximate(1.0, 1e-5)
    assert calibrate(dp.Gaussian, target).scale == pytest.approx(calibrate_sigma(1.0, 1e-5), rel=1e-8)
    # rho-zCDP iff sigma >= Δ / sqrt(2 rho) (D_alpha = alpha Δ^2 / (2 sigma^2))
    for rho, sens in [(0.125, 1.0), (0.5, 3.0)]:
        cal = calibrate("Gaussian", PrivacyTarget.zcdp(rho), sens)
        assert cal.scale == pytest.approx(sens / math.sqrt(2 * rho), rel=1e-8)
    # seed 004 T3: sigma(1, 1e-5) = 3.7306...
    assert calibrate("Gaussian", target).noise_sd == pytest.approx(3.730632, abs=2e-6)


def test_discrete_gaussian_rho_is_attained_and_matches_the_summed_divergences():
    mech = dp.DiscreteGaussian(1.3, 2)
    generic = AdditiveMechanism.zcdp_rho.fget(mech)  # sup over alpha of summed D_alpha / alpha
    assert generic == pytest.approx(4 / (2 * 1.3**2), rel=1e-8)
    for sigma, sens in [(2.0, 1), (1.3, 2), (0.7, 3)]:
        mech = dp.DiscreteGaussian(sigma, sens)
        # the supremum is attained at alpha = 2 (theta((alpha - 1) d) is largest at whole shifts)
        assert mech.renyi_divergence(2.0) / 2 == pytest.approx(mech.zcdp_rho, rel=1e-12)
        assert mech.renyi_divergence(1.3) / 1.3 < mech.zcdp_rho  # 0.3 d is not whole
    cal = calibrate("DiscreteGaussian", PrivacyTarget.zcdp(0.5), 1)
    assert cal.scale == pytest.approx(1.0, rel=1e-8)


@pytest.mark.parametrize("epsilon0, sensitivity", [(0.5, 1), (1.3, 3), (0.2, 2)])
def test_double_geometric_profile_equals_enumeration(epsilon0, sensitivity):
    mech = dp.DoubleGeometric(epsilon0, sensitivity=sensitivity)
    y = np.arange(-3000, 3000)
    for eps in (0.05, epsilon0 / 3, epsilon0 * 0.9, epsilon0, 2 * epsilon0):
        worst = max(hockey_stick(mech.log_likelihood(y, np.zeros(y.size)),
                                 mech.log_likelihood(y, np.full(y.size, float(d))), eps)
                    for d in range(1, sensitivity + 1))
        # (at eps = epsilon0 the true delta is 0; the enumeration's log-ratios carry ~1e-16)
        assert mech.delta_for_epsilon(eps) == pytest.approx(worst, rel=1e-12, abs=1e-15)


def test_renyi_divergences_against_mpmath():
    mpmath.mp.dps = 30
    alpha = 2.5
    lap = dp.Laplace(0.7)
    b, u = lap.scale, lap.sensitivity

    def f(x, mu):
        return mpmath.exp(-abs(x - mu) / b) / (2 * b)

    ref = mpmath.log(mpmath.quad(lambda x: f(x, 0) ** alpha * f(x, u) ** (1 - alpha),
                                 [-mpmath.inf, 0, u, mpmath.inf])) / (alpha - 1)
    assert lap.renyi_divergence(alpha) == pytest.approx(float(ref), rel=1e-12)
    assert AdditiveMechanism.renyi_divergence(lap, alpha) == pytest.approx(float(ref), rel=1e-9)

    dg = dp.DoubleGeometric(0.8, sensitivity=2)
    a = mpmath.exp(-mpmath.mpf(0.8) / 2)

    def p(z):
        return (1 - a) / (1 + a) * a ** abs(z)

    total = mpmath.nsum(lambda z: p(z) ** alpha * p(z - 2) ** (1 - alpha), [-mpmath.inf, mpmath.inf])
    assert dg.renyi_divergence(alpha) == pytest.approx(float(mpmath.log(total) / (alpha - 1)), rel=1e-12)


def test_pure_noise_rho_is_a_supremum_below_the_generic_implication():
    for mech in (dp.Laplace(0.5), dp.DoubleGeometric(1.0), dp.DoubleGeometric(0.6, sensitivity=2)):
        rho = mech.zcdp_rho
        alphas = 1.0 + np.exp(np.linspace(-8, 8, 400))
        ratios = [mech.renyi_divergence(a) / a for a in alphas]
        assert rho >= max(ratios) * (1 - 1e-12)
        assert rho == pytest.approx(max(ratios), rel=1e-4)  # the grid brackets the supremum
        assert rho < mech.epsilon**2 / 2  # Bun & Steinke Prop 1.4 is a bound, not the value


@pytest.mark.parametrize("target", [PrivacyTarget.pure(0.5), PrivacyTarget.approximate(0.8, 1e-6),
                                    PrivacyTarget.zcdp(0.2)])
def test_every_calibration_is_the_smallest_private_scale(target):
    for name in FAMILIES:
        if target.kind == "zcdp" and name == "Logistic":
            continue  # by quadrature: about 10 s (its rho is tested below)
        try:
            cal = calibrate(name, target, 1)
        except ValueError:
            assert target.kind == "pure" and name in ("Gaussian", "DiscreteGaussian")
            continue
        assert target.met_by(cal.mechanism)
        smaller = FAMILIES[name].build(cal.scale * (1 - 1e-4), 1, target)
        assert not target.met_by(smaller), name


def test_pure_target_gives_the_textbook_scales():
    cal = calibrate("DoubleGeometric", PrivacyTarget.pure(0.25), 2)
    assert cal.mechanism.epsilon == pytest.approx(0.25, rel=1e-12)
    assert calibrate("Laplace", PrivacyTarget.pure(0.25), 2).scale == pytest.approx(8.0, rel=1e-12)


def test_refusals_and_bad_input_are_clear():
    with pytest.raises(ValueError, match="never pure epsilon-DP"):
        calibrate("Gaussian", PrivacyTarget.pure(1.0))
    with pytest.raises(ValueError, match="whole-number sensitivity"):
        calibrate("DoubleGeometric", PrivacyTarget.pure(1.0), 1.5)
    with pytest.raises(ValueError, match="family must be one of"):
        calibrate("Cauchy", PrivacyTarget.pure(1.0))
    with pytest.raises(TypeError, match="PrivacyTarget"):
        calibrate("Laplace", (1.0, 1e-5))
    with pytest.raises(ValueError, match="epsilon"):
        PrivacyTarget.pure(0.0)
    with pytest.raises(ValueError, match="delta"):
        PrivacyTarget.approximate(1.0, 1.5)
    with pytest.raises(ValueError, match="rho"):
        PrivacyTarget.zcdp(-1.0)
    with pytest.raises(ValueError, match="alpha must be > 1"):
        dp.Laplace(1.0).renyi_divergence(1.0)


def test_table_shows_refusals_as_rows():
    table = equal_privacy_table(PrivacyTarget.pure(1.0))
    assert list(table.index) == list(FAMILIES)
    assert np.isnan(table.loc["Gaussian", "scale"])
    assert "never pure" in table.loc["Gaussian", "note"]
    assert table.loc["Laplace", "noise_sd"] == pytest.approx(math.sqrt(2.0), rel=1e-12)


def test_seed_004_families_at_equal_privacy():
    target = PrivacyTarget.approximate(1.0, 1e-5)
    # seed 004 T14: noise sd at (1, 1e-5, Δ = 1): Laplace 1.4142, Logistic 1.8047, Gauss 3.7306
    assert calibrate("Logistic", target).noise_sd == pytest.approx(1.8047, abs=1e-4)
    assert calibrate("Laplace", target).noise_sd == pytest.approx(1.4142, abs=1e-4)
    # seed 004 T4: Subbotin scales at (1, 1e-5): r = 1.5 -> 2.203784, r = 3 -> 7.300730
    assert calibrate("Subbotin(1.5)", target).scale == pytest.approx(2.203784, abs=2e-6)
    assert calibrate("Subbotin(3)", target).scale == pytest.approx(7.300730, abs=2e-6)
    with pytest.raises(ValueError, match="never pure"):
        calibrate("Subbotin(1.5)", PrivacyTarget.pure(1.0))
    with pytest.raises(ValueError, match="never rho-zCDP"):
        calibrate("Subbotin(3)", PrivacyTarget.zcdp(0.1))
    with pytest.raises(ValueError, match="r >= 1"):
        calibrate("Subbotin(0.5)", target)
    assert calibrate("Subbotin(1)", PrivacyTarget.pure(1.0)).scale == pytest.approx(1.0, rel=1e-12)
    # Logistic and Laplace noise: D_alpha / alpha is largest as alpha -> 1, so rho is the KL
    # divergence (Laplace: u + e^-u - 1), well below the generic epsilon^2 / 2
    logistic = dp.Logistic(epsilon=1.0)
    assert logistic.zcdp_rho == pytest.approx(logistic.renyi_divergence(1.0 + 1e-7), rel=1e-6)
    assert logistic.zcdp_rho < 0.5
    u = 0.5
    assert dp.Laplace(u).zcdp_rho == pytest.approx(u + math.exp(-u) - 1, rel=1e-8)
