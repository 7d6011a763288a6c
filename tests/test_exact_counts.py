"""Exact draws of latent counts given the parameters (the compiled engine's count block)
against enumeration.

With fixed priors the model has no parameters, so every sweep of dpinfer.sample is an
independent exact draw of the counts: the draws' law must be the enumerated posterior, within
the Monte Carlo error of i.i.d. sampling. Windows are narrowed on purpose so that a good share
of the draws come from the exact geometric tails."""

import itertools
import json

import numpy as np
import pymc as pm
import pytest
from scipy import special, stats

import dpinfer as dp
from law_checks import iid_tv_quantile

RATES = np.array([3.0, 40.0, 7.5, 12.0, 0.8, 25.0])


def _fit(mechanism, release, draws, seed, half_width, monkeypatch, prior=pm.Poisson):
    import dpinfer.inference.planning.cells as plans_module

    monkeypatch.setattr(plans_module, "tail_half_width", lambda mech: half_width)
    with pm.Model() as model:
        x = prior("x", RATES[: len(release)])
        mechanism.observe("release", x, observed=release)
    idata = dp.sample(draws, tune=0, chains=1, random_seed=seed, progressbar=False, model=model)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["engine"] == "compiled" and report["exact_tails"]
    return idata.posterior["x"].values.reshape(draws, -1), report


def test_independent_cells_match_enumeration_with_narrow_windows(monkeypatch):
    mech = dp.DoubleGeometric(epsilon=0.5)
    release = np.array([0, 45, -3, 20])
    draws, report = _fit(mech, release, 40_000, 1, 3, monkeypatch)
    support = np.arange(200)
    outside = 0.0
    for i, s in enumerate(release):
        log_w = stats.poisson.logpmf(support, RATES[i]) + mech.log_likelihood(np.full(200, s), support)
        p = np.exp(log_w - special.logsumexp(log_w))
        outside += np.mean(np.abs(draws[:, i] - max(s, 0)) > 3)
        counts = np.bincount(draws[:, i], minlength=200)[:200]
        keep = p * len(draws) >= 5
        observed = np.append(counts[keep], counts[~keep].sum())
        expected = np.append(p[keep], p[~keep].sum()) * len(draws)
        assert stats.chisquare(observed, expected).pvalue > 1e-3, i
    assert outside > 0.3  # the tails really are drawn from
    assert report["held_cells_after_tuning"] == 0


def test_discrete_gaussian_noise_has_exact_tails_too(monkeypatch):
    mech = dp.DiscreteGaussian(sigma=3.0)
    release = np.array([2, 38])
    draws, _ = _fit(mech, release, 30_000, 2, 2, monkeypatch)
    support = np.arange(120)
    for i, s in enumerate(release):
        log_w = stats.poisson.logpmf(support, RATES[i]) + mech.log_likelihood(np.full(120, s), support)
        p = np.exp(log_w - special.logsumexp(log_w))
        counts = np.bincount(draws[:, i], minlength=120)[:120]
        keep = p * len(draws) >= 5
        observed = np.append(counts[keep], counts[~keep].sum())
        expected = np.append(p[keep], p[~keep].sum()) * len(draws)
        assert stats.chisquare(observed, expected).pvalue > 1e-3, i


def _fibre_law(release, codes, mech, group):
    """The exact law of the cells of ``group`` given their total, by enumeration."""
    cells = np.flatnonzero(codes == group)
    total = int(release[cells].sum())
    points, log_w = [], []
    for head in itertools.product(range(total + 1), repeat=len(cells) - 1):
        last = total - sum(head)
        if last < 0:
            continue
        x = np.array((*head, last))
        points.append(x)
        log_w.append(np.sum(stats.poisson.logpmf(x, RATES[cells])
                            + mech.base.log_likelihood(release[cells], x)))
    log_w = np.array(log_w)
    return np.array(points), np.exp(log_w - special.logsumexp(log_w))


@pytest.mark.parametrize("half_width", [2, 40])
def test_group_totals_match_enumeration(half_width, monkeypatch):
    """Cells conditioned on three group totals (one group a single cell, whose count is its
    total): each group's joint law on its fibre against enumeration, in total variation."""
    codes = np.array([0, 0, 0, 1, 1, 2])
    inv = dp.Invariants.groups(codes)
    mech = dp.Conditioned(dp.DoubleGeometric(epsilon=0.7), inv)
    release = np.array([1, 44, 6, 15, -1, 23])
    n = 20_000
    draws, report = _fit(mech, release, n, 3, half_width, monkeypatch)
    for g in range(3):
        cells = np.flatnonzero(codes == g)
        assert np.all(draws[:, cells].sum(axis=1) == release[cells].sum())
    assert np.all(draws[:, 5] == 23)
    rng = np.random.default_rng(0)
    for g in (0, 1):
        support, p = _fibre_law(release, codes, mech, g)
        index = {tuple(x): k for k, x in enumerate(support)}
        cells = np.flatnonzero(codes == g)
        freq = np.bincount([index[tuple(x)] for x in draws[:, cells]], minlength=len(p)) / n
        tv = 0.5 * np.abs(freq - p).sum()
        assert tv < iid_tv_quantile(p, n, rng), (g, tv)
    assert report["method"].startswith("exact Gibbs (compiled): the counts drawn exactly and jointly")


def test_a_large_group_is_drawn_in_random_blocks_with_the_exact_law(monkeypatch):
    """A group of 300 cells (more than BLOCK_CELLS) is updated in random blocks, each exact
    given the rest: every cell's marginal law given the total matches the exact marginal from
    the convolution of the cells' laws (dpinfer.lattice.convolution, itself tested against
    mpmath), within Monte Carlo error measured by the ESS."""
    import arviz as az

    from dpinfer.lattice.convolution import log_convolution_at
    from dpinfer.inference.engines.compiled.exact_counts import BLOCK_CELLS

    m = 300
    assert m > 2 * BLOCK_CELLS
    rng = np.random.default_rng(4)
    rates = rng.gamma(3.0, 5.0, size=m)
    base = dp.DoubleGeometric(epsilon=0.5)
    mech = dp.Conditioned(base, dp.Invariants.total(m))
    release = mech.release(rng.poisson(rates), rng)
    import dpinfer.inference.planning.cells as plans_module

    monkeypatch.setattr(plans_module, "tail_half_width", lambda mech: 25)
    with pm.Model() as model:
        x = pm.Poisson("x", rates)
        mech.observe("release", x, observed=release)
    idata = dp.sample(3000, tune=50, chains=2, random_seed=6, progressbar=False, model=model)
    draws = idata.posterior["x"].values
    assert np.all(draws.sum(axis=-1) == release.sum())
    # exact marginals on windows wide enough to hold all the mass (60 either side)
    k = 60
    lo = np.maximum(release, 0) - k
    grid = lo[:, None] + np.arange(2 * k + 1)
    log_g = np.where(grid >= 0, stats.poisson.logpmf(grid, rates[:, None]), -np.inf) + base.log_likelihood(
        np.broadcast_to(release[:, None], grid.shape), grid)
    _, marginals = log_convolution_at(log_g, np.zeros(m, np.int64), [release.sum() - lo.sum()])
    exact_mean = (marginals * grid).sum(axis=1)
    exact_sd = np.sqrt((marginals * grid**2).sum(axis=1) - exact_mean**2)
    ess = az.ess(draws).values if hasattr(az.ess(draws), "values") else az.ess(draws)
    z = (draws.reshape(-1, m).mean(axis=0) - exact_mean) / (exact_sd / np.sqrt(ess))
    # 300 cells: |z| beyond 4.5 has probability ~2e-3 overall for a correct sampler
    assert np.max(np.abs(z)) < 4.5
    assert np.mean(ess) > 1000  # nearly independent draws from sweep to sweep


def test_fast_exponential_is_within_one_ulp_of_libm():
    from dpinfer.inference.engines.compiled.exact_counts import weights_moments

    rng = np.random.default_rng(7)
    x = np.concatenate([-rng.uniform(0, 708, 200_000), -rng.exponential(1.0, 200_000),
                        [0.0, -1e-300, -708.0, -708.5, -1e6, -np.inf]])
    x = np.concatenate([x, [0.0]])  # the row's maximum: w = exp(x - 0)
    w = np.empty_like(x)
    m, mass, mean, var = weights_moments(x, w, np.empty(x.size, np.int64))
    reference = np.exp(x)
    normal = x >= -708.0
    assert m == 0.0
    assert np.max(np.abs(w[normal] / reference[normal] - 1.0)) <= 2.3e-16
    assert np.all(w[~normal] == 0.0)  # below e^-708 ~ 3e-308, -inf included: exactly 0
    j = np.arange(x.size)
    assert mass == pytest.approx(reference.sum(), rel=1e-12)
    assert mean == pytest.approx((j * reference).sum() / reference.sum(), rel=1e-12)
    assert var == pytest.approx((j**2 * reference).sum() / reference.sum() - mean**2, rel=1e-9)


def test_weights_of_an_empty_row_are_zero():
    from dpinfer.inference.engines.compiled.exact_counts import weights_moments

    w = np.ones(5)
    assert weights_moments(np.full(5, -np.inf), w, np.empty(5, np.int64)) == (-np.inf, 0.0, 0.0, 0.0)
    assert np.all(w == 0.0)


def test_start_on_the_totals_spreads_each_groups_surplus_evenly():
    """Clipping many small cells' releases at 0 raises a group's sum; the start takes the
    surplus from all cells, about surplus / cells each, not from the largest cells whole (a
    cell started hundreds of counts outside its window was held there forever)."""
    from dpinfer.inference.planning.cells import point_on_totals

    rng = np.random.default_rng(3)
    codes = np.repeat([0, 1, 2], [400, 250, 1])
    centres = np.concatenate([rng.integers(-8, 30, 400), rng.integers(0, 2000, 250), [7]])
    clipped = np.maximum(centres, 0)
    targets = np.array([clipped[:400].sum() - 1_203, clipped[400:650].sum() + 517, 9])
    x = point_on_totals(centres, codes, targets, (0, None), "x")
    assert [int(x[codes == g].sum()) for g in range(3)] == targets.tolist()
    assert x.min() >= 0
    moved = np.abs(x - clipped)
    # group 0: 1,203 taken from the cells above 0 (about 330 of them): a few counts each
    assert moved[:400].max() <= -(-1_203 // np.count_nonzero(clipped[:400])) + 1
    assert moved[400:650].max() <= -(-517 // 250)  # group 1: 517 added to 250 cells
    assert x[650] == 9
    # an upper bound and a total out of reach
    x = point_on_totals(np.array([5, 9, 2]), np.zeros(3, int), np.array([3]), (0, 4), "x")
    assert x.sum() == 3 and x.max() <= 4 and x.min() >= 0
    with pytest.raises(ValueError, match="outside what its cells can reach"):
        point_on_totals(np.array([1, 2]), np.zeros(2, int), np.array([9]), (0, 4), "x")
