"""dp.sample on latent counts behind NestedMeasurements (the compiled engine's nested block):
posterior means against exhaustive enumeration, every draw on the equalities and bounds, a
multi-level table with free parameters that converges, and the refusals."""

import json
import re
import math

import numpy as np
import pymc as pm
import pytest

import dpinfer as dp
from dpinfer.inference.convergence import diagnostics
from dpinfer.inference.recovery import RecoveryWarning
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian
from dpinfer.mechanisms.nested import NestedMeasurements
from test_nested_sums import LAM, TOTAL, C, enumerate_posterior


def assert_means_within_5_mcse(draws: np.ndarray, exact: np.ndarray) -> None:
    """Each count's posterior mean from ``draws`` (chains, draws, *shape) within 5 Monte Carlo
    standard errors (sd / sqrt(ESS)) of the enumeration's ``exact`` (*shape)."""
    chains, n = draws.shape[:2]
    flat = draws.reshape(chains, n, -1).astype(float)
    _, ess = diagnostics(flat)
    pooled = flat.reshape(chains * n, -1)
    z = (pooled.mean(0) - np.asarray(exact, float).reshape(-1)) / (pooled.std(0) / np.sqrt(ess))
    assert np.all(np.abs(z) < 5), z


def small_release() -> NestedMeasurements:
    """The table of tests/test_nested_sums.py through the public builder."""
    nm = NestedMeasurements([-1, 0, 1, 1], [2, 3], C, area_names=["root", "mid", "leaf0", "leaf1"])
    release = [1, 3, 0, 2, 2, 0, 1, 1]
    for leaf, area in enumerate([2, 3]):
        nm.measure(f"leaf{leaf}/cell", [area], [[c] for c in range(C)], [release[leaf * C:(leaf + 1) * C]], 2.0)
        nm.measure(f"leaf{leaf}/total", [area], [list(range(C))], [[[6, 4][leaf]]], 1.0)
    nm.measure("mid/cells 0+1 (summed)", [1], [[0, 1]], [[5]], 1.5, summed=2)
    nm.measure("mid/cells 1+2 (summed, not a quadratic)", [1], [[1, 2]], [[3]], 0.4, summed=3)
    nm.measure("mid/cells 2+3", [1], [[2, 3]], [[4]], 3.0)
    nm.equal("root/total (=)", [0], [list(range(C))], [[TOTAL]])
    nm.at_most("root/cells 0+1 (<=)", [0], [[0, 1]], [[6]])
    nm.measure("root/cell 2", [0], [[2]], [[2]], 0.7)
    return nm


def test_the_release_log_likelihood_is_the_enumerations_and_pymcs():
    nm = small_release()
    states, logp = enumerate_posterior()
    with pm.Model() as model:
        x = pm.Poisson("x", LAM, shape=(2, C))
        nm.observe("nmf", x)
    f = model.compile_logp()
    from scipy import stats

    ref = int(np.argmax(logp))
    for i in [ref, 0, 17, 400, 3000]:
        want = logp[i] - logp[ref]
        got = f({"x": states[i]}) - f({"x": states[ref]})
        direct = (nm.log_likelihood(states[i]) + stats.poisson.logpmf(states[i], LAM).sum()
                  - nm.log_likelihood(states[ref]) - stats.poisson.logpmf(states[ref], LAM).sum())
        if want == -np.inf:
            assert got == -np.inf and direct == -np.inf
        else:
            assert got == pytest.approx(want, abs=1e-9) and direct == pytest.approx(want, abs=1e-9)


def test_dp_sample_matches_the_enumerated_posterior():
    """Posterior means of all 8 counts within 5 Monte Carlo standard errors (sd / sqrt(ESS)) of
    the enumeration; every draw meets the equality and the bound."""
    nm = small_release()
    with pm.Model() as model:
        x = pm.Poisson("x", LAM, shape=(2, C))
        nm.observe("nmf", x)
    idata = dp.sample(model=model, draws=3000, tune=300, chains=2, random_seed=11, progressbar=False)
    draws = idata.posterior["x"].values
    flat = draws.reshape(-1, 2, C)
    assert np.all(flat.sum((1, 2)) == TOTAL) and np.all(flat[:, :, :2].sum((1, 2)) <= 6)
    states, logp = enumerate_posterior()
    assert_means_within_5_mcse(draws, np.tensordot(np.exp(logp), states, axes=1))
    report = idata.posterior.attrs["dpinfer"]
    assert "sum-tree" in report and "box_edges_hit_after_tuning" in report


def three_level_table(n_counties: int, tracts: int, n_cells: int, seed: int):
    """A state of counties x tracts x cells: Poisson counts with cell and county effects,
    discrete Gaussian measurements per cell at tract, county and state level and of county
    totals, the state total exact (the table issue 23 reported failing)."""
    rng = np.random.default_rng(seed)
    parent = [-1] + [0] * n_counties + [1 + k for k in range(n_counties) for _ in range(tracts)]
    leaves = np.arange(1 + n_counties, 1 + n_counties + n_counties * tracts)
    a, b = rng.normal(3.0, 0.7, n_cells), rng.normal(0.0, 0.3, n_counties)
    truth = rng.poisson(np.exp(a[None, :] + np.repeat(b, tracts)[:, None]))
    county = truth.reshape(n_counties, tracts, n_cells).sum(1)

    def noisy(v, sigma2):
        return v + DiscreteGaussian(math.sqrt(sigma2)).sample_noise(np.shape(v), rng)

    nm = NestedMeasurements(parent, leaves, n_cells)
    cells = [[c] for c in range(n_cells)]
    nm.measure("tract/detailed", leaves, cells, noisy(truth, 20.0), 20.0)
    nm.measure("county/detailed", 1 + np.arange(n_counties), cells, noisy(county, 10.0), 10.0)
    nm.measure("county/total", 1 + np.arange(n_counties), [list(range(n_cells))],
               noisy(county.sum(1, keepdims=True), 5.0), 5.0)
    nm.measure("state/detailed", [0], cells, noisy(county.sum(0, keepdims=True), 5.0), 5.0)
    nm.equal("state/total", [0], [list(range(n_cells))], [[int(truth.sum())]])
    county_of = np.repeat(np.arange(n_counties), tracts)
    with pm.Model() as model:
        cell = pm.Normal("cell", 3.0, 1.5, shape=n_cells)
        others = pm.Normal("county", 0.0, 0.5, shape=n_counties - 1)  # county 0 the baseline
        effect = pm.math.concatenate([np.zeros(1), others])
        counts = pm.Poisson("counts", pm.math.exp(cell[None, :] + effect[county_of][:, None]),
                            shape=(n_counties * tracts, n_cells))
        nm.observe("nmf", counts)
    return model, truth


def test_a_three_level_table_with_parameters_converges():
    """2 counties x 3 tracts x 4 cells with measurements at three levels and the state total
    exact: converged (R-hat <= 1.01, ESS >= 400, no divergence), every draw on the total."""
    model, truth = three_level_table(2, 3, 4, seed=5)
    idata = dp.sample(model=model, draws=1000, tune=1000, chains=2, random_seed=3, progressbar=False)
    verdict = idata.posterior.attrs["dpinfer_convergence"]
    assert '"converged": true' in verdict, verdict
    assert np.all(idata.posterior["counts"].values.sum((2, 3)) == truth.sum())


def test_refusals():
    nm = small_release()
    with pm.Model() as model:
        x = pm.Poisson("x", LAM, shape=(2, C))
        with pytest.raises(ValueError, match=r"shape \(n_leaves, n_cells\)"):
            nm.observe("nmf", x[:1])
        nm.observe("nmf", x)
        DiscreteGaussian(1.0).observe("again", x, np.ones((2, C), int))
    with pytest.raises(ValueError, match="put every measurement of them in the one"):
        dp.sample(model=model, draws=10, tune=10, chains=1, progressbar=False)
    bad = NestedMeasurements([-1, 0, 0], [1, 2], 1)
    bad.equal("root", [0], [[0]], [[5]])
    bad.equal("left", [1], [[0]], [[3]])
    bad.equal("right", [2], [[0]], [[3]])  # 3 + 3 != 5
    with pm.Model() as model:
        y = pm.Poisson("y", 2.0, shape=(2, 1))
        bad.observe("bad", y)
    with pytest.raises(ValueError, match="no counts in the boxes meet every equality and bound"):
        dp.sample(model=model, draws=10, tune=10, chains=1, progressbar=False)
    with pytest.raises(RuntimeError, match="frozen"):
        bad.measure("late", [0], [[0]], [[1]], 1.0)
    with pytest.raises(ValueError, match="sigma2 must be finite and > 0"):
        NestedMeasurements([-1, 0], [1], 1).measure("m", [1], [[0]], [[1]], 0.0)


def test_a_new_release_through_pm_data_refits_the_same_model():
    """release() draws measurements exactly around the true sums (their mean and variance over
    400 releases within 5 Monte Carlo standard errors of summed * sigma^2: the exact sampler
    costs ~15 ms a release here and is tested on its own in test_exact_sampling); values given as
    pm.Data are replaced with pm.set_data and the next fit uses them."""
    nm = small_release()
    truth = np.array([[2, 2, 1, 1], [1, 1, 1, 1]])
    rng = np.random.default_rng(4)
    releases = np.array([nm.release(truth, rng) for _ in range(400)])
    sums = nm.sums
    t = sums.term_sums(truth)
    kinds = [sums.tables.params(int(k)) for k in sums.term_table]
    for r, (kind, sigma2, m) in enumerate(kinds):
        if kind == "eq":
            assert np.all(releases[:, r] == t[r])
        elif kind == "dg":
            e = releases[:, r] - t[r]
            var = m * sigma2
            assert abs(e.mean()) < 5 * math.sqrt(var / e.size)
            assert abs(e.var() - var) < 5 * var * math.sqrt(2 / e.size)
    with pm.Model() as model:
        x = pm.Poisson("x", LAM, shape=(2, C))
        data = pm.Data("nmf_values", nm.values)
        nm.observe("nmf", x, data)
    first = dp.sample(model=model, draws=200, tune=100, chains=1, random_seed=1, progressbar=False)
    assert np.all(first.posterior["x"].values.sum((2, 3)) == TOTAL)
    new = nm.values.copy()
    new[sums.term_table == sums.tables.add_equality()] = 9
    with model:
        pm.set_data({"nmf_values": new})
    second = dp.sample(model=model, draws=200, tune=100, chains=1, random_seed=1, progressbar=False)
    assert np.all(second.posterior["x"].values.sum((2, 3)) == 9)


def test_boxes_that_the_posterior_keeps_reaching_are_named(monkeypatch):
    """Boxes of 0 pilot sds (half-width 2, which doubling keeps) and one widening: its warning
    names the counts that reached a box edge, and then dp.sample stops with an error that
    names the release, those counts and what to check."""
    import sys

    import dpinfer.inference.planning.nested as planning_nested

    sample_module = sys.modules["dpinfer.inference.sample"]

    monkeypatch.setattr(planning_nested, "FIRST_K", 0)
    monkeypatch.setattr(sample_module, "MAX_WIDENINGS", 1)
    nm = small_release()
    with pm.Model() as model:
        x = pm.Poisson("x", LAM, shape=(2, C))
        nm.observe("nmf", x)
    count = r"leaf\d, cell \d: box \d+\.\.\d+, stored draws \d+\.\.\d+, pilot"
    message = r"(?s)nested release 'nmf' reached the edges.*" + count
    with pytest.raises(RuntimeError, match=message), \
            pytest.warns(RecoveryWarning, match=r"widened them \(only the \d+ counts of 'x' at or near "
                                                 r"their boxes' edges\) and fitted again; x: " + count):
        dp.sample(model=model, draws=300, tune=100, chains=1, random_seed=1, progressbar=False)


def test_counts_that_reach_their_boxes_are_widened_alone_and_the_refit_is_exact(monkeypatch):
    """First boxes of 1 pilot sd: the first fit's draws reach some counts' box edges, so the
    refit widens those counts alone (the record and the warning say how many; the others
    keep their boxes) until none is reached, and the posterior is the enumeration's."""
    import dpinfer.inference.planning.nested as planning_nested

    monkeypatch.setattr(planning_nested, "FIRST_K", 1)
    nm = small_release()
    with pm.Model() as model:
        x = pm.Poisson("x", LAM, shape=(2, C))
        nm.observe("nmf", x)
    with pytest.warns(RecoveryWarning, match=r"only the \d+ counts of 'x'"):
        idata = dp.sample(model=model, draws=3000, tune=300, chains=2, random_seed=11, progressbar=False)
    widened = [r for r in dp.recoveries_of(idata) if r["kind"] == "windows widened"]
    assert widened and all(1 <= r["counts_widened"]["x"] <= 2 * C for r in widened)
    states, logp = enumerate_posterior()
    assert_means_within_5_mcse(idata.posterior["x"].values, np.tensordot(np.exp(logp), states, axes=1))
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["stored_draws_on_box_edges"] == 0 and report["box_edges_hit_after_tuning"] == 0


def test_draws_that_reach_a_box_stop_the_chains_there_and_the_refit_is_exact(monkeypatch):
    """First boxes of 1 pilot sd and the draws looked at every 0.05 s: the first draw on a
    box's edge stops the chains (the record says at how many of the 20,000 draws asked), the
    counts near their edges are widened, and the refit's posterior is the enumeration's."""
    import dpinfer.inference.engines.compiled.chains as chains
    import dpinfer.inference.planning.nested as planning_nested

    monkeypatch.setattr(planning_nested, "FIRST_K", 1)
    monkeypatch.setattr(chains, "_DRAW_WATCH", 0.05)
    nm = small_release()
    with pm.Model() as model:
        x = pm.Poisson("x", LAM, shape=(2, C))
        nm.observe("nmf", x)
    with pytest.warns(RecoveryWarning, match=r"only the \d+ counts of 'x'"):
        idata = dp.sample(model=model, draws=20000, tune=300, chains=2, random_seed=11, progressbar=False)
    stopped = [r["stopped_early"] for r in dp.recoveries_of(idata) if "stopped_early" in r]
    assert stopped, dp.recoveries_of(idata)
    at = [int(re.match(r"stopped at (\d+) of 20000 draws per chain: ", text).group(1)) for text in stopped]
    assert all(1 <= n < 20000 for n in at), stopped
    draws = idata.posterior["x"].values
    assert draws.shape[1] == 20000 and "stopped_early" not in idata.sample_stats.attrs
    states, logp = enumerate_posterior()
    assert_means_within_5_mcse(draws, np.tensordot(np.exp(logp), states, axes=1))


def test_grouped_negative_binomial_counts_match_the_enumerated_posterior():
    """GroupedNegativeBinomial counts (a gamma-mixed rate per cell over both leaves, the
    engine's group factor at their area) behind the small release: posterior means of all 8
    counts within 5 Monte Carlo standard errors of the enumeration under the generative law
    (the group sum negative binomial, its split beta-binomial: tests/test_nested_sums.py)."""
    from test_nested_sums import ALPHA, LEAF_ALPHA, MU, grouped_prior

    nm = small_release()
    with pm.Model() as model:
        x = dp.GroupedNegativeBinomial("x", MU, LEAF_ALPHA, ALPHA, np.array([0, 0]))
        nm.observe("nmf", x)
    idata = dp.sample(model=model, draws=3000, tune=300, chains=2, random_seed=12, progressbar=False)
    draws = idata.posterior["x"].values
    flat = draws.reshape(-1, 2, C)
    assert np.all(flat.sum((1, 2)) == TOTAL) and np.all(flat[:, :, :2].sum((1, 2)) <= 6)
    states, logp = enumerate_posterior(grouped_prior)
    assert_means_within_5_mcse(draws, np.tensordot(np.exp(logp), states, axes=1))
    assert "rates of the 1 x 4 (group, cell) pairs summed out" in idata.posterior.attrs["dpinfer"]


def test_grouped_negative_binomial_with_free_parameters_matches_the_explicit_hierarchy():
    """The same law written two ways behind the small release: GroupedNegativeBinomial (group
    rates summed out: the engine's group factor) and the explicit hierarchy (each cell's group
    rate lambda ~ Gamma(alpha, mean M) and the leaves' split rho ~ Beta(A pi_0, A pi_1) as
    parameters, the counts Poisson(lambda rho)), with alpha free. Posterior means of log alpha
    and of the 8 counts agree within 5 Monte Carlo standard errors of their difference."""
    from test_nested_sums import LEAF_ALPHA, MU

    M = MU.sum(0)
    pi0 = MU[0] / M

    def fit(collapsed: bool, seed: int):
        nm = small_release()
        with pm.Model() as model:
            log_alpha = pm.Normal("log_alpha", 0.0, 0.5)
            alpha = pm.math.exp(log_alpha)
            if collapsed:
                x = dp.GroupedNegativeBinomial("x", MU, LEAF_ALPHA, alpha, np.array([0, 0]))
            else:
                rate = pm.Gamma("rate", alpha=alpha, beta=alpha / M, shape=C)
                split = pm.Beta("split", LEAF_ALPHA * pi0, LEAF_ALPHA * (1 - pi0), shape=C)
                share = pm.math.stack([split, 1 - split])
                x = pm.Poisson("x", rate[None, :] * share, shape=(2, C))
            nm.observe("nmf", x)
        idata = dp.sample(model=model, draws=4000, tune=1000, chains=2, random_seed=seed, progressbar=False)
        draws = np.concatenate([idata.posterior["log_alpha"].values[..., None],
                                idata.posterior["x"].values.reshape(2, -1, 2 * C)], axis=-1).astype(float)
        _, ess = diagnostics(draws)
        flat = draws.reshape(-1, draws.shape[-1])
        return flat.mean(0), flat.std(0) / np.sqrt(ess)

    m1, se1 = fit(True, 21)
    m2, se2 = fit(False, 22)
    z = (m1 - m2) / np.sqrt(se1 ** 2 + se2 ** 2)
    assert np.all(np.abs(z) < 5), z


def test_grouped_negative_binomial_refusals():
    nm = small_release()
    with pm.Model():
        with pytest.raises(ValueError, match="group must take every value"):
            dp.GroupedNegativeBinomial("x", MU_ONES, 1.0, 1.0, np.array([0, 2]))
        with pytest.raises(ValueError, match="1-d array of integer"):
            dp.GroupedNegativeBinomial("x", MU_ONES, 1.0, 1.0, np.array([0.0, 1.0]))
    # groups that are not areas of the tree: a tree whose root has three leaves
    three = NestedMeasurements([-1, 0, 0, 0], [1, 2, 3], 1)
    three.measure("m", [1, 2, 3], [[0]], [[1], [2], [3]], 1.0)
    with pm.Model() as model:
        y = dp.GroupedNegativeBinomial("y", np.ones((3, 1)), 1.0, 1.0, np.array([0, 0, 1]))
        three.observe("three", y)
    with pytest.raises(ValueError, match="not the set of leaves under one area"):
        dp.sample(model=model, draws=10, tune=10, chains=1, progressbar=False)
    del nm


MU_ONES = np.ones((2, C))


def test_draw_grouped_negative_binomial_has_the_laws_moments():
    """Group sums of the exact draws: mean M and variance M + M^2 / alpha (the negative
    binomial's), and a leaf's share of its group's sum with mean pi (the Dirichlet split),
    over 20,000 draws, within 5 standard errors (each estimated from the draws' own terms)."""
    rng = np.random.default_rng(3)
    mu = np.array([[2.0, 30.0], [6.0, 10.0], [4.0, 5.0]])
    group = np.array([0, 0, 1])
    draws = np.array([dp.distributions.draw_grouped_negative_binomial(mu, 4.0, 2.5, group, rng)
                      for _ in range(20_000)])
    S = draws[:, 0] + draws[:, 1]  # group 0's sums (20000, 2)
    M = mu[0] + mu[1]
    n = draws.shape[0]
    var = M + M ** 2 / 2.5
    assert np.all(np.abs(S.mean(0) - M) < 5 * np.sqrt(var / n))
    squares = (S - S.mean(0)) ** 2  # the sample variance's standard error from its own terms
    assert np.all(np.abs(S.var(0) - var) < 5 * squares.std(0) / np.sqrt(n))
    for c, pi in enumerate(mu[0] / M):
        share = draws[:, 0, c][S[:, c] > 0] / S[S[:, c] > 0, c]
        assert abs(share.mean() - pi) < 5 * share.std() / np.sqrt(share.size)


# ---- two levels of groups: counties of tracts of leaves ------------------------------------
# root -> mids 1, 2 -> leaves 3, 4 | 5, 6; two cells. Level 1 groups: the mids; level 2: the root.
TWO_MU = np.array([[1.2, 0.5], [2.0, 0.9], [0.7, 1.6], [1.5, 0.4]])
TWO_GROUPS = [np.array([0, 0, 1, 1]), np.array([0, 0, 0, 0])]
TWO_TOTAL = 7


def two_level_prior(states, A1, A2, top):
    """The generative law of GroupedNegativeBinomial with two groupings, from scipy alone: per
    cell the root's sum S ~ NB(M, top), its split between the mids beta-binomial(A2 M_mid / M),
    each mid's between its two leaves beta-binomial(A1 mu / M_mid). ``states`` (K, 4, 2)."""
    from scipy import stats

    mid = TWO_MU.reshape(2, 2, 2).sum(1)
    M = mid.sum(0)
    x = states.reshape(-1, 2, 2, 2)  # state, mid, leaf, cell
    s_mid = x.sum(2)
    S = s_mid.sum(1)
    logp = stats.nbinom.logpmf(S, top, top / (top + M))
    logp = logp + stats.betabinom.logpmf(s_mid[:, 0], S, A2 * mid[0] / M, A2 * mid[1] / M)
    for j in range(2):
        mu = TWO_MU[2 * j:2 * j + 2]
        logp = logp + stats.betabinom.logpmf(x[:, j, 0], s_mid[:, j], A1 * mu[0] / mid[j], A1 * mu[1] / mid[j])
    return logp.sum(1)


def two_level_release() -> NestedMeasurements:
    nm = NestedMeasurements([-1, 0, 0, 1, 1, 2, 2], [3, 4, 5, 6], 2,
                            area_names=["root", "mid1", "mid2", "leaf0", "leaf1", "leaf2", "leaf3"])
    for leaf, area in enumerate([3, 4, 5, 6]):
        nm.measure(f"leaf{leaf}/total", [area], [[0, 1]], [[[3, 1, 2, 0][leaf]]], 1.0)
    nm.measure("mids/cells", [1, 2], [[0], [1]], [[2, 1], [3, 0]], 2.0)
    nm.equal("root/total (=)", [0], [[0, 1]], [[TWO_TOTAL]])
    nm.measure("root/cell 0", [0], [[0]], [[3]], 1.5)
    return nm


def two_level_posterior(A1, A2, top):
    """Every x >= 0 with total TWO_TOTAL and its posterior log probability under
    two_level_prior and the release (discrete Gaussian terms by their closed form)."""
    import itertools

    from test_nested_sums import dg_log_pmf

    n = 8
    comps = np.array(list(itertools.combinations(range(TWO_TOTAL + n - 1), n - 1)))
    bars = np.concatenate([np.full((len(comps), 1), -1), comps, np.full((len(comps), 1), TWO_TOTAL + n - 1)], 1)
    states = (np.diff(bars, axis=1) - 1).reshape(-1, 4, 2)
    logp = two_level_prior(states, A1, A2, top)
    for leaf, y in enumerate([3, 1, 2, 0]):
        logp = logp + dg_log_pmf(y - states[:, leaf].sum(1), 1.0)
    mids = states.reshape(-1, 2, 2, 2).sum(2)
    for j, values in enumerate([[2, 1], [3, 0]]):
        for c in range(2):
            logp = logp + dg_log_pmf(values[c] - mids[:, j, c], 2.0)
    logp = logp + dg_log_pmf(3 - states[:, :, 0].sum(1), 1.5)
    logp -= np.logaddexp.reduce(logp)
    return states, logp


@pytest.mark.parametrize("A1, A2, top", [(3.0, 1.5, 0.6), (0.8, 6.0, 2.5)])
def test_two_level_grouped_negative_binomial_log_pmf_is_the_generative_law(A1, A2, top):
    """The model's log density of the counts (negative binomial leaves plus the Potential of
    both levels' factors) equals the generative law's log pmf exactly, constants included (so
    it is normalised whatever the parameters), on 40 states."""
    from test_nested_sums import TOTAL as _  # noqa: F401  (the enumeration helpers' module)

    rng = np.random.default_rng(5)
    states = rng.integers(0, 6, size=(40, 4, 2))
    with pm.Model() as model:
        dp.GroupedNegativeBinomial("x", TWO_MU, [A1, A2], top, TWO_GROUPS)
    f = model.compile_logp()
    got = np.array([f({"x": s}) for s in states])
    np.testing.assert_allclose(got, two_level_prior(states, A1, A2, top), rtol=0, atol=1e-9)


def test_two_level_grouped_negative_binomial_matches_the_enumerated_posterior():
    """Two levels of group factors in the engine (at the mids and the root, with the tilt
    passed down the levels) behind a four-leaf release: posterior means of all 8 counts within
    5 Monte Carlo standard errors of the enumeration under the generative law. A1 = 0.8 (an
    uneven split inside the mids) differs enough from the other shapes that a factor left out
    or misplaced shifts the means (checked by hand: by up to ~0.15, several standard errors)."""
    A1, A2, top = 0.8, 6.0, 2.5
    nm = two_level_release()
    with pm.Model() as model:
        x = dp.GroupedNegativeBinomial("x", TWO_MU, [A1, A2], top, TWO_GROUPS)
        nm.observe("nmf", x)
    idata = dp.sample(model=model, draws=3000, tune=300, chains=2, random_seed=4, progressbar=False)
    draws = idata.posterior["x"].values
    flat = draws.reshape(-1, 8)
    assert np.all(flat.sum(1) == TWO_TOTAL)
    states, logp = two_level_posterior(A1, A2, top)
    assert_means_within_5_mcse(draws, np.tensordot(np.exp(logp), states, axes=1))
    assert "rates of the 3 x 2 (group, cell) pairs summed out" in idata.posterior.attrs["dpinfer"]


def test_two_level_draws_have_the_laws_moments():
    """Exact draws with two groupings: the root's sums have mean M and variance M + M^2 / top,
    each mid's share of the root's sum mean M_mid / M, each leaf's share of its mid's mu / M_mid
    (20,000 draws, 5 standard errors from the draws' own terms)."""
    rng = np.random.default_rng(8)
    A1, A2, top = 2.0, 3.0, 1.5
    draws = np.array([dp.distributions.draw_grouped_negative_binomial(TWO_MU, [A1, A2], top, TWO_GROUPS, rng)
                      for _ in range(20_000)])
    S = draws.sum(1)
    M = TWO_MU.sum(0)
    n = draws.shape[0]
    var = M + M ** 2 / top
    assert np.all(np.abs(S.mean(0) - M) < 5 * np.sqrt(var / n))
    squares = (S - S.mean(0)) ** 2
    assert np.all(np.abs(S.var(0) - var) < 5 * squares.std(0) / np.sqrt(n))
    mids = draws.reshape(n, 2, 2, 2).sum(2)
    mid_mean = TWO_MU.reshape(2, 2, 2).sum(1)

    def share_check(part, whole, want):
        ok = whole > 0
        share = part[ok] / whole[ok]
        assert abs(share.mean() - want) < 5 * share.std() / np.sqrt(share.size)

    for c in range(2):
        share_check(mids[:, 0, c], S[:, c], mid_mean[0, c] / M[c])
        share_check(draws[:, 2, c], mids[:, 1, c], TWO_MU[2, c] / mid_mean[1, c])


def test_groupings_that_do_not_nest_are_refused():
    with pm.Model():
        with pytest.raises(ValueError, match=r"group\[1\] must be coarser than group\[0\]"):
            dp.GroupedNegativeBinomial("x", TWO_MU, [1.0, 1.0], 1.0, [np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1])])
        with pytest.raises(ValueError, match="one split concentration per grouping"):
            dp.GroupedNegativeBinomial("x", TWO_MU, [1.0], 1.0, TWO_GROUPS)


def test_values_beyond_int32_reach_the_sampler_whole():
    """PyMC stores integer observed data as int32; a bound of 3e9 (a state's group-quarters
    upper bound is 99999 x its housing units) must reach the plan unwrapped."""
    from dpinfer.inference import planning
    from dpinfer.mechanisms.records import releases_of

    nm = NestedMeasurements([-1, 0, 0], [1, 2], 1)
    nm.measure("leaves", [1, 2], [[0]], [[3], [5]], 2.0)
    nm.at_most("root (<=)", [0], [[0]], [[2_963_370_366]])
    with pm.Model() as model:
        x = pm.Poisson("x", 4.0, shape=(2, 1))
        nm.observe("nmf", x)
    plan = planning.plan_model(model, releases_of(model)).latents[0]
    assert plan.sums.term_value.tolist() == [2_963_370_366, 3, 5]
