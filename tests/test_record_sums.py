"""The planner's choice between data augmentation and the law of the sum for releases of
record-additive statistics (dpinfer.inference.planning.record_sums), its refusals, and the law
of the sum's posterior where the normal law is exact: the sum of n normal records is normal,
so its posterior must match the closed form (Gaussian noise) or a one-dimensional integral
(Laplace noise). The two fits are in the validation tier: the law of the sum's functions
compile for minutes on first use (its graph has a few hundred nodes), which the fast tier
cannot pay; the fast tier checks the rewritten model's log density against scipy instead."""

import json

import numpy as np
import pymc as pm
import pytest
from scipy import integrate, stats

import dpinfer as dp
from dpinfer.inference.planning.record_sums import CROSSOVER_RECORDS, NotASumError, plan_record_sums
from dpinfer.mechanisms.records import releases_of


def _regression(n, *, mean=None, x_clamp=(-5.0, 5.0), x_mu=0.0, extra_child=False, mechanism=None, release=None):
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=2)
        x = pm.Normal("x", x_mu, 1.0, shape=(n, 1))
        y = pm.Normal("y", mean(beta, x) if mean else beta[0] + x @ beta[1:], 1.0, shape=n)
        if extra_child:
            pm.Deterministic("x_mean", x.mean())
        statistic = dp.regression_statistic(dp.clamp(x, *x_clamp), dp.clamp(y, -5.0, 5.0))
        (mechanism or dp.Laplace(1.0, sensitivity=60.0)).observe("s", statistic,
                                                                      observed=np.zeros(5) if release is None else release)
    return model


def _plan(model, choice="auto"):
    return plan_record_sums(model, releases_of(model), choice)


def test_auto_takes_the_law_of_the_sum_from_the_crossover():
    summed, kept = _plan(_regression(CROSSOVER_RECORDS))
    assert [s.record.name for s in summed] == ["s"] and not kept
    assert summed[0].n == CROSSOVER_RECORDS and [v.name for v in summed[0].removed] == ["x", "y"]
    summed, kept = _plan(_regression(CROSSOVER_RECORDS - 1))
    assert not summed and "below the" in kept["s"]


def _rectified(n, mechanism):
    """Power sums of c = clamp(y, 0, 10), y ~ N(-2, 1) (mu's prior a point): c is 0 for 98% of
    records and its sum skewed."""
    with pm.Model() as model:
        mu = pm.Normal("mu", -2.0, 1e-9)
        y = pm.Normal("y", mu, 1.0, shape=n)
        mechanism.observe("s", dp.power_sums(dp.clamp(y, 0.0, 10.0), degree=1), observed=np.array([25.0]))
    return model


def test_auto_keeps_data_augmentation_where_the_normal_law_would_err():
    """The predicted error: the release's skewness n k3(c) / (n Var[c] + noise variance)^1.5 times
    0.284 (the 5%/95% quantiles' first Edgeworth shift), here against k3 and Var of the
    rectified normal by quadrature (the planner simulates 50,000 records: 20%).
    Nearly noiseless (sd 0.1) at 3,000 records it is 0.03 sd and 'auto' keeps data
    augmentation, saying why; Laplace noise of scale 10 dilutes it to 0.0014 and the law is
    taken. Forced, the law is fitted either way."""
    from scipy import integrate

    from dpinfer.inference.planning.record_sums import EDGEWORTH, ERROR_TOLERANCE

    n = 3000
    moment = [integrate.quad(lambda y, k=k: max(y, 0.0) ** k * stats.norm.pdf(y, -2.0, 1.0), -12, 10, points=[0])[0]
              for k in range(4)]
    mean = moment[1]
    variance = moment[2] - mean**2
    third = moment[3] - 3 * mean * moment[2] + 2 * mean**3

    def expected(noise):
        return EDGEWORTH * n * third / (n * variance + noise) ** 1.5

    quiet = _rectified(n, dp.Gaussian.from_sigma(0.1))
    summed, kept = _plan(quiet)
    assert not summed and "predicted error" in kept["s"] and "exceeds the 0.02" in kept["s"]
    [item] = _plan(quiet, "law-of-the-sum")[0]
    assert expected(0.01) > 1.4 * ERROR_TOLERANCE
    assert item.predicted_error == pytest.approx(expected(0.01), rel=0.2)
    [item] = _plan(_rectified(n, dp.Laplace(1.0, sensitivity=10.0)))[0]
    assert item.predicted_error == pytest.approx(expected(200.0), rel=0.2) and item.predicted_error < ERROR_TOLERANCE / 10


def test_the_measured_error_is_the_sums_skewness_at_the_posterior_mean():
    """measured_error at the posterior mean against quadrature: the sum's skewness skew(c) /
    sqrt(n) and the release's quantile error 0.284 n k3(c) / (n Var[c] + noise variance)^1.5,
    from the 200,000 records it simulates (the sample skewness of this rectified normal,
    zero for 98% of records, has a relative sd of 1.7% at that size, by simulation: rel=0.1 is
    6 sds)."""
    import xarray as xr

    from dpinfer.inference.planning.record_sums import EDGEWORTH

    n = 3000
    moment = [integrate.quad(lambda y, k=k: max(y, 0.0) ** k * stats.norm.pdf(y, -2.0, 1.0), -12, 10, points=[0])[0]
              for k in range(4)]
    variance = moment[2] - moment[1] ** 2
    third = moment[3] - 3 * moment[1] * moment[2] + 2 * moment[1] ** 3
    [item] = _plan(_rectified(n, dp.Laplace(1.0, sensitivity=10.0)), "law-of-the-sum")[0]
    posterior = xr.Dataset({"mu": (("chain", "draw"), np.full((1, 2), -2.0))})
    error = item.measured_error(posterior, np.random.default_rng(5))
    assert error["max_abs_skewness_of_sum"] == pytest.approx(third / variance**1.5 / np.sqrt(n), rel=0.1)
    assert error["release_quantile_error_sd"] == pytest.approx(EDGEWORTH * n * third / (n * variance + 200.0) ** 1.5,
                                                               rel=0.1)


def test_simulated_moments_in_chunks_are_the_samples_own():
    """The chunked power sums give the variance and third central moment (divisor the number of
    records) of the very records simulated, chunk by chunk from the same stream: scipy's."""
    from dpinfer.distributions.sum_of_records import Clamp, regression_terms, simulate_terms
    from dpinfer.inference.planning.record_sums import CHUNK_RECORDS, _simulated_cumulants

    records = dict(mu_x=np.full(2, 3.0), sigma_x=np.ones(2), a=40.0, b=np.array([2.0, -1.0]), sigma=1.0,
                   clamp=Clamp(-50.0, 45.0), alpha_x=np.ones(2), gamma_x=np.zeros(2))  # means far from 0
    terms, size = regression_terms(2), 2 * CHUNK_RECORDS + 7
    variance, third = _simulated_cumulants(records, terms, size, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    sizes = [CHUNK_RECORDS, CHUNK_RECORDS, 7]
    draws = np.concatenate([simulate_terms(records, terms, k, rng) for k in sizes])
    np.testing.assert_allclose(variance, stats.moment(draws, 2, axis=0), rtol=1e-9)
    np.testing.assert_allclose(third, stats.moment(draws, 3, axis=0), rtol=1e-6, atol=1e-9 * np.abs(draws).max() ** 3)


def test_either_method_can_be_forced():
    assert _plan(_regression(50), "law-of-the-sum")[0]
    summed, kept = _plan(_regression(5000), "data-augmentation")
    assert not summed and "records='data-augmentation'" in kept["s"]
    with pytest.raises(ValueError, match="records must be one of"):
        _plan(_regression(50), "normal")


@pytest.mark.parametrize("model, why", [
    (lambda: _regression(3000, mean=lambda b, x: b[0] + (x**2) @ b[1:]), "affine function of its own record"),
    (lambda: _regression(3000, x_clamp=(-1.0, 1.0)), "clamp \\[-1, 1\\] binds"),
    (lambda: _regression(3000, x_mu=np.linspace(0, 1, 3000)[:, None]), "varies by record"),
    (lambda: _regression(3000, extra_child=True), "x_mean depends on the records"),
])
def test_the_law_of_the_sum_is_refused_saying_why(model, why):
    m = model()
    summed, kept = _plan(m)
    assert not summed and "does not apply" in kept["s"]
    with pytest.raises(NotASumError, match=why):
        _plan(m, "law-of-the-sum")


def _normal_sum_model(n, mechanism, release):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        y = pm.Normal("y", mu, 2.0, shape=n)
        mechanism.observe("s", dp.power_sums(y, degree=1), observed=np.array([release]))
    return model


def _logp_at(fitted, point):
    return float(fitted.compile_logp(mode="FAST_COMPILE")(point))


def test_rewritten_model_has_the_law_of_the_sum():
    """The model dp.sample fits: the records gone, s ~ N(n mu, 4 n + tau^2) for sum y of
    N(mu, 2) records under Gaussian noise (exact: a sum of normals is normal)."""
    from dpinfer.inference.engines.closed_form import summed_out_model

    n, tau, release = 5000, 30.0, 1234.0
    model = _normal_sum_model(n, dp.Gaussian.from_sigma(tau), release)
    fitted = summed_out_model(model, _plan(model)[0])
    assert [v.name for v in fitted.free_RVs] == ["mu"]
    expected = stats.norm.logpdf(release, n * 0.3, np.sqrt(4 * n + tau**2)) + stats.norm.logpdf(0.3)
    assert _logp_at(fitted, {"mu": 0.3}) == pytest.approx(expected, rel=1e-10)


def _records_moments(n, beta):
    import pytensor

    from dpinfer.distributions.sum_of_records import Clamp, NormalRecords, regression_terms

    records = NormalRecords(mu_x=np.zeros(1), sigma_x=np.ones(1), a=beta[0], b=beta[1:], sigma=1.0,
                            clamp=Clamp(-5.0, 5.0), alpha_x=np.ones(1), gamma_x=np.zeros(1))
    mean, cov = pytensor.function([], list(records.moments(regression_terms(1))), mode="FAST_COMPILE")()
    return n * mean, n * cov + np.diag(1e-10 * n * (np.diag(cov) + mean**2))


def test_rewritten_regression_under_laplace_noise_is_a_scale_mixture():
    """Laplace noise (scale b = 20): e ~ N(0, v), v ~ Exponential(mean 2 b^2) written as
    v = -2 b^2 log(1 - Phi(w)), w ~ N(0, 1), so given v the release s ~ MvNormal(n E[t],
    n Cov[t] + diag v) (the records' law's covariance with its Cholesky guard, 1e-10 n E[t_j^2]), against
    scipy, v through scipy's exponential quantile. Scale b = 20 at n = 10,000: every coordinate's
    sum spreads wider than the noise (x's variance n = 10,000 > 2 b^2 = 800), so T is not
    non-centred."""
    from dpinfer.inference.engines.closed_form import summed_out_model

    n = 10_000
    model = _regression(n, mechanism=dp.Laplace(1.0, sensitivity=20.0))
    [item] = _plan(model)[0]
    assert not item.non_centred
    fitted = summed_out_model(model, [item])
    assert sorted(v.name for v in fitted.free_RVs) == ["beta", "s_noise_variance_z"]
    beta, w = np.array([0.5, 1.5]), np.array([-2.5, -0.3, 0.4, 1.1, 6.0])
    v = stats.expon.ppf(stats.norm.cdf(w), scale=2 * 20.0**2)
    v[-1] = stats.expon.isf(stats.norm.sf(w[-1]), scale=2 * 20.0**2)  # the far tail, where cdf rounds to 1
    m, c = _records_moments(n, beta)
    release = np.zeros(5)
    expected = (stats.multivariate_normal.logpdf(release, m, c + np.diag(v)) + stats.norm.logpdf(beta, 0, 2).sum()
                + stats.norm.logpdf(w).sum())
    point = {"beta": beta, "s_noise_variance_z": w}
    assert _logp_at(fitted, point) == pytest.approx(expected, rel=1e-9)


def test_noise_dominated_statistic_is_non_centred():
    """Laplace noise of scale b = 600 over n = 4000 records whose release says beta is near (0.5,
    1.5): every coordinate's sum has variance under 2 b^2 = 720,000 (the clamped c^2 varies
    most, Var[c^2] <= 25^2 / 4, so n Var <= 625,000 at any parameters), so T is non-centred,
    T = n E[t] + L z with z ~ N(0, I) (L the Cholesky factor of n Cov[t] with its guard) and the
    release Laplace given T, against scipy; no noise variances are sampled."""
    from dpinfer.inference.engines.closed_form import summed_out_model

    n, b = 4000, 600.0
    beta = np.array([0.5, 1.5])
    release = np.round(_records_moments(n, beta)[0])  # a release such records make, without noise
    model = _regression(n, release=release, mechanism=dp.Laplace(1.0, sensitivity=b))
    [item] = _plan(model)[0]
    assert item.non_centred and "T non-centred" in item.method
    fitted = summed_out_model(model, [item])
    assert sorted(v.name for v in fitted.free_RVs) == ["beta", "s_true_statistic_z"]
    assert [v.name for v in fitted.observed_RVs] == ["s"]
    z = np.array([0.7, -1.2, 0.1, 2.0, -0.4])
    m, c = _records_moments(n, beta)
    statistic = m + np.linalg.cholesky(c) @ z
    expected = (stats.laplace.logpdf(release, statistic, b).sum()
                + stats.norm.logpdf(beta, 0, 2).sum() + stats.norm.logpdf(z).sum())
    assert _logp_at(fitted, {"beta": beta, "s_true_statistic_z": z}) == pytest.approx(expected, rel=1e-9)


def test_a_refit_whose_release_changes_the_form_rewrites_the_model_again():
    """The form is chosen per release (at its planning point): Laplace noise of scale 200 over
    4000 records (2 b^2 = 80,000) is noise-dominated on every coordinate where the release says
    beta is near (0, 0.5) (c^2's sum varies by about n Var[c^2] = 4000 x 2.5) and not where it
    says (0.5, 3) (c^2 of a response with sd 3.2, clamped at 5, varies by n x 60 or more). After
    pm.set_data the model kept for the first release must not be reused for the second: its
    free variables are the first form's."""
    from dpinfer.inference.engines.closed_form import summed_out_model

    n = 4000
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=2)
        x = pm.Normal("x", 0.0, 1.0, shape=(n, 1))
        y = pm.Normal("y", beta[0] + x @ beta[1:], 1.0, shape=n)
        release = pm.Data("release", np.round(_records_moments(n, np.array([0.0, 0.5]))[0]))
        dp.Laplace(1.0, sensitivity=200.0).observe(
            "s", dp.regression_statistic(dp.clamp(x, -5.0, 5.0), dp.clamp(y, -5.0, 5.0)), observed=release)
    forms = []
    for beta_release in ([0.0, 0.5], [0.5, 3.0]):
        pm.set_data({"release": np.round(_records_moments(n, np.array(beta_release))[0])}, model=model)
        [item] = _plan(model)[0]
        fitted = summed_out_model(model, [item])
        forms.append((item.non_centred, sorted(v.name for v in fitted.free_RVs)))
    assert forms == [(True, ["beta", "s_true_statistic_z"]), (False, ["beta", "s_noise_variance_z"])]


def test_rewritten_regression_keeps_the_true_statistic_under_other_noise():
    """Logistic noise (no scale mixture of normals used): T = s_true_statistic is a latent,
    T ~ MvNormal(n E[t], n Cov[t]) (+ 1e-10 n E[t_j^2], the Cholesky guard), and s | T
    is Logistic."""
    from dpinfer.inference.engines.closed_form import summed_out_model

    n = 4000
    model = _regression(n, mechanism=dp.Logistic(1.0, sensitivity=60.0))
    fitted = summed_out_model(model, _plan(model)[0])
    assert sorted(v.name for v in fitted.free_RVs) == ["beta", "s_true_statistic"]
    beta = np.array([0.5, 1.5])
    m, c = _records_moments(n, beta)
    t = m + np.linspace(-30, 30, 5)
    expected = (stats.multivariate_normal.logpdf(t, m, c) + stats.norm.logpdf(beta, 0, 2).sum()
                + stats.logistic.logpdf(np.zeros(5), t, 60.0).sum())
    assert _logp_at(fitted, {"beta": beta, "s_true_statistic": t}) == pytest.approx(expected, rel=1e-9)


@pytest.mark.validation
def test_gaussian_noise_matches_the_closed_form():
    """sum y ~ N(n mu, 4 n) exactly, so s | mu ~ N(n mu, 4 n + tau^2): a conjugate normal
    posterior for mu ~ N(0, 1)."""
    n, tau, release = 5000, 30.0, 1234.0
    mechanism = dp.Gaussian.from_sigma(tau)
    idata = dp.sample(1000, tune=500, random_seed=3, progressbar=False,
                      model=_normal_sum_model(n, mechanism, release))
    variance = 4 * n + tau**2
    precision = 1.0 + n**2 / variance
    exact_mean, exact_sd = (n * release / variance) / precision, precision**-0.5
    draws = idata.posterior["mu"].values.ravel()
    report = json.loads(idata.posterior.attrs["dpinfer"])["s"]
    assert report["method"].startswith("law of the sum")
    assert report["approximation_error"]["max_abs_skewness_of_sum"] < 0.01  # normal records: skewness 0 up to MC error
    ess = float(json.loads(idata.posterior.attrs["dpinfer_convergence"])["min_ess_bulk"])
    assert abs(draws.mean() - exact_mean) < 4 * exact_sd / np.sqrt(ess)
    assert abs(draws.std() / exact_sd - 1) < 4 / np.sqrt(2 * ess)


@pytest.mark.validation
@pytest.mark.parametrize("sensitivity, latent", [(20.0, "s_noise_variance_z"), (80.0, "s_true_statistic_z")])
def test_laplace_noise_matches_integration(sensitivity, latent):
    """Laplace noise: p(mu | s) is proportional to N(mu; 0, 1) int N(T; n mu, 4 n) Laplace(s; T, b)
    dT, integrated numerically; at b = 20 the sum's variance 4 n = 12,000 exceeds the noise's
    2 b^2 = 800 (fitted as a scale mixture of normals), at b = 80 it does not (12,800: T
    non-centred, the release Laplace given it)."""
    n, release = 3000, -900.0
    mechanism = dp.Laplace(1.0, sensitivity=sensitivity)
    idata = dp.sample(1000, tune=500, random_seed=4, progressbar=False,
                      model=_normal_sum_model(n, mechanism, release))
    grid = np.linspace(-0.6, 0.0, 301)
    b = mechanism.scale

    def likelihood(mu):
        return integrate.quad(lambda t: stats.norm.pdf(t, n * mu, 2 * np.sqrt(n)) * stats.laplace.pdf(release, t, b),
                              n * mu - 12 * 2 * np.sqrt(n), n * mu + 12 * 2 * np.sqrt(n), points=[release],
                              limit=200)[0]

    density = stats.norm.pdf(grid) * np.array([likelihood(m) for m in grid])
    density /= np.trapezoid(density, grid)
    exact_mean = np.trapezoid(grid * density, grid)
    exact_sd = np.sqrt(np.trapezoid((grid - exact_mean) ** 2 * density, grid))
    draws = idata.posterior["mu"].values.ravel()
    ess = float(json.loads(idata.posterior.attrs["dpinfer_convergence"])["min_ess_bulk"])
    assert latent in idata.posterior and "s_true_statistic" not in idata.posterior
    assert abs(draws.mean() - exact_mean) < 4 * exact_sd / np.sqrt(ess)
    assert abs(draws.std() / exact_sd - 1) < 4 / np.sqrt(2 * ess)


def test_small_release_is_planned_for_data_augmentation_saying_why():
    """dp.sample's report takes the plan's reason (posterior.attrs["dpinfer"][name]["records"])."""
    from dpinfer.inference.planning import plan_model

    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        y = pm.Normal("y", mu, 1.0, shape=20)
        dp.Laplace(1.0, sensitivity=10.0).observe("s", dp.power_sums(dp.clamp(y, -5, 5), degree=2),
                                                 observed=np.array([3.0, 25.0]))
    plan = plan_model(model, releases_of(model))
    assert "data augmentation: 20 records" in plan.augmented["s"]
    assert not [s for s in plan.summed if s.record.name == "s"]
    with pytest.raises(NotASumError, match="latent counts"):
        with model:
            k = pm.Poisson("k", 5.0)
            dp.DoubleGeometric(1.0).observe("c", k, observed=4)
        plan_model(model, releases_of(model), record_method="law-of-the-sum")


def test_power_sums_on_numpy_and_pytensor_agree():
    values = np.array([1.5, -2.0, 0.25])
    np.testing.assert_allclose(dp.power_sums(values, degree=3), [-0.25, 6.3125, -4.609375])
    assert dp.power_sums_labels(3) == ["S1", "S2", "S3"]
    with pytest.raises(ValueError, match="degree must be a whole number"):
        dp.power_sums(values, degree=0)
    with pytest.raises(ValueError, match="vector of n records"):
        dp.power_sums(np.ones((2, 2)))
