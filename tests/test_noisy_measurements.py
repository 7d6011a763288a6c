"""Noisy measurement tables (dpinfer/io/noisy_measurements.py): the query matrices against
hand-written ones, releases against their means, the privacy sum by hand, exact posteriors by
enumeration (with and without invariants), every bad-input error and a CSV round trip."""

import math

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
import pytest
from scipy import stats

import dpinfer as dp

HIST = {"votingage": ["u18", "18+"], "hispanic": ["no", "yes"]}
COLUMNS = ["geocode", "query", "votingage", "hispanic", "noisy_count", "variance"]
# variances: state total 4, county votingage 2, county detailed 1
VARIANCE = {"total": 4.0, "votingage": 2.0, "detailed": 1.0}


def hand_rows(values=None):
    """Rows of the hand-written table: total at state 01, votingage and detailed at counties
    01001 and 01003; ``values`` = the noisy counts in row order (default 5 each)."""
    rows = [("01", "total", None, None)]
    for county in ("01001", "01003"):
        rows += [(county, "votingage", v, None) for v in HIST["votingage"]]
        rows += [(county, "detailed", v, h) for v in HIST["votingage"] for h in HIST["hispanic"]]
    values = [5] * len(rows) if values is None else list(values)
    return [(*r, s, VARIANCE[r[1]]) for r, s in zip(rows, values)]


def hand_table(values=None) -> pd.DataFrame:
    return pd.DataFrame(hand_rows(values), columns=COLUMNS)


def invariant_table(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["geocode", "query", "votingage", "hispanic", "value"])


def test_query_matrices_match_hand_written_ones():
    nmf = dp.read_noisy_measurements(hand_table(), HIST)
    assert list(nmf.cells) == [(c, v, h) for c in ("01001", "01003") for v in ("u18", "18+")
                               for h in ("no", "yes")]
    assert list(nmf.cells.names) == ["geocode", "votingage", "hispanic"]
    by_name = {r.name: r for r in nmf.releases}
    assert list(by_name) == ["state/total", "county/votingage", "county/detailed"]
    np.testing.assert_array_equal(by_name["state/total"].matrix, [[1, 1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(by_name["county/votingage"].matrix, [
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 1],
    ])
    np.testing.assert_array_equal(by_name["county/detailed"].matrix, np.eye(8, dtype=int))
    assert list(by_name["county/votingage"].labels) == [
        ("01001", "u18"), ("01001", "18+"), ("01003", "u18"), ("01003", "18+")]
    assert by_name["county/votingage"].variable == "county_votingage"
    for r in nmf.releases:
        assert r.mechanism.sigma == pytest.approx(math.sqrt(VARIANCE[r.query]))
        assert r.mechanism.neighbour == "substitution"
    assert nmf.invariants is None and nmf.invariant_values is None


def test_rows_are_ordered_by_leaf_then_cell_whatever_the_table_order():
    """Shuffled rows give the same releases (a leaf-level detailed release keeps Q = I)."""
    shuffled = hand_table(range(13)).sample(frac=1.0, random_state=3)
    nmf = dp.read_noisy_measurements(shuffled, HIST)
    ordered = dp.read_noisy_measurements(hand_table(range(13)), HIST)
    releases = [sorted(m.releases, key=lambda r: r.name) for m in (nmf, ordered)]
    for a, b in zip(*releases):
        np.testing.assert_array_equal(a.matrix, b.matrix)
        np.testing.assert_array_equal(a.values, b.values)


def test_releases_average_to_the_queries_of_the_truth():
    """Releases drawn with each release's own mechanism from a known truth: their averages
    match Q @ truth within 4 Monte Carlo standard errors sqrt(Var(e) / n)."""
    truth = np.array([3, 7, 12, 0, 5, 1, 9, 4])
    nmf = dp.read_noisy_measurements(hand_table(), HIST)
    rng = np.random.default_rng(11)
    n = 4000
    for r in nmf.releases:
        q = r.matrix @ truth
        draws = r.mechanism.release(np.tile(q, (n, 1)), rng)
        tolerance = 4.0 * math.sqrt(r.mechanism.noise_variance / n)
        np.testing.assert_array_less(np.abs(draws.mean(axis=0) - q), tolerance)


def test_privacy_is_the_hand_sum():
    nmf = dp.read_noisy_measurements(hand_table(), HIST)
    # substitution: l2 sensitivity sqrt(2) per marginal, rho = 2 / (2 sigma^2)
    expected = 2 / (2 * 4.0) + 2 / (2 * 2.0) + 2 / (2 * 1.0)
    guarantee = nmf.privacy()
    assert guarantee.rho == pytest.approx(expected)
    assert guarantee.per_release["county/votingage"] == pytest.approx(0.5)
    assert guarantee.neighbour == "substitution"
    assert guarantee.epsilon(1e-6) == pytest.approx(expected + 2 * math.sqrt(expected * math.log(1e6)))
    add_remove = dp.read_noisy_measurements(hand_table(), HIST, neighbour="add-remove").privacy()
    assert add_remove.rho == pytest.approx(expected / 2)


# --- exact posteriors by enumeration -------------------------------------------------------------

RATES = np.array([3.0, 2.5, 3.5, 2.0])
SMALL_HIST = {"sex": ["m", "f"]}
BOX = 26  # every cell enumerated over 0..25


def small_table(rng):
    """2 leaves x 2 cells: a state total (variance 4) and the leaf-level detailed counts
    (variance 1), released with the mechanisms' own samplers from a fixed truth."""
    truth = np.array([2, 4, 3, 1])
    total = dp.DiscreteGaussian(2.0).release(np.array([truth.sum()]), rng)
    detailed = dp.DiscreteGaussian(1.0).release(truth, rng)
    rows = [("01", "total", None, int(total[0]), 4.0)]
    cells = [(c, s) for c in ("01001", "01003") for s in SMALL_HIST["sex"]]
    rows += [(c, "detailed", s, int(v), 1.0) for (c, s), v in zip(cells, detailed)]
    return pd.DataFrame(rows, columns=["geocode", "query", "sex", "noisy_count", "variance"]), total, detailed


def enumerated_means(total, detailed, keep=None):
    """Posterior means of the 4 counts by enumeration over the box, with the discrete
    Gaussian log pmf of dpinfer's mechanisms; ``keep`` restricts to a set of count vectors."""
    grid = np.indices((BOX,) * 4).reshape(4, -1)
    log_p = stats.poisson.logpmf(grid, RATES[:, None]).sum(axis=0)
    log_p += dp.DiscreteGaussian(2.0).log_likelihood(np.full(grid.shape[1], total[0]), grid.sum(axis=0))
    log_p += dp.DiscreteGaussian(1.0).log_likelihood(np.broadcast_to(detailed[:, None], grid.shape),
                                                     grid).sum(axis=0)
    if keep is not None:
        log_p = np.where(keep(grid), log_p, -np.inf)
    w = np.exp(log_p - log_p.max())
    w /= w.sum()
    mean = grid @ w
    sd = np.sqrt((grid**2) @ w - mean**2)
    return mean, sd


def fitted_means(nmf, **observe):
    with pm.Model():
        counts = pm.Poisson("counts", RATES, shape=4)
        nmf.observe(counts, **observe)
        idata = dp.sample(2000, tune=500, chains=2, random_seed=5, progressbar=False)
    mean = idata.posterior["counts"].mean(("chain", "draw")).values
    ess = az.ess(idata, var_names=["counts"])["counts"].values.reshape(-1)
    return mean, ess, idata


def test_posterior_means_match_enumeration():
    table, total, detailed = small_table(np.random.default_rng(2))
    nmf = dp.read_noisy_measurements(table, SMALL_HIST)
    assert [r.name for r in nmf.releases] == ["state/total", "county/detailed"]
    exact, sd = enumerated_means(total, detailed)
    mean, ess, _ = fitted_means(nmf)
    print("enumeration", np.round(exact, 4), "dp.sample", np.round(mean, 4), "ess", np.round(ess))
    np.testing.assert_array_less(np.abs(mean - exact), 4.0 * sd / np.sqrt(ess))


def test_posterior_with_invariants_matches_enumeration_on_the_fibre():
    """An exact count of leaf 01001 (cells 0 and 1): every draw keeps it, and the means match
    enumeration restricted to x0 + x1 = b."""
    table, total, detailed = small_table(np.random.default_rng(2))
    b = 6
    inv = pd.DataFrame([("01001", "total", None, b)], columns=["geocode", "query", "sex", "value"])
    nmf = dp.read_noisy_measurements(table, SMALL_HIST, invariants=inv)
    np.testing.assert_array_equal(nmf.invariants.constraint_matrix, [[1, 1, 0, 0]])
    exact, sd = enumerated_means(total, detailed, keep=lambda g: g[0] + g[1] == b)
    mean, ess, idata = fitted_means(nmf)
    print("enumeration", np.round(exact, 4), "dp.sample", np.round(mean, 4), "ess", np.round(ess))
    draws = idata.posterior["counts"].values
    assert np.all(draws[..., 0] + draws[..., 1] == b)
    np.testing.assert_array_less(np.abs(mean - exact), 4.0 * sd / np.sqrt(ess))


def test_observe_can_drop_invariants_with_a_warning():
    table, _, _ = small_table(np.random.default_rng(2))
    inv = pd.DataFrame([("01001", "total", None, 6)], columns=["geocode", "query", "sex", "value"])
    nmf = dp.read_noisy_measurements(table, SMALL_HIST, invariants=inv)
    with pm.Model() as model:
        counts = pm.Poisson("counts", RATES, shape=4)
        with pytest.warns(UserWarning, match="exact counts of the table are left out"):
            observed = nmf.observe(counts, invariants="drop")
        assert [v.name for v in observed] == ["state_total", "county_detailed"]
        with pytest.raises(ValueError, match="invariants must be one of"):
            nmf.observe(counts, invariants="ignore")
    assert "invariants" not in model.named_vars
    with pm.Model():
        with pytest.raises(ValueError, match="counts has 3 entries, but the table has 4 cells"):
            nmf.observe(pm.Poisson("counts", 3.0, shape=3))


def test_baseline_is_the_weighted_least_squares_estimate():
    """Without binding constraints the estimate solves the normal equations
    sum_r Q_r' Q_r x / v_r = sum_r Q_r' s_r / v_r; with an invariant it keeps it exactly."""
    values = [30, 8, 6, 3, 5, 4, 2, 7, 9, 1, 4, 2, 6]
    nmf = dp.read_noisy_measurements(hand_table(values), HIST)
    x_hat = nmf.baseline()
    assert list(x_hat.index) == list(nmf.cells)
    h = sum(r.matrix.T @ r.matrix / r.mechanism.noise_variance for r in nmf.releases)
    g = sum(r.matrix.T @ r.values / r.mechanism.noise_variance for r in nmf.releases)
    np.testing.assert_allclose(x_hat.values, np.linalg.solve(h, g), rtol=1e-9)
    inv = invariant_table([("01001", "total", None, None, 20)])
    constrained = dp.read_noisy_measurements(hand_table(values), HIST, invariants=inv).baseline()
    assert constrained.loc["01001"].sum() == pytest.approx(20)
    assert np.all(constrained.values >= 0)


# --- bad input -----------------------------------------------------------------------------------


def test_unknown_attribute_level():
    table = hand_table()
    table.loc[1, "votingage"] = "adult"
    with pytest.raises(ValueError, match=r"column 'votingage' has level 'adult'"):
        dp.read_noisy_measurements(table, HIST)


def test_query_keeping_different_attributes():
    table = hand_table()
    table.loc[1, "hispanic"] = "no"  # a votingage row that also keeps hispanic
    with pytest.raises(ValueError, match=r"query 'votingage' \(column 'query'\) keeps different attribute"):
        dp.read_noisy_measurements(table, HIST)


def test_geocode_covering_no_leaf():
    table = pd.concat([hand_table(), pd.DataFrame([("02", "total", None, None, 5, 4.0)], columns=COLUMNS)])
    with pytest.raises(ValueError, match=r"geocode '02' \(column 'geocode'\) covers no leaf"):
        dp.read_noisy_measurements(table, HIST)
    with pytest.raises(ValueError, match=r"geocode '01003' \(column 'geocode'\) covers no leaf"):
        dp.read_noisy_measurements(hand_table(), HIST, leaves=["01001"])


def test_duplicate_measurement():
    table = pd.concat([hand_table(), hand_table().iloc[[2]]])
    with pytest.raises(ValueError, match=r"duplicate measurement of geocode '01001' \(column 'geocode'\)"):
        dp.read_noisy_measurements(table, HIST)


@pytest.mark.parametrize("bad", [3.5, np.nan, "many"])
def test_non_integer_noisy_count(bad):
    table = hand_table().astype({"noisy_count": object})
    table.loc[4, "noisy_count"] = bad
    with pytest.raises(ValueError, match=r"column 'noisy_count' must hold whole numbers"):
        dp.read_noisy_measurements(table, HIST)


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan])
def test_variance_not_positive(bad):
    table = hand_table()
    table.loc[4, "variance"] = bad
    with pytest.raises(ValueError, match=r"column 'variance' must hold variances > 0"):
        dp.read_noisy_measurements(table, HIST)


def test_variance_differing_within_a_unit():
    table = hand_table()
    table.loc[1, "variance"] = 3.0  # 01001 votingage u18, while 18+ keeps 2
    message = r"column 'variance' differs between the rows of geocode '01001', query 'votingage'"
    with pytest.raises(ValueError, match=message):
        dp.read_noisy_measurements(table, HIST)


def test_missing_columns():
    with pytest.raises(ValueError, match=r"missing column\(s\) \['variance'\]"):
        dp.read_noisy_measurements(hand_table().drop(columns="variance"), HIST)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['hispanic'\]"):
        dp.read_noisy_measurements(hand_table().drop(columns="hispanic"), HIST)
    renamed = hand_table().rename(columns={"noisy_count": "nmf"})
    with pytest.raises(ValueError, match=r"missing column\(s\) \['noisy_count'\]"):
        dp.read_noisy_measurements(renamed, HIST)
    nmf = dp.read_noisy_measurements(renamed, HIST, count_column="nmf")
    assert len(nmf.releases) == 3


def test_geocodes_must_be_strings():
    table = hand_table()
    table["geocode"] = table["geocode"].astype(int)
    with pytest.raises(TypeError, match=r"column 'geocode' must hold non-empty strings"):
        dp.read_noisy_measurements(table, HIST)


@pytest.mark.parametrize("value, message", [
    (-1, r"column 'value' must hold counts >= 0"),
    (2.5, r"column 'value' must hold whole numbers"),
])
def test_bad_invariant_values(value, message):
    inv = invariant_table([("01001", "total", None, None, value)])
    with pytest.raises(ValueError, match=message):
        dp.read_noisy_measurements(hand_table(), HIST, invariants=inv)


def test_inconsistent_invariants():
    inv = invariant_table([("01", "total", None, None, 26), ("01001", "total", None, None, 12),
                           ("01003", "total", None, None, 10)])
    with pytest.raises(ValueError, match=r"values in column 'value' are inconsistent"):
        dp.read_noisy_measurements(hand_table(), HIST, invariants=inv)
    inv.loc[2, "value"] = 14
    nmf = dp.read_noisy_measurements(hand_table(), HIST, invariants=inv)
    np.testing.assert_array_equal(nmf.invariant_values, [26, 12, 14])
    assert list(nmf.invariant_labels.get_level_values("geocode")) == ["01", "01001", "01003"]


# --- files ---------------------------------------------------------------------------------------


def test_csv_round_trip_keeps_leading_zeros(tmp_path):
    table = hand_table(range(13))
    table.to_csv(tmp_path / "nmf.csv", index=False)
    inv = invariant_table([("01001", "total", None, None, 20)])
    inv.to_csv(tmp_path / "inv.csv", index=False)
    from_file = dp.read_noisy_measurements(tmp_path / "nmf.csv", HIST, invariants=str(tmp_path / "inv.csv"))
    in_memory = dp.read_noisy_measurements(table, HIST, invariants=inv)
    assert list(from_file.cells.get_level_values("geocode").unique()) == ["01001", "01003"]
    assert list(from_file.cells) == list(in_memory.cells)
    for a, b in zip(from_file.releases, in_memory.releases):
        assert a.name == b.name
        np.testing.assert_array_equal(a.matrix, b.matrix)
        np.testing.assert_array_equal(a.values, b.values)
        assert list(a.labels) == list(b.labels)
    np.testing.assert_array_equal(from_file.invariants.constraint_matrix,
                                  in_memory.invariants.constraint_matrix)


def test_parquet_and_unknown_suffix(tmp_path):
    pytest.importorskip("pyarrow")
    hand_table().to_parquet(tmp_path / "nmf.parquet")
    nmf = dp.read_noisy_measurements(tmp_path / "nmf.parquet", HIST)
    assert nmf.cells[0] == ("01001", "u18", "no")
    with pytest.raises(ValueError, match="neither a .csv nor a .parquet file"):
        dp.read_noisy_measurements(tmp_path / "nmf.txt", HIST)
