"""Nested sums (dpinfer.lattice.nested): term tables against closed forms, and the exact moves
against exhaustive enumeration of a small multi-level table (2 leaves x 4 cells, measurements
at three levels, summed discrete Gaussians (one a quadratic to round-off, one not), an
equality and an inequality)."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpinfer._random_stream import new_stream
from dpinfer.lattice.nested.directions import sweep_products
from dpinfer.lattice.nested.kernel import (DEFAULT_TRIM, DENSE_CELLS, cells_redrawn_alone, draw_direction,
                                           log_mass_ratio, quadratic_forms, workspace)
from dpinfer.lattice.nested.sampler import NestedGibbs
from dpinfer.lattice.nested.structure import NestedSums
from dpinfer.lattice.nested.terms import TermTables, quadratic_tables, term_log


def dg_log_pmf(e, sigma2):
    """log N_Z(0, sigma2) at e, normaliser summed over |k| <= 2000 (closed form per term)."""
    k = np.arange(-2000, 2001)
    return -np.asarray(e, float) ** 2 / (2 * sigma2) - np.logaddexp.reduce(-k * k / (2 * sigma2))


def summed_dg_log_pmf(e, sigma2, m):
    """log pmf of the sum of m discrete Gaussians by explicit repeated sums over k."""
    k = np.arange(-300, 301)
    pmf = np.exp(dg_log_pmf(k, sigma2))
    total = pmf.copy()
    for _ in range(m - 1):
        total = np.convolve(total, pmf)
    centre = (total.size - 1) // 2
    return np.log(total[centre + np.asarray(e)])


@pytest.mark.parametrize("sigma2,m", [(0.3, 1), (2.0, 1), (10.0, 1), (1.5, 2), (0.7, 5), (4.0, 9)])
def test_summed_discrete_gaussian_table_matches_the_explicit_convolution(sigma2, m):
    tables = TermTables()
    k = tables.add_discrete_gaussian(sigma2, m)
    e = np.arange(-25, 26)
    got = tables.log_weight(k, e)
    with np.errstate(divide="ignore"):
        want = summed_dg_log_pmf(e, sigma2, m)
    inside = want > -700  # the reference underflows in linear space beyond
    np.testing.assert_allclose(got[inside], want[inside], rtol=1e-12, atol=1e-12)
    assert np.all(got[~inside] < -690)
    if m == 1:  # beyond the table, the quadratic continues the exact pmf
        far = np.array([-400, 333, 1000]) * int(math.ceil(math.sqrt(sigma2)))
        np.testing.assert_allclose(tables.log_weight(k, far), dg_log_pmf(far, sigma2), rtol=1e-12)


@pytest.mark.parametrize("sigma2,m,quadratic", [(0.3, 1, True), (0.05, 1, True), (4.0, 2, True), (5.0, 8, True),
                                                (0.4, 3, False), (0.7, 5, False), (1.5, 2, False)])
def test_quadratic_tables_are_the_quadratic_to_round_off(sigma2, m, quadratic):
    """One discrete Gaussian is a quadratic in e exactly; a sum of m is not: by Poisson
    summation its log pmf departs from the quadratic of variance m sigma^2 by terms of order
    exp(-pi^2 sigma^2) that alternate with e's parity (1.5e-6 nats at sigma^2 = 1.5, m = 2,
    below 1e-17 from sigma^2 = 4). The classification agrees with the explicit convolution."""
    tables = TermTables()
    tables.add_discrete_gaussian(sigma2, m)
    tables.add_equality(), tables.add_at_most(), tables.add_at_least(), tables.add_group_mixing(2.0, 3.0, 5.0)
    assert list(quadratic_tables(*tables.arrays())) == [quadratic, False, False, False, False]
    e = np.arange(-6, 7)
    with np.errstate(divide="ignore"):
        exact = summed_dg_log_pmf(e, sigma2, m)
    deviation = np.max(np.abs(exact - exact[6] + e * e / (2 * m * sigma2)))
    assert (deviation < 1e-12) == quadratic


def test_quadratic_forms_match_the_terms_one_by_one():
    """H and Y (kernel.quadratic_forms) against the sums over the quadratic terms of each area,
    written out; d' H d and d' (Y - H S) against sum_r a_r^2 / (2 v_r) and sum_r a_r e_r / (2 v_r)
    for random directions and sums; areas measured alike share one pattern of H, and only
    they (the two leaves here: the same tables on the same cells, values apart)."""
    sums, terms = small_table()
    meta, inv2v, values = sums.tables.arrays()
    quadratic = quadratic_tables(meta, inv2v, values)[sums.term_table]
    hq, pattern, yq = quadratic_forms(sums.term_ptr, sums.term_cells, sums.term_table, sums.term_value, inv2v,
                                      quadratic)
    assert pattern[2] == pattern[3] and len({pattern[0], pattern[1], pattern[2]}) == 3 and hq.shape[0] == 3
    rng = np.random.default_rng(3)
    for v in range(sums.n_areas):
        mine = [r for r in range(sums.term_ptr[v], sums.term_ptr[v + 1]) if quadratic[r]]
        w = inv2v[sums.term_table[mine]]
        cells = sums.term_cells[mine].astype(float)
        h = hq[pattern[v]]
        np.testing.assert_allclose(h, (cells * w[:, None]).T @ cells, rtol=1e-15)
        np.testing.assert_allclose(yq[v], (cells * (w * sums.term_value[mine])[:, None]).sum(0), rtol=1e-15)
        for _ in range(5):
            d = rng.integers(-1, 2, C)
            S = rng.integers(0, 9, C)
            a = cells @ d
            e = sums.term_value[mine] - cells @ S
            assert d @ h @ d == pytest.approx(np.sum(w * a * a), rel=1e-13, abs=1e-13)
            assert d @ (yq[v] - h @ S) == pytest.approx(np.sum(w * a * e), rel=1e-13, abs=1e-12)


def test_bound_and_equality_tables():
    tables = TermTables()
    eq, le, ge = tables.add_equality(), tables.add_at_most(), tables.add_at_least()
    e = np.array([-3, -1, 0, 1, 5])
    assert list(tables.log_weight(eq, e)) == [-np.inf, -np.inf, 0, -np.inf, -np.inf]
    assert list(tables.log_weight(le, e)) == [-np.inf, -np.inf, 0, 0, 0]  # t <= y: e = y - t >= 0
    assert list(tables.log_weight(ge, e)) == [0, 0, 0, -np.inf, -np.inf]
    assert tables.add_discrete_gaussian(2.0) == tables.add_discrete_gaussian(2.0)  # stored once
    with pytest.raises(ValueError, match="sigma2"):
        tables.add_discrete_gaussian(0.0)


# ---- the small multi-level table --------------------------------------------------------------
C = 4
LAM = np.array([[1.5, 2.0, 0.8, 1.2], [1.0, 2.5, 1.1, 0.6]])  # Poisson priors, leaf x cell
TOTAL = 10


def small_table():
    """Areas: 0 root, 1 mid (both leaves), 2 and 3 the leaves. Terms at three levels: per-cell
    and total measurements at the leaves, a measurement of cells {0, 1} summed over two
    published noises and one of {2, 3} at mid, the root's total exact, cells {0, 1} at most 6
    and cell 2 measured at the root."""
    tables = TermTables()
    terms = []

    def add(area, cells, value, table, name):
        mask = np.zeros(C, bool)
        mask[list(cells)] = True
        terms.append((area, mask, value, table, name))

    release = [1, 3, 0, 2, 2, 0, 1, 1]
    for leaf, area in enumerate([2, 3]):
        for c in range(C):
            add(area, [c], release[leaf * C + c], tables.add_discrete_gaussian(2.0), f"leaf{leaf}/cell{c}")
        add(area, range(C), [6, 4][leaf], tables.add_discrete_gaussian(1.0), f"leaf{leaf}/total")
    add(1, [0, 1], 5, tables.add_discrete_gaussian(1.5, 2), "mid/cells 0+1 (summed)")
    add(1, [1, 2], 3, tables.add_discrete_gaussian(0.4, 3), "mid/cells 1+2 (summed, not a quadratic)")
    add(1, [2, 3], 4, tables.add_discrete_gaussian(3.0), "mid/cells 2+3")
    add(0, range(C), TOTAL, tables.add_equality(), "root/total (=)")
    add(0, [0, 1], 6, tables.add_at_most(), "root/cells 0+1 (<=)")
    add(0, [2], 2, tables.add_discrete_gaussian(0.7), "root/cell 2")
    area, cells, value, table, name = zip(*terms)
    return NestedSums([-1, 0, 1, 1], [2, 3], C, area, np.array(cells), value, table, tables, name), terms


def poisson_prior(states):
    return stats.poisson.logpmf(states, LAM).sum((1, 2))


def enumerate_posterior(prior=poisson_prior):
    """Every x >= 0 with total TOTAL (the equality) and its posterior log probability
    (normalised), computed with the independent pmfs above (no dpinfer table); ``prior``:
    states (K, 2, C) -> their prior log pmf (K,)."""
    _, terms = small_table()
    n = 2 * C
    comps = np.array(list(itertools.combinations(range(TOTAL + n - 1), n - 1)))  # stars and bars
    bars = np.concatenate([np.full((len(comps), 1), -1), comps, np.full((len(comps), 1), TOTAL + n - 1)], 1)
    states = (np.diff(bars, axis=1) - 1).reshape(-1, 2, C)
    S = {2: states[:, 0], 3: states[:, 1], 1: states.sum(1), 0: states.sum(1)}
    logp = prior(states)
    summed = summed_dg_log_pmf(np.arange(-30, 31), 1.5, 2)
    rough = summed_dg_log_pmf(np.arange(-30, 31), 0.4, 3)
    for area, mask, value, _, name in terms:
        e = value - S[area][:, mask].sum(1)
        if "(=)" in name:
            logp = logp + np.where(e == 0, 0.0, -np.inf)
        elif "(<=)" in name:
            logp = logp + np.where(e >= 0, 0.0, -np.inf)
        elif "not a quadratic" in name:
            logp = logp + rough[e + 30]
        elif "summed" in name:
            logp = logp + summed[e + 30]
        else:
            sigma2 = {"leaf": 2.0 if "cell" in name else 1.0, "mid/": 3.0, "root": 0.7}[name[:4]]
            logp = logp + dg_log_pmf(e, sigma2)
    logp -= np.logaddexp.reduce(logp)
    return states, logp


@pytest.fixture(scope="module")
def posterior():
    states, logp = enumerate_posterior()
    return states, np.exp(logp), logp


def gibbs(sums):
    # every count's box covers its whole support 0 .. TOTAL and beyond, by 1 to 3 (an open
    # edge; boxes of different widths: the flat prior table's rows differ in length)
    hi = TOTAL + 1 + np.arange(LAM.size).reshape(LAM.shape) % 3
    g = NestedGibbs(sums, 0, hi)
    prior = stats.poisson.logpmf(g.grid(), LAM.reshape(-1)[g.rows()])
    return g, np.ascontiguousarray(prior)


def test_the_log_weight_of_the_structure_matches_the_enumeration(posterior):
    sums, _ = small_table()
    states, p, logp = posterior
    rng = np.random.default_rng(0)
    ref = int(np.argmax(p))
    lp0 = sums.log_weight(states[ref]) + float(np.sum(stats.poisson.logpmf(states[ref], LAM)))
    for i in rng.choice(len(states), 40):
        lp = sums.log_weight(states[i]) + float(np.sum(stats.poisson.logpmf(states[i], LAM)))
        if logp[i] == -np.inf:
            assert lp == -np.inf
        else:
            assert lp - lp0 == pytest.approx(logp[i] - logp[ref], abs=1e-9)


def _chi2_pvalue(observed, expected_p):
    """The chi-square test's p-value of counts ``observed`` on ordered values against the
    probabilities ``expected_p``: runs of neighbouring values merged from the left until each
    bin expects at least 5 (the last run's remainder joins the bin before it), so no bin with a
    tiny expectation decides the test. A draw on a value of probability 0 gives 0."""
    observed, expected = np.asarray(observed, float), np.asarray(expected_p, float) * np.sum(observed)
    if np.any(observed[expected_p == 0] > 0):
        return 0.0
    obs, exp, o, e = [], [], 0.0, 0.0
    for oi, ei in zip(observed, expected):
        o, e = o + oi, e + ei
        if e >= 5:
            obs.append(o), exp.append(e)
            o, e = 0.0, 0.0
    if e > 0 and obs:
        obs[-1], exp[-1] = obs[-1] + o, exp[-1] + e
    elif e > 0:
        obs, exp = [o], [e]
    return stats.chisquare(obs, exp).pvalue


def reachable(states, x0, dcells, dsigns) -> np.ndarray:
    """Which states are x0 + z (.) d, one integer z_l per leaf: those a move along the
    direction (dcells, dsigns) reaches from x0."""
    d = np.zeros(C, np.int64)
    d[dcells] = dsigns
    return np.array([np.all((s - x0) * (d == 0) == 0) and
                     all(len(set(((s - x0)[leaf][dcells] * dsigns).tolist())) == 1 for leaf in range(2))
                     for s in states])


def check_log_mass_ratio(sums, g, prior, values, states, logp, direction):
    """log_mass_ratio from several states equals the enumeration's log of (the posterior mass
    of the states the move reaches / the state's), to round-off."""
    dcells, dsigns = (np.array(v, np.int64) for v in direction)
    meta, inv2v, _ = sums.tables.arrays()
    work = workspace(sums.order, sums.child_area, sums.term_ptr, sums.term_cells, sums.term_value, sums.term_table, meta,
                     inv2v, values, g.box_lo, g.box_hi)
    order = np.argsort(-logp)
    for i in order[[0, 3, 10, 40, 200]]:
        x0 = states[i]
        reach = reachable(states, x0, dcells, dsigns)
        want = np.logaddexp.reduce(logp[reach]) - logp[i]
        for trim in (DEFAULT_TRIM, 600.0):  # the sampler's trim, and the benchmark's wide one
            got = log_mass_ratio(dcells, dsigns, x0.copy(), sums.term_sums(x0), g.box_lo, g.box_hi, prior,
                                 g.prior_start, sums.order, sums.child_ptr, sums.child_area, sums.area_leaf,
                                 sums.term_cells, sums.term_value, sums.term_table, meta, inv2v, values,
                                 trim, work)
            assert got == pytest.approx(want, abs=1e-9)


def check_one_move(sums, g, prior, values, states, p, direction, seed):
    """From the posterior's mode, one move along ``direction``, 10,000 times: the draws' law
    is the enumerated posterior p restricted to the states that move reaches (chi-square),
    and the sums kept stay the counts'."""
    x0 = states[np.argmax(p)]
    dcells, dsigns = (np.array(v, np.int64) for v in direction)
    reach = reachable(states, x0, dcells, dsigns)
    target = p * reach
    target /= target.sum()
    index = {s.tobytes(): i for i, s in enumerate(states)}
    counts = np.zeros(len(states))
    meta, inv2v, _ = sums.tables.arrays()
    rng = new_stream(np.random.default_rng(seed))
    stat = np.zeros(3, np.int64)
    S0, t0 = sums.area_sums(x0), sums.term_sums(x0)
    for _ in range(10_000):
        x, S, t = x0.copy(), S0.copy(), t0.copy()
        assert draw_direction(dcells, dsigns, x, S, t, g.box_lo, g.box_hi, g.lo_open, g.hi_open, prior,
                              g.prior_start, sums.order, sums.child_ptr, sums.child_area, sums.area_leaf, sums.term_ptr,
                              sums.term_cells, sums.term_value, sums.term_table, meta, inv2v, values,
                              DEFAULT_TRIM, rng, stat)
        assert np.array_equal(S, sums.area_sums(x)) and np.array_equal(t, sums.term_sums(x))
        counts[index[x.tobytes()]] += 1
    assert counts[~reach].sum() == 0
    assert _chi2_pvalue(counts, target) > 1e-3
    assert stat[1] == 0 and stat[2] == 0


@pytest.mark.parametrize("direction", [([0], [1]), ([2], [1]), ([1, 3], [1, -1]), ([0, 1], [1, -1])])
def test_one_move_draws_the_exact_conditional(posterior, direction):
    """From a fixed state, one move along a direction, 10,000 times: the draws' law is the
    enumerated posterior restricted to the states that move reaches (chi-square)."""
    sums, _ = small_table()
    g, prior = gibbs(sums)
    states, p, logp = posterior
    check_one_move(sums, g, prior, sums.tables.arrays()[2], states, p, direction, 1)


def check_cells_redrawn_alone(sums, g, prior, values, states, p, seed):
    """From the posterior's mode x0, 2,500 calls of 4 copies: each cell's column in the copies
    has the enumerated posterior's law restricted to the states a move along that cell alone
    reaches (chi-square), two copies of one call are independent (chi-square of the pairs of
    cell 0 against the product of that law), and x0 and its sums are left as they were."""
    x0 = states[np.argmax(p)]
    S0, t0 = sums.area_sums(x0), sums.term_sums(x0)
    x, S, t = x0.copy(), S0.copy(), t0.copy()
    meta, inv2v, _ = sums.tables.arrays()
    rng = new_stream(np.random.default_rng(seed))
    calls, copies = 2500, 4
    draws = np.empty((calls, copies) + x0.shape, np.int64)
    for i in range(calls):
        assert cells_redrawn_alone(x, S, t, g.box_lo, g.box_hi, prior, g.prior_start, sums.order, sums.child_ptr,
                                   sums.child_area, sums.area_leaf, sums.term_ptr, sums.term_cells, sums.term_value,
                                   sums.term_table, meta, inv2v, values, DEFAULT_TRIM, rng, draws[i])
    assert np.array_equal(x, x0) and np.array_equal(S, S0) and np.array_equal(t, t0)
    index = {s.tobytes(): i for i, s in enumerate(states)}
    for c in range(C):
        reach = reachable(states, x0, np.array([c]), np.array([1]))
        target = p * reach
        target /= target.sum()
        state = x0.copy()
        drawn = np.empty((calls, copies), np.int64)
        for i, j in itertools.product(range(calls), range(copies)):
            state[:, c] = draws[i, j, :, c]
            drawn[i, j] = index[state.tobytes()]
        counts = np.bincount(drawn.ravel(), minlength=len(states)).astype(float)
        assert counts[~reach].sum() == 0
        assert _chi2_pvalue(counts, target) > 1e-3
        if c == 0:
            support = np.flatnonzero(target * calls >= 20)
            pairs = np.zeros((support.size, support.size))
            kept = np.isin(drawn[:, 0], support) & np.isin(drawn[:, 1], support)
            np.add.at(pairs, (np.searchsorted(support, drawn[kept, 0]), np.searchsorted(support, drawn[kept, 1])), 1)
            law = target[support] / target[support].sum()
            assert support.size >= 3 and _chi2_pvalue(pairs.ravel(), np.outer(law, law).ravel()) > 1e-3


def test_cells_redrawn_alone_are_independent_exact_conditionals(posterior):
    """The copies of cells_redrawn_alone (the empirical-Bayes score's Rao-Blackwell average)
    against the enumeration (check_cells_redrawn_alone)."""
    sums, _ = small_table()
    g, prior = gibbs(sums)
    states, p, _ = posterior
    check_cells_redrawn_alone(sums, g, prior, sums.tables.arrays()[2], states, p, 2)


@pytest.mark.parametrize("direction", [([0], [1]), ([2], [1]), ([1, 3], [1, -1]), ([0, 1], [1, -1])])
def test_log_mass_ratio_is_the_enumerated_mass_along_the_direction(posterior, direction):
    """The upward pass's normaliser: log (mass of the states a move reaches / the state's)
    against the enumeration, from several states."""
    sums, _ = small_table()
    g, prior = gibbs(sums)
    states, p, logp = posterior
    check_log_mass_ratio(sums, g, prior, sums.tables.arrays()[2], states, logp, direction)


@pytest.mark.parametrize("direction", [([0], [1]), ([1, 3], [1, -1]), ([0, 1], [1, -1])])
def test_a_table_wider_than_dense_cells_reads_its_terms_and_keeps_the_law(posterior, direction):
    """With more than DENSE_CELLS cells the moves read every term from its table (no quadratic
    forms): the small table with DENSE_CELLS cells more, each boxed at 0 and in no term, gives
    the same log_mass_ratio from the same states as its 4 cells alone (which the enumeration
    checks, through the quadratic forms)."""
    sums, _ = small_table()
    g, prior = gibbs(sums)
    extra = DENSE_CELLS
    cells = np.zeros((sums.term_cells.shape[0], C + extra), bool)
    cells[:, :C] = sums.term_cells
    wide = NestedSums(sums.parent, sums.leaf_area, C + extra, sums.term_area, cells, sums.term_value,
                      sums.term_table, sums.tables, sums.term_name)
    hi = np.zeros((2, C + extra), np.int64)
    hi[:, :C] = g.box_hi
    gw = NestedGibbs(wide, 0, hi)
    prior_wide = np.zeros(gw.prior_start[-1])  # the cells beyond C: one value, 0, log weight 0
    for leaf in range(2):
        for c in range(C):
            w, n = leaf * (C + extra) + c, leaf * C + c
            prior_wide[gw.prior_start[w]:gw.prior_start[w] + gw.widths[w]] = prior[g.prior_start[n]:g.prior_start[n] + g.widths[n]]
    meta, inv2v, values = sums.tables.arrays()
    dcells, dsigns = (np.array(v, np.int64) for v in direction)
    work = workspace(sums.order, sums.child_area, sums.term_ptr, sums.term_cells, sums.term_value, sums.term_table,
                     meta, inv2v, values, g.box_lo, g.box_hi)
    work_wide = workspace(wide.order, wide.child_area, wide.term_ptr, wide.term_cells, wide.term_value,
                          wide.term_table, meta, inv2v, values, gw.box_lo, gw.box_hi)
    assert work[2].any() and not work_wide[2].any()  # quadratic forms in the small table only
    states, p, logp = posterior
    for i in np.argsort(-logp)[[0, 3, 10, 40]]:
        x0 = states[i]
        x0_wide = np.zeros((2, C + extra), np.int64)
        x0_wide[:, :C] = x0
        want = log_mass_ratio(dcells, dsigns, x0.copy(), sums.term_sums(x0), g.box_lo, g.box_hi, prior,
                              g.prior_start, sums.order, sums.child_ptr, sums.child_area, sums.area_leaf,
                              sums.term_cells, sums.term_value, sums.term_table, meta, inv2v, values,
                              DEFAULT_TRIM, work)
        got = log_mass_ratio(dcells, dsigns, x0_wide, wide.term_sums(x0_wide), gw.box_lo, gw.box_hi, prior_wide,
                             gw.prior_start, wide.order, wide.child_ptr, wide.child_area, wide.area_leaf,
                             wide.term_cells, wide.term_value, wide.term_table, meta, inv2v, values,
                             DEFAULT_TRIM, work_wide)
        assert got == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("cell_shape", [(4,), (2, 2)])
def test_a_sweep_keeps_the_posterior(posterior, cell_shape):
    """Start 6,000 independent chains at exact posterior draws, make one sweep each (cells and
    pairs; or, as a 2 x 2 table, cells, pairs along each axis and squares): the result
    is again distributed as the posterior (chi-square on every count's marginal and on the
    joint of the leaf totals), and the area and term sums are the counts'."""
    sums, _ = small_table()
    g, prior = gibbs(sums)
    states, p, logp = posterior
    rng = np.random.default_rng(2)
    starts = rng.choice(len(states), size=6000, p=p)
    out = np.empty((starts.size, 2, C), np.int64)
    meta, inv2v, values = sums.tables.arrays()
    stream = new_stream(rng)
    stat = np.zeros(3, np.int64)
    for i, s in enumerate(starts):
        x = states[s].copy()
        S, t = sums.area_sums(x), sums.term_sums(x)
        assert sweep_products(x, S, t, g.box_lo, g.box_hi, g.lo_open,
                              g.hi_open, prior, g.prior_start, sums.order, sums.child_ptr, sums.child_area, sums.area_leaf,
                              sums.term_ptr, sums.term_cells, sums.term_value, sums.term_table, meta, inv2v,
                              values, DEFAULT_TRIM, np.array(cell_shape), stream, stat) == 0
        if i < 100:  # the sums the sweep keeps (the quadratic terms' settled at its end)
            np.testing.assert_array_equal(S, sums.area_sums(x))
            np.testing.assert_array_equal(t, sums.term_sums(x))
        out[i] = x
    pvalues = []
    for leaf in range(2):
        for c in range(C):
            marg = np.bincount(states[:, leaf, c], weights=p, minlength=TOTAL + 1)
            pvalues.append(_chi2_pvalue(np.bincount(out[:, leaf, c], minlength=TOTAL + 1).astype(float), marg))
    lt = states.sum(2)[:, 0]
    pvalues.append(_chi2_pvalue(np.bincount(out.sum(2)[:, 0], minlength=TOTAL + 1).astype(float),
                                np.bincount(lt, weights=p, minlength=TOTAL + 1)))
    # 9 tests: Bonferroni at 1e-3 overall
    assert min(pvalues) > 1e-3 / len(pvalues), pvalues


def check_chain_means(g, x0, prior, states, p, seed) -> np.ndarray:
    """20,000 sweeps of ``g`` from x0: no move without mass, no trimmed edge, and every count's
    posterior mean (after 1,000) within 5 batch-means standard errors (50 batches) of the
    enumeration's (p over states). Returns the draws."""
    draws, info = g.run(x0, prior, 20_000, np.random.default_rng(seed))
    assert info["moves_without_mass"] == 0 and info["trimmed_edges_hit"] == 0
    exact = np.tensordot(p, states, axes=1)
    kept = draws[1000:].reshape(-1, 2 * C).astype(float)
    batches = kept.reshape(50, -1, 2 * C).mean(1)
    se = batches.std(0, ddof=1) / math.sqrt(50)
    z = (kept.mean(0) - exact.reshape(-1)) / se
    assert np.all(np.abs(z) < 5), z
    return draws


def test_a_long_chain_reaches_the_posterior_from_a_bad_start(posterior):
    """From a start far in the posterior's tail, 20,000 sweeps: every count's posterior mean
    within 5 batch-means standard errors of the enumeration, and every draw keeps the
    equality and the inequality."""
    sums, _ = small_table()
    g, prior = gibbs(sums)
    states, p, logp = posterior
    x0 = np.array([[6, 0, 0, 0], [0, 0, 0, 4]])
    draws = check_chain_means(g, x0, prior, states, p, 3)
    assert np.all(draws.sum((1, 2)) == TOTAL)
    assert np.all(draws[:, :, :2].sum((1, 2)) <= 6)


def test_the_flat_prior_table_lies_cell_by_cell():
    """Each count's row starts at prior_start[count] and spans its box (rows() and grid() say
    so entry by entry); the rows of one cell follow each other leaf by leaf, the cells in turn
    (a move along a cell reads one stretch of the table)."""
    sums, _ = small_table()
    g, _ = gibbs(sums)
    rows, grid = g.rows(), g.grid()
    assert rows.size == grid.size == g.prior_start[-1] == g.widths.sum()
    for i in range(g.widths.size):
        span = slice(g.prior_start[i], g.prior_start[i] + g.widths[i])
        assert np.all(rows[span] == i)
        np.testing.assert_array_equal(grid[span], np.arange(g.box_lo.flat[i], g.box_hi.flat[i] + 1))
    leaf, cell = np.divmod(rows, sums.n_cells)
    assert np.all(np.diff(cell) >= 0) and np.all(np.diff(leaf)[np.diff(cell) == 0] >= 0)


def test_bad_inputs_are_refused():
    sums, _ = small_table()
    with pytest.raises(ValueError, match="outside its box"):
        NestedGibbs(sums, 0, 5).check_start(np.full((2, C), 6))
    with pytest.raises(ValueError, match="breaks .* exact term"):
        NestedGibbs(sums, 0, 20).check_start(np.ones((2, C)))  # total 8, not 10
    with pytest.raises(ValueError, match="one root"):
        NestedSums([-1, -1], [0, 1], 1, [], np.zeros((0, 1), bool), [], [], TermTables(), [])
    with pytest.raises(ValueError, match="exactly the areas without children"):
        NestedSums([-1, 0, 0], [1], 1, [], np.zeros((0, 1), bool), [], [], TermTables(), [])
    tables = TermTables()
    eq = tables.add_equality()
    with pytest.raises(ValueError, match="disjoint or nested"):
        NestedSums([-1, 0], [1], 3, [0, 0], np.array([[1, 1, 0], [0, 1, 1]], bool), [1, 1], [eq, eq],
                   tables, ["a", "b"])


# ---- a gamma-mixed group rate (GroupedNegativeBinomial's factor) ------------------------------
MU = np.array([[1.5, 2.0, 0.8, 1.2], [1.0, 2.5, 1.1, 0.6]])  # leaf means
ALPHA, LEAF_ALPHA = 0.7, 3.0  # the group total's shape, the split's concentration


def grouped_prior(states, mu=MU):
    """The generative law, independently of dpinfer's factorisation: per cell, the group's sum
    S ~ NB(M, ALPHA), M = mu[0] + mu[1], and its split x[0] | S ~ BetaBinomial(S, A pi_0,
    A pi_1) (a Dirichlet-multinomial of two leaves), pi_l = mu[l] / M."""
    M = mu.sum(0)
    S = states.sum(1)
    total = stats.nbinom.logpmf(S, ALPHA, ALPHA / (ALPHA + M))
    split = stats.betabinom.logpmf(states[:, 0], S, LEAF_ALPHA * mu[0] / M, LEAF_ALPHA * mu[1] / M)
    return (total + split).sum(1)


def grouped_table():
    """small_table() with the mixing factor on every cell at the mid area (both leaves), its
    Gibbs sampler, the leaves' prior table (independent NB(MU, A pi)) and the tables' values."""
    sums, _ = small_table()
    mixed, _ = sums.with_group_mixing([1], ALPHA, LEAF_ALPHA, MU.sum(0)[None, :])
    g = NestedGibbs(mixed, 0, TOTAL + 1)
    shape = LEAF_ALPHA * MU / MU.sum(0)
    rows = g.rows()
    prior = stats.nbinom.logpmf(g.grid(), shape.reshape(-1)[rows], (shape / (shape + MU)).reshape(-1)[rows])
    return mixed, g, np.ascontiguousarray(prior), mixed.tables.arrays()[2]


@pytest.fixture(scope="module")
def grouped_posterior():
    states, logp = enumerate_posterior(grouped_prior)
    return states, np.exp(logp), logp


def test_the_group_mixing_factor_gives_the_generative_law(grouped_posterior):
    """Independent NB(mu_l, A pi_l) leaves times the factor NB(S; M, alpha) / NB(S; M, A)
    is, up to a constant, the law S ~ NB(M, alpha) with a Dirichlet-multinomial split (the
    enumeration's), on every state; and the factor's table reads the formula."""
    mixed, g, prior, values = grouped_table()
    states, p, logp = grouped_posterior
    meta, inv2v, _ = mixed.tables.arrays()
    shape = LEAF_ALPHA * MU / MU.sum(0)

    def structure_logp(x):
        return mixed.log_weight(x) + float(stats.nbinom.logpmf(x, shape, shape / (shape + MU)).sum())

    ref = int(np.argmax(p))
    for i in np.random.default_rng(0).choice(len(states), 40):
        assert structure_logp(states[i]) - structure_logp(states[ref]) == pytest.approx(
            logp[i] - logp[ref], abs=1e-9)
    # the formula: lgamma(S + a) - lgamma(S + A) + kappa S + c0 = log NB(S; M, a) - log NB(S; M, A)
    M = MU.sum(0)[2]
    k = mixed.term_table[np.flatnonzero(mixed.term_name == "group mixing: area 1, cell 2")[0]]
    for S in [0, 1, 7, 40]:
        want = (stats.nbinom.logpmf(S, ALPHA, ALPHA / (ALPHA + M))
                - stats.nbinom.logpmf(S, LEAF_ALPHA, LEAF_ALPHA / (LEAF_ALPHA + M)))
        assert term_log(k, -S, meta, inv2v, values) == pytest.approx(want, abs=1e-12)
    assert term_log(k, 1, meta, inv2v, values) == -np.inf  # a negative sum


@pytest.mark.parametrize("direction", [([0], [1]), ([1, 3], [1, -1])])
def test_a_move_with_group_mixing_draws_the_exact_conditional(grouped_posterior, direction):
    """As test_one_move_draws_the_exact_conditional, with the mixing factor at the mid area."""
    mixed, g, prior, values = grouped_table()
    states, p, logp = grouped_posterior
    check_one_move(mixed, g, prior, values, states, p, direction, 4)


def test_cells_redrawn_alone_with_group_mixing(grouped_posterior):
    """As test_cells_redrawn_alone_are_independent_exact_conditionals, with the mixing factor
    at the mid area."""
    mixed, g, prior, values = grouped_table()
    states, p, _ = grouped_posterior
    check_cells_redrawn_alone(mixed, g, prior, values, states, p, 5)


@pytest.mark.parametrize("direction", [([0], [1]), ([1, 3], [1, -1])])
def test_log_mass_ratio_with_group_mixing(grouped_posterior, direction):
    """As test_log_mass_ratio_is_the_enumerated_mass_along_the_direction, with the mixing
    factor at the mid area."""
    mixed, g, prior, values = grouped_table()
    states, p, logp = grouped_posterior
    check_log_mass_ratio(mixed, g, prior, values, states, logp, direction)


def test_a_long_chain_with_group_mixing_reaches_the_posterior(grouped_posterior):
    """20,000 sweeps with the mixing factor: every count's posterior mean within 5 batch-means
    standard errors of the enumeration."""
    mixed, g, prior, values = grouped_table()
    states, p, _ = grouped_posterior
    check_chain_means(g, states[np.argmax(p)], prior, states, p, 5)
