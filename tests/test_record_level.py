"""Record-level releases (issue 13, part 3): latent records, clamped, behind a record-additive
statistic released with continuous noise, sampled jointly with the parameters by NUTS.

Oracle: the exact posterior of theta for two clamped records by quadrature over the law of
the clamped sum (atoms at the bounds, density inside). The statistics helpers against direct
numpy formulas.
"""

import json

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from scipy import stats

import dpinfer as dp
from dpinfer import statistics

LOWER, UPPER, NOISE_SCALE, RELEASE = -1.0, 1.0, 0.5, 1.6


def clamped_sum_likelihood(theta_grid, release, noise_scale, n_nodes=1200):
    """E[Laplace(release - C1 - C2)] for C_i = clamp(y_i, -1, 1), y_i ~ N(theta, 1) iid.

    C has atoms P(C = -1) = Phi(-1 - theta), P(C = 1) = Phi(theta - 1) and density
    phi(c - theta) on (-1, 1); the expectation is the sum over atom/interior combinations,
    the interior integrals by the midpoint rule on n_nodes cells per dimension."""
    lap = stats.laplace(scale=noise_scale)
    h = (UPPER - LOWER) / n_nodes
    c = LOWER + h * (np.arange(n_nodes) + 0.5)
    kernel = lap.pdf(release - c[:, None] - c[None, :])  # free of theta: computed once
    edges = {a: lap.pdf(release - a - c) for a in (LOWER, UPPER)}
    out = np.empty(theta_grid.size)
    for i, theta in enumerate(theta_grid):
        atoms = {LOWER: stats.norm.cdf(LOWER - theta), UPPER: stats.norm.sf(UPPER - theta)}
        dens = stats.norm.pdf(c - theta) * h
        total = sum(pa * pb * lap.pdf(release - a - b) for a, pa in atoms.items() for b, pb in atoms.items())
        total += 2 * sum(pa * (dens @ edges[a]) for a, pa in atoms.items())
        total += dens @ kernel @ dens
        out[i] = total
    return out


def test_two_clamped_records_match_quadrature():
    """theta ~ N(0, 1); y_1, y_2 ~ N(theta, 1) clamped to [-1, 1]; their sum released with
    Laplace noise (scale 0.5). A release of 1.6 puts real mass on the upper atom, so ignoring
    the clamping would bias theta upwards."""
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 1.0)
        y = pm.Normal("y", theta, 1.0, shape=2)
        total = dp.clamp(y, LOWER, UPPER).sum()
        dp.Laplace(1.0 / NOISE_SCALE).observe("s", total, observed=RELEASE)
    idata = dp.sample(3000, tune=1000, chains=2, random_seed=3, progressbar=False, model=model)
    report = json.loads(idata.posterior.attrs["dpinfer"])
    assert report["s"]["engine"] == "compiled"

    grid = np.linspace(-6.0, 6.0, 481)
    post = stats.norm.pdf(grid) * clamped_sum_likelihood(grid, RELEASE, NOISE_SCALE)
    post /= post.sum()
    mean = float((grid * post).sum())
    sd = float(np.sqrt(((grid - mean) ** 2 * post).sum()))
    draws = idata.posterior["theta"].values
    ess = float(az.ess(idata, var_names=["theta"])["theta"])
    assert abs(draws.mean() - mean) < 4.5 * sd / np.sqrt(ess)
    # the variance estimate's sd is about var sqrt((kurtosis - 1) / ESS); posterior kurtosis < 4 here
    assert abs(draws.var() - sd**2) < 4.5 * sd**2 * np.sqrt(3.0 / ess)

    # the naive analysis (release = the unclamped sum, no noise) lands elsewhere:
    # theta | sum ~ N(1.6 / 3, 1 / 3)
    assert abs(RELEASE / 3.0 - mean) > 10 * sd / np.sqrt(ess)


def test_clamp_on_numpy_and_pytensor_agree():
    values = np.array([-12.0, -10.0, -3.5, 0.0, 9.99, 10.0, 25.0])
    expected = np.array([-1.0, -1.0, -0.35, 0.0, 0.999, 1.0, 1.0])
    np.testing.assert_allclose(dp.clamp(values, -10, 10, scale=True), expected)
    np.testing.assert_allclose(dp.clamp(values, 0, 10), np.clip(values, 0, 10))
    np.testing.assert_allclose(dp.clamp(values, 0, 10, scale=True), np.clip(values, 0, 10) / 5 - 1)
    tensor = pt.vector("v")
    np.testing.assert_allclose(dp.clamp(tensor, -10, 10, scale=True).eval({tensor: values}), expected)


@pytest.mark.parametrize("lower, upper", [(1.0, -1.0), (2.0, 2.0)])
def test_clamp_bounds_must_be_ordered(lower, upper):
    with pytest.raises(ValueError, match="lower must be < upper"):
        dp.clamp(np.zeros(3), lower, upper)


def test_clamp_bounds_must_be_finite_numbers():
    with pytest.raises(ValueError, match="upper must be finite"):
        dp.clamp(np.zeros(3), 0.0, np.inf)
    with pytest.raises(TypeError, match="lower must be a real number"):
        dp.clamp(np.zeros(3), "a", 1.0)


def test_regression_statistic_matches_direct_formulas():
    rng = np.random.default_rng(4)
    design = dp.clamp(rng.normal(0.0, 8.0, size=(30, 3)), -10, 10, scale=True)
    response = dp.clamp(rng.normal(0.0, 8.0, size=30), -10, 10, scale=True)
    x = np.column_stack([np.ones(30), design])
    gram = x.T @ x
    expected = np.concatenate([x.T @ response, [response @ response],
                               [gram[1, 0], gram[2, 0], gram[2, 1], gram[3, 0], gram[3, 1], gram[3, 2]],
                               np.diag(gram)[1:]])
    np.testing.assert_allclose(dp.regression_statistic(design, response), expected, rtol=1e-13)
    assert dp.regression_statistic_labels(3) == [
        "XY[1]", "XY[2]", "XY[3]", "XY[4]", "YY", "XX[2,1]", "XX[3,1]", "XX[3,2]", "XX[4,1]",
        "XX[4,2]", "XX[4,3]", "XX[2,2]", "XX[3,3]", "XX[4,4]"]
    d, r = pt.matrix("d", shape=(30, 3)), pt.vector("r", shape=(30,))
    np.testing.assert_allclose(dp.regression_statistic(d, r).eval({d: design, r: response}), expected,
                               rtol=1e-13)


@pytest.mark.parametrize("p", [1, statistics.ELEMENTWISE_COLUMNS, statistics.ELEMENTWISE_COLUMNS + 1])
def test_symbolic_regression_statistic_built_by_columns_or_by_matrices_is_the_curators(p):
    """Up to ELEMENTWISE_COLUMNS covariates the symbolic statistic is built entry by entry,
    beyond it by matrix products: both give the curator's numpy values, and their gradients
    are those of the sum of squares by its closed form d/dX sum_j c_j T_j."""
    rng = np.random.default_rng(p)
    n = 25
    design, response = rng.normal(size=(n, p)), rng.normal(size=n)
    d, r = pt.matrix("d", shape=(n, p)), pt.vector("r", shape=(n,))
    statistic = dp.regression_statistic(d, r)
    expected = dp.regression_statistic(design, response)
    np.testing.assert_allclose(statistic.eval({d: design, r: response}), expected, rtol=1e-12)
    weights = rng.normal(size=expected.size)
    grad_d, grad_r = pytensor.function([d, r], pt.grad(pt.dot(weights, statistic), [d, r]))(design, response)
    step = 1e-6  # central differences of the numpy statistic (a quadratic: exact up to rounding)
    for values, grad in ((design, grad_d), (response, grad_r)):
        flat = values.reshape(-1)
        for i in rng.choice(flat.size, size=6, replace=False):
            up, down = flat.copy(), flat.copy()
            up[i] += step
            down[i] -= step
            args = [(up.reshape(values.shape), response), (down.reshape(values.shape), response)] \
                if values is design else [(design, up), (design, down)]
            numeric = (weights @ dp.regression_statistic(*args[0]) - weights @ dp.regression_statistic(*args[1])) / (2 * step)
            assert grad.reshape(-1)[i] == pytest.approx(numeric, rel=1e-6, abs=1e-8)


def test_regression_statistic_refuses_bad_shapes():
    with pytest.raises(ValueError, match="design must be an n x p matrix"):
        dp.regression_statistic(np.zeros(5), np.zeros(5))
    with pytest.raises(ValueError, match="response must be a vector"):
        dp.regression_statistic(np.zeros((5, 2)), np.zeros((5, 1)))
    with pytest.raises(ValueError, match="design has 5 records but response has 4"):
        dp.regression_statistic(np.zeros((5, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="p must be a whole number"):
        dp.regression_statistic_labels(0)
