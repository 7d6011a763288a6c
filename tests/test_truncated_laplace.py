"""TruncatedLaplace and BITLaplace against independent references: the seed 002 note's tables
(§2.5, §3.3), quadrature, brute-force privacy grids, scipy's Laplace law and PyMC's logp."""

import math

import mpmath as mp
import numpy as np
import pymc as pm
import pytest
from scipy import integrate, stats

from dpinfer.mechanisms.truncated_laplace import BITLaplace, TruncatedLaplace

# (lower, upper, sensitivity, epsilon, eps_eff at b = Δ/ε, eps_eff at b = 2Δ/ε, b*/(Δ/ε)): seed 002 §2.5
EPS_EFF_TABLE = [
    (0, 1, 0.01, 1.0, 1.4899, 0.8318, 1.6126),
    (0, 1, 0.1, 1.0, 1.4898, 0.8306, 1.6116),
    (0, 1, 0.01, 0.1, 0.1909, 0.0976, 1.9509),
    (0, 1, 0.5, 1.0, 1.3799, 0.7191, 1.4133),
    (0, 1, 0.002, 0.5, 0.8318, 0.4498, 1.7798),
    (-1, 1, 0.02, 0.3, 0.5305, 0.2804, 1.8609),
]

# (s, b, C, P(BIT=l), P(BIT=u), bias_T, bias_BIT, MSE_T, MSE_BIT, Var_T, Var_BIT) on [0, 1]: seed 002 §3.3
MOMENT_TABLE = [
    (0.05, 0.01, 0.996631, 0.00336897, 2.76054e-42, 0.000202822, 3.36897e-05, 0.000188169, 0.000195957, 0.000188128, 0.000195956),
    (0.25, 0.01, 1, 6.94397e-12, 1.33932e-33, 1.80543e-12, 6.94397e-14, 0.0002, 0.0002, 0.0002, 0.0002),
    (0.5, 0.01, 1, 9.64375e-23, 9.64375e-23, 0, 0, 0.0002, 0.0002, 0.0002, 0.0002),
    (0.05, 0.1, 0.696697, 0.303265, 3.74259e-05, 0.0652371, 0.0303228, 0.0145002, 0.0108942, 0.0102443, 0.00997471),
    (0.25, 0.1, 0.958681, 0.0410425, 0.000276542, 0.0147388, 0.0040766, 0.0149782, 0.01708, 0.014761, 0.0170634),
    (0.5, 0.1, 0.993262, 0.00336897, 0.00336897, 0, 0, 0.0176257, 0.0191914, 0.0176257, 0.0191914),
    (0.05, 1.0, 0.331015, 0.475615, 0.193371, 0.369539, 0.282244, 0.215574, 0.247064, 0.0790148, 0.167402),
    (0.25, 1.0, 0.374416, 0.3894, 0.236183, 0.196118, 0.153217, 0.113956, 0.199858, 0.0754936, 0.176382),
    (0.5, 1.0, 0.393469, 0.303265, 0.303265, 0, 0, 0.0731324, 0.180408, 0.0731324, 0.180408),
]


def truncated_with_scale(b, lower=0.0, upper=1.0, sensitivity=1.0):
    """A TruncatedLaplace with scale b, asking for the epsilon that b truly gives (no warning)."""
    epsilon = TruncatedLaplace.epsilon_effective(b, lower, upper, sensitivity)
    return TruncatedLaplace(epsilon, lower, upper, sensitivity, scale=b)


def bit_with_scale(b, lower=0.0, upper=1.0):
    return BITLaplace(1.0 / b, lower, upper, sensitivity=1.0)


def laplace_truncated_cdf(r, x, b, lower, upper):
    """Independent reference: scipy's Laplace CDF, renormalised to [lower, upper]."""
    law = stats.laplace(loc=x, scale=b)
    return (law.cdf(r) - law.cdf(lower)) / (law.cdf(upper) - law.cdf(lower))


# --- privacy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("row", EPS_EFF_TABLE)
def test_effective_epsilon_table(row):
    lower, upper, sens, eps, eff_paper, eff_cons, ratio = row
    eff = TruncatedLaplace.epsilon_effective
    assert eff(sens / eps, lower, upper, sens) == pytest.approx(eff_paper, abs=5e-5)
    assert eff(2 * sens / eps, lower, upper, sens) == pytest.approx(eff_cons, abs=5e-5)
    mech = TruncatedLaplace(eps, lower, upper, sens)
    assert mech.scale / (sens / eps) == pytest.approx(ratio, abs=5e-5)
    assert mech.epsilon == eps


@pytest.mark.parametrize(
    "lower, upper, sens, eps", [(0, 1, 0.1, 1.0), (0, 1, 0.01, 0.1), (-1, 1, 0.02, 0.3), (0, 1, 3.0, 0.7)]
)
def test_default_scale_is_smallest_with_exact_epsilon(lower, upper, sens, eps):
    b = TruncatedLaplace(eps, lower, upper, sens).scale
    eff = TruncatedLaplace.epsilon_effective(b, lower, upper, sens)
    assert eff <= eps and eff == pytest.approx(eps, rel=1e-9, abs=0)
    assert TruncatedLaplace.epsilon_effective(b * (1 - 1e-9), lower, upper, sens) > eps


def test_paper_scale_is_not_epsilon_dp_and_reports_true_epsilon():
    with pytest.warns(UserWarning, match="only 1.4898"):
        paper = TruncatedLaplace(1.0, 0, 1, 0.1, scale="paper")
    assert paper.scale == pytest.approx(0.1, rel=1e-15)
    assert paper.epsilon == pytest.approx(1.4898499105794798, rel=1e-12)
    assert "asked for epsilon = 1" in paper.privacy.note
    audit = paper.audit()
    assert audit.holds and audit.measured_epsilon == pytest.approx(1.48985, abs=1e-5)
    assert TruncatedLaplace(1.0, 0, 1, 0.1).epsilon == 1.0
    wide = TruncatedLaplace(1.0, 0, 1, 0.1, scale=0.5)  # more noise than needed: true epsilon < asked
    assert wide.epsilon == pytest.approx(TruncatedLaplace.epsilon_effective(0.5, 0, 1, 0.1))
    assert wide.epsilon < 1
    assert TruncatedLaplace(1.0, 0, 1, 0.1, scale="conservative").scale == pytest.approx(0.2)


def brute_force_loss(mech, s_grid, r_grid):
    """sup over s, s' on s_grid with |s - s'| <= sensitivity and r on r_grid of log f(r|s)/f(r|s')."""
    logf = np.stack([mech.log_likelihood(r_grid, np.full_like(r_grid, s)) for s in s_grid], axis=1)
    close = np.abs(s_grid[:, None] - s_grid[None, :]) <= mech.sensitivity * (1 + 1e-12)
    worst = -np.inf
    for i in range(len(s_grid)):
        others = logf[:, close[i]]
        worst = max(worst, float(np.max(logf[:, [i]] - others)))
    return worst


@pytest.mark.parametrize(
    "lower, upper, sens, b",
    [(0, 1, 0.1, 0.1), (0, 1, 0.5, 0.3), (0, 1, 1.0, 0.4), (0, 1, 2.5, 0.4), (-1, 2, 7.0, 1.3)],
)
def test_worst_case_loss_closed_form_matches_brute_force(lower, upper, sens, b):
    """Closed form min(Δ, D)/b + log ΔC(b) against a grid over all pairs s, s' (also outside
    [l, u]) within Δ and all releases r; for Δ >= D the exact worst case is D/b."""
    mech = truncated_with_scale(b, lower, upper, sens)
    width = upper - lower
    s_grid = np.union1d(np.linspace(lower - 1.5 * sens, upper + 1.5 * sens, 241), [lower, upper, lower + sens])
    grid = brute_force_loss(mech, s_grid, np.linspace(lower, upper, 201))
    closed = TruncatedLaplace.epsilon_effective(b, lower, upper, sens)
    assert grid == pytest.approx(closed, rel=1e-9)
    if sens >= width:
        assert closed == pytest.approx(width / b, rel=1e-12)
    else:
        dc = (2 - math.exp(-sens / b) - math.exp(-(width - sens) / b)) / (1 - math.exp(-width / b))
        assert closed == pytest.approx(sens / b + math.log(dc), rel=1e-12)


def test_effective_epsilon_decreasing_and_between_eps_and_2eps():
    bs = np.geomspace(1e-3, 1e3, 200)
    eff = np.array([TruncatedLaplace.epsilon_effective(b, 0, 1, 0.1) for b in bs])
    assert np.all(np.diff(eff) < 0)
    assert np.all(eff > 0.1 / bs) and np.all(eff <= 2 * 0.1 / bs * (1 + 1e-12))


@pytest.mark.parametrize("sens", [0.1, 0.5, 1.0, 3.0])
def test_truncated_audit_holds_at_default_scale(sens):
    audit = TruncatedLaplace(0.8, 0, 1, sens).audit()
    assert audit.holds and audit.measured_epsilon == pytest.approx(0.8, rel=1e-9)
    assert "grid" in audit.method and "closed form" in audit.method


@pytest.mark.parametrize("args", [(1.0, 0, 1, 0.1), (0.3, -2, 5, 1.0), (0.5, 0)])
def test_bit_audit_equals_epsilon(args):
    mech = BITLaplace(*args)
    audit = mech.audit()
    assert audit.holds and audit.measured_epsilon == pytest.approx(mech.epsilon, rel=1e-9)
    assert mech.scale == pytest.approx(mech.sensitivity / mech.epsilon, rel=1e-15)


# --- densities -------------------------------------------------------------------------------------
def integral_on_bounds(mech, x, power):
    """int_l^u r^power p(r | x) dr by quadrature (the density part only; BIT atoms excluded)."""
    peak = [x] if mech.lower < x < mech.upper else None
    return integrate.quad(
        lambda r: r**power * math.exp(mech.log_likelihood(r, x)),
        mech.lower, mech.upper, points=peak, epsabs=1e-14, epsrel=1e-12, limit=200,
    )[0]


CASES = [(x, b, l, u) for (l, u) in [(0.0, 1.0), (-2.0, 3.0), (5.0, 5.5)] for b in [0.01, 0.3, 4.0, 1e3]
         for x in [l - 3.0, l - 0.2, l, 0.3 * l + 0.7 * u, u, u + 0.05, u + 40.0]]


@pytest.mark.parametrize("x, b, l, u", CASES)
def test_densities_integrate_to_one(x, b, l, u):
    trunc, bit = truncated_with_scale(b, l, u), bit_with_scale(b, l, u)
    assert integral_on_bounds(trunc, x, 0) == pytest.approx(1.0, abs=1e-9)
    atoms = np.exp(bit.log_likelihood([l, u], [x, x])).sum()
    assert integral_on_bounds(bit, x, 0) + atoms == pytest.approx(1.0, abs=1e-9)


def test_a_release_outside_the_bounds_is_an_error_and_the_likelihood_memoryless():
    trunc, bit = truncated_with_scale(0.3), bit_with_scale(0.3)
    for mech in (trunc, bit):  # as ClampedGeometric: not a release of this mechanism
        for outside in ([-0.1, 0.5], [0.5, 1.1]):
            with pytest.raises(ValueError, match="release"):
                mech.log_likelihood(outside, [0.5, 0.5])
    r = np.linspace(0, 1, 7)
    far = trunc.log_likelihood(r, np.full(7, -1e6))
    np.testing.assert_allclose(far, trunc.log_likelihood(r, np.zeros(7)), rtol=1e-14)
    exponential = stats.expon(scale=0.3).logpdf(r) - math.log(-math.expm1(-1 / 0.3))
    np.testing.assert_allclose(far, exponential, rtol=1e-12)
    atoms_and_peak = bit.log_likelihood([0.0, 1.0, 0.4], [-1e6, 1e6, 0.4])
    np.testing.assert_allclose(atoms_and_peak, [0.0, 0.0, -math.log(0.6)])


def test_pymc_logp_equals_numpy_likelihood():
    x = np.array([-2.0, -0.1, 0.0, 0.05, 0.5, 0.93, 1.0, 1.3, 4.0])
    for r in (np.linspace(0, 1, 9), np.array([0.0, 0.2, 1.0, 0.0, 1.0, 0.0, 0.7, 1.0, 0.0])):
        for mech in (truncated_with_scale(0.3), bit_with_scale(0.3), BITLaplace(0.5, 0.0)):
            expected = mech.log_likelihood(r, x)
            got = pm.logp(mech.dist(x), r).eval()
            # pm.Laplace.logcdf uses pt.log(0.5), which PyTensor stores as float32: error 1.9e-9
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=5e-9)
    r_out = np.array([-0.5, 1.5])
    assert np.all(pm.logp(truncated_with_scale(0.3).dist(np.array([0.5, 0.5])), r_out).eval() == -np.inf)


def test_log_likelihood_against_mpmath():
    mp.mp.dps = 40
    b, lower, upper = mp.mpf("0.3"), mp.mpf(0), mp.mpf(1)

    def cdf(r, x):
        return mp.e ** ((r - x) / b) / 2 if r < x else 1 - mp.e ** (-(r - x) / b) / 2

    trunc, bit = truncated_with_scale(0.3), bit_with_scale(0.3)
    for x in ("-2", "0", "0.05", "0.5", "1", "1.3", "40"):
        x_mp = mp.mpf(x)
        for r in ("0", "0.2", "0.93", "1"):
            r_mp = mp.mpf(r)
            log_pdf = -mp.log(2 * b) - abs(r_mp - x_mp) / b
            exact_t = log_pdf - mp.log(cdf(upper, x_mp) - cdf(lower, x_mp))
            assert trunc.log_likelihood(float(r), float(x)) == pytest.approx(float(exact_t), rel=1e-13)
            atom = {"0": cdf(lower, x_mp), "1": 1 - cdf(upper, x_mp)}
            exact_b = mp.log(atom[r]) if r in atom else log_pdf
            assert bit.log_likelihood(float(r), float(x)) == pytest.approx(float(exact_b), rel=1e-13)


def test_observe_registers_the_bit_release():
    mech = BITLaplace(1.0, 0.0, 10.0)
    with pm.Model() as model:
        x = pm.Normal("x", 3.0, 2.0, shape=3)
        mech.observe("r", x, np.array([0.0, 2.5, 10.0]))
    point = {"x": np.array([1.0, 2.0, 9.5])}
    model_logp = model.compile_logp(vars=[model["r"]])(point)
    expected = mech.log_likelihood([0.0, 2.5, 10.0], point["x"]).sum()
    assert model_logp == pytest.approx(expected, abs=5e-9)  # PyMC's float32 log(0.5), see above
    with pytest.raises(ValueError, match="release"):
        with pm.Model():
            mech.observe("r", pm.Normal("x", 3.0, 2.0), 10.5)


# --- samplers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("x, b, l, u", [(0.05, 0.1, 0, 1), (0.5, 1.0, 0, 1), (-0.4, 0.3, 0, 1), (2.0, 0.5, -1, 1.5)])
def test_truncated_sampler_matches_law(x, b, l, u):
    draws = truncated_with_scale(b, l, u).release(np.full(100_000, x), np.random.default_rng(20020))
    assert draws.min() >= l and draws.max() <= u
    assert stats.kstest(draws, lambda r: laplace_truncated_cdf(r, x, b, l, u)).pvalue > 1e-3


@pytest.mark.parametrize("x, b, l, u", [(0.05, 0.1, 0, 1), (0.5, 1.0, 0, 1), (-0.4, 0.3, 0, 1), (3.0, 2.0, 0, None)])
def test_bit_sampler_matches_law(x, b, l, u):
    mech = BITLaplace(1.0 / b, l, u)
    n = 100_000
    draws = mech.release(np.full(n, x), np.random.default_rng(20021))
    law = stats.laplace(loc=x, scale=b)
    upper = math.inf if u is None else u
    for hits, p in (((draws == l).sum(), law.cdf(l)), ((draws == upper).sum(), law.sf(upper))):
        assert abs(hits - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9
    inner = draws[(draws > l) & (draws < upper)]
    assert stats.kstest(inner, lambda r: laplace_truncated_cdf(r, x, b, l, upper)).pvalue > 1e-3


def test_sampler_far_outside_bounds_and_rng_check():
    draws = truncated_with_scale(0.2).release(np.full(50_000, -1e9), np.random.default_rng(3))
    assert stats.kstest(draws, lambda r: laplace_truncated_cdf(r, 0.0, 0.2, 0.0, 1.0)).pvalue > 1e-3
    assert np.all(bit_with_scale(0.2).release(np.array([-1e9, 1e9]), np.random.default_rng(3)) == [0.0, 1.0])
    with pytest.raises(TypeError, match="rng"):
        bit_with_scale(0.2).release([0.5], rng=3)


# --- utility ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("row", MOMENT_TABLE)
def test_moments_reference_table(row):
    s, b, c, p_l, p_u, bias_t, bias_b, mse_t, mse_b, var_t, var_b = row
    trunc, bit = truncated_with_scale(b), bit_with_scale(b)
    close = dict(rel=1e-5, abs=1e-15)
    assert math.exp(trunc.log_normaliser(s)) == pytest.approx(c, rel=1e-5)
    assert np.exp(bit.log_likelihood([0.0, 1.0], [s, s])) == pytest.approx([p_l, p_u], rel=1e-5)
    assert trunc.bias(s) == pytest.approx(bias_t, **close)
    assert bit.bias(s) == pytest.approx(bias_b, **close)
    assert trunc.mse(s) == pytest.approx(mse_t, **close)
    assert bit.mse(s) == pytest.approx(mse_b, **close)
    assert trunc.variance(s) == pytest.approx(var_t, **close)
    assert bit.variance(s) == pytest.approx(var_b, **close)


def quadrature_moments(mech, x):
    """(E[r], Var[r]) by quadrature of the density plus the atoms (BIT)."""
    l, u = mech.lower, mech.upper
    mom = [integral_on_bounds(mech, x, k) for k in (1, 2)]
    if isinstance(mech, BITLaplace):
        p = np.exp(mech.log_likelihood([l, u], [x, x]))
        mom = [mom[0] + p[0] * l + p[1] * u, mom[1] + p[0] * l**2 + p[1] * u**2]
    return mom[0], mom[1] - mom[0] ** 2


@pytest.mark.parametrize("x", [-3.0, -0.3, 0.0, 0.1, 0.7, 1.0, 1.2, 6.0])
@pytest.mark.parametrize("b", [0.05, 0.3, 2.0])
def test_moments_match_quadrature_also_outside_bounds(x, b):
    for mech in (truncated_with_scale(b), bit_with_scale(b)):
        mean, var = quadrature_moments(mech, x)
        assert mech.bias(x) == pytest.approx(mean - x, rel=1e-8, abs=1e-11)
        assert mech.variance(x) == pytest.approx(var, rel=1e-7, abs=1e-11)
        assert mech.mse(x) == pytest.approx(var + (mean - x) ** 2, rel=1e-8, abs=1e-11)


def test_proposition_1_and_mse_bound_on_grid():
    s = np.linspace(0.001, 0.999, 999)
    for b in (1e-3, 0.01, 0.1, 0.5, 1.0, 5.0, 50.0, 1e3):
        trunc, bit = truncated_with_scale(b), bit_with_scale(b)
        bt, bb = trunc.bias(s), bit.bias(s)
        assert np.all(np.sign(bt) == np.sign(bb)) and np.all(np.sign(bb) == np.sign(0.5 - s))
        assert np.all(np.abs(bb) <= np.abs(bt) + 1e-15)
        assert np.all(trunc.mse(s) <= 2 * b**2 * (1 + 1e-12)) and np.all(bit.mse(s) <= 2 * b**2 * (1 + 1e-12))
    # b -> infinity (seed 002 §2.4): Uniform(0, 1) and Bernoulli(1/2) on {0, 1}
    assert truncated_with_scale(1e6).mse(0.05) == pytest.approx(1 / 12 + 0.45**2, rel=1e-6)
    assert bit_with_scale(1e6).mse(0.05) == pytest.approx(0.5 * (0.05**2 + 0.95**2), rel=1e-5)


def test_release_interval_has_the_stated_probability():
    x = np.array([-0.2, 0.05, 0.5, 0.9])
    trunc = truncated_with_scale(0.2)
    lo, hi = trunc.release_interval(x, 0.8)
    cover = laplace_truncated_cdf(hi, x, 0.2, 0, 1) - laplace_truncated_cdf(lo, x, 0.2, 0, 1)
    np.testing.assert_allclose(cover, 0.8, rtol=1e-10)
    np.testing.assert_allclose(laplace_truncated_cdf(lo, x, 0.2, 0, 1), 0.1, rtol=1e-9)
    bit = bit_with_scale(0.2)
    lo, hi = bit.release_interval(x, 0.8)
    law = stats.laplace(loc=x, scale=0.2)
    mass = np.where(hi >= 1, 1.0, law.cdf(hi)) - np.where(lo <= 0, 0.0, law.cdf(lo))
    assert np.all(mass >= 0.8 - 1e-12)
    assert lo[0] == 0.0 and lo[1] == 0.0  # P(r = 0) > 0.1 there
    np.testing.assert_allclose([lo[2], hi[2]], 0.5 + 0.2 * np.log([0.2, 5.0]), rtol=1e-12)


# --- tail bound for windows -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "mech", [truncated_with_scale(2.0, 0, 10), truncated_with_scale(0.7, -3, 8), BITLaplace(0.5, 0, 10), BITLaplace(0.4, 0)]
)
@pytest.mark.parametrize("support", [None, (0, np.inf), (-3, 12)])
def test_bound_outside_is_the_sup_over_integers(mech, support):
    xs = np.arange(-400, 401, dtype=float)
    if support is not None:
        xs = xs[(xs >= support[0]) & (xs <= support[1])]
    hi = mech.upper if math.isfinite(mech.upper) else 30.0
    releases = np.union1d(np.linspace(mech.lower, hi, 23), [mech.lower, hi])
    for k in (0, 1, 2.5, 4, 9):
        bound = mech.log_likelihood_bound_outside(releases, k, support=support)
        for r, bnd in zip(releases, bound):
            far = xs[np.abs(xs - r) > k]
            brute = mech.log_likelihood(np.full(far.shape, r), far).max() if far.size else -np.inf
            assert brute <= bnd + 1e-12
            # tight: the sup is reached at an integer, or (BIT atoms, no support) approached as x -> -/+inf
            approached = bnd == 0.0 and brute > -1e-80
            assert brute == pytest.approx(bnd, abs=1e-12) or approached


def test_bound_outside_decays_for_counts():
    mech = BITLaplace(0.5, 0)  # max(0, x + Laplace(2)), counts x >= 0
    assert mech.log_likelihood_bound_outside([0.0], 5)[0] == 0.0  # x -> -inf makes r = 0 certain
    bound = mech.log_likelihood_bound_outside([0.0, 3.0], 5, support=(0, np.inf))
    np.testing.assert_allclose(bound, [math.log(0.5) - 6 / 2, -math.log(4) - 6 / 2], rtol=1e-14)


# --- argument checks ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [TruncatedLaplace, BITLaplace])
def test_bad_arguments_are_named(cls):
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="epsilon"):
            cls(eps, 0, 1)
    with pytest.raises(TypeError, match="epsilon"):
        cls("1", 0, 1)
    with pytest.raises(ValueError, match="lower must be < upper"):
        cls(1.0, 1, 1)
    with pytest.raises(ValueError, match="lower must be < upper"):
        cls(1.0, 2, 1)
    with pytest.raises(ValueError, match="sensitivity"):
        cls(1.0, 0, 1, sensitivity=0)
    with pytest.raises(ValueError, match="neighbour"):
        cls(1.0, 0, 1, neighbour="swap")
    mech = cls(1.0, 0, 1)
    with pytest.raises(ValueError, match="release"):
        mech.check_release([0.5, 1.2])
    with pytest.raises(ValueError, match="release"):
        mech.log_likelihood_bound_outside([-0.1], 2)
    with pytest.raises(ValueError, match="release has shape"):
        mech.log_likelihood(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="true_values"):
        mech.log_likelihood([0.5], [np.nan])
    with pytest.raises(ValueError, match="prob"):
        mech.release_interval([0.5], 1.0)
    with pytest.raises(ValueError, match="k must be"):
        mech.log_likelihood_bound_outside([0.5], -1)


def test_bad_scale_and_bounds():
    for scale in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ValueError, match="scale"):
            TruncatedLaplace(1.0, 0, 1, scale=scale)
    with pytest.raises(ValueError, match="scale"):
        TruncatedLaplace(1.0, 0, 1, scale="optimistic")
    with pytest.raises(ValueError, match="upper must be finite"):
        TruncatedLaplace(1.0, 0, float("inf"))
    with pytest.raises(ValueError, match="lower must be finite"):
        BITLaplace(1.0, float("-inf"))
    with pytest.raises(TypeError, match="lower"):
        BITLaplace(1.0, "0")
    assert BITLaplace(1.0, 0).privacy.epsilon == 1.0
    assert not TruncatedLaplace.discrete and not TruncatedLaplace.exact_sampler
    assert not BITLaplace.discrete and not BITLaplace.exact_sampler


def test_one_sided_bit_moments_match_seed_002_eq_10():
    """Bounds [l, inf): bias_BIT = (b/2) e^{-a/b} (Eq (10)); MSE = b^2 [P(2, a/b) + 1]; below l
    the release is l + the clamp excess, so bias -> l - x and the variance -> 0."""
    mech = BITLaplace(0.5, 0.0)  # b = 2
    a = np.array([0.0, 0.5, 3.0, 40.0])
    np.testing.assert_allclose(mech.bias(a), np.exp(-a / 2), rtol=1e-14)
    np.testing.assert_allclose(mech.mse(a), 4 * (1 - (1 + a / 2) * np.exp(-a / 2) + 1), rtol=1e-13)
    below = np.array([-1.0, -30.0])
    np.testing.assert_allclose(mech.bias(below), -below + np.exp(below / 2), rtol=1e-14)
    np.testing.assert_allclose(mech.variance(below), 4 * np.exp(below / 2) - np.exp(below), rtol=1e-13)


def test_dp_sample_posterior_of_counts_bounded_by_the_mechanism_matches_enumeration():
    """x ~ Binomial(40, 0.3) (a prior bounded by the public bounds [0, 40]), releases of 3 cells
    by TruncatedLaplace(0.5, 0, 40): P(x | s) ∝ Binomial pmf x TruncatedLaplace likelihood,
    enumerated over x = 0..40 per cell. Tolerance 4 Monte Carlo s.e. (ArviZ ESS)."""
    import arviz as az

    import dpinfer as dp

    mech = TruncatedLaplace(0.5, 0, 40)
    release = np.array([1.7, 14.2, 39.5])
    x = np.arange(41)
    log_w = stats.binom.logpmf(x, 40, 0.3)[:, None] + mech.log_likelihood(
        np.broadcast_to(release, (41, 3)), np.broadcast_to(x[:, None], (41, 3)))
    w = np.exp(log_w - log_w.max(axis=0))
    exact = (w * x[:, None]).sum(axis=0) / w.sum(axis=0)
    with pm.Model() as model:
        counts = pm.Binomial("counts", 40, 0.3, shape=3)
        mech.observe("release", counts, release)
    idata = dp.sample(2000, tune=200, chains=2, random_seed=5, progressbar=False, model=model)
    draws = idata.posterior["counts"]
    mean = draws.mean(("chain", "draw")).values
    se = draws.std(("chain", "draw")).values / np.sqrt(np.asarray(az.ess(draws)))
    assert np.all(np.abs(mean - exact) < 4 * se), (mean, exact, se)


def test_dp_sample_refuses_an_unbounded_prior_for_a_flat_likelihood():
    import dpinfer as dp

    with pm.Model() as model:
        counts = pm.Poisson("counts", 10.0, shape=2)
        TruncatedLaplace(0.5, 0, 40).observe("release", counts, np.array([3.0, 39.0]))
    with pytest.raises(ValueError, match="does not decay away from the release.*bounded by"):
        dp.sample(10, tune=10, chains=1, progressbar=False, model=model)
