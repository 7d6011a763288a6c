"""Noisy measurement tables (dpinfer/io/noisy_measurements.py): the query matrices against
hand-written ones, releases against their means, the privacy sum by hand, exact posteriors by
enumeration (with and without invariants), every bad-input error and a CSV round trip."""

import json
import math

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
import pytest
from scipy import stats

import dpinfer as dp
from dpinfer.mechanisms.records import releases_of

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


# --- the nested release ---------------------------------------------------------------------------


def test_areas_are_the_prefix_tree_of_the_geocodes():
    """Every geocode under the longest other one that is a prefix of it; a virtual root over
    several top geocodes; leaves of different lengths; leaves inside leaves refused."""
    nmf = dp.read_noisy_measurements(hand_table(), HIST)
    assert nmf.areas.to_dict("list") == {"geocode": ["01", "01001", "01003"],
                                         "geolevel": ["state", "county", "county"], "parent": [-1, 0, 0]}
    rows = [("01", "total", None, None, 5, 4.0), ("02", "total", None, None, 5, 4.0),
            ("01003", "total", None, None, 5, 2.0),
            *[(g, "detailed", "u18", "no", 1, 1.0) for g in ("01001", "010031", "010032", "02001")]]
    leaves = ["01001", "010031", "010032", "02001"]
    nmf = dp.read_noisy_measurements(pd.DataFrame(rows, columns=COLUMNS), HIST, leaves=leaves)
    areas = nmf.areas.set_index("geocode")
    parents = {g: areas.index[p] if p >= 0 else None for g, p in areas["parent"].items()}
    assert parents == {"": None, "01": "", "02": "", "01001": "01", "01003": "01", "02001": "02",
                       "010031": "01003", "010032": "01003"}
    assert areas.loc["", "geolevel"] == "(all)" and areas.loc["010031", "geolevel"] == "geo6"
    sums = nmf.nested().sums  # the leaves under each term's area are the leaves its row covers
    under = sums.leaves_under()
    for r in nmf.releases:
        for row, g in zip(r.matrix, r.labels.get_level_values("geocode")):
            covered = np.flatnonzero(row.reshape(nmf.shape).any(axis=1))
            np.testing.assert_array_equal(under[list(areas.index).index(g)], covered)
    with pytest.raises(ValueError, match="leaf '010031' starts with leaf '01003'"):
        dp.read_noisy_measurements(pd.DataFrame(rows, columns=COLUMNS), HIST, leaves=[*leaves, "01003"])


def dense_log_likelihood(nmf, x, invariants=True):
    """The releases' log-likelihood sum_r log f(s_r - Q_r x) with each release's own
    mechanism, and log 1{A x = b}: the reference for the nested release."""
    flat = x.reshape(-1)
    total = sum(r.mechanism.log_likelihood(r.values, r.matrix @ flat).sum() for r in nmf.releases)
    if invariants and np.any(nmf.invariants.constraint_matrix @ flat != nmf.invariant_values):
        return -np.inf
    return total


def test_the_nested_release_is_the_tables_likelihood():
    """log p(s, b | x) of NoisyMeasurements.nested() equals the releases' dense log-likelihood
    (each Q_r x through its own mechanism) times 1{A x = b}, at counts on and off the
    invariants, with and without them; its terms are named by release, geocode and cells."""
    inv = invariant_table([("01", "total", None, None, 40), ("01001", "votingage", "18+", None, 12)])
    nmf = dp.read_noisy_measurements(hand_table([30, 8, 6, 3, 5, 4, 2, 7, 9, 1, 4, 2, 6]), HIST, invariants=inv)
    nested, dropped = nmf.nested(), nmf.nested(invariants="drop")
    rng = np.random.default_rng(4)
    on_fibre = 0
    for _ in range(20):
        x = rng.integers(0, 12, size=nmf.shape)
        if rng.random() < 0.5:  # onto the invariants: 01001's 18+ cells sum to 12, all to 40
            x[0, 2:] = [5, 7]
            x[1, 0] = 0
            x[1, 0] = 40 - x.sum()
        on_fibre += np.isfinite(dense_log_likelihood(nmf, x))
        assert nested.log_likelihood(x) == pytest.approx(dense_log_likelihood(nmf, x), rel=1e-12)
        assert dropped.log_likelihood(x) == pytest.approx(dense_log_likelihood(nmf, x, False), rel=1e-12)
    assert 0 < on_fibre < 20
    names = set(nested.sums.term_name)
    assert {"state/total [01, all cells]", "state/total (=) [01, all cells]",
            "county/votingage (=) [01001, votingage=18+]",
            "county/detailed [01003, votingage=18+, hispanic=no]"} <= names
    assert len(names) == 13 + 2 and nested.sums.cell_shape == (2, 2)


def test_invariants_overlapping_partly_fall_back_to_separate_releases():
    """Exact voting-age and Hispanic-origin margins at one state cannot be kept by the
    sum-tree moves: a warning names them, and the model observes each release of Q x and a
    conditioned release of A x, whose log density is the dense reference."""
    inv = invariant_table([("01", "votingage", "u18", None, 20), ("01", "votingage", "18+", None, 30),
                           ("01", "hispanic", None, "no", 35), ("01", "hispanic", None, "yes", 15)])
    nmf = dp.read_noisy_measurements(hand_table(range(13)), HIST, invariants=inv)
    first, second = nmf.overlapping_invariants()
    assert first[:3] == ("votingage", "01", "u18") and second[:2] == ("hispanic", "01")
    with pm.Model() as model:
        counts = pm.Poisson("counts", 4.0, shape=nmf.shape)
        with pytest.warns(UserWarning, match="overlap partly at one geocode"):
            observed = nmf.observe(counts)
    assert [v.name for v in observed] == ["state_total", "county_votingage", "county_detailed", "invariants"]
    logp = model.compile_logp(vars=observed)
    x = np.array([[5, 4, 8, 6], [6, 5, 16, 0]])  # margins 20/30 and 35/15
    assert logp({"counts": x}) == pytest.approx(dense_log_likelihood(nmf, x), rel=1e-9)
    assert logp({"counts": x + np.eye(2, 4, dtype=int)}) == -np.inf


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


def test_three_levels_with_an_exact_total_match_enumeration():
    """State 01 > county 01001 > tracts 01001000100 and 01001000200, cells sex: each tract's
    cells (variance 2), the county's sex margin (variance 1.5), the state's count of m
    (variance 3) and its total exact. Every draw keeps the total and the means match the
    enumeration over x >= 0 with that total (the likelihood written out by hand)."""
    rng = np.random.default_rng(8)
    truth = np.array([[2, 4], [3, 1]])  # (tract, sex)
    tracts = ["01001000100", "01001000200"]
    tract = dp.DiscreteGaussian(math.sqrt(2.0)).release(truth, rng)
    county = dp.DiscreteGaussian(math.sqrt(1.5)).release(truth.sum(0), rng)
    state_m = dp.DiscreteGaussian(math.sqrt(3.0)).release(truth[:, :1].sum(0), rng)
    rows = [(t, "detailed", s, int(tract[i, j]), 2.0) for i, t in enumerate(tracts)
            for j, s in enumerate(SMALL_HIST["sex"])]
    rows += [("01001", "sex", s, int(county[j]), 1.5) for j, s in enumerate(SMALL_HIST["sex"])]
    rows += [("01", "sex", "m", int(state_m[0]), 3.0)]
    table = pd.DataFrame(rows, columns=["geocode", "query", "sex", "noisy_count", "variance"])
    b = int(truth.sum())
    inv = pd.DataFrame([("01", "total", None, b)], columns=["geocode", "query", "sex", "value"])
    nmf = dp.read_noisy_measurements(table, SMALL_HIST, invariants=inv)
    assert nmf.areas["geocode"].tolist() == ["01", "01001", *tracts]

    grid = np.indices((BOX,) * 4).reshape(4, -1)  # x00, x01, x10, x11
    log_p = stats.poisson.logpmf(grid, RATES[:, None]).sum(axis=0)
    log_p += dp.DiscreteGaussian(math.sqrt(2.0)).log_likelihood(tract.reshape(-1)[:, None], grid).sum(axis=0)
    margin = np.stack([grid[0] + grid[2], grid[1] + grid[3]])
    log_p += dp.DiscreteGaussian(math.sqrt(1.5)).log_likelihood(county[:, None], margin).sum(axis=0)
    log_p += dp.DiscreteGaussian(math.sqrt(3.0)).log_likelihood(np.full(grid.shape[1], state_m[0]), margin[0])
    log_p = np.where(grid.sum(axis=0) == b, log_p, -np.inf)
    w = np.exp(log_p - log_p.max())
    w /= w.sum()
    exact = grid @ w
    sd = np.sqrt((grid**2) @ w - exact**2)

    mean, ess, idata = fitted_means(nmf)
    print("enumeration", np.round(exact, 4), "dp.sample", np.round(mean, 4), "ess", np.round(ess))
    assert np.all(idata.posterior["counts"].values.sum(-1) == b)
    assert "sum-tree" in idata.posterior.attrs["dpinfer"]
    np.testing.assert_array_less(np.abs(mean - exact), 4.0 * sd / np.sqrt(ess))


def test_observe_registers_one_nested_release_and_can_drop_invariants():
    """Flat (leaf-major) or (leaves, cells) counts: one release "nmf" with every term; with
    invariants="drop" the equality is left out, with a warning."""
    table, _, _ = small_table(np.random.default_rng(2))
    inv = pd.DataFrame([("01001", "total", None, 6)], columns=["geocode", "query", "sex", "value"])
    nmf = dp.read_noisy_measurements(table, SMALL_HIST, invariants=inv)
    assert nmf.shape == (2, 2)
    for shape in [(4,), (2, 2)]:
        with pm.Model() as model:
            observed = nmf.observe(pm.Poisson("counts", 3.0, shape=shape))
        assert [v.name for v in observed] == ["nmf"]
        assert [r.name for r in releases_of(model)] == ["nmf"]
    with pm.Model() as model:
        counts = pm.Poisson("counts", RATES, shape=4)
        with pytest.warns(UserWarning, match="exact counts of the table are left out"):
            observed = nmf.observe(counts, invariants="drop", name="table")
        assert [v.name for v in observed] == ["table"]
        with pytest.raises(ValueError, match="invariants must be one of"):
            nmf.observe(counts, invariants="ignore")
    names = releases_of(model)[0].mechanism.sums.term_name
    assert not any("(=)" in n for n in names) and len(names) == 5
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


# --- an analyst's model of a three-level table --------------------------------------------------

# Variances of the synthetic state's measurements, by (query, geolevel); the state total is exact.
STATE_VARIANCE = {("detailed", "tract"): 20.0, ("total", "tract"): 8.0, ("detailed", "county"): 10.0,
                  ("votingage", "county"): 6.0, ("total", "county"): 5.0, ("detailed", "state"): 5.0}


def state_model(nmf, n_counties: int):
    """The analyst's model: x[t, c] ~ Poisson(exp(cell_c + county_k(t))), cell_c ~ N(3, 1),
    county_k ~ N(0, 0.5) for k >= 1 (county 0 the baseline), the table observed."""
    county_of = np.repeat(np.arange(n_counties), nmf.shape[0] // n_counties)
    with pm.Model() as model:
        cell = pm.Normal("cell", 3.0, 1.0, shape=nmf.shape[1])
        county = pm.Normal("county", 0.0, 0.5, shape=n_counties - 1)
        effect = pm.math.concatenate([np.zeros(1), county])
        counts = pm.Poisson("counts", pm.math.exp(cell[None, :] + effect[county_of][:, None]), shape=nmf.shape)
        nmf.observe(counts)
    return model


def synthetic_state(n_counties: int, tracts: int, seed: int):
    """A state "01" of ``n_counties`` counties x ``tracts`` tracts, cells votingage x hispanic
    (:data:`HIST`): parameters and counts drawn from :func:`state_model`'s prior; every
    tract's cells and total, every county's cells, voting-age margin and total and the state's
    cells released with the discrete Gaussian mechanism (:data:`STATE_VARIANCE`), the state
    total exact. Returns (table, invariants, truth (tracts, cells), parameters)."""
    rng = np.random.default_rng(seed)
    cell, county = rng.normal(3.0, 1.0, 4), rng.normal(0.0, 0.5, n_counties - 1)
    counties = [f"01{2 * k + 1:03d}" for k in range(n_counties)]
    leaves = [c + f"{100 * (t + 1):06d}" for c in counties for t in range(tracts)]
    effect = np.repeat(np.concatenate([[0.0], county]), tracts)
    truth = rng.poisson(np.exp(cell[None, :] + effect[:, None]))
    cells = [(v, h) for v in HIST["votingage"] for h in HIST["hispanic"]]
    rows = []
    for level, areas, counts in [("tract", leaves, truth),
                                 ("county", counties, truth.reshape(n_counties, tracts, 4).sum(1)),
                                 ("state", ["01"], truth.sum(0, keepdims=True))]:
        for g, x in zip(areas, counts):
            rows += [(g, "detailed", v, h, t, STATE_VARIANCE["detailed", level]) for (v, h), t in zip(cells, x)]
            if ("votingage", level) in STATE_VARIANCE:
                rows += [(g, "votingage", v, None, x[2 * i:2 * i + 2].sum(), STATE_VARIANCE["votingage", level])
                         for i, v in enumerate(HIST["votingage"])]
            if ("total", level) in STATE_VARIANCE:
                rows.append((g, "total", None, None, x.sum(), STATE_VARIANCE["total", level]))
    table = pd.DataFrame(rows, columns=["geocode", "query", "votingage", "hispanic", "true", "variance"])
    table["noisy_count"] = [int(dp.DiscreteGaussian(math.sqrt(r.variance)).release(np.array([r.true]), rng)[0])
                            for r in table.itertuples()]
    invariants = invariant_table([("01", "total", None, None, int(truth.sum()))])
    return table.drop(columns="true"), invariants, truth, {"cell": cell, "county": county}


def test_a_three_level_table_fits_with_the_defaults():
    """The reported table (2 counties x 3 tracts x 4 cells, measurements at state, county and
    tract, the state total exact, cell and county effects): dp.sample's defaults converge
    (R-hat <= 1.01, bulk ESS >= 400 over every parameter and count) on the compiled engine's
    sum-tree moves, every draw keeps the total, and the counts' 90% intervals cover the truth
    at least 17 times in 24 (P(Binomial(24, 0.9) <= 16) = 0.0017)."""
    table, invariants, truth, _ = synthetic_state(2, 3, seed=1)
    nmf = dp.read_noisy_measurements(table, HIST, invariants=invariants)
    assert nmf.shape == (6, 4) and len(nmf.releases) == 6
    model = state_model(nmf, 2)
    idata = dp.sample(model=model, random_seed=2, progressbar=False)
    verdict = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    report = json.loads(idata.posterior.attrs["dpinfer"])["counts"]
    print(verdict, report["engine"], report["widenings"], idata.posterior.attrs["sampling_time"])
    assert verdict["converged"] and verdict["quantities"] == 4 + 1 + 24, verdict
    assert verdict["max_rhat"] <= 1.01 and verdict["min_ess_bulk"] >= 400
    assert report["engine"] == "compiled" and "sum-tree" in report["method"]
    draws = idata.posterior["counts"].values.reshape(-1, *nmf.shape)
    assert np.all(draws.sum((1, 2)) == truth.sum())
    lo, hi = np.quantile(draws, [0.05, 0.95], axis=0)
    assert np.sum((truth >= lo) & (truth <= hi)) >= 17


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
