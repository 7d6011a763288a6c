"""dpinfer.sample against exact posteriors computed by enumeration."""

import json
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy import special, stats

from dpinfer.inference import marginal_model, sample
from dpinfer.inference.recovery import RecoveryWarning, recoveries_of
from dpinfer.inference.window import initial_half_width, log_eta_off_centre, neglected_log_mass
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian
from dpinfer.mechanisms.geometric import DoubleGeometric
from dpinfer.mechanisms.laplace import Laplace

N, A, B, EPS, RELEASE = 1000, 10.0, 10.0, 0.1, 612


def exact_beta_binomial_posterior():
    """theta ~ Beta(A, B), x ~ Bin(N, theta), s = x + DoubleGeometric(EPS) = RELEASE.

    x's marginal is BetaBinomial(N, A, B), so p(x | s) ∝ BetaBin(x) f(s - x) over x = 0..N,
    and theta | x ~ Beta(A + x, B + N - x): E[theta | s] and Var by the laws of total
    expectation and variance.
    """
    x = np.arange(N + 1)
    a = np.exp(-EPS)
    log_w = stats.betabinom.logpmf(x, N, A, B) + np.log((1 - a) / (1 + a)) - EPS * np.abs(RELEASE - x)
    p = np.exp(log_w - special.logsumexp(log_w))
    a_post, b_post = A + x, B + N - x
    m = a_post / (A + B + N)
    v = a_post * b_post / ((A + B + N) ** 2 * (A + B + N + 1))
    mean = np.sum(p * m)
    sd = np.sqrt(np.sum(p * (v + m**2)) - mean**2)
    return mean, sd, x, p


def exact_poisson_child_posterior(a, b, q, y, s, mech, n_max=400):
    """x ~ Poisson(lam), lam ~ Gamma(a, b) (so x ~ NegBinomial(a, b/(b+1))), y ~ Binomial(x, q),
    s = release of x: p(x | y, s) on 0..n_max-1, and its mean and sd."""
    support = np.arange(n_max)
    log_w = (
        stats.nbinom.logpmf(support, a, b / (b + 1))
        + stats.binom.logpmf(y, support, q)
        + mech.log_likelihood(np.full(support.shape, s), support)
    )
    p = np.exp(log_w - special.logsumexp(log_w))
    mean = np.sum(p * support)
    return support, p, mean, np.sqrt(np.sum(p * support**2) - mean**2)


def beta_binomial_model() -> pm.Model:
    with pm.Model() as model:
        theta = pm.Beta("theta", A, B)
        x = pm.Binomial("x", N, theta)
        DoubleGeometric(epsilon=EPS).observe("release", x, observed=RELEASE)
    return model


@pytest.fixture(scope="module")
def beta_binomial_fit():
    model = beta_binomial_model()
    idata = sample(2000, tune=1000, chains=2, random_seed=11, progressbar=False, model=model)
    return model, idata


def test_exact_posterior_values_match_published():
    mean, sd, _, _ = exact_beta_binomial_posterior()
    assert mean == pytest.approx(0.6082, abs=5e-5)
    assert sd == pytest.approx(0.0205, abs=5e-5)


def test_theta_posterior_matches_enumeration(beta_binomial_fit):
    _, idata = beta_binomial_fit
    mean, sd, _, _ = exact_beta_binomial_posterior()
    theta = idata.posterior["theta"]
    ess = float(az.ess(idata, var_names=["theta"])["theta"])
    draws = theta.values.ravel()
    # Monte Carlo standard errors: of the mean sd/sqrt(ess); of the sd ~ sd/sqrt(2 ess).
    assert abs(draws.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(draws.std() - sd) < 4 * sd / np.sqrt(2 * ess)


def test_naive_posterior_is_too_narrow():
    """Taking the release as the count gives Beta(A + s, B + N - s): about 26% too narrow."""
    _, sd, _, _ = exact_beta_binomial_posterior()
    naive_sd = stats.beta(A + RELEASE, B + N - RELEASE).std()
    assert 1 - naive_sd / sd == pytest.approx(0.26, abs=0.01)


def test_count_draws_match_enumerated_posterior(beta_binomial_fit):
    _, idata = beta_binomial_fit
    _, _, support, p = exact_beta_binomial_posterior()
    x = idata.posterior["x"].values
    assert x.dtype == np.int64
    exact_mean = np.sum(p * support)
    exact_sd = np.sqrt(np.sum(p * support**2) - exact_mean**2)
    ess = float(az.ess(idata, var_names=["x"])["x"])
    assert abs(x.mean() - exact_mean) < 4 * exact_sd / np.sqrt(ess)
    assert abs(x.std() - exact_sd) < 4 * exact_sd / np.sqrt(2 * ess)
    # Whole-distribution check on deciles of the exact posterior, with effective counts.
    edges = np.searchsorted(np.cumsum(p), np.linspace(0.1, 0.9, 9))
    expected = np.diff(np.concatenate([[0.0], np.cumsum(p)[edges], [1.0]]))
    observed = np.bincount(np.searchsorted(support[edges], x.ravel(), side="left"), minlength=10)
    observed = observed / x.size
    chi2 = ess * np.sum((observed - expected) ** 2 / expected)
    assert stats.chi2.sf(chi2, df=9) > 1e-3


def test_report_records_engine_method_and_window(beta_binomial_fit):
    _, idata = beta_binomial_fit
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["release"] == "release"
    assert report["engine"] == "compiled" and report["method"].startswith("exact Gibbs")
    assert report["exact_tails"] and report["max_relative_error_bound"] == 0.0
    # the window: the smallest k with P(|e| > k) <= TAIL_SHARE f(sd), in closed form for the
    # double geometric law f(e) = (1 - a)/(1 + a) a^|e|, a = e^-eps: P(|e| > k) = 2 a^(k+1)/(1 + a)
    from dpinfer.inference.window import TAIL_SHARE

    a = np.exp(-EPS)
    sd = np.sqrt(2 * a) / (1 - a)

    def tail_ratio(k):
        return (2 * a ** (k + 1) / (1 + a)) / ((1 - a) / (1 + a) * a**sd)

    k = report["window_half_width"]
    assert tail_ratio(k) <= TAIL_SHARE < tail_ratio(k - 1)


def test_marginal_model_keeps_release_observed(beta_binomial_fit):
    model, idata = beta_binomial_fit
    mm = marginal_model(model)
    assert [v.name for v in mm.observed_RVs] == ["release"]
    assert [v.name for v in mm.free_RVs] == ["theta"]
    sub = idata.posterior.isel(draw=slice(0, 50))
    small = idata.copy()
    small["posterior"] = sub
    with mm:
        ll = pm.compute_log_likelihood(small, progressbar=False, extend_inferencedata=False)
        pp = pm.sample_posterior_predictive(small, random_seed=1, progressbar=False)
    # Marginal likelihood of the release at a posterior draw, by direct enumeration.
    theta0 = float(sub["theta"].values[0, 0])
    x = np.arange(N + 1)
    a = np.exp(-EPS)
    direct = special.logsumexp(
        stats.binom.logpmf(x, N, theta0) + np.log((1 - a) / (1 + a)) - EPS * np.abs(RELEASE - x)
    )
    assert float(ll["release"].values[0, 0]) == pytest.approx(direct, rel=1e-9)
    predictive = pp["posterior_predictive"]["release"].values
    assert predictive.dtype.kind == "i" and abs(predictive.mean() - RELEASE) < 40


def test_plain_pm_sample_warns_on_latent_counts():
    from pymc.sampling.mcmc import assign_step_methods

    mech = DoubleGeometric(epsilon=1.0)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 0.1)
        x = pm.Poisson("x", lam, shape=3)
        mech.observe("release", x, observed=[3, 4, 5])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assign_step_methods(model)
    assert any("dpinfer.sample" in str(w.message) for w in caught)


def test_latent_with_a_continuous_child_is_refused():
    from dpinfer.inference.planning.children import ContinuousChildError

    mech = DoubleGeometric(epsilon=1.0)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 0.1)
        x = pm.Poisson("x", lam)
        pm.Normal("y", mu=x, sigma=1.0, observed=2.5)
        mech.observe("release", x, observed=4)
    with pytest.raises(ContinuousChildError, match="continuous child 'y'"):
        sample(10, tune=10, model=model, progressbar=False)


def test_model_without_release_is_refused():
    with pm.Model() as model:
        pm.Normal("mu")
    with pytest.raises(ValueError, match="no release registered"):
        sample(model=model)


def test_window_bound_is_valid_against_the_full_sum():
    """|L - L_W| / L_W <= eta / L_W: compare the windowed likelihood with the full sum."""
    mech = DoubleGeometric(epsilon=0.5)
    release, lam = np.array([0, 3, 25]), 12.0
    k = initial_half_width(mech, release, log_target=np.log(1e-6))
    x_all = np.arange(0, 400)
    full = special.logsumexp(
        stats.poisson.logpmf(x_all[:, None], lam) + mech.log_likelihood(release[None, :], x_all[:, None]),
        axis=0,
    )
    centres = np.maximum(release, 0)
    windowed = []
    for c, s in zip(centres, release):
        xs = np.arange(max(c - k, 0), c + k + 1)
        windowed.append(special.logsumexp(stats.poisson.logpmf(xs, lam) + mech.log_likelihood(s, xs)))
    windowed = np.array(windowed)
    log_eta = mech.log_likelihood_bound_outside(release, k)
    bound = neglected_log_mass(log_eta, windowed)
    assert np.sum(full - windowed) <= bound + 1e-15
    assert np.all(log_eta <= np.log(1e-6) + 1e-12)


def test_window_widens_when_the_check_fails(monkeypatch):
    """The PyMC engine's marginal path: a window too narrow for tol is widened and refitted."""
    from dpinfer.inference.planning.cells import CellsPlan

    monkeypatch.setattr(CellsPlan, "first_half_width", lambda plan, tol, compiled: 1)
    model = beta_binomial_model()
    with pytest.warns(RecoveryWarning, match="widened them and fitted again"):
        idata = sample(50, tune=50, chains=1, random_seed=3, progressbar=False, model=model,
                       method="marginal")
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["engine"] == "pymc" and report["widenings"] >= 1
    assert [r["kind"] for r in recoveries_of(idata)] == ["windows widened"] * report["widenings"]
    assert report["max_relative_error_bound"] <= report["tol"]


def test_exact_tails_make_a_narrow_window_exact(monkeypatch):
    """The compiled engine draws the counts exactly beyond the window (geometric envelopes):
    with a window of +-8 around s = 612 at epsilon = 0.1 (noise sd 14) about half of the
    count draws come from the tails, and the posterior still matches enumeration."""
    import dpinfer.inference.planning.cells as plans_module

    monkeypatch.setattr(plans_module, "tail_half_width", lambda mech: 8)
    model = beta_binomial_model()
    idata = sample(2000, tune=1000, chains=2, random_seed=5, progressbar=False, model=model)
    x_draws_total = 2 * 2000 * idata.sample_stats.attrs["counts_per_sweep"]  # draws of x made
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["engine"] == "compiled" and report["window_half_width"] == 8
    # a cell is held (kept for a sweep) only where the window misses x | theta almost entirely
    assert report["exact_tails"] and report["held_cells_after_tuning"] < 0.1 * x_draws_total
    mean, sd, support, p = exact_beta_binomial_posterior()
    x = idata.posterior["x"].values
    assert np.mean(np.abs(x - RELEASE) > 8) > 0.3  # the tails are really used
    ess = float(az.ess(idata, var_names=["x"])["x"])
    exact_mean = np.sum(p * support)
    exact_sd = np.sqrt(np.sum(p * support**2) - exact_mean**2)
    assert abs(x.mean() - exact_mean) < 4 * exact_sd / np.sqrt(ess)
    assert abs(x.std() - exact_sd) < 4 * exact_sd / np.sqrt(2 * ess)
    theta = idata.posterior["theta"].values
    ess_theta = float(az.ess(idata, var_names=["theta"])["theta"])
    assert abs(theta.mean() - mean) < 4 * sd / np.sqrt(ess_theta)


def test_windowed_gibbs_for_counts_with_other_children():
    """x ~ Poisson(lam), lam ~ Gamma(a, b); y ~ Binomial(x, q) observed; s = x + noise.

    x's marginal is NegativeBinomial(a, b / (b + 1)), so p(x | y, s) ∝ NB(x) Bin(y | x, q) f(s - x)
    is enumerable, and lam | x ~ Gamma(a + x, b + 1) gives E[lam | y, s].
    """
    a, b, q, y, s_obs, eps = 4.0, 0.2, 0.5, 9, 23, 0.4
    mech = DoubleGeometric(epsilon=eps)
    with pm.Model() as model:
        lam = pm.Gamma("lam", a, b)
        x = pm.Poisson("x", lam)
        pm.Binomial("y", n=x, p=q, observed=y)
        mech.observe("release", x, observed=s_obs)
    idata = sample(1500, tune=500, chains=2, random_seed=5, progressbar=False, model=model)
    support, p, x_mean, x_sd = exact_poisson_child_posterior(a, b, q, y, s_obs, mech)
    lam_mean = np.sum(p * (a + support) / (b + 1))
    draws = idata.posterior["x"].values
    ess = az.ess(idata, var_names=["x", "lam"])
    assert abs(draws.mean() - x_mean) < 4 * x_sd / np.sqrt(float(ess["x"]))
    assert abs(draws.std() - x_sd) < 4 * x_sd / np.sqrt(2 * float(ess["x"]))
    lam_draws = idata.posterior["lam"].values
    assert abs(lam_draws.mean() - lam_mean) < 4 * lam_draws.std() / np.sqrt(float(ess["lam"]))
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["method"].startswith("windowed exact Gibbs")
    assert report["max_relative_error_bound"] <= report["tol"]


def test_release_at_the_upper_atom_of_a_clamped_mechanism():
    """theta ~ Beta(2, 2), x ~ Binomial(20, theta), release = clamp(x + Laplace, 0, 20) = 20.

    The atom P(s = 20 | x) = exp(-(20 - x)/b)/2 only decays because x <= 20: the window uses
    the Binomial's upper end. Exact: p(x | s) ∝ BetaBin(x; 20, 2, 2) P(s | x)."""
    from dpinfer.mechanisms.truncated_laplace import BITLaplace

    mech = BITLaplace(epsilon=0.5, lower=0.0, upper=20.0)
    with pm.Model() as model:
        theta = pm.Beta("theta", 2.0, 2.0)
        x = pm.Binomial("x", 20, theta)
        mech.observe("release", x, observed=20.0)
    idata = sample(1000, tune=500, chains=2, random_seed=7, progressbar=False, model=model)
    support = np.arange(21)
    log_w = stats.betabinom.logpmf(support, 20, 2, 2) + mech.log_likelihood(np.full(21, 20.0), support)
    p = np.exp(log_w - special.logsumexp(log_w))
    theta_mean = np.sum(p * (2 + support) / 24)
    draws = idata.posterior["theta"].values
    ess = float(az.ess(idata, var_names=["theta"])["theta"])
    assert abs(draws.mean() - theta_mean) < 4 * draws.std() / np.sqrt(ess)
    x_draws = idata.posterior["x"].values
    assert x_draws.max() <= 20
    assert abs(x_draws.mean() - np.sum(p * support)) < 4 * x_draws.std() / np.sqrt(ess)


def test_observe_rejects_a_release_of_the_wrong_shape():
    mech = DoubleGeometric(epsilon=1.0)
    with pm.Model():
        x = pm.Poisson("x", 5.0, shape=3)
        with pytest.raises(ValueError, match=r"observed has shape \(4,\) but true_values has shape \(3,\)"):
            mech.observe("release", x, observed=[1, 2, 3, 4])
        with pytest.raises(ValueError, match="whole numbers"):
            mech.observe("release", x, observed=[1.5, 2, 3])


def test_fixed_prior_gives_exact_iid_count_draws():
    """No parameters left after summing out: x_i ~ Poisson(3) released with OpenDP-style
    one-sided clamping at 0. dp.sample draws the counts i.i.d. from the exact posterior
    p(x | s) ∝ Pois(x; 3) P(s | x); a chi-square test against enumeration (i.i.d. draws)."""
    from dpinfer.mechanisms.geometric import ClampedGeometric

    mech = ClampedGeometric(epsilon=0.5, lower=0)
    release = np.array([0, 4])
    with pm.Model() as model:
        x = pm.Poisson("x", 3.0, shape=2)
        mech.observe("release", x, observed=release)
    idata = sample(2000, chains=2, random_seed=3, progressbar=False, model=model)
    draws = idata.posterior["x"].values.reshape(-1, 2)
    support = np.arange(60)
    for i, s in enumerate(release):
        log_w = stats.poisson.logpmf(support, 3.0) + mech.log_likelihood(np.full(60, s), support)
        p = np.exp(log_w - special.logsumexp(log_w))
        observed = np.bincount(draws[:, i], minlength=60)[:60]
        keep = p * draws.shape[0] >= 5  # pool the tail into one cell
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(p[keep], p[~keep].sum()) * draws.shape[0]
        assert stats.chisquare(obs, exp).pvalue > 1e-3


def test_binomial_upper_support_is_read_through_broadcasting():
    from dpinfer.inference.latents import prior_support

    with pm.Model():
        a = pm.Binomial("a", 20, 0.3, shape=3)
        b = pm.Binomial("b", np.array([10, 20]), 0.3)
        c = pm.Binomial("c", pm.Data("n", np.array([5, 7])), 0.3)
        d = pm.Poisson("d", 2.0)
    assert [prior_support(v.owner) for v in (a, b, c, d)] == [(0, 20), (0, 20), (0, None), (0, None)]


@pytest.mark.parametrize("make", [
    lambda: pm.Poisson.dist(2.0), lambda: pm.NegativeBinomial.dist(mu=2.0, alpha=1.5),
    lambda: pm.Binomial.dist(6, 0.3), lambda: pm.BetaBinomial.dist(alpha=1.0, beta=2.0, n=6),
    lambda: pm.Geometric.dist(0.4), lambda: pm.HyperGeometric.dist(N=10, k=4, n=3),
    lambda: pm.Bernoulli.dist(0.3)], ids=lambda f: f().owner.op.name)
def test_prior_support_matches_where_the_log_pmf_is_finite(make):
    """The support read from the distribution agrees with PyMC's own log pmf: finite at the
    lower end (and the upper end where one is read), -inf one step outside. (The negative
    binomial's op is named "negative_binomial" in PyMC 6: an unknown name gave no lower end,
    and a nested release's start could then hold negative counts.)"""
    from dpinfer.inference.latents import prior_support

    rv = make()
    lower, upper = prior_support(rv.owner)
    assert lower is not None
    logp = lambda v: float(pm.logp(rv, v).eval())  # noqa: E731
    assert np.isfinite(logp(lower)) and logp(lower - 1) == -np.inf
    if upper is not None:
        assert np.isfinite(logp(upper)) and logp(upper + 1) == -np.inf


def test_two_releases_of_the_same_counts():
    """x ~ Poisson(lam), lam ~ Gamma(a, b), released twice (epsilon 0.3 and 1.0). The second
    release is one more discrete child, so the windowed Gibbs step handles both; exact:
    p(x | s1, s2) ∝ NB(x) f1(s1 - x) f2(s2 - x)."""
    a, b = 3.0, 0.1
    m1, m2 = DoubleGeometric(epsilon=0.3), DoubleGeometric(epsilon=1.0)
    with pm.Model() as model:
        lam = pm.Gamma("lam", a, b)
        x = pm.Poisson("x", lam)
        m1.observe("first", x, observed=31)
        m2.observe("second", x, observed=24)
    idata = sample(1500, tune=500, chains=2, random_seed=9, progressbar=False, model=model)
    support = np.arange(0, 300)
    log_w = (
        stats.nbinom.logpmf(support, a, b / (b + 1))
        + m1.log_likelihood(np.full(300, 31), support)
        + m2.log_likelihood(np.full(300, 24), support)
    )
    p = np.exp(log_w - special.logsumexp(log_w))
    mean, sd = np.sum(p * support), np.sqrt(np.sum(p * support**2) - np.sum(p * support) ** 2)
    draws = idata.posterior["x"].values
    ess = float(az.ess(idata, var_names=["x"])["x"])
    assert abs(draws.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(draws.std() - sd) < 4 * sd / np.sqrt(2 * ess)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["method"].startswith("windowed exact Gibbs")
    assert report["max_relative_error_bound"] <= report["tol"]


def test_refit_with_new_data_uses_the_new_values_on_both_paths():
    """pm.set_data on the original model reaches the kept (compiled) model: the release and a
    child's data both change between fits; each fit matches its own enumerated posterior."""
    a, b, q, eps = 4.0, 0.2, 0.5, 0.4
    mech = DoubleGeometric(epsilon=eps)
    with pm.Model() as model:
        s_data = pm.Data("s_data", 23)
        y_data = pm.Data("y_data", 9)
        lam = pm.Gamma("lam", a, b)
        x = pm.Poisson("x", lam)
        pm.Binomial("y", n=x, p=q, observed=y_data)
        mech.observe("release", x, observed=s_data)
    for seed, (s_obs, y_obs) in enumerate([(23, 9), (60, 35)]):
        pm.set_data({"s_data": s_obs, "y_data": y_obs}, model=model)
        idata = sample(1000, tune=500, chains=2, random_seed=seed, progressbar=False, model=model)
        _, _, mean, sd = exact_poisson_child_posterior(a, b, q, y_obs, s_obs, mech)
        draws = idata.posterior["x"].values
        ess = float(az.ess(idata, var_names=["x"])["x"])
        assert abs(draws.mean() - mean) < 4 * sd / np.sqrt(ess), (s_obs, draws.mean(), mean)



def test_compiled_model_is_kept_when_only_the_release_changes():
    """The compiled engine hands the model's data to its functions at every fit: a new release
    (not used by them) or a new value of data the model's own terms use (here the binomial's
    n) keeps the compiled model and gives the draws of a fresh model fitted to those data."""
    from dpinfer.inference.engines.compiled.engine import _COMPILED

    def model_with(release, n):
        with pm.Model() as model:
            theta = pm.Beta("theta", A, B)
            x = pm.Binomial("x", pm.Data("n", n), theta)
            DoubleGeometric(epsilon=EPS).observe("release", x, observed=pm.Data("s", release))
        return model

    def fit(model):
        return sample(100, tune=100, chains=1, random_seed=4, progressbar=False, model=model)

    model = model_with(RELEASE, N)
    fit(model)
    compiled = getattr(model, _COMPILED)[1]
    pm.set_data({"s": 580}, model=model)
    refit = fit(model)
    assert getattr(model, _COMPILED)[1] is compiled
    fresh = fit(model_with(580, N))
    for name in ("theta", "x"):
        np.testing.assert_array_equal(refit.posterior[name].values, fresh.posterior[name].values)
    pm.set_data({"n": 900}, model=model)
    refit = fit(model)
    assert getattr(model, _COMPILED)[1] is compiled
    fresh = fit(model_with(580, 900))
    for name in ("theta", "x"):
        np.testing.assert_array_equal(refit.posterior[name].values, fresh.posterior[name].values)


def test_gibbs_path_starts_where_the_default_start_is_impossible():
    """The prior's default start x = 20 is impossible with y = 30 ~ Binomial(x, 0.6); the
    Gibbs step supplies a valid start and the posterior matches enumeration."""
    a, b, q = 4.0, 0.2, 0.6
    mech = DoubleGeometric(epsilon=0.5)
    with pm.Model() as model:
        lam = pm.Gamma("lam", a, b)
        x = pm.Poisson("x", lam, shape=2)
        pm.Binomial("y", n=x, p=q, observed=[30, 2])
        mech.observe("release", x, observed=[48, 4])
    idata = sample(1000, tune=500, chains=2, random_seed=4, progressbar=False, model=model)
    draws = idata.posterior["x"].values
    assert (draws[..., 0] >= 30).all()
    # Exact: (x1, x2) are negative multinomial a priori (lam integrated out):
    # p(x1, x2) ∝ Gamma(a + x1 + x2) / (x1! x2!) (b + 2)^-(x1 + x2).
    x1, x2 = np.meshgrid(np.arange(200), np.arange(60), indexing="ij")
    log_w = (
        special.gammaln(a + x1 + x2) - special.gammaln(x1 + 1) - special.gammaln(x2 + 1)
        - (x1 + x2) * np.log(b + 2)
        + stats.binom.logpmf(30, x1, q) + stats.binom.logpmf(2, x2, q)
        + mech.log_likelihood(np.full(x1.shape, 48), x1) + mech.log_likelihood(np.full(x2.shape, 4), x2)
    )
    p = np.exp(log_w - special.logsumexp(log_w))
    mean = np.sum(p * x1)
    sd = np.sqrt(np.sum(p * x1**2) - mean**2)
    ess = float(az.ess(draws[..., 0]))
    assert abs(draws[..., 0].mean() - mean) < 4 * sd / np.sqrt(ess)


def test_grandchildren_do_not_block_the_count_methods():
    """y ~ Binomial(x, .) is a child of x, so x takes the Gibbs path; the continuous z depends
    on x only through y (a grandchild) and does not count against the window bound."""
    mech = DoubleGeometric(epsilon=1.0)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 0.1)
        x = pm.Poisson("x", lam)
        y = pm.Binomial("y", n=x, p=0.5)
        pm.Normal("z", mu=y, sigma=1.0, observed=3.2)
        mech.observe("release", x, observed=7)
    idata = sample(100, tune=100, chains=1, random_seed=1, progressbar=False, model=model)
    assert json.loads(idata.posterior.attrs["dpinfer"])["x"]["method"].startswith("windowed exact Gibbs")
    assert (idata.posterior["x"].values >= idata.posterior["y"].values).all()


def test_compiled_engine_takes_initvals_in_the_constrained_space():
    """initvals name the variables as pm.sample does (sigma, not sigma_log__) and are not
    jittered; the others keep PyMC's jittered start; a start for the counts is not used."""
    from dpinfer.inference.engines.compiled.engine import compiled_model_for

    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1.0)
        mu = pm.Normal("mu", 0.0, 1.0)
        x = pm.Poisson("x", 50.0 * sigma * pm.math.exp(mu), shape=3)
        DoubleGeometric(epsilon=1.0).observe("release", x, observed=[48, 52, 50])
    compiled = compiled_model_for(model, [model["x"]], [model["release"]])
    q = {n: compiled.initial_q(7, model, {"sigma": 2.5, "x": [1, 2, 3]})[s]
         for n, s in zip(compiled.names, compiled.slices)}
    assert q["sigma_log__"] == pytest.approx([np.log(2.5)], abs=1e-12)
    assert 0 < abs(q["mu"][0]) <= 1.0  # jittered around 0


def test_compiled_engine_takes_one_initvals_dict_per_chain(monkeypatch):
    """A list of initvals dicts gives each chain its own start, as pm.sample takes them (the
    starts handed to the chains are captured); a list of another length, or of something
    else than dicts, is refused naming initvals."""
    from dpinfer.inference.engines.compiled import engine

    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1.0)
        mu = pm.Normal("mu", 0.0, 1.0)
        x = pm.Poisson("x", 50.0 * sigma * pm.math.exp(mu), shape=3)
        DoubleGeometric(epsilon=1.0).observe("release", x, observed=[48, 52, 50])
    captured = []

    class Captured(Exception):
        pass

    def run_chains(compiled, blocks, *, starts, **_):
        captured.append({name: [q[s] for q, _ in starts] for name, s in zip(compiled.names, compiled.slices)})
        raise Captured

    monkeypatch.setattr(engine, "run_chains", run_chains)
    with pytest.raises(Captured):
        sample(10, tune=10, chains=2, random_seed=1, progressbar=False, model=model,
               initvals=[{"sigma": 2.0, "mu": -0.5}, {"sigma": 0.5, "mu": 0.25}])
    np.testing.assert_allclose(np.concatenate(captured[0]["sigma_log__"]), np.log([2.0, 0.5]), atol=1e-12)
    np.testing.assert_allclose(np.concatenate(captured[0]["mu"]), [-0.5, 0.25], atol=1e-12)
    for bad, what in (([{"mu": 0.0}], "a list of 1"), ([{"mu": 0.0}, 3.0], "a list of 2"), ("mu", "got str")):
        with pytest.raises(ValueError, match=f"initvals must be one dict for every chain or a list of 2 dicts.*{what}"):
            sample(10, tune=10, chains=2, random_seed=1, progressbar=False, model=model, initvals=bad)


def test_compiled_log_density_is_minus_inf_where_a_parameter_check_fails(capfd):
    """At a point where a parameter leaves its domain (sigma = exp(-800) underflows to 0), the
    compiled log density is -inf (NUTS treats it as a divergence), not an exception printed
    by numba with an undefined value returned; the same for the prior table of the counts."""
    from dpinfer.inference.engines.compiled.engine import compiled_model_for
    from dpinfer.inference.engines.compiled.exact_counts import _prior_at
    from dpinfer.inference.engines.compiled.nuts import log_density_at

    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, sigma)
        x = pm.Poisson("x", 10.0 * sigma * pm.math.exp(z), shape=2)
        DoubleGeometric(epsilon=1.0).observe("release", x, observed=[9, 11])
    compiled = compiled_model_for(model, [model["x"]], [model["release"]])
    q = np.zeros(compiled.n)
    q[compiled.slices[compiled.names.index("sigma_log__")]] = -800.0
    counts = np.array([9, 11], dtype=np.int64)
    env = compiled.environment(counts)
    grad = np.empty(compiled.n)
    assert log_density_at(compiled.logp_grad_address, q, grad, env) == -np.inf
    point = compiled.prior_tables["x"].point_address
    assert _prior_at(point, q, env, 0, 9) == -np.inf
    q[:] = 0.0
    assert np.isfinite(log_density_at(compiled.logp_grad_address, q, grad, env))
    assert "ParameterValueError" not in capfd.readouterr().err


def test_the_flat_prior_table_gives_each_candidate_its_own_cells_law():
    """The flat prior table (nested sums: each count's box its own width) against scipy: a
    (2, 3) negative binomial latent whose cells all differ, candidates of ragged boxes in an
    order that mixes the cells; equal to the padded table where they overlap, to 1e-12."""
    from scipy import stats

    from dpinfer.inference.engines.compiled.engine import compiled_model_for
    from dpinfer.inference.engines.compiled.exact_counts import flat_prior_table, log_weight_tables

    mu = np.array([[2.0, 7.5, 30.0], [0.4, 12.0, 3.0]])
    with pm.Model() as model:
        alpha = pm.HalfNormal("alpha", 5.0)
        x = pm.NegativeBinomial("x", mu=mu * pm.Gamma("scale", 2.0, 2.0), alpha=alpha, shape=(2, 3))
        DoubleGeometric(epsilon=1.0).observe("release", x, observed=np.round(mu))
    compiled = compiled_model_for(model, [model["x"]], [model["release"]])
    table = compiled.prior_tables["x"]
    lo = np.array([0, 3, 20, 0, 5, 1])
    width = np.array([4, 11, 25, 2, 17, 9])  # ragged boxes of the 6 cells
    rows = np.repeat(np.arange(6), width)
    grid = lo[rows] + np.arange(rows.size) - np.repeat(np.cumsum(width) - width, width)
    order = np.random.default_rng(0).permutation(rows.size)  # any order of the entries
    rows, grid = rows[order].astype(np.int64), grid[order].astype(np.int64)
    buffers, hoisted = table.prepare_flat(grid, rows)  # buffers: kept alive while used
    padded = (lo[:, None] + np.arange(width.max())[None, :]).astype(np.int64)
    padded_buffers, padded_hoisted = table.prepare(padded)
    counts = np.zeros(6, dtype=np.int64)
    env = compiled.environment(counts)
    for a, scale in ((0.7, 1.0), (12.0, 0.4)):
        q = np.zeros(compiled.n)
        q[compiled.slices[compiled.names.index("alpha_log__")]] = np.log(a)
        q[compiled.slices[compiled.names.index("scale_log__")]] = np.log(scale)
        out = np.empty(grid.size)
        flat_prior_table(table.flat_address, hoisted, q, env, grid, rows, out)
        m = (mu * scale).reshape(-1)[rows]
        np.testing.assert_allclose(out, stats.nbinom.logpmf(grid, a, a / (a + m)), rtol=1e-12, atol=1e-12)
        full = np.empty(padded.shape)
        log_weight_tables(table.full_address, padded_hoisted, q, env, padded, np.zeros(padded.shape), full)
        np.testing.assert_allclose(out, full[rows, grid - lo[rows]], rtol=1e-12, atol=0)


def _assert_matches_exact(idata, name, mean, sd):
    """The draws of ``name`` have the exact mean and sd within 4 Monte Carlo standard errors
    (of the mean sd/sqrt(ess); of the sd about sd/sqrt(2 ess))."""
    draws = idata.posterior[name].values.ravel()
    ess = float(az.ess(idata, var_names=[name])[name])
    assert abs(draws.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(draws.std() - sd) < 4 * sd / np.sqrt(2 * ess)


def test_one_nuts_transition_per_sweep_is_exact_too():
    """nuts_per_sweep=1 (one NUTS move of theta per draw of x) leaves the same posterior;
    a count of moves that is not a whole number >= 1 is refused by name."""
    model = beta_binomial_model()
    idata = sample(2000, tune=1000, chains=2, random_seed=5, progressbar=False, model=model,
                   nuts_per_sweep=1)
    assert idata.sample_stats.attrs["nuts_per_sweep"] == 1
    mean, sd, _, _ = exact_beta_binomial_posterior()
    _assert_matches_exact(idata, "theta", mean, sd)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="nuts_per_sweep must be a whole number >= 1"):
            sample(10, tune=10, chains=1, progressbar=False, model=model, nuts_per_sweep=bad)


def test_three_count_draws_per_sweep_are_exact_too():
    """counts_per_sweep=3 with nuts_per_sweep=3 (counts and theta alternate three times per
    stored draw) leaves the same posterior, and the counts' draws match the enumerated law;
    more count draws than NUTS transitions are refused by name."""
    model = beta_binomial_model()
    idata = sample(2000, tune=1000, chains=2, random_seed=6, progressbar=False, model=model,
                   nuts_per_sweep=3, counts_per_sweep=3)
    assert idata.sample_stats.attrs["counts_per_sweep"] == 3
    mean, sd, support, p = exact_beta_binomial_posterior()
    _assert_matches_exact(idata, "theta", mean, sd)
    x_mean = np.sum(p * support)
    _assert_matches_exact(idata, "x", x_mean, np.sqrt(np.sum(p * support**2) - x_mean**2))
    with pytest.raises(ValueError, match=r"counts_per_sweep must be at most nuts_per_sweep \(2\)"):
        sample(10, tune=10, chains=1, progressbar=False, model=model, nuts_per_sweep=2,
               counts_per_sweep=3)
    with pytest.raises(ValueError, match="counts_per_sweep must be a whole number >= 1"):
        sample(10, tune=10, chains=1, progressbar=False, model=model, counts_per_sweep=0)


def test_a_release_far_from_the_prior_widens_the_windows_instead_of_holding_the_cell():
    """lam ~ Gamma(50, 5), x_i ~ Poisson(lam), releases (10, 100) with double geometric noise
    (eps 0.5): x_2's posterior sits near 18, far outside the first window around 100, where the
    compiled engine's hold rule would keep x_2 at its start in every draw. dp.sample sees the
    held cells, widens and refits; the posterior of x_2 matches quadrature over lam x
    enumeration over the counts."""
    st = stats
    mech = DoubleGeometric(epsilon=0.5)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 50.0, 5.0)
        x = pm.Poisson("x", lam, shape=2)
        mech.observe("release", x, observed=[10, 100])
    idata = sample(2000, random_seed=1, progressbar=False, model=model)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["widenings"] >= 1 and report["draws_with_held_cells"] == 0

    lam_grid = np.linspace(0.5, 40.0, 4000)
    counts = np.arange(0, 400)

    def like(s):  # p(s | lam) and E[x p(s | x) | lam], per lam
        w = np.exp(st.poisson.logpmf(counts[None, :], lam_grid[:, None])
                   + mech.log_likelihood(np.full(counts.size, s), counts)[None, :])
        return w.sum(axis=1), (w * counts[None, :]).sum(axis=1)
    l1, _ = like(10)
    l2, m2 = like(100)
    post = st.gamma.pdf(lam_grid, 50.0, scale=0.2) * l1 * l2
    post /= post.sum()
    x2_mean = float((post * m2 / l2).sum())
    draws = idata.posterior["x"].values[..., 1]
    ess = float(az.ess(idata, var_names=["x"])["x"].values[1])
    assert abs(draws.mean() - x2_mean) < 4.5 * draws.std() / np.sqrt(ess)


@pytest.mark.parametrize("mech", [DoubleGeometric(epsilon=0.5), Laplace(0.7), DiscreteGaussian(sigma=2.0)])
def test_off_centre_tail_bound_covers_every_count_outside_the_window(mech):
    """A second release of a cell, its window centred on another release: the bound must hold
    for every supported x outside c - k .. c + k (brute force over 0..200), and never exceed
    the likelihood's sup over every x, real for continuous noise (its value where the window is
    far off)."""
    release = np.array([10.0, 10.0, 3.0, 30.0, 0.4]) if not mech.discrete else np.array([10, 10, 3, 30, 0])
    centres = np.array([10, 14, 10, 10, 0])
    x = np.arange(0, 201)
    for k in (0, 2, 5, 12):
        bound = log_eta_off_centre(mech, release, centres, k, support=(0, None))
        for s, c, b in zip(release, centres, bound):
            outside = x[np.abs(x - c) > k]
            true_sup = np.max(mech.log_likelihood(np.full(outside.shape, s), outside))
            assert true_sup <= b + 1e-12, (k, s, c)
            peak = max(np.max(mech.log_likelihood(np.full(x.shape, s), x)), mech.log_likelihood(s, s))
            assert b <= peak + 1e-12
