"""The census model's complete-data score in its split concentrations (dpinfer.io.nmf.split_score):
its first and second derivatives against mpmath's numerical derivatives of the log-gamma sums
written out, and the scan's split of the sum (each county's levels from its own leaves, the
levels above from the counties' sizes and counts) against the whole tree's."""

import mpmath
import numpy as np
import pytest
from scipy.special import logsumexp

from dpinfer.io.nmf.split_score import prior_terms, split_score

C = 3


def tree():
    """24 leaves in 8 tracts in 3 counties in one state: each leaf's group, finest first."""
    tract = np.repeat(np.arange(8), 3)
    county = np.array([0, 0, 0, 1, 1, 2, 2, 2])[tract]
    return [tract, county, np.zeros(24, np.int64)]


def reference(log_size, counts, groups, k, c, theta):
    """f_k[c] of the module docstring at A = exp(theta), in mpmath, from the sums written out."""
    A = mpmath.exp(theta)
    child = np.arange(log_size.size) if k == 0 else groups[k - 1]
    W = np.bincount(child, weights=np.exp(log_size))
    S = np.bincount(child, weights=counts[:, c])
    parent = np.empty(W.size, np.int64)
    parent[child] = groups[k]
    total = mpmath.mpf(0)
    for h in range(parent.max() + 1):
        members = np.flatnonzero(parent == h)
        total += mpmath.loggamma(A) - mpmath.loggamma(A + S[members].sum())
        for j in members:
            a = A * W[j] / W[members].sum()
            total += mpmath.loggamma(a + S[j]) - mpmath.loggamma(a)
    return total


def test_the_score_and_curvature_are_the_derivatives_of_the_splits():
    rng = np.random.default_rng(3)
    groups = tree()
    log_size = rng.normal(0.0, 0.8, size=24)
    counts = rng.poisson(6.0, size=(24, C)).astype(float)
    counts[:5, 1] = 0  # children without counts: no term of their own
    theta = rng.normal(1.0, 1.0, size=(3, C))
    score, curvature = split_score(log_size, counts, groups, theta)
    mpmath.mp.dps = 30
    for k in range(3):
        for c in range(C):
            f = lambda t: reference(log_size, counts, groups, k, c, t)  # noqa: E731
            assert score[k, c] == pytest.approx(float(mpmath.diff(f, theta[k, c])), rel=1e-9, abs=1e-9)
            assert curvature[k, c] == pytest.approx(float(mpmath.diff(f, theta[k, c], 2)), rel=1e-8, abs=1e-9)
    # a common shift of the sizes changes no share
    np.testing.assert_allclose(split_score(log_size + 5.0, counts, groups, theta)[0], score, rtol=1e-12)


def test_the_scans_split_of_the_sum_is_the_whole_trees():
    """Each county's levels (tract, county) from its leaves alone, numbered in the county, and
    the state's from the counties' sizes L = log sum exp v and summed counts: the whole's."""
    rng = np.random.default_rng(4)
    groups = tree()
    log_size = rng.normal(0.0, 1.0, size=24)
    counts = rng.poisson(4.0, size=(24, C)).astype(float)
    theta = rng.normal(2.0, 0.5, size=(3, C))
    whole = split_score(log_size, counts, groups, theta)
    county = groups[1]
    parts = [np.zeros((3, C)), np.zeros((3, C))]
    for q in range(3):
        leaves = county == q
        local = [np.unique(g[leaves], return_inverse=True)[1] for g in groups[:2]]
        for part, value in zip(parts, split_score(log_size[leaves], counts[leaves], local, theta[:2])):
            part[:2] += value
    L = np.array([logsumexp(log_size[county == q]) for q in range(3)])
    X = np.stack([counts[county == q].sum(axis=0) for q in range(3)])
    for part, value in zip(parts, split_score(L, X, [np.zeros(3, np.int64)], theta[2:])):
        part[2:] += value
    for ours, theirs in zip(parts, whole):
        np.testing.assert_allclose(ours, theirs, rtol=1e-11, atol=1e-11)


def test_the_prior_terms_are_the_normal_laws():
    theta = np.array([[0.5, 2.0], [3.5, -1.0]])
    score, curvature = prior_terms(theta)
    np.testing.assert_allclose(score, -(theta - 2.0) / 2.25)
    np.testing.assert_allclose(curvature, -1.0 / 2.25)
