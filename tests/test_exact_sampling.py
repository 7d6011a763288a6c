"""Exact samplers (dpinfer.mechanisms.exact_sampling) against their laws.

Every goodness-of-fit test draws >= 10^5 values from a fixed seed and runs a chi-square test
with cells pooled so that every expected count is >= 5; it asserts p > 1e-3. With the fixed
seed each test is deterministic (the same draws every run), so it cannot flake; the threshold
only documents that the observed draws are unremarkable under the stated law.
"""

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpinfer.mechanisms.exact_sampling import (
    sample_bernoulli,
    sample_bernoulli_exp,
    sample_discrete_gaussian,
    sample_discrete_laplace,
    sample_geometric_exp,
)

N_DRAWS = 100_000


def chi_square_pvalue(draws, support, probs, min_expected=5.0):
    """Chi-square goodness-of-fit p-value of integer ``draws`` against ``probs`` on the
    contiguous integer ``support``. Draws beyond the support's ends are counted in the end
    cells (callers make the support wide enough that the mass outside is < 1e-12). Adjacent
    cells are pooled left to right until each expected count is >= ``min_expected``."""
    draws = np.asarray(draws).ravel()
    support = np.asarray(support)
    probs = np.asarray(probs, dtype=float)
    assert np.all(np.diff(support) == 1)
    assert abs(probs.sum() - 1.0) < 1e-12, probs.sum()
    idx = np.clip(draws, support[0], support[-1]) - support[0]
    observed = np.bincount(idx, minlength=support.size).astype(float)
    expected = probs * draws.size
    cells_obs, cells_exp, acc_obs, acc_exp = [], [], 0.0, 0.0
    for o, e in zip(observed, expected):
        acc_obs, acc_exp = acc_obs + o, acc_exp + e
        if acc_exp >= min_expected:
            cells_obs.append(acc_obs)
            cells_exp.append(acc_exp)
            acc_obs = acc_exp = 0.0
    cells_obs[-1] += acc_obs
    cells_exp[-1] += acc_exp
    assert len(cells_obs) >= 2
    cells_exp = np.array(cells_exp)
    cells_exp *= draws.size / cells_exp.sum()  # remove the < 1e-12 rounding of the pooled sum
    return stats.chisquare(cells_obs, cells_exp).pvalue


# --- references ---------------------------------------------------------------------------


def discrete_laplace_probs(scale, half_width):
    """(1 - a)/(1 + a) a^|k| with a = exp(-1/scale), from the exact rational scale in mpmath."""
    mpmath.mp.dps = 30
    a = mpmath.exp(-1 / mpmath.mpf(Fraction(scale).numerator) * Fraction(scale).denominator)
    ks = np.arange(-half_width, half_width + 1)
    probs = [(1 - a) / (1 + a) * a ** abs(int(k)) for k in ks]
    return ks, np.array([float(p) for p in probs])


def discrete_gaussian_probs(sigma, half_width):
    """exp(-k^2/(2 sigma^2)) / Z with Z summed by mpmath over all integers (sigma exact)."""
    mpmath.mp.dps = 30
    s = Fraction(sigma)
    sigma2 = mpmath.mpf(s.numerator) ** 2 / mpmath.mpf(s.denominator) ** 2
    z = mpmath.nsum(lambda k: mpmath.exp(-(k**2) / (2 * sigma2)), [-mpmath.inf, mpmath.inf])
    ks = np.arange(-half_width, half_width + 1)
    return ks, np.array([float(mpmath.exp(-(int(k) ** 2) / (2 * sigma2)) / z) for k in ks])


# --- Bernoulli -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [Fraction(3, 7), 0.1, Fraction(1, 3) + Fraction(1, 2**80), Fraction(2**70 - 1, 2**70)],
    ids=["3/7", "float-0.1", "big-denominator", "near-one-big"],
)
def test_bernoulli_matches_law(p):
    draws = sample_bernoulli(p, N_DRAWS, np.random.default_rng(101))
    assert draws.dtype == bool and draws.shape == (N_DRAWS,)
    q = float(Fraction(p))
    if q > 0.999:  # too few failures for a chi-square cell: binomial tail check instead
        assert stats.binomtest(int((~draws).sum()), N_DRAWS, 1 - q).pvalue > 1e-3
        return
    assert chi_square_pvalue(draws.astype(int), [0, 1], [1 - q, q]) > 1e-3


def test_bernoulli_degenerate():
    rng = np.random.default_rng(0)
    assert not sample_bernoulli(0, 1000, rng).any()
    assert sample_bernoulli(1, 1000, rng).all()
    assert sample_bernoulli_exp(0, 1000, rng).all()


@pytest.mark.parametrize(
    "gamma",
    [Fraction(1, 3), 1, Fraction(5, 2), 0.7, 7, Fraction(10**30 + 7, 10**30)],
    ids=["1/3", "1", "5/2", "float-0.7", "7", "big-ints"],
)
def test_bernoulli_exp_matches_law(gamma):
    draws = sample_bernoulli_exp(gamma, N_DRAWS, np.random.default_rng(202))
    q = float(mpmath.exp(-mpmath.mpf(Fraction(gamma).numerator) / Fraction(gamma).denominator))
    assert chi_square_pvalue(draws.astype(int), [0, 1], [1 - q, q]) > 1e-3


# --- geometric and discrete Laplace ------------------------------------------------------------


@pytest.mark.parametrize("gamma", [Fraction(1, 2), Fraction(3, 7), 2.5, Fraction(1, 20)])
def test_geometric_matches_law(gamma):
    draws = sample_geometric_exp(gamma, N_DRAWS, np.random.default_rng(303))
    assert draws.dtype == np.int64 and draws.min() >= 0
    g = float(Fraction(gamma))
    ks = np.arange(0, int(60 / g) + 1)
    probs = -np.expm1(-g) * np.exp(-g * ks)
    probs[-1] = np.exp(-g * ks[-1])  # last cell = P(K >= k_max)
    assert chi_square_pvalue(draws, ks, probs) > 1e-3


@pytest.mark.parametrize(
    "scale",
    [Fraction(1, 2), 2, 1 / 0.3, Fraction(1) / Fraction(0.3), 25, Fraction(2**64 + 1, 2**63)],
    ids=["1/2", "2", "float-1/0.3", "exact-1/0.3", "25", "denominator>2**62"],
)
def test_discrete_laplace_matches_law(scale):
    draws = sample_discrete_laplace(scale, N_DRAWS, np.random.default_rng(404))
    assert draws.dtype == np.int64
    ks, probs = discrete_laplace_probs(scale, int(40 * float(scale)) + 5)
    assert chi_square_pvalue(draws, ks, probs) > 1e-3


# --- discrete Gaussian -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma", [0.5, 1, Fraction(7, 3), 3, 4.2308, 30.7], ids=["0.5", "1", "7/3", "3", "4.2308", "30.7"]
)
def test_discrete_gaussian_matches_law(sigma):
    draws = sample_discrete_gaussian(sigma, N_DRAWS, np.random.default_rng(505))
    assert draws.dtype == np.int64
    ks, probs = discrete_gaussian_probs(sigma, int(10 * float(sigma)) + 10)
    assert chi_square_pvalue(draws, ks, probs) > 1e-3


def test_discrete_gaussian_tiny_sigma_is_almost_surely_zero():
    draws = sample_discrete_gaussian(1e-3, 10_000, np.random.default_rng(6))
    assert np.all(draws == 0)  # P(k != 0) ~ 2 exp(-5e5)


# --- shapes, reproducibility, arguments -------------------------------------------------------


def test_shapes_and_reproducibility():
    a = sample_discrete_gaussian(2.5, (3, 4), np.random.default_rng(7))
    b = sample_discrete_gaussian(2.5, (3, 4), np.random.default_rng(7))
    assert a.shape == (3, 4) and a.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    assert sample_discrete_laplace(2, 0, np.random.default_rng(7)).shape == (0,)
    assert sample_bernoulli_exp(Fraction(1, 2), (), np.random.default_rng(7)).shape == ()


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda r: sample_discrete_laplace(0, 5, r), ValueError, "scale"),
        (lambda r: sample_discrete_laplace(-1.5, 5, r), ValueError, "scale"),
        (lambda r: sample_discrete_laplace(float("nan"), 5, r), ValueError, "scale"),
        (lambda r: sample_discrete_laplace(float("inf"), 5, r), ValueError, "scale"),
        (lambda r: sample_discrete_laplace(2.0**41, 5, r), ValueError, "scale"),
        (lambda r: sample_discrete_laplace(True, 5, r), TypeError, "scale"),
        (lambda r: sample_discrete_laplace("2", 5, r), TypeError, "scale"),
        (lambda r: sample_discrete_gaussian(0.0, 5, r), ValueError, "sigma"),
        (lambda r: sample_discrete_gaussian(-1, 5, r), ValueError, "sigma"),
        (lambda r: sample_bernoulli(Fraction(3, 2), 5, r), ValueError, "p"),
        (lambda r: sample_bernoulli_exp(-1, 5, r), ValueError, "gamma"),
        (lambda r: sample_geometric_exp(0, 5, r), ValueError, "gamma"),
        (lambda r: sample_discrete_laplace(2, -1, r), ValueError, "size"),
        (lambda r: sample_discrete_laplace(2, 2.5, r), TypeError, "size"),
        (lambda r: sample_discrete_laplace(2, 5, np.random.RandomState(0)), TypeError, "rng"),
    ],
)
def test_bad_arguments_name_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call(np.random.default_rng(0))
