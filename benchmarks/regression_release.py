"""The privatised regression of issue 39 that the record-sum benchmarks fit
(bench_record_sums.py, bench_blas_threads.py): n records x ~ N(0, 1) with p covariates,
y = 1 + x'b + N(0, 1) with b = 2 / sqrt(p) each, both clamped to [-5, 5], the regression
statistic released with Laplace noise at epsilon 1 (sensitivity that of the clamped records'
statistic: 25 per entry), and the analyst's model: beta ~ N(0, 5), the records N(0, 1) and
y ~ N(beta_0 + x'beta_1:, 1), the release observed through the same mechanism."""

from __future__ import annotations

import numpy as np
import pymc as pm

import dpinfer as dp


def regression_model(n: int, p: int, seed: int) -> pm.Model:
    """A new model object of new data (``seed``) for the release above."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p))
    b = np.r_[1.0, np.full(p, 2.0 / np.sqrt(p))]
    y = b[0] + x @ b[1:] + rng.normal(size=n)
    mechanism = dp.Laplace(1.0, sensitivity=25.0 * len(dp.regression_statistic_labels(p)))
    release = mechanism.release(dp.regression_statistic(dp.clamp(x, -5, 5), dp.clamp(y, -5, 5)), rng)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 5.0, shape=p + 1)
        xs = pm.Normal("x", 0.0, 1.0, shape=(n, p))
        ys = pm.Normal("y", beta[0] + xs @ beta[1:], 1.0, shape=n)
        mechanism.observe("s", dp.regression_statistic(dp.clamp(xs, -5, 5), dp.clamp(ys, -5, 5)), observed=release)
    return model
