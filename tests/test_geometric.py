"""DoubleGeometric and ClampedGeometric (dpinfer.mechanisms.geometric) against closed forms,
mpmath sums, exact enumeration and seed 003's corrected G_{3,1/4} matrix.

Goodness-of-fit tests use fixed seeds, so they are deterministic (see test_exact_sampling)."""

import math
from fractions import Fraction

import mpmath
import numpy as np
import pymc as pm
import pytest
from test_exact_sampling import chi_square_pvalue

from dpinfer.mechanisms.geometric import ClampedGeometric, DoubleGeometric

MPMATH_DPS = 40  # mpmath precision of every test here (tests/conftest.py)


def mp_pmf(e, epsilon, sensitivity):
    """(1 - a)/(1 + a) a^|e| in mpmath, a = exp(-epsilon/sensitivity)."""
    a = mpmath.exp(-mpmath.mpf(epsilon) / sensitivity)
    return (1 - a) / (1 + a) * a ** abs(int(e))


# --- DoubleGeometric -------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon, sensitivity", [(0.5, 1), (math.log(4), 1), (0.9, 2), (0.05, 1)])
def test_double_geometric_pmf_cdf_and_variance(epsilon, sensitivity):
    m = DoubleGeometric(epsilon, sensitivity)
    a = mpmath.exp(-mpmath.mpf(epsilon) / sensitivity)
    ks = np.arange(-60, 61)
    want = np.array([float(mp_pmf(k, epsilon, sensitivity)) for k in ks])
    np.testing.assert_allclose(np.exp(m.noise_logpdf(ks)), want, rtol=1e-13)
    # total mass: the window plus the closed-form tails 2 a^61/(1 + a)
    total = mpmath.fsum(mp_pmf(k, epsilon, sensitivity) for k in ks) + 2 * a**61 / (1 + a)
    assert abs(total - 1) < 1e-30
    # cdf / sf against mpmath partial sums (both tails, far out)
    for k in [-200, -7, -1, 0, 3, 200]:
        left = 1 - a ** (k + 1) / (1 + a) if k >= 0 else a ** (-k) / (1 + a)
        assert m.noise_logcdf(k) == pytest.approx(float(mpmath.log(left)), rel=1e-13, abs=1e-15)
        assert m.noise_logsf(-k) == pytest.approx(float(mpmath.log(left)), rel=1e-13, abs=1e-15)
    assert m.noise_logcdf(2.5) == m.noise_logcdf(2)
    var = mpmath.nsum(lambda k: 2 * k**2 * (1 - a) / (1 + a) * a**k, [1, mpmath.inf])
    assert m.noise_variance == pytest.approx(float(var), rel=1e-13)
    assert m.noise_variance == pytest.approx(float(2 * a / (1 - a) ** 2), rel=1e-13)
    assert m.noise_logpdf(0.5) == -np.inf


@pytest.mark.parametrize("epsilon", [0.1, 0.5, math.log(4), 3.0])
@pytest.mark.parametrize("prob", [0.5, 0.9, 0.99])
def test_double_geometric_noise_interval_is_smallest(epsilon, prob):
    m = DoubleGeometric(epsilon)
    lo, hi = m.noise_interval(prob)
    q = int(hi)
    assert lo == -hi

    def coverage(q):
        a = mpmath.exp(-mpmath.mpf(epsilon))
        return 1 - 2 * a ** (q + 1) / (1 + a)

    assert coverage(q) >= prob
    assert q == 0 or coverage(q - 1) < prob
    np.testing.assert_array_equal(m.release_interval([3, 10], prob), ([3 - q, 10 - q], [3 + q, 10 + q]))


def test_double_geometric_sup_beyond():
    m = DoubleGeometric(0.7, 2)
    for k in [0, 1, 5]:
        beyond = m.noise_logpdf(np.concatenate([np.arange(-80, -k), np.arange(k + 1, 80)]))
        assert m.noise_log_sup_beyond(k) == pytest.approx(beyond.max(), rel=1e-14)
    np.testing.assert_allclose(m.log_likelihood_bound_outside([4, 9], 3), m.noise_logpdf(4))
    with pytest.raises(ValueError, match="k"):
        m.noise_log_sup_beyond(-1)


@pytest.mark.parametrize("sensitivity", [1, 2])
@pytest.mark.parametrize("epsilon", [0.3, math.log(4)])
def test_double_geometric_audit_equals_epsilon(epsilon, sensitivity):
    audit = DoubleGeometric(epsilon, sensitivity).audit()
    assert audit.measured_epsilon == pytest.approx(epsilon, rel=1e-12)
    assert audit.holds
    assert audit.measured_delta < 1e-15


def test_double_geometric_release_matches_law():
    m = DoubleGeometric(0.9, sensitivity=2)
    truth = np.full(100_000, 7)
    noise = m.release(truth, np.random.default_rng(11)) - truth
    ks = np.arange(-120, 121)
    probs = np.array([float(mp_pmf(k, 0.9, 2)) for k in ks])
    probs[[0, -1]] += float(mpmath.exp(-mpmath.mpf(0.9) / 2) ** 121 / (1 + mpmath.exp(-mpmath.mpf(0.9) / 2)))
    assert chi_square_pvalue(noise, ks, probs) > 1e-3


def test_double_geometric_dist_matches_log_likelihood():
    m = DoubleGeometric(0.5, sensitivity=2)
    x, r = np.meshgrid(np.arange(-3, 4), np.arange(-15, 16), indexing="ij")
    np.testing.assert_allclose(pm.logp(m.dist(x), r).eval(), m.log_likelihood(r, x), rtol=1e-12)


def test_double_geometric_utility():
    m = DoubleGeometric(0.5)
    np.testing.assert_array_equal(m.bias([1, 2]), [0.0, 0.0])
    np.testing.assert_allclose(m.mse([1, 2]), [m.noise_variance] * 2)
    assert m.privacy.epsilon == 0.5 and m.privacy.delta == 0.0
    assert m.alpha == pytest.approx(math.exp(-0.5)) and m.scale == 2.0


# --- ClampedGeometric --------------------------------------------------------------------------

# Seed 003 §7, the CORRECTED G_{3,1/4} (the paper's Table 1(b) omits the factor 3/5).
G_3_QUARTER = [
    [Fraction(4, 5), Fraction(3, 20), Fraction(3, 80), Fraction(1, 80)],
    [Fraction(1, 5), Fraction(3, 5), Fraction(3, 20), Fraction(1, 20)],
    [Fraction(1, 20), Fraction(3, 20), Fraction(3, 5), Fraction(1, 5)],
    [Fraction(1, 80), Fraction(3, 80), Fraction(3, 20), Fraction(4, 5)],
]


def range_restricted_matrix(n, alpha):
    """Seed 003 Definition 4 in exact fractions: alpha^|z-k|/(1+alpha) at z in {0, n},
    (1-alpha)/(1+alpha) alpha^|z-k| inside."""
    return [
        [alpha ** abs(z - k) / (1 + alpha) * (1 if z in (0, n) else 1 - alpha) for z in range(n + 1)]
        for k in range(n + 1)
    ]


def test_corrected_g_3_quarter_matrix():
    assert range_restricted_matrix(3, Fraction(1, 4)) == G_3_QUARTER
    mech = ClampedGeometric(epsilon=math.log(4), lower=0, upper=3)
    assert mech.noise.alpha == pytest.approx(0.25, rel=1e-15)
    g = mech.transition_matrix()
    np.testing.assert_allclose(g, np.array(G_3_QUARTER, dtype=float), rtol=1e-14)
    np.testing.assert_allclose(g.sum(axis=1), 1.0, rtol=1e-15)
    # shifted bounds give the same matrix (rows: true values lower..upper)
    np.testing.assert_allclose(ClampedGeometric(math.log(4), 10, 13).transition_matrix(), g, rtol=1e-14)


@pytest.mark.parametrize(
    "mech",
    [ClampedGeometric(0.8, 0, 5), ClampedGeometric(0.3, -2, 4, sensitivity=2), ClampedGeometric(1.2, 3, 4)],
    ids=["[0,5]", "[-2,4],sens2", "[3,4]"],
)
def test_clamped_pmf_sums_to_one_with_boundary_masses(mech):
    a = mpmath.exp(-mpmath.mpf(mech.epsilon) / mech.noise.sensitivity)
    xs = np.arange(mech.lower - 6, mech.upper + 7)
    rs = np.arange(mech.lower, mech.upper + 1)
    p = np.exp(mech.log_likelihood(rs[None, :], xs[:, None]))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-14)
    for i, x in enumerate(xs):
        lower_mass = a ** (x - mech.lower) / (1 + a) if x >= mech.lower else 1 - a ** (mech.lower - x + 1) / (1 + a)
        upper_mass = a ** (mech.upper - x) / (1 + a) if x <= mech.upper else 1 - a ** (x - mech.upper + 1) / (1 + a)
        assert p[i, 0] == pytest.approx(float(lower_mass), rel=1e-13)
        assert p[i, -1] == pytest.approx(float(upper_mass), rel=1e-13)
        for j, r in enumerate(rs[1:-1], start=1):
            assert p[i, j] == pytest.approx(float(mp_pmf(r - x, mech.epsilon, mech.noise.sensitivity)), rel=1e-13)


def test_one_sided_clamp_pmf_sums_to_one():
    mech = ClampedGeometric(0.7, lower=0)  # OpenDP's counts: max(0, x + e)
    a = mpmath.exp(-mpmath.mpf(0.7))
    assert np.exp(mech.log_likelihood(0, 0)) == pytest.approx(float(1 / (1 + a)), rel=1e-14)
    for x in [-3, 0, 4]:
        rs = np.arange(0, 201)
        window = mpmath.fsum(mpmath.exp(v) for v in mech.log_likelihood(rs, np.full(rs.shape, x)))
        tail = a ** (200 + 1 - x) / (1 + a)  # P(x + e >= 201)
        assert abs(window + tail - 1) < 1e-14


@pytest.mark.parametrize("sensitivity", [1, 2])
@pytest.mark.parametrize("upper", [3, 8, None, 1000], ids=["n=3", "n=8", "one-sided", "n=1000"])
def test_clamped_audit_equals_epsilon(upper, sensitivity):
    audit = ClampedGeometric(0.6, 0, upper, sensitivity=sensitivity).audit()
    assert audit.measured_epsilon == pytest.approx(0.6, rel=1e-12)
    assert audit.holds


@pytest.mark.parametrize(
    "mech, x, top",
    [(ClampedGeometric(0.8, 0, 5), 1, 5), (ClampedGeometric(0.5, 0, sensitivity=2), 2, 150)],
    ids=["finite", "one-sided"],
)
def test_clamped_release_matches_law(mech, x, top):
    draws = mech.release(np.full(100_000, x), np.random.default_rng(21))
    assert draws.min() >= mech.lower and (mech.upper is None or draws.max() <= mech.upper)
    rs = np.arange(mech.lower, top + 1)
    probs = np.exp(mech.log_likelihood(rs, np.full(rs.shape, x)))
    if mech.upper is None:
        probs[-1] = np.exp(mech.noise.noise_logsf(top - x))  # last cell: P(release >= top)
    assert chi_square_pvalue(draws, rs, probs) > 1e-3


@pytest.mark.parametrize(
    "mech", [ClampedGeometric(0.7, 0, 6), ClampedGeometric(0.7, 0, sensitivity=2), ClampedGeometric(1.1, -3, 4)]
)
def test_clamped_dist_matches_log_likelihood(mech):
    top = mech.upper if mech.upper is not None else 40
    x, r = np.meshgrid(np.arange(-5, 10), np.arange(mech.lower, top + 1), indexing="ij")
    np.testing.assert_allclose(pm.logp(mech.dist(x), r).eval(), mech.log_likelihood(r, x), rtol=1e-12)
    assert pm.logp(mech.dist(np.array([2])), np.array([mech.lower - 1])).eval()[0] == -np.inf


@pytest.mark.parametrize(
    "mech", [ClampedGeometric(0.7, 0, 6), ClampedGeometric(0.4, 0, sensitivity=2), ClampedGeometric(1.5, -2, 1)]
)
def test_clamped_bias_variance_against_exact_sums(mech):
    xs = np.arange(-8, 15)
    top = mech.upper if mech.upper is not None else 600
    rs = np.arange(mech.lower, top + 1)
    for x, bias, var, mse in zip(xs, mech.bias(xs), mech.variance(xs), mech.mse(xs)):
        p = [mpmath.exp(v) for v in mech.log_likelihood(rs, np.full(rs.shape, x))]
        mean = mpmath.fsum(pi * int(r) for pi, r in zip(p, rs))
        second = mpmath.fsum(pi * (int(r) - mean) ** 2 for pi, r in zip(p, rs))
        assert bias == pytest.approx(float(mean - x), rel=1e-11, abs=1e-13)
        assert var == pytest.approx(float(second), rel=1e-11, abs=1e-13)
        assert mse == pytest.approx(float(second + (mean - x) ** 2), rel=1e-11, abs=1e-13)


@pytest.mark.parametrize("mech", [ClampedGeometric(0.7, 0, 6), ClampedGeometric(0.4, 0)])
@pytest.mark.parametrize("prob", [0.5, 0.9])
def test_clamped_release_interval_is_smallest_symmetric(mech, prob):
    xs = np.arange(-3, 10)
    lo, hi = mech.release_interval(xs, prob)
    top = mech.upper if mech.upper is not None else 400

    def coverage(x, q):
        rs = np.arange(max(mech.lower, x - q), min(top, x + q) + 1)
        return np.exp(mech.log_likelihood(rs, np.full(rs.shape, x))).sum() if rs.size else 0.0

    for x, l, h in zip(xs, lo, hi):
        q = next(q for q in range(0, 200) if coverage(x, q) >= prob)  # brute-force smallest q
        assert (l, h) == (max(mech.lower, min(top, x - q)), min(top, max(mech.lower, x + q)))


def test_clamped_bound_outside_is_valid():
    mech = ClampedGeometric(0.6, 0, 8, sensitivity=2)
    for k in [0, 2, 5]:
        rs = np.arange(0, 9)
        general = mech.log_likelihood_bound_outside(rs, k)
        inside = mech.log_likelihood_bound_outside(rs, k, support=(0, 8))
        for r, g, w in zip(rs, general, inside):
            far = np.array([x for x in range(r - 300, r + 301) if abs(x - r) > k])
            sup_all = mech.log_likelihood(np.full(far.shape, r), far).max()
            near = far[(far >= 0) & (far <= 8)]
            assert sup_all <= g + 1e-12
            if near.size:
                assert mech.log_likelihood(np.full(near.shape, r), near).max() <= w + 1e-12
        assert general[4] == pytest.approx(mech.noise.noise_log_sup_beyond(k))  # interior: f(k+1)
        assert general[0] == 0.0 and inside[0] < 0  # boundary release


# --- argument errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, exc, word",
    [
        (lambda: DoubleGeometric(0), ValueError, "epsilon"),
        (lambda: DoubleGeometric(-1.0), ValueError, "epsilon"),
        (lambda: DoubleGeometric(float("nan")), ValueError, "epsilon"),
        (lambda: DoubleGeometric(float("inf")), ValueError, "epsilon"),
        (lambda: DoubleGeometric("1"), TypeError, "epsilon"),
        (lambda: DoubleGeometric(1.0, sensitivity=1.5), ValueError, "sensitivity"),
        (lambda: DoubleGeometric(1.0, sensitivity=0), ValueError, "sensitivity"),
        (lambda: DoubleGeometric(1.0, neighbour="bounded"), ValueError, "neighbour"),
        (lambda: ClampedGeometric(1.0, 5, 5), ValueError, "lower"),
        (lambda: ClampedGeometric(1.0, 6, 2), ValueError, "lower"),
        (lambda: ClampedGeometric(1.0, 0.5, 4), ValueError, "lower"),
        (lambda: ClampedGeometric(1.0, 0, 4.5), ValueError, "upper"),
        (lambda: ClampedGeometric(1.0, 0.5), ValueError, "lower"),
        (lambda: ClampedGeometric(float("nan"), 0), ValueError, "epsilon"),
        (lambda: ClampedGeometric(1.0, 0).transition_matrix(), ValueError, "upper"),
        (lambda: ClampedGeometric(1.0, 0, 5).log_likelihood([6], [3]), ValueError, "release"),
        (lambda: ClampedGeometric(1.0, 0, 5).log_likelihood([-1], [3]), ValueError, "release"),
        (lambda: ClampedGeometric(1.0, 0).log_likelihood([2.5], [3]), ValueError, "release"),
        (lambda: ClampedGeometric(1.0, 0, 5).log_likelihood([1, 2, 3], [1, 2]), ValueError, "shape"),
        (lambda: ClampedGeometric(1.0, 0, 5).bias([1.5]), ValueError, "true_values"),
        (lambda: ClampedGeometric(1.0, 0, 5).release([1.5], np.random.default_rng(0)), ValueError, "true_values"),
        (lambda: DoubleGeometric(1.0).log_likelihood([1.5], [1]), ValueError, "release"),
        (lambda: DoubleGeometric(1.0).log_likelihood([1, 2], [1, 2, 3]), ValueError, "shape"),
        (lambda: DoubleGeometric(1.0).noise_interval(1.0), ValueError, "prob"),
    ],
)
def test_bad_arguments_name_the_argument(make, exc, word):
    with pytest.raises(exc, match=word):
        make()
