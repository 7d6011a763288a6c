"""Releases conditioned on invariants and non-negativity (seed 000's congenial mechanism):
normaliser, samplers of both grades, likelihood, utility and posterior, against enumeration."""

from __future__ import annotations

import json

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from scipy import stats
from scipy.special import gammaln

import dpinfer as dp
from dpinfer.lattice.class_convolution import NormaliserTracker
from dpinfer.lattice.independence_sampler import unimodular_block
from law_checks import posterior_mean_z

# a 2 x 3 "sex by age" table: total, first-row total, adult (last two columns) total
SEX_BY_AGE = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 1, 1]])
# seed 000 Table 1: the confidential 2 x 23 table (reference note 000 §4.1)
TABLE1 = np.array([8, 6, 3, 6, 4, 4, 4, 8, 5, 7, 7, 6, 1, 5, 4, 4, 9, 6, 2, 8, 8, 8, 7,
                   3, 4, 5, 8, 6, 4, 5, 5, 5, 6, 10, 7, 3, 2, 5, 11, 6, 4, 7, 4, 5, 3, 8])


def table1_invariants() -> dp.Invariants:
    A = np.zeros((3, 46), dtype=np.int64)
    A[0] = 1
    A[1, :23] = 1
    A[2, 4:23] = A[2, 27:] = 1  # ages 18+ (columns 5-23) of both sexes
    return dp.Invariants.from_matrix(A)


def enumerate_noise(base, A, lower, k):
    """Every e with A e = 0, e >= lower and |e_i| <= k on the free cells of a unimodular
    block (the solved cells follow exactly), with its log weight sum_i log f(e_i)."""
    A = np.asarray(A, dtype=np.int64)
    inv = dp.Invariants.from_matrix(A)
    block = unimodular_block(inv.matrix)
    free = np.indices((2 * k + 1,) * block.free.size).reshape(block.free.size, -1).T - k
    e = block.solve(inv.matrix, np.zeros(inv.rank, np.int64), free)
    e = e[np.all(e >= lower, axis=1)]
    return e, base.noise_logpdf(e).sum(axis=1)


def chisq_pvalue(draws: np.ndarray, support: np.ndarray, probs: np.ndarray) -> float:
    index = {tuple(r): j for j, r in enumerate(support)}
    counts = np.bincount([index[tuple(r)] for r in draws], minlength=len(support))
    expected = probs * draws.shape[0]
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    return float(stats.chisquare(obs, exp).pvalue)


# --- normaliser ----------------------------------------------------------------------------------


@pytest.mark.parametrize("A, x", [
    (SEX_BY_AGE, [0, 2, 1, 0, 3, 0]),                 # class lattice of dimension 1
    (np.array([[1, 1, 0, 0, 0], [0, 0, 1, 1, 1]]), [0, 3, 1, 0, 2]),  # group totals
    (np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 1, 0]]), [1, 0, 0, 2]),  # 2x2 margins
])
def test_normaliser_against_brute_force(A, x):
    base = dp.DoubleGeometric(1.1)
    inv = dp.Invariants.from_matrix(A)
    x = np.array(x)
    _, log_w = enumerate_noise(base, inv.matrix, -x, k=9 if inv.n_cells == 6 else 14)
    mech = dp.Conditioned(base, inv, nonnegative=True)
    assert mech.log_normaliser(x) == pytest.approx(np.logaddexp.reduce(log_w), abs=1e-9)
    _, log_all = enumerate_noise(base, inv.matrix, np.full(x.size, -99), k=9 if inv.n_cells == 6 else 14)
    plain = dp.Conditioned(base, inv)
    assert plain.log_normaliser() == pytest.approx(np.logaddexp.reduce(log_all), abs=1e-7)


def test_normaliser_range_is_the_gap_to_the_untruncated_normaliser():
    mech = dp.Conditioned(dp.DoubleGeometric(0.5), dp.Invariants.from_matrix(SEX_BY_AGE), nonnegative=True)
    x = np.array([3, 0, 5, 1, 2, 0])
    want = mech.log_normaliser(np.full(6, 500)) - mech.log_normaliser(x)
    assert mech.normaliser_range(x) == pytest.approx(want, abs=1e-9)
    # the normaliser increases with every count: the range shrinks as the lower ends rise
    assert mech.normaliser_range(x + 1) < mech.normaliser_range(x)
    assert mech.normaliser_range(np.full(6, 200)) < 1e-30  # far from 0: cannot bind


def test_tracker_follows_the_normaliser():
    mech = dp.Conditioned(dp.DoubleGeometric(0.4), table1_invariants(), nonnegative=True)
    tracker = NormaliserTracker(mech.class_lattice(), TABLE1)
    x = TABLE1.copy()
    x[[0, 4, 23, 27]] += [1, -1, -1, 1]  # a lifted class-level move
    log_z, sums = tracker.propose(x)
    assert log_z == pytest.approx(mech.log_normaliser(x), abs=1e-10)
    tracker.move(x, log_z, sums)
    assert tracker.log_z == pytest.approx(mech.log_normaliser(x), abs=1e-10)


# --- samplers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["curator", "simulation", "algorithm 1"])
def test_release_law_against_enumeration(sampler):
    """Every sampler of the non-negativity-conditioned noise against the enumerated law on a
    2 x 3 table: curator-grade rejection, the exact class-lattice draws, and seed 000's
    Algorithm 1 from its data-free start (thinned)."""
    base = dp.DoubleGeometric(0.9)
    inv = dp.Invariants.from_matrix(SEX_BY_AGE)
    mech = dp.Conditioned(base, inv, nonnegative=True)
    x = np.array([0, 2, 1, 1, 0, 3])
    e, log_w = enumerate_noise(base, inv.matrix, -x, k=8)
    p = np.exp(log_w - np.logaddexp.reduce(log_w))
    rng = np.random.default_rng(11)
    if sampler == "curator":
        s = np.array([mech.release(x, rng) for _ in range(600)])
    elif sampler == "simulation":
        s = x + mech.sample_noise(rng, 20_000, true_values=x)
    else:
        s = x + mech.independence_chain_noise(x, rng, 3000, burn_in=1000, thin=20)
    assert s.dtype == np.int64 and np.all(s >= 0) and np.all(inv.values(s) == inv.values(x))
    assert chisq_pvalue(s - x, e, p) > 1e-3


def test_algorithm_1_starts_on_invariants_with_dependent_rows():
    """Both margins of a 2 x 3 table (5 rows, rank 4: the rows' and the columns' sums share
    the total): Algorithm 1's data-free start is found from every constraint row's value (it
    was given the full-rank rows' only, and refused), and its draws keep the margins and
    non-negativity."""
    inv = dp.Invariants.margins((2, 3), [(0,), (1,)])
    mech = dp.Conditioned(dp.DoubleGeometric(0.9), inv, nonnegative=True)
    x = np.array([0, 2, 1, 1, 0, 3])
    assert inv.constraint_matrix.shape[0] == 5 and inv.matrix.shape[0] == 4
    s = x + mech.independence_chain_noise(x, np.random.default_rng(3), 50, burn_in=100, thin=5)
    assert np.all(s >= 0) and np.all(inv.values(s) == inv.values(x))


def test_table1_reproduces_seed_000_congenial_draws():
    """Reference note 000 (R2): on Table 1 at epsilon = 0.5 the congenial draws have mean L1
    73.5 and mean L2 15.2 to s*, and the cell with s* = 1 shifts up by about +0.89 (an MCMC
    estimate). Exact i.i.d. draws here; tolerances 5 Monte Carlo standard errors."""
    mech = dp.Conditioned(dp.DoubleGeometric(0.5), table1_invariants(), nonnegative=True)
    e = mech.sample_noise(np.random.default_rng(2020), 20_000, true_values=TABLE1)
    assert np.all(mech.invariants.values(e) == 0) and np.all(TABLE1 + e >= 0)
    l1, l2 = np.abs(e).sum(1), np.sqrt((e ** 2).sum(1))
    assert abs(l1.mean() - 73.5) < 5 * l1.std() / np.sqrt(e.shape[0]) + 0.5  # note's own MC error
    assert abs(l2.mean() - 15.2) < 5 * l2.std() / np.sqrt(e.shape[0]) + 0.1
    assert abs(e[:, 12].mean() - 0.89) < 0.1


def test_curator_release_of_table1():
    mech = dp.Conditioned(dp.DoubleGeometric(0.5), table1_invariants(), nonnegative=True)
    s = mech.release(TABLE1, np.random.default_rng(1))
    assert s.dtype == np.int64 and np.all(s >= 0)
    assert np.all(mech.invariants.values(s) == mech.invariants.values(TABLE1))
    with pytest.raises(RuntimeError, match="max_proposals"):
        mech.release(TABLE1, np.random.default_rng(1), max_proposals=1e3)


# --- likelihood and utility -------------------------------------------------------------------------


def test_likelihood_and_dist_against_enumeration():
    base = dp.DoubleGeometric(0.7)
    inv = dp.Invariants.from_matrix(SEX_BY_AGE)
    mech = dp.Conditioned(base, inv, nonnegative=True)
    s, x = np.array([0, 3, 1, 2, 0, 2]), np.array([1, 2, 1, 1, 1, 2])
    _, log_w = enumerate_noise(base, inv.matrix, -x, k=9)
    want = base.noise_logpdf(s - x).sum() - np.logaddexp.reduce(log_w)
    assert mech.log_likelihood(s, x) == pytest.approx(want, abs=1e-9)
    assert mech.log_likelihood(np.array([-1, 4, 1, 2, 0, 2]), x) == -np.inf
    dist = mech.dist(pt.as_tensor(x))
    assert float(pm.logp(dist, s).sum().eval()) == pytest.approx(want, abs=1e-9)
    assert float(pm.logp(dist, np.array([-1, 4, 1, 2, 0, 2])).sum().eval()) == -np.inf


def test_bias_variance_and_interval_against_enumeration():
    base = dp.DoubleGeometric(0.6)
    mech = dp.Conditioned(base, dp.Invariants.total(3), nonnegative=True)
    x = np.array([0, 1, 6])
    e, log_w = enumerate_noise(base, np.ones((1, 3), np.int64), -x, k=40)
    p = np.exp(log_w - np.logaddexp.reduce(log_w))
    mean = p @ e
    np.testing.assert_allclose(mech.bias(x), mean, atol=1e-9)
    np.testing.assert_allclose(mech.variance(x), p @ e ** 2 - mean ** 2, atol=1e-8)
    assert mean[0] > 0.3  # the empty cell is pushed up
    lo, hi = mech.release_interval(x, 0.9)
    for i in range(3):
        q = hi[i] - x[i]
        assert p[np.abs(e[:, i]) <= q].sum() >= 0.9 - 1e-12
        assert q == 0 or p[np.abs(e[:, i]) <= q - 1].sum() < 0.9


# --- privacy -----------------------------------------------------------------------------------------


def test_congenial_recipe_and_audit():
    inv = dp.Invariants.total(2)
    mech = dp.Conditioned.congenial(1.0, inv)
    assert mech.base.epsilon == pytest.approx(0.5) and mech.nonnegative
    assert mech.privacy.epsilon == pytest.approx(1.0)
    audit = mech.audit(max_true=4)
    assert audit.holds
    # non-negativity costs privacy: the base's 0.5 per unit is exceeded, within Theorem 2.1's 2x
    assert 0.5 < audit.measured_epsilon <= 1.0


def test_bad_input():
    inv = dp.Invariants.total(3)
    with pytest.raises(TypeError, match="nonnegative"):
        dp.Conditioned(dp.DoubleGeometric(1.0), inv, nonnegative="yes")
    mech = dp.Conditioned(dp.DoubleGeometric(1.0), inv, nonnegative=True)
    with pytest.raises(ValueError, match="non-negative counts"):
        mech.release([1, -1, 2], np.random.default_rng(0))
    with pytest.raises(ValueError, match="grade"):
        mech.release([1, 1, 2], np.random.default_rng(0), grade="fast")
    with pytest.raises(ValueError, match="true_values is needed"):
        mech.sample_noise(np.random.default_rng(0), 3)
    with pytest.raises(ValueError, match="true_values is needed"):
        mech.log_normaliser()
    with pytest.raises(ValueError, match="negative cells"):
        with pm.Model():
            mech.observe("s", pm.Poisson("x", 2.0, shape=3), np.array([2, -1, 3]))
    with pytest.raises(ValueError, match="epsilon"):
        dp.Conditioned.congenial(-1.0, inv)


# --- posterior -----------------------------------------------------------------------------------------


def _posterior_by_enumeration(mech, s, normaliser: bool):
    inv = mech.invariants
    fibre = inv.fibre(inv.values(s))
    # x_i ~ Poisson(lam), lam ~ Gamma: on a fibre with a fixed total the prior is prop. to 1/prod x_i!
    log_p = np.array([
        -gammaln(x + 1).sum() + mech.base.noise_logpdf(s - x).sum()
        - (mech.log_normaliser(x) if normaliser else 0.0) for x in fibre
    ])
    p = np.exp(log_p - np.logaddexp.reduce(log_p))
    return fibre, p


def test_posterior_with_the_x_dependent_normaliser_matches_enumeration():
    """dp.sample (fibre moves, Metropolis-corrected palindromic blocks) against the enumerated
    posterior of the counts; the posterior that ignores the normaliser differs detectably."""
    mech = dp.Conditioned(dp.DoubleGeometric(0.6), dp.Invariants.from_matrix(SEX_BY_AGE), nonnegative=True)
    s = np.array([1, 1, 4, 5, 0, 0])
    fibre, p = _posterior_by_enumeration(mech, s, normaliser=True)
    _, p_wrong = _posterior_by_enumeration(mech, s, normaliser=False)
    with pm.Model():
        lam = pm.Gamma("lam", 2.0, 0.5)
        x = pm.Poisson("x", lam, shape=6)
        mech.observe("s", x, s)
        idata = dp.sample(2000, tune=500, chains=2, cores=1, random_seed=3, progressbar=False)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["nonnegativity"]["metropolis_corrected"]
    assert 0.2 < report["nonnegativity"]["block_acceptance"] <= 1
    draws = idata.posterior["x"].values.reshape(-1, 6)
    assert np.all(draws @ SEX_BY_AGE.T == SEX_BY_AGE @ s)
    z, se = posterior_mean_z(idata, "x", fibre, p)
    assert np.all(np.abs(z) < 4), z
    z_wrong = (draws.mean(0) - p_wrong @ fibre) / se
    assert np.max(np.abs(z_wrong)) > 4, z_wrong


def test_normaliser_that_cannot_bind_is_reported_constant():
    mech = dp.Conditioned(dp.DoubleGeometric(1.0), dp.Invariants.total(4), nonnegative=True)
    s = np.array([400, 380, 420, 390])
    with pm.Model():
        lam = pm.Gamma("lam", 40.0, 0.1)
        x = pm.Poisson("x", lam, shape=4)
        mech.observe("s", x, s)
        idata = dp.sample(200, tune=200, chains=1, random_seed=1, progressbar=False)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert not report["nonnegativity"]["metropolis_corrected"]
    assert report["nonnegativity"]["normaliser_log_range_on_window"] <= report["tol"]
    assert np.all(idata.posterior["x"].values.sum(-1) == s.sum())


# --- validation tier -------------------------------------------------------------------------------


@pytest.mark.validation
def test_sbc_of_the_nonnegativity_likelihood():
    """validation/sbc_nonnegative.py at 100 replicates (about 20 minutes): every dpinfer row
    passes its coverage and rank tests. (The equality-only likelihood passed too in the
    recorded run: with counts of ~3 at epsilon 0.5 its ignored normaliser varies by only
    ~0.2-0.7 nats; see validation/results/sbc_nonnegative.md.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
    import sbc_nonnegative

    df, text = sbc_nonnegative.run(100)
    print(text)
    assert df[df["method"] == "dpinfer"]["passed"].all()


def test_the_normaliser_op_recomputes_exactly_when_the_counts_change():
    """The Op keeps its last value for repeated evaluations at the same counts (NUTS steps with
    x fixed) and matches log_normaliser at every new x, also after returning to an old one."""
    from dpinfer.mechanisms.conditioned import _LogNormaliserOp

    mechanism = dp.Conditioned(dp.DoubleGeometric(0.7), dp.Invariants.total(3), nonnegative=True)
    x = pt.lvector("x")
    evaluate = pytensor.function([x], _LogNormaliserOp(mechanism)(x), mode="FAST_COMPILE")
    for counts in ([0, 2, 5], [0, 2, 5], [1, 1, 5], [0, 2, 5], [4, 0, 0]):
        assert float(evaluate(np.array(counts))) == mechanism.log_normaliser(np.array(counts))
    assert float(evaluate(np.array([-1, 2, 5]))) == np.inf
