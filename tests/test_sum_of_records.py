"""The closed-form moments of a record-additive statistic of normal records
(dpinfer.distributions.sum_of_records) against an independent numerical integral: Gauss-Hermite
over the covariates (the covariates' clamps do not bind, so the integrand is smooth in x) and,
at every node, the clamped response's moments E[c^k | x] by adaptive quadrature (scipy's quad
between the clamp's bounds, the bounds' masses from the normal cdf)."""

import itertools

import numpy as np
import pytensor
import pytest
from scipy import integrate, stats

from dpinfer.distributions.sum_of_records import (
    Clamp,
    NormalRecords,
    power_sum_terms,
    regression_terms,
    simulate_terms,
)


def _response_moment(mean, sd, clamp: Clamp, k: int) -> float:
    """E[c^k] for y ~ N(mean, sd), c = clamp.apply(y), by quadrature."""
    def c_power(y):
        return clamp.apply(np.asarray(y)) ** k

    if not clamp.binds:
        return float(stats.norm.moment(k, loc=mean, scale=sd)) if k else 1.0
    lower, upper = clamp.lower, clamp.upper
    middle = integrate.quad(lambda y: c_power(y) * stats.norm.pdf(y, mean, sd),
                            max(lower, mean - 12 * sd), min(upper, mean + 12 * sd),
                            epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    tails = 0.0
    if np.isfinite(lower):
        tails += c_power(lower) * stats.norm.cdf(lower, mean, sd)
    if np.isfinite(upper):
        tails += c_power(upper) * stats.norm.sf(upper, mean, sd)
    return middle + tails


def _reference_moments(pars: dict, terms, nodes: int = 40):
    p = len(pars["alpha_x"])
    z, weights = np.polynomial.hermite_e.hermegauss(nodes)
    weights = weights / weights.sum()
    grid = list(itertools.product(range(nodes), repeat=p))
    powers = 2 * max(t.power for t in terms)
    means = np.zeros(len(terms))
    second = np.zeros((len(terms), len(terms)))
    for point in grid:
        x = pars["mu_x"] + pars["sigma_x"] * z[list(point)]
        weight = np.prod(weights[list(point)])
        v = np.concatenate([[1.0], pars["alpha_x"] * x + pars["gamma_x"]])
        mean_y = pars["a"] + x @ pars["b"]
        h = [_response_moment(mean_y, pars["sigma"], pars["clamp"], k) for k in range(powers + 1)]
        for i, s in enumerate(terms):
            means[i] += weight * np.prod(v[list(s.covariates)]) * h[s.power]
            for j, t in enumerate(terms):
                second[i, j] += weight * np.prod(v[list(s.covariates + t.covariates)]) * h[s.power + t.power]
    return means, second - np.outer(means, means)


CASES = {
    "power sums of a scaled clamp": (0, Clamp(-1.0, 3.0, True), "power sums"),
    "one covariate, clamped response": (1, Clamp(-5.0, 5.0, False), "regression"),
    "two covariates, heavy scaled clamp": (2, Clamp(-0.5, 1.0, True), "regression"),
    "one-sided clamp": (1, Clamp(0.0, np.inf, False), "regression"),
    "no clamp": (2, Clamp(), "regression"),
}


@pytest.mark.parametrize("case", CASES)
def test_moments_match_numerical_integration(case):
    p, clamp, kind = CASES[case]
    rng = np.random.default_rng(len(case))
    pars = dict(mu_x=rng.normal(size=p), sigma_x=rng.uniform(0.5, 1.5, size=p), a=0.7,
                b=rng.normal(size=p) * 1.5, sigma=1.3, clamp=clamp,
                alpha_x=np.full(p, 0.3), gamma_x=np.full(p, 0.1))
    terms = power_sum_terms(3) if kind == "power sums" else regression_terms(p)
    mean, cov = pytensor.function([], list(NormalRecords(**pars).moments(terms)), mode="FAST_COMPILE")()
    ref_mean, ref_cov = _reference_moments(pars, terms, nodes=30 if p < 2 else 14)
    scale = np.sqrt(np.diag(ref_cov))
    np.testing.assert_allclose(mean / scale, ref_mean / scale, atol=1e-7)
    np.testing.assert_allclose(cov / np.outer(scale, scale), ref_cov / np.outer(scale, scale), atol=1e-7)


def test_simulated_terms_have_the_moments():
    """The simulator (the normal law's measured error uses it) draws from the same model:
    its sample means within 4 standard errors of the closed form."""
    rng = np.random.default_rng(3)
    pars = dict(mu_x=np.array([0.5, -1.0]), sigma_x=np.array([1.0, 0.7]), a=1.0, b=np.array([2.0, -0.5]),
                sigma=1.0, clamp=Clamp(-5.0, 5.0, True), alpha_x=np.full(2, 0.2), gamma_x=np.zeros(2))
    terms = regression_terms(2)
    mean, _ = pytensor.function([], list(NormalRecords(**pars).moments(terms)), mode="FAST_COMPILE")()
    draws = simulate_terms(pars, terms, 400_000, rng)
    z = (draws.mean(0) - mean) / (draws.std(0) / np.sqrt(len(draws)))
    assert np.abs(z).max() < 4.0
