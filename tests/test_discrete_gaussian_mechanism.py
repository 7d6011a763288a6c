"""DiscreteGaussian mechanism (dpinfer.mechanisms.discrete_gaussian) against mpmath sums, the
literal CKS Theorem 7 formula and exact enumeration of the hockey-stick divergence.

The goodness-of-fit test uses a fixed seed, so it is deterministic (see test_exact_sampling)."""

import math

import mpmath
import numpy as np
import pymc as pm
import pytest
from test_exact_sampling import chi_square_pvalue

from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian
from dpinfer.privacy import hockey_stick

MPMATH_DPS = 30  # mpmath precision of every test here (tests/conftest.py)
SIGMAS = [0.3, 0.9, 1.0, 1.7, 4.2308, 50.0]


def mp_reach(sigma):
    """Terms this far out are below exp(-60^2/2) of the largest: direct sums stop there."""
    return math.ceil(60 * sigma) + 20


def mp_normaliser(sigma):
    s2 = mpmath.mpf(sigma) ** 2
    r = mp_reach(sigma)
    return mpmath.fsum(mpmath.exp(-mpmath.mpf(k) ** 2 / (2 * s2)) for k in range(-r, r + 1))


def mp_pmf(y, sigma, z):
    return mpmath.exp(-mpmath.mpf(int(y)) ** 2 / (2 * mpmath.mpf(sigma) ** 2)) / z


def mp_tail(c, sigma, z):
    """P[Y > c] for real c, summed by mpmath."""
    first = int(mpmath.floor(c)) + 1
    return mpmath.fsum(mp_pmf(y, sigma, z) for y in range(first, max(first, 0) + mp_reach(sigma)))


@pytest.mark.parametrize("sigma", SIGMAS)
def test_pmf_sums_to_one_and_matches_mpmath(sigma):
    m = DiscreteGaussian(sigma)
    z = mp_normaliser(sigma)
    assert m._log_norm == pytest.approx(float(mpmath.log(z)), rel=1e-15, abs=1e-16)
    k = math.ceil(12 * sigma) + 5
    ys = np.arange(-k, k + 1)
    want = np.array([float(mp_pmf(y, sigma, z)) for y in ys])
    np.testing.assert_allclose(np.exp(m.noise_logpdf(ys)), want, rtol=1e-13)
    window = mpmath.fsum(mpmath.exp(v) for v in m.noise_logpdf(ys))
    assert abs(window + 2 * mp_tail(k, sigma, z) - 1) < 1e-14
    assert m.noise_logpdf(0.5) == -np.inf


@pytest.mark.parametrize("sigma", SIGMAS)
def test_variance_is_the_exact_sum(sigma):
    z = mp_normaliser(sigma)
    var = 2 * mpmath.fsum(y**2 * mp_pmf(y, sigma, z) for y in range(1, mp_reach(sigma)))
    m = DiscreteGaussian(sigma)
    assert m.noise_variance == pytest.approx(float(var), rel=1e-13)
    assert m.noise_variance <= sigma**2  # below sigma^2 by ~8 pi^2 sigma^4 e^{-2 pi^2 sigma^2}
    if sigma <= 1.0:
        assert m.noise_variance < sigma**2
    np.testing.assert_allclose(m.variance([0, 5]), float(var), rtol=1e-13)


@pytest.mark.parametrize(
    "sigma, sensitivity, epsilon",
    [(0.9, 1, 0.5), (1.7, 1, 2.0), (4.2308, 1, 1.0), (4.2308, 2, 1.3), (20.0, 3, 0.4), (50.0, 1, 0.01)],
)
def test_delta_matches_cks_theorem_7(sigma, sensitivity, epsilon):
    z = mp_normaliser(sigma)
    c = mpmath.mpf(epsilon) * mpmath.mpf(sigma) ** 2 / sensitivity
    literal = mp_tail(c - mpmath.mpf(sensitivity) / 2, sigma, z) - mpmath.exp(epsilon) * mp_tail(
        c + mpmath.mpf(sensitivity) / 2, sigma, z
    )
    m = DiscreteGaussian(sigma, sensitivity=sensitivity)
    assert m.delta_for_epsilon(epsilon) == pytest.approx(float(literal), rel=1e-12)


@pytest.mark.parametrize("sensitivity", [1, 2, 3])
@pytest.mark.parametrize("sigma", [0.6, 2.0, 4.2308, 25.0])
def test_audit_enumeration_equals_exact_delta(sigma, sensitivity):
    m = DiscreteGaussian(sigma, sensitivity=sensitivity, delta=1e-5)
    audit = m.audit()
    assert audit.measured_delta == pytest.approx(m.delta_for_epsilon(m.epsilon), rel=1e-10)
    assert audit.measured_delta <= 1e-5
    assert audit.holds
    # enumeration at other epsilons agrees too (it is not just the calibrated point)
    ks = np.arange(-200 - math.ceil(40 * sigma), 200 + math.ceil(40 * sigma))
    log_p, log_q = m.log_likelihood(ks, np.zeros(ks.shape)), m.log_likelihood(ks, np.full(ks.shape, sensitivity))
    for eps in [0.5 * m.epsilon, 2 * m.epsilon]:
        hs = hockey_stick(log_p, log_q, eps)
        assert hs == pytest.approx(m.delta_for_epsilon(eps), rel=1e-10, abs=1e-300)


@pytest.mark.parametrize("sigma, sensitivity", [(4.2308, 1), (3.0, 2), (0.8, 1)])
def test_epsilon_for_delta_is_tight_and_conservative(sigma, sensitivity):
    m = DiscreteGaussian(sigma, sensitivity=sensitivity, delta=1e-6)
    eps = m.epsilon_for_delta(1e-6)
    assert m.privacy.epsilon == eps and m.privacy.delta == 1e-6
    assert m.delta_for_epsilon(eps) <= 1e-6
    assert m.delta_for_epsilon(eps * (1 - 1e-8)) > 1e-6


def test_epsilon_is_zero_when_delta_exceeds_total_variation():
    m = DiscreteGaussian(100.0)
    tv = float(1 / mp_normaliser(100.0))  # delta(0) = P(-1/2 < Y <= 1/2) = p(0)
    assert m.epsilon_for_delta(1.5 * tv) == 0.0
    assert m.epsilon_for_delta(0.5 * tv) > 0.0


@pytest.mark.parametrize("epsilon, delta, sensitivity", [(1.0, 1e-6, 1), (0.5, 1e-5, 2), (3.0, 1e-9, 1)])
def test_from_privacy_calibrates_the_smallest_sigma(epsilon, delta, sensitivity):
    m = DiscreteGaussian.from_privacy(epsilon, delta, sensitivity=sensitivity)
    assert m.delta_for_epsilon(epsilon) <= delta
    assert m.epsilon <= epsilon and m.delta == delta
    smaller = DiscreteGaussian(m.sigma * (1 - 1e-8), sensitivity=sensitivity)
    assert smaller.delta_for_epsilon(epsilon) > delta
    if (epsilon, delta, sensitivity) == (1.0, 1e-6, 1):
        assert m.sigma == pytest.approx(4.2308, abs=5e-5)  # diffprivlib GaussianDiscrete (notes §2.6)


def test_rho_and_privacy_note():
    m = DiscreteGaussian(3.0, sensitivity=2, delta=1e-7, neighbour="substitution")
    assert m.zcdp_rho == pytest.approx(4 / 18)
    guarantee = m.privacy
    assert guarantee.neighbour == "substitution" and guarantee.sensitivity == 2
    assert "rho" in guarantee.note and "zCDP" in guarantee.note


@pytest.mark.parametrize("sigma", [0.5, 4.2308, 50.0])
@pytest.mark.parametrize("prob", [0.5, 0.9, 0.99])
def test_noise_interval_is_smallest(sigma, prob):
    m = DiscreteGaussian(sigma)
    lo, hi = m.noise_interval(prob)
    q = int(hi)
    z = mp_normaliser(sigma)

    def coverage(q):
        return 1 - 2 * mp_tail(q, sigma, z)

    assert lo == -hi and coverage(q) >= prob
    assert q == 0 or coverage(q - 1) < prob


def test_sup_beyond():
    m = DiscreteGaussian(2.5)
    for k in [0, 1, 4.5]:
        ys = np.concatenate([np.arange(-60, -k), np.arange(math.floor(k) + 1, 60)])
        ys = ys[np.abs(ys) > k]
        assert m.noise_log_sup_beyond(k) == pytest.approx(m.noise_logpdf(ys).max(), rel=1e-15)


def test_release_matches_law():
    sigma = 2.5
    m = DiscreteGaussian(sigma)
    truth = np.full(100_000, 3)
    noise = m.release(truth, np.random.default_rng(31)) - truth
    z = mp_normaliser(sigma)
    ys = np.arange(-40, 41)
    probs = np.array([float(mp_pmf(y, sigma, z)) for y in ys])
    assert chi_square_pvalue(noise, ys, probs) > 1e-3


def test_dist_matches_log_likelihood():
    m = DiscreteGaussian(1.7)
    x, r = np.meshgrid(np.arange(-3, 4), np.arange(-12, 13), indexing="ij")
    np.testing.assert_allclose(pm.logp(m.dist(x), r).eval(), m.log_likelihood(r, x), rtol=1e-12)


@pytest.mark.parametrize(
    "make, exc, word",
    [
        (lambda: DiscreteGaussian(0.0), ValueError, "sigma"),
        (lambda: DiscreteGaussian(-2.0), ValueError, "sigma"),
        (lambda: DiscreteGaussian(float("nan")), ValueError, "sigma"),
        (lambda: DiscreteGaussian("2"), TypeError, "sigma"),
        (lambda: DiscreteGaussian(2.0, delta=0.0), ValueError, "delta"),
        (lambda: DiscreteGaussian(2.0, delta=1.0), ValueError, "delta"),
        (lambda: DiscreteGaussian(2.0, delta=-0.1), ValueError, "delta"),
        (lambda: DiscreteGaussian(2.0, sensitivity=1.5), ValueError, "sensitivity"),
        (lambda: DiscreteGaussian(2.0, neighbour="any"), ValueError, "neighbour"),
        (lambda: DiscreteGaussian(2.0).delta_for_epsilon(0.0), ValueError, "epsilon"),
        (lambda: DiscreteGaussian(2.0).delta_for_epsilon(float("nan")), ValueError, "epsilon"),
        (lambda: DiscreteGaussian(2.0).epsilon_for_delta(1.5), ValueError, "delta"),
        (lambda: DiscreteGaussian.from_privacy(-1.0, 1e-6), ValueError, "epsilon"),
        (lambda: DiscreteGaussian.from_privacy(1.0, 0.0), ValueError, "delta"),
        (lambda: DiscreteGaussian(2.0).log_likelihood([0.5], [0]), ValueError, "release"),
        (lambda: DiscreteGaussian(2.0).log_likelihood([1, 2], [1, 2, 3]), ValueError, "shape"),
        (lambda: DiscreteGaussian(2.0).release([0.5], np.random.default_rng(0)), ValueError, "true_values"),
        (lambda: DiscreteGaussian(2.0).noise_log_sup_beyond(-1), ValueError, "k"),
    ],
)
def test_bad_arguments_name_the_argument(make, exc, word):
    with pytest.raises(exc, match=word):
        make()
