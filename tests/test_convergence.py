"""R-hat, bulk and tail ESS of dpinfer.inference.convergence equal ArviZ's (the reference,
arviz.rhat, arviz.ess(method="bulk") and arviz.ess(method="tail", prob=0.05)), and dp.sample
reports them after every fit."""

import json

import arviz as az
import numpy as np
import pymc as pm
import pytest
import xarray as xr

from dpinfer.inference import sample
from dpinfer.inference.convergence import (
    LATENT_ALPHA,
    ConvergenceWarning,
    check,
    diagnostics,
    draws_to_add,
    latent_diagnostics,
    tail_ess,
)
from dpinfer.mechanisms.geometric import DoubleGeometric


def ar1(rng, phi, chains, draws, k):
    x = np.zeros((chains, draws, k))
    noise = rng.standard_normal((chains, draws, k))
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    return x


def _draws(phi, chains, draws):
    rng = np.random.default_rng(int(phi * 100) + chains * draws)
    x = ar1(rng, phi, chains, draws, 6)
    x[..., 1] = np.round(x[..., 1] * 2)  # ties, as counts have
    x[..., 2] += np.arange(chains)[:, None] * 0.5  # chains that disagree
    x[..., 3] = 7.0  # a constant quantity
    x[..., 4] = rng.poisson(3.0, size=(chains, draws))  # many ties
    return x


@pytest.mark.parametrize("phi", [0.0, 0.6, 0.97])
@pytest.mark.parametrize("chains, draws", [(2, 1000), (4, 201), (1, 500), (3, 7)])
def test_rhat_and_bulk_ess_equal_arviz(phi, chains, draws):
    x = _draws(phi, chains, draws)
    rhat, ess = diagnostics(x)
    data = xr.Dataset({"v": (("chain", "draw", "k"), x)})
    with np.errstate(invalid="ignore", divide="ignore"):
        expected_ess = az.ess(data, method="bulk")["v"].values
        expected_rhat = az.rhat(data)["v"].values if chains > 1 else np.full(6, np.nan)
    np.testing.assert_allclose(ess, expected_ess, rtol=1e-10)
    np.testing.assert_allclose(rhat, expected_rhat, rtol=1e-10)


@pytest.mark.parametrize("phi", [0.0, 0.6, 0.97])
@pytest.mark.parametrize("chains, draws", [(2, 1000), (4, 201), (1, 500), (3, 7)])
def test_tail_ess_equals_arviz_at_the_5_and_95_percent_quantiles(phi, chains, draws):
    x = _draws(phi, chains, draws)
    data = xr.Dataset({"v": (("chain", "draw", "k"), x)})
    expected = az.ess(data, method="tail", prob=0.05)["v"].values
    np.testing.assert_allclose(tail_ess(x), expected, rtol=1e-10)


def test_ess_by_direct_lags_is_the_ffts_and_the_fft_serves_the_slow_quantities():
    """Autocovariances summed lag by lag (quantities that mix) and by FFT (those whose
    truncation needs more than DIRECT_LAGS lags) give the same ESS to rounding, constants NaN."""
    from dpinfer.inference import convergence

    rng = np.random.default_rng(8)
    for chains in (1, 2, 4):
        z = np.concatenate([ar1(rng, phi, chains, 1000, 20) for phi in (0.0, 0.5, 0.9, 0.995)], axis=2)
        z[..., 0] = 2.5
        z = np.ascontiguousarray(z.transpose(2, 0, 1))  # (quantity, chain, draw)
        centred = np.ascontiguousarray(z - z.mean(axis=2, keepdims=True))
        between = np.var(z.mean(axis=2), axis=1, ddof=1) if chains > 1 else np.zeros(len(z))
        _, direct = convergence._geyer(centred, np.empty((0, 0)), between, convergence.DIRECT_LAGS)
        assert direct[:40].all() and not direct[60:].any()  # white noise and phi 0.5; phi 0.995
        got, fft = convergence._ess(z), convergence._ess_by_fft(centred, between)
        assert np.isnan(got[0]) and np.isnan(fft[0])
        np.testing.assert_allclose(got[1:], fft[1:], rtol=1e-12)


def test_many_quantities_are_done_in_batches():
    x = ar1(np.random.default_rng(3), 0.5, 2, 100, 5000)
    rhat, ess = diagnostics(x)
    data = xr.Dataset({"v": (("chain", "draw", "k"), x[:, :, 4090:4100])})
    np.testing.assert_allclose(ess[4090:4100], az.ess(data, method="bulk")["v"].values, rtol=1e-10)
    np.testing.assert_allclose(rhat[4090:4100], az.rhat(data)["v"].values, rtol=1e-10)
    np.testing.assert_allclose(tail_ess(x)[4090:4100], az.ess(data, method="tail", prob=0.05)["v"].values,
                               rtol=1e-10)


def test_quantities_judged_on_several_threads_are_judged_as_on_one(monkeypatch):
    """The batches spread over the cores give exactly what one thread gives, quantity by
    quantity (ties, a constant quantity, chains that disagree): 300 quantities on 2 cores in
    2 parts of 150, on 7 cores in 4 parts of 75 (at least 64 a thread), and 9 quantities on
    one thread however many cores."""
    from concurrent.futures import ThreadPoolExecutor

    from dpinfer.inference import convergence

    rng = np.random.default_rng(11)
    x = ar1(rng, 0.7, 2, 400, 300)
    x[..., :40] = np.round(x[..., :40] * 2)
    x[..., 40] = 3.0
    x[1, :, 41] += 2.0
    splits = []

    class Recorded(ThreadPoolExecutor):
        def map(self, function, parts):
            parts = list(parts)
            splits.append([p.stop - p.start for p in parts])
            return super().map(function, parts)

    monkeypatch.setattr(convergence, "ThreadPoolExecutor", Recorded)

    def judged(cores):
        monkeypatch.setattr(convergence.os, "sched_getaffinity", lambda pid: set(range(cores)))
        return (*diagnostics(x), *latent_diagnostics(x, 300), tail_ess(x), tail_ess(x[..., :9]))

    single = judged(1)
    assert splits == []
    for cores, split in ((2, [150] * 2), (7, [75] * 4)):
        splits.clear()
        for got, expected in zip(judged(cores), single, strict=True):
            np.testing.assert_array_equal(got, expected)
        assert splits == [split] * 3  # diagnostics, latent_diagnostics, tail_ess of the 300


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_counts_are_judged_as_their_floats_without_a_float_copy(dtype):
    """check() passes integer draws on as they are (a state's counts as floats would be ~1 GB);
    the batches become floats: the verdict is that of the same draws as floats, and ArviZ's."""
    from dpinfer.inference.convergence import check

    rng = np.random.default_rng(8)
    counts = np.round(5 + 3 * ar1(rng, 0.7, 2, 300, 2100)).astype(dtype)
    as_ints = check(xr.DataTree.from_dict({"posterior": xr.Dataset({"c": (("chain", "draw", "k"), counts)})}),
                    ["c"], subject="counts")
    as_floats = check(xr.DataTree.from_dict({"posterior": xr.Dataset(
        {"c": (("chain", "draw", "k"), counts.astype(float))})}), ["c"], subject="counts")
    assert as_ints.as_dict() == as_floats.as_dict()
    worst = ((as_ints.worst_rhat, as_ints.max_rhat, "rhat"), (as_ints.worst_ess, as_ints.min_ess, "bulk"))
    for label, value, method in worst:
        k = int(label.removeprefix("c[").removesuffix("]"))  # ArviZ on that quantity alone (all 2,100: 4 s)
        data = xr.Dataset({"v": (("chain", "draw"), counts[:, :, k].astype(float))})
        reference = az.rhat(data)["v"] if method == "rhat" else az.ess(data, method="bulk")["v"]
        assert value == pytest.approx(float(reference), rel=1e-10)


def _model():
    with pm.Model() as model:
        theta = pm.Beta("theta", 10, 10)
        x = pm.Binomial("x", 1000, theta, shape=2)
        DoubleGeometric(epsilon=0.1).observe("release", x, observed=[612, 580])
    return model


def test_sample_reports_convergence_in_one_line_and_in_its_attributes(capsys):
    idata = sample(1000, model=_model(), random_seed=1)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    report = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    assert line.startswith("dpinfer: converged: the parameters' max R-hat")
    assert "the 2 latents' R-hat within their bound" in line
    assert report["converged"] and report["quantities"] == 3  # theta and two counts
    rhat = az.rhat(idata.posterior.to_dataset()[["theta", "x"]])
    assert report["max_rhat"] == pytest.approx(float(rhat["theta"]), rel=1e-10)  # the parameters'
    assert report["latent_rhat"]["rhat"] == pytest.approx(float(rhat["x"].max()), rel=1e-10)
    ess = az.ess(idata.posterior.to_dataset()[["theta", "x"]], method="bulk")
    assert report["min_ess_bulk"] == pytest.approx(float(min(ess["theta"].min(), ess["x"].min())), rel=1e-10)
    tail = az.ess(idata.posterior.to_dataset()[["theta", "x"]], method="tail", prob=0.05)
    assert report["min_ess_tail"] == pytest.approx(float(min(tail["theta"].min(), tail["x"].min())), rel=1e-10)
    assert "min tail ESS" in line


def test_a_short_fit_is_said_to_be_not_converged():
    with pytest.warns(ConvergenceWarning, match="NOT CONVERGED.*Not a result yet"):
        idata = sample(30, tune=10, model=_model(), random_seed=1, progressbar=False)
    assert not json.loads(idata.posterior.attrs["dpinfer_convergence"])["converged"]


def test_one_chain_has_no_r_hat_and_is_judged_by_its_ess():
    with pytest.warns(ConvergenceWarning, match="R-hat not computed .* min bulk ESS"):
        idata = sample(100, tune=100, chains=1, model=_model(), random_seed=2, progressbar=False)
    report = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    assert np.isnan(report["max_rhat"]) and not report["converged"]


# --- many latents: R-hat judged as a family ---------------------------------------------------
def _posterior(**arrays):
    return xr.DataTree.from_dict({"posterior": xr.Dataset(
        {k: (("chain", "draw", *[f"{k}_dim_{i}" for i in range(v.ndim - 2)]), v) for k, v in arrays.items()})})


@pytest.mark.parametrize("phi, counts, draws, k", [(0.0, False, 500, 2000), (0.5, False, 1000, 2000),
                                                  (0.9, False, 4000, 500), (0.5, True, 1000, 2000)])
def test_the_latent_bound_holds_for_each_quantity_of_a_converged_chain(phi, counts, draws, k):
    """On k quantities of converged AR(1) chains (2 chains, bulk ESS about 650-2,000, above
    the target 400 where the bound is judged), the share whose R-hat exceeds the bound for one
    latent (K = 1) is at most LATENT_ALPHA plus 3 Monte Carlo se (measured: 0.08-0.38% at 4,000-20,000
    quantities; the approximation is conservative)."""
    rng = np.random.default_rng(int(10 * phi) + counts)
    x = ar1(rng, phi, 2, draws, k) * np.sqrt(1 - phi**2)
    if counts:  # Poisson-like counts around 2: ties
        x = np.clip(np.floor(2 + np.sqrt(2) * x), 0, None)
    assert np.median(diagnostics(x)[1]) > 400
    share = np.mean(latent_diagnostics(x, 1)[2] > 1.0)
    assert share <= LATENT_ALPHA + 3 * np.sqrt(LATENT_ALPHA * (1 - LATENT_ALPHA) / k)


def test_the_latents_diagnostics_from_one_ranking_are_those_of_diagnostics():
    """latent_diagnostics' R-hat and bulk ESS equal diagnostics' exactly, counts with ties and a
    constant quantity included, two chains and one."""
    rng = np.random.default_rng(3)
    x = np.clip(np.floor(2 + np.sqrt(2) * ar1(rng, 0.5, 2, 300, 40)), 0, None)
    x[:, :, 7] = 3.0
    for values in (x, x[:1]):
        rhat, ess = latent_diagnostics(values, 40)[:2]
        want_rhat, want_ess = diagnostics(values)
        np.testing.assert_array_equal(rhat, want_rhat)
        np.testing.assert_array_equal(ess, want_ess)
    _, _, excess, judged, bound = latent_diagnostics(x, 40)
    assert np.isnan(excess[7]) and np.all(np.isfinite(excess[:7])) and np.all(judged[:7] >= 1.0)
    assert np.all(np.isnan(latent_diagnostics(x[:1], 40)[2]))


def test_many_latents_of_a_converged_fit_pass_where_the_maximum_r_hat_fails():
    """1,000 latents of converged chains (AR(1), phi 0.5, 2 x 1,000 draws): their largest R-hat
    is over 1.01 (the single-quantity target false-alarms on the maximum of many), their
    family's bound holds; a parameter is still judged against 1.01. Sampling on (max_minutes)
    aims at the same bound: no more draws for them as latents, a doubling one by one."""
    rng = np.random.default_rng(7)
    x = ar1(rng, 0.5, 2, 1000, 1000)
    theta = ar1(rng, 0.5, 2, 1000, 1)[..., 0]
    idata = _posterior(theta=theta, x=x)
    assert float(np.nanmax(diagnostics(x)[0])) > 1.01
    result = check(idata, ["theta", "x"], latents=["x"])
    assert result.latents.ok and result.latents.quantities == 1000 and result.rhat_ok, result.line()
    assert result.max_rhat == pytest.approx(float(diagnostics(theta[..., None])[0][0]))
    assert not check(idata, ["theta", "x"]).rhat_ok  # all judged against 1.01
    assert draws_to_add([], 1000, 1e-3, 1e6, latents=[x], n_latents=1000) == 0
    assert draws_to_add([x], 1000, 1e-3, 1e6) == 1000


def test_a_latent_with_a_chain_in_another_place_is_over_its_bound():
    """One latent of 1,000 whose second chain sits 1 sd away: over its bound, named."""
    rng = np.random.default_rng(8)
    x = ar1(rng, 0.5, 2, 1000, 1000)
    x[1, :, 123] += 1.0 / np.sqrt(1 - 0.25)  # one marginal sd
    result = check(_posterior(x=x), ["x"], latents=["x"])
    assert not result.latents.ok and result.latents.worst == "x[123]"
    assert "x[123]'s R-hat" in result.line() and not result.converged


def test_latents_are_the_vectors_a_release_privatises_directly():
    """A regression's records x and y (the release is of their statistics), not beta behind y
    nor a scalar; latent counts, not their rate."""
    from dpinfer.inference.sample import latent_names
    import dpinfer as dp

    with pm.Model() as regression:
        beta = pm.Normal("beta", 0.0, 2.0, shape=2)
        x = pm.Normal("x", 0.0, 1.0, shape=50)
        y = pm.Normal("y", beta[0] + beta[1] * x, 1.0)
        stats = dp.regression_statistic(dp.clamp(x, -3, 3)[:, None], dp.clamp(y, -5, 5))
        dp.Laplace(1.0, sensitivity=30.0).observe("s", stats, np.zeros(5))
    assert sorted(latent_names(regression)) == ["x", "y"]
    assert latent_names(_model()) == ["x"]


def test_chains_in_different_modes_are_told_apart_from_short_chains():
    """Two stable chains of beta at +2 and -2 (the mirror modes of issue 39's regression):
    the verdict says the chains sit in different modes and that more draws will not join them;
    two chains that drift (random walks) are short: sample longer."""
    rng = np.random.default_rng(3)
    mirror = ar1(rng, 0.5, 2, 1000, 1)[..., 0] * 0.05 + np.array([[2.0], [-2.0]])
    result = check(_posterior(beta=mirror), ["beta"])
    assert not result.converged and "different modes of beta (chain 0 at 2" in result.line()
    assert "more draws will not join them" in result.line()
    assert "chains_in_different_modes" in result.as_dict()
    drifting = np.cumsum(rng.standard_normal((2, 1000)), axis=1)
    short = check(_posterior(beta=drifting), ["beta"])
    assert not short.converged and not short.modes and "sample longer" in short.line()
