"""dpinfer.lattice.convolution and its PyTensor Op (dpinfer.inference.engines.pymc.convolution)
against independent references.

References: mpmath enumeration / dynamic programming on the exact float64 inputs (40-50
digits), closed forms (sums of iid Poisson cells are Poisson; given the total, each cell is
Binomial), and the enumerated conditional law for the sampler. The three internal paths --
direct linear-space tree, FFT tree, log-space direct tree -- are each forced through the
package's testing hooks and checked against the same references.

Sampler tests use fixed seeds (deterministic, cannot flake) and a chi-square goodness-of-fit
with expected counts >= 5 (cells pooled); they assert p > 1e-3, i.e. the draws are
unremarkable under the exact law at the Monte Carlo error of 10^5 draws.
"""

import itertools
import warnings

import arviz as az
import mpmath
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad
from scipy import stats

import dpinfer.lattice.convolution.group_totals as conv
import dpinfer.lattice.convolution.tree as conv_tree
from dpinfer.inference.engines.pymc.convolution import ConvolutionLogLikelihood
from dpinfer.lattice.convolution import log_convolution_at, sample_given_sums

MODES = ["default", "fft", "direct", "log"]


@pytest.fixture
def mode(request, monkeypatch):
    """Force one internal path: FFT at every level, direct at every level, or log space."""
    if request.param == "fft":
        monkeypatch.setattr(conv_tree, "_DIRECT_MAX_LEN", 0)
    elif request.param == "direct":
        monkeypatch.setattr(conv_tree, "_DIRECT_MAX_LEN", 10**9)
    elif request.param == "log":
        monkeypatch.setattr(conv, "_FORCE_LOG", True)
    return request.param


# ------------------------------------------------------------------------------------------
# references
# ------------------------------------------------------------------------------------------


def mp_weights(row):
    return [mpmath.exp(mpmath.mpf(float(x))) if np.isfinite(x) else mpmath.mpf(0) for x in row]


def brute_force(log_g, groups, targets):
    """Enumerate every (k_i) of each group in mpmath: (log V (G,), marginals (d, W), law)."""
    d, W = log_g.shape
    G = len(targets)
    logV = np.full(G, -np.inf)
    marg = np.full((d, W), np.nan)
    laws = []
    with mpmath.workdps(40):
        w = [mp_weights(r) for r in log_g]
        for g in range(G):
            cells = np.flatnonzero(groups == g)
            confs, probs = [], []
            for ks in itertools.product(range(W), repeat=len(cells)):
                if sum(ks) == targets[g]:
                    p = mpmath.fprod([w[c][k] for c, k in zip(cells, ks)])
                    if p > 0:
                        confs.append(ks)
                        probs.append(p)
            V = mpmath.fsum(probs)
            laws.append((cells, confs, [float(p / V) for p in probs] if V > 0 else []))
            if V == 0:
                if len(cells) == 0 and targets[g] == 0:
                    logV[g] = 0.0
                continue
            logV[g] = float(mpmath.log(V))
            for j, c in enumerate(cells):
                row = [mpmath.mpf(0)] * W
                for ks, p in zip(confs, probs):
                    row[ks[j]] += p / V
                marg[c] = [float(x) for x in row]
    return logV, marg, laws


_MP_CACHE = {}


def mp_log_conv_at(log_g, t, dps=50):
    """log (g_1 * ... * g_d)(t) by dynamic programming in mpmath (partial sums <= t only)."""
    key = (np.ascontiguousarray(log_g).tobytes(), log_g.shape, int(t), dps)
    if key not in _MP_CACHE:
        _MP_CACHE[key] = _mp_log_conv_at(log_g, int(t), dps)
    return _MP_CACHE[key]


def _mp_log_conv_at(log_g, t, dps):
    with mpmath.workdps(dps):
        acc = [mpmath.mpf(1)] + [mpmath.mpf(0)] * t
        for row in log_g:
            g = mp_weights(row)
            new = [mpmath.mpf(0)] * (t + 1)
            for s, a in enumerate(acc):
                if a == 0:
                    continue
                for k, gk in enumerate(g[: t - s + 1]):
                    new[s + k] += a * gk
            acc = new
        return mpmath.log(acc[t]) if acc[t] > 0 else mpmath.mpf("-inf")


def random_log_g(rng, d, W, p_neg_inf=0.25):
    lg = rng.normal(0.0, 2.0, (d, W))
    lg[rng.random((d, W)) < p_neg_inf] = -np.inf
    lg[np.arange(d), rng.integers(0, W, d)] = rng.normal(size=d)  # >= 1 finite entry per cell
    return lg


def chi_square_p(counts, probs, min_expected=5.0):
    """Goodness-of-fit p-value; cells with expected < min_expected are pooled into one."""
    counts = np.asarray(counts, float)
    expected = counts.sum() * np.asarray(probs, float)
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any():
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    obs, exp = np.array(obs), np.array(exp)
    chi2 = ((obs - exp) ** 2 / exp).sum()
    return stats.chi2.sf(chi2, len(obs) - 1)


def joint_law(laws, d):
    """Joint conditional law over all groups (product of per-group laws) as {config: prob}."""
    law = {(): 1.0}
    cells_all = []
    for cells, confs, probs in laws:
        if len(cells) == 0:
            continue
        law = {a + b: pa * pb for a, pa in law.items() for b, pb in zip(confs, probs)}
        cells_all.extend(cells)
    order = np.argsort(cells_all)
    return {tuple(np.array(k)[order]): p for k, p in law.items()}


def realistic(d, W, G, seed=0, eps=0.5, shift=0):
    """Poisson counts released with double-geometric noise: g_i(k) = p(x = s - K + k) f(K - k)."""
    rng = np.random.default_rng(seed)
    K = (W - 1) // 2
    mu = rng.uniform(5, 200, d)
    a = np.exp(-eps)
    s = rng.poisson(mu) + rng.geometric(1 - a, d) - rng.geometric(1 - a, d)
    k = np.arange(W)
    lg = stats.poisson.logpmf(s[:, None] - K + k, mu[:, None]) + np.log((1 - a) / (1 + a)) - eps * np.abs(k - K)
    groups = np.arange(d) % G
    return lg, groups, np.bincount(groups, minlength=G) * K + shift


# ------------------------------------------------------------------------------------------
# value and marginals
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, indirect=True)
@pytest.mark.parametrize("seed", range(6))
def test_brute_force_small(mode, seed):
    rng = np.random.default_rng(seed)
    d, W = 5, 5
    lg = random_log_g(rng, d, W)
    groups = np.array([0, 1, 0, 1, 0])
    fin = np.isfinite(lg)
    lo = np.argmax(fin, 1)
    hi = W - 1 - np.argmax(fin[:, ::-1], 1)
    # an interior target, each range end, and one unreachable target per group
    cases = [
        [rng.integers(lo[groups == 0].sum(), hi[groups == 0].sum() + 1), rng.integers(lo[[1, 3]].sum(), hi[[1, 3]].sum() + 1)],
        [lo[groups == 0].sum(), hi[[1, 3]].sum()],
        [hi[groups == 0].sum() + 1, max(lo[[1, 3]].sum() - 1, -1)],
    ]
    for targets in cases:
        targets = np.array(targets)
        v, m = log_convolution_at(lg, groups, targets)
        bv, bm, _ = brute_force(lg, groups, targets)
        np.testing.assert_array_equal(np.isfinite(v), np.isfinite(bv))
        fin_v = np.isfinite(bv)
        np.testing.assert_allclose(v[fin_v], bv[fin_v], rtol=0, atol=1e-12)  # |dlog V| = rel. err of V
        rows = fin_v[groups]
        assert np.isnan(m[~rows]).all()  # undefined marginals of unreachable groups
        pos = bm[rows] > 0
        np.testing.assert_allclose(m[rows][pos], bm[rows][pos], rtol=1e-12, atol=0)
        zero_tol = 1e-15 if mode == "fft" else 0.0  # FFT round-off is absolute
        assert np.all(np.abs(m[rows][~pos]) <= zero_tol)


def test_special_groups():
    # empty group, single-cell group, a cell with no finite weight, a point-mass cell
    lg = np.array(
        [
            [0.0, np.log(2.0), -np.inf, np.log(3.0)],
            [-np.inf, -np.inf, -np.inf, -np.inf],
            [np.log(5.0), np.log(7.0), 0.0, -np.inf],
            [-np.inf, 0.0, -np.inf, -np.inf],
            [np.log(0.5), np.log(0.25), np.log(0.125), np.log(0.125)],
        ]
    )
    groups = np.array([0, 1, 3, 3, 2])  # group 4 is empty
    v, m = log_convolution_at(lg, groups, [1, 0, 2, 2, 0])
    assert v[0] == pytest.approx(np.log(2.0), abs=1e-15)
    assert v[1] == -np.inf and np.isnan(m[1]).all()
    assert v[2] == pytest.approx(np.log(0.125), abs=1e-15)
    assert v[3] == pytest.approx(np.log(7.0), abs=1e-15)  # (2, 3) -> 7 * 1
    assert v[4] == 0.0
    np.testing.assert_array_equal(m[0], [0, 1, 0, 0])
    np.testing.assert_array_equal(m[2], [0, 1, 0, 0])
    np.testing.assert_array_equal(m[3], [0, 1, 0, 0])
    v, _ = log_convolution_at(lg, groups, [2, 0, 2, 2, 1])
    assert v[0] == -np.inf  # inside [0, 3] but g_0(2) = 0
    assert v[4] == -np.inf  # empty group, non-zero target
    with pytest.raises(ValueError, match="unreachable"):
        sample_given_sums(lg, groups, [1, 0, 2, 2, 0], rng=0)  # group 1 has V = 0
    x = sample_given_sums(np.delete(lg, 1, 0), np.array([0, 3, 3, 2]), [3, 0, 2, 2, 0], rng=0, size=50)
    assert np.all(x == [3, 1, 1, 2])  # single cell / range ends: one configuration each


@pytest.mark.parametrize("mode", ["default", "fft", "log"], indirect=True)
def test_lattice_gaps(mode):
    """Cells supported on even offsets only: odd totals have V = 0 exactly (FFT round-off
    there is caught by the error bound and recomputed in log space)."""
    rng = np.random.default_rng(5)
    d, W = 6, 9
    lg = rng.normal(size=(d, W))
    lg[:, 1::2] = -np.inf
    groups = np.zeros(d, int)
    for t in [15, 17, 24, 26, 47]:
        v, m = log_convolution_at(lg, groups, [t])
        ref = mp_log_conv_at(lg, t)
        if t % 2:
            assert v[0] == -np.inf and np.isnan(m).all()
        else:
            assert abs(v[0] - float(ref)) < 1e-12
            assert np.all(m[:, 1::2] == 0.0)
            x = sample_given_sums(lg, groups, [t], rng=1, size=200)
            assert np.all(x % 2 == 0) and np.all(x.sum(1) == t)


def gaussian_like(rng, d, W):
    mu = rng.uniform(15, 25, d)
    sig = rng.uniform(1.2, 2.5, d)
    k = np.arange(W)
    return -0.5 * ((k[None, :] - mu[:, None]) / sig[:, None]) ** 2


@pytest.mark.parametrize("mode", ["default", "fft", "log"], indirect=True)
def test_tail_accuracy(mode):
    """Targets 30-46 sd from the mode (V ~ 1e-200 of the mode's value) against mpmath."""
    # Poisson(3) pmfs, 20 cells: total ~ Poisson(60), sd 7.7; t = 420 is 46 sd above the mean
    lg_p = stats.poisson.logpmf(np.arange(40)[None, :], np.full((20, 1), 3.0))
    # discretised Gaussian-like weights, 16 cells; both tails at 30 sd
    rng = np.random.default_rng(11)
    lg_g = gaussian_like(rng, 16, 40)
    fin = np.exp(lg_g)
    mean = (fin @ np.arange(40) / fin.sum(1)).sum()
    sd = np.sqrt((((np.arange(40)[None, :] - (fin @ np.arange(40) / fin.sum(1))[:, None]) ** 2 * fin).sum(1) / fin.sum(1)).sum())
    t_lo, t_hi = int(mean - 30 * sd), int(mean + 30 * sd)
    assert 0 < t_lo and t_hi < 16 * 39
    # one call with two groups: the 16 Gaussian-like cells and the 20 Poisson cells
    lg = np.vstack([lg_g, lg_p])
    groups = np.r_[np.zeros(16, int), np.ones(20, int)]
    for targets in ([t_lo, 420], [t_hi, 60]):
        v, m = log_convolution_at(lg, groups, targets)
        for g in range(2):
            ref = mp_log_conv_at(lg[groups == g], targets[g])
            assert abs(v[g] - float(ref)) < 1e-11, (g, targets[g], v[g], float(ref))
        np.testing.assert_allclose(m.sum(1), 1.0, atol=1e-13)
        assert (m * np.arange(40)).sum(1)[groups == 0].sum() == pytest.approx(targets[0], abs=1e-9)
    # the mode's value, for scale: these tails are ~1e-200 (Gaussian) and ~1e-200 (Poisson) below it
    v_mode, _ = log_convolution_at(lg, groups, [int(mean), 60])
    v_tail, _ = log_convolution_at(lg, groups, [t_lo, 420])
    assert np.all(v_mode - v_tail > np.log(1e190))


def test_poisson_closed_form_fft_scale():
    """300 iid Poisson(10) cells (FFT levels in use): the total is Poisson(3000) and, given
    it, each cell is Binomial(t, 1/300). The float64 rounding of the inputs is added to the
    reference to first order (sum_i E[delta(k_i) | t], computed from the exact marginals)."""
    d, W, mu = 300, 61, 10.0
    k = np.arange(W)
    with mpmath.workdps(40):
        exact = [k_ * mpmath.log(mu) - mu - mpmath.loggamma(k_ + 1) for k_ in range(W)]
        lg1 = np.array([float(e) for e in exact])
        delta = [mpmath.mpf(float(x)) - e for x, e in zip(lg1, exact)]
        lg = np.tile(lg1, (d, 1))
        sd = np.sqrt(d * mu)
        for z in (0, 30, -30):
            t = int(round(d * mu + z * sd))
            v, m = log_convolution_at(lg, np.zeros(d, int), [t])
            bm = stats.binom.pmf(k, t, 1 / d)
            ref = t * mpmath.log(d * mu) - d * mu - mpmath.loggamma(t + 1)
            ref += d * mpmath.fsum(mpmath.mpf(float(b)) * dl for b, dl in zip(bm, delta))
            assert abs(v[0] - float(ref)) < 1e-12, (z, v[0], float(ref))
            np.testing.assert_allclose(m, np.broadcast_to(bm, m.shape), rtol=0, atol=1e-14)


def test_fft_tree_matches_log_space_realistic():
    """Typical NUTS sizes (437 cells, W = 61, 5 groups), away from the mode: the
    default (direct + FFT) tree against the log-space direct tree (no cancellation)."""
    for shift in (140,):
        lg, groups, targets = realistic(437, 61, 5, shift=shift)
        v, m = log_convolution_at(lg, groups, targets)
        conv._FORCE_LOG = True
        try:
            vr, mr = log_convolution_at(lg, groups, targets)
        finally:
            conv._FORCE_LOG = False
        np.testing.assert_allclose(v, vr, rtol=0, atol=1e-12)
        np.testing.assert_allclose(m, mr, rtol=0, atol=1e-14)


def test_wide_windows_circular_fft_matches_log_space():
    """Wide windows as in the real use (double-geometric noise at eps = 0.192, W = 301): FFT
    levels convolve circularly with N < 2 L - 1 (wrap-around only folds tail mass below the
    windows' 1e-25); value and marginals against the log-space direct tree, at the mode and
    ~30 sd into either tail."""
    lg, groups, targets = realistic(40, 301, 2, seed=1, eps=0.192)
    plan = conv._get_plan(groups, 2)
    (m, gids, cells), = plan.buckets
    tree = conv._solve_bucket(conv._gather_cells(lg, cells), targets[gids], False, True).trees[0][0]
    assert any(0 < N < 2 * tree.levels[a].shape[2] - 1 for a, _, N in tree.steps)
    for shift in (0, 900, -900):
        v, m_ = log_convolution_at(lg, groups, targets + shift)
        conv._FORCE_LOG = True
        try:
            vr, mr = log_convolution_at(lg, groups, targets + shift)
        finally:
            conv._FORCE_LOG = False
        np.testing.assert_allclose(v, vr, rtol=0, atol=1e-12)
        np.testing.assert_allclose(m_, mr, rtol=0, atol=1e-14)
        if shift:
            v0, _ = log_convolution_at(lg, groups, targets)
            assert np.all(v0 - v > np.log(1e100))  # deep in the tails


# ------------------------------------------------------------------------------------------
# sampler
# ------------------------------------------------------------------------------------------


def small_sampler_case(seed=2):
    rng = np.random.default_rng(seed)
    d, W = 5, 4
    lg = rng.normal(0.0, 1.0, (d, W))
    lg[0, 1] = lg[3, 3] = -np.inf
    groups = np.array([0, 0, 1, 0, 1])
    return lg, groups, np.array([5, 3])


def config_counts(x, law):
    index = {c: j for j, c in enumerate(law)}
    codes = np.array([index.get(tuple(r), -1) for r in x])
    assert np.all(codes >= 0), "a draw outside the support of the conditional law"
    return np.bincount(codes, minlength=len(law))


@pytest.mark.parametrize("mode", ["default", "fft", "log"], indirect=True)
def test_sampler_exact_law(mode):
    lg, groups, targets = small_sampler_case()
    _, _, laws = brute_force(lg, groups, targets)
    law = joint_law(laws, lg.shape[0])
    x = sample_given_sums(lg, groups, targets, rng=np.random.default_rng(123), size=100_000)
    assert x.shape == (100_000, 5) and x.dtype == np.int64
    counts = config_counts(x, law)
    assert len(law) > 20
    assert chi_square_p(counts, list(law.values())) > 1e-3


def test_sampler_redraws_dead_branches_exactly(monkeypatch):
    """If FFT round-off ever led a draw into a zero-weight branch (the kernel marks it -1),
    that draw is redone from the log-space tree; simulate it and check the law is unchanged."""
    lg, groups, targets = small_sampler_case()
    law = joint_law(brute_force(lg, groups, targets)[2], 5)
    real_descend = conv.descend
    calls = {"log": 0}

    def flaky(tree, tree_idx, t, rng):
        out = real_descend(tree, tree_idx, t, rng)
        if tree.log_mode:
            calls["log"] += 1
        else:
            out[::3] = -1
        return out

    monkeypatch.setattr(conv, "descend", flaky)
    x = sample_given_sums(lg, groups, targets, rng=np.random.default_rng(5), size=30_000)
    assert calls["log"] > 0
    assert chi_square_p(config_counts(x, law), list(law.values())) > 1e-3


def test_batched_sampler_same_law():
    """One draw per batch element, three different (log_g, targets) interleaved in the batch:
    each subsequence follows its exact law, and matches unbatched draws of the same law."""
    rng = np.random.default_rng(9)
    cases = []
    for s in range(3):
        lg, groups, _ = small_sampler_case(seed=10 + s)
        targets = np.array([4 + s, 2 + s])
        cases.append((lg, targets))
    n = 30_000
    batch = np.stack([cases[j % 3][0] for j in range(n)])
    tb = np.stack([cases[j % 3][1] for j in range(n)])
    x = sample_given_sums(batch, groups, tb, rng=rng)
    assert x.shape == (n, 5)
    for s, (lg, targets) in enumerate(cases):
        law = joint_law(brute_force(lg, groups, targets)[2], 5)
        cb = config_counts(x[s::3], law)
        assert chi_square_p(cb, list(law.values())) > 1e-3
        cu = config_counts(sample_given_sums(lg, groups, targets, rng=rng, size=n // 3), law)
        keep = (cb + cu) > 0
        assert stats.chi2_contingency(np.vstack([cb[keep], cu[keep]]))[1] > 1e-3
    # (G,) targets are broadcast over the batch
    y = sample_given_sums(batch[:30], groups, cases[0][1], rng=1)
    assert np.all([np.bincount(groups, weights=r) for r in y] == cases[0][1])


def test_sampler_means_realistic():
    """FFT-sized trees: per-cell means of the draws against the marginals (z-scores), for
    an unbatched call (5 groups, 4000 draws) and a batch of 500 copies (1 group)."""
    lg, groups, targets = realistic(437, 61, 5, seed=3)
    _, m = log_convolution_at(lg, groups, targets)
    k = np.arange(61)
    mean = m @ k
    sd = np.sqrt(m @ k**2 - mean**2)
    x = sample_given_sums(lg, groups, targets, rng=np.random.default_rng(4), size=4000)
    assert np.all([np.bincount(groups, weights=r, minlength=5) == targets for r in x[:50]])
    z = (x.mean(0) - mean) / (sd / np.sqrt(4000))
    assert np.abs(z).max() < 5.0  # Bonferroni over 437 cells: P(max |z| > 5) < 3e-4
    lg1, g1, t1 = realistic(102, 61, 1, seed=5, shift=-40)
    _, m1 = log_convolution_at(lg1, g1, t1)
    xb = sample_given_sums(np.broadcast_to(lg1, (500, 102, 61)), g1, t1, rng=np.random.default_rng(6))
    assert np.all(xb.sum(1) == t1[0])
    assert np.isfinite(np.take_along_axis(lg1, xb.T, axis=1)).all()
    mean1 = m1 @ k
    sd1 = np.sqrt(m1 @ k**2 - mean1**2)
    z1 = (xb.mean(0) - mean1) / (sd1 / np.sqrt(500))
    assert np.abs(z1).max() < 5.0


# ------------------------------------------------------------------------------------------
# gradient and PyTensor / PyMC
# ------------------------------------------------------------------------------------------


def test_verify_grad_and_disconnected_targets():
    rng = np.random.default_rng(0)
    lg = rng.normal(size=(5, 4))
    groups = (0, 1, 0, 1, 1)
    op = ConvolutionLogLikelihood(groups)
    assert op == ConvolutionLogLikelihood(list(groups)) and hash(op) == hash(ConvolutionLogLikelihood(groups))
    targets = pt.as_tensor(np.array([3, 5]))
    verify_grad(lambda a: op(a, targets), [lg], rng=np.random.default_rng(1))
    x = pt.dmatrix("x")
    t = pt.lvector("t")
    out = op(x, t)
    assert out.ndim == 0 and out.dtype == "float64"
    g_t = pytensor.grad(out, t, disconnected_inputs="ignore", return_disconnected="disconnected")
    assert "Disconnected" in str(g_t.type)
    f = pytensor.function([x, t], [out, pytensor.grad(out, x)])
    val, grad = f(lg, [3, 5])
    ref_v, ref_m = log_convolution_at(lg, np.array(groups), [3, 5])
    assert val == pytest.approx(ref_v.sum(), abs=1e-13)
    np.testing.assert_allclose(grad, ref_m, atol=1e-15)
    val, grad = f(lg, [3, 20])  # group 1 unreachable: -inf; its cells get zero gradient
    assert val == -np.inf
    g0 = np.array(groups) == 0
    assert np.all(grad[~g0] == 0)
    np.testing.assert_allclose(grad[g0], ref_m[g0], atol=1e-15)
    bad = lg.copy()
    bad[0, 0] = np.nan
    assert np.isnan(f(bad, [3, 5])[0])


@pytest.mark.parametrize("mode", ["default", "fft"], indirect=True)
def test_marginals_are_finite_difference_gradient(mode):
    lg, groups, targets = realistic(40, 31, 2, seed=7, shift=9)
    _, m = log_convolution_at(lg, groups, targets)
    rng = np.random.default_rng(8)
    h = 1e-5
    for i, k in zip(rng.integers(0, 40, 25), rng.integers(5, 25, 25)):
        up, dn = lg.copy(), lg.copy()
        up[i, k] += h
        dn[i, k] -= h
        fd = (log_convolution_at(up, groups, targets)[0] - log_convolution_at(dn, groups, targets)[0]) / (2 * h)
        assert fd[groups[i]] == pytest.approx(m[i, k], abs=1e-8)
        assert abs(fd[1 - groups[i]]) < 1e-8  # other group unaffected


def pymc_case():
    s = np.array([12, 7, 20, 3, 9, 15])
    d, W, K = 6, 9, 4
    k = np.arange(W)
    eps = 1.0
    a = np.exp(-eps)
    noise = np.log((1 - a) / (1 + a)) - eps * np.abs(k - K)
    xs = s[:, None] - K + k[None, :]
    return s, xs, noise, np.array([d * K])


def log_g_graph(mu, xs, noise):
    lp = pm.logp(pm.Poisson.dist(pt.exp(mu)), np.maximum(xs, 0))
    return pt.switch(xs >= 0, lp, -np.inf) + noise[None, :]


def test_pymc_potential_and_customdist_compile():
    s, xs, noise, targets = pymc_case()
    op = ConvolutionLogLikelihood([0] * len(s))
    with pm.Model() as m1:
        mu = pm.Normal("mu", 2.0, 1.0)
        pm.Potential("lik", op(log_g_graph(mu, xs, noise), targets))
    with pm.Model() as m2:  # the released total as the observed value of a scalar CustomDist
        mu = pm.Normal("mu", 2.0, 1.0)
        pm.CustomDist(
            "T", mu, logp=lambda value, mu: op(log_g_graph(mu, xs, noise), value[None]),
            observed=targets[0], dtype="int64",
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for model in (m1, m2):
            logp = model.compile_logp()
            dlogp = model.compile_dlogp()
            for mu0 in (1.5, 2.4, 4.0):
                lgv = stats.poisson.logpmf(xs, np.exp(mu0)) + noise[None, :]
                ref = stats.norm.logpdf(mu0, 2.0, 1.0) + log_convolution_at(lgv, np.zeros(6, int), targets)[0][0]
                assert logp({"mu": mu0}) == pytest.approx(ref, abs=1e-10)
                h = 1e-6
                fd = (logp({"mu": mu0 + h}) - logp({"mu": mu0 - h})) / (2 * h)
                assert dlogp({"mu": mu0})[0] == pytest.approx(fd, abs=1e-6)


def test_nuts_small():
    """Small NUTS run (tune = draws = 200, one chain, one parameter) against the exact
    posterior mean by quadrature, within 4 Monte Carlo standard errors."""
    s, xs, noise, targets = pymc_case()
    op = ConvolutionLogLikelihood([0] * len(s))
    with pm.Model():
        mu = pm.Normal("mu", 2.0, 1.0)
        pm.Potential("lik", op(log_g_graph(mu, xs, noise), targets))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pm.sample(
                tune=200, draws=200, chains=1, random_seed=1, progressbar=False,
                compute_convergence_checks=False, nuts_sampler="pymc",  # the Op runs in Python
            )
    draws = idata.posterior["mu"].values.ravel()
    grid = np.linspace(0.0, 5.0, 2001)
    lp = np.array([
        stats.norm.logpdf(g, 2.0, 1.0)
        + log_convolution_at(stats.poisson.logpmf(xs, np.exp(g)) + noise[None, :], np.zeros(6, int), targets)[0][0]
        for g in grid
    ])
    w = np.exp(lp - lp.max())
    w /= w.sum()
    post_mean = (w * grid).sum()
    post_sd = np.sqrt((w * grid**2).sum() - post_mean**2)
    assert w[0] < 1e-12 and w[-1] < 1e-12  # grid covers the posterior
    ess = float(az.ess(draws[None, :]))
    assert ess > 30
    assert abs(draws.mean() - post_mean) < 4 * post_sd / np.sqrt(ess)


# ------------------------------------------------------------------------------------------
# input validation
# ------------------------------------------------------------------------------------------


def test_shape_errors_name_the_argument():
    lg = np.zeros((4, 3))
    with pytest.raises(ValueError, match="log_g"):
        log_convolution_at(np.zeros(4), [0, 0, 0, 0], [1])
    with pytest.raises(ValueError, match="groups"):
        log_convolution_at(lg, [0, 0, 0], [1])
    with pytest.raises(ValueError, match="groups"):
        log_convolution_at(lg, [0, 0, 1, 2], [1, 1])  # code 2 but G = 2
    with pytest.raises(ValueError, match="targets"):
        log_convolution_at(lg, [0, 0, 0, 0], [[1]])
    with pytest.raises(ValueError, match="targets"):
        log_convolution_at(lg, [0, 0, 0, 0], [1.5])
    with pytest.raises(ValueError, match="log_g"):
        log_convolution_at(np.full((4, 3), np.nan), [0, 0, 0, 0], [1])
    with pytest.raises(ValueError, match="targets"):
        sample_given_sums(np.zeros((7, 4, 3)), [0, 0, 0, 0], np.ones((6, 1), int), rng=0)
    with pytest.raises(ValueError, match="size"):
        sample_given_sums(np.zeros((7, 4, 3)), [0, 0, 0, 0], [1], rng=0, size=3)
    with pytest.raises(ValueError, match="log_g"):
        sample_given_sums(np.zeros((2, 7, 4, 3)), [0, 0, 0, 0], [1], rng=0)
    with pytest.raises(ValueError, match="log_g"):
        ConvolutionLogLikelihood([0, 0, 0])(pt.as_tensor(lg), pt.as_tensor(np.array([1])))
    with pytest.raises(ValueError, match="targets"):
        ConvolutionLogLikelihood([0, 0, 0, 0])(pt.as_tensor(lg), pt.as_tensor(np.array([1.0])))
