"""A privatised mean (dapper's README example, "B1"): a continuous latent statistic.

n = 100 confidential records y_i ~ N(theta, 1); the curator releases their mean with Gaussian
noise of sd 1/3: s = ybar + N(0, (1/3)^2) = -2.097902. The analyst's prior is theta ~ N(0, 2^2).
The mean is sufficient for theta, so the record-level model reduces to ybar ~ N(theta, 1/100),
a continuous latent observed through the same mechanism object the curator used; ``dp.sample``
sums it out in closed form (s ~ N(theta, sqrt(1/100 + 1/9))), samples theta by NUTS and draws
ybar exactly for every posterior draw.

Exact posterior: s | theta ~ N(theta, 1/100 + 1/9), so theta | s ~ N(0.970612 s, 0.117552).
The naive analysis takes the release as the true mean (s = ybar) and is overconfident: its
posterior variance is 1 / (1/4 + 100) = 0.00998, a twelfth of the right one.
Run: .venv/bin/python examples/privatised_mean.py
"""

import time

import arviz as az
import numpy as np
import pymc as pm

import dpinfer as dp

N, RELEASE, NOISE_SD = 100, -2.097902, 1.0 / 3.0
mechanism = dp.Gaussian.from_sigma(NOISE_SD)
print(mechanism)

with pm.Model() as model:
    theta = pm.Normal("theta", 0.0, 2.0)
    ybar = pm.Normal("ybar", theta, 1.0 / np.sqrt(N))
    mechanism.observe("s", ybar, observed=RELEASE)
start = time.perf_counter()
idata = dp.sample(2000, random_seed=1, progressbar=False, model=model)
seconds = time.perf_counter() - start

# naive: the release taken as the true mean, ybar = s ~ N(theta, 1/100), a conjugate update
naive_var = 1.0 / (0.25 + N)
naive_mean = RELEASE * N * naive_var

exact_var = 1.0 / (0.25 + 1.0 / (1.0 / N + NOISE_SD**2))
exact_mean = RELEASE * exact_var / (1.0 / N + NOISE_SD**2)
draws = idata.posterior["theta"].values.ravel()
ess = float(az.ess(idata, var_names=["theta"])["theta"])
print(f"\ntheta | release, 90% intervals ({seconds:.1f} s for dp.sample, compilation included; "
      f"ESS {ess:.0f}):")
rows = [("dpinfer", draws.mean(), draws.std(), *np.quantile(draws, [0.05, 0.95])),
        ("exact", exact_mean, np.sqrt(exact_var),
         exact_mean - 1.6449 * np.sqrt(exact_var), exact_mean + 1.6449 * np.sqrt(exact_var)),
        ("naive (release = true mean)", naive_mean, np.sqrt(naive_var),
         naive_mean - 1.6449 * np.sqrt(naive_var), naive_mean + 1.6449 * np.sqrt(naive_var))]
for name, mean, sd, lo, hi in rows:
    print(f"  {name:28s} mean {mean:8.4f}  sd {sd:.4f}  [{lo:.3f}, {hi:.3f}]")
print("\nThe naive interval is about 3.4 times too narrow: it ignores the privacy noise, "
      "whose variance (1/9) is eleven times the sampling variance of the mean (1/100).")
