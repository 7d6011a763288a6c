"""Continuous latents released by continuous mechanisms (issue 13, part 1) and the type rules.

Oracles: closed-form Gaussian posteriors (dapper's README example, B1) and, for a model that
mixes a latent count and a continuous latent, the exact posterior mean of the shared
parameter by quadrature over theta and enumeration over the count.
"""

import json

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import dpinfer as dp
from dpinfer.mechanisms.geometric import DoubleGeometric

# B1 (dapper's README): y_i ~ N(theta, 1), n = 100, theta ~ N(0, 2^2); the mean is released
# with Gaussian noise of sd 1/3. s | theta ~ N(theta, 1/100 + 1/9), so
# theta | s ~ N(s v / (1/100 + 1/9), v), v = 1 / (1/4 + 1 / (1/100 + 1/9)) = 0.117552.
B1_RELEASE = -2.097902
B1_VAR = 1.0 / (0.25 + 1.0 / (0.01 + 1.0 / 9.0))
B1_MEAN = B1_RELEASE * B1_VAR / (0.01 + 1.0 / 9.0)
# ybar ~ N(0, 4 + 1/100) a priori, so ybar | s ~ N(s w 9, w), w = 1 / (1 / 4.01 + 9)
YBAR_VAR = 1.0 / (1.0 / 4.01 + 9.0)
YBAR_MEAN = B1_RELEASE * 9.0 * YBAR_VAR


def b1_model():
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 2.0)
        ybar = pm.Normal("ybar", theta, 0.1)  # the mean of n = 100 records y ~ N(theta, 1)
        dp.Gaussian.from_sigma(1.0 / 3.0).observe("s", ybar, observed=B1_RELEASE)
    return model


def test_published_b1_posterior_constants():
    assert B1_MEAN / B1_RELEASE == pytest.approx(0.970612, abs=1e-6)
    assert B1_VAR == pytest.approx(0.117552, abs=1e-6)


def within_mc_error(draws, mean, var, ess):
    """|sample mean - mean| and |sample var - var| within 4.5 Monte Carlo standard errors
    (for a Gaussian posterior the variance estimate's sd is var sqrt(2 / ESS))."""
    se_mean = np.sqrt(var / ess)
    se_var = var * np.sqrt(2.0 / ess)
    assert abs(draws.mean() - mean) < 4.5 * se_mean
    assert abs(draws.var() - var) < 4.5 * se_var


@pytest.mark.parametrize("method, engine", [("auto", "compiled"), ("nutpie", "nutpie")])
def test_b1_continuous_latent_matches_the_closed_form_posterior(method, engine):
    model = b1_model()
    idata = dp.sample(3000, tune=1000, chains=2, random_seed=11, progressbar=False, model=model,
                      method=method)
    ess = az.ess(idata, var_names=["theta", "ybar"])
    within_mc_error(idata.posterior["theta"].values, B1_MEAN, B1_VAR, float(ess["theta"]))
    within_mc_error(idata.posterior["ybar"].values, YBAR_MEAN, YBAR_VAR, float(ess["ybar"]))
    report = json.loads(idata.posterior.attrs["dpinfer"])
    assert report["s"]["engine"] == engine
    assert "summed out in closed form" in report["s"]["method"]
    assert idata.posterior["ybar"].dtype.kind == "f"  # never rounded to counts


def test_a_count_and_a_continuous_latent_in_one_model_match_quadrature():
    """theta ~ N(1, 1); x ~ Poisson(e^theta) released with double geometric noise (eps 0.5);
    ybar ~ N(theta, 0.5) released with Laplace noise (scale 1). Exact posterior of theta on a
    grid: prior x sum_x Poisson(x) DG(s1 - x) x int N(ybar; theta, 0.5) Laplace(s2 - ybar)."""
    s1, s2 = 7, 2.3
    counts_mech, mean_mech = DoubleGeometric(0.5), dp.Laplace(1.0)
    with pm.Model() as model:
        theta = pm.Normal("theta", 1.0, 1.0)
        x = pm.Poisson("x", pm.math.exp(theta))
        counts_mech.observe("s1", x, observed=s1)
        ybar = pm.Normal("ybar", theta, 0.5)
        mean_mech.observe("s2", ybar, observed=s2)
    idata = dp.sample(3000, tune=1000, chains=2, random_seed=5, progressbar=False, model=model)
    report = json.loads(idata.posterior.attrs["dpinfer"])
    assert report["x"]["engine"] == "compiled" and report["s2"]["engine"] == "compiled"

    theta_grid = np.linspace(-4.0, 5.0, 1801)
    xs = np.arange(0, 400)
    like_x = np.exp(stats.poisson.logpmf(xs[None, :], np.exp(theta_grid)[:, None])
                    + counts_mech.log_likelihood(np.full(xs.size, s1), xs)[None, :]).sum(axis=1)
    y_grid = np.linspace(-8.0, 12.0, 4001)
    like_y = (stats.norm.pdf(y_grid[None, :], theta_grid[:, None], 0.5)
              * np.exp(mean_mech.log_likelihood(np.full(y_grid.size, s2), y_grid))[None, :]).sum(axis=1)
    post = stats.norm.pdf(theta_grid, 1.0, 1.0) * like_x * like_y
    post /= post.sum()
    mean = float((theta_grid * post).sum())
    var = float(((theta_grid - mean) ** 2 * post).sum())
    draws = idata.posterior["theta"].values
    ess = float(az.ess(idata, var_names=["theta"])["theta"])
    assert abs(draws.mean() - mean) < 4.5 * np.sqrt(var / ess)
    x_mean = float((xs[None, :] * np.exp(stats.poisson.logpmf(xs[None, :], np.exp(theta_grid)[:, None])
                    + counts_mech.log_likelihood(np.full(xs.size, s1), xs)[None, :])
                    / like_x[:, None] * post[:, None]).sum())
    x_ess = float(az.ess(idata, var_names=["x"])["x"])
    x_draws = idata.posterior["x"].values
    assert abs(x_draws.mean() - x_mean) < 4.5 * x_draws.std() / np.sqrt(x_ess)


def _discrete_mechanisms():
    return {
        "double geometric": lambda n: DoubleGeometric(1.0),
        "conditioned on the total": lambda n: dp.Conditioned(DoubleGeometric(1.0), dp.Invariants.total(n)),
        "discrete gaussian": lambda n: dp.DiscreteGaussian(1.0),
        "generalized laplace l1": lambda n: dp.GeneralizedLaplace(1.0, dp.Invariants.total(n), "l1"),
        "generalized laplace l2": lambda n: dp.GeneralizedLaplace(1.0, dp.Invariants.total(n), "l2"),
    }


@pytest.mark.parametrize("kind", sorted(_discrete_mechanisms()))
def test_a_discrete_mechanism_on_a_continuous_latent_is_refused(kind):
    mech = _discrete_mechanisms()[kind](3)
    with pm.Model():
        ybar = pm.Normal("ybar", 0.0, 1.0, shape=3)
        with pytest.raises(ValueError, match=r"release 's'.*discrete mechanism.*continuous latent \['ybar'\]"):
            mech.observe("s", ybar, observed=np.array([1, 2, 3]))


def test_a_discrete_mechanism_on_a_query_of_a_continuous_latent_is_refused():
    with pm.Model():
        ybar = pm.Normal("ybar", 0.0, 1.0, shape=3)
        with pytest.raises(ValueError, match="continuous latent"):
            DoubleGeometric(1.0).observe("s", ybar.sum(), observed=4)


def test_counts_whose_rate_is_a_continuous_parameter_are_not_refused():
    with pm.Model():
        rate = pm.HalfNormal("rate", 5.0)
        x = pm.Poisson("x", rate, shape=2)
        DoubleGeometric(1.0).observe("s", x, observed=np.array([3, 4]))
        DoubleGeometric(1.0).observe("t", x.sum(), observed=8)


@pytest.mark.parametrize("make, outside", [
    (lambda: dp.ClampedGeometric(0.5, 0, 10), [11, 3]),
    (lambda: dp.TruncatedLaplace(1.0, 0.0, 1.0), [1.2, 0.5]),
    (lambda: dp.BITLaplace(1.0, 0.0, 1.0), [-0.2, 0.5]),
    (lambda: dp.MultiLevelGeometric([1.0, 0.5], lower=0, upper=4), [[5, 3], [1, 2]]),
])
def test_a_release_outside_a_bounded_mechanisms_bounds_is_an_error(make, outside):
    mech = make()
    true_values = np.array([3, 2])
    with pytest.raises(ValueError, match="release"):
        mech.log_likelihood(outside, true_values)
    with pm.Model():
        x = pm.Poisson("x", 2.0, shape=2)
        with pytest.raises(ValueError, match="release"):
            mech.observe("s", x, observed=np.asarray(outside))


def test_the_pymc_engine_takes_continuous_latents_and_says_why_it_ran():
    idata = dp.sample(300, tune=300, chains=2, random_seed=2, progressbar=False, model=b1_model(),
                      method="marginal")
    entry = json.loads(idata.posterior.attrs["dpinfer"])["s"]
    assert entry["engine"] == "pymc" and "method='marginal'" in entry["engine_reason"]
    assert "continuous latent" in entry["method"]
    assert abs(idata.posterior["theta"].values.mean() - B1_MEAN) < 0.15  # > 5 MC standard errors (sd 0.34, ESS >= 150)


def test_a_normal_latent_with_laplace_noise_is_summed_out_and_drawn_exactly():
    """Three means sharing theta, each released with Laplace noise (scale 0.5): theta's and
    each mean's posterior moments against quadrature (theta on a grid, each release's
    likelihood by quadrature over its mean)."""
    releases = np.array([1.4, 2.9, -0.6])
    scale, latent_sd = 0.5, 0.4
    with pm.Model(coords={"group": ["a", "b", "c"]}) as model:
        theta = pm.Normal("theta", 0.0, 2.0)
        ybar = pm.Normal("ybar", theta, latent_sd, dims="group")
        dp.Laplace(1.0 / scale).observe("s", ybar, observed=releases)
    idata = dp.sample(3000, tune=1000, chains=2, random_seed=21, progressbar=False, model=model)
    report = json.loads(idata.posterior.attrs["dpinfer"])
    assert report["s"]["engine"] == "compiled" and "Laplace noise" in report["s"]["method"]
    assert idata.posterior["ybar"].dims == ("chain", "draw", "group")
    assert list(idata.posterior["group"].values) == ["a", "b", "c"]

    # exact: p(theta | s) on a grid, each release's likelihood by quadrature over its mean
    theta_grid = np.linspace(-10.0, 10.0, 2001)
    y_grid = np.linspace(-15.0, 15.0, 6001)
    dens = stats.norm.pdf(y_grid[None, :], theta_grid[:, None], latent_sd)
    like = [(dens * stats.laplace.pdf(s - y_grid, scale=scale)[None, :]).sum(axis=1) for s in releases]
    post = stats.norm.pdf(theta_grid, 0.0, 2.0) * np.prod(like, axis=0)
    post /= post.sum()
    theta_mean = float((theta_grid * post).sum())
    theta_var = float(((theta_grid - theta_mean) ** 2 * post).sum())
    ess = az.ess(idata, var_names=["theta", "ybar"])
    within_mc_error(idata.posterior["theta"].values, theta_mean, theta_var, float(ess["theta"]))
    for i, s in enumerate(releases):
        cond = dens * stats.laplace.pdf(s - y_grid, scale=scale)[None, :]
        cond /= cond.sum(axis=1, keepdims=True)
        y_mean = float((post[:, None] * cond * y_grid[None, :]).sum())
        y_var = float((post[:, None] * cond * (y_grid[None, :] - y_mean) ** 2).sum())
        draws = idata.posterior["ybar"].values[..., i]
        within_mc_error(draws, y_mean, y_var, float(ess["ybar"].values[i]))


def test_a_normal_latent_with_other_children_stays_with_nuts():
    """A Deterministic of the latent keeps it in the model (NUTS samples it); the posterior
    is unchanged: theta against the closed form of B1."""
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 2.0)
        ybar = pm.Normal("ybar", theta, 0.1)
        pm.Deterministic("total", 100 * ybar)
        dp.Gaussian.from_sigma(1.0 / 3.0).observe("s", ybar, observed=B1_RELEASE)
    idata = dp.sample(3000, tune=1000, chains=2, random_seed=2, progressbar=False, model=model)
    report = json.loads(idata.posterior.attrs["dpinfer"])
    assert "nothing to marginalise" in report["s"]["method"]
    ess = float(az.ess(idata, var_names=["theta"])["theta"])
    within_mc_error(idata.posterior["theta"].values, B1_MEAN, B1_VAR, ess)
    np.testing.assert_allclose(idata.posterior["total"].values, 100 * idata.posterior["ybar"].values)


@pytest.mark.parametrize("method, kept_as", [("auto", "_dpinfer_compiled_model"),
                                             ("nutpie", "_dpinfer_nutpie_model")])
def test_new_releases_reuse_the_compiled_model_and_log_likelihoods_are_marginal(method, kept_as):
    """pm.set_data of a new release refits without compiling again (the kept compiled or
    nutpie model is the same object) and gives that release's posterior; the log-likelihood
    group holds the release's marginal log density given theta, N(s; theta, sqrt(1/100 + 1/9))."""
    with pm.Model() as model:
        release = pm.Data("release", B1_RELEASE)
        theta = pm.Normal("theta", 0.0, 2.0)
        ybar = pm.Normal("ybar", theta, 0.1)
        dp.Gaussian.from_sigma(1.0 / 3.0).observe("s", ybar, observed=release)
    first = dp.sample(1000, tune=500, chains=2, random_seed=4, progressbar=False, model=model,
                      log_likelihood=True, method=method)
    kept = getattr(model._dpinfer_closed_form_model[1], kept_as)[1]
    pm.set_data({"release": 1.5}, model=model)
    second = dp.sample(3000, tune=1000, chains=2, random_seed=5, progressbar=False, model=model,
                       method=method)
    assert getattr(model._dpinfer_closed_form_model[1], kept_as)[1] is kept
    ess = float(az.ess(second, var_names=["theta"])["theta"])
    within_mc_error(second.posterior["theta"].values, 1.5 * B1_MEAN / B1_RELEASE, B1_VAR, ess)
    log_lik = first.log_likelihood["s"].values
    expected = stats.norm.logpdf(B1_RELEASE, first.posterior["theta"].values, np.sqrt(0.01 + 1.0 / 9.0))
    np.testing.assert_allclose(log_lik, expected, rtol=1e-10)
