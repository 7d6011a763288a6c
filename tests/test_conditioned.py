"""Conditioned(base, invariants): the release law, its likelihood, normaliser and privacy,
against enumeration and closed forms; and linear queries of latent counts."""

from __future__ import annotations

import itertools

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats

import dpinfer as dp
from dpinfer.inference.planning.queries import resolve_query
from law_checks import empirical_tv, iid_tv_quantile, kernel_lattice_law

EPS = 0.8


def _chisq_pvalue(observed_keys, probs: dict) -> float:
    """Chi-square goodness of fit of draws (hashable keys) to ``probs``; cells with expected
    count < 5 are pooled into one."""
    n = len(observed_keys)
    counts: dict = {}
    for k in observed_keys:
        counts[k] = counts.get(k, 0) + 1
    assert set(counts) <= set(probs), "a draw outside the support"
    big = [k for k, p in probs.items() if p * n >= 5]
    obs = [counts.get(k, 0) for k in big]
    exp = [probs[k] * n for k in big]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    return float(stats.chisquare(obs, exp).pvalue)


def test_total_release_keeps_the_total_and_matches_the_conditioned_law():
    mech = dp.Conditioned(dp.DoubleGeometric(EPS), dp.Invariants.total(3))
    x = np.array([5, 0, 2])
    rng = np.random.default_rng(1)
    noise = mech.sample_noise(rng, size=100_000)
    assert noise.dtype == np.int64 and np.all(noise.sum(1) == 0)
    f = dp.DoubleGeometric(EPS)
    k = 30
    probs = {}
    for e1, e2 in itertools.product(range(-k, k + 1), repeat=2):
        probs[(e1, e2, -e1 - e2)] = float(np.exp(f.noise_logpdf(np.array([e1, e2, -e1 - e2])).sum()))
    z = sum(probs.values())
    probs = {key: p / z for key, p in probs.items()}
    assert _chisq_pvalue([tuple(r) for r in noise], probs) > 1e-3
    release = mech.release(x, rng)
    assert release.sum() == x.sum()


def test_group_release_keeps_every_group_total():
    labels = np.array(["a", "b", "a", "c", "b", "a"])
    mech = dp.Conditioned(dp.DoubleGeometric(0.3), dp.Invariants.groups(labels))
    x = np.arange(6) * 10
    s = mech.release(x, np.random.default_rng(2))
    for g in "abc":
        assert s[labels == g].sum() == x[labels == g].sum()


def test_two_by_two_margins_release_matches_the_closed_form():
    """The kernel of a 2x2 table with both margins is t (1, -1, -1, 1): P(t) ∝ f(t)^4."""
    inv = dp.Invariants.margins((2, 2), [(0,), (1,)])
    mech = dp.Conditioned(dp.DoubleGeometric(EPS), inv, burn_in_sweeps=20)
    noise = mech.sample_noise(np.random.default_rng(3), size=20_000)
    assert np.all(inv.values(noise) == 0)
    t = noise[:, 0]
    assert np.array_equal(noise, np.outer(t, [1, -1, -1, 1]))
    grid = np.arange(-40, 41)
    p = np.exp(4 * dp.DoubleGeometric(EPS).noise_logpdf(grid))
    probs = dict(zip(grid.tolist(), p / p.sum()))
    assert _chisq_pvalue(t.tolist(), probs) > 1e-3


def test_normaliser_and_likelihood_against_enumeration():
    f = dp.DoubleGeometric(EPS)
    mech = dp.Conditioned(f, dp.Invariants.total(3))
    k = 60
    e = np.arange(-k, k + 1)
    e1, e2 = np.meshgrid(e, e, indexing="ij")
    p_zero = np.exp(f.noise_logpdf(e1) + f.noise_logpdf(e2) + f.noise_logpdf(-e1 - e2)).sum()
    assert mech.log_normaliser() == pytest.approx(np.log(p_zero), rel=1e-12)
    s, x = np.array([3, -1, 4]), np.array([2, 1, 3])
    want = f.noise_logpdf(s - x).sum() - np.log(p_zero)
    assert mech.log_likelihood(s, x) == pytest.approx(want, rel=1e-12)
    assert mech.log_likelihood(s, np.array([2, 1, 2])) == -np.inf  # totals differ
    # the PyMC distribution gives the same total and -inf off the fibre
    dist = mech.dist(pt.as_tensor(x))
    assert float(pm.logp(dist, s).sum().eval()) == pytest.approx(want, rel=1e-12)
    assert float(pm.logp(dist, np.array([3, -1, 5])).sum().eval()) == -np.inf


def test_conditioned_variance_against_enumeration():
    f = dp.DoubleGeometric(0.5)
    mech = dp.Conditioned(f, dp.Invariants.total(2))
    # two cells: e2 = -e1, P(e1) ∝ f(e1)^2
    grid = np.arange(-200, 201)
    p = np.exp(2 * f.noise_logpdf(grid))
    want = (p * grid**2).sum() / p.sum()
    np.testing.assert_allclose(mech.variance(np.array([3, 4])), [want, want], rtol=1e-10)
    assert want < f.noise_variance  # conditioning narrows the noise


@pytest.mark.parametrize("prob", [0.5, 0.9, 0.99])
def test_conditioned_release_interval_against_enumeration(prob):
    # groups of 1, 2 and 3 cells: a cell alone has no noise; otherwise the marginal of e_i
    # given its group's sum is 0, enumerated over the other cells' noise
    f = dp.DoubleGeometric(0.4)
    mech = dp.Conditioned(f, dp.Invariants.groups(["a", "b", "b", "c", "c", "c"]))
    grid = np.arange(-150, 151)
    lf = f.noise_logpdf(grid)
    two = np.exp(2 * lf)  # e1 = -e2
    pair = np.exp(np.logaddexp.reduce(lf[None, :] + f.noise_logpdf(-grid[:, None] - grid[None, :]), axis=1))
    three = np.exp(lf) * pair  # P(e1 = k) ∝ f(k) P(e2 + e3 = -k)
    want = []
    for p in (np.where(grid == 0, 1.0, 0.0), two, three):
        p = p / p.sum()
        central = np.array([p[np.abs(grid) <= q].sum() for q in range(40)])
        want.append(int(np.argmax(central >= prob)))
    x = np.array([5, 0, 7, 2, 9, 4])
    lo, hi = mech.release_interval(x, prob)
    q = np.array([want[0], want[1], want[1], want[2], want[2], want[2]])
    np.testing.assert_array_equal(lo, x - q)
    np.testing.assert_array_equal(hi, x + q)
    with pytest.raises(ValueError, match="group totals only"):
        dp.Conditioned(f, dp.Invariants.margins((2, 2), [(0,), (1,)])).release_interval(np.zeros(4, int))


@pytest.mark.parametrize("inv", [dp.Invariants.total(3), dp.Invariants.margins((2, 2), [(0,), (1,)])])
def test_privacy_audit_measures_epsilon_per_unit_distance(inv):
    mech = dp.Conditioned(dp.DoubleGeometric(EPS), inv)
    audit = mech.audit()
    assert audit.holds
    assert audit.measured_epsilon == pytest.approx(EPS, rel=1e-9)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="base"):
        dp.Conditioned(dp.ClampedGeometric(1.0, 0, 10), dp.Invariants.total(3))
    with pytest.raises(TypeError, match="base"):
        dp.Conditioned(dp.Laplace(1.0), dp.Invariants.total(3))
    with pytest.raises(TypeError, match="invariants"):
        dp.Conditioned(dp.DoubleGeometric(1.0), np.ones((1, 3)))
    mech = dp.Conditioned(dp.DoubleGeometric(1.0), dp.Invariants.total(3))
    with pytest.raises(ValueError, match="cells"):
        mech.release(np.array([1, 2]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="approximate-DP"):
        dp.Conditioned(dp.DiscreteGaussian(sigma=2.0), dp.Invariants.total(3)).privacy


def test_linear_queries_are_recovered_exactly():
    with pm.Model() as model:
        x = pm.Poisson("x", 3.0, shape=(2, 3))
        margins = pt.concatenate([x.sum(axis=1), x.sum(axis=0)])
    latent, q = resolve_query(model, margins)
    assert latent is x
    want = np.array([
        [1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1],
        [1, 0, 0, 1, 0, 0], [0, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 1],
    ])
    np.testing.assert_array_equal(q, want)
    assert resolve_query(model, x) == (x, None)
    assert resolve_query(model, x + 0)[1] is None  # the identity query


def test_queries_that_are_not_fixed_linear_maps_are_refused():
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        x = pm.Poisson("x", 3.0, shape=3)
    with pytest.raises(ValueError, match="integer-linear"):
        resolve_query(model, x + 1)
    with pytest.raises(ValueError, match="also depends on"):
        resolve_query(model, x * lam)


@pytest.mark.parametrize("base", [dp.DoubleGeometric(0.7, sensitivity=2), dp.DiscreteGaussian(1.5)],
                         ids=["double-geometric", "discrete-gaussian"])
def test_gibbs_noise_targets_the_conditioned_base(base):
    """The MCMC path of sample_noise (used when the class lattice is too large; called directly
    here on 2 x 3 margins) against the enumerated law prod_i f(e_i) on A e = 0."""
    inv = dp.Invariants.margins((2, 3), [(0,), (1,)])
    mech = dp.Conditioned(base, inv, burn_in_sweeps=30)
    rng = np.random.default_rng(4)
    z = mech._gibbs_noise(rng, 20_000)
    assert np.all(inv.values(z) == 0)
    support, p = kernel_lattice_law(inv, lambda e: base.noise_logpdf(e).sum(axis=1), 30)
    assert empirical_tv(z, support, p) <= iid_tv_quantile(p, z.shape[0], rng)


def test_rejection_cost_where_the_normaliser_cannot_be_enumerated():
    # the normal approximation of P(A e = 0) against the exact value on small tables: exact
    # for discrete Gaussian noise, low (a conservative cost estimate) for double geometric
    inv = dp.Invariants.margins((2, 3), [(0,), (1,)])
    gauss = dp.Conditioned(dp.DiscreteGaussian(3.0), inv)
    assert gauss.approximate_log_acceptance() == pytest.approx(gauss.log_normaliser(), abs=1e-3)
    for eps in (0.25, 1.0):
        geo = dp.Conditioned(dp.DoubleGeometric(eps), inv)
        assert geo.log_normaliser() - 2 < geo.approximate_log_acceptance() < geo.log_normaliser()
    # 4 x 4 margins: the class lattice has 9 dimensions; the release is refused on cost
    # (about 1e11 draws) instead of running for hours, and the message points to the chain
    big = dp.Conditioned(dp.DoubleGeometric(0.25), dp.Invariants.margins((4, 4), [(0,), (1,)]))
    with pytest.raises(RuntimeError, match="normal approximation.*GeneralizedLaplace"):
        big.release(np.arange(16) + 5, np.random.default_rng(0))
