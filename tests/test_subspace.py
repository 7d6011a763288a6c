"""The generalized Laplace mechanism on integer subspaces (seed 001): privacy by enumeration,
release laws against exact ones, the Illinois-size magnitudes, likelihoods."""

import itertools
import math

import json

import numpy as np
import pymc as pm
import pytest
from scipy.special import gammaln

import dpinfer as dp
from dpinfer.mechanisms.subspace import GeneralizedLaplace
from law_checks import empirical_tv, iid_tv_quantile, kernel_lattice_law, posterior_mean_z

EPS = 0.5


@pytest.mark.parametrize("norm", ["l1", "l2"])
@pytest.mark.parametrize("inv", [dp.Invariants.total(3), dp.Invariants.margins((2, 2), [(0,), (1,)])])
def test_privacy_audit_attains_epsilon(norm, inv):
    # Theorem 10: loss <= epsilon ||x - x'|| in the target's norm, attained when s - x is a
    # multiple of x - x' (itself a lattice vector)
    audit = GeneralizedLaplace(EPS, inv, norm).audit()
    assert audit.holds
    assert audit.measured_epsilon == pytest.approx(EPS, rel=1e-12)


def test_l2_loss_in_l1_distance_can_exceed_epsilon():
    # the l2 guarantee is per unit of ||x - x'||_2, not ||x - x'||_1: a check that the audit
    # really measures in the declared norm
    mech = GeneralizedLaplace(EPS, dp.Invariants.total(3), "l2")
    x, x2 = np.array([2, 0, 1]), np.array([1, 1, 1])
    z = 5 * (x2 - x)  # s - x parallel to x' - x: the loss attains eps ||x - x'||_2
    s = x + z
    loss = mech.log_likelihood(s, x2) - mech.log_likelihood(s, x)
    assert loss == pytest.approx(EPS * math.sqrt(2))
    assert loss < EPS * np.abs(x - x2).sum()


def test_l1_is_double_geometric_conditioned_on_the_invariants():
    inv = dp.Invariants.groups([0, 0, 1, 1, 1])
    mech = GeneralizedLaplace(EPS, inv, "l1")
    same = dp.Conditioned(dp.DoubleGeometric(EPS), inv)
    s, x = np.array([3, 1, 4, 0, 2]), np.array([2, 2, 1, 3, 2])
    assert mech.log_likelihood(s, x) == pytest.approx(same.log_likelihood(s, x), rel=1e-14)
    assert mech.sampler == "exact"
    np.testing.assert_allclose(mech.variance(x), same.variance(x))


def test_illinois_size_total_magnitudes():
    # reference note 001 §9.3: d = 102, epsilon = 0.192, l1, one total: per-county sd ~ 7.28 and
    # E||z||_1 ~ 523 (from 2000 rejection draws), P(sum e = 0) = 0.005391 (§10, T8). Exact values
    # by convolution (sd 7.264, E||z||_1 = 522.8); draws within 4 Monte Carlo standard errors.
    mech = GeneralizedLaplace(0.192, dp.Invariants.total(102), "l1")
    k, marginals = mech.as_conditioned().noise_marginals()
    offsets = np.arange(-k, k + 1)
    sd_exact = math.sqrt(float(marginals[0] @ offsets**2))
    l1_exact = 102 * float(marginals[0] @ np.abs(offsets))
    assert sd_exact == pytest.approx(7.28, abs=0.02)
    assert l1_exact == pytest.approx(523, abs=3)
    assert math.exp(mech.as_conditioned().log_normaliser()) == pytest.approx(0.005391, abs=5e-7)
    z = mech.sample_noise(np.random.default_rng(4), size=2000)
    assert np.all(z.sum(axis=1) == 0)
    norms = np.abs(z).sum(axis=1)
    assert abs(norms.mean() - l1_exact) < 4 * norms.std() / math.sqrt(z.shape[0])
    # per-cell variance pooled over cells (cells of one draw are dependent: use the per-draw mean)
    per_draw = (z.astype(float) ** 2).mean(axis=1)
    assert abs(per_draw.mean() - sd_exact**2) < 4 * per_draw.std() / math.sqrt(z.shape[0])


def exact_lattice_law(mech, radius):
    return kernel_lattice_law(
        mech.invariants, lambda z: [mech.log_likelihood(zi, np.zeros_like(zi)) for zi in z], radius)


@pytest.mark.parametrize("chain, iterations", [("gibbs", 30), ("walk", 200)])
@pytest.mark.parametrize("inv", [dp.Invariants.total(3), dp.Invariants.margins((2, 2), [(0,), (1,)])])
def test_mcmc_release_law_l2(inv, chain, iterations):
    # the chain after `iterations` sweeps (Gibbs) or steps (walk, from pi_0) against the
    # enumerated l2 law: every release keeps the invariants; the law of z matches in total
    # variation within Monte Carlo error
    mech = GeneralizedLaplace(0.8, inv, "l2", iterations=iterations, chain=chain)
    assert mech.sampler == chain
    rng = np.random.default_rng(8)
    x = np.arange(inv.n_cells) + 3
    s = np.array([mech.release(x, rng) for _ in range(200)])
    assert np.all(inv.values(s) == inv.values(x))
    z = mech.sample_noise(rng, size=20_000)
    z_all, p = exact_lattice_law(mech, 25)
    assert empirical_tv(z, z_all, p) <= iid_tv_quantile(p, z.shape[0], rng, n_sims=200) * 1.2


def test_l1_exact_sampler_wherever_the_class_lattice_enumerates():
    # 2 x 3 margins: every cell its own class, a 2-dimensional lattice -> exact joint draws
    inv = dp.Invariants.margins((2, 3), [(0,), (1,)])
    mech = GeneralizedLaplace(0.8, inv, "l1")
    assert mech.sampler == "exact" and mech.certify() is mech
    assert GeneralizedLaplace(0.8, dp.Invariants.margins((4, 4), [(0,), (1,)]), "l1").sampler == "gibbs"
    rng = np.random.default_rng(11)
    z = mech.sample_noise(rng, size=20_000)
    z_all, p = exact_lattice_law(mech, 25)
    assert empirical_tv(z, z_all, p) <= iid_tv_quantile(p, z.shape[0], rng, n_sims=200)


def test_coupling_diagnostic_and_mcmc_delta():
    mech = GeneralizedLaplace(0.8, dp.Invariants.total(3), "l2")
    times = mech.coupling(n_runs=100, lag=50, rng=np.random.default_rng(2), max_iterations=20_000)
    assert times.n_censored == 0
    n = times.iterations_for(0.05)
    assert n >= 1
    assert mech.mcmc_delta(0.01) == pytest.approx((1 + math.exp(0.8)) * 0.01)


def test_errors():
    inv = dp.Invariants.total(3)
    with pytest.raises(ValueError, match="norm must be"):
        GeneralizedLaplace(EPS, inv, "linf")
    with pytest.raises(ValueError, match="set iterations"):
        GeneralizedLaplace(EPS, inv, "l2").release([1, 2, 3], np.random.default_rng(0))
    with pytest.raises(NotImplementedError, match="l1 norm"):
        GeneralizedLaplace(EPS, inv, "l2").variance(np.zeros(3))
    with pm.Model():
        x = pm.Poisson("x", 3.0, shape=3)
        with pytest.raises(ValueError, match="observe"):  # negative total: no counts fit
            GeneralizedLaplace(EPS, inv, "l2").observe("s", x, [-5, 1, 1])
        with pytest.raises(ValueError, match="whole numbers|integer"):
            GeneralizedLaplace(EPS, inv, "l2").observe("s", x, [1.5, 1, 1])
    with pytest.raises(ValueError, match="proposal_a"):
        GeneralizedLaplace(EPS, inv, proposal_a=1.5)
    with pytest.raises(TypeError, match="Invariants"):
        GeneralizedLaplace(EPS, np.ones((1, 3)))


def _coupling_4x4(norm, lag, n_runs, cap):
    inv = dp.Invariants.margins((4, 4), [(0,), (1,)])
    mech = GeneralizedLaplace(0.25, inv, norm, chain="walk")  # seed 001's a = e^-1 (l1), e^-2 (l2)
    times = mech.coupling(n_runs=n_runs, lag=lag, rng=np.random.default_rng(1), max_iterations=cap)
    assert times.n_censored == 0
    return times.tv_upper_bound([0, 3_000, 10_000, 30_000, 100_000]).estimate


def test_coupling_reproduces_seed_001_l1_on_the_4x4_table():
    # reference note 001 §9.2: 200 coupled pairs, l1 target, epsilon = 0.25: the TV estimate
    # reaches ~0 by ~10^4 iterations (note's reproduction: 1.78 at 0, 0.12 at 3000, 0 by 10^4).
    # Measured with this seed: 1.97, 0.27, 0.025, 0, 0.
    tv = _coupling_4x4("l1", 1000, 200, 100_000)
    assert tv[0] > 1 and tv[2] < 0.1 and tv[3] < 0.02


@pytest.mark.validation
def test_coupling_reproduces_seed_001_l2_on_the_4x4_table():
    # l2 target: ~10^5 iterations (note: 2.3 at 0, 1.3 at 10^4, 0.4 at 3 10^4, 0 by 10^5).
    # Measured with this seed: 2.34, 1.90, 1.34, 0.47, 0 (100 pairs, L = 10^4; ~25 s).
    tv = _coupling_4x4("l2", 10_000, 100, 400_000)
    assert tv[2] > 0.5 and tv[3] > 0.1 and tv[4] < 0.05


# --- the l2 likelihood in dp.sample ------------------------------------------------------------


def _fibre_posterior(inv, s, eps, norm):
    """Posterior of counts x ~ Poisson(lam) i.i.d. (any Gamma prior on lam: the fibre fixes the
    total, so lam factors out) given a release s with likelihood exp(-eps ||s - x||), by
    enumerating the fibre {x >= 0 : A x = A s}."""
    a_mat = inv.constraint_matrix
    box = np.array(list(itertools.product(range(13), repeat=inv.n_cells)))
    fibre = box[np.all(box @ a_mat.T == a_mat @ s, axis=1)]
    r = s - fibre
    dist = np.sqrt((r ** 2).sum(1)) if norm == "l2" else np.abs(r).sum(1)
    log_w = -eps * dist - gammaln(fibre + 1).sum(1)
    p = np.exp(log_w - log_w.max())
    return fibre, p / p.sum()


def test_l2_posterior_matches_enumeration():
    """dp.sample with an l2 release (exact line conditionals of the joint factor) against the
    enumerated posterior on a 2 x 3 table with both margins; the posterior under the l1 norm
    at the same epsilon differs detectably, so the test can fail."""
    inv = dp.Invariants.margins((2, 3), [(0,), (1,)])
    s = np.array([3, 0, 5, 1, 4, 0])
    mech = GeneralizedLaplace(0.7, inv, "l2")
    fibre, p = _fibre_posterior(inv, s, 0.7, "l2")
    _, p_l1 = _fibre_posterior(inv, s, 0.7, "l1")
    with pm.Model():
        lam = pm.Gamma("lam", 2.0, 0.5)
        x = pm.Poisson("x", lam, shape=6)
        mech.observe("s", x, s)
        idata = dp.sample(2000, tune=500, chains=2, cores=1, random_seed=3, progressbar=False)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["max_relative_error_bound"] <= report["tol"]
    draws = idata.posterior["x"].values.reshape(-1, 6)
    assert np.all(inv.values(draws) == inv.values(s))
    z, se = posterior_mean_z(idata, "x", fibre, p)
    assert np.all(np.abs(z) < 4), z
    assert np.max(np.abs(draws.mean(0) - p_l1 @ fibre) / se) > 4


def test_l2_dist_logp_and_window_bound():
    inv = dp.Invariants.total(3)
    mech = GeneralizedLaplace(0.6, inv, "l2")
    s, x = np.array([4, 0, 2]), np.array([1, 2, 3])
    logp = pm.logp(mech.dist(x), s).eval()
    assert logp.sum() == pytest.approx(-0.6 * np.sqrt(14))
    assert np.all(np.isinf(pm.logp(mech.dist(x), np.array([4, 0, 3])).eval()))
    assert mech.log_likelihood(s, x) == pytest.approx(-0.6 * np.sqrt(14))
    # the tail bound: exp(-eps ||s - x||_2) for every x on the fibre with a cell beyond k
    k = 3
    bound = mech.log_likelihood_bound_outside(s, k)
    fibre = np.array([v for v in itertools.product(range(-10, 17), repeat=3) if sum(v) == 6])
    far = np.abs(fibre - s) > k
    for i in range(3):
        worst = max(mech.log_likelihood(s, v) for v in fibre[far[:, i]])
        assert worst <= bound[i] + 1e-12
