"""Post-processing baseline (dpinfer.utility.baselines): least-squares projection onto
invariants, integer rounding, noise-only intervals.

Every solution is checked against something independent of the code under test: closed forms
derived by hand, a root-finder for the simplex threshold, a KKT certificate found by linear
programming (existence of multipliers), and exhaustive enumeration of small integer fibres."""

import itertools
import time

import numpy as np
import pytest
import scipy.optimize

import dpinfer as dp
from dpinfer.mechanisms import DoubleGeometric
from dpinfer.utility.baselines import (
    KKT_TOLERANCE,
    generalized_least_squares,
    noise_only_intervals,
    nonnegative_least_squares,
    round_to_invariants,
)
from dpinfer.utility.baselines.qp import _solve_qp

# --- independent checkers ----------------------------------------------------------------------


def assert_kkt(H, h, A, a, x, *, rtol=1e-7):
    """x minimises 1/2 x'Hx - h'x s.t. A x = a, x >= 0 (H psd): x >= 0, A x = a, and some lambda
    (found by an LP over lambda alone) gives mu = g - A' lambda with mu = 0 on {x > 0} and mu >= 0
    on {x = 0}, to rtol. Convex problem, so KKT = global optimality."""
    assert np.all(x >= 0)
    g = H @ x - h
    scale = max(1.0, np.max(np.abs(H) @ np.abs(x)), np.max(np.abs(h)))
    if A is None:
        free = x > 1e-9 * max(1.0, np.max(x))
        assert np.max(np.abs(g[free]), initial=0) <= rtol * scale
        assert np.min(g[~free], initial=0) >= -rtol * scale
        return
    A = np.asarray(A, dtype=float)
    assert np.max(np.abs(A @ x - a)) <= 1e-9 * max(1.0, np.max(np.abs(a)))
    free = x > 1e-9 * max(1.0, np.max(x))
    m = A.shape[0]
    # min t  s.t.  |A_F' lam - g_F| <= t,  A_W' lam - g_W <= t   over (lam, t)
    AF, AW = A[:, free].T, A[:, ~free].T
    ones_f, ones_w = np.ones((AF.shape[0], 1)), np.ones((AW.shape[0], 1))
    A_ub = np.vstack([np.hstack([AF, -ones_f]), np.hstack([-AF, -ones_f]), np.hstack([AW, -ones_w])])
    b_ub = np.concatenate([g[free], -g[free], g[~free]])
    res = scipy.optimize.linprog(np.r_[np.zeros(m), 1.0], A_ub=A_ub, b_ub=b_ub,
                                 bounds=[(None, None)] * m + [(0, None)], method="highs")
    assert res.status == 0
    assert res.fun <= rtol * scale, f"KKT violated by {res.fun}"


def tau_by_root_finding(s, t):
    """Threshold of the simplex projection from sum max(s - tau, 0) = t (brentq, independent)."""
    if t == 0:
        return np.inf
    return scipy.optimize.brentq(lambda tau: np.maximum(s - tau, 0).sum() - t,
                                 s.min() - t - 1.0, s.max(), xtol=1e-13, rtol=1e-15)


def group_matrix(groups):
    labels, codes = np.unique(groups, return_inverse=True)
    A = np.zeros((labels.size, len(groups)), dtype=np.int64)
    A[codes, np.arange(len(groups))] = 1
    return A


def table_margins(rows, cols):
    """Row and column totals of a rows x cols table (rank rows + cols - 1: one redundant row)."""
    return np.vstack([np.kron(np.eye(rows, dtype=int), np.ones(cols, dtype=int)),
                      np.kron(np.ones(rows, dtype=int), np.eye(cols, dtype=int))])


def fibre(A, a):
    """All integer x >= 0 with A x = a (A >= 0, every column covered: a finite set)."""
    A = np.asarray(A)
    ub = [min(a[r] // A[r, i] for r in range(A.shape[0]) if A[r, i] > 0) for i in range(A.shape[1])]
    pts = np.array(list(itertools.product(*[range(u + 1) for u in ub])), dtype=np.int64)
    return pts[np.all(pts @ A.T == a, axis=1)]


# --- closed-form simplex projection ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_simplex_projection_matches_general_qp_and_kkt(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 30))
    n_groups = int(rng.integers(1, 4))
    groups = rng.integers(0, n_groups, d)
    truth = rng.integers(0, 6, d)
    s = truth + rng.integers(-8, 9, d)  # big noise on small counts: non-negativity binds
    A = group_matrix(groups)
    a = A @ truth  # true totals, as the analyst knows them
    x = nonnegative_least_squares(s, groups=groups, invariant_values=a)
    # the general active-set solver: dense (Cholesky) and diagonal-Hessian steps, from the
    # primal-dual warm start and from a vertex of the feasible set
    for dense, warm in itertools.product((True, False), (True, False)):
        general = _solve_qp(np.eye(d), s.astype(float), A, a.astype(float), dense=dense, warm=warm)
        np.testing.assert_allclose(x, general, atol=1e-9)
    assert_kkt(np.eye(d), s.astype(float), A, a, x)
    # the same problem through an explicit group-indicator matrix
    np.testing.assert_allclose(nonnegative_least_squares(s, invariants_matrix=A, invariant_values=a), x,
                               atol=1e-12)
    # and per-group thresholds agree with root finding: x_i = max(s_i - tau_g, 0)
    for r in range(A.shape[0]):
        cells = A[r] == 1
        tau = tau_by_root_finding(s[cells].astype(float), a[r])
        np.testing.assert_allclose(x[cells], np.maximum(s[cells] - tau, 0), atol=1e-9)


def test_simplex_projection_kkt_by_hand():
    # s = (5, 1, -3), t = 3: support {0, 1} would give tau = (6 - 3)/2 = 1.5 > s_1 = 1, so the
    # support is {0}: tau = 2, x = (3, 0, 0); multipliers mu_i = x_i - s_i + tau = (0, 1, 5) >= 0.
    x = nonnegative_least_squares([5, 1, -3], groups=[0, 0, 0], invariant_values=[3])
    np.testing.assert_allclose(x, [3, 0, 0], atol=1e-15)
    # s = (4, 3, 1), t = 5: tau = (4 + 3 + 1 - 5)/3 = 1 -> x = (3, 2, 0), mu_2 = 0 (degenerate)
    x = nonnegative_least_squares([4, 3, 1], groups=[7, 7, 7], invariant_values={7: 5})
    np.testing.assert_allclose(x, [3, 2, 0], atol=1e-15)
    # zero total: everything 0; no binding: the total is already met, x = s
    np.testing.assert_array_equal(nonnegative_least_squares([2, -1, 5], groups=[0, 0, 0],
                                                            invariant_values=[0]), [0, 0, 0])
    np.testing.assert_array_equal(nonnegative_least_squares([2, 1, 5], groups=["a", "a", "a"]), [2, 1, 5])


def test_simplex_projection_thousands_of_cells_is_instant_and_exact():
    rng = np.random.default_rng(11)
    d, n_groups = 20_000, 300
    groups = rng.integers(0, n_groups, d)
    truth = rng.poisson(3.0, d)
    s = truth + rng.integers(-10, 11, d)
    A = group_matrix(groups)
    a = A @ truth
    start = time.perf_counter()
    x = nonnegative_least_squares(s, groups=groups, invariant_values=a)
    assert time.perf_counter() - start < 0.5
    assert np.all(x >= 0) and np.sum(x == 0) > 1000
    np.testing.assert_allclose(A @ x, a, rtol=0, atol=1e-9)
    for r in rng.choice(n_groups, 10, replace=False):
        cells = A[r] == 1
        tau = tau_by_root_finding(s[cells].astype(float), a[r])
        np.testing.assert_allclose(x[cells], np.maximum(s[cells] - tau, 0), atol=1e-9)
    # census-sized totals keep the equality to relative rounding
    big = nonnegative_least_squares(s * 10_000.0 + 3e5, groups=groups)
    np.testing.assert_allclose(A @ big, A @ (s * 10_000.0 + 3e5), rtol=1e-13)


def test_no_invariants_is_clip_at_zero():
    np.testing.assert_array_equal(nonnegative_least_squares([-3, 0, 2.5]), [0, 0, 2.5])


# --- general A: exact QP ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_table_margins_nonnegativity_binds(seed):
    rng = np.random.default_rng(100 + seed)
    rows, cols = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    truth = rng.integers(0, 3, rows * cols)
    s = truth + DoubleGeometric(epsilon=0.3).sample_noise(truth.shape, rng)
    A = table_margins(rows, cols)  # redundant rows (rank rows + cols - 1)
    a = A @ truth
    x = nonnegative_least_squares(s, invariants_matrix=A, invariant_values=a)
    assert np.all(x >= 0)
    np.testing.assert_allclose(A @ x, a, rtol=0, atol=1e-9)
    assert_kkt(np.eye(s.size), s.astype(float), A, a, x)
    unconstrained = generalized_least_squares([np.eye(s.size, dtype=int)], [s], [1.0], invariants_matrix=A,
                                              invariant_values=a, nonnegative=False)
    if np.any(unconstrained < -1e-9):  # non-negativity binds: the answer moves
        assert np.sum(x == 0) >= 1
        assert not np.allclose(x, unconstrained)


@pytest.mark.parametrize("seed", range(6))
def test_general_invariants_random_kkt(seed):
    rng = np.random.default_rng(200 + seed)
    d, m = int(rng.integers(3, 25)), int(rng.integers(1, 5))
    A = rng.integers(0, 3, (m, d))
    A[0] = 1  # a grand total, so the feasible set is bounded
    truth = rng.integers(0, 4, d)
    s = truth + rng.integers(-6, 7, d)
    a = A @ truth
    x = nonnegative_least_squares(s, invariants_matrix=A, invariant_values=a)
    assert np.all(x >= 0)
    np.testing.assert_allclose(A @ x, a, rtol=0, atol=1e-9)
    assert_kkt(np.eye(d), s.astype(float), A, a, x)
    # nothing feasible does better (random feasible points and segments towards them)
    f = np.sum((x - s) ** 2)
    for _ in range(20):
        z = scipy.optimize.linprog(rng.normal(size=d), A_eq=A, b_eq=a, bounds=(0, None), method="highs").x
        for theta in (1e-3, 0.1, 1.0):
            y = x + theta * (z - x)
            assert f <= np.sum((y - s) ** 2) + 1e-9


def test_default_invariant_values_use_the_release():
    # a release conditioned on its invariants (A s = a): the default a = A @ s
    s = np.array([4, -2, 3, 1])
    A = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    x = nonnegative_least_squares(s, invariants_matrix=A)
    np.testing.assert_allclose(A @ x, A @ s, atol=1e-12)
    # cells 0-1 must sum to 2: (4, -2) -> (2, 0); cells 2-3 must sum to 6 - 2 = 4, as (3, 1) does
    np.testing.assert_allclose(x, [2, 0, 3, 1], atol=1e-12)


# --- generalised least squares ------------------------------------------------------------------------


@pytest.mark.parametrize("v_cells, v_total", [(2.0, 2.0), (1.0, 9.0), (4.0, 0.5)])
def test_gls_counts_plus_total_closed_form(v_cells, v_total):
    # min ||x - s||^2/v1 + (1'x - t)^2/v2: gradient (x - s)/v1 + 1 (1'x - t)/v2 = 0, so
    # x = s - c 1 with c = (v1/v2) delta, delta = 1'x - t = 1's - t - d c, hence
    # x = s - (1's - t) v1/(v2 + d v1); equal variances: x = s - (1's - t)/(d + 1).
    rng = np.random.default_rng(5)
    d = 7
    s = rng.normal(100, 5, d)
    t = s.sum() + 13.0
    Q = [np.eye(d, dtype=int), np.ones((1, d), dtype=int)]
    x = generalized_least_squares(Q, [s, [t]], [v_cells, v_total])
    want = s - (s.sum() - t) * v_cells / (v_total + d * v_cells)
    np.testing.assert_allclose(x, want, rtol=0, atol=1e-10)
    if v_cells == v_total:
        np.testing.assert_allclose(x, s - (s.sum() - t) / (d + 1), atol=1e-10)
    # per-entry variances equal to the scalars give the same answer; 1-D query row accepted
    x2 = generalized_least_squares((np.eye(d, dtype=int), np.ones(d, dtype=int)), (s, t),
                                   (np.full(d, v_cells), v_total))
    np.testing.assert_allclose(x2, want, atol=1e-10)


def test_gls_identity_fast_path_matches_general_solver():
    rng = np.random.default_rng(8)
    d = 15
    groups = rng.integers(0, 3, d)
    A = group_matrix(groups)
    truth = rng.integers(0, 4, d)
    s1, s2 = truth + rng.integers(-5, 6, d), truth + rng.integers(-9, 10, d)
    v1, v2 = 1.5, 6.0
    x = generalized_least_squares([np.eye(d, dtype=int)] * 2, [s1, s2], [v1, v2], invariants_matrix=A,
                                  invariant_values=A @ truth)
    M = np.vstack([np.eye(d) / np.sqrt(v1), np.eye(d) / np.sqrt(v2)])
    b = np.concatenate([s1 / np.sqrt(v1), s2 / np.sqrt(v2)])
    general = _solve_qp(M.T @ M, M.T @ b, A, (A @ truth).astype(float), dense=True)
    np.testing.assert_allclose(x, general, atol=1e-9)
    assert_kkt(M.T @ M, M.T @ b, A, A @ truth, x)
    # without non-negativity: x_i = s_bar_i - (group sum of s_bar - t_g)/n_g
    free = generalized_least_squares([np.eye(d, dtype=int)] * 2, [s1, s2], [v1, v2], invariants_matrix=A,
                                     invariant_values=A @ truth, nonnegative=False)
    s_bar = (s1 / v1 + s2 / v2) / (1 / v1 + 1 / v2)
    shift = (A @ s_bar - A @ truth) / A.sum(axis=1)
    np.testing.assert_allclose(free, s_bar - A.T @ shift, atol=1e-10)


@pytest.mark.parametrize("seed", range(5))
def test_gls_hierarchy_with_invariants_kkt(seed):
    # cells, pair sums and the grand total released with different variances; the state total
    # is invariant. Small counts and big noise: non-negativity binds.
    rng = np.random.default_rng(300 + seed)
    d = 8
    truth = rng.integers(0, 3, d)
    pairs = np.kron(np.eye(d // 2, dtype=int), np.ones(2, dtype=int))
    Qs = [np.eye(d, dtype=int), pairs, np.ones((1, d), dtype=int)]
    vs = [9.0, 4.0, 1.0]
    ss = [Q @ truth + rng.normal(0, np.sqrt(v), Q.shape[0]) for Q, v in zip(Qs, vs)]
    A = np.ones((1, d), dtype=int)
    a = A @ truth
    x = generalized_least_squares(Qs, ss, vs, invariants_matrix=A, invariant_values=a)
    M = np.vstack([Q / np.sqrt(v) for Q, v in zip(Qs, vs)])
    b = np.concatenate([s / np.sqrt(v) for s, v in zip(ss, vs)])
    assert np.all(x >= 0)
    np.testing.assert_allclose(A @ x, a, atol=1e-9)
    assert_kkt(M.T @ M, M.T @ b, A, a, x)
    # unconstrained GLS = the normal equations
    free = generalized_least_squares(Qs, ss, vs, nonnegative=False)
    np.testing.assert_allclose(free, np.linalg.solve(M.T @ M, M.T @ b), atol=1e-9)
    # non-negativity only
    assert_kkt(M.T @ M, M.T @ b, None, None, generalized_least_squares(Qs, ss, vs))


def test_gls_equality_constrained_matches_kkt_system():
    rng = np.random.default_rng(9)
    d = 6
    Q = rng.integers(0, 3, (9, d))
    s = rng.normal(10, 2, 9)
    A = np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]])
    a = np.array([12.0, 7.0])
    x = generalized_least_squares([Q], [s], [2.0], invariants_matrix=A, invariant_values=a,
                                  nonnegative=False)
    K = np.block([[Q.T @ Q / 2.0, A.T], [A, np.zeros((2, 2))]])
    want = np.linalg.solve(K, np.concatenate([Q.T @ s / 2.0, a]))[:d]
    np.testing.assert_allclose(x, want, atol=1e-9)


# --- integer rounding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_largest_remainder_is_l1_optimal_by_enumeration(seed):
    rng = np.random.default_rng(400 + seed)
    d = 5
    truth = rng.integers(0, 3, d)
    s = truth + rng.integers(-3, 4, d)
    groups = np.zeros(d, dtype=int)
    groups[3:] = 1
    A = group_matrix(groups)
    a = A @ truth
    x_hat = nonnegative_least_squares(s, groups=groups, invariant_values=a)
    x_int = round_to_invariants(x_hat, groups=groups)  # totals: group sums of x_hat
    assert x_int.dtype == np.int64 and np.all(x_int >= 0)
    np.testing.assert_array_equal(A @ x_int, a)
    candidates = fibre(A, a)
    best = np.min(np.abs(candidates - x_hat).sum(axis=1))
    assert np.abs(x_int - x_hat).sum() == pytest.approx(best, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_milp_rounding_is_l1_optimal_by_enumeration(seed):
    rng = np.random.default_rng(500 + seed)
    d = 6
    A = rng.integers(0, 3, (2, d))
    A[0] = np.maximum(A[0], 1)  # every column covered: a finite fibre
    truth = rng.integers(0, 3, d)
    a = A @ truth
    s = truth + rng.integers(-3, 4, d)
    x_hat = nonnegative_least_squares(s, invariants_matrix=A, invariant_values=a)
    x_int = round_to_invariants(x_hat, invariants_matrix=A, invariant_values=a)
    assert x_int.dtype == np.int64 and np.all(x_int >= 0)
    np.testing.assert_array_equal(A @ x_int, a)
    candidates = fibre(A, a)
    best = np.min(np.abs(candidates - x_hat).sum(axis=1))
    assert np.abs(x_int - x_hat).sum() == pytest.approx(best, abs=1e-7)
    # an x_hat off the fibre (not a projection) is rounded optimally too
    x_off = x_hat + rng.normal(0, 0.7, d)
    x_int = round_to_invariants(x_off, invariants_matrix=A, invariant_values=a)
    np.testing.assert_array_equal(A @ x_int, a)
    best = np.min(np.abs(candidates - x_off).sum(axis=1))
    assert np.abs(x_int - x_off).sum() == pytest.approx(best, abs=1e-7)


@pytest.mark.parametrize("seed", range(8))
def test_group_rounding_off_the_fibre_is_l1_optimal(seed):
    # a raw release (negative cells, sums off the published totals) rounded to the totals:
    # greedy moves from max(rint(x), 0); checked by enumeration and against the MILP
    from dpinfer.utility.baselines.rounding import _milp_round

    rng = np.random.default_rng(600 + seed)
    d = int(rng.integers(2, 6))
    groups = rng.integers(0, 2, d)
    A = group_matrix(groups)
    totals = rng.integers(0, 9, A.shape[0])
    x = rng.normal(rng.uniform(-2, 4), rng.uniform(0.3, 4), d)
    if seed % 2:
        x = np.round(x * 2) / 2  # half-integers: ties
    x_int = round_to_invariants(x, groups=groups, invariant_values=totals)
    np.testing.assert_array_equal(A @ x_int, totals)
    best = np.min(np.abs(fibre(A, totals) - x).sum(axis=1))
    assert np.abs(x_int - x).sum() == pytest.approx(best, abs=1e-9)
    big_groups = rng.integers(0, 4, 60)
    big_A = group_matrix(big_groups)
    big_x = rng.normal(1, 5, 60)
    big_totals = np.maximum(0, np.rint(big_A @ big_x + rng.normal(0, 25, big_A.shape[0]))).astype(int)
    greedy = round_to_invariants(big_x, groups=big_groups, invariant_values=big_totals)
    np.testing.assert_array_equal(big_A @ greedy, big_totals)
    milp = _milp_round(big_x, big_A, big_totals)
    assert np.abs(greedy - big_x).sum() == pytest.approx(np.abs(milp - big_x).sum(), abs=1e-6)


def test_milp_rounding_with_redundant_margin_rows():
    # both margins of a 3 x 3 table: 6 rows of rank 5. HiGHS stopped with "Solve error" on this
    # projection (found by the SBC study); the MILP now runs on independent rows only.
    A = np.asarray(dp.Invariants.margins((3, 3), [(0,), (1,)]).constraint_matrix)
    s = np.array([2, 1, 1, 3, 2, -1, 4, 1, 2])
    x_hat = nonnegative_least_squares(s, invariants_matrix=A, invariant_values=A @ s)
    np.testing.assert_allclose(x_hat, [2.25, 1.25, 0.5, 2.5, 1.5, 0.0, 4.25, 1.25, 1.5], atol=1e-12)
    x_int = round_to_invariants(x_hat, invariants_matrix=A, invariant_values=A @ s)
    np.testing.assert_array_equal(A @ x_int, A @ s)
    best = np.min(np.abs(fibre(A, A @ s) - x_hat).sum(axis=1))
    assert np.abs(x_int - x_hat).sum() == pytest.approx(best, abs=1e-9)


def test_rounding_examples():
    # largest remainders 0.6 and 0.5 get the 2 missing units; ties go to the lowest index
    np.testing.assert_array_equal(round_to_invariants([1.6, 0.5, 0.4, 2.5], groups=[0, 0, 0, 0]),
                                  [2, 1, 0, 2])
    np.testing.assert_array_equal(round_to_invariants([0.5, 0.5, 0.5, 0.5], groups=[0, 0, 0, 0]),
                                  [1, 1, 0, 0])
    # no invariants: nearest non-negative integer
    np.testing.assert_array_equal(round_to_invariants([-0.7, 2.4, 3.6]), [0, 2, 4])
    # big thousands-cell table: exact totals
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 40, 5000)
    x_hat = nonnegative_least_squares(rng.integers(-2, 9, 5000), groups=groups)
    x_int = round_to_invariants(x_hat, groups=groups)
    A = group_matrix(groups)
    np.testing.assert_array_equal(A @ x_int, np.rint(A @ x_hat).astype(int))
    assert np.max(np.abs(x_int - x_hat)) < 1
    # the raw release, rounded to totals it does not meet: still instant and exact
    raw = rng.normal(2, 4, 5000)
    totals = np.maximum(0, np.rint(A @ raw) + 7)
    start = time.perf_counter()
    x_int = round_to_invariants(raw, groups=groups, invariant_values=totals)
    assert time.perf_counter() - start < 0.5
    np.testing.assert_array_equal(A @ x_int, totals)
    # examples by hand: (-1.2, 0.4, 2.6) to total 5: per-cell (0, 0, 3) = 3, two units short;
    # cheapest moves: cell 1 up (cost 1 - 2*0.4 = 0.2), then cost 1 (cells 0, 1 or 2)
    x_int = round_to_invariants([-1.2, 0.4, 2.6], groups=[0, 0, 0], invariant_values=[5])
    assert x_int.sum() == 5 and np.abs(x_int - [-1.2, 0.4, 2.6]).sum() == pytest.approx(1.2 + 0.6 + 0.4 + 1)


def test_rounding_real_feasible_but_no_integer_point():
    with pytest.raises(ValueError, match="no non-negative integer"):
        round_to_invariants([0.75, 0.75], invariants_matrix=[[2, 2]], invariant_values=[3])


# --- noise-only intervals --------------------------------------------------------------------------------


class StubMechanism:
    def __init__(self, q):
        self.q = q
        self.calls = []

    def noise_interval(self, prob=0.9):
        self.calls.append(prob)
        return -self.q, self.q


def test_noise_only_intervals_stub():
    mech = StubMechanism(4.0)
    lo, hi = noise_only_intervals(np.array([0.0, 2.5, 10.0]), mech, 0.8)
    assert mech.calls == [0.8]
    np.testing.assert_array_equal(lo, [-4.0, -1.5, 6.0])
    np.testing.assert_array_equal(hi, [4.0, 6.5, 14.0])
    lo, hi = noise_only_intervals([0.0, 2.5, 10.0], mech, 0.8, clip_at_zero=True)
    np.testing.assert_array_equal(lo, [0.0, 0.0, 6.0])
    np.testing.assert_array_equal(hi, [4.0, 6.5, 14.0])
    lo, hi = noise_only_intervals([[1, 2], [3, 4]], mech)
    assert lo.shape == (2, 2) and mech.calls[-1] == 0.9


def test_noise_only_intervals_double_geometric():
    mech = DoubleGeometric(epsilon=0.5)
    q_lo, q_hi = mech.noise_interval(0.9)
    # smallest q with P(|e| <= q) = 1 - 2 a^{q+1}/(1 + a) >= 0.9, a = exp(-0.5): q = 5
    a = np.exp(-0.5)
    q = next(k for k in range(100) if 1 - 2 * a ** (k + 1) / (1 + a) >= 0.9)
    assert (q_lo, q_hi) == (-q, q) == (-5, 5)
    lo, hi = noise_only_intervals([0, 3, 20], mech, 0.9)
    np.testing.assert_array_equal(lo, [-5, -2, 15])
    np.testing.assert_array_equal(hi, [5, 8, 25])
    # coverage around the raw release is >= 0.9 (simulation, fixed seed)
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 50, 20_000)
    release = mech.release(truth, rng)
    lo, hi = noise_only_intervals(release, mech, 0.9)
    assert np.mean((lo <= truth) & (truth <= hi)) > 0.89


# --- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(release=[[1, 2]]), ValueError, "release must be a non-empty 1-D"),
        (dict(release=[]), ValueError, "release must be a non-empty 1-D"),
        (dict(release=["a", "b"]), TypeError, "release must be numeric"),
        (dict(release=[1, np.nan]), ValueError, "release must be finite"),
        (dict(release=[1, 2], groups=[0, 0], invariants_matrix=[[1, 1]]), ValueError, "either groups"),
        (dict(release=[1, 2], invariant_values=[3]), ValueError, "without invariants_matrix"),
        (dict(release=[1, 2], invariants_matrix=[[1, 0.5]]), ValueError, "invariants_matrix must hold whole"),
        (dict(release=[1, 2], invariants_matrix=[[1, 1, 1]]), ValueError, "with 2 columns"),
        (dict(release=[1, 2], invariants_matrix=[[1, 1]], invariant_values=[1, 2]), ValueError,
         "one value per row"),
        (dict(release=[1, 2], invariants_matrix=[[1, 1], [2, 2]], invariant_values=[1, 3]), ValueError,
         "not consistent"),
        (dict(release=[1, 2], invariants_matrix=[[1, 1], [1, -1]], invariant_values=[1, 3]), ValueError,
         "no x >= 0"),
        (dict(release=[1, 2, 3], invariants_matrix=[[1, 1, 0], [0, 1, 1]], invariant_values=[1, -1]),
         ValueError, "infeasible"),
        (dict(release=[1, 2], groups=[0, 1], invariant_values=[3, -1]), ValueError, "negative"),
        (dict(release=[-5, 2], groups=[0, 0]), ValueError, "negative"),
        (dict(release=[1, 2], groups=[0]), ValueError, "groups must be a 1-D array of 2 labels"),
        (dict(release=[1, 2], groups=[0.5, 1.5]), TypeError, "integer or string labels"),
        (dict(release=[1, 2], groups=[0, 1], invariant_values=[3]), ValueError, "one total per group"),
        (dict(release=[1, 2], groups=[0, 1], invariant_values={0: 1, 2: 1}), ValueError, "mapping"),
    ],
)
def test_nnls_errors(kwargs, exc, pattern):
    release = kwargs.pop("release")
    with pytest.raises(exc, match=pattern):
        nonnegative_least_squares(release, **kwargs)


I2 = np.eye(2, dtype=int)


@pytest.mark.parametrize(
    "args, kwargs, exc, pattern",
    [
        ((I2, [[1, 2]], [1.0]), {}, TypeError, "queries must be a list or tuple"),
        (([I2], [[1, 2]], 1.0), {}, TypeError, "variances must be a list or tuple"),
        (([], [], []), {}, ValueError, "at least one"),
        (([I2], [[1, 2], [3]], [1.0]), {}, ValueError, "same length"),
        (([I2], [[1, 2, 3]], [1.0]), {}, ValueError, r"releases\[0\] must have one value per row"),
        (([I2, np.ones((1, 3), int)], [[1, 2], [3]], [1.0, 1.0]), {}, ValueError, r"queries\[1\].*2 columns"),
        (([I2 * 0.5], [[1, 2]], [1.0]), {}, ValueError, r"queries\[0\] must hold whole"),
        (([I2, np.ones((1, 2), int)], [[1, 2], [3]], [1.0, -2.0]), {}, ValueError, r"variances\[1\] must be > 0"),
        (([I2], [[1, 2]], [0.0]), {}, ValueError, r"variances\[0\] must be > 0"),
        (([I2], [[1, 2]], [[1.0, 2.0, 3.0]]), {}, ValueError, r"variances\[0\] must be one number"),
        (([I2], [[1, 2]], [True]), {}, TypeError, r"variances\[0\]"),
        (([np.ones((1, 2), int)], [[3]], [1.0]), {}, ValueError, "do not determine"),
        (([I2], [[1, 2]], [1.0]), dict(invariants_matrix=[[1, 1]]), ValueError, "invariant_values is required"),
        (([I2], [[1, 2]], [1.0]), dict(invariant_values=[3]), ValueError, "without invariants_matrix"),
        (([I2], [[1, 2]], [1.0]), dict(nonnegative="yes"), TypeError, "nonnegative must be True or False"),
        (([I2], [[1, 2]], [1.0]), dict(invariants_matrix=[[1, 1], [1, 1]], invariant_values=[3, 4]),
         ValueError, "not consistent"),
    ],
)
def test_gls_errors(args, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        generalized_least_squares(*args, **kwargs)


def test_gls_identifiable_through_invariants():
    # the total alone does not determine 2 cells, but with a second invariant it does
    x = generalized_least_squares([np.ones((1, 2), int)], [[3.0]], [1.0], invariants_matrix=[[1, -1]],
                                  invariant_values=[1.0])
    np.testing.assert_allclose(x, [2.0, 1.0], atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(x_hat=[0.5, 1.2], groups=[0, 0]), ValueError, "whole numbers"),
        (dict(x_hat=[0.5, 1.5], groups=[0, 0], invariant_values=[2.5]), ValueError, "invariant_values must be whole"),
        (dict(x_hat=[0.5, 1.5], groups=[0, 0], invariant_values=[2.0000001]), ValueError,
         "invariant_values must be whole"),
        (dict(x_hat=[0.5, 1.5], invariants_matrix=[[1, 1]], invariant_values=[-2]), ValueError, "negative"),
        (dict(x_hat=[0.5, 1.5], invariants_matrix=[[1, 1], [1, -1]], invariant_values=[1, 3]), ValueError,
         "no non-negative integer"),
        (dict(x_hat=[0.5, 1.5], invariants_matrix=[[1, 1], [2, 2]], invariant_values=[2, 5]), ValueError,
         "not consistent"),
        (dict(x_hat=[0.5, 1.5], invariants_matrix=[[1.5, 1]], invariant_values=[2]), ValueError,
         "invariants_matrix must hold whole"),
        (dict(x_hat=[[0.5, 1.5]]), ValueError, "x_hat must be a non-empty 1-D"),
    ],
)
def test_round_errors(kwargs, exc, pattern):
    x_hat = kwargs.pop("x_hat")
    with pytest.raises(exc, match=pattern):
        round_to_invariants(x_hat, **kwargs)


def test_interval_errors():
    mech = StubMechanism(2.0)
    with pytest.raises(TypeError, match="mechanism must provide noise_interval"):
        noise_only_intervals([1.0], object())
    with pytest.raises(ValueError, match="prob must lie strictly between 0 and 1"):
        noise_only_intervals([1.0], mech, 1.5)
    with pytest.raises(TypeError, match="clip_at_zero must be True or False"):
        noise_only_intervals([1.0], mech, clip_at_zero=1)
    with pytest.raises(ValueError, match="lo <= 0 <= hi"):
        noise_only_intervals([1.0], StubMechanism(-1.0))
    with pytest.raises(TypeError, match="point must be numeric"):
        noise_only_intervals(["x"], mech)


def test_kkt_tolerance_is_documented():
    assert KKT_TOLERANCE == {"primal": 1e-9, "dual": 1e-8}
