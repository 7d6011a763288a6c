"""Seed 000's Theorem 2.1 for noise conditioned on invariants and non-negativity
(dpinfer.mechanisms.conditioned): exact normalisers and the gamma* bound, attained on small
cases."""

import math

import numpy as np
import pytest

import dpinfer as dp
from dpinfer.mechanisms.conditioned import congenial_privacy_audit


def brute_log_normaliser(base, A, x, k):
    """log P(A e = 0, x + e >= 0) by summing over the whole box |e_i| <= k."""
    d = len(x)
    e = np.indices((2 * k + 1,) * d).reshape(d, -1).T - k
    e = e[np.all(e @ A.T == 0, axis=1) & np.all(x + e >= 0, axis=1)]
    return np.logaddexp.reduce(base.noise_logpdf(e).sum(axis=1))


@pytest.mark.parametrize("inv, x, eps", [
    (dp.Invariants.total(3), [0, 2, 5], 1.2),
    (dp.Invariants.groups([0, 0, 1, 1]), [1, 0, 3, 0], 2.5),
    (dp.Invariants.margins((2, 2), [(0,), (1,)]), [0, 3, 2, 1], 2.5),
])
def test_log_normaliser_against_brute_force(inv, x, eps):
    # box |e_i| <= k with tail a^k below 1e-16 relative: k = 40 at eps 1.2, 16 at eps 2.5
    base = dp.DoubleGeometric(eps)
    A = np.asarray(inv.constraint_matrix)
    want = brute_log_normaliser(base, A, np.array(x), k=40 if eps < 2 else 16)
    log_normaliser = dp.Conditioned(base, inv, nonnegative=True).log_normaliser(x)
    assert log_normaliser == pytest.approx(want, abs=1e-12)
    # the convolution path (totals, groups) and the lattice enumeration of an explicit matrix
    # (kind "matrix": no group structure is detected) agree
    general = dp.Invariants.from_matrix(A)
    assert general.group_codes is None
    assert log_normaliser == pytest.approx(
        dp.Conditioned(base, general, nonnegative=True).log_normaliser(x), abs=1e-12)


def test_gamma_closed_form_for_two_cells():
    # 2 cells with a fixed total n, base DoubleGeometric(eps) (sensitivity 1): e = (t, -t) with
    # -x_1 <= t <= x_2, so P_x = c^2 sum a^(2|t|). The worst pair is x = (0, n), x' = (1, n - 1)
    # (distance 2): gamma* = log(P_x' / P_x) / (2 eps), and the loss at s = x attains
    # (1 + gamma*) eps per unit distance: Theorem 2.1's bound is attained.
    eps, n = 1.0, 4
    a = math.exp(-eps)
    p_x = sum(a ** (2 * t) for t in range(0, n + 1))
    p_x2 = sum(a ** (2 * abs(t)) for t in range(-1, n))
    gamma = math.log(p_x2 / p_x) / (2 * eps)
    audit = congenial_privacy_audit(dp.DoubleGeometric(eps), dp.Invariants.total(2), max_true=n)
    assert audit.gamma == pytest.approx(gamma, rel=1e-10)
    assert audit.measured_epsilon == pytest.approx((1 + gamma) * eps, rel=1e-10)
    assert audit.worst_pair[0] in ((0, n), (n, 0)) and audit.holds


@pytest.mark.parametrize("inv", [dp.Invariants.total(3), dp.Invariants.margins((2, 2), [(0,), (1,)])])
def test_theorem_2_1_holds_and_is_attained(inv):
    audit = congenial_privacy_audit(dp.DoubleGeometric(0.8), inv, max_true=3)
    assert audit.holds and 0 < audit.gamma <= 1
    assert audit.measured_epsilon == pytest.approx((1 + audit.gamma) * 0.8, rel=1e-9)


def test_errors():
    with pytest.raises(ValueError, match="at most 4 cells"):
        congenial_privacy_audit(dp.DoubleGeometric(1.0), dp.Invariants.total(5))
    mechanism = dp.Conditioned(dp.DoubleGeometric(1.0), dp.Invariants.total(2), nonnegative=True)
    with pytest.raises(ValueError, match="non-negative"):
        mechanism.log_normaliser([-1, 3])
