"""Random-walk Metropolis on kernel lattices and its L-lag coupling (dpinfer.lattice.random_walk),
against exact laws by enumeration; targets from dpinfer.lattice.targets."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

import dpinfer as dp
from dpinfer.lattice.random_walk import LatticeWalk
from dpinfer.lattice.targets import gaussian_log_target, laplace_log_target


def exact_law(C, log_target, radius):
    """Normalised pmf of the target over all w in a box of the given radius (the mass outside
    is checked to be negligible by the caller's choice of radius)."""
    m = C.shape[1]
    w = np.array(list(itertools.product(range(-radius, radius + 1), repeat=m)))
    z = w @ C.T
    lp = log_target(z)
    p = np.exp(lp - lp.max())
    return z, p / p.sum()


@pytest.mark.parametrize("norm_name, epsilon", [("l1", 0.7), ("l2", 0.9)])
def test_walk_reaches_the_generalized_laplace_law(norm_name, epsilon):
    # 3 cells with a fixed total: m = 2; the chains' joint law of z after 60 steps against the
    # enumerated target (chi-square over the cells holding 99% of the mass, pooled tail)
    C = np.asarray(dp.Invariants.total(3).kernel_basis())
    target = laplace_log_target(epsilon, norm_name)
    z_all, p = exact_law(C, target, 40)
    walk = LatticeWalk(C, target, a=math.exp(-epsilon))
    rng = np.random.default_rng(11)
    z, rate = walk.run(40_000, 60, rng)
    assert 0.05 < rate < 0.95
    assert np.all(z.sum(axis=1) == 0)  # every draw on the lattice
    order = np.argsort(-p)
    keep = order[: np.searchsorted(np.cumsum(p[order]), 0.99) + 1]
    index = {tuple(row): i for i, row in enumerate(z_all[keep])}
    counts = np.zeros(keep.size + 1)
    for row in map(tuple, z):
        counts[index.get(row, keep.size)] += 1
    expected = np.append(p[keep], 1 - p[keep].sum()) * z.shape[0]
    _, p_value = stats.chisquare(counts, expected)
    assert p_value > 1e-3


def test_walk_reaches_the_lattice_gaussian_on_a_2x2_table():
    # both margins of a 2 x 2 table: the lattice is {k (1, -1, -1, 1)}, m = 1
    C = np.asarray(dp.Invariants.margins((2, 2), [(0,), (1,)]).kernel_basis())
    target = gaussian_log_target(2.0)
    z_all, p = exact_law(C, target, 30)
    walk = LatticeWalk(C, target, a=0.5)
    z, _ = walk.run(50_000, 40, np.random.default_rng(5))
    k = z[:, 0] * np.sign(C[0, 0])
    kk = z_all[:, 0] * np.sign(C[0, 0])
    mean_sq = float(np.sum(p * kk**2))
    # E[k^2] within 4 Monte Carlo standard errors
    sd = math.sqrt(float(np.sum(p * kk**4)) - mean_sq**2)
    assert abs(np.mean(k**2) - mean_sq) < 4 * sd / math.sqrt(z.shape[0])


def test_coupled_chains_have_the_walks_marginals_and_stay_together():
    C = np.asarray(dp.Invariants.total(4).kernel_basis())
    target = laplace_log_target(0.5, "l1")
    walk = LatticeWalk(C, target, a=0.6)
    rng = np.random.default_rng(3)
    n = 20_000
    v, w = walk.initial(n, rng), walk.initial(n, rng)
    lv, lw = target(walk.to_lattice(v)), target(walk.to_lattice(w))
    v1, _, w1, _ = walk.coupled_step(v, lv, w, lw, rng)
    # the lagging chain's step has Algorithm 1's kernel: compare with an uncoupled step from w
    w_ref, _, _ = walk.step(w, lw, rng)
    for j in range(C.shape[1]):
        d1, d2 = w1[:, j] - w[:, j], w_ref[:, j] - w[:, j]
        assert stats.ks_2samp(d1, d2).pvalue > 1e-3
    # chains that are equal stay equal
    v2, _, w2, _ = walk.coupled_step(v, lv, v.copy(), lv.copy(), rng)
    np.testing.assert_array_equal(v2, w2)


def test_meeting_times_and_tv_bound():
    C = np.asarray(dp.Invariants.total(3).kernel_basis())
    walk = LatticeWalk(C, laplace_log_target(1.0, "l1"), a=math.exp(-1.0))
    times = walk.meeting_times(lag=20, n_runs=400, rng=np.random.default_rng(9), max_iterations=5000)
    assert times.n_censored == 0 and np.all(times.tau > 20)
    bound = times.tv_upper_bound([0, 10, 50, 200, 2000])
    assert np.all(np.diff(bound.estimate) <= 0)  # non-increasing in l
    assert bound.estimate[-1] == 0 and bound.upper[-1] == pytest.approx(1 - 0.05 ** (1 / 400))
    assert np.all(bound.upper >= bound.estimate)
    # the bound must hold against the exact TV at iteration l (estimated here by running the
    # walk from pi_0 and comparing with the enumerated law): check at l = 0
    z_all, p = exact_law(C, walk.log_target, 30)
    z0 = walk.to_lattice(walk.initial(100_000, np.random.default_rng(1)))
    index = {tuple(r): i for i, r in enumerate(z_all)}
    q = np.bincount([index[tuple(r)] for r in z0], minlength=p.size) / z0.shape[0]
    tv0 = 0.5 * np.abs(q - p).sum()
    assert bound.estimate[0] >= tv0 - 0.02
    assert times.iterations_for(0.01) <= int(times.tau.max())


@pytest.mark.parametrize("kwargs, pattern", [
    ({"basis": np.ones((3, 2)), "a": 0.5}, "integer matrix"),
    ({"basis": np.ones((3, 2), dtype=int), "a": 1.0}, "must lie in"),
])
def test_walk_rejects_bad_input(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        LatticeWalk(log_target=laplace_log_target(1.0, "l1"), **kwargs)
    with pytest.raises(ValueError, match="norm must be"):
        laplace_log_target(1.0, "linf")


def test_compiled_and_numpy_walks_agree():
    """The compiled kernel (known targets) and the numpy steps (any callable) are the same
    chain: their draws after 30 steps from pi_0 agree in law (two-sample KS per cell)."""
    C = np.asarray(dp.Invariants.margins((3, 3), [(0,), (1,)]).kernel_basis())
    target = laplace_log_target(0.6, "l2")
    walk = LatticeWalk(C, target, a=math.exp(-1.0))
    plain = LatticeWalk(C, lambda z: target(z), a=math.exp(-1.0))  # not a LatticeTarget: numpy path
    z1, r1 = walk.run(20_000, 30, np.random.default_rng(1))
    z2, r2 = plain.run(20_000, 30, np.random.default_rng(2))
    assert abs(r1 - r2) < 0.01
    for i in range(C.shape[0]):
        assert stats.ks_2samp(z1[:, i], z2[:, i]).pvalue > 1e-3
