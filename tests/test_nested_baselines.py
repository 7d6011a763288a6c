"""Baselines for nested measurements (dpinfer/utility/baselines/nested/): GLS against closed
forms and a dense KKT solve, the tree pass against the dense covariance, per-cell posteriors
against enumeration, the aggregated law against brute-force convolution, NNLS against
scipy.optimize.nnls / SLSQP, and the comparison table on a case with a known answer."""

import itertools

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

from dpinfer.mechanisms.nested import NestedMeasurements
from dpinfer.utility.baselines.nested.comparison import compare_nested, nested_target_table
from dpinfer.utility.baselines.nested.gls import nested_gls
from dpinfer.lattice.nested.nnls import nested_nnls
from dpinfer.utility.baselines.nested.per_cell import _convolve_all, per_cell_posterior, per_cell_posteriors
from dpinfer.utility.baselines.nested.targets import (
    NestedTargets,
    area_cell_targets,
    area_sum_targets,
    concat_targets,
    ratio_targets,
)


def dg_log_pmf(e, sigma2):
    k = np.arange(-3000, 3001)
    return -np.asarray(e, float) ** 2 / (2 * sigma2) - np.logaddexp.reduce(-k * k / (2 * sigma2))


# ---- GLS: closed forms on one cell, a root and two leaves -----------------------------------
def cherry(values, variances, equality=None):
    rel = NestedMeasurements([-1, 0, 0], [1, 2], 1)
    for v, (y, s2) in enumerate(zip(values, variances)):
        rel.measure(f"m{v}", [v], [[0]], [[y]], s2)
    if equality is not None:
        rel.equal("root", [0], [[0]], [[equality]])
    return rel


def test_gls_cherry_is_the_inverse_variance_combination():
    y0, y1, y2 = 31, 12, 15
    v0, v1, v2 = 9.0, 4.0, 2.5
    fit = nested_gls(cherry([y0, y1, y2], [v0, v1, v2]))
    # the root total: its own measurement combined with the leaves' sum (variance v1 + v2)
    w0, ws = 1 / v0, 1 / (v1 + v2)
    total = (w0 * y0 + ws * (y1 + y2)) / (w0 + ws)
    var_total = 1 / (w0 + ws)
    # each leaf: its measurement plus its share v_i / (v1 + v2) of the correction of the sum
    x1 = y1 + v1 / (v1 + v2) * (total - y1 - y2)
    x2 = y2 + v2 / (v1 + v2) * (total - y1 - y2)
    np.testing.assert_allclose(fit.counts[:, 0], [x1, x2], rtol=1e-12)
    # Var x1^ = v1 - v1^2/(v1+v2) + (v1/(v1+v2))^2 Var(total^)
    k1 = v1 / (v1 + v2)
    var1 = v1 - v1 * k1 + k1 ** 2 * var_total
    targets = concat_targets(area_cell_targets(cherry([y0, y1, y2], [v0, v1, v2]), [1], "leaf"),
                             area_cell_targets(cherry([y0, y1, y2], [v0, v1, v2]), [0], "root"))
    for tree in (True, False):
        df = nested_gls(cherry([y0, y1, y2], [v0, v1, v2]), tree=tree).targets(targets)
        np.testing.assert_allclose(df.estimate, [x1, total], rtol=1e-12)
        np.testing.assert_allclose(df.sd, np.sqrt([var1, var_total]), rtol=1e-9)
        np.testing.assert_allclose(df.upper - df.estimate, 1.6448536269514722 * df.sd, rtol=1e-12)


def test_gls_cherry_with_the_root_exact():
    y0, y1, y2, a = 31, 12, 15, 30
    v0, v1, v2 = 9.0, 4.0, 2.5
    rel = cherry([y0, y1, y2], [v0, v1, v2], equality=a)
    fit = nested_gls(rel)
    x1 = y1 + v1 / (v1 + v2) * (a - y1 - y2)  # the root measurement no longer matters
    np.testing.assert_allclose(fit.counts[:, 0], [x1, a - x1], rtol=1e-12)
    t = concat_targets(area_cell_targets(rel, [1, 2], "leaf"), area_cell_targets(rel, [0], "root"))
    for f in (fit, nested_gls(rel, tree=False)):
        df = f.targets(t)
        np.testing.assert_allclose(df.sd[:2], np.sqrt(v1 * v2 / (v1 + v2)), rtol=1e-9)
        assert df.sd[2] < 1e-6 and abs(df.estimate[2] - a) < 1e-9


# ---- GLS against a dense KKT solve on a random tree ------------------------------------------
def random_release(seed, redundant=False, bounds=False, small=False, zero=False):
    """Root 0; areas 1, 2 under it; leaves 3, 4 under 1 and 5, 6, 7 under 2; 3 cells;
    per-cell, pair and total measurements at random areas, equalities on the root total and on
    area 2's cells {0, 1} (with ``redundant``: also every leaf total of area 1's leaves and
    area 1's total)."""
    rng = np.random.default_rng(seed)
    parent = [-1, 0, 0, 1, 1, 2, 2, 2]
    leaves = [3, 4, 5, 6, 7]
    C = 3
    x = rng.poisson(1.0 if small else 12.0, (5, C))
    if zero:
        x[3, 2] = 0
    S = np.zeros((8, C), np.int64)
    S[leaves] = x
    for v in (7, 6, 5, 4, 3, 2, 1):
        S[parent[v]] += S[v]
    rel = NestedMeasurements(parent, leaves, C)
    for v in range(8):
        for name, cells in (("cell", [[0], [1], [2]]), ("pair", [[0, 1]]), ("total", [[0, 1, 2]])):
            if v in leaves and name == "cell" or rng.random() < 0.6:
                s2 = float(rng.uniform(1, 6))
                true = np.array([[S[v, c].sum() for c in cells]])
                noise = np.round(rng.normal(0, np.sqrt(s2), true.shape)).astype(np.int64)
                rel.measure(f"{name}{v}", [v], cells, true + noise, s2, summed=1 + (name == "pair"))
    rel.equal("root total", [0], [[0, 1, 2]], [[S[0].sum()]])
    rel.equal("area 2 cells 0+1", [2], [[0, 1]], [[S[2, :2].sum()]])
    if redundant:
        rel.equal("leaf totals", [3, 4], [[0, 1, 2]], S[[3, 4]].sum(1, keepdims=True))
        rel.equal("area 1 total", [1], [[0, 1, 2]], [[S[1].sum()]])
    if bounds:
        rel.at_most("cap", [5], [[0, 1]], [[S[5, :2].sum()]])
        rel.at_least("floor", [1], [[2]], [[S[1, 2]]])
    if zero:
        rel.zero("structural zero", [6], [[2]])
    return rel, x


def dense_problem(rel):
    """x-space matrices: M (measurements), variances, E (equalities), and the targets' rows."""
    s = rel.sums
    measured, equal, at_most, at_least, var = s.term_kinds()
    under = s.leaves_under()
    n = s.n_leaves * s.n_cells

    def row(r):
        out = np.zeros(n)
        for leaf in under[s.term_area[r]]:
            out[leaf * s.n_cells + np.flatnonzero(s.term_cells[r])] = 1
        return out

    M = np.array([row(r) for r in np.flatnonzero(measured)])
    E = np.array([row(r) for r in np.flatnonzero(equal)])
    B = np.array([row(r) for r in np.flatnonzero(at_most | at_least)]).reshape(-1, n)
    return (M, s.term_value[measured].astype(float), var[measured], E, s.term_value[equal].astype(float),
            B, s.term_value[at_most | at_least].astype(float), np.where(at_most, 1.0, -1.0)[at_most | at_least])


def test_gls_matches_the_dense_kkt_solve_and_covariance():
    for redundant in (False, True):
        rel, _ = random_release(3, redundant=redundant)
        M, y, v, E, e, *_ = dense_problem(rel)
        H = M.T @ (M / v[:, None])
        h = M.T @ (y / v)
        # dense reference: Z = null space of E, x = x0 + Z w
        Z = scipy.linalg.null_space(E)
        x0 = np.linalg.lstsq(E, e, rcond=None)[0]
        w = np.linalg.solve(Z.T @ H @ Z, Z.T @ (h - H @ x0))
        x_ref = x0 + Z @ w
        cov = Z @ np.linalg.inv(Z.T @ H @ Z) @ Z.T
        if not redundant:  # the KKT system itself, as numpy.linalg.solve sees it
            K = np.block([[H, E.T], [E, np.zeros((E.shape[0], E.shape[0]))]])
            np.testing.assert_allclose(np.linalg.solve(K, np.concatenate([h, e]))[:H.shape[0]], x_ref, atol=1e-9)
        t = concat_targets(area_cell_targets(rel, [3, 4, 5, 6, 7], "leaf"),
                           area_cell_targets(rel, [0, 1, 2], "areas"),
                           area_sum_targets(rel, [0, 1, 2, 5], [1, 2], "sum12"),
                           ratio_targets(rel, [0, 1, 2, 6], [0], [0, 1, 2], "share0"))
        D = t.numerator.toarray().astype(float)
        Dd = t.denominator.toarray().astype(float)
        a, b = D @ x_ref, Dd @ x_ref
        ratio = t.is_ratio
        est = np.where(ratio, a / np.where(ratio, b, 1), a)
        G = np.where(ratio[:, None], (D - est[:, None] * Dd) / np.where(ratio, b, 1)[:, None], D)
        sd = np.sqrt(np.maximum(np.einsum("ki,ij,kj->k", G, cov, G), 0))
        for tree in (True, False):
            fit = nested_gls(rel, tree=tree)
            np.testing.assert_allclose(fit.counts.reshape(-1), x_ref, atol=1e-8)
            df = fit.targets(t)
            np.testing.assert_allclose(df.estimate, est, atol=1e-8)
            np.testing.assert_allclose(df.sd, sd, atol=1e-6)
        # a target that is no single area's sum goes through the KKT solves
        mixed = NestedTargets(np.array(["mix"], object), np.array(["mix"], object),
                                 (t.numerator[0] + 2 * t.numerator[7]).tocsr(), t.denominator[:1],
                                 np.array([-1]), t.num_cells[:1], t.den_area[:1], t.den_cells[:1])
        g = D[0] + 2 * D[7]
        df = fit.targets(mixed)
        np.testing.assert_allclose(df.estimate, [g @ x_ref], atol=1e-8)
        np.testing.assert_allclose(df.sd, [np.sqrt(g @ cov @ g)], atol=1e-6)


def test_gls_marks_counts_the_data_do_not_determine():
    # two leaves, one cell, only the root measured: neither leaf is determined, their sum is
    rel = NestedMeasurements([-1, 0, 0], [1, 2], 1)
    rel.measure("root", [0], [[0]], [[20]], 4.0)
    fit = nested_gls(rel)
    assert np.all(np.isnan(fit.counts))
    df = fit.targets(concat_targets(area_cell_targets(rel, [1], "leaf"), area_cell_targets(rel, [0], "root")))
    assert np.isnan(df.estimate[0]) and np.isinf(df.sd[0])
    np.testing.assert_allclose([df.estimate[1], df.sd[1]], [20, 2], rtol=1e-9)


# ---- per-cell posteriors ---------------------------------------------------------------------
@pytest.mark.parametrize("y,sigma2,summed,bound", [(3, 4.0, 1, None), (-2, 2.5, 1, None), (7, 1.5, 3, None),
                                                    (40, 30.0, 1, ("le", 38)), (5, 9.0, 2, ("ge", 6))])
def test_per_cell_posterior_against_enumeration(y, sigma2, summed, bound):
    rel = NestedMeasurements([-1, 0], [1], 2)
    rel.measure("m", [0], [[0, 1]], [[y]], sigma2, summed=summed)
    rel.measure("other", [1], [[0]], [[1]], 1.0)
    if bound:
        (rel.at_most if bound[0] == "le" else rel.at_least)("b", [0], [[0, 1]], [[bound[1]]])
    lo, pmf = per_cell_posterior(rel, 0, [0, 1])
    t = np.arange(0, 400)
    one = np.exp(dg_log_pmf(np.arange(-200, 201), sigma2))
    law = one.copy()
    for _ in range(summed - 1):
        law = np.convolve(law, one)
    centre = (law.size - 1) // 2
    e = y - t
    p = np.where(np.abs(e) <= centre, law[np.clip(centre + e, 0, law.size - 1)], 0.0)
    if bound:
        p = p * ((t <= bound[1]) if bound[0] == "le" else (t >= bound[1]))
    p = p / p.sum()
    got = np.zeros(t.size)
    got[lo:lo + pmf.size] = pmf
    np.testing.assert_allclose(got, p, atol=1e-13)
    # the summary: median and the equal-tailed 90% interval, q(p) = min{t: F(t) >= p}
    F = np.cumsum(p)
    want = [np.argmax(F >= q - 1e-12) for q in (0.5, 0.05, 0.95)]
    df = per_cell_posteriors(rel, area_sum_targets(rel, [0], [0, 1], "root"), aggregate=False)
    np.testing.assert_array_equal(df[["estimate", "lower", "upper"]].to_numpy()[0], want)


def test_aggregated_per_cell_law_is_the_brute_force_convolution():
    # a county (area 1) with three leaves; each leaf cell measured alone, plus the county itself
    rel = NestedMeasurements([-1, 0, 1, 1, 1], [2, 3, 4], 2)
    ys = [[4, 1], [0, 6], [2, 3]]
    rel.measure("leaf", [2, 3, 4], [[0], [1]], ys, 1.3)
    rel.measure("county", [1], [[0], [1]], [[9, 9]], 2.0)
    rel.at_most("cap", [3], [[1]], [[5]])
    units = [per_cell_posterior(rel, leaf, [0]) for leaf in (2, 3, 4)]
    lo, pmf = _convolve_all(units)
    # brute force: every combination of the three leaves' values
    law = {}
    for combo in itertools.product(*[range(u[1].size) for u in units]):
        total = sum(u[0] + j for u, j in zip(units, combo))
        law[total] = law.get(total, 0.0) + np.prod([u[1][j] for u, j in zip(units, combo)])
    ref = np.zeros(max(law) + 1)
    for k_, pr in law.items():
        ref[k_] += pr
    got = np.zeros(max(ref.size, lo + pmf.size))
    got[lo:lo + pmf.size] = pmf
    np.testing.assert_allclose(got[:ref.size], ref, atol=1e-13)
    # the target's summary: aggregated uses the leaves, direct uses the county's own measurement
    t = area_cell_targets(rel, [1], "county", cells=[0])
    agg = per_cell_posteriors(rel, t, aggregate=True)
    F = np.cumsum(ref)
    assert agg.estimate[0] == np.argmax(F >= 0.5 - 1e-12)
    assert (agg.lower[0], agg.upper[0]) == (np.argmax(F >= 0.05 - 1e-12), np.argmax(F >= 0.95 - 1e-12))
    direct = per_cell_posteriors(rel, t, aggregate=False)
    lo1, p1 = per_cell_posterior(rel, 1, [0])
    assert direct.estimate[0] == lo1 + np.argmax(np.cumsum(p1) >= 0.5 - 1e-12)
    # a weighted leaf (2 x) and a ratio by Monte Carlo (fixed seed: reproducible)
    r = ratio_targets(rel, [1], [0], [0, 1], "share")
    a1 = per_cell_posteriors(rel, r, aggregate=True, seed=5)
    a2 = per_cell_posteriors(rel, r, aggregate=True, seed=5)
    assert a1.equals(a2) and 0 < a1.lower[0] < a1.estimate[0] < a1.upper[0] < 1


# ---- NNLS ------------------------------------------------------------------------------------
def test_nnls_matches_scipy_nnls_without_equalities():
    rel = NestedMeasurements([-1, 0, 0, 1, 1], [2, 3, 4], 2)
    rel.measure("leaf", [2, 3, 4], [[0], [1]], [[-3, 1], [2, -1], [0, 4]], 2.0)
    rel.measure("mid", [1], [[0], [1], [0, 1]], [[-2, 2, 1]], 3.0)
    rel.measure("root", [0], [[0, 1]], [[3]], 5.0)
    M, y, v, *_ = dense_problem(rel)
    ref, _ = scipy.optimize.nnls(M / np.sqrt(v)[:, None], y / np.sqrt(v))
    got = nested_nnls(rel)
    np.testing.assert_allclose(got.reshape(-1), ref, atol=1e-9)
    assert np.any(ref == 0)  # non-negativity binds


def slsqp_reference(M, y, v, E, e, B, b, sign, bounds):
    """min 1/2 sum (M x - y)^2 / v s.t. E x = e, x >= 0 (and the bounds) by SLSQP; (x, objective)."""
    n = M.shape[1]

    def f(x):
        r = (M @ x - y) / np.sqrt(v)
        return 0.5 * r @ r

    def g(x):
        return M.T @ ((M @ x - y) / v)

    cons = [{"type": "eq", "fun": lambda x: E @ x - e, "jac": lambda x: E}]
    if bounds:
        cons.append({"type": "ineq", "fun": lambda x: sign * (b - B @ x), "jac": lambda x: -sign[:, None] * B})
    ref = scipy.optimize.minimize(f, np.full(n, 1.0), jac=g, bounds=[(0, None)] * n, constraints=cons,
                                  method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000})
    assert ref.success
    return ref.x, f


def test_nnls_with_equalities_and_bounds_matches_slsqp():
    for bounds in (False, True):
        rel, _ = random_release(11, bounds=bounds, small=True, zero=True)
        M, y, v, E, e, B, b, sign = dense_problem(rel)
        ref, f = slsqp_reference(M, y, v, E, e, B, b, sign, bounds)
        got = nested_nnls(rel, bounds=bounds).reshape(-1)
        assert np.all(got >= 0) and np.allclose(E @ got, e, atol=1e-8)
        if bounds:
            assert np.all(sign * (B @ got - b) <= 1e-8)
        np.testing.assert_allclose(got, ref, atol=2e-5)
        assert f(got) <= f(ref) + 1e-9
        assert np.any(got == 0)  # non-negativity binds


# ---- the comparison table ---------------------------------------------------------------------
def test_comparison_table_on_a_known_case():
    # every leaf cell exact: GLS, per-cell and NNLS recover the truth with zero width
    parent, leaves = [-1, 0, 0, 1, 1, 2, 2], [3, 4, 5, 6]
    x = np.array([[3, 1], [0, 2], [4, 4], [1, 0]])
    rel = NestedMeasurements(parent, leaves, 2)
    rel.equal("leaf cells", leaves, [[0], [1]], x)
    rel.measure("root", [0], [[0], [1]], [[9, 6]], 4.0)
    targets = concat_targets(area_cell_targets(rel, leaves, "leaf"),
                             area_cell_targets(rel, [1, 2], "county"))
    # dpinfer's draws: the truth, shifted by +2 on leaf 3 in every draw (its two cells are missed:
    # coverage 6/8 on the leaves), and by -1..1 elsewhere (covered)
    rng = np.random.default_rng(0)
    draws = x[None] + rng.integers(-1, 2, (400, 4, 2))
    draws[:, 0] = x[0] + 2
    table = nested_target_table(rel, x, draws, targets)
    out = compare_nested(rel, x, draws, targets, table=table)
    row = out.set_index(["method", "group"])
    assert row.loc[("dpinfer", "leaf"), "coverage"] == 0.75
    # leaf 3's two cells lie below dpinfer's intervals (the draws are shifted up): 2/8 below
    assert row.loc[("dpinfer", "leaf"), "below"] == 0.25 and row.loc[("dpinfer", "leaf"), "above"] == 0.0
    np.testing.assert_allclose(row.loc[("dpinfer", "leaf"), "coverage_se"], np.sqrt(0.75 * 0.25 / 8))
    np.testing.assert_allclose(row.loc[("dpinfer", "leaf"), "mae"], 2 * 2 / 8)
    np.testing.assert_allclose(row.loc[("dpinfer", "leaf"), "rmse"], np.sqrt(2 * 4 / 8))
    for method in ("GLS", "per-cell aggregated", "per-cell"):
        for group in ("leaf", "county") if method != "per-cell" else ("leaf",):
            r = row.loc[(method, group)]
            assert r["coverage"] == 1.0 and r["coverage_se"] == 0.0 and r["mae"] < 1e-6
            assert r["mean_width"] < 1e-3 and r["targets"] == (8 if group == "leaf" else 4)
    assert row.loc[("per-cell", "county"), "targets"] == 0  # counties are not published cells
    assert np.isnan(row.loc[("NNLS", "leaf"), "coverage"]) and row.loc[("NNLS", "leaf"), "mae"] < 1e-9
    assert set(out.columns) == {"method", "group", "targets", "coverage", "coverage_se", "below", "above",
                                "expected_coverage", "mean_width", "mae", "rmse"}
    assert np.isnan(row.loc[("NNLS", "leaf"), "below"])
    # every draw of every leaf cell lies within its 5%-95% quantiles (at most 3 values): mass 1
    assert row.loc[("dpinfer", "leaf"), "expected_coverage"] == 1.0
    assert np.isnan(row.loc[("GLS", "leaf"), "expected_coverage"])


def test_coverage_of_nothing_covered_is_zero_with_zero_se():
    """Five targets, four truths below their intervals and one above: coverage 0 and its se 0
    (as 1 - 4/5 - 1/5 it rounds to -5.6e-17, whose se was a math domain error)."""
    parent, leaves = [-1, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5]
    x = np.array([[3], [5], [2], [7], [4]])
    rel = NestedMeasurements(parent, leaves, 1)
    rel.measure("leaf", leaves, [[0]], x, 4.0)
    draws = np.repeat((x + np.array([[5], [5], [5], [5], [-5]]))[None], 50, axis=0)
    out = compare_nested(rel, x, draws, area_cell_targets(rel, leaves, "leaf"), methods=("dpinfer",))
    row = out.set_index(["method", "group"]).loc[("dpinfer", "leaf")]
    assert row["coverage"] == 0.0 and row["coverage_se"] == 0.0
    assert row["below"] == 0.8 and row["above"] == 0.2


def test_interval_mass_is_the_share_of_draws_inside():
    """A target uniform on 0..99 over the draws: the 5% and 95% quantiles are 4.95 and 94.05,
    which hold the 90 values 5..94 (mass 0.90); one on {0, 1} (half each): [0, 1], mass 1."""
    parent, leaves = [-1, 0], [1]
    rel = NestedMeasurements(parent, leaves, 2)
    rel.measure("leaf", leaves, [[0], [1]], [[50, 1]], 4.0)
    draws = np.stack([np.arange(100), np.arange(100) % 2], axis=1)[:, None, :]
    table = nested_target_table(rel, np.array([[50, 1]]), draws, area_cell_targets(rel, leaves, "leaf"),
                                   methods=("dpinfer",))
    np.testing.assert_allclose(table["lower"], [4.95, 0.0])
    np.testing.assert_allclose(table["upper"], [94.05, 1.0])
    np.testing.assert_allclose(table["mass"], [0.90, 1.0])
