"""Fast checks of benchmarks/b3_reference.py, the numba data-augmentation reference for B3.

Oracles: direct NumPy computation of the clamped statistic; the closed-form conjugate update
(against a least-squares formulation); the Laplace density ratio; the prior (an uninformative
release, epsilon = 1e-6); and, for a 3-record data set with an informative release, the
posterior mean computed independently by importance sampling from the prior.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import arviz as az
import numpy as np
import pytest
from scipy import stats

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "b3_reference.py"


def _load():
    name = "b3_reference"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


b3 = _load()


def _wide_records(rng, n):
    """Records with many values beyond the clamp bounds +-10."""
    x = rng.normal(0.0, 9.0, size=(n, 2))
    y = rng.normal(0.0, 14.0, size=n)
    return x, y


def _numpy_statistic(x, y):
    d = np.column_stack([np.ones(len(y)), np.clip(x, -10, 10) / 10])
    u = np.clip(y, -10, 10) / 10
    dtu = d.T @ u
    dtd = d.T @ d
    return np.array([dtu[0], dtu[1], dtu[2], u @ u, dtd[1, 0], dtd[2, 0], dtd[2, 1], dtd[1, 1],
                     dtd[2, 2]]), dtd


def _chain_summary(beta):
    """(mean, sd, mcse_mean, mcse_sd, ess_bulk) of draws shaped (chain, draw, 3)."""
    idata = az.from_dict({"posterior": {"beta": beta}}, dims={"beta": ["coef"]})

    def vals(tree):
        return np.asarray(tree["beta"].values, dtype=float)

    flat = beta.reshape(-1, 3)
    return (flat.mean(axis=0), flat.std(axis=0, ddof=1),
            vals(az.mcse(idata, method="mean")), vals(az.mcse(idata, method="sd")),
            vals(az.ess(idata, method="bulk")))


def test_statistic_matches_numpy_with_clamping():
    rng = np.random.default_rng(0)
    x, y = _wide_records(rng, 200)
    assert (np.abs(x) > 10).mean() > 0.1 and (np.abs(y) > 10).mean() > 0.3
    expected, dtd = _numpy_statistic(x, y)
    got = b3.statistic(x, y)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert dtd[0, 0] == len(y)  # the (1,1) entry is N, not part of the release
    per_record = np.sum([b3.record_statistic(*x[i], y[i]) for i in range(len(y))], axis=0)
    np.testing.assert_allclose(per_record, expected, rtol=1e-12, atol=1e-12)
    # a record at the bounds and beyond them gives the same contribution
    np.testing.assert_array_equal(b3.record_statistic(10.0, -10.0, 10.0),
                                  b3.record_statistic(37.0, -12.5, 1e6))


def test_beta_conditional_matches_least_squares():
    rng = np.random.default_rng(1)
    x, y = b3.simulate_records([0.5, -1.0, 2.0], rng)
    y[:5] += 30.0  # unclamped values must be used: beyond +-10 on purpose
    m, v = b3.beta_conditional(x, y)
    s, tau = np.sqrt(b3.SIGMA2), b3.PRIOR_SD
    xd = np.column_stack([np.ones(len(y)), x])
    # ridge as augmented least squares: [X/s; I/tau] beta ~ [y/s; 0]
    a = np.vstack([xd / s, np.eye(3) / tau])
    rhs = np.concatenate([y / s, np.zeros(3)])
    m_ls = np.linalg.lstsq(a, rhs, rcond=None)[0]
    np.testing.assert_allclose(m, m_ls, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(v, np.linalg.inv(a.T @ a), rtol=1e-10, atol=1e-14)


def test_beta_draws_have_conditional_mean_and_covariance():
    rng = np.random.default_rng(2)
    x, y = b3.simulate_records([1.0, 0.3, -0.7], rng)
    m, v = b3.beta_conditional(x, y)
    n = 200_000
    draws = b3.draw_beta_conditional(x, y, n, seed=3)
    se = np.sqrt(np.diag(v) / n)
    assert np.all(np.abs(draws.mean(axis=0) - m) < 4.5 * se)
    cov = np.cov(draws.T)
    # sd of a sample covariance entry: sqrt((v_ab^2 + v_aa v_bb) / n)
    se_cov = np.sqrt((v**2 + np.outer(np.diag(v), np.diag(v))) / n)
    assert np.all(np.abs(cov - v) < 4.5 * se_cov)


def test_acceptance_ratio_of_the_same_record_is_one():
    rng = np.random.default_rng(4)
    x, y = _wide_records(rng, 100)
    t = b3.statistic(x, y)
    s = b3.PUBLISHED_RELEASE
    for i in (0, 17, 99):
        ti = b3.record_statistic(*x[i], y[i])
        t_new = t - ti + ti
        assert np.exp(b3.log_acceptance_ratio(s, t, t_new, 1.3)) == pytest.approx(1.0, abs=1e-12)
    assert b3.log_acceptance_ratio(s, t, t.copy(), 1.3) == 0.0


def test_acceptance_ratio_is_the_laplace_density_ratio():
    rng = np.random.default_rng(5)
    s = b3.PUBLISHED_RELEASE
    t, t_new = s + rng.normal(0, 2, 9), s + rng.normal(0, 2, 9)
    lap = stats.laplace(scale=1.3)
    expected = lap.logpdf(s - t_new).sum() - lap.logpdf(s - t).sum()
    assert b3.log_acceptance_ratio(s, t, t_new, 1.3) == pytest.approx(expected, rel=1e-12)


def test_chain_is_reproducible_and_checks_release():
    a = b3.run_chain(50, seed=7, burn=10)
    b = b3.run_chain(50, seed=7, burn=10)
    np.testing.assert_array_equal(a["beta"], b["beta"])
    assert a["beta"].shape == (50, 3) and 0.0 < a["acceptance_rate"] <= 1.0
    with pytest.raises(ValueError):
        b3.run_chain(5, seed=1, release=np.zeros(8))


def test_simulate_release():
    release, truth = b3.simulate_release([0.5, -1.0, 1.0], seed=11)
    rng = np.random.default_rng(11)
    x, y = b3.simulate_records([0.5, -1.0, 1.0], rng)
    np.testing.assert_allclose(truth, _numpy_statistic(x, y)[0], rtol=1e-12)
    assert release.shape == (9,) and np.all(release != truth)


def test_uninformative_release_gives_the_prior():
    # epsilon = 1e-6: Laplace scale 1.3e7, the release carries no information, so beta's
    # posterior is its prior N(0, 2^2 I). The chain starts at the stationary law.
    n_chains, n_sweeps = 4, 60_000
    beta = np.stack([b3.run_chain(n_sweeps, seed=100 + c, epsilon=1e-6, burn=0)["beta"]
                     for c in range(n_chains)])
    mean, sd, mcse_mean, mcse_sd, ess = _chain_summary(beta)
    assert ess.min() > 200, ess
    assert np.all(np.abs(mean) < 4.5 * mcse_mean), (mean, mcse_mean)
    assert np.all(np.abs(sd - b3.PRIOR_SD) < 4.5 * mcse_sd), (sd, mcse_sd)


def _importance_posterior_mean(release, epsilon, n_records, n_samples, seed):
    """E[beta | s] by self-normalised importance sampling from the prior (independent code).

    Draw beta ~ N(0, 4 I), records from the model, weight by the Laplace density of s - T.
    Returns (mean, standard error by the delta method).
    """
    rng = np.random.default_rng(seed)
    scale = b3.DELTA / epsilon
    means, log_w = [], []
    for _ in range(n_samples // 500_000):
        m = 500_000
        beta = b3.PRIOR_SD * rng.standard_normal((m, 3))
        x = b3.MU_X + rng.standard_normal((m, n_records, 2))
        y = (beta[:, :1] + np.einsum("mnk,mk->mn", x, beta[:, 1:])
             + np.sqrt(b3.SIGMA2) * rng.standard_normal((m, n_records)))
        d2, d3 = np.clip(x[..., 0], -10, 10) / 10, np.clip(x[..., 1], -10, 10) / 10
        u = np.clip(y, -10, 10) / 10
        t = np.stack([u.sum(1), (d2 * u).sum(1), (d3 * u).sum(1), (u * u).sum(1), d2.sum(1),
                      d3.sum(1), (d2 * d3).sum(1), (d2 * d2).sum(1), (d3 * d3).sum(1)], axis=1)
        log_w.append(-np.abs(release - t).sum(axis=1) / scale)
        means.append(beta)
    beta = np.concatenate(means)
    w = np.exp(np.concatenate(log_w) - np.concatenate(log_w).max())
    w /= w.sum()
    mean = w @ beta
    se = np.sqrt((w[:, None] ** 2 * (beta - mean) ** 2).sum(axis=0))
    return mean, se


def test_informative_release_matches_importance_sampling():
    # 3 records, Laplace scale 13/52 = 0.25: the accept/reject step matters (acceptance about
    # 0.37); the posterior mean of beta is checked against importance sampling from the prior.
    n_records, epsilon = 3, 52.0
    release, _ = b3.simulate_release([1.0, -2.0, 1.5], seed=21, epsilon=epsilon,
                                     n_records=n_records)
    chains = [b3.run_chain(200_000, seed=200 + c, release=release, epsilon=epsilon, burn=1000,
                           n_records=n_records) for c in range(4)]
    assert max(c["acceptance_rate"] for c in chains) < 0.6
    mean, _, mcse_mean, _, ess = _chain_summary(np.stack([c["beta"] for c in chains]))
    assert ess.min() > 1000, ess
    is_mean, is_se = _importance_posterior_mean(release, epsilon, n_records, 4_000_000, seed=22)
    tol = 4.5 * np.sqrt(mcse_mean**2 + is_se**2)
    assert np.all(np.abs(mean - is_mean) < tol), (mean, is_mean, tol)
    # and the release was informative: the posterior mean is far from the prior's 0
    assert np.abs(is_mean).max() > 10 * is_se.max()
