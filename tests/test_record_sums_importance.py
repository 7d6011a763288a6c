"""The exact reference of validation/record_sums_importance.py (the law of the sum against
importance sampling with a simulated likelihood): its simulation of the records is the
release's statistic of clamped records, its likelihood estimate the Laplace densities' mean,
its weighted quantiles and its pooling of runs what they claim. Fast: no fit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.special import logsumexp

import dpinfer as dp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import record_sums_importance as study  # noqa: E402


def test_simulated_statistics_are_the_release_statistic_of_clamped_records():
    beta = np.array([1.0, 3.0, -2.0])  # steep enough that the response's clamp binds
    sets, n = 3, 40
    got = study.simulated_statistics(beta, n, sets, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    raw = rng.standard_normal((sets, n, 2))
    y = beta[0] + raw @ beta[1:] + rng.standard_normal((sets, n))
    for k in range(sets):
        expected = dp.regression_statistic(dp.clamp(raw[k], -5, 5), dp.clamp(y[k], -5, 5))
        np.testing.assert_allclose(got[k], expected, rtol=1e-12)
    assert np.mean(np.abs(y) > 5) > 0.05  # the clamp was exercised


def test_log_likelihood_is_the_log_of_the_mean_laplace_density():
    beta, n, sets, scale = np.array([1.0, 0.5]), 30, 50, 7.0
    release = study.simulated_statistics(beta, n, 1, np.random.default_rng(1))[0] + 3.0
    t = study.simulated_statistics(beta, n, sets, np.random.default_rng(2))
    densities = np.prod(np.exp(-np.abs(release - t) / scale) / (2 * scale), axis=1)
    got = study.log_likelihood(beta, release, scale, n, sets, np.random.default_rng(2))
    assert got == pytest.approx(np.log(densities.mean()), rel=1e-12)
    assert got == pytest.approx(logsumexp(np.log(densities)) - np.log(sets), rel=1e-12)


def test_weighted_quantiles():
    values = np.random.default_rng(3).normal(size=1001)
    for q in (0.05, 0.5, 0.95):  # equal weights: the inverted-cdf sample quantile
        assert study.weighted_quantile(values, np.ones(1001), q) == np.quantile(values, q, method="inverted_cdf")
    # integer weights are repeats
    weights = np.random.default_rng(4).integers(1, 4, size=1001)
    assert study.weighted_quantile(values, weights.astype(float), 0.3) == np.quantile(
        np.repeat(values, weights), 0.3, method="inverted_cdf")


def test_pooling_averages_the_runs_differences(tmp_path):
    rows = [[0.5, 0.4, 0.1, 0.1], [0.3, 0.4, 0.1, 0.1]]  # law, exact, se law, se exact
    paths = []
    for k, (law, exact, se_law, se_exact) in enumerate(rows):
        path = tmp_path / f"run{k}.md"
        path.write_text("| n | p | parameter | q | law | exact | se law | se exact | z |\n"
                        f"| 1,000 | 5 | beta[0] | 0.50 | {law} | {exact} | {se_law} | {se_exact} | 0 |\n")
        paths.append(path)
    [row] = [line for line in study.pooled(paths).splitlines() if line.startswith("| 1,000")]
    cells = [c.strip() for c in row.split("|")]
    assert cells[5] == "2" and float(cells[6]) == pytest.approx(0.0)  # mean of +0.1 and -0.1
    assert float(cells[8]) == pytest.approx(np.std([0.1, -0.1], ddof=1), abs=1e-4)
    assert float(cells[9]) == pytest.approx(np.sqrt(0.02), abs=1e-4)
