"""RandomizedResponse (dpinfer.mechanisms.randomized_response) against explicit Kronecker
powers, brute-force enumeration of every record's report (exact fractions), closed forms, and
the dapper vignette's posterior means (UC Berkeley admissions, case B2).

Goodness-of-fit tests use fixed seeds, so they are deterministic; each is a chi-square test at
level 1e-3 (adjacent outcomes pooled until every expected count is >= 5, see
test_exact_sampling.chi_square_pvalue)."""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from numpy.polynomial.legendre import leggauss
from scipy import stats
from test_exact_sampling import chi_square_pvalue

from dpinfer.mechanisms.base import PrivacyAudit
from dpinfer.mechanisms.randomized_response import RandomizedResponse

ALPHA = 1e-3  # level of every chi-square test


def tables_with_total(n, cells):
    """Every table of ``cells`` non-negative counts summing to n (stars and bars)."""
    out = []
    for bars in itertools.combinations(range(n + cells - 1), cells - 1):
        edges = (-1,) + bars + (n + cells - 1,)
        out.append(tuple(edges[i + 1] - edges[i] - 1 for i in range(cells)))
    return out


def exact_matrix(p, k):
    """M[c, o] = prod_j (p if bit j of c equals bit j of o else 1 - p), in exact fractions."""
    p = Fraction(p)
    return [
        [math.prod(p if (c >> j) & 1 == (o >> j) & 1 else 1 - p for j in range(k)) for o in range(2**k)]
        for c in range(2**k)
    ]


def brute_force_law(p, k, true_table):
    """P(S = s | t) for every report table s, summing prod_i M[c_i, o_i] over every assignment
    (o_1, ..., o_n) of reports to the n records (exact fractions)."""
    m = exact_matrix(p, k)
    records = [c for c, count in enumerate(true_table) for _ in range(count)]
    law = {}
    for reports in itertools.product(range(2**k), repeat=len(records)):
        s = tuple(np.bincount(reports, minlength=2**k))
        law[s] = law.get(s, 0) + math.prod(m[c][o] for c, o in zip(records, reports))
    return law


def multinomial_pmf(table, probs):
    return stats.multinomial.pmf(table, sum(table), probs)


# --- transition matrix -----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("p", [0.6, 0.75, 0.9])
def test_transition_matrix_is_kronecker_power(p, k):
    mech = RandomizedResponse(p, k)
    m = mech.transition_matrix()
    a = np.array([[p, 1 - p], [1 - p, p]])
    np.testing.assert_allclose(m, functools.reduce(np.kron, [a] * k), rtol=1e-15, atol=0)
    np.testing.assert_allclose(m, np.array(exact_matrix(p, k), dtype=float), rtol=1e-15, atol=0)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, rtol=1e-15)
    np.testing.assert_array_equal(m, m.T)
    assert m.shape == (2**k, 2**k) and mech.n_cells == 2**k


def test_transition_matrix_refuses_large_tables():
    with pytest.raises(ValueError, match="attributes"):
        RandomizedResponse(0.8, 11).transition_matrix()


# --- privacy ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("p", [0.55, 0.75, Fraction(9, 10)])
def test_audit_matches_claim(p, k):
    mech = RandomizedResponse(p, k)
    claimed = k * math.log(float(p) / (1 - float(p)))
    assert mech.epsilon_per_attribute == pytest.approx(claimed / k, rel=1e-14)
    assert mech.epsilon == pytest.approx(claimed, rel=1e-14)
    guarantee = mech.privacy
    assert guarantee.delta == 0.0 and guarantee.neighbour == "substitution"
    assert guarantee.sensitivity == k and "local DP" in guarantee.note
    audit = mech.audit()
    assert audit.holds
    assert audit.measured_epsilon == pytest.approx(claimed, rel=1e-12)
    assert audit.measured_delta == 0.0
    # a smaller claim must fail the same comparison
    smaller = PrivacyAudit(claimed * (1 - 1e-6), 0.0, audit.measured_epsilon, audit.measured_delta, "test")
    assert not smaller.holds


def test_audit_refuses_more_than_eight_attributes():
    with pytest.raises(ValueError, match="attributes"):
        RandomizedResponse(0.8, 9).audit()


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, math.log(3), 3.0])
def test_from_epsilon_round_trips(epsilon, k):
    mech = RandomizedResponse.from_epsilon(epsilon, attributes=k)
    assert mech.p == pytest.approx(math.exp(epsilon) / (1 + math.exp(epsilon)), rel=1e-15)
    assert mech.epsilon_per_attribute == pytest.approx(epsilon, rel=1e-12)
    assert mech.epsilon == pytest.approx(k * epsilon, rel=1e-12)
    assert mech.attributes == k
    assert RandomizedResponse.from_epsilon(math.log(3)).p == pytest.approx(0.75, rel=1e-15)


# --- exact likelihood ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p, k, true_table",
    [(0.75, 1, (2, 1)), (0.7, 2, (1, 0, 2, 1)), (Fraction(2, 3), 3, (1, 0, 0, 1, 0, 0, 1, 0))],
    ids=["k1", "k2", "k3"],
)
def test_log_likelihood_against_brute_force(p, k, true_table):
    mech = RandomizedResponse(p, k)
    law = brute_force_law(mech._p_exact, k, true_table)  # float p at its exact binary value
    n = sum(true_table)
    tables = tables_with_total(n, 2**k)
    assert set(law) <= set(tables)
    probs = np.exp([mech.log_likelihood(s, true_table) for s in tables])
    want = np.array([float(law.get(s, 0)) for s in tables])
    np.testing.assert_allclose(probs, want, rtol=1e-13, atol=0)
    assert probs.sum() == pytest.approx(1.0, abs=1e-13)
    # wrong totals are impossible
    assert mech.log_likelihood(tables[0][:-1] + (tables[0][-1] + 1,), true_table) == -np.inf


def test_log_likelihood_one_attribute_closed_form():
    """k = 1: S_0 = Binomial(t_0, p) + Binomial(t_1, 1 - p), a convolution of binomial pmfs."""
    mech = RandomizedResponse(0.8, 1)
    t0, t1 = 30, 20
    conv = np.convolve(stats.binom.pmf(np.arange(t0 + 1), t0, 0.8), stats.binom.pmf(np.arange(t1 + 1), t1, 0.2))
    ll = np.array([mech.log_likelihood((s0, 50 - s0), (t0, t1)) for s0 in range(51)])
    np.testing.assert_allclose(np.exp(ll), conv, rtol=1e-11, atol=1e-300)


def test_log_likelihood_does_not_underflow():
    mech = RandomizedResponse(0.75, 1)
    # every one of 2000 bits flipped: (1/4)^2000 = 1e-1204, far below the float range
    assert mech.log_likelihood((0, 2000), (2000, 0)) == pytest.approx(2000 * math.log(0.25), rel=1e-13)
    assert mech.log_likelihood((0, 0), (0, 0)) == 0.0


def test_log_likelihood_refuses_huge_state_space():
    mech = RandomizedResponse(0.75, 2)
    with pytest.raises(ValueError, match="marginal form"):
        mech.log_likelihood((104, 120, 74, 102), (100, 100, 100, 100))


# --- releases ---------------------------------------------------------------------------------------


def test_release_frequencies_match_exact_likelihood():
    mech = RandomizedResponse(0.7, 2)
    true_table = (1, 0, 2, 1)
    tables = tables_with_total(4, 4)
    index = {s: i for i, s in enumerate(tables)}
    probs = np.exp([mech.log_likelihood(s, true_table) for s in tables])
    rng = np.random.default_rng(2024)
    draws = [index[tuple(mech.release(true_table, rng))] for _ in range(20_000)]
    assert chi_square_pvalue(draws, np.arange(len(tables)), probs) > ALPHA


@pytest.mark.parametrize("cell", [0, 5, 7])
def test_release_records_rows_match_transition_matrix(cell):
    mech = RandomizedResponse(Fraction(3, 4), 3)
    reports = mech.release_records(np.full(20_000, cell), np.random.default_rng(7 + cell))
    assert reports.dtype == np.int64 and reports.shape == (20_000,)
    assert chi_square_pvalue(reports, np.arange(8), mech.transition_matrix()[cell]) > ALPHA


def test_release_shapes_and_zero_table():
    mech = RandomizedResponse(0.8, 2)
    rng = np.random.default_rng(3)
    out = mech.release([0, 0, 0, 0], rng)
    np.testing.assert_array_equal(out, [0, 0, 0, 0])
    out = mech.release([5, 1, 0, 9], rng)
    assert out.sum() == 15 and out.shape == (4,) and out.dtype == np.int64
    assert mech.release_records([[0, 3], [1, 2]], rng).shape == (2, 2)
    assert mech.exact_sampler and mech.discrete


# --- marginal form and conditional draws ---------------------------------------------------------


def test_marginal_form_is_exact():
    """sum_t Multinomial(t; n, pi) P(s | t) = Multinomial(s; n, M^T pi) for every s."""
    mech = RandomizedResponse(0.7, 2)
    pi = np.array([0.1, 0.2, 0.3, 0.4])
    n = 4
    q = mech.report_probabilities(pi)
    np.testing.assert_allclose(q, pi @ mech.transition_matrix(), rtol=1e-15)
    tables = tables_with_total(n, 4)
    for s in tables:
        mixed = sum(multinomial_pmf(t, pi) * math.exp(mech.log_likelihood(s, t)) for t in tables)
        assert mixed == pytest.approx(multinomial_pmf(s, q), abs=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_report_probabilities_numpy_and_symbolic(k):
    mech = RandomizedResponse(0.8, k)
    rng = np.random.default_rng(k)
    pis = rng.dirichlet(np.ones(2**k), size=3)
    m = mech.transition_matrix()
    np.testing.assert_allclose(mech.report_probabilities(pis), pis @ m, rtol=1e-14)  # batch
    sym = pt.vector("pi", shape=(2**k,))
    np.testing.assert_allclose(mech.report_probabilities(sym).eval({sym: pis[0]}), pis[0] @ m, rtol=1e-14)
    np.testing.assert_allclose(mech.unbiased_table(np.arange(2**k)), np.linalg.solve(m.T, np.arange(2**k)), rtol=1e-12)


def test_dist_given_probabilities_is_multinomial():
    mech = RandomizedResponse(0.75, 2)
    s = np.array([104, 120, 74, 102])
    pi = np.array([0.28, 0.34, 0.11, 0.27])
    want = stats.multinomial.logpmf(s, 400, pi @ mech.transition_matrix())
    assert pm.logp(mech.dist_given_probabilities(pi, 400), s).eval() == pytest.approx(want, rel=1e-12)
    sym = pt.vector("pi", shape=(4,))
    got = pm.logp(mech.dist_given_probabilities(sym, 400), s).eval({sym: pi})
    assert got == pytest.approx(want, rel=1e-12)


def test_draw_true_table_matches_exact_conditional():
    """P(t | s, pi) proportional to Multinomial(t; n, pi) P(s | t), P(s | t) by the exact DP."""
    mech = RandomizedResponse(0.7, 2)
    pi = np.array([0.1, 0.2, 0.3, 0.4])
    s = (2, 1, 0, 1)
    tables = tables_with_total(4, 4)
    weights = np.array([multinomial_pmf(t, pi) * math.exp(mech.log_likelihood(s, t)) for t in tables])
    probs = weights / weights.sum()
    index = {t: i for i, t in enumerate(tables)}
    rng = np.random.default_rng(99)
    draws = [index[tuple(mech.draw_true_table(pi, s, rng))] for _ in range(20_000)]
    assert chi_square_pvalue(draws, np.arange(len(tables)), probs) > ALPHA


def test_dapper_berkeley_b2_posterior_means():
    """dapper vignette, UC Berkeley admissions (B2): n = 400, k = 2, p = 3/4, release
    (104, 120, 74, 102), prior Dirichlet(1, 1, 1, 1); published posterior means
    (0.2823, 0.3358, 0.1096, 0.2724).

    Deterministic integration over the 3-simplex: pi = (u1, (1 - u1) u2, (1 - u1)(1 - u2) u3,
    rest), Jacobian (1 - u1)^2 (1 - u2), u in [0, 1]^3 by a 40-point Gauss-Legendre rule per
    axis; the integrand (uniform prior x prod_o (M^T pi)_o^s_o) is a smooth polynomial, and the
    means agree with a 200-point rule to < 1e-12, so the grid error is negligible next to the
    5e-4 tolerance (the published values have 4 decimals and MCMC error; the exact means are
    0.28233, 0.33572, 0.10950, 0.27245, at most 1.0e-4 from them)."""
    mech = RandomizedResponse(Fraction(3, 4), 2)
    s = np.array([104, 120, 74, 102])
    m = mech.transition_matrix()
    x, w = leggauss(40)
    u, w = (x + 1) / 2, w / 2
    u1, u2, u3 = np.meshgrid(u, u, u, indexing="ij")
    pi = np.stack([u1, (1 - u1) * u2, (1 - u1) * (1 - u2) * u3, (1 - u1) * (1 - u2) * (1 - u3)], axis=-1)
    log_weight = (
        np.log(pi @ m) @ s
        + 2 * np.log1p(-u1) + np.log1p(-u2)
        + np.log(w[:, None, None] * w[None, :, None] * w[None, None, :])
    )
    f = np.exp(log_weight - log_weight.max())
    means = (f[..., None] * pi).sum(axis=(0, 1, 2)) / f.sum()
    np.testing.assert_allclose(means, [0.2823, 0.3358, 0.1096, 0.2724], atol=5e-4, rtol=0)
    np.testing.assert_allclose(means, [0.28233, 0.33572, 0.10950, 0.27245], atol=1e-5, rtol=0)


# --- utility ----------------------------------------------------------------------------------------


def test_bias_variance_unbiased_against_enumeration():
    mech = RandomizedResponse(0.7, 2)
    t = (1, 0, 2, 1)
    law = brute_force_law(mech._p_exact, 2, t)
    tables = np.array(list(law), dtype=float)
    probs = np.array([float(v) for v in law.values()])
    mean = probs @ tables
    cov = (tables - mean).T @ ((tables - mean) * probs[:, None])
    np.testing.assert_allclose(mech.bias(t), mean - np.array(t), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(mech.variance(t), np.diag(cov), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(mech.covariance(t), cov, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(mech.mse(t), np.diag(cov) + (mean - np.array(t)) ** 2, rtol=1e-13)
    unbiased = np.array([mech.unbiased_table(s.astype(int)) for s in tables])
    np.testing.assert_allclose(probs @ unbiased, t, rtol=1e-12, atol=1e-12)


# --- argument errors -------------------------------------------------------------------------------

MECH = RandomizedResponse(0.75, 2)
RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "make, exc, word",
    [
        (lambda: RandomizedResponse(0.5), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(1), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(1.0), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(0.3), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(1.2), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(float("nan")), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(float("inf")), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse("0.7"), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(True), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(Fraction(1, 2)), ValueError, r"p must .*\(1/2, 1\)"),
        (lambda: RandomizedResponse(0.75, 0), ValueError, "attributes must be a whole number"),
        (lambda: RandomizedResponse(0.75, 2.5), ValueError, "attributes must be a whole number"),
        (lambda: RandomizedResponse(0.75, 17), ValueError, "attributes must be a whole number"),
        (lambda: RandomizedResponse(0.75, "2"), ValueError, "attributes must be a whole number"),
        (lambda: RandomizedResponse.from_epsilon(0), ValueError, "epsilon"),
        (lambda: RandomizedResponse.from_epsilon(float("nan")), ValueError, "epsilon"),
        (lambda: RandomizedResponse.from_epsilon(40.0), ValueError, "epsilon"),
        (lambda: MECH.release([1, 2, 3], RNG), ValueError, "true_table must be a table of 2"),
        (lambda: MECH.release([1, -2, 3, 0], RNG), ValueError, "true_table must hold non-negative"),
        (lambda: MECH.release([1, 2.5, 3, 0], RNG), ValueError, "true_table must hold whole numbers"),
        (lambda: MECH.release([1, 2, 3, 0], 0), TypeError, "rng"),
        (lambda: MECH.release_records([0, 4], RNG), ValueError, "cells"),
        (lambda: MECH.release_records([0.5], RNG), ValueError, "cells"),
        (lambda: MECH.log_likelihood([1, 2, 3], [1, 2, 3, 0]), ValueError, "release_table"),
        (lambda: MECH.log_likelihood([1, 2, 3, 0], [[1, 2, 3, 0]]), ValueError, "true_table"),
        (lambda: MECH.log_likelihood([1, -2, 3, 4], [1, 2, 3, 0]), ValueError, "release_table"),
        (lambda: MECH.log_likelihood([1, 2, 3, 0], [1, 2, 0.5, 0]), ValueError, "true_table"),
        (lambda: MECH.bias([1, 2, 3]), ValueError, "true_table"),
        (lambda: MECH.variance([1, -1, 3, 0]), ValueError, "true_table"),
        (lambda: MECH.unbiased_table([1, 2, 3, 4, 5]), ValueError, "release_table"),
        (lambda: MECH.report_probabilities([0.2, 0.2, 0.2, 0.2]), ValueError, "pi must lie on the probability simplex"),
        (lambda: MECH.report_probabilities([0.6, -0.1, 0.3, 0.2]), ValueError, "pi must lie on the probability simplex"),
        (lambda: MECH.report_probabilities([0.5, 0.5]), ValueError, "pi must hold 4"),
        (lambda: MECH.report_probabilities([0.5, np.nan, 0.5, 0]), ValueError, "pi"),
        (lambda: MECH.report_probabilities(pt.vector("x", shape=(3,))), ValueError, "pi must hold 4"),
        (lambda: MECH.dist_given_probabilities([0.25] * 4, -1), ValueError, "n must"),
        (lambda: MECH.draw_true_table([0.5, 0.5, 0, 0.1], [1, 2, 3, 4], RNG), ValueError, "pi"),
        (lambda: MECH.draw_true_table([0.25] * 4, [1, 2, 3], RNG), ValueError, "release_table"),
        (lambda: MECH.log_likelihood_bound_outside([1, 2, 3, 4], 2), NotImplementedError, "log_likelihood"),
        (lambda: MECH.release_interval([1, 2, 3, 4]), NotImplementedError, "unbiased_table"),
    ],
)
def test_bad_arguments_name_the_argument(make, exc, word):
    with pytest.raises(exc, match=word):
        make()


# --- dp.sample: the true table summed out, then drawn exactly ------------------------------------
def test_dist_log_p_is_the_exact_likelihood():
    true_table = np.array([3, 1, 0, 2])
    release = np.array([2, 2, 1, 1])
    rv = MECH.dist(pt.as_tensor(true_table))
    np.testing.assert_allclose(pm.logp(rv, release).eval(), MECH.log_likelihood(release, true_table))
    draw = pm.draw(rv, random_seed=1)
    assert draw.shape == (4,) and draw.sum() == true_table.sum()


def test_sample_matches_enumeration_of_every_true_table():
    """Dirichlet(alpha) cell probabilities, a true table t ~ Multinomial(10, p), its report table
    under two bits kept with probability 0.7. Reference by enumerating all 286 tables:
    P(t | s) ∝ DirichletMultinomial(t; alpha) P(s | t) (exact likelihood), E[p | s] =
    sum_t P(t | s) (alpha + t) / (sum alpha + n). Tolerance: 4 Monte Carlo standard errors
    (ESS from ArviZ)."""
    import arviz as az

    import dpinfer as dp

    mech, alpha, n, s = RandomizedResponse(0.7, attributes=2), np.array([1.0, 2.0, 1.5, 1.0]), 10, [4, 1, 3, 2]
    tables = np.array(tables_with_total(n, 4))
    log_w = np.array([stats.dirichlet_multinomial.logpmf(t, alpha, n) + mech.log_likelihood(s, t)
                      for t in tables])
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    exact_t = w @ tables
    exact_p = w @ ((alpha + tables) / (alpha.sum() + n))
    with pm.Model() as model:
        p = pm.Dirichlet("p", alpha)
        t = pm.Multinomial("t", n=n, p=p)
        mech.observe("release", t, s)
    idata = dp.sample(2000, tune=1000, chains=2, random_seed=3, progressbar=False, model=model)
    post = idata.posterior
    for name, exact in (("p", exact_p), ("t", exact_t)):
        draws = post[name].values.reshape(-1, 4)
        ess = np.asarray(az.ess(post[name])).reshape(-1)
        se = draws.std(axis=0) / np.sqrt(ess)
        assert np.all(np.abs(draws.mean(axis=0) - exact) < 4 * se), (name, draws.mean(axis=0), exact, se)
    assert np.all(post["t"].values.sum(axis=-1) == n)
    assert "summed out" in idata.posterior.attrs["dpinfer"]


def test_sample_refuses_tables_it_cannot_sum_out():
    import dpinfer as dp
    from dpinfer.inference.latents import NotMarginalisableError

    with pm.Model() as poisson_cells:
        t = pm.Poisson("t", 3.0, shape=4)
        MECH.observe("release", t, [1, 2, 3, 4])
    with pm.Model() as two_children:
        t = pm.Multinomial("t", n=10, p=np.full(4, 0.25))
        MECH.observe("release", t, [1, 2, 3, 4])
        pm.Normal("other", t.sum(), 1.0, observed=9.0)
    for model in (poisson_cells, two_children):
        with pytest.raises(NotMarginalisableError, match="pm.Multinomial"):
            dp.sample(10, tune=10, chains=1, progressbar=False, model=model)
    with pm.Model() as wrong_n:
        t = pm.Multinomial("t", n=12, p=pm.Dirichlet("p", np.ones(4)))
        MECH.observe("release", t, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="number of reports"):
        dp.sample(10, tune=10, chains=1, progressbar=False, model=wrong_n)
