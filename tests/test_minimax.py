"""Seed 003 (Gupte & Sundararajan, PODS 2010): minimax consumers, optimal remaps, optimal
mechanisms and derivability from the geometric mechanism, against the reference note's exact
test vectors (fractions), closed forms and exhaustive enumeration.

Tolerances: matrices built from exact laws carry float round-off (~1e-16 per entry, so 1e-14
on sums of a few products); LP values are solved with HiGHS feasibility tolerances 1e-10 on
losses of size <= ~20, so 1e-9 absolute covers them (observed: ~1e-15).
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from fractions import Fraction as F

import numpy as np
import pytest

from dpinfer.mechanisms import ClampedGeometric, DoubleGeometric, Laplace
from dpinfer.utility.consumers import (
    Consumer,
    NonMonotoneLossWarning,
    absolute_loss,
    asymmetric_linear_loss,
    bayes_risk,
    is_monotone_loss,
    loss_matrix,
    minimax_risk,
    power_loss,
    risk_profile,
    squared_loss,
    threshold_loss,
    zero_one_loss,
)
from dpinfer.utility.derivability import (
    clamped_to_range,
    derivable_transform,
    geometric_inverse,
    geometric_matrix,
    is_derivable,
    mechanism_matrix,
)
from dpinfer.utility.remap import (
    bayes_optimal_mechanism,
    bayes_remap,
    best_deterministic_remap,
    optimal_mechanism,
    optimal_remap,
)

LP_TOL = 1e-9


def exact_geometric(n: int, a: F) -> list[list[F]]:
    """G_{n,a} in fractions from the note's formula sheet (§12): a^|z-k|/(1+a) at z in {0, n},
    (1-a)/(1+a) a^|z-k| inside."""
    return [
        [a ** abs(z - k) / (1 + a) if z in (0, n) else (1 - a) / (1 + a) * a ** abs(z - k)
         for z in range(n + 1)]
        for k in range(n + 1)
    ]


def exact_product(A, B) -> list[list[F]]:
    """A B in exact arithmetic (lists of fractions)."""
    return [[sum(A[i][j] * B[j][k] for j in range(len(B))) for k in range(len(B[0]))] for i in range(len(A))]


def as_float(matrix) -> np.ndarray:
    return np.array([[float(v) for v in row] for row in matrix])


def dp_violation(X: np.ndarray, alpha: float) -> float:
    """Largest violation of alpha x[i, r] <= x[i+1, r] and alpha x[i+1, r] <= x[i, r]
    (paper Definition 2), as a difference (no division, zero columns allowed)."""
    return float(max(np.max(alpha * X[:-1] - X[1:]), np.max(alpha * X[1:] - X[:-1])))


def clamp_remap(n: int, S) -> np.ndarray:
    """The note's 'reasonable rule' (Example 1): report clip(r, min S, max S)."""
    T = np.zeros((n + 1, n + 1))
    T[np.arange(n + 1), np.clip(np.arange(n + 1), min(S), max(S))] = 1.0
    return T


def random_monotone_loss(rng: np.random.Generator, n: int, symmetric: bool) -> np.ndarray:
    """l(i, r) = c_i + (sum of the first |i - r| increments on r's side of i); increments are
    exponential or 0 (plateaus); symmetric: the same increments on both sides (reading (a)
    of pitfall P7), else separate sides (reading (b), asymmetric)."""
    L = np.zeros((n + 1, n + 1))
    for i in range(n + 1):
        right = rng.exponential(size=n) * (rng.random(n) > 0.3)
        left = right if symmetric else rng.exponential(size=n) * (rng.random(n) > 0.3) * rng.uniform(0.2, 5.0)
        base = rng.exponential() * (rng.random() < 0.3)
        L[i, i] = base
        L[i, i + 1 :] = base + np.cumsum(right)[: n - i]
        L[i, :i] = (base + np.cumsum(left)[:i])[::-1]
    return L


def random_side_information(rng: np.random.Generator, n: int) -> tuple[list[int], bool]:
    """A non-empty S ⊆ {0..n}: an interval half the time, else a random subset; returns
    (S, contiguous)."""
    if rng.random() < 0.5:
        lo = int(rng.integers(0, n + 1))
        S = list(range(lo, int(rng.integers(lo, n + 1)) + 1))
    else:
        S = []
        while not S:
            S = [i for i in range(n + 1) if rng.random() < 0.5]
    return S, S == list(range(S[0], S[-1] + 1))


# --- the geometric mechanism, its inverse and Table 1 -----------------------------------------

G_3_QUARTER = [
    [F(4, 5), F(3, 20), F(3, 80), F(1, 80)],
    [F(1, 5), F(3, 5), F(3, 20), F(1, 20)],
    [F(1, 20), F(3, 20), F(3, 5), F(1, 5)],
    [F(1, 80), F(3, 80), F(3, 20), F(4, 5)],
]


def test_geometric_matrix_is_table_1_and_the_clamped_geometric_law():
    G = geometric_matrix(3, 0.25)
    np.testing.assert_allclose(G, as_float(G_3_QUARTER), rtol=1e-14, atol=0)
    assert exact_geometric(3, F(1, 4)) == G_3_QUARTER
    for n, a in [(1, F(1, 3)), (5, F(1, 2)), (9, F(7, 10)), (20, F(1, 20))]:
        expected = as_float(exact_geometric(n, a))
        np.testing.assert_allclose(geometric_matrix(n, float(a)), expected, rtol=1e-13, atol=0)
    # one source of truth: the same matrix as the mechanism's own law
    np.testing.assert_array_equal(G, ClampedGeometric(math.log(4.0), 0, 3).transition_matrix())
    # alpha-DP with the bound attained: max adjacent |log ratio| = ln 4 (note §9 test 1)
    assert np.max(np.abs(np.diff(np.log(G), axis=0))) == pytest.approx(math.log(4.0), rel=1e-13)


def test_closed_form_inverse():
    inv = geometric_inverse(3, 0.25)
    expected = [[F(4, 3), F(-1, 3), 0, 0], [F(-4, 9), F(17, 9), F(-4, 9), 0],
                [0, F(-4, 9), F(17, 9), F(-4, 9)], [0, 0, F(-1, 3), F(4, 3)]]  # note §5
    np.testing.assert_allclose(inv, as_float(expected), rtol=1e-15, atol=0)
    for n, a in [(1, 0.3), (2, 0.5), (7, 0.1), (30, 0.9), (60, 0.6)]:
        G = geometric_matrix(n, a)
        # entries of G^-1 are <= (1 + a)^2/(1 - a)^2, so round-off in G^-1 G is ~1e-16 times that
        scale = (1 + a) ** 2 / (1 - a) ** 2
        np.testing.assert_allclose(geometric_inverse(n, a) @ G, np.eye(n + 1), rtol=0, atol=1e-14 * scale)
        np.testing.assert_allclose(G @ geometric_inverse(n, a), np.eye(n + 1), rtol=0, atol=1e-14 * scale)
    # the closed form is exact: in fractions G^-1 G is the identity (n = 4, a = 2/7)
    a, n = F(2, 7), 4
    Gx = exact_geometric(n, a)
    inv_x = [[F(0)] * (n + 1) for _ in range(n + 1)]
    inv_x[0][0] = inv_x[n][n] = 1 / (1 - a)
    inv_x[0][1] = inv_x[n][n - 1] = -a / (1 - a)
    for i in range(1, n):
        inv_x[i][i - 1] = inv_x[i][i + 1] = -a / (1 - a) ** 2
        inv_x[i][i] = (1 + a * a) / (1 - a) ** 2
    product = [[sum(inv_x[i][j] * Gx[j][k] for j in range(n + 1)) for k in range(n + 1)] for i in range(n + 1)]
    assert product == [[F(int(i == k)) for k in range(n + 1)] for i in range(n + 1)]
    np.testing.assert_allclose(geometric_inverse(n, float(a)), as_float(inv_x), rtol=1e-15, atol=0)


def test_table_1_raw_and_optimal_remap():
    G = geometric_matrix(3, 0.25)
    consumer = Consumer("absolute")
    np.testing.assert_allclose(risk_profile(G, "absolute"), [21 / 80, 9 / 20, 9 / 20, 21 / 80], rtol=1e-14)
    assert minimax_risk(G, consumer) == pytest.approx(9 / 20, rel=1e-14)

    remap = optimal_remap(G, consumer)
    T_star = [[F(68, 83), F(15, 83), 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, F(15, 83), F(68, 83)]]
    X_star = [[F(272, 415), F(489, 1660), F(33, 830), F(17, 1660)],
              [F(68, 415), F(264, 415), F(66, 415), F(17, 415)],
              [F(17, 415), F(66, 415), F(264, 415), F(68, 415)],
              [F(17, 1660), F(33, 830), F(489, 1660), F(272, 415)]]
    # X* = G T* in exact arithmetic (note §7)
    assert exact_product(G_3_QUARTER, T_star) == X_star
    assert remap.risk == pytest.approx(168 / 415, abs=LP_TOL)
    np.testing.assert_allclose(remap.transform, as_float(T_star), atol=LP_TOL)  # unique optimum (note §7)
    np.testing.assert_allclose(remap.mechanism, as_float(X_star), atol=LP_TOL)
    np.testing.assert_allclose(risk_profile(remap.mechanism, "absolute"), [168 / 415] * 4, atol=LP_TOL)

    # the LP of §4.2 returns the same value and, the optimum being unique, the same X*
    designed = optimal_mechanism(3, 0.25, consumer)
    assert designed.risk == pytest.approx(168 / 415, abs=LP_TOL)
    np.testing.assert_allclose(designed.matrix, as_float(X_star), atol=1e-8)

    # the paper's printed T (9/11, 2/11) is slightly suboptimal: 357/880 (erratum P5)
    T_paper = as_float([[F(9, 11), F(2, 11), 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, F(2, 11), F(9, 11)]])
    np.testing.assert_allclose(
        risk_profile(G @ T_paper, consumer), [357 / 880, 89 / 220, 89 / 220, 357 / 880], rtol=1e-14
    )
    assert minimax_risk(G @ T_paper, consumer) == pytest.approx(357 / 880, rel=1e-14)

    # no deterministic remap does better than the identity: 9/20 > 168/415 (note §9 test 11)
    best = best_deterministic_remap(G, consumer)
    assert best.risk == pytest.approx(9 / 20, rel=1e-14)
    np.testing.assert_array_equal(best.transform, np.eye(4))


# --- Theorem 2 and Lemma 3 ------------------------------------------------------------------------


def test_appendix_b_is_dp_but_not_derivable():
    M = [[F(1, 9), F(2, 9), F(4, 9), F(2, 9)], [F(2, 9), F(1, 9), F(2, 9), F(4, 9)],
         [F(4, 9), F(2, 9), F(1, 9), F(2, 9)], [F(13, 18), F(1, 9), F(1, 18), F(1, 9)]]
    # exactly 1/2-DP: adjacent ratios in [1/2, 2] in every column
    assert all(F(1, 2) <= M[i + 1][r] / M[i][r] <= 2 for i in range(3) for r in range(4))
    expected = [[0, F(1, 3), F(2, 3), 0], [0, F(-1, 3), 0, F(4, 3)], [F(1, 3), F(2, 3), 0, 0], [1, 0, 0, 0]]
    T = derivable_transform(as_float(M), 0.5)
    np.testing.assert_allclose(T, as_float(expected), atol=1e-14)
    assert T[1, 1] == pytest.approx(-1 / 3, abs=1e-14)
    assert not is_derivable(as_float(M), 0.5)
    # the violated three-term condition (Theorem 2) on column 1, rows 0..2
    assert (1 + F(1, 4)) * M[1][1] - F(1, 2) * (M[0][1] + M[2][1]) == F(-3, 4) / 9
    # anything of the form G T with T stochastic passes (note §9 test 5)
    rng = np.random.default_rng(3)
    for n in (1, 3, 8):
        T = rng.dirichlet(np.ones(n + 1), size=n + 1)
        assert is_derivable(geometric_matrix(n, 0.4) @ T, 0.4)
        np.testing.assert_allclose(derivable_transform(geometric_matrix(n, 0.4) @ T, 0.4), T, atol=1e-13)


def test_lemma_3_adding_privacy():
    T = derivable_transform(geometric_matrix(3, 0.5), 0.25)
    exact = [[F(7, 9), F(1, 9), F(1, 18), F(1, 18)], [F(7, 27), F(13, 27), F(7, 54), F(7, 54)],
             [F(7, 54), F(7, 54), F(13, 27), F(7, 27)], [F(1, 18), F(1, 18), F(1, 9), F(7, 9)]]  # note §7
    np.testing.assert_allclose(T, as_float(exact), atol=1e-14)
    G_half = [[F(2, 3), F(1, 6), F(1, 12), F(1, 12)], [F(1, 3), F(1, 3), F(1, 6), F(1, 6)],
              [F(1, 6), F(1, 6), F(1, 3), F(1, 3)], [F(1, 12), F(1, 12), F(1, 6), F(2, 3)]]
    assert exact_product(G_3_QUARTER, exact) == G_half
    assert exact_geometric(3, F(1, 2)) == G_half
    # random n <= 15, alpha < beta: stochastic; the reverse order is not (note §9 test 6)
    rng = np.random.default_rng(11)
    for _ in range(40):
        n = int(rng.integers(1, 16))
        alpha, beta = np.sort(rng.uniform(0.02, 0.98, size=2))
        T = derivable_transform(geometric_matrix(n, beta), alpha)
        assert T.min() >= -1e-12
        np.testing.assert_allclose(T.sum(axis=1), 1.0, atol=1e-12)
        assert is_derivable(geometric_matrix(n, beta), alpha)
        assert derivable_transform(geometric_matrix(n, alpha), beta).min() < -1e-6
        assert not is_derivable(geometric_matrix(n, alpha), beta)


def test_post_processing_preserves_dp():
    rng = np.random.default_rng(5)
    M_b = as_float([[F(1, 9), F(2, 9), F(4, 9), F(2, 9)], [F(2, 9), F(1, 9), F(2, 9), F(4, 9)],
                    [F(4, 9), F(2, 9), F(1, 9), F(2, 9)], [F(13, 18), F(1, 9), F(1, 18), F(1, 9)]])
    cases = [(M_b, 0.5), (geometric_matrix(6, 0.3), 0.3)]
    for _ in range(20):
        n = int(rng.integers(1, 8))
        alpha = float(rng.uniform(0.05, 0.95))
        S, _ = random_side_information(rng, n)
        Y = optimal_mechanism(n, alpha, Consumer(random_monotone_loss(rng, n, symmetric=False), S)).matrix
        assert dp_violation(Y, alpha) <= 1e-9  # the LP's output is alpha-DP (solver tolerance 1e-10)
        cases.append((Y, alpha))
    for Y, alpha in cases:
        for _ in range(5):
            T = rng.dirichlet(np.full(Y.shape[1], 0.5), size=Y.shape[1])
            T[rng.random(T.shape) < 0.3] = 0.0  # sparse remaps too
            T[np.arange(T.shape[0]), rng.integers(0, T.shape[1], T.shape[0])] += 1e-3
            T /= T.sum(axis=1, keepdims=True)
            assert dp_violation(Y @ T, alpha) <= 1e-9


# --- the §8 table ---------------------------------------------------------------------------------

SECTION_8 = [
    # n, alpha, S, loss, LP = G + remap, raw G, clamp to [min S, max S], best deterministic remap;
    # fractions are exact, strings are the note's decimals
    (3, F(1, 4), range(4), "absolute", F(168, 415), F(9, 20), F(9, 20), F(9, 20)),
    (3, F(1, 4), range(4), "squared", F(44, 87), F(11, 20), F(11, 20), F(11, 20)),
    (3, F(1, 4), range(4), "zero-one", F(9, 25), F(2, 5), F(2, 5), F(2, 5)),
    (5, F(1, 2), range(2, 6), "absolute", F(28, 39), F(13, 12), F(5, 6), F(19, 24)),
    (5, F(1, 2), range(2, 6), "squared", F(5, 4), F(25, 12), F(5, 4), F(5, 4)),
    (5, F(1, 2), range(2, 6), "zero-one", F(5, 9), F(2, 3), F(2, 3), F(2, 3)),
    (5, F(1, 2), range(6), "absolute", F(212, 231), F(13, 12), F(13, 12), F(13, 12)),
    (5, F(1, 2), range(6), "squared", F(124, 67), F(25, 12), F(25, 12), F(25, 12)),
    (5, F(1, 2), range(6), "zero-one", F(13, 21), F(2, 3), F(2, 3), F(2, 3)),
    (4, F(3, 10), [1, 3], "absolute", F(3, 10), F(717, 1300), F(3, 10), F(3, 10)),
    (4, F(3, 10), [1, 3], "squared", F(57, 130), F(201, 260), F(57, 130), F(57, 130)),
    (4, F(3, 10), [1, 3], "zero-one", F(3, 20), F(6, 13), F(3, 13), F(3, 13)),
    (6, F(4, 5), range(7), "absolute", "1.81772849", F(488, 225), F(488, 225), "1.97152"),
    (6, F(4, 5), range(7), "squared", "6.65916444", "7.76661333", "7.76661333", "6.65916444"),
    (6, F(4, 5), range(7), "zero-one", "0.79608483", F(8, 9), F(8, 9), F(8, 9)),
]


def expect(value, tol: float):
    """pytest.approx of a table entry: a fraction to ``tol``; a printed decimal to half a unit
    in its last digit (e.g. "1.97152" to 5e-6)."""
    if isinstance(value, str):
        tol = 0.5 * 10.0 ** -len(value.split(".")[1])
    return pytest.approx(float(F(value)), abs=tol)


@pytest.mark.parametrize("n, alpha, S, loss, lp, raw, clamp, best", SECTION_8)
def test_section_8_table(n, alpha, S, loss, lp, raw, clamp, best):
    consumer = Consumer(loss, S)
    G = geometric_matrix(n, float(alpha))
    assert optimal_mechanism(n, float(alpha), consumer).risk == expect(lp, LP_TOL)
    assert optimal_remap(G, consumer).risk == expect(lp, LP_TOL)
    assert minimax_risk(G, consumer) == expect(raw, 1e-13)
    assert minimax_risk(G @ clamp_remap(n, S), consumer) == expect(clamp, 1e-13)
    assert best_deterministic_remap(G, consumer).risk == expect(best, 1e-13)


def test_section_8_single_point_side_information():
    G = geometric_matrix(6, 0.8)
    for loss in ("absolute", "squared", "zero-one"):
        consumer = Consumer(loss, [3])
        assert optimal_mechanism(6, 0.8, consumer).risk == pytest.approx(0.0, abs=LP_TOL)
        assert optimal_remap(G, consumer).risk == pytest.approx(0.0, abs=LP_TOL)
        assert minimax_risk(G, consumer) > 0.1
        assert minimax_risk(G @ clamp_remap(6, [3]), consumer) == 0.0
        best = best_deterministic_remap(G, consumer)
        assert best.risk == 0.0
        np.testing.assert_array_equal(best.transform[:, 3], 1.0)


def test_section_8_worked_remap_n5():
    """The note's optimal T for n = 5, alpha = 1/2, S = {2..5}, |i - r| has the stated row risks
    [215/78, 62/39, 28/39, 28/39, 28/39, 28/39], and the clamp and raw profiles are as stated."""
    G = geometric_matrix(5, 0.5)
    T = np.zeros((6, 6))
    T[0, 2], T[0, 3] = 1 / 13, 12 / 13
    T[1, 2] = T[2, 2] = T[3, 3] = T[4, 4] = 1.0
    T[5, 4], T[5, 5] = 3 / 13, 10 / 13
    np.testing.assert_allclose(
        risk_profile(G @ T, "absolute"), [215 / 78, 62 / 39, 28 / 39, 28 / 39, 28 / 39, 28 / 39], rtol=1e-14
    )
    np.testing.assert_allclose(
        risk_profile(G @ clamp_remap(5, [2, 5]), "absolute")[2:], [7 / 12, 5 / 6, 5 / 6, 7 / 12], rtol=1e-14
    )
    np.testing.assert_allclose(
        risk_profile(G, "absolute"), [31 / 48, 23 / 24, 13 / 12, 13 / 12, 23 / 24, 31 / 48], rtol=1e-14
    )


def test_minimax_consumers_need_randomisation():
    """n = 4, alpha = 0.3, S = {1, 3}, 0-1 loss (note §8): 3/20 with the randomised T of the note,
    while every one of the 5^5 deterministic maps has risk >= 3/13."""
    G = geometric_matrix(4, 0.3)
    consumer = Consumer("zero-one", {1, 3})
    T_note = np.zeros((5, 5))
    T_note[0, 1] = T_note[1, 1] = T_note[3, 3] = T_note[4, 3] = 1.0
    T_note[2, 1] = T_note[2, 3] = 0.5
    np.testing.assert_allclose(risk_profile(G @ T_note, consumer)[[1, 3]], [3 / 20, 3 / 20], rtol=1e-14)
    remap = optimal_remap(G, consumer)
    assert remap.risk == pytest.approx(3 / 20, abs=LP_TOL)
    np.testing.assert_allclose(remap.transform.sum(axis=1), 1.0, atol=1e-12)
    assert remap.transform.min() >= 0.0
    L = zero_one_loss(4)
    deterministic = min(
        max(sum(G[i, r] * L[i, f[r]] for r in range(5)) for i in (1, 3))
        for f in itertools.product(range(5), repeat=5)
    )
    assert deterministic == pytest.approx(3 / 13, rel=1e-14)
    assert best_deterministic_remap(G, consumer).risk == pytest.approx(3 / 13, rel=1e-14)


def test_best_deterministic_remap_matches_brute_force():
    """Exhaustive enumeration with itertools (no pruning, no dominance) on random small cases,
    including non-monotone losses and non-square mechanisms' worth of zero columns."""
    rng = np.random.default_rng(17)
    for trial in range(40):
        n = int(rng.integers(1, 5))
        S, _ = random_side_information(rng, n)
        L = rng.random((n + 1, n + 1)) if trial % 2 else random_monotone_loss(rng, n, symmetric=False)
        Y = rng.dirichlet(np.full(n + 1, 0.7), size=n + 1)
        Y[:, rng.random(n + 1) < 0.2] = 0.0  # some releases never happen
        Y[:, 0] += 1e-3
        Y /= Y.sum(axis=1, keepdims=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonMonotoneLossWarning)
            consumer = Consumer(L, S)
        brute = min(
            max(sum(Y[i, r] * L[i, f[r]] for r in range(n + 1)) for i in S)
            for f in itertools.product(range(n + 1), repeat=n + 1)
        )
        found = best_deterministic_remap(Y, consumer)
        assert found.risk == pytest.approx(brute, rel=1e-12, abs=1e-15)
        assert set(np.unique(found.transform)) <= {0.0, 1.0}
        # the randomised optimum is never worse than the best deterministic map
        assert optimal_remap(Y, consumer).risk <= found.risk + LP_TOL


# --- Theorem 1: universality ------------------------------------------------------------------


def test_universality_on_random_monotone_consumers():
    """Theorem 1 part 2: for 320 random monotone consumers (n <= 8, any S, symmetric and
    asymmetric losses, plateaus) the geometric mechanism plus the consumer's optimal remap
    reaches the tailored alpha-DP optimum, to 1e-7 relative (note §9 tests 7-8)."""
    rng = np.random.default_rng(2010)
    builders = [
        "absolute", "squared", "zero-one",
        functools.partial(threshold_loss, t=1), functools.partial(power_loss, p=0.5),
        functools.partial(power_loss, p=3.0), functools.partial(asymmetric_linear_loss, under=1.0, over=4.0),
    ]
    gaps, kinds = [], {"non-contiguous": 0, "asymmetric": 0, "built-in": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonMonotoneLossWarning)  # every loss here is monotone
        for trial in range(320):
            n = int(rng.integers(1, 9))
            alpha = float(rng.uniform(0.05, 0.95))
            S, contiguous = random_side_information(rng, n)
            if trial % 5 == 0:
                loss = builders[int(rng.integers(len(builders)))]
                kinds["built-in"] += 1
            else:
                symmetric = bool(rng.random() < 0.4)
                loss = random_monotone_loss(rng, n, symmetric)
                kinds["asymmetric"] += not symmetric
                assert is_monotone_loss(loss)
            kinds["non-contiguous"] += not contiguous
            consumer = Consumer(loss, S)
            lp = optimal_mechanism(n, alpha, consumer).risk
            remap = optimal_remap(geometric_matrix(n, alpha), consumer).risk
            gaps.append(abs(remap - lp) / max(abs(lp), 1e-5))
    assert min(kinds.values()) >= 50, kinds
    assert max(gaps) <= 1e-7


def test_non_monotone_losses_break_universality():
    """Negative control (note §9 test 9): with random non-monotone losses the consumer is warned,
    G plus remap is never better than the LP optimum (G T is alpha-DP), and for some consumers
    it is strictly worse."""
    rng = np.random.default_rng(9)
    gaps = []
    for _ in range(60):
        n = int(rng.integers(2, 7))
        alpha = float(rng.uniform(0.05, 0.95))
        L = rng.random((n + 1, n + 1))
        S = list(range(n + 1))
        assert not is_monotone_loss(L)
        with pytest.warns(NonMonotoneLossWarning, match="Theorem 1"):
            consumer = Consumer(L, S)
        lp = optimal_mechanism(n, alpha, consumer).risk
        remap = optimal_remap(geometric_matrix(n, alpha), consumer).risk
        assert remap >= lp - LP_TOL
        gaps.append((remap - lp) / lp)
    assert max(gaps) > 1e-6
    assert sum(g > 1e-6 for g in gaps) >= 3


# --- Bayesian consumers -------------------------------------------------------------------------


def test_bayes_remap_is_the_exhaustive_optimum():
    """bayes_remap's deterministic map minimises the Bayes risk over all (n+1)^(n+1) maps."""
    rng = np.random.default_rng(23)
    for _ in range(30):
        n = int(rng.integers(1, 5))
        alpha = float(rng.uniform(0.05, 0.95))
        prior = rng.dirichlet(np.ones(n + 1))
        L = random_monotone_loss(rng, n, symmetric=False)
        G = geometric_matrix(n, alpha)
        brute = min(
            sum(prior[i] * G[i, r] * L[i, f[r]] for i in range(n + 1) for r in range(n + 1))
            for f in itertools.product(range(n + 1), repeat=n + 1)
        )
        remap = bayes_remap(G, prior, L)
        assert remap.risk == pytest.approx(brute, rel=1e-12)
        assert remap.risk == pytest.approx(bayes_risk(remap.mechanism, prior, L), rel=1e-14)
        assert set(np.unique(remap.transform)) <= {0.0, 1.0}


def test_bayes_universality():
    """Ghosh, Roughgarden & Sundararajan (2009), note §9 test 18: G plus the deterministic Bayes
    remap equals the Bayes-optimal alpha-DP LP for random priors (some with zeros) and random
    monotone losses (symmetric and asymmetric), to 1e-7 relative."""
    rng = np.random.default_rng(2009)
    gaps = []
    for trial in range(150):
        n = int(rng.integers(1, 9))
        alpha = float(rng.uniform(0.05, 0.95))
        prior = rng.dirichlet(np.full(n + 1, 0.5))
        if trial % 3 == 0:
            prior[rng.random(n + 1) < 0.3] = 0.0
            prior = prior / prior.sum() if prior.sum() > 0 else np.full(n + 1, 1.0 / (n + 1))
        L = random_monotone_loss(rng, n, symmetric=bool(trial % 2))
        best = bayes_optimal_mechanism(n, alpha, prior, L)
        assert dp_violation(best.matrix, alpha) <= 1e-9
        remap = bayes_remap(geometric_matrix(n, alpha), prior, L)
        gaps.append(abs(remap.risk - best.risk) / max(best.risk, 1e-5))
    assert max(gaps) <= 1e-7


# --- losses, consumers, mechanism matrices --------------------------------------------------------


def test_loss_builders():
    i, r = np.meshgrid(np.arange(5), np.arange(5), indexing="ij")
    np.testing.assert_array_equal(absolute_loss(4), np.abs(i - r))
    np.testing.assert_array_equal(squared_loss(4), (i - r) ** 2)
    np.testing.assert_array_equal(zero_one_loss(4), (i != r).astype(float))
    np.testing.assert_array_equal(threshold_loss(4, 0), zero_one_loss(4))
    np.testing.assert_array_equal(threshold_loss(4, 2), (np.abs(i - r) > 2).astype(float))
    np.testing.assert_allclose(power_loss(4, 1.5), np.abs(i - r) ** 1.5, rtol=1e-15)
    asymmetric = np.where(r < i, 2.0 * (i - r), 0.5 * (r - i))
    np.testing.assert_array_equal(asymmetric_linear_loss(4, 2.0, 0.5), asymmetric)
    np.testing.assert_array_equal(loss_matrix("squared", 4), squared_loss(4))
    np.testing.assert_array_equal(loss_matrix(functools.partial(threshold_loss, t=1), 4), threshold_loss(4, 1))
    for L in (absolute_loss(6), squared_loss(6), zero_one_loss(6), threshold_loss(6, 2), power_loss(6, 0.3),
              asymmetric_linear_loss(6, 3.0, 0.1)):
        assert is_monotone_loss(L)


def test_monotonicity_reading_b_and_the_warning_policy():
    L = absolute_loss(4)
    L[2, 0] = 0.5  # row 2: 0.5 at r = 0 < 1 at r = 1, moving away from i = 2
    assert not is_monotone_loss(L)
    assert is_monotone_loss(L, rows=[0, 1, 3, 4])
    with pytest.warns(NonMonotoneLossWarning):
        Consumer(L)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonMonotoneLossWarning)
        Consumer(L, [0, 1, 3])  # row 2 never enters this consumer's risk
        consumer = Consumer(functools.partial(asymmetric_linear_loss, under=5.0, over=1.0), [0, 4])
        consumer.loss_matrix(4)
    with pytest.warns(NonMonotoneLossWarning):
        Consumer(lambda n: -absolute_loss(n)).loss_matrix(3)


def test_consumer_attributes():
    consumer = Consumer("absolute", {3, 1})
    assert consumer.side_information == (1, 3)
    assert consumer.name == "absolute, S={1, 3}"
    np.testing.assert_array_equal(consumer.side_set(5), [1, 3])
    np.testing.assert_array_equal(Consumer("squared").side_set(2), [0, 1, 2])
    assert Consumer(functools.partial(threshold_loss, t=2), range(3)).name == "threshold_loss(t=2), S={0, 1, 2}"
    assert Consumer(absolute_loss(3), name="agency").name == "agency"
    assert not Consumer("absolute").loss_matrix(3).flags.writeable


def test_bayes_risk_closed_form():
    # uniform prior, G_{3,1/4}, |i - r|: (21/80 + 9/20 + 9/20 + 21/80)/4 = 57/160
    risk = bayes_risk(geometric_matrix(3, 0.25), np.full(4, 0.25), "absolute")
    assert risk == pytest.approx(57 / 160, rel=1e-14)


def test_mechanism_matrix_and_the_unbounded_geometric():
    eps = math.log(4.0)
    G = geometric_matrix(3, 0.25)
    np.testing.assert_allclose(mechanism_matrix(ClampedGeometric(eps, 0, 3), 3), G, rtol=1e-15)
    # sensitivity 2: alpha = exp(-epsilon/2)
    np.testing.assert_allclose(
        mechanism_matrix(ClampedGeometric(2 * eps, 0, 3, sensitivity=2), 3), G, rtol=1e-13
    )
    with pytest.raises(ValueError, match="clamped_to_range"):
        mechanism_matrix(DoubleGeometric(eps), 3)
    with pytest.raises(ValueError, match="outside"):
        mechanism_matrix(ClampedGeometric(eps, 0, 5), 3)
    with pytest.raises(ValueError, match=r"\{0..3\}"):
        mechanism_matrix(ClampedGeometric(eps, 0, 2), 3)
    with pytest.raises(ValueError, match="discrete"):
        mechanism_matrix(Laplace(eps), 3)
    for mech in (DoubleGeometric(eps), ClampedGeometric(eps, 0), ClampedGeometric(eps, -4, 9)):
        np.testing.assert_allclose(mechanism_matrix(clamped_to_range(mech, 3), 3), G, rtol=1e-14)
    with pytest.raises(ValueError, match="lower <= 0"):
        clamped_to_range(ClampedGeometric(eps, 1, 9), 3)
    with pytest.raises(TypeError, match="DoubleGeometric"):
        clamped_to_range(Laplace(eps), 3)
    # sufficiency (note §3.11): beyond the range, the unbounded likelihood in i is proportional
    # to the clamped one, so the posterior given r equals the posterior given clip(r, 0, 3)
    dg, i = DoubleGeometric(eps), np.arange(4)
    for r in [-7, -1, 0, 3, 4, 12]:
        unbounded = np.exp(dg.log_likelihood(np.full(4, r), i))
        clamped = G[:, min(max(r, 0), 3)]
        np.testing.assert_allclose(unbounded / unbounded.sum(), clamped / clamped.sum(), rtol=1e-14)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: geometric_matrix(3, 1.0), ValueError, "alpha"),
        (lambda: geometric_matrix(3, 0.0), ValueError, "alpha"),
        (lambda: geometric_matrix(3, "0.5"), TypeError, "alpha"),
        (lambda: geometric_matrix(0, 0.5), ValueError, "n"),
        (lambda: optimal_mechanism(3, 1.5, Consumer("absolute")), ValueError, "alpha"),
        (lambda: optimal_remap(np.eye(3), "absolute"), TypeError, "consumer"),
        (lambda: optimal_remap(np.full((3, 3), 0.5), Consumer("absolute")), ValueError, "Y rows must sum to 1"),
        (lambda: optimal_remap(-np.eye(3), Consumer("absolute")), ValueError, "Y must have entries >= 0"),
        (lambda: optimal_remap(np.eye(3), Consumer("absolute", [0, 5])), ValueError, "side_information"),
        (lambda: best_deterministic_remap(np.eye(10), Consumer("absolute")), ValueError, "n <= 8"),
        (lambda: Consumer("huber"), ValueError, "loss must be one of"),
        (lambda: Consumer(np.ones((3, 4))), ValueError, "square"),
        (lambda: Consumer("absolute", []), ValueError, "side_information"),
        (lambda: Consumer("absolute", [-1, 2]), ValueError, "side_information"),
        (lambda: Consumer("absolute", [0.5]), ValueError, "side_information"),
        (lambda: Consumer(absolute_loss(3), [4]), ValueError, "side_information"),
        (lambda: Consumer("absolute", name=3), TypeError, "name"),
        (lambda: Consumer(absolute_loss(3)).loss_matrix(4), ValueError, "n = 3"),
        (lambda: Consumer(lambda n: np.ones((n, n))).loss_matrix(3), ValueError, "4 x 4"),
        (lambda: minimax_risk(np.eye(3), "absolute"), TypeError, "consumer"),
        (lambda: risk_profile(np.full((3, 2), 0.5), "absolute"), ValueError, "X must be"),
        (lambda: bayes_risk(np.eye(3), [0.5, 0.5, 0.5], "absolute"), ValueError, "prior must sum to 1"),
        (lambda: bayes_remap(np.eye(3), [0.5, 0.5], "absolute"), ValueError, "prior must have"),
        (lambda: threshold_loss(3, -1), ValueError, "t"),
        (lambda: power_loss(3, 0.0), ValueError, "p"),
        (lambda: asymmetric_linear_loss(3, 1.0, -1.0), ValueError, "over"),
        (lambda: is_derivable(np.eye(3), 0.5, tol=-1.0), ValueError, "tol"),
        (lambda: is_monotone_loss(np.ones((2, 3))), ValueError, "L must be a square"),
        (lambda: mechanism_matrix("geometric", 3), TypeError, "mechanism"),
    ],
)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
