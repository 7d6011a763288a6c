"""NormalLaplace (the release law of a normal latent under the Laplace mechanism) and the exact
latent draws given a Laplace or Gaussian release, against independent references: the
convolution and posterior integrals by mpmath quadrature, closed-form truncated normals and
the conjugate normal update; Monte Carlo checks with fixed seeds and tolerances of 4.5
standard errors."""

from __future__ import annotations

import functools
import math

import mpmath as mp
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pymc.logprob.utils import ParameterValueError
from pymc.testing import assert_support_point_is_expected
from scipy import integrate, stats
from scipy.special import log_ndtr

from dpinfer.distributions.normal_laplace import (
    NormalLaplace,
    draw_normal_given_gaussian_release,
    draw_normal_given_laplace_release,
    normal_laplace_logpdf,
)

MPMATH_DPS = 20  # mpmath precision of every test here (tests/conftest.py)
Z_TOL = 4.5  # Monte Carlo tolerance, in standard errors


# --- mpmath quadrature of the convolution y ~ N(mu, sigma^2), s = y + Laplace(0, b) -------
def _log_joint(s, mu, sigma, b):
    """log of N(y; mu, sigma^2) * exp(-|s - y|/b) / (2b), as a function of y (mpmath)."""
    s, mu, sigma, b = (mp.mpf(float(x)) for x in (s, mu, sigma, b))
    const = mp.log(2 * b * sigma * mp.sqrt(2 * mp.pi))
    return lambda y: -((y - mu) ** 2) / (2 * sigma**2) - abs(s - y) / b - const


def _quad(log_h, lo, hi, centre, sigma, weight=None):
    """(log peak, integral of exp(log_h - log peak) * weight) over [lo, hi], log_h concave and
    Gaussian-like with scale sigma and unconstrained maximum at ``centre``.

    mpmath's quad stops on an absolute error below 10^-dps, so the integrand is divided by its
    maximum on the interval. Breakpoints: +-1, 4, 16 sigma about an interior maximum; for a
    maximum at an end point, multiples 1, 4, 16, 64 of the decay length there,
    min(sigma, sigma^2 / distance to the centre)."""
    centre, sigma = mp.mpf(centre), mp.mpf(sigma)
    mode = min(max(centre, lo), hi)
    if mode == centre:
        pts = [mode + k * sigma for k in (-16, -4, -1, 0, 1, 4, 16)]
    else:
        w = min(sigma, sigma**2 / abs(centre - mode))
        sign = 1 if mode == lo else -1
        pts = [mode + sign * k * w for k in (1, 4, 16, 64)]
    pts = [lo] + sorted(p for p in pts if lo < p < hi) + [hi]
    peak = log_h(mode)
    weight = weight or (lambda y: 1)
    value, err = mp.quad(lambda y: mp.exp(log_h(y) - peak) * weight(y), pts, error=True)
    assert abs(err) <= 1e-15 * abs(value) + mp.mpf(10) ** -25
    return peak, value


def _pieces(s, mu, sigma, b, weight=None, upper=None):
    """(log peak, integral) of the joint times ``weight`` over y < min(s, upper) and over
    s < y < upper: the left piece has its maximum towards mu + sigma^2/b, the right one towards
    mu - sigma^2/b."""
    log_g = _log_joint(s, mu, sigma, b)
    s_, shift = mp.mpf(float(s)), mp.mpf(float(sigma)) ** 2 / float(b)
    hi = mp.inf if upper is None else mp.mpf(float(upper))
    out = [_quad(log_g, -mp.inf, min(s_, hi), mu + shift, sigma, weight)]
    if hi > s_:
        out.append(_quad(log_g, s_, hi, mu - shift, sigma, weight))
    return out


def _ratio(num, den):
    """sum(e^peak * integral) over ``num`` divided by the same over ``den`` (signed)."""
    top = max(p for p, _ in den)
    total = lambda pieces: mp.fsum(mp.exp(p - top) * v for p, v in pieces)  # noqa: E731
    return total(num) / total(den), top + mp.log(total(den))


def ref_logpdf(s, mu, sigma, b) -> float:
    pieces = _pieces(s, mu, sigma, b)
    return float(_ratio(pieces, pieces)[1])


def ref_posterior_moments(s, mu, sigma, b):
    """(mean, variance, fourth central moment) of y | s, by quadrature about c = s."""
    c = mp.mpf(float(s))
    den = _pieces(s, mu, sigma, b)
    m1, m2, m3, m4 = (_ratio(_pieces(s, mu, sigma, b, lambda y, k=k: (y - c) ** k), den)[0] for k in (1, 2, 3, 4))
    var = m2 - m1**2
    mu4 = m4 - 4 * m1 * m3 + 6 * m1**2 * m2 - 3 * m1**4
    return float(c + m1), float(var), float(mu4)


def ref_posterior_cdf(y, s, mu, sigma, b) -> float:
    return float(_ratio(_pieces(s, mu, sigma, b, upper=y), _pieces(s, mu, sigma, b))[0])


# --- closed-form posterior cdf (mixture of truncated normals), for KS tests ----------------
def mixture_cdf(s, mu, sigma, b):
    """P(Y <= y | S = s): weights e^A, e^B from scipy's log_ndtr; the left component
    N(mu + sigma^2/b, sigma^2) on (-inf, s], the right one N(mu - sigma^2/b, sigma^2) on
    [s, inf), each tail ratio taken in log space."""
    z, r = (s - mu) / sigma, sigma / b
    log_a = r * r / 2 - z * r + log_ndtr(z - r)
    log_b = r * r / 2 + z * r + log_ndtr(-z - r)
    w_left = math.exp(log_a - np.logaddexp(log_a, log_b))
    c_left, c_right = z - r, z + r  # (s - mean)/sigma of each component

    def cdf(y):
        y = np.asarray(y, dtype=float)
        u_left = (np.minimum(y, s) - mu) / sigma - r
        left = np.exp(log_ndtr(u_left) - log_ndtr(c_left))
        u_right = (np.maximum(y, s) - mu) / sigma + r
        right = np.where(y < s, 0.0, -np.expm1(log_ndtr(-u_right) - log_ndtr(-c_right)))
        return w_left * left + (1 - w_left) * right

    return cdf


# --- the law --------------------------------------------------------------------------------
SCALES = [(1.0, 1.0), (0.01, 1.0), (1.0, 0.01), (100.0, 1.0), (2.5, 0.7)]  # sigma/b from 0.01 to 100
OFFSETS = [0.0, 0.3, -1.0, 3.0, -7.0, 40.0, -40.0]  # in units of sigma and of b


def _grid():
    rows = []
    for sigma, b in SCALES:
        for u in OFFSETS:
            for unit in (sigma, b):
                rows.append((1.5 + u * unit, 1.5, sigma, b))
    return np.unique(np.array(rows), axis=0)


GRID = _grid()
with mp.workdps(MPMATH_DPS):  # computed at import, outside the tests' precision fixture
    GRID_REF = np.array([ref_logpdf(*row) for row in GRID])


@functools.cache
def compiled(mode):
    """(logp, dlogp/dmu, dlogp/dsigma, dlogp/db) of NormalLaplace.dist(mu, sigma, b) at a
    vector of values, vector parameters (so each gradient entry belongs to one value)."""
    value, mu, sigma, b = (pt.vector(n, dtype="float64") for n in ("value", "mu", "sigma", "b"))
    logp = pm.logp(NormalLaplace.dist(mu, sigma, b), value)
    outs = [logp, *pt.grad(logp.sum(), [mu, sigma, b])]
    return pytensor.function([value, mu, sigma, b], outs, mode=mode)


def test_logpdf_matches_convolution_quadrature():
    # |log f - log f_ref| <= 1e-10 max(1, |log f_ref|): relative 1e-10 on f where |log f| <= 1,
    # and on log f beyond (|log f| reaches 805 here, whose float64 spacing is 1.1e-13).
    s, mu, sigma, b = GRID.T
    assert np.all(np.isfinite(GRID_REF)) and GRID_REF.min() < -800
    np.testing.assert_allclose(normal_laplace_logpdf(s, mu, sigma, b), GRID_REF, rtol=1e-10, atol=1e-10)
    # pm.logp compiled by numba (PyTensor 3's default backend).
    np.testing.assert_allclose(compiled("NUMBA")(s, mu, sigma, b)[0], GRID_REF, rtol=1e-10, atol=1e-10)
    # Scalar in, float out; broadcasting.
    assert isinstance(normal_laplace_logpdf(0.0, 0.0, 1.0, 1.0), float)
    assert normal_laplace_logpdf(np.zeros((3, 1)), np.zeros(4), 1.0, np.ones(4)).shape == (3, 4)


@pytest.mark.parametrize("mu, sigma, b", [(0.0, 1.0, 1.0), (-3.0, 0.05, 2.0), (10.0, 4.0, 0.1), (1.0, 0.7, 0.7)])
def test_density_integrates_to_one_with_mean_mu_and_variance(mu, sigma, b):
    f = lambda s: math.exp(normal_laplace_logpdf(s, mu, sigma, b))  # noqa: E731
    pieces = ((-np.inf, mu), (mu, np.inf))
    mass = sum(integrate.quad(f, lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0] for lo, hi in pieces)
    mean = sum(integrate.quad(lambda s: s * f(s), lo, hi, epsabs=1e-12, limit=200)[0] for lo, hi in pieces)
    var = sum(integrate.quad(lambda s: (s - mu) ** 2 * f(s), lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0]
              for lo, hi in pieces)
    assert mass == pytest.approx(1.0, abs=1e-10)
    assert mean == pytest.approx(mu, abs=1e-9 * (1 + abs(mu)))
    assert var == pytest.approx(sigma**2 + 2 * b**2, rel=1e-9)


def test_numba_mode_matches_python_mode_and_finite_differences():
    # PyTensor 3 compiles with numba by default; the Python backend (FAST_COMPILE: numpy and
    # scipy.special) is the comparison. (The C backend agrees too, but compiling the gradient
    # graph in C takes ~25 s on a cold cache.)
    rows = [(u, m, sg, bb) for m, sg, bb in [(0.0, 1.0, 1.0), (0.0, 1.0, 0.01), (0.0, 1.0, 100.0), (2.0, 0.3, 5.0)]
            for u in (-4000.0, -40.0, -1.0, 0.0, 0.5, 40.0, 4000.0)]
    args = [np.array(col) for col in zip(*rows)]
    s, mu, sigma, b = args
    res = {m: compiled(m)(*args) for m in ("NUMBA", "FAST_COMPILE")}
    # Gradients stay finite far in both tails (each switch branch gets a safe argument).
    assert all(np.all(np.isfinite(x)) for x in res["NUMBA"])
    logf = normal_laplace_logpdf(*args)
    np.testing.assert_allclose(res["NUMBA"][0], logf, rtol=1e-14, atol=1e-14)
    # Each gradient is a sum of terms of these sizes that cancel (for b -> 0, r^2/2 alone has
    # d/db = -sigma^2/b^3 = -1e6 here): backends agree to 1e-14 of them.
    d = np.abs(s - mu)
    sizes = [1 / b + d / sigma**2, sigma / b**2 + d**2 / sigma**3, d / b**2 + sigma**2 / b**3]
    np.testing.assert_allclose(res["FAST_COMPILE"][0], res["NUMBA"][0], rtol=1e-14, atol=1e-14)
    for got, ref, size in zip(res["NUMBA"][1:], res["FAST_COMPILE"][1:], sizes):
        np.testing.assert_array_less(np.abs(got - ref), 1e-14 * (np.abs(ref) + size))
    # Central differences of the numpy density, entry by entry.
    h = 1e-5 * np.minimum(sigma, b)  # (h / scale)^2 <= 1e-10: truncation negligible
    for i, grad in zip((1, 2, 3), res["NUMBA"][1:]):
        up, down = list(args), list(args)
        up[i], down[i] = args[i] + h, args[i] - h
        fd = (normal_laplace_logpdf(*up) - normal_laplace_logpdf(*down)) / (2 * h)
        roundoff = 4e-16 * (1 + np.abs(logf)) / h  # rounding of the two log densities
        np.testing.assert_array_less(np.abs(grad - fd), 1e-7 * np.abs(fd) + roundoff)


def test_observed_in_a_model_compiled_with_numba():
    data = np.array([3.1, -0.4, 7.7, 2.2, 60.0])
    with pm.Model() as model:
        # float64 arrays: Python literals such as 10.0 become float32 constants in PyTensor,
        # which puts pm.Normal's logp off by ~3e-8.
        mu = pm.Normal("mu", np.array(0.0), np.array(10.0))
        sigma = pm.HalfNormal("sigma", np.array(5.0))
        NormalLaplace("s", mu, sigma, 1.3, observed=data)
    point = {"mu": 2.0, "sigma_log__": math.log(1.7)}
    logp, dlogp = model.compile_fn([model.logp(), model.dlogp()], mode="NUMBA")(point)
    expected = (stats.norm.logpdf(2.0, 0, 10) + stats.halfnorm.logpdf(1.7, scale=5.0) + math.log(1.7)
                + normal_laplace_logpdf(data, 2.0, 1.7, 1.3).sum())
    assert logp == pytest.approx(expected, rel=1e-14)
    assert np.all(np.isfinite(dlogp))
    # d/dmu: the prior's -mu/100 plus the observed term's gradient (checked above).
    d_mu = compiled("NUMBA")(data, np.full(5, 2.0), np.full(5, 1.7), np.full(5, 1.3))[1].sum() - 2.0 / 100
    assert dlogp[0] == pytest.approx(d_mu, rel=1e-13)


def test_invalid_parameters_in_pymc_logp():
    sigma, b = pt.scalar("sigma", dtype="float64"), pt.scalar("b", dtype="float64")
    fn = pytensor.function([sigma, b], pm.logp(NormalLaplace.dist(0.0, sigma, b), 0.0))
    assert np.isfinite(fn(1.0, 1.0))
    for bad in [(-1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (1.0, -2.0)]:
        with pytest.raises(ParameterValueError, match="sigma > 0, b > 0"):
            fn(*bad)


def test_support_point_and_float64_parameters():
    with pm.Model() as model:
        NormalLaplace("x", mu=np.array([-2.0, 0.5, 4.0]), sigma=1.0, b=np.float32(0.5))
    assert_support_point_is_expected(model, np.array([-2.0, 0.5, 4.0]))
    with pm.Model() as model:
        NormalLaplace("x", mu=3.0, sigma=np.array([1.0, 2.0]), b=0.5)
    assert_support_point_is_expected(model, np.array([3.0, 3.0]))
    rv = NormalLaplace.dist(1.0, 2.0, 0.5)
    assert [inp.type.dtype for inp in rv.owner.inputs[2:]] == ["float64"] * 3
    assert rv.type.dtype == "float64"
    assert pm.draw(NormalLaplace.dist(np.zeros(3), 1.0, np.ones((2, 1))), random_seed=1).shape == (2, 3)


@pytest.mark.parametrize("mu, sigma, b", [(0.0, 1.0, 1.0), (5.0, 0.2, 3.0), (-2.0, 4.0, 0.25)])
def test_rv_draws_have_mean_mu_and_variance(mu, sigma, b):
    n = 200_000
    draws = pm.draw(NormalLaplace.dist(mu, sigma, b, size=n), random_seed=20240611 + int(10 * b))
    var = sigma**2 + 2 * b**2
    # Var of the sample variance: (mu4 - var^2)/n, mu4 = 3 var^2 + 12 b^4 (the Laplace
    # fourth cumulant; the normal's is zero).
    assert abs(draws.mean() - mu) <= Z_TOL * math.sqrt(var / n)
    assert abs(draws.var() - var) <= Z_TOL * math.sqrt((2 * var**2 + 12 * b**4) / n)
    assert stats.kstest(draws, release_cdf(mu, sigma, b)).pvalue > 1e-3


def release_cdf(mu, sigma, b):
    """P(S <= s) = Phi(z) - (e^A - e^B)/2 (Reed & Jorgensen 2004, with the Mills-ratio terms
    written as e^A, e^B); fine for KS tests, not in the far tails (cancellation)."""

    def cdf(s):
        z, r = (np.asarray(s) - mu) / sigma, sigma / b
        log_a = r * r / 2 - z * r + log_ndtr(z - r)
        log_b = r * r / 2 + z * r + log_ndtr(-z - r)
        return stats.norm.cdf(z) - (np.exp(log_a) - np.exp(log_b)) / 2

    return cdf


@pytest.mark.parametrize("mu, sigma, b", [(0.0, 1.0, 1.0), (5.0, 0.2, 3.0), (-2.0, 4.0, 0.25)])
def test_release_cdf_reference_matches_quadrature(mu, sigma, b):
    f = lambda s: math.exp(normal_laplace_logpdf(s, mu, sigma, b))  # noqa: E731
    cdf = release_cdf(mu, sigma, b)
    for x in mu + (sigma + b) * np.array([-6.0, -1.0, 0.0, 0.4, 3.0]):
        ref = integrate.quad(f, -np.inf, mu, epsabs=0, epsrel=1e-13)[0] + integrate.quad(f, mu, x, epsabs=1e-15)[0]
        assert float(cdf(x)) == pytest.approx(ref, abs=1e-12)


# --- exact posterior draws of the latent -------------------------------------------------
POSTERIOR_CASES = [
    (0.7, 0.0, 1.0, 1.0),  # both components matter
    (-4.0, 2.0, 0.5, 3.0),  # noise large: little truncation
    (1.2, 0.0, 3.0, 0.1),  # noise small (sigma/b = 30): y concentrates near s
    (30.0, 0.0, 1.0, 0.02),  # s - mu = 30 sigma, sigma/b = 50: both truncations deep (c = -20, 80)
    (-75.0, 5.0, 2.0, 0.5),  # s - mu = -40 sigma: left weight ~ e^-650, right ~ untruncated
    (30.0, 0.0, 1.0, 1.0),  # s - mu = 30 sigma, sigma/b = 1
]


@pytest.mark.parametrize("s, mu, sigma, b", POSTERIOR_CASES)
def test_laplace_posterior_draws_match_quadrature(s, mu, sigma, b):
    n = 200_000
    rng = np.random.default_rng(20240612)
    y = draw_normal_given_laplace_release(np.full(n, s), mu, sigma, b, rng)
    assert y.shape == (n,) and y.dtype == np.float64 and np.all(np.isfinite(y))
    mean, var, mu4 = ref_posterior_moments(s, mu, sigma, b)
    assert abs(y.mean() - mean) <= Z_TOL * math.sqrt(var / n)
    assert abs(y.var() - var) <= Z_TOL * math.sqrt((mu4 - var**2) / n)
    # The closed-form mixture cdf agrees with quadrature of the posterior, then KS against it.
    cdf = mixture_cdf(s, mu, sigma, b)
    for q in np.quantile(y, [0.02, 0.3, 0.7, 0.98]):
        assert float(cdf(q)) == pytest.approx(ref_posterior_cdf(q, s, mu, sigma, b), abs=1e-12)
    assert stats.kstest(y, cdf).pvalue > 1e-3


def test_laplace_posterior_draws_broadcast_and_stay_finite_far_out():
    rng = np.random.default_rng(7)
    s = np.array([[-1e4], [-40.0], [0.0], [35.0], [1e4]])  # (5, 1)
    sigma = np.array([1.0, 1.0, 1.0])  # (3,)
    b = np.array([100.0, 1.0, 0.01])  # sigma/b = 0.01, 1, 100
    y = draw_normal_given_laplace_release(s, 0.0, sigma, b, rng)
    assert y.shape == (5, 3) and np.all(np.isfinite(y))
    # sigma/b = 100: the left component is N(mu + sigma^2/b = 100, 1) truncated to y <= s, so
    # for 0 <= s < 100 y sits within a few b below s, and for s = 1e4 near 100 (the Laplace
    # tail is the heavier one); symmetrically for s < 0.
    np.testing.assert_array_less(np.abs(y[1:4, 2] - s[1:4, 0]), 0.2)
    np.testing.assert_array_less(np.abs(np.abs(y[[0, 4], 2]) - 100.0), 6.0)
    # sigma/b = 0.01 and |s| = 1e4 = 100 b: the prior dominates, y ~ N(-+0.01, 1).
    np.testing.assert_array_less(np.abs(y[[0, 4], 0]), 6.0)
    # Scalar input: a 0-d array.
    assert np.shape(draw_normal_given_laplace_release(1.0, 0.0, 1.0, 1.0, rng)) == ()
    # Reproducible given the generator's state.
    a = draw_normal_given_laplace_release(s, 0.0, sigma, b, np.random.default_rng(3))
    np.testing.assert_array_equal(a, draw_normal_given_laplace_release(s, 0.0, sigma, b, np.random.default_rng(3)))


@pytest.mark.parametrize("s, mu, sigma, tau", [(2.0, 0.0, 1.0, 1.0), (-30.0, 4.0, 0.3, 5.0), (1e3, 0.0, 50.0, 0.01)])
def test_gaussian_posterior_draws_match_conjugate_update(s, mu, sigma, tau):
    n = 200_000
    y = draw_normal_given_gaussian_release(np.full(n, s), mu, sigma, tau, np.random.default_rng(11))
    # Precision form of the conjugate update.
    prec = 1 / sigma**2 + 1 / tau**2
    mean, var = (mu / sigma**2 + s / tau**2) / prec, 1 / prec
    assert abs(y.mean() - mean) <= Z_TOL * math.sqrt(var / n)
    assert abs(y.var() - var) <= Z_TOL * var * math.sqrt(2 / n)
    assert stats.kstest(y, stats.norm(mean, math.sqrt(var)).cdf).pvalue > 1e-3
    shape = draw_normal_given_gaussian_release(np.zeros((2, 1)), np.zeros(3), 1.0, 2.0, np.random.default_rng(0)).shape
    assert shape == (2, 3)


# --- argument checks -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "call",
    [
        lambda s, mu, sigma, scale: normal_laplace_logpdf(s, mu, sigma, scale),
        lambda s, mu, sigma, scale: draw_normal_given_laplace_release(s, mu, sigma, scale, np.random.default_rng(0)),
        lambda s, mu, sigma, scale: draw_normal_given_gaussian_release(s, mu, sigma, scale, np.random.default_rng(0)),
    ],
    ids=["logpdf", "laplace_draws", "gaussian_draws"],
)
def test_bad_arguments_raise_naming_them(call, request):
    scale_name = "tau" if "gaussian" in request.node.callspec.id else "b"
    good = dict(s=np.array([0.0, 1.0]), mu=0.0, sigma=1.0, scale=1.0)
    for name, bad, match in [
        ("sigma", 0.0, "sigma must be > 0"),
        ("sigma", np.array([1.0, -2.0]), "sigma must be > 0"),
        ("scale", 0.0, f"{scale_name} must be > 0"),
        ("scale", -1.0, f"{scale_name} must be > 0"),
        ("sigma", np.inf, "sigma must be finite"),
        ("s", np.array([0.0, np.nan]), "s must be finite"),
        ("mu", np.inf, "mu must be finite"),
        ("mu", np.zeros(3), "must broadcast together"),
    ]:
        with pytest.raises(ValueError, match=match):
            call(**{**good, name: bad})


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        draw_normal_given_laplace_release(0.0, 0.0, 1.0, 1.0, 42)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        draw_normal_given_gaussian_release(0.0, 0.0, 1.0, 1.0, np.random.RandomState(0))
