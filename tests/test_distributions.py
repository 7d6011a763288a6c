"""DiscreteLaplace and DiscreteGaussian against independent references: closed forms and direct
sums evaluated in mpmath (40 digits), never scipy (inaccurate in the tails, reference notes §5(b)
item 13)."""

from __future__ import annotations

import functools
import math

import mpmath as mp
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pymc.testing import (
    Domain,
    assert_support_point_is_expected,
    check_logccdf,
    check_logcdf,
    check_logp,
    check_selfconsistency_discrete_logcdf,
)
from scipy import stats

from dpinfer.distributions import (
    DiscreteGaussian,
    DiscreteLaplace,
    discrete_gaussian_log_normaliser,
    discrete_gaussian_variance,
)

MPMATH_DPS = 40  # mpmath precision of every test here (tests/conftest.py)
INF = np.inf

# Integer domains with unbounded edges must list +-inf explicitly (reference notes §5(b) 12).
VALUES = Domain([-INF, -150, -9, -1, 0, 2, 8, 40, 500, INF], "int64")
MU = Domain([-INF, -4, 0, 7, INF], "int64")
SCALE = Domain([0, 0.3, 0.9, 1.0, 3.7, 25.0, INF], "float64")
# check_selfconsistency_discrete_logcdf sums pmfs from the lower edge: it must be finite, and
# the mass below it negligible: the edge is >= 396 / 3.7 = 107 scale units below every mu used.
VALUES_FROM_EDGE = Domain([-400, -8, -1, 0, 3, 12], "int64")
MU_SMALL = Domain([-INF, -4, 7, INF], "int64")
SCALE_SMALL = Domain([0, 0.6, 3.7, INF], "float64")


# --- references ---------------------------------------------------------------------------
def dl_ref_logpmf(value, mu, b):
    a = mp.exp(-1 / mp.mpf(float(b)))
    return float(mp.log((1 - a) / (1 + a)) - abs(int(value) - int(mu)) / mp.mpf(float(b)))


def _dl_ref_tails(value, mu, b):
    """(P(Y <= value), P(Y > value)) from the closed-form geometric series, in mpmath."""
    a = mp.exp(-1 / mp.mpf(float(b)))
    j = math.floor(value - mu)
    if j < 0:
        low = a ** (-j) / (1 + a)
        return low, 1 - low
    high = a ** (j + 1) / (1 + a)
    return 1 - high, high


def dl_ref_logcdf(value, mu, b):
    return float(mp.log(_dl_ref_tails(value, mu, b)[0]))


def dl_ref_logccdf(value, mu, b):
    return float(mp.log(_dl_ref_tails(value, mu, b)[1]))


def _dg_reach(sigma):
    """Terms beyond this distance from the mode are below exp(-98) of the largest one, and
    their total is below 1e-40 of the sum (the 40 digits mpmath carries)."""
    return math.ceil(14 * sigma) + 40


@functools.lru_cache(maxsize=None)
def _dg_terms_sum(lo, hi, sigma):
    s2 = 2 * mp.mpf(sigma) ** 2
    return mp.fsum(mp.exp(-mp.mpf(k) ** 2 / s2) for k in range(lo, hi + 1))


def _dg_log_z(sigma):
    n = _dg_reach(sigma)
    return mp.log(_dg_terms_sum(-n, n, sigma))


def dg_ref_logpmf(value, mu, sigma):
    k = mp.mpf(int(value) - int(mu))
    return float(-(k**2) / (2 * mp.mpf(float(sigma)) ** 2) - _dg_log_z(float(sigma)))


def dg_ref_logcdf(value, mu, sigma):
    """Direct sum of the pmf over every integer <= value with non-negligible mass."""
    sigma, j = float(sigma), math.floor(value - mu)
    return float(mp.log(_dg_terms_sum(min(j, 0) - _dg_reach(sigma), j, sigma)) - _dg_log_z(sigma))


def dg_ref_logccdf(value, mu, sigma):
    sigma, j = float(sigma), math.floor(value - mu)
    return float(mp.log(_dg_terms_sum(j + 1, max(j + 1, 0) + _dg_reach(sigma), sigma)) - _dg_log_z(sigma))


# --- compiled once per distribution: vector values, scalar parameters -----------------------
@functools.cache
def compiled(dist_cls):
    """(logp, logcdf, logccdf) of dist_cls.dist(mu, scale) at a vector of values."""
    value = pt.vector("value", dtype="int64")
    mu = pt.scalar("mu", dtype="int64")
    scale = pt.scalar("scale", dtype="float64")
    rv = dist_cls.dist(mu, scale)
    outs = [pm.logp(rv, value), pm.logcdf(rv, value), pm.logccdf(rv, value)]
    fn = pytensor.function([value, mu, scale], outs)
    return lambda v, m, s: fn(np.asarray(v, dtype=np.int64), m, s)


DISTS = {
    "laplace": (DiscreteLaplace, dl_ref_logpmf, dl_ref_logcdf, dl_ref_logccdf, "b"),
    "gaussian": (DiscreteGaussian, dg_ref_logpmf, dg_ref_logcdf, dg_ref_logccdf, "sigma"),
}


@pytest.mark.parametrize("name", DISTS)
def test_pymc_testing_checks(name):
    dist_cls, ref_logp, ref_logcdf, ref_logccdf, scale = DISTS[name]
    params = {"mu": MU, scale: SCALE}
    # Absolute tolerance 1.5e-8 on log values as large as 1.4e6 in magnitude.
    check_logp(dist_cls, VALUES, params, lambda value, mu, **kw: ref_logp(value, mu, kw[scale]), decimal=8, n_samples=-1)
    check_logcdf(dist_cls, VALUES, params, lambda value, mu, **kw: ref_logcdf(value, mu, kw[scale]), decimal=8, n_samples=-1)
    check_logccdf(dist_cls, VALUES, params, lambda value, mu, **kw: ref_logccdf(value, mu, kw[scale]), decimal=8, n_samples=-1)
    check_selfconsistency_discrete_logcdf(
        dist_cls, VALUES_FROM_EDGE, {"mu": MU_SMALL, scale: SCALE_SMALL}, decimal=10, n_samples=-1
    )


@pytest.mark.parametrize("name", DISTS)
@pytest.mark.parametrize("mu, scale", [(0, 0.3), (5, 1.0), (-3, 2.7), (12, 40.0)])
def test_pmf_sums_to_one_and_cdfs_are_cumulative_sums(name, mu, scale):
    fn = compiled(DISTS[name][0])
    reach = math.ceil(60 * scale) + 30  # mass outside below exp(-30)
    ks = np.arange(mu - reach, mu + reach + 1)
    logp, logcdf, logccdf = fn(ks, mu, scale)
    pmf = np.exp(logp)
    assert math.fsum(pmf) == pytest.approx(1.0, abs=2e-15)
    below = np.cumsum(pmf)  # P(Y <= k) less the (< e^-30) mass left of the window
    above = np.append(np.cumsum(pmf[::-1])[::-1][1:], 0.0)  # P(Y > k), same caveat on the right
    for got, ref in ((logcdf, below), (logccdf, above)):
        np.testing.assert_allclose(np.exp(got), ref, rtol=0, atol=1e-14)  # cumsum rounding
        big = ref > 1e-12  # where the mass outside the window is relatively negligible
        np.testing.assert_allclose(got[big], np.log(ref[big]), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(np.exp(logcdf) + np.exp(logccdf), 1.0, rtol=1e-15, atol=0)


def test_discrete_laplace_far_tail_exact():
    fn = compiled(DiscreteLaplace)
    _, logcdf, logccdf = fn([60, -61], 0, 1.0)
    # -61 - log(1 + e^-1), the closed form (reference notes §3.2(b)); scipy gives -inf here.
    assert logccdf[0] == pytest.approx(-61.31326168751822, rel=1e-15)
    assert logcdf[1] == pytest.approx(-61.31326168751822, rel=1e-15)
    _, logcdf, logccdf = fn([4000, -4000], 10, 0.5)
    np.testing.assert_allclose(logccdf[0], dl_ref_logccdf(4000, 10, 0.5), rtol=1e-14)
    np.testing.assert_allclose(logcdf[1], dl_ref_logcdf(-4000, 10, 0.5), rtol=1e-14)


@pytest.mark.parametrize("sigma", [0.4, 2.0, 50.0])
def test_discrete_gaussian_far_tails_match_mpmath(sigma):
    fn = compiled(DiscreteGaussian)
    ks = np.array([-1, 0, 1, 3, 25, 200, 2000]) * max(1, round(sigma))
    logp, logcdf, logccdf = fn(np.concatenate([ks, -ks]), 0, sigma)
    ref_ccdf = [dg_ref_logccdf(k, 0, sigma) for k in ks]
    np.testing.assert_allclose(logccdf[: len(ks)], ref_ccdf, rtol=1e-13)
    # By symmetry P(Y <= -k - 1) = P(Y > k).
    _, logcdf_sym, _ = fn(-ks - 1, 0, sigma)
    np.testing.assert_allclose(logcdf_sym, ref_ccdf, rtol=1e-13)
    np.testing.assert_allclose(logp[: len(ks)], [dg_ref_logpmf(k, 0, sigma) for k in ks], rtol=1e-14)


@pytest.mark.parametrize("sigma", [0.05, 0.3, 0.7, 0.999, 1.0, 1.5, 4.2, 100.0, 1500.0])
def test_discrete_gaussian_log_normaliser_matches_mpmath(sigma):
    j = np.arange(1, _dg_reach(sigma))
    s2 = 2 * mp.mpf(sigma) ** 2
    ref = mp.log1p(2 * mp.fsum(mp.exp(-mp.mpf(int(k)) ** 2 / s2) for k in j))
    # Relative 1e-15, except sigma = 0.05 where log Z = 2 e^{-200} inherits the 2e-14 relative
    # rounding of exp(-1 / (2 sigma^2)) at argument -200.
    rtol = 5e-14 if sigma < 0.1 else 1e-15
    assert discrete_gaussian_log_normaliser(sigma) == pytest.approx(float(ref), rel=rtol)
    var_ref = 2 * mp.fsum(mp.mpf(int(k)) ** 2 * mp.exp(-mp.mpf(int(k)) ** 2 / s2) for k in j) / mp.exp(ref)
    assert discrete_gaussian_variance(sigma) == pytest.approx(float(var_ref), rel=1e-13)


def _chi_square_pvalue(draws, log_pmf_fn, mu, scale):
    """Chi-square goodness of fit, cells with expected count < 20 pooled into the two tails."""
    n = draws.size
    ks = np.arange(draws.min(), draws.max() + 1)
    expected = n * np.exp(log_pmf_fn(ks, mu, scale)[0])
    observed = np.bincount(draws - ks[0], minlength=ks.size).astype(float)
    inner = np.flatnonzero(expected >= 20)
    lo, hi = inner[0], inner[-1]
    # Pooled tails take the exact tail probabilities, including values never drawn.
    _, logcdf, logccdf = log_pmf_fn(np.array([ks[lo] - 1, ks[hi]]), mu, scale)
    exp_cells = np.concatenate([[n * np.exp(logcdf[0])], expected[lo : hi + 1], [n * np.exp(logccdf[1])]])
    obs_cells = np.concatenate([[observed[:lo].sum()], observed[lo : hi + 1], [observed[hi + 1 :].sum()]])
    return stats.chisquare(obs_cells, exp_cells).pvalue


@pytest.mark.parametrize(
    "dist_cls, mus, scales",
    [(DiscreteLaplace, [3, -20], [2.0, 0.4]), (DiscreteGaussian, [3, -20], [0.7, 4.5])],
)
def test_draws_match_the_law(dist_cls, mus, scales):
    n = 150_000
    draws = pm.draw(dist_cls.dist(np.array(mus), np.array(scales), size=(n, 2)), random_seed=20240607)
    assert draws.dtype == np.int64 and draws.shape == (n, 2)
    fn = compiled(dist_cls)
    for col, (mu, scale) in enumerate(zip(mus, scales)):
        assert _chi_square_pvalue(draws[:, col], fn, mu, scale) > 1e-3
    # Without size, each entry of a batched location gets its own noise.
    batch = pm.draw(dist_cls.dist(np.zeros(4000, dtype=np.int64), 3.0), random_seed=7)
    assert batch.shape == (4000,) and np.unique(batch).size > 10


@pytest.mark.parametrize("name", DISTS)
def test_truncated_and_censored(name):
    dist_cls, ref_logp, ref_logcdf, ref_logccdf, _ = DISTS[name]
    mu, scale, lower, upper = 3, 1.7, 0, 10
    ks = np.arange(lower - 3, upper + 4)
    value = pt.vector("value", dtype="int64")
    base = dist_cls.dist(mu, scale)
    trunc = pm.Truncated.dist(base, lower=lower, upper=upper)
    cens = pm.Censored.dist(base, lower=lower, upper=upper)
    # A far-tail lower truncation: its normaliser is logccdf(30 - 1), about e^-150.
    tail = pm.Truncated.dist(dist_cls.dist(0, 1.0), lower=30)
    fn = pytensor.function([value], [pm.logp(trunc, value), pm.logp(cens, value), pm.logp(tail, value + 27)])
    log_trunc, log_cens, log_tail = fn(ks)
    inside = (ks >= lower) & (ks <= upper)

    ref_pmf = np.array([math.exp(ref_logp(k, mu, scale)) for k in ks])
    mass_inside = math.exp(ref_logcdf(upper, mu, scale)) - math.exp(ref_logcdf(lower - 1, mu, scale))
    assert math.fsum(np.exp(log_trunc)) == pytest.approx(1.0, abs=1e-14)
    assert np.all(np.isneginf(log_trunc[~inside]))
    np.testing.assert_allclose(np.exp(log_trunc[inside]), ref_pmf[inside] / mass_inside, rtol=1e-12)

    cens_ref = np.where(inside, ref_pmf, 0.0)
    cens_ref[ks == lower] = math.exp(ref_logcdf(lower, mu, scale))
    cens_ref[ks == upper] = math.exp(ref_logccdf(upper - 1, mu, scale))
    assert math.fsum(np.exp(log_cens)) == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(np.exp(log_cens), cens_ref, rtol=1e-12, atol=0)

    tail_vals = ks + 27  # 24 .. 40
    ref_tail = [
        ref_logp(k, 0, 1.0) - ref_logccdf(29, 0, 1.0) if k >= 30 else -np.inf for k in tail_vals
    ]
    np.testing.assert_allclose(log_tail, ref_tail, rtol=1e-12)


def test_latent_poisson_location_in_a_model():
    with pm.Model() as model:
        x = pm.Poisson("x", np.float64(10.0))  # a bare 10.0 would become a float32 constant
        DiscreteLaplace("y", mu=x, b=2.0, observed=12)
        DiscreteGaussian("z", mu=x, sigma=1.5, observed=13)
    got = model.compile_logp()({"x": 11})
    expected = stats.poisson.logpmf(11, 10.0) + dl_ref_logpmf(12, 11, 2.0) + dg_ref_logpmf(13, 11, 1.5)
    assert got == pytest.approx(expected, rel=1e-13)


@pytest.mark.parametrize("dist_cls", [DiscreteLaplace, DiscreteGaussian])
def test_parameters_are_checked_and_cast(dist_cls):
    rv = dist_cls.dist(np.array([1, 4]), 2.5)  # 2.5 is exact in float32: must stay float64
    assert [inp.type.dtype for inp in rv.owner.inputs[2:]] == ["int64", "float64"]
    with pytest.raises(TypeError, match="mu"):
        dist_cls.dist(pt.scalar("m", dtype="float64"), 1.0)
    with pytest.raises(ValueError, match="mu"):
        dist_cls.dist(2.5, 1.0)
    with pm.Model() as model:
        dist_cls("x", np.array([1, -5]), 2.0)
    assert_support_point_is_expected(model, np.array([1, -5]))
