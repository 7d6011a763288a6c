"""A privatised linear regression from record-level data (Ju et al. 2022's example, "B3").

The curator holds N = 100 records (x_i1, x_i2, y_i); x and y are clamped to [-10, 10] and
mapped to [-1, 1], and the regression's sufficient statistics (X'Y, Y'Y and the free entries of
X'X; ``dp.regression_statistic``) are released with Laplace noise of scale 13 / epsilon,
epsilon = 10 (Ju, Awan, Gong & Rao, NeurIPS 2022; the release below is the one published in
their companion repository). The analyst's model: x_i ~ N2((0.90014, -1.17335), I),
y_i | x_i ~ N(beta0 + beta1 x_i1 + beta2 x_i2, 2), beta ~ N(0, 2^2 I).

The analyst writes the record-level model as it is, clamping included, and observes the
release through the mechanism object; ``dp.sample`` samples the 300 latent record values and
beta jointly (NUTS, dpinfer's compiled engine).

The naive analysis takes the released statistics as the true ones (a conjugate update with
X'X and X'Y read off the release) and is far too confident.
The reference posterior is dapper's data-augmentation algorithm run long
(benchmarks/b3_reference.py; see benchmarks/README.md).
Run: .venv/bin/python examples/privatised_regression.py
"""

import time

import arviz as az
import numpy as np
import pymc as pm

import dpinfer as dp

N, SIGMA2, BOUND = 100, 2.0, 10.0
X_MEAN = np.array([0.90014, -1.17335])
RELEASE = np.array([-38.24398, -6.67830, 3.19974,  # X'Y
                    27.19852,  # Y'Y
                    9.88348, -13.85033, -2.28842,  # X'X (2,1), (3,1), (3,2)
                    2.18818, 3.40915])  # X'X (2,2), (3,3); (1,1) = N carries no noise
mechanism = dp.Laplace(epsilon=10.0, sensitivity=13.0)
print(mechanism)

with pm.Model() as model:
    beta = pm.Normal("beta", 0.0, 2.0, shape=3)
    x = pm.Normal("x", X_MEAN, 1.0, shape=(N, 2))
    y = pm.Normal("y", beta[0] + x @ beta[1:], np.sqrt(SIGMA2), shape=N)
    statistic = dp.regression_statistic(dp.clamp(x, -BOUND, BOUND, scale=True),
                                        dp.clamp(y, -BOUND, BOUND, scale=True))
    mechanism.observe("s", statistic, observed=RELEASE)

start = time.perf_counter()
idata = dp.sample(2000, random_seed=1, progressbar=False, model=model)
seconds = time.perf_counter() - start
draws = idata.posterior["beta"].values.reshape(-1, 3)
ess = az.ess(idata, var_names=["beta"])["beta"].values


def naive_posterior(release):
    """beta | (X'X, X'Y) taken as exact: N(V X'y / sigma^2, V), V = (X'X / sigma^2 + I / 4)^-1,
    on the original scale (x and y were divided by 10)."""
    xy, (x21, x31, x32, x22, x33) = release[:3], release[4:]
    gram = np.array([[N, x21, x31], [x21, x22, x32], [x31, x32, x33]])
    scale = np.diag([1.0, BOUND, BOUND])
    gram, xy = scale @ gram @ scale, BOUND * scale @ xy
    cov = np.linalg.inv(gram / SIGMA2 + np.eye(3) / 4.0)
    return cov @ xy / SIGMA2, np.sqrt(np.diag(cov))


naive_mean, naive_sd = naive_posterior(RELEASE)
print(f"\nbeta | release ({seconds:.1f} s for dp.sample, compilation included; min ESS "
      f"{ess.min():.0f} of {draws.shape[0]} draws):")
print(f"  {'':28s} {'beta0':>16s} {'beta1':>16s} {'beta2':>16s}")
print("  dpinfer mean (sd)          " + "".join(
    f" {m:8.3f} ({s:.3f})" for m, s in zip(draws.mean(0), draws.std(0))))
print("  naive mean (sd)            " + "".join(
    f" {m:8.3f} ({s:.3f})" for m, s in zip(naive_mean, naive_sd)))
print("  (the data-generating beta: -1.795, -2.889, -0.662)")
print(f"\nThe naive sds are {np.round(draws.std(0) / naive_sd, 1)} times too small: the Laplace "
      "noise (scale 1.3 on statistics of size 2-40) is ignored.")
