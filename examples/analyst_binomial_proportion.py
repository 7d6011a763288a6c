"""Analyst's view: a proportion estimated from a privatised count.

A curator releases the number of 'yes' answers among N = 1000 people with double geometric
noise (epsilon = 0.1). The analyst puts a Beta(10, 10) prior on the proportion theta, writes
the ordinary Binomial model for the true count, conditions on the release with the same
mechanism object, and samples with dpinfer. The exact posterior (enumerating the true count)
and the naive posterior (release taken as the count) are printed alongside.
Run: .venv/bin/python examples/analyst_binomial_proportion.py
"""

import numpy as np
import pymc as pm
from scipy import special, stats

import dpinfer as dp

N, EPSILON, RELEASE = 1000, 0.1, 612
mechanism = dp.DoubleGeometric(epsilon=EPSILON)
print(mechanism)

with pm.Model() as model:
    theta = pm.Beta("theta", 10, 10)
    count = pm.Binomial("count", N, theta)
    mechanism.observe("release", count, observed=RELEASE)
    idata = dp.sample(2000, random_seed=1, progressbar=False)

theta_draws = idata.posterior["theta"].values.ravel()
count_draws = idata.posterior["count"].values.ravel()

# Exact: count | release ∝ BetaBinomial(count; N, 10, 10) f(release - count); theta | count is Beta.
x = np.arange(N + 1)
log_w = stats.betabinom.logpmf(x, N, 10, 10) + mechanism.log_likelihood(np.full(x.shape, RELEASE), x)
p = np.exp(log_w - special.logsumexp(log_w))
mean_exact = np.sum(p * (10 + x) / (20 + N))
second = np.sum(p * ((10 + x) * (11 + x)) / ((20 + N) * (21 + N)))
sd_exact = np.sqrt(second - mean_exact**2)
naive = stats.beta(10 + RELEASE, 10 + N - RELEASE)

print(f"\ntheta  dpinfer  mean {theta_draws.mean():.4f}  sd {theta_draws.std():.4f}")
print(f"theta  exact    mean {mean_exact:.4f}  sd {sd_exact:.4f}")
print(f"theta  naive    mean {naive.mean():.4f}  sd {naive.std():.4f}  ({1 - naive.std() / sd_exact:.0%} too narrow)")
lo, hi = np.quantile(count_draws, [0.05, 0.95])
print(f"\ntrue count: posterior median {np.median(count_draws):.0f}, 90% interval [{lo:.0f}, {hi:.0f}]")
print("what dpinfer did:", idata.posterior.attrs["dpinfer"])
