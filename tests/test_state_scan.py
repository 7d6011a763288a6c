"""A state's counts at blocks on workers (dpinfer.io.nmf.state_scan): the scan on a small synthetic
state (3 counties and a single-county AIAN part, 70 blocks, 28 cells) draws the same in this
process and on Dask workers, keeps every exact term of the release, its county sizes are its
leaf sizes' log-sum-exp; its empirical-Bayes estimate of the split concentrations settles and is
reported as an approximation, an unsettled one is NOT CONVERGED; a scan interrupted, or whose
worker is lost, resumes from its checkpoint to the uninterrupted scan's draws (on Dask too);
bad input is refused by name; and (validation tier) its posterior is the one-machine engine's
on the same model (the census model with iid leaf sizes and the split concentrations fixed),
and its estimate of them the one-machine estimate."""

import json
import tempfile
import warnings

import numpy as np
import pytest
from scipy.special import logsumexp

import dpinfer as dp
from dpinfer.io.nmf.model import ROOT_SHAPE, groupings_levels, root_mean, spine_groupings
from dpinfer.io.nmf.state_scan import StateScan
from dpinfer.io.nmf.synthetic import write_synthetic_nmf
from dpinfer.io.nmf.table import census_table
from dpinfer.lattice.nested.sampler import check_exact_terms

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]


@pytest.fixture(scope="module")
def table():
    with tempfile.TemporaryDirectory() as root:
        write_synthetic_nmf(root, n_counties=3, tracts_per_county=2, block_groups_per_tract=2,
                            blocks_per_block_group=(4, 6), aian_tracts=1, mean_block_population=60.0, seed=2020)
        return census_table(dp.read_nmf(root, 19, levels=LEVELS), "Block")


def fixed_theta(table) -> np.ndarray:
    return np.full((len(groupings_levels(table)), len(table.cells)), 2.0)


@pytest.fixture(scope="module")
def here(table):
    return StateScan(table, fixed_theta(table), shards=3, progressbar=False).run(draws=15, tune=10, chains=1,
                                                                               random_seed=7)


def test_on_workers_the_draws_are_those_of_this_process(table, here, client):
    """Also a second run on the same cluster (its shards' data sent again, under new keys)."""
    scan = StateScan(table, fixed_theta(table), shards=3, client=client, progressbar=False)
    for _ in range(2):
        there = scan.run(draws=15, tune=10, chains=1, random_seed=7)
        for name in ("counts", "leaf_effect", "county_log_size", "sd_leaf"):
            np.testing.assert_array_equal(here.posterior[name].values, there.posterior[name].values)
    assert np.unique(here.posterior["counts"].values, axis=1).shape[1] > 10  # the counts move


def test_every_draw_keeps_the_exact_terms_and_the_county_sizes_are_the_leaves(table, here):
    x = here.posterior["counts"].values[0]
    for draw in x:
        check_exact_terms(table.release.sums, draw)
    county = spine_groupings(table)[groupings_levels(table).index("County")]
    v, L = here.posterior["leaf_effect"].values[0], here.posterior["county_log_size"].values[0]
    assert county.max() == 3  # the AIAN part's county too
    for q in range(4):
        np.testing.assert_allclose(logsumexp(v[:, county == q], axis=1), L[:, q], rtol=0, atol=1e-9)
    assert here.posterior.attrs["moves_without_mass"] == 0


def test_the_aian_part_is_a_shard_of_its_own(table):
    """Its county's areas have another parent in the tree: a run of counties is cut there, so
    asking for 3 shards of the 4 counties gives 4."""
    scan = StateScan(table, fixed_theta(table), shards=3, progressbar=False)
    assert [p.tolist() for p in scan.parts] == [[0], [1], [2], [3]]
    assert [p.tolist() for p in StateScan(table, fixed_theta(table), shards=2, progressbar=False).parts] == \
        [[0, 1], [2], [3]]


def test_the_estimate_settles_and_is_reported_as_an_approximation(table):
    """With the default settings the estimate settles (every Monte Carlo error within a fifth of
    its approximate posterior sd), is reported as dpinfer.sample reports one and named as the
    approximation it is; the draws given it follow."""

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 10 draws: not converged
        tree = StateScan(table, shards=3, progressbar=False, empirical_bayes={"tune": 10}).run(draws=10, chains=2,
                                                                                             random_seed=5)
    estimate = json.loads(tree.posterior.attrs["dpinfer_empirical_bayes"])
    assert estimate["settled"] and estimate["uncertainty"] == "none" and 30 <= estimate["iterations"] < 300
    theta = np.array(estimate["parameters"]["log_split"])
    assert theta.shape == fixed_theta(table).shape and np.all(np.isfinite(theta))
    assert np.all(np.array(estimate["mc_se"]["log_split"]) <= 0.2 * np.array(estimate["posterior_sd"]["log_split"]))
    assert "empirical Bayes" in estimate["method"] and "ignores its uncertainty" in estimate["method"]
    assert "empirical-Bayes estimate" in tree.posterior.attrs["method"]
    assert tree.posterior.sizes["draw"] == 10 and tree.sample_stats.sizes["draw"] == 10
    verdict = json.loads(tree.posterior.attrs["dpinfer_convergence"])
    assert "estimate_not_settled" not in verdict


def test_an_unsettled_estimate_is_not_converged(table):
    """Stopped at max_iterations before its Monte Carlo error meets the tolerance: the verdict
    says NOT CONVERGED and names the estimate, whatever the draws given it."""

    from dpinfer.inference.convergence import ConvergenceWarning

    scan = StateScan(table, shards=2, progressbar=False, empirical_bayes={"burn_in": 10, "max_iterations": 25,
                                                                                  "tune": 5})
    with pytest.warns(ConvergenceWarning, match="NOT CONVERGED: the parameters' empirical-Bayes estimate is NOT "
                                                "SETTLED after 25 iterations"):
        tree = scan.run(draws=5, chains=2, random_seed=1)
    verdict = json.loads(tree.posterior.attrs["dpinfer_convergence"])
    assert not verdict["converged"] and "NOT SETTLED" in verdict["estimate_not_settled"]


SMALL_ESTIMATE = {"burn_in": 5, "max_iterations": 12, "tune": 4}  # an estimate cut short, for resumes


def small_scan(table, **options):
    return StateScan(table, shards=3, progressbar=False, empirical_bayes=SMALL_ESTIMATE, **options)


@pytest.fixture(scope="module")
def uninterrupted(table):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # not settled, not converged
        return small_scan(table).run(draws=6, chains=2, random_seed=3)


def assert_same_scan(a, b):
    estimates = [json.loads(x.posterior.attrs["dpinfer_empirical_bayes"]) for x in (a, b)]
    for e in estimates:
        e.pop("seconds")  # this process's
    assert estimates[0] == estimates[1]
    for name in ("counts", "leaf_effect", "county_log_size", "sd_leaf"):
        np.testing.assert_array_equal(a.posterior[name].values, b.posterior[name].values)
    np.testing.assert_array_equal(a.sample_stats["step_size"].values, b.sample_stats["step_size"].values)


@pytest.mark.parametrize("stop_at", [7, 15])  # iterations: in the estimate (12), in the draws after it
def test_an_interrupted_scan_resumes_to_the_draws_of_an_uninterrupted_one(table, uninterrupted, stop_at,
                                                                          tmp_path, monkeypatch, capsys):
    """Interrupted (Ctrl-C) at iteration 7 or 15 with checkpoints every 5: the scan says where
    its checkpoint is; resumed from it (the seed read from it), the estimate and every draw are
    the uninterrupted scan's."""
    from dpinfer.io.nmf import state_scan

    iterate, calls = state_scan._ScanChain.iterate, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2 * (stop_at - 1) + 1:  # two chains an iteration
            raise KeyboardInterrupt
        return iterate(self, *args, **kwargs)

    monkeypatch.setattr(state_scan._ScanChain, "iterate", interrupted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(KeyboardInterrupt):
            StateScan(table, shards=3, empirical_bayes=SMALL_ESTIMATE).run(
                draws=6, chains=2, random_seed=3, checkpoint=tmp_path / "scan", checkpoint_every=5)
        assert f"holds iteration {5 * ((stop_at - 1) // 5)}: run it again with resume=" in capsys.readouterr().err
        monkeypatch.setattr(state_scan._ScanChain, "iterate", iterate)
        resumed = small_scan(table).run(draws=6, chains=2, resume=tmp_path / "scan")
    assert resumed.posterior.attrs["resumed_at_iteration"] == 5 * ((stop_at - 1) // 5)
    assert_same_scan(uninterrupted, resumed)


def test_a_checkpoint_of_another_scan_is_refused(table, tmp_path):
    from dpinfer.inference.checkpoint import CheckpointMismatchError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small_scan(table).run(draws=2, chains=2, random_seed=3, checkpoint=tmp_path / "scan", checkpoint_every=5)
    with pytest.raises(CheckpointMismatchError, match=r"draws=2 there, 3 now"):
        small_scan(table).run(draws=3, chains=2, resume=tmp_path / "scan")
    with pytest.raises(CheckpointMismatchError, match="random_seed"):
        small_scan(table).run(draws=2, chains=2, random_seed=4, resume=tmp_path / "scan")
    with pytest.raises(FileExistsError, match="is not empty"):
        small_scan(table).run(draws=2, chains=2, checkpoint=tmp_path / "scan")
    with pytest.raises(FileNotFoundError, match="holds no state scan checkpoint"):
        small_scan(table).run(draws=2, resume=tmp_path / "nothing")
    with pytest.raises(ValueError, match="give checkpoint= or resume=, not both"):
        small_scan(table).run(draws=2, checkpoint=tmp_path / "a", resume=tmp_path / "scan")
    with pytest.raises(ValueError, match="checkpoint_every must be a whole number >= 1"):
        small_scan(table).run(draws=2, checkpoint=tmp_path / "b", checkpoint_every=0)
    with pytest.raises(TypeError, match="checkpoint must be None or a directory path"):
        small_scan(table).run(draws=2, checkpoint=5)


def test_a_lost_worker_stops_the_scan_and_its_checkpoint_resumes_it(table, uninterrupted, client, tmp_path,
                                                                     monkeypatch):
    """A worker killed at the ninth iteration (SIGKILL; its nanny starts another, so this runs
    after the module's other tests on the cluster): the scan stops at once, naming the
    iteration and its checkpoint; resumed from it on the same cluster, its estimate and draws
    are those of the uninterrupted scan in this process."""
    import os
    import signal

    refill = StateScan._refill
    calls = []

    def killing_refill(self, shards, state, shared):
        calls.append(1)
        if len(calls) == 2 * 8 + 1:  # two chains an iteration
            pid = next(iter(self.client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)
        return refill(self, shards, state, shared)

    monkeypatch.setattr(StateScan, "_refill", killing_refill)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match=r"lost a shard's worker at iteration 9 of chain 0.*checkpoint holds "
                                               r"iteration 5: run it again with resume="):
            small_scan(table, client=client).run(draws=6, chains=2, random_seed=3, checkpoint=tmp_path / "scan",
                                                 checkpoint_every=5)
        monkeypatch.setattr(StateScan, "_refill", refill)
        client.wait_for_workers(2, timeout=60)
        resumed = small_scan(table, client=client).run(draws=6, chains=2, resume=tmp_path / "scan")
    assert_same_scan(uninterrupted, resumed)


def test_the_leaves_prior_table_is_scipy_s_negative_binomial():
    """negative_binomial_rows (the pmf carried along each box by its ratio) against
    scipy.stats.nbinom on boxes from 0 and far from it, wide and narrow, laid out out of order."""
    from scipy import stats

    from dpinfer.io.nmf.county_shard import negative_binomial_rows

    rng = np.random.default_rng(4)
    lo = np.array([0, 0, 37, 950, 3, 0])
    hi = lo + np.array([0, 2000, 40, 300, 1, 60])
    order = np.array([3, 0, 5, 1, 4, 2])  # the table's layout: row i's entries from start[i]
    width = hi - lo + 1
    start = np.empty(lo.size + 1, np.int64)
    start[order] = np.concatenate([[0], np.cumsum(width[order])[:-1]])
    start[-1] = width.sum()
    shape, mean = rng.gamma(2.0, 1.0, lo.size) + 0.01, np.array([0.05, 40.0, 55.0, 1000.0, 2.0, 7.5])
    out = np.full(width.sum(), np.nan)
    negative_binomial_rows(lo, hi, start, shape, mean, out)
    for i in range(lo.size):
        x = np.arange(lo[i], hi[i] + 1)
        np.testing.assert_allclose(out[start[i]:start[i] + width[i]],
                                   stats.nbinom.logpmf(x, shape[i], shape[i] / (shape[i] + mean[i])),
                                   rtol=1e-11, atol=1e-9)


def test_bad_input_is_refused_by_name(table):
    theta = fixed_theta(table)
    with pytest.raises(TypeError, match="table must be a CensusTable"):
        StateScan("table.parquet", theta)
    with pytest.raises(ValueError, match="level must be one of the table's spine levels"):
        StateScan(table, theta, level="Place")
    with pytest.raises(ValueError, match="level must be below the root"):
        StateScan(table, theta, level="US")
    for bad in (theta[:2], "2.0", np.full_like(theta, np.nan)):
        with pytest.raises(ValueError, match=r"log_split must be None \(estimated\) or finite numbers, a row"):
            StateScan(table, bad)
    with pytest.raises(ValueError, match="empirical_bayes settings are for log_split=None"):
        StateScan(table, theta, empirical_bayes={"tolerance": 0.1})
    with pytest.raises(ValueError, match=r"empirical_bayes got \['uncertainty'\]; its settings are"):
        StateScan(table, empirical_bayes={"uncertainty": "normal"})
    with pytest.raises(TypeError, match="empirical_bayes must be a dict of settings"):
        StateScan(table, empirical_bayes=0.1)
    for bad in ({"tolerance": 0}, {"tolerance": "0.1"}):
        with pytest.raises(ValueError, match=r"empirical_bayes\['tolerance'\] must be a number > 0"):
            StateScan(table, empirical_bayes=bad)
    with pytest.raises(ValueError, match=r"empirical_bayes\['burn_in'\] \(50\) must be at most max_iterations"):
        StateScan(table, empirical_bayes={"burn_in": 50, "max_iterations": 40})
    with pytest.raises(ValueError, match=r"empirical_bayes\['tune'\] must be a whole number >= 0"):
        StateScan(table, empirical_bayes={"tune": -1})
    with pytest.raises(ValueError, match=r"shards must be at most the number of County areas \(4\)"):
        StateScan(table, theta, shards=5)
    with pytest.raises(ValueError, match="shards must be a whole number >= 1"):
        StateScan(table, theta, shards=0)
    with pytest.raises(TypeError, match="store_counts must be True or False"):
        StateScan(table, theta, store_counts="no")
    with pytest.raises(TypeError, match="client must be None or a dask.distributed.Client"):
        StateScan(table, theta, client="tcp://127.0.0.1:8786")
    with pytest.raises(TypeError, match=r"StateScan got \['chains'\]; it takes target_accept"):
        StateScan(table, theta, chains=2)
    scan = StateScan(table, theta, shards=1, progressbar=False)
    with pytest.raises(ValueError, match="draws must be a whole number >= 1"):
        scan.run(draws=0)
    with pytest.raises(TypeError, match="random_seed must be None or a whole number"):
        scan.run(draws=1, tune=0, random_seed="7")


@pytest.mark.validation
def test_the_scan_s_posterior_is_the_one_machine_engine_s(table):
    """The one-machine engine (dp.sample) on the census model with iid leaf sizes and theta
    fixed, against the scan with each county a shard: every county's total by cell, every
    block's total, every block's share of the state and the leaf sizes' scale agree within
    4.5 standard errors of the difference (MCSE of each side; about 200 quantities, so a
    correct scan fails with probability about 1e-3), and their z-scores spread as N(0, 1)
    (their sd below 1.3)."""
    import arviz as az
    import pymc as pm
    import pytensor.tensor as pt

    theta = fixed_theta(table)
    groupings = spine_groupings(table)
    K, C = theta.shape
    with pm.Model(coords=table.coords) as model:
        s = pm.HalfNormal("sd_leaf", 1.0)
        v = pm.Normal("leaf_effect", 0.0, s, dims="geocode")
        mu = root_mean(table) * pt.special.softmax(v)[:, None] * pt.ones((1, C))
        counts = dp.GroupedNegativeBinomial("counts", mu, [np.exp(theta[k]) for k in range(K)], ROOT_SHAPE,
                                            groupings, dims=("geocode", "cell"))
        table.release.observe("nmf", counts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = dp.sample(model=model, draws=600, tune=400, chains=2, random_seed=3, progressbar=False)
    scan = StateScan(table, theta, shards=3, progressbar=False).run(draws=600, tune=400, chains=2, random_seed=4)
    county = groupings[groupings_levels(table).index("County")]

    def quantities(idata) -> np.ndarray:
        p = idata.posterior
        x = p["counts"].values.astype(float)
        share = np.exp(p["leaf_effect"].values)
        share /= share.sum(-1, keepdims=True)
        by_county = np.concatenate([x[:, :, county == q].sum(2) for q in range(county.max() + 1)], axis=2)
        return np.concatenate([by_county, x.sum(-1), share, p["sd_leaf"].values[..., None]], axis=2)

    a, b = quantities(one), quantities(scan)
    moving = (a.std(axis=(0, 1)) > 0) | (b.std(axis=(0, 1)) > 0)
    z = [(a[..., j].mean() - b[..., j].mean()) / np.hypot(float(az.mcse(a[..., j])), float(az.mcse(b[..., j])))
         for j in np.flatnonzero(moving)]
    z = np.array(z)
    assert z.size > 150
    assert np.abs(z).max() < 4.5, f"max |z| {np.abs(z).max():.2f} at {np.argmax(np.abs(z))}"
    assert z.std() < 1.3


@pytest.mark.validation
def test_the_scan_s_estimate_of_theta_is_the_one_machine_estimate(table):
    """theta by the scan's empirical Bayes (each shard's scores reduced with the driver's)
    against dp.sample's on census_model with the leaf sizes drawn (dpinfer nmf's settings at
    blocks), both to a tolerance of a tenth of the approximate posterior sd: the estimates (140,
    less any level that keeps its prior mode on both sides) within 4.5 standard errors of their difference (the two Monte Carlo errors; a correct scan
    fails with probability about 1e-3), their z-scores spread as N(0, 1) (sd below 1.3), and the
    approximate posterior sds agree (median ratio within 3%, 90% of the ratios within 15%: two
    one-machine estimates differ by as much, their secant-read sds of cells with most of the
    information missing the noisiest)."""

    from dpinfer.io.nmf.model import census_model, empirical_bayes_settings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scan = StateScan(table, shards=3, progressbar=False,
                         empirical_bayes={"tolerance": 0.1, "max_iterations": 800}).run(draws=10, chains=2,
                                                                                       random_seed=1)
        model = census_model(table)
        one = dp.sample(model=model, draws=10, tune=20, chains=2, random_seed=1, progressbar=False,
                        inference="empirical-bayes",
                        empirical_bayes=empirical_bayes_settings(model, "Block", "none") | {"tolerance": 0.1})
    ours, theirs = (json.loads(idata.posterior.attrs["dpinfer_empirical_bayes"]) for idata in (scan, one))
    assert ours["settled"] and theirs["settled"]

    def values(entry, key):
        return np.asarray(entry[key]["log_split"], dtype=float).ravel()

    se = np.hypot(values(ours, "mc_se"), values(theirs, "mc_se"))
    moved = se > 0  # a level whose areas have one child each (the nation of one state) keeps its prior mode
    np.testing.assert_allclose(values(ours, "parameters")[~moved], values(theirs, "parameters")[~moved], atol=1e-12)
    z = (values(ours, "parameters") - values(theirs, "parameters"))[moved] / se[moved]
    assert z.size >= 100
    assert np.abs(z).max() < 4.5, f"max |z| {np.abs(z).max():.2f} at {np.argmax(np.abs(z))}"
    assert z.std() < 1.3
    ratio = values(ours, "posterior_sd") / values(theirs, "posterior_sd")
    assert abs(np.median(ratio) - 1.0) < 0.03
    low, high = np.percentile(ratio, [5, 95])
    assert 0.85 < low and high < 1.15, (low, high)
