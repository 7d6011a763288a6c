"""GeneralizedGaussian (seed 001 Definition 13): delta computed exactly under Definition 2,
checked against an independent hockey-stick enumeration over releases; the law is the
conditioned discrete Gaussian."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import dpinfer as dp
from dpinfer.mechanisms import PrivacyUnverifiedError

MARGINS_2X2 = dp.Invariants.margins((2, 2), [(0,), (1,)])


@pytest.mark.parametrize("inv", [dp.Invariants.total(2), dp.Invariants.total(3), MARGINS_2X2],
                         ids=["total2", "total3", "2x2"])
@pytest.mark.parametrize("sigma, eps", [(2.0, 1.0), (1.5, 0.5)])
def test_delta_matches_the_release_enumeration(inv, sigma, eps):
    mech = dp.GeneralizedGaussian(sigma, inv, epsilon=eps)
    audit = mech.audit()
    assert audit.holds
    assert audit.measured_delta == pytest.approx(mech.privacy.delta, rel=1e-6, abs=1e-15)


def test_delta_two_cells_closed_form():
    """Total over 2 cells: z = (t, -t), q(t) prop. to exp(-t^2 / sigma^2); Delta = u (1, -1),
    r = sqrt(2) |u|, loss (4 t u + 2 u^2) / (2 sigma^2); the sup over u of the scaled
    hockey-stick divergence, summed directly over t."""
    sigma, eps = 1.7, 0.8
    t = np.arange(-200, 201)
    p = np.exp(-t ** 2 / sigma ** 2)
    p /= p.sum()
    best = 0.0
    for u in range(1, 60):
        r = math.sqrt(2) * u
        loss = (4 * t * u + 2 * u * u) / (2 * sigma ** 2)
        h = np.sum(p * (1 - np.exp(np.minimum(eps * r - loss, 0.0))))
        best = max(best, h * math.expm1(eps) / math.expm1(eps * r))
    assert dp.GeneralizedGaussian(sigma, dp.Invariants.total(2), epsilon=eps).privacy_delta() == \
        pytest.approx(best, rel=1e-9)


def test_delta_decreases_with_sigma_and_epsilon():
    inv = dp.Invariants.total(3)
    deltas = [dp.GeneralizedGaussian(s, inv, epsilon=1.0).privacy_delta() for s in (1.0, 2.0, 4.0)]
    assert deltas[0] > deltas[1] > deltas[2] > 0
    mech = dp.GeneralizedGaussian(2.0, inv, epsilon=1.0)
    assert mech.privacy_delta(0.5) > mech.privacy_delta(1.0) > mech.privacy_delta(2.0)


def test_large_lattices_are_unverified():
    mech = dp.GeneralizedGaussian(3.0, dp.Invariants.margins((4, 4), [(0,), (1,)]), epsilon=1.0)
    with pytest.raises(PrivacyUnverifiedError, match="unverified"):
        mech.privacy


def test_release_law_is_the_lattice_gaussian():
    sigma = 1.5  # an exact binary fraction: the exact sampler stays in int64 arithmetic
    mech = dp.GeneralizedGaussian(sigma, MARGINS_2X2, epsilon=1.0)
    x = np.array([3, 1, 0, 4])
    # 600 releases (the exact integer sampler takes about 18 ms each): the law's variance along
    # the move is estimated to about 6%, so a wrong scale (sigma for sigma / 2 along the move:
    # 4x the variance; sigma^2 for sigma: 2.25x) fails the chi-square with probability > 0.99
    s = np.array([mech.release(x, np.random.default_rng(i)) for i in range(600)])
    assert s.dtype == np.int64 and np.all(MARGINS_2X2.values(s) == MARGINS_2X2.values(x))
    t = (s - x)[:, 0]  # z = t (1, -1, -1, 1), q(t) prop. to exp(-4 t^2 / (2 sigma^2))
    grid = np.arange(-10, 11)
    p = np.exp(-4 * grid ** 2 / (2 * sigma ** 2))
    p /= p.sum()
    counts = np.array([(t == g).sum() for g in grid])
    big = p * t.size >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big] * t.size, p[~big].sum() * t.size)
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    assert mech.log_likelihood(s[0], x) == pytest.approx(
        dp.Conditioned(dp.DiscreteGaussian(sigma), MARGINS_2X2).log_likelihood(s[0], x))


def test_bad_input():
    with pytest.raises(ValueError, match="sigma"):
        dp.GeneralizedGaussian(-1.0, MARGINS_2X2, epsilon=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        dp.GeneralizedGaussian(1.0, MARGINS_2X2, epsilon=0.0)
    with pytest.raises(TypeError, match="invariants"):
        dp.GeneralizedGaussian(1.0, np.ones((1, 4)), epsilon=1.0)
