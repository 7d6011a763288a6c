"""Multi-level releases (seed 003, Algorithm 1, Lemmas 3-4): transition laws against the
reference note's exact matrices, Lemma 3's G_alpha^{-1} G_beta, the de-clamp and mixture
representations summed term by term and mpmath; the exact sampler against the joint pmf;
every coalition's privacy by enumeration (note §8); posteriors by enumeration and by
dpinfer.sample."""

from __future__ import annotations

import math
from fractions import Fraction

import arviz as az
import mpmath
import numpy as np
import pymc as pm
import pytest
from scipy import special, stats

import dpinfer
from dpinfer import privacy
from dpinfer.mechanisms.geometric import ClampedGeometric, DoubleGeometric
from dpinfer.mechanisms.multilevel import MultiLevelGeometric

# note §8: alpha = (0.2, 0.5, 0.8), n = 4
EPS3 = (math.log(5.0), math.log(2.0), -math.log(0.8))


def clamped3():
    return MultiLevelGeometric(EPS3, lower=0, upper=4)


def lemma3_matrix(n, eps_a, eps_b):
    """T = G_alpha^{-1} G_beta (seed 003 Lemma 3), G from ClampedGeometric's own likelihood."""
    g_a = ClampedGeometric(eps_a, 0, n).transition_matrix()
    g_b = ClampedGeometric(eps_b, 0, n).transition_matrix()
    return np.linalg.solve(g_a, g_b)


def increment_pmf(alpha, beta, reach):
    """The note's W (A7): p0 delta_0 + (1 - p0) DG(beta), on -reach..reach, in plain floats."""
    d = np.arange(-reach, reach + 1)
    p0 = alpha * (1 - beta) ** 2 / (beta * (1 - alpha) ** 2)
    return d, (1 - p0) * (1 - beta) / (1 + beta) * beta ** np.abs(d) + p0 * (d == 0)


def dg_pmf(alpha, z):
    return (1 - alpha) / (1 + alpha) * alpha ** np.abs(z)


# --- structure and guarantees ---------------------------------------------------------------


def test_levels_guarantees_and_marginals():
    mech = clamped3()
    assert mech.n_levels == 3 and mech.epsilons == EPS3
    np.testing.assert_allclose(mech.alphas, [0.2, 0.5, 0.8], rtol=1e-15)
    assert (mech.epsilon, mech.delta) == (EPS3[0], 0.0)
    for levels, eps in [((0, 1, 2), EPS3[0]), ((2, 0), EPS3[0]), ((1, 2), EPS3[1]), ([2], EPS3[2])]:
        guarantee = mech.coalition_privacy(levels)
        assert (guarantee.epsilon, guarantee.delta, guarantee.sensitivity) == (eps, 0.0, 1)
    assert isinstance(mech.marginal(1), ClampedGeometric) and mech.marginal(1).epsilon == EPS3[1]
    assert isinstance(MultiLevelGeometric([1.0, 0.5]).marginal(0), DoubleGeometric)
    assert mech.exact_sampler and mech.discrete


# --- transition laws ------------------------------------------------------------------------


def test_transition_matrix_matches_note_section7_exactly():
    """n = 3, alpha = 1/4 -> 1/2: the note's exact T_{1/4,1/2} (p0 = 2/9)."""
    mech = MultiLevelGeometric([math.log(4.0), math.log(2.0)], lower=0, upper=3)
    f = Fraction
    expected = [[f(7, 9), f(1, 9), f(1, 18), f(1, 18)],
                [f(7, 27), f(13, 27), f(7, 54), f(7, 54)],
                [f(7, 54), f(7, 54), f(13, 27), f(7, 27)],
                [f(1, 18), f(1, 18), f(1, 9), f(7, 9)]]
    np.testing.assert_allclose(mech.transition_matrix(1), np.array(expected, dtype=float), rtol=1e-14)


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_chain_keeps_every_marginal_geometric(n):
    """G_{alpha_1} T_2 ... T_j = G_{alpha_j} (Lemma 3, Algorithm 1), each T equal to
    G_alpha^{-1} G_beta, stochastic and positive."""
    mech = MultiLevelGeometric(EPS3, lower=0, upper=n)
    product = ClampedGeometric(EPS3[0], 0, n).transition_matrix()
    for j in (1, 2):
        t = mech.transition_matrix(j)
        assert np.all(t > 0)
        np.testing.assert_allclose(t.sum(axis=1), 1.0, rtol=1e-15)
        np.testing.assert_allclose(t, lemma3_matrix(n, EPS3[j - 1], EPS3[j]), rtol=1e-12, atol=1e-15)
        product = product @ t
        np.testing.assert_allclose(product, ClampedGeometric(EPS3[j], 0, n).transition_matrix(), rtol=1e-13)


@pytest.mark.parametrize("upper", [4, None])
def test_clamped_rows_are_the_declamp_law(upper):
    """Row r of T is clamp(Y + W) (note A7): Y = r inside, lower - M at lower, upper + M at
    upper, M ~ geometric(alpha); summed term by term (tails below 0.8^400)."""
    reach = 400
    for j, (alpha, beta) in enumerate([(0.2, 0.5), (0.5, 0.8)], start=1):
        mech = MultiLevelGeometric(EPS3, lower=0, upper=upper)
        top = 4 if upper is not None else 30
        d, w = increment_pmf(alpha, beta, reach)
        m = np.arange(reach)
        geo = (1 - alpha) * alpha**m
        for r in range(top + 1):
            if r == 0:
                ys, py = -m, geo
            elif upper is not None and r == upper:
                ys, py = upper + m, geo
            else:
                ys, py = np.array([r]), np.array([1.0])
            values = (ys[:, None] + d[None, :]).ravel()
            probs = (py[:, None] * w[None, :]).ravel()
            values = np.clip(values, 0, upper if upper is not None else None)
            row = np.bincount(values, weights=probs, minlength=top + 1)[: top + 1]
            got = np.exp(mech.log_transition(j, np.full(top + 1, r), np.arange(top + 1)))
            np.testing.assert_allclose(got, row, rtol=1e-13, atol=1e-16)


def test_unbounded_increment_turns_dg_alpha_into_dg_beta():
    """The unbounded W (note A7) convolved with DG(alpha) is DG(beta), to 1e-15 by summation;
    and W is the difference X1 - X2 of iid X = 0 w.p. q = alpha(1-beta)/(beta(1-alpha)), else
    geometric(beta) on {0, 1, ..} (the brief's second form)."""
    mech = MultiLevelGeometric(EPS3)
    reach = 400
    d = np.arange(-reach, reach + 1)
    for j, (alpha, beta) in enumerate([(0.2, 0.5), (0.5, 0.8)], start=1):
        w = np.exp(mech.log_transition(j, np.zeros_like(d), d))
        np.testing.assert_allclose(w, increment_pmf(alpha, beta, reach)[1], rtol=1e-13, atol=1e-300)
        assert w.sum() == pytest.approx(1.0, abs=1e-15)
        z = np.arange(-30, 31)
        conv = np.array([np.sum(dg_pmf(alpha, zz - d) * w) for zz in z])
        np.testing.assert_allclose(conv, dg_pmf(beta, z), rtol=0, atol=1e-15)
        q = alpha * (1 - beta) / (beta * (1 - alpha))
        x_pmf = (1 - q) * (1 - beta) * beta ** np.arange(reach + 1)
        x_pmf[0] += q
        diff = np.convolve(x_pmf, x_pmf[::-1])  # P(X1 - X2 = k), k = -reach..reach
        near = np.abs(d) <= reach // 2  # X truncated at reach: exact to beta^(reach/2) relative
        np.testing.assert_allclose(w[near], diff[near], rtol=1e-12, atol=1e-300)


def test_far_entries_against_mpmath():
    """Log-space entries far out (alpha^3000 underflows) against 60-digit mpmath evaluation
    of the tridiagonal G_alpha^{-1} rows times G_beta (note §5) and of the mixture W."""
    mpmath.mp.dps = 60
    n = 3000
    mech = MultiLevelGeometric(EPS3[:2], lower=0, upper=n)
    a, b = mpmath.exp(-mpmath.mpf(EPS3[0])), mpmath.exp(-mpmath.mpf(EPS3[1]))

    def g_beta(i, s):
        c = 1 / (1 + b) if s in (0, n) else (1 - b) / (1 + b)
        return c * b ** abs(i - s)

    def t_ref(i, s):
        if i == 0:
            return (g_beta(0, s) - a * g_beta(1, s)) / (1 - a)
        if i == n:
            return (g_beta(n, s) - a * g_beta(n - 1, s)) / (1 - a)
        return ((1 + a**2) * g_beta(i, s) - a * (g_beta(i - 1, s) + g_beta(i + 1, s))) / (1 - a) ** 2

    pairs = [(0, 0), (0, 1), (0, 2999), (0, n), (1500, 1490), (1500, 1500), (1500, n), (n, 0), (2, 0)]
    for i, s in pairs:
        assert mech.log_transition(1, i, s) == pytest.approx(float(mpmath.log(t_ref(i, s))), rel=1e-13)
    unbounded = MultiLevelGeometric(EPS3[:2])
    p0 = a * (1 - b) ** 2 / (b * (1 - a) ** 2)
    far = (1 - p0) * (1 - b) / (1 + b) * b**10**6
    assert unbounded.log_transition(1, 0, 10**6) == pytest.approx(float(mpmath.log(far)), rel=1e-14)


# --- exact sampler ----------------------------------------------------------------------------


def _chi_square_pvalue(counts, probs):
    """Pearson chi-square; cells expected below 5 merged into one. Under the exact law the
    p-value is uniform, so with a fixed seed a sound sampler fails p > 1e-3 with probability 1e-3."""
    n = counts.sum()
    expected = n * probs
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_clamped_release_frequencies_match_joint_pmf():
    mech = clamped3()
    draws = mech.release(np.ones(100_000, dtype=int), np.random.default_rng(20250601))
    assert draws.shape == (100_000, 3) and draws.dtype == np.int64
    g = ClampedGeometric(EPS3[0], 0, 4).transition_matrix()
    t2, t3 = lemma3_matrix(4, EPS3[0], EPS3[1]), lemma3_matrix(4, EPS3[1], EPS3[2])
    joint = g[1][:, None, None] * t2[:, :, None] * t3[None, :, :]  # (r1, r2, r3)
    counts = np.bincount(np.ravel_multi_index(draws.T, (5, 5, 5)), minlength=125)
    assert _chi_square_pvalue(counts, joint.ravel()) > 1e-3


def test_dist_draws_match_joint_pmf():
    """dist()'s PyTensor random graph (predictive draws) follows the same joint law, one
    independent chain per cell."""
    mech = clamped3()
    draws = pm.draw(mech.dist(np.ones(100_000, dtype=np.int64)), random_seed=11)
    probs = np.exp(mech.log_likelihood(np.array(np.unravel_index(np.arange(125), (5, 5, 5))).T, 1))
    counts = np.bincount(np.ravel_multi_index(draws.T, (5, 5, 5)), minlength=125)
    assert _chi_square_pvalue(counts, probs) > 1e-3


def test_unbounded_release_frequencies_match_joint_pmf():
    """(r_1, r_2) at x = 0 on a 9 x 21 box plus one cell for everything else; the reference is
    scipy's dlaplace times the note's W."""
    eps = (1.0, 0.3)
    mech = MultiLevelGeometric(eps)
    draws = mech.release(np.zeros((50_000, 2), dtype=int), np.random.default_rng(7)).reshape(-1, 2)
    r1, r2 = np.arange(-4, 5), np.arange(-10, 11)
    _, w = increment_pmf(math.exp(-eps[0]), math.exp(-eps[1]), 40)
    probs = stats.dlaplace.pmf(r1, eps[0])[:, None] * w[40 + r2[None, :] - r1[:, None]]
    inside = (np.abs(draws[:, 0]) <= 4) & (np.abs(draws[:, 1]) <= 10)
    cells = np.ravel_multi_index((draws[inside, 0] + 4, draws[inside, 1] + 10), probs.shape)
    counts = np.append(np.bincount(cells, minlength=probs.size), np.count_nonzero(~inside))
    assert _chi_square_pvalue(counts, np.append(probs.ravel(), 1.0 - probs.sum())) > 1e-3


# --- privacy -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bounds", [(0, 4), (None, None), (0, None)])
def test_every_coalition_gets_its_least_private_level(bounds):
    """Note §8: alpha = (0.2, 0.5, 0.8) gives ln 5 for every coalition holding level 0, ln 2
    for {1, 2} and {1}, -ln 0.8 for {2}; exactly, by enumeration."""
    mech = MultiLevelGeometric(EPS3, lower=bounds[0], upper=bounds[1])
    audit = mech.audit()
    assert audit.holds and len(audit.coalitions) == 7
    for levels, found in audit.coalitions.items():
        assert found.claimed_epsilon == EPS3[min(levels)]
        assert found.measured_epsilon == pytest.approx(EPS3[min(levels)], rel=1e-12)
        assert found.measured_delta < 1e-15
    assert audit.measured_epsilon == pytest.approx(math.log(5.0), rel=1e-12)
    assert mech.audit_coalition([1, 2]).measured_epsilon == pytest.approx(math.log(2.0), rel=1e-12)


def test_audit_with_sensitivity_two():
    mech = MultiLevelGeometric([3.0, 1.0], sensitivity=2, lower=0, upper=10)
    audit = mech.audit()
    assert audit.holds
    assert audit.coalitions[(1,)].measured_epsilon == pytest.approx(1.0, rel=1e-12)
    assert audit.coalitions[(0, 1)].measured_epsilon == pytest.approx(3.0, rel=1e-12)


def test_independent_releases_compose():
    """Contrast (note §8): independent releases at alpha 0.2 and 0.5 (n = 4) have joint privacy
    loss ln 10 = ln 5 + ln 2, where the chain's levels {0, 1} have ln 5."""
    levels = [ClampedGeometric(EPS3[0], 0, 4), ClampedGeometric(EPS3[1], 0, 4)]
    grid = np.array([(a, b) for a in range(5) for b in range(5)])

    def independent(outputs, x):  # x has the outputs' shape (privacy.max_privacy_loss)
        return sum(m.log_likelihood(outputs[:, j], x[:, 0]) for j, m in enumerate(levels))

    def chain(outputs, x):
        return MultiLevelGeometric(EPS3[:2], lower=0, upper=4).log_likelihood(outputs, x[:, 0])

    pairs = privacy.integer_neighbour_pairs(0, 4, 1)
    assert privacy.max_privacy_loss(independent, pairs, grid) == pytest.approx(math.log(10.0), rel=1e-12)
    assert privacy.max_privacy_loss(chain, pairs, grid) == pytest.approx(math.log(5.0), rel=1e-12)


# --- likelihood -------------------------------------------------------------------------------


def test_clamped_joint_likelihood_is_the_markov_chain():
    """log p(r | x) = log G[x, r1] + log T2[r1, r2] + log T3[r2, r3] with Lemma 3's matrices;
    it sums to 1 over all 125 outputs for every x, and PyMC's logp of dist() agrees."""
    mech = clamped3()
    g = ClampedGeometric(EPS3[0], 0, 4).transition_matrix()
    t2, t3 = lemma3_matrix(4, EPS3[0], EPS3[1]), lemma3_matrix(4, EPS3[1], EPS3[2])
    outputs = np.array(np.meshgrid(*[np.arange(5)] * 3, indexing="ij")).reshape(3, -1).T
    for x in range(5):
        got = mech.log_likelihood(outputs, x)
        r1, r2, r3 = outputs.T
        expected = np.log(g[x, r1] * t2[r1, r2] * t3[r2, r3])
        np.testing.assert_allclose(got, expected, rtol=1e-12)
        assert np.exp(got).sum() == pytest.approx(1.0, abs=1e-14)
    x = np.array([0, 2, 4, 1])
    release = np.array([[0, 0, 4], [2, 3, 3], [4, 4, 0], [1, 0, 2]])
    np.testing.assert_allclose(pm.logp(mech.dist(x), release).eval(), mech.log_likelihood(release, x),
                               rtol=1e-13)


def test_unbounded_joint_likelihood_and_dist():
    mech = MultiLevelGeometric(EPS3)
    x = np.array([0, 5, -3])
    release = np.array([[0, 2, -7], [6, 6, 9], [-3, -20, -20]])
    alphas = [0.2, 0.5, 0.8]
    expected = np.log(stats.dlaplace.pmf(release[:, 0] - x, EPS3[0]))
    for j in (1, 2):
        d, w = increment_pmf(alphas[j - 1], alphas[j], 50)
        expected += np.log(w[50 + release[:, j] - release[:, j - 1]])
    np.testing.assert_allclose(mech.log_likelihood(release, x), expected, rtol=1e-12)
    np.testing.assert_allclose(pm.logp(mech.dist(x), release).eval(), expected, rtol=1e-12)
    draws = pm.draw(mech.dist(x), random_seed=1)
    assert draws.shape == (3, 3) and draws.dtype == np.int64


def test_bound_outside_window_is_attained_and_holds():
    """sup over |x - r1| > k of p(r | x) is the joint at |x - r1| = k + 1 (enumerated)."""
    mech = MultiLevelGeometric(EPS3)
    release = np.array([3, 1, 6])
    xs = np.arange(-60, 67)
    outside = xs[np.abs(xs - release[0]) > 3]
    best = np.max(mech.log_likelihood(np.broadcast_to(release, (outside.size, 3)), outside))
    assert float(mech.log_likelihood_bound_outside(release, 3)) == pytest.approx(best, rel=1e-14)


# --- posteriors ---------------------------------------------------------------------------------


def _posterior(log_w):
    p = np.exp(log_w - special.logsumexp(log_w))
    return p


@pytest.mark.parametrize("bounds", [(0, 40), (None, None)])
def test_posterior_given_all_levels_is_posterior_given_level0(bounds):
    """r_1 is sufficient (Lemma 4): p(x | r_1..r_3) = p(x | r_1), by enumeration; treating the
    levels as independent noisy copies gives a posterior with a visibly smaller sd (wrong)."""
    mech = MultiLevelGeometric([0.8, 0.6, 0.4], lower=bounds[0], upper=bounds[1])
    support = np.arange(0, 41)
    prior = stats.nbinom.logpmf(support, 4, 1 / 3)  # x ~ Poisson(lam), lam ~ Gamma(4, rate 0.5)
    release = np.array([9, 10, 9])
    full = _posterior(prior + mech.log_likelihood(np.broadcast_to(release, (support.size, 3)), support))
    first = _posterior(prior + mech.marginal(0).log_likelihood(np.full(support.size, release[0]), support))
    np.testing.assert_allclose(full, first, rtol=1e-12, atol=1e-300)
    naive = _posterior(prior + sum(mech.marginal(j).log_likelihood(np.full(support.size, release[j]), support)
                                   for j in range(3)))

    def sd(p):
        return math.sqrt(np.sum(p * support**2) - np.sum(p * support) ** 2)

    assert sd(full) == pytest.approx(1.5754385039, rel=1e-9)  # both bounds: 0..40 holds the posterior
    assert sd(naive) < 0.6 * sd(full)  # 0.81 against 1.58


def _assert_matches_exact(idata, name, mean, sd):
    """Draws of ``name`` have the exact mean and sd within 4 Monte Carlo standard errors
    (sd/sqrt(ess) for the mean, sd/sqrt(2 ess) for the sd)."""
    draws = idata.posterior[name].values.ravel()
    ess = float(az.ess(idata, var_names=[name])[name])
    assert abs(draws.mean() - mean) < 4 * sd / math.sqrt(ess)
    assert abs(draws.std() - sd) < 4 * sd / math.sqrt(2 * ess)


def test_observe_gives_the_exact_joint_and_dpinfer_sample_the_exact_posterior():
    """lam ~ Gamma(4, rate 0.5), x ~ Poisson(lam), three levels observed: the model's log-p is
    the prior plus the joint (1); dpinfer.sample's draws of x and lam match the enumerated
    posterior given r_1 alone (x's marginal is NegBinomial(4, 1/3), lam | x ~ Gamma(4 + x,
    rate 1.5)); the release is summed out like a single release of level 0."""
    eps = (1.0, 0.5, 0.2)
    mech = MultiLevelGeometric(eps)
    release = np.array([7, 9, 4])
    with pm.Model() as model:
        lam = pm.Gamma("lam", 4.0, 0.5)
        x = pm.Poisson("x", lam)
        mech.observe("r", x, observed=release)
    chain = float(mech.chain_log_likelihood(release))
    assert float(model["r_chain"].eval()) == pytest.approx(chain, rel=1e-15)
    with pm.Model() as prior_only:
        pm.Poisson("x", pm.Gamma("lam", 4.0, 0.5))
    point = {"lam_log__": np.log(5.0), "x": 6}
    joint = model.compile_logp()(point) - prior_only.compile_logp()(point)
    assert joint == pytest.approx(float(mech.log_likelihood(release, 6)), rel=1e-13)

    support = np.arange(0, 200)
    p = _posterior(stats.nbinom.logpmf(support, 4, 1 / 3) + DoubleGeometric(eps[0]).log_likelihood(
        np.full(support.size, release[0]), support))
    x_mean = np.sum(p * support)
    lam_mean = np.sum(p * (4 + support)) / 1.5
    lam_var = np.sum(p * ((4 + support) / 1.5**2 + ((4 + support) / 1.5) ** 2)) - lam_mean**2
    # the PyMC engine (the compiled engine gives the same posterior but spends ~20 s compiling)
    idata = dpinfer.sample(1000, tune=500, chains=2, random_seed=3, progressbar=False, model=model,
                           method="marginal")
    assert '"release": "r"' in idata.posterior.attrs["dpinfer"]
    _assert_matches_exact(idata, "x", x_mean, math.sqrt(np.sum(p * support**2) - x_mean**2))
    _assert_matches_exact(idata, "lam", lam_mean, math.sqrt(lam_var))


# --- utility ----------------------------------------------------------------------------------


def test_per_level_bias_and_variance():
    """Clamped: each level's marginal row G_{alpha_1} T_2 ... T_j (Lemma 3's matrices), its
    mean and variance by summation; unbounded: 0 and 2 alpha/(1 - alpha)^2."""
    mech = clamped3()
    law = ClampedGeometric(EPS3[0], 0, 4).transition_matrix()
    values = np.arange(5)
    x = np.arange(5)
    bias, var = mech.bias(x), mech.variance(x)
    assert bias.shape == var.shape == (5, 3)
    for j in range(3):
        if j:
            law = law @ lemma3_matrix(4, EPS3[j - 1], EPS3[j])
        mean = law @ values
        np.testing.assert_allclose(bias[:, j], mean - x, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(var[:, j], law @ values**2 - mean**2, rtol=1e-12)
    np.testing.assert_allclose(mech.mse(x), var + bias**2, rtol=1e-15)
    unbounded = MultiLevelGeometric(EPS3)
    a = np.array([0.2, 0.5, 0.8])
    expected = np.broadcast_to(2 * a / (1 - a) ** 2, (2, 3))
    np.testing.assert_allclose(unbounded.variance([3, 7]), expected, rtol=1e-14)
    np.testing.assert_array_equal(unbounded.bias([3, 7]), np.zeros((2, 3)))


def test_release_interval_is_level0s():
    """x -/+ q for the smallest whole q with P(|e| <= q) = 1 - 2 alpha^(q+1)/(1 + alpha) >= prob,
    alpha = alpha_1 = 0.2 (level 0, sufficient for x)."""
    mech = MultiLevelGeometric(EPS3)
    lo, hi = mech.release_interval([10, 20], 0.99)
    q = min(q for q in range(50) if 1 - 2 * 0.2 ** (q + 1) / 1.2 >= 0.99)
    np.testing.assert_array_equal(lo, [10 - q, 20 - q])
    np.testing.assert_array_equal(hi, [10 + q, 20 + q])


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"epsilons": [0.5, 1.0]}, ValueError, "strictly decreasing"),
        ({"epsilons": [1.0, 1.0]}, ValueError, "strictly decreasing"),
        ({"epsilons": []}, ValueError, "at least one"),
        ({"epsilons": 1.0}, TypeError, "epsilons"),
        ({"epsilons": [1.0, -0.5]}, ValueError, r"epsilons\[1\]"),
        ({"epsilons": [1.0, 0.5], "upper": 5}, ValueError, "upper needs lower"),
        ({"epsilons": [1.0, 0.5], "lower": 5, "upper": 5}, ValueError, "lower must be < upper"),
        ({"epsilons": [1.0, 0.5], "sensitivity": 1.5}, ValueError, "sensitivity"),
    ],
)
def test_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiLevelGeometric(**kwargs)


def test_bad_calls():
    mech = clamped3()
    with pytest.raises(ValueError, match="last axis of length 3"):
        mech.log_likelihood([[1, 2]], [1])
    with pytest.raises(ValueError, match="last axis of length 3"):
        mech.log_likelihood(2, 1)
    with pytest.raises(ValueError, match=r"release must lie in \[0, 4\]"):
        mech.log_likelihood([[1, 2, 5]], [1])
    with pytest.raises(ValueError, match="whole numbers"):
        mech.log_likelihood([[1, 2, 2.5]], [1])
    with pytest.raises(ValueError, match="true_values"):
        mech.log_likelihood(np.zeros((2, 3), dtype=int), [1, 2, 3])
    with pytest.raises(ValueError, match=r"true_values must lie in \[0, 4\]"):
        mech.bias([5])
    with pytest.raises(ValueError, match="level must lie in 0..2"):
        mech.coalition_privacy([0, 3])
    with pytest.raises(ValueError, match="at least one level"):
        mech.coalition_privacy([])
    with pytest.raises(ValueError, match="level must lie in 1..2"):
        mech.log_transition(0, 1, 1)
    with pytest.raises(ValueError, match="finite bounds"):
        MultiLevelGeometric(EPS3, lower=0).transition_matrix(1)
    with pytest.raises(TypeError, match="rng"):
        mech.release([1], rng=1)
    with pytest.raises(TypeError, match="observed must be an array"):
        with pm.Model():
            data = pm.Data("d", np.array([1, 2, 3]))
            mech.observe("r", pm.Poisson("x", 2.0), observed=data)
    with pytest.raises(ValueError, match="shape"):
        with pm.Model():
            mech.observe("r", pm.Poisson("x", 2.0, shape=2), observed=[[1, 2, 3]])
