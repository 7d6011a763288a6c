"""Analyst tools on dp.sample results (dpinfer.utility.analysis, dpinfer.utility.imputation):
LOO and model comparison, posterior predictive checks of the releases, multiple imputation by
Rubin's rules, derived quantities and prior sensitivity.

The fitted model: 30 cells with exposures e_i and a standardised covariate c_i,
alpha ~ N(-1, 1), beta ~ N(0, 1), x_i ~ Poisson(e_i exp(alpha + beta c_i)), released by
DoubleGeometric(0.5); the competitor drops the covariate (one pooled rate). The release is
simulated from the covariate model's prior with a fixed seed (alpha = -1.00, beta = 0.30)."""

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
import xarray as xr
from scipy import special, stats

from dpinfer.inference import sample
from dpinfer.mechanisms.geometric import ClampedGeometric, DoubleGeometric
from dpinfer.utility.analysis import (
    exceeds,
    posterior_predictive_releases,
    ppc_pvalues,
    prior_sensitivity,
    rank_probabilities,
    ranked_first,
    ranks,
    ratio,
    shares,
    with_log_likelihood,
)
from dpinfer.utility.imputation import imputations, rubin, share_analysis, total_analysis

N_CELLS = 30
_design = np.random.default_rng(20261)
EXPOSURE = _design.uniform(5, 50, N_CELLS)
COVARIATE = _design.normal(size=N_CELLS)
COVARIATE = (COVARIATE - COVARIATE.mean()) / COVARIATE.std()
MECH = DoubleGeometric(epsilon=0.5)
CORRUPT = 5  # the cell multiplied by 10 in the misspecified release

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def covariate_model(release, covariate: bool = True) -> pm.Model:
    with pm.Model(coords={"cell": np.arange(N_CELLS)}) as model:
        alpha = pm.Normal("alpha", -1.0, 1.0)
        log_rate = alpha
        if covariate:
            beta = pm.Normal("beta", 0.0, 1.0)
            log_rate = alpha + beta * COVARIATE
        x = pm.Poisson("x", EXPOSURE * pm.math.exp(log_rate), dims="cell")
        MECH.observe("release", x, observed=release, dims="cell")
    return model


@pytest.fixture(scope="module")
def simulated():
    """(alpha, beta, true counts, release) drawn from the covariate model's prior."""
    rng = np.random.default_rng(7)
    alpha, beta = rng.normal(-1.0, 1.0), rng.normal(0.0, 1.0)
    x = rng.poisson(EXPOSURE * np.exp(alpha + beta * COVARIATE))
    return alpha, beta, x, MECH.release(x, rng)


def _fit(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sample(500, tune=500, chains=2, random_seed=1, progressbar=False, model=model, **kwargs)


@pytest.fixture(scope="module")
def covariate_fit(simulated):
    model = covariate_model(simulated[3])
    return model, _fit(model, log_likelihood=True)


@pytest.fixture(scope="module")
def pooled_fit(simulated):
    model = covariate_model(simulated[3], covariate=False)
    return model, _fit(model, log_likelihood=True)


@pytest.fixture(scope="module")
def corrupted_fit(simulated):
    """method="marginal": the compiled engine holds a cell whose release is far from every
    count its prior allows (its window, centred on the release, has no mass), so that cell
    would keep its starting value in every draw."""
    release = simulated[3].copy()
    release[CORRUPT] *= 10
    model = covariate_model(release)
    return model, _fit(model, method="marginal")


# --- 1. LOO ----------------------------------------------------------------------------------
def test_simulated_release_has_a_visible_covariate(simulated):
    alpha, beta, x, release = simulated
    assert beta == pytest.approx(0.2987, abs=1e-4) and alpha == pytest.approx(-0.9988, abs=1e-4)
    assert release[CORRUPT] >= 10


def test_loo_and_compare_work_and_rank_the_true_model_first(covariate_fit, pooled_fit):
    (_, with_covariate), (_, pooled) = covariate_fit, pooled_fit
    loo = az.loo(with_covariate, pointwise=True)
    assert loo.n_data_points == N_CELLS
    assert np.all(np.asarray(loo.pareto_k) < 0.7)  # one LOO observation per release cell, reliable
    table = az.compare({"covariate": with_covariate, "pooled": pooled}, round_to="none")
    assert list(table.index) == ["covariate", "pooled"]
    assert -table.loc["pooled", "elpd_diff"] > 2 * table.loc["pooled", "dse"]


def test_log_likelihood_is_each_cells_marginal_given_the_parameters(covariate_fit, simulated):
    """log p(s_i | alpha, beta) = log sum_x Poisson(x; e_i exp(alpha + beta c_i)) f(s_i - x)."""
    _, idata = covariate_fit
    release = simulated[3]
    alpha = float(idata.posterior["alpha"].values[1, 17])
    beta = float(idata.posterior["beta"].values[1, 17])
    x = np.arange(400)
    rate = EXPOSURE * np.exp(alpha + beta * COVARIATE)
    direct = [special.logsumexp(stats.poisson.logpmf(x, rate[i]) + MECH.log_likelihood(np.full(400, s), x))
              for i, s in enumerate(release)]
    np.testing.assert_allclose(idata.log_likelihood["release"].values[1, 17], direct, rtol=1e-9)


def test_with_log_likelihood_adds_the_group_dp_sample_stores(covariate_fit):
    model, idata = covariate_fit
    stripped = idata.copy()
    del stripped["log_likelihood"]
    assert "log_likelihood" not in stripped.children
    added = with_log_likelihood(stripped, model)
    np.testing.assert_allclose(added.log_likelihood["release"].values,
                               idata.log_likelihood["release"].values, rtol=1e-12)
    assert "log_likelihood" not in stripped.children  # the input is not modified
    assert az.loo(added).elpd == pytest.approx(az.loo(idata).elpd)


def test_with_log_likelihood_sums_normal_latents_out_as_the_fit_does():
    """y_i ~ N(mu, 1) released with Gaussian noise of sd 2: on a fit without counts (dp.sample sums y
    out in closed form) the log-likelihood is log N(s_i; mu, sqrt(5))."""
    import json

    from dpinfer.mechanisms.gaussian import Gaussian

    release = np.array([1.5, 4.0, -0.5, 3.2])
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        y = pm.Normal("y", mu, 1.0, shape=4)
        Gaussian.from_sigma(2.0).observe("release", y, observed=release)
    idata = _fit(model)
    report = json.loads(idata.posterior.attrs["dpinfer"])
    assert all(entry["engine"] == "compiled" for entry in report.values())
    added = with_log_likelihood(idata, model)
    mu_draws = idata.posterior["mu"].values[..., None]
    np.testing.assert_allclose(added.log_likelihood["release"].values,
                               stats.norm.logpdf(release, mu_draws, np.sqrt(5.0)), rtol=1e-6)


# --- 2. posterior predictive checks -------------------------------------------------------------
def test_replicated_releases_are_the_posterior_counts_plus_the_mechanisms_noise(covariate_fit, simulated):
    model, idata = covariate_fit
    checked = posterior_predictive_releases(idata, model, rng=3)
    rep = checked.posterior_predictive["release"]
    assert rep.dims == ("chain", "draw", "cell") and rep.shape == (2, 500, N_CELLS)
    assert rep.dtype.kind == "i"
    np.testing.assert_array_equal(checked.observed_data["release"].values, simulated[3])
    noise = (rep - idata.posterior["x"]).values.ravel()
    se = MECH.noise_variance * np.sqrt(2 / noise.size) * 2  # kurtosis of the double geometric ~ 6
    assert abs(noise.mean()) < 4 * np.sqrt(MECH.noise_variance / noise.size)
    assert abs(noise.var() - MECH.noise_variance) < 4 * se
    assert "posterior_predictive" not in idata.children  # the input is not modified


def test_ppc_pvalues_are_not_extreme_when_the_model_is_right(covariate_fit):
    """Release simulated from the model's prior: at most 20% of the cells' two-sided p-values
    below 0.1 (Meng 1994: P(p <= a) <= 2a for posterior predictive p-values) and none below
    0.01 (seeded: 0 and 7% below 0.1, smallest 0.36 and 0.03 for the two replications)."""
    model, idata = covariate_fit
    for replicate in ("release", "counts"):
        p = ppc_pvalues(posterior_predictive_releases(idata, model, rng=5, replicate=replicate),
                        two_sided=True)["release"]
        assert p.dims == ("cell",)
        assert float(p.min()) > 0.01, replicate
        assert float((p < 0.1).mean()) <= 0.2, replicate


def test_ppc_flags_a_release_cell_multiplied_by_ten(corrupted_fit):
    model, idata = corrupted_fit
    for replicate in ("release", "counts"):
        p = ppc_pvalues(posterior_predictive_releases(idata, model, rng=5, replicate=replicate))["release"]
        assert float(p.isel(cell=CORRUPT)) < 0.005, replicate  # released far above every replicate
        others = np.delete(p.values, CORRUPT)
        assert np.median(others) > 0.1


def test_replicated_releases_of_a_query_and_of_a_clamped_mechanism():
    """No fit needed: a synthetic posterior. The release of x.sum() re-releases the sum of
    each draw's counts; the clamped mechanism (not additive) is called draw by draw."""
    clamped, total = ClampedGeometric(epsilon=1.0, lower=0), DoubleGeometric(epsilon=1.0)
    with pm.Model() as model:
        x = pm.Poisson("x", 5.0, shape=3)
        clamped.observe("cells", x, observed=[0, 4, 7])
        total.observe("total", x.sum(), observed=12)
    rng = np.random.default_rng(0)
    draws = rng.poisson(5.0, size=(2, 400, 3))
    posterior = az.from_dict({"posterior": {"x": draws}})
    checked = posterior_predictive_releases(posterior, model, rng=1)
    cells = checked.posterior_predictive["cells"].values
    assert cells.shape == (2, 400, 3) and cells.min() >= 0
    tot = checked.posterior_predictive["total"].values
    assert tot.shape == (2, 400)
    noise = tot - draws.sum(axis=-1)
    assert abs(noise.mean()) < 4 * np.sqrt(total.noise_variance / noise.size)
    assert int(checked.observed_data["total"]) == 12
    thinned = posterior_predictive_releases(posterior, model, rng=1, var_names="total", thin=4)
    assert list(thinned.posterior_predictive.data_vars) == ["total"]
    assert thinned.posterior_predictive["total"].shape == (2, 100)
    with pytest.raises(ValueError, match="no release named"):
        posterior_predictive_releases(posterior, model, var_names="nope")


# --- 3. multiple imputation ---------------------------------------------------------------------
Q = np.array([10.2, 9.1, 11.4, 10.8, 9.6])
U = np.array([1.10, 0.95, 1.25, 1.05, 0.90])


def test_rubin_against_the_formulas_written_out():
    """van Buuren, Flexible Imputation of Missing Data, §2.3 (eqs. 2.16-2.33), by hand."""
    m, nu_com = 5, 12.0
    q_bar = (10.2 + 9.1 + 11.4 + 10.8 + 9.6) / 5
    u_bar = (1.10 + 0.95 + 1.25 + 1.05 + 0.90) / 5
    b = sum((q - q_bar) ** 2 for q in (10.2, 9.1, 11.4, 10.8, 9.6)) / (m - 1)
    t = u_bar + (1 + 1 / m) * b
    lam = (b + b / m) / t
    r = (b + b / m) / u_bar
    nu_old = (m - 1) / lam**2
    nu_obs = (nu_com + 1) / (nu_com + 3) * nu_com * (1 - lam)
    nu = nu_old * nu_obs / (nu_old + nu_obs)
    gamma = (r + 2 / (nu + 3)) / (1 + r)
    result = rubin(Q, U, complete_df=nu_com)
    assert result.m == 5
    for got, want in [(result.estimate, q_bar), (result.within, u_bar), (result.between, b),
                      (result.total, t), (result.lam, lam), (result.riv, r), (result.df_old, nu_old),
                      (result.df_obs, nu_obs), (result.df, nu), (result.fmi, gamma)]:
        assert got == pytest.approx(want, rel=1e-12)
    # the two forms of nu_old and the relation between r and lambda
    assert nu_old == pytest.approx((m - 1) * (1 + 1 / r) ** 2, rel=1e-12)
    assert r == pytest.approx(lam / (1 - lam), rel=1e-12)
    assert b == pytest.approx(0.842, rel=1e-12) and u_bar == pytest.approx(1.05, rel=1e-12)
    lo, hi = result.interval(0.95)
    half = stats.t.ppf(0.975, nu) * np.sqrt(t)
    assert (lo, hi) == (pytest.approx(q_bar - half), pytest.approx(q_bar + half))
    lo_old, hi_old = result.interval(0.95, df="rubin")
    assert hi_old - lo_old == pytest.approx(2 * stats.t.ppf(0.975, nu_old) * np.sqrt(t))
    assert hi_old - lo_old < hi - lo  # Barnard-Rubin df <= Rubin's: a wider interval


def test_rubin_infinite_complete_df_is_rubins_1987_df():
    result = rubin(Q, U)
    assert result.df == pytest.approx(result.df_old) and np.isinf(result.df_obs)


def test_rubin_with_identical_imputations_has_no_between_variance():
    result = rubin(np.full(6, 3.5), np.full(6, 0.4), complete_df=20)
    assert result.between == 0 and result.total == pytest.approx(0.4) and result.lam == 0
    assert np.isinf(result.df_old) and result.df == pytest.approx(21 / 23 * 20)
    lo, hi = rubin(np.full(6, 3.5), np.full(6, 0.4)).interval(0.9)
    assert (lo, hi) == (pytest.approx(3.5 - stats.norm.ppf(0.95) * np.sqrt(0.4)),
                        pytest.approx(3.5 + stats.norm.ppf(0.95) * np.sqrt(0.4)))


def test_rubin_realised_estimand_uses_the_between_variance_with_m_minus_1_df():
    result = rubin(Q, np.zeros(5))
    assert result.total == pytest.approx(1.2 * result.between) and result.lam == 1
    assert result.df == pytest.approx(4) and result.fmi == 1


def test_rubin_is_elementwise_for_arrays():
    q2, u2 = np.stack([Q, 2 * Q], axis=1), np.stack([U, 3 * U], axis=1)
    both = rubin(q2, u2, complete_df=12)
    for j in range(2):
        one = rubin(q2[:, j], u2[:, j], complete_df=12)
        assert both.df[j] == pytest.approx(one.df) and both.total[j] == pytest.approx(one.total)
        assert both.interval(0.9)[0][j] == pytest.approx(one.interval(0.9)[0])
    with pytest.raises(ValueError, match="at least 2"):
        rubin([1.0], [1.0])
    with pytest.raises(ValueError, match="same shape"):
        rubin(Q, U[:4])


def _synthetic(values, cells=("a", "b", "c", "d")):
    return az.from_dict({"posterior": {"x": np.asarray(values)}}, dims={"x": ["cell"]},
                        coords={"cell": list(cells)})


def test_imputations_are_spread_over_chains_and_far_apart():
    values = np.arange(4 * 100 * 2).reshape(4, 100, 2)
    idata = az.from_dict({"posterior": {"x": values}}, dims={"x": ["cell"]}, coords={"cell": [0, 1]})
    completed = imputations(idata, "x", 10, rng=1)
    assert completed.dims == ("imputation", "cell") and completed.sizes["imputation"] == 10
    chains, draws = completed["chain"].values, completed["draw"].values
    assert list(np.bincount(chains)) == [3, 3, 2, 2]
    for c in range(4):
        gaps = np.diff(np.sort(draws[chains == c]))
        assert np.all(gaps >= 100 // np.sum(chains == c) - 1)
    np.testing.assert_array_equal(completed.values, values[chains, draws])
    np.testing.assert_array_equal(imputations(idata, "x", 10, rng=1).values, completed.values)
    assert len(set(map(tuple, np.column_stack([chains, draws])))) == 10
    with pytest.raises(ValueError, match="m must be"):
        imputations(idata, "x", 401)


def test_complete_data_analyses_by_hand():
    completed = xr.DataArray([[3, 1, 0, 6], [2, 2, 2, 2], [0, 0, 0, 0]], dims=("imputation", "cell"),
                             coords={"cell": list("abcd")})
    est, var = total_analysis(completed)
    np.testing.assert_array_equal(est, [10, 8, 0])
    np.testing.assert_array_equal(var, [10, 8, 0])  # Poisson: Var(sum x) = sum mu, estimated by sum x
    np.testing.assert_array_equal(total_analysis(completed, estimand="realised")[1], [0, 0, 0])
    share, var = share_analysis(completed, ["a", "b"])
    np.testing.assert_allclose(share[:2], [0.4, 0.5])
    np.testing.assert_allclose(var[:2], [0.4 * 0.6 / 10, 0.5 * 0.5 / 8])  # binomial given the total
    assert np.isnan(share[2]) and np.isnan(var[2])
    mask_share, _ = share_analysis(completed, np.array([True, True, False, False]))
    np.testing.assert_allclose(mask_share[:2], [0.4, 0.5])
    np.testing.assert_array_equal(share_analysis(completed, "d", estimand="realised")[1][:2], [0, 0])
    est_np, _ = total_analysis(np.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(est_np, [3, 7])
    with pytest.raises(ValueError, match="estimand"):
        total_analysis(completed, estimand="finite")


def test_rubin_on_imputations_of_a_fit_approximates_the_posterior_of_the_total(covariate_fit):
    """The realised total (complete-data variance 0): Rubin's T is (1 + 1/M) times the
    between-imputation variance, close to the posterior variance of the total."""
    _, idata = covariate_fit
    totals = idata.posterior["x"].sum("cell").values.ravel()
    completed = imputations(idata, "x", 40, rng=2)
    result = rubin(*total_analysis(completed, estimand="realised"))
    assert result.df == pytest.approx(39)
    assert abs(result.estimate - totals.mean()) < 4 * totals.std() / np.sqrt(40)
    assert 0.5 < result.total / totals.var() < 2.0
    expected = rubin(*total_analysis(completed))  # plus the Poisson variance: a wider interval
    assert expected.total == pytest.approx(result.total + np.mean(completed.sum("cell").values))


# --- 4. derived quantities --------------------------------------------------------------------------
DERIVED = np.array([[[3, 1, 0, 6], [2, 2, 2, 2], [0, 5, 1, 1]],
                    [[1, 1, 1, 1], [4, 0, 0, 4], [0, 0, 0, 0]]])


def test_shares_and_ratios_by_hand():
    idata = _synthetic(DERIVED)
    share = shares(idata, "x")
    assert share.dims == ("chain", "draw", "cell")
    np.testing.assert_allclose(share.values[0, 0], [0.3, 0.1, 0.0, 0.6])
    np.testing.assert_allclose(share.values[1, 1], [0.5, 0, 0, 0.5])
    assert np.isnan(share.values[1, 2]).all()
    r = ratio(idata, "x", "a", "b")
    assert r.dims == ("chain", "draw")
    np.testing.assert_allclose(r.values[0], [3.0, 1.0, 0.0])
    assert np.isinf(r.values[1, 1]) and np.isnan(r.values[1, 2])
    group = ratio(idata, "x", ["a", "b"], ["c", "d"])
    np.testing.assert_allclose(group.values[0], [4 / 6, 1.0, 5 / 2])
    positional = ratio(az.from_dict({"posterior": {"x": DERIVED}}), "x", 0, 1)
    np.testing.assert_allclose(positional.values[0], [3.0, 1.0, 0.0])
    summary = az.summary(share, kind="stats", skipna=True)
    assert summary.loc["x_share[a]", "mean"] == pytest.approx(np.nanmean(share.values[..., 0]), abs=0.01)


def test_ranks_first_and_rank_probabilities_by_hand():
    idata = _synthetic(DERIVED)
    ranked = ranks(idata, "x")
    np.testing.assert_array_equal(ranked.values[0, 0], [2, 3, 4, 1])
    np.testing.assert_array_equal(ranked.values[0, 1], [1, 1, 1, 1])  # ties share the best rank
    np.testing.assert_array_equal(ranked.values[0, 2], [4, 1, 2, 2])
    np.testing.assert_array_equal(ranks(idata, "x", descending=False).values[0, 0], [3, 2, 1, 4])
    first = ranked_first(idata, "x")
    np.testing.assert_allclose(first.mean(("chain", "draw")).values, [4 / 6, 4 / 6, 3 / 6, 5 / 6])
    probs = rank_probabilities(idata, "x")
    assert probs.dims == ("cell", "rank") and list(probs["rank"].values) == [1, 2, 3, 4]
    np.testing.assert_allclose(probs.sel(rank=1).values, first.mean(("chain", "draw")).values)
    np.testing.assert_allclose(probs.sel(cell="a").values, [4 / 6, 1 / 6, 0, 1 / 6])


def test_exceedance_by_hand():
    idata = _synthetic(DERIVED)
    over = exceeds(idata, "x", 2)
    np.testing.assert_allclose(over.mean(("chain", "draw")).values, [3 / 6, 2 / 6, 1 / 6, 3 / 6])
    per_cell = exceeds(idata, "x", xr.DataArray([1, 1, 10, 10], dims="cell", coords={"cell": list("abcd")}))
    np.testing.assert_allclose(per_cell.mean(("chain", "draw")).values, [4 / 6, 4 / 6, 0, 0])
    assert az.summary(over, kind="stats").loc["x_exceeds[a]", "mean"] == pytest.approx(0.5)


# --- 5. prior sensitivity ----------------------------------------------------------------------------
SMALL_MECH = DoubleGeometric(epsilon=0.5)


def gamma_poisson(release, prior):
    a, b = prior
    with pm.Model() as model:
        lam = pm.Gamma("lam", a, b)
        x = pm.Poisson("x", lam)
        SMALL_MECH.observe("release", x, observed=release)
    return model


def test_prior_sensitivity_matches_the_exact_posteriors():
    """x ~ Poisson(lam), lam ~ Gamma(a, b), release s = 1: x | s ∝ NegBin(x; a, b / (b + 1))
    f(s - x), by enumeration, for two priors (prior means 2 and 10)."""
    release = 1
    priors = {"Gamma(2, 1)": (2.0, 1.0), "Gamma(5, 0.5)": (5.0, 0.5)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = prior_sensitivity(gamma_poisson, release, priors, var_name="x", draws=2000, tune=500,
                                   random_seed=4)
    table = result.table
    assert list(table["prior"]) == list(priors) and list(table["cell"]) == ["x", "x"]
    assert {"mean", "sd", "median", "lower90%", "upper90%", "P(=0)", "mean change"} <= set(table.columns)
    assert table["mean change"].iloc[0] == 0
    support = np.arange(300)
    exact, errors = [], []
    for (label, (a, b)), (_, row) in zip(priors.items(), table.iterrows()):
        log_w = stats.nbinom.logpmf(support, a, b / (b + 1)) + SMALL_MECH.log_likelihood(np.full(300, release), support)
        p = np.exp(log_w - special.logsumexp(log_w))
        mean = np.sum(p * support)
        sd = np.sqrt(np.sum(p * support**2) - mean**2)
        ess = float(az.ess(result.fits[label], var_names=["x"])["x"])
        assert abs(row["mean"] - mean) < 4 * sd / np.sqrt(ess), label
        assert abs(row["P(=0)"] - p[0]) < 4 * np.sqrt(p[0] * (1 - p[0]) / ess), label
        exact.append(mean)
        errors.append(sd / np.sqrt(ess))
    # the small count moves with the prior (exactly by about 2.2): the release does not decide it
    assert exact[1] - exact[0] > 2
    assert abs(table["mean change"].iloc[1] - (exact[1] - exact[0])) < 4 * np.hypot(*errors)
