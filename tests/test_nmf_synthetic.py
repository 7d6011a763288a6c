"""The NMF layout as data (dpinfer/io/nmf/layout.py) against the fact sheet
(docs/dev/census-nmf-layout.md) and numpy references, and the synthetic NMF
(dpinfer/io/nmf/synthetic.py): its truth's margins and geography, its noise against the
production variances, its constraints on the truth, its reproducibility and the shipped
instance models/synthetic_state_nmf."""

import inspect
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse

import dpinfer as dp
from dpinfer.io.nmf import layout, persons, synthetic
from dpinfer.io.nmf.table import census_table
from dpinfer.io.nmf.layout import (
    AXES,
    CENRACE_LABELS,
    LEVELS,
    PL94_QUERIES,
    PRODUCTION_BUDGET,
    SHAPE,
    axis_partition,
    query_matrix,
)

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "synthetic_state_nmf"
TINY = dict(n_counties=1, tracts_per_county=2, block_groups_per_tract=1, blocks_per_block_group=2,
            aian_tracts=1, seed=7)


# --- layout --------------------------------------------------------------------------------

def test_cenrace_has_63_levels_in_the_fact_sheet_order():
    assert len(CENRACE_LABELS) == 63 == len(set(CENRACE_LABELS))
    assert SHAPE == (8, 2, 2, 63) and layout.N_CELLS == 2016
    # spot checks transcribed from the fact sheet §4
    expected = {0: "white", 5: "sor", 6: "white-black", 10: "white-sor", 11: "black-aian",
                20: "nhopi-sor", 21: "white-black-aian", 30: "white-nhopi-sor",
                40: "asian-nhopi-sor", 41: "white-black-aian-asian", 55: "aian-asian-nhopi-sor",
                56: "white-black-aian-asian-nhopi", 61: "black-aian-asian-nhopi-sor",
                62: "white-black-aian-asian-nhopi-sor"}
    assert {i: CENRACE_LABELS[i] for i in expected} == expected
    # independent order: by number of races, then lexicographic over the race indices
    races = ["white", "black", "aian", "asian", "nhopi", "sor"]
    keys = [tuple(races.index(r) for r in label.split("-")) for label in CENRACE_LABELS]
    assert keys == sorted(keys, key=lambda k: (len(k), k))
    assert [sum(1 for k in keys if len(k) == n) for n in range(1, 7)] == [math.comb(6, n) for n in range(1, 7)]


def test_axis_partitions():
    np.testing.assert_array_equal(axis_partition("hhgq", "*").matrix, np.ones((1, 8)))
    np.testing.assert_array_equal(axis_partition("hhgq", "detailed").matrix, np.eye(8))
    np.testing.assert_array_equal(axis_partition("cenrace", "cenrace").matrix, np.eye(63))
    np.testing.assert_array_equal(axis_partition("hhgq", "hhinstlevels").matrix,
                                  [[1, 0, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(axis_partition("hhgq", "gqNursingTotal").matrix, [[0, 0, 0, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(axis_partition("votingage", "nonvoting").matrix, [[1, 0]])
    major = axis_partition("cenrace", "majorrace")
    assert major.matrix.shape == (7, 63) and major.matrix[6].sum() == 57
    assert (major.matrix.sum(axis=0) == 1).all() and major.labels[-1] == "two or more races"
    numraces = axis_partition("cenrace", "numraces")
    assert numraces.matrix.sum(axis=1).tolist() == [6, 15, 20, 15, 6, 1]
    assert numraces.matrix[1, CENRACE_LABELS.index("asian-sor")] == 1
    with pytest.raises(ValueError, match=r"unknown spec 'races' on axis 'cenrace'; known specs: "
                                         r"\('\*', 'detailed', 'cenrace', 'majorrace', 'numraces'\)"):
        axis_partition("cenrace", "races")
    with pytest.raises(ValueError, match="axis must be one of"):
        axis_partition("sex", "*")


def _reference_answer(axes, x):
    """The query answer by numpy sums over the reshaped histogram (fact sheet §2)."""
    h = x.reshape(SHAPE)
    for k, (axis, spec) in enumerate(zip(AXES, axes)):
        groups = axis_partition(axis, spec).matrix.astype(bool)
        h = np.stack([np.take(h, np.flatnonzero(g), axis=k).sum(axis=k) for g in groups], axis=k)
    return h.ravel()


@pytest.mark.parametrize("axes", [*PL94_QUERIES.values(), ("gqNursingTotal", "nonvoting", "*", "*"),
                                  ("hhinstlevels", "*", "hispanic", "majorrace")])
def test_query_matrix_is_the_c_order_marginal(axes):
    x = np.random.default_rng(3).integers(0, 50, size=2016)
    shape, matrix = query_matrix(axes)
    assert shape == tuple(axis_partition(a, s).matrix.shape[0] for a, s in zip(AXES, axes))
    assert matrix.shape == (math.prod(shape), 2016) and matrix.format == "csr"
    np.testing.assert_array_equal(matrix @ x, _reference_answer(axes, x))
    np.testing.assert_array_equal((matrix @ x).reshape(shape), _reference_answer(axes, x).reshape(shape))


def test_the_production_budget_matches_the_fact_sheet():
    b = PRODUCTION_BUDGET
    assert b.rho == Fraction(542, 339) ** 2 == Fraction(293764, 114921)
    # fact sheet §5: per-level rho to 5 decimals
    level_rho = {"US": 0.06486, "State": 0.89802, "County": 0.27876, "Tract": 0.42843,
                 "Block_Group": 0.78327, "Block": 0.10290}
    for level, rho in level_rho.items():
        assert float(b.rho * b.level_shares[level]) == pytest.approx(rho, abs=5e-6)
        assert sum(b.query_rho(level, q) for q in b.query_shares[level]) == b.rho * b.level_shares[level]
    assert set(b.query_shares["US"]) == set(PL94_QUERIES) - {"total"}
    assert all(set(b.query_shares[lv]) == set(PL94_QUERIES) for lv in LEVELS[1:])
    # worked examples of §5: Block detailed sigma^2 ~ 10.09, Block total ~ 7963
    assert b.variance("Block", "detailed") == pytest.approx(10.09, abs=0.01)
    assert b.variance("Block", "total") == pytest.approx(7963, abs=1)
    assert b.variance("Tract", "hhgq") == float(1 / (b.rho * Fraction(687, 4099) * Fraction(5, 4102)))
    with pytest.raises(ValueError, match="no query 'total' at level 'US'"):
        b.query_rho("US", "total")
    with pytest.raises(ValueError, match="summing to 1"):
        layout.PrivacyBudget(Fraction(1), {"US": Fraction(1, 2)}, {"US": {"total": Fraction(1)}})


# --- the synthetic NMF ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    truth = pd.read_parquet(SHIPPED / "truth.parquet")
    return json.loads((SHIPPED / "manifest.json").read_text()), truth


def _block_histograms(truth: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    blocks, index = np.unique(truth["geocode"].to_numpy(), return_inverse=True)
    x = np.zeros((len(blocks), 2016), dtype=np.int64)
    x[index, truth["cell"].to_numpy()] = truth["count"].to_numpy()
    return blocks, x


def test_the_shipped_instance_is_the_small_preset(shipped):
    manifest, truth = shipped
    expected = synthetic._parameters(**synthetic.PRESETS["small"], levels=LEVELS)
    assert manifest["parameters"] == expected
    defaults = {k: p.default for k, p in inspect.signature(dp.write_synthetic_nmf).parameters.items()
                if k in synthetic.PRESETS["small"]}
    assert defaults == synthetic.PRESETS["small"]
    assert "--preset small" in (SHIPPED / "README.md").read_text()
    size = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    assert size < 1.5e6
    g = manifest["geounits"]
    assert (g["US"], g["State"]) == (1, 2) and 3 <= g["County"] <= 4
    assert 8 <= g["Tract"] <= 12 and 18 <= g["Block_Group"] <= 32 and 100 <= g["Block"] <= 200
    assert manifest["population"] == truth["count"].sum()


def test_the_truth_has_realistic_margins(shipped):
    manifest, truth = shipped
    _, x = _block_histograms(truth)
    h = x.reshape(-1, *SHAPE)
    total = h.sum()
    assert h[:, 0].sum() / total > 0.85                              # mostly households
    assert 0.70 < h[:, :, 1].sum() / total < 0.85                    # ~77% voting age
    assert 0.0 < h[:, :, :, 1].sum() / total < 0.2                   # a Hispanic minority
    race = h.sum(axis=(0, 1, 2, 3))
    assert race[0] / total > 0.6 and np.sort(race)[::-1][:4].sum() / total > 0.85
    assert h[:, 3, 0].sum() == 0                                     # nurse_nva_0: no minors in nursing
    populated = h.sum(axis=(1, 2, 3, 4))
    assert manifest["empty_blocks"] == manifest["geounits"]["Block"] - len(populated)
    assert manifest["empty_blocks"] > 0 and populated.max() > 3 * np.median(populated)
    gq_blocks = (h[:, 1:].sum(axis=(1, 2, 3, 4)) > 0).sum()
    assert 0 < gq_blocks <= 0.1 * manifest["geounits"]["Block"]     # group quarters concentrated


def test_geocodes_nest_and_follow_the_spine_format(tmp_path):
    dp.write_synthetic_nmf(tmp_path, state_fips=["19", "20"], **TINY)
    nmf = dp.read_nmf(tmp_path, ["19", "20"])
    geo = nmf.geography
    assert geo["US"].geocodes.tolist() == [""]
    assert geo["State"].geocodes.tolist() == ["019", "020", "119", "120"]
    assert geo["County"].geocodes.tolist() == ["019100011", "020100011", "119090011", "120090011"]
    assert geo["County"].width == 9 and geo["Tract"].width == 10 and geo["Block_Group"].width == 11
    assert geo["Block"].width == 11 + 16
    for block in geo["Block"].geocodes:
        g16 = block[-16:]
        assert g16[:2] == block[1:3]                     # geocode16 starts with the state FIPS
        assert g16[11] == g16[12] == block[10]           # block-group digit, block's first digit
    aian = [b for b in geo["Block"].geocodes if b.startswith("1")]
    assert aian and all(b[-16:][5:9] == "9401" for b in aian)
    for level in LEVELS[1:]:
        parents = geo[level].parents
        assert all(g.startswith(p) for g, p in zip(geo[level].geocodes, parents))


def _assert_constraints_hold(nmf, blocks, x):
    """Every constraint of the files holds for the truth (blocks' histograms x)."""
    for level in ("US", "State", "Block"):
        con = nmf.constraints(level)
        width = nmf.geography[level].width
        assert len(con.geocodes) > 0 and all(len(g) == width for g in con.geocodes)
        codes, agg = _sums(blocks, x, width, ordinary_only=False)
        at = np.minimum(np.searchsorted(codes, con.geocodes), len(codes) - 1)
        found = codes[at] == np.asarray(con.geocodes)        # geounits without persons: zeros
        rows = scipy.sparse.csr_array(np.vstack([agg, np.zeros((1, agg.shape[1]), dtype=np.int64)]))
        answer = con.matrix.multiply(rows[np.where(found, at, len(codes))]).sum(axis=1)
        assert np.all(con.lower <= answer) and np.all(answer <= con.upper), level


def test_constraints_hold_for_the_truth_and_match_the_rule(tmp_path):
    manifest = dp.write_synthetic_nmf(tmp_path, **{**TINY, "blocks_per_block_group": 6, "seed": 11})
    nmf = dp.read_nmf(tmp_path, "19")
    _assert_constraints_hold(nmf, *_block_histograms(pd.read_parquet(tmp_path / "truth.parquet")))
    us = nmf.constraints("US")
    assert us.lower.tolist() == us.upper.tolist() == [manifest["population"]]
    block = nmf.constraints("Block")
    nurse = block.query_axes.index(("gqNursingTotal", "nonvoting", "*", "*"))
    assert np.all(block.upper[block.query_index == nurse] == 0)


def test_noise_has_the_production_variances(shipped):
    """values - Q (truth aggregated) = noise; its z = noise / sigma has E z = 0 and
    E z^2 = Var_DG(sigma) / sigma^2 (= 1 to 1e-8 for sigma^2 >= 1.2), within 5 Monte Carlo
    standard errors (Var z^2 = 2 for a Gaussian) pooled and per (level, query)."""
    _, truth = shipped
    nmf = dp.read_nmf(SHIPPED, "19")
    blocks, x = _block_histograms(truth)
    pooled = []
    for (level, query), q in nmf.dpqueries.items():
        assert np.all(q.variance == PRODUCTION_BUDGET.variance(level, query))
        width = nmf.geography[level].width
        prefix = pd.Series([b[:width] for b in blocks])
        agg = pd.DataFrame(x).groupby(prefix.to_numpy()).sum().reindex(q.geocodes, fill_value=0)
        noise = q.values - (q.matrix @ agg.to_numpy().T).T
        sigma = math.sqrt(q.variance[0])
        z = noise.ravel() / sigma
        expected = dp.DiscreteGaussian(sigma).noise_variance / sigma**2
        assert expected == pytest.approx(1.0, abs=1e-8)
        if z.size >= 50:
            assert abs(np.mean(z**2) - expected) < 5 * math.sqrt(2 / z.size), (level, query)
        pooled.append(z)
    z = np.concatenate(pooled)
    assert z.size > 400_000
    assert abs(np.mean(z)) < 5 / math.sqrt(z.size)
    assert abs(np.mean(z**2) - 1) < 5 * math.sqrt(2 / z.size)
    assert np.all(noise == np.round(noise))


def test_writing_is_reproducible_and_the_truth_ignores_levels(tmp_path):
    a = dp.write_synthetic_nmf(tmp_path / "a", **TINY)
    dp.write_synthetic_nmf(tmp_path / "b", **TINY)
    c = dp.write_synthetic_nmf(tmp_path / "c", **TINY, levels=["Block", "US"])
    part = "US_Person_PL_PROD/Block.parquet/DPQuery/State=19/part-0.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / part), pd.read_parquet(tmp_path / "b" / part))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / part), pd.read_parquet(tmp_path / "c" / part))
    for other in ("b", "c"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / "truth.parquet"),
                                      pd.read_parquet(tmp_path / other / "truth.parquet"))
    assert not (tmp_path / "c" / "US_Person_PL_PROD" / "Tract.parquet").exists()
    assert c["written_geounits"] == {"US": 1, "Block": a["geounits"]["Block"]}
    assert dp.read_nmf(tmp_path / "c", 19).levels == ("US", "Block")


def test_the_default_truth_rewrites_the_shipped_instance(tmp_path):
    """The shipped instance was written before there were truth scenarios: the default
    (hierarchical) truth with the small preset writes every file of it again, value for value
    (and its manifest, which now names the truth)."""
    manifest = dp.write_synthetic_nmf(tmp_path, **synthetic.PRESETS["small"])
    assert json.loads((SHIPPED / "manifest.json").read_text()) == json.loads(json.dumps(manifest))
    assert manifest["parameters"]["truth"] == "hierarchical"
    assert set(manifest["scenario"]["county_kinds"].values()) == {"hierarchical"}
    files = sorted(p.relative_to(SHIPPED) for p in SHIPPED.rglob("*.parquet") if p.is_file())
    assert len(files) == 1 + 2 * 6 + 2 * 2     # truth, DPQuery per level, Constraint at US/State/Block
    assert files == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.parquet") if p.is_file())
    for path in files:
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / path), pd.read_parquet(SHIPPED / path))


def test_the_command_line_writes_a_preset(tmp_path, capsys):
    synthetic.main(["--out", str(tmp_path / "out"), "--levels", "US,State", "--seed", "5"])
    assert "wrote" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["parameters"]["seed"] == 5 and manifest["parameters"]["levels"] == ["US", "State"]
    assert "write_synthetic_nmf(root, **" in (tmp_path / "out" / "README.md").read_text()
    synthetic.main(["--out", str(tmp_path / "seg"), "--preset", "small", "--truth", "segregated"])
    manifest = json.loads((tmp_path / "seg" / "manifest.json").read_text())
    assert manifest["parameters"] == synthetic._parameters(**synthetic.PRESETS["small"], levels=LEVELS,
                                                           truth="segregated")
    assert set(manifest["scenario"]["county_kinds"].values()) == {"segregated", "hierarchical"}
    assert "--preset small --truth segregated\n" in (tmp_path / "seg" / "README.md").read_text()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"state_fips": "72"}, ValueError, "Puerto Rico"),
    ({"state_fips": "9"}, ValueError, "2-digit FIPS"),
    ({"block_groups_per_tract": (2, 10)}, ValueError, r"block_groups_per_tract must satisfy 1 <= low <= high <= 9"),
    ({"n_counties": 2.5}, TypeError, "n_counties must be an int or a"),
    ({"levels": ["Place"]}, ValueError, "levels must be a non-empty subset"),
    ({"aian_tracts": -1}, ValueError, "aian_tracts must be an int in 0..99"),
    ({"budget": "production"}, TypeError, "budget must be a PrivacyBudget"),
    ({"truth": "prison"}, ValueError, r"truth must be one of \('hierarchical', 'segregated'"),
    ({"truth": "mixed"}, ValueError, r"truth='mixed' needs n_counties >= 4 in every state"),
])
def test_bad_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        dp.write_synthetic_nmf(tmp_path, **{**TINY, **kwargs})


def test_an_existing_instance_is_not_overwritten(tmp_path):
    dp.write_synthetic_nmf(tmp_path, **TINY, levels=["US"])
    with pytest.raises(FileExistsError, match="US_Person_PL_PROD exists"):
        dp.write_synthetic_nmf(tmp_path, **TINY)



# --- truth scenarios (dpinfer/io/nmf/persons.py) ---------------------------------------------

#: The validation's shape: Iowa-like counties (4-14 tracts, 3 block groups a tract), two states;
#: only the US level is written, so the cost is the truth's (a fraction of a second).
IOWA_SHAPE = {**synthetic.PRESETS["iowa"], "n_counties": 10, "state_fips": ("19", "20"), "seed": 2020,
              "levels": ["US"]}
MAJOR = axis_partition("cenrace", "majorrace")  # pl94-28's 7 race groups


def _scenario(root, truth, **kwargs):
    """(manifest, block geocodes, histograms) of a written truth."""
    manifest = dp.write_synthetic_nmf(root, **{**IOWA_SHAPE, **kwargs, "truth": truth})
    return manifest, *_block_histograms(pd.read_parquet(root / "truth.parquet"))


def _coarse(x):
    """(n, 2, 2, 7): voting age x Hispanic x major race group, group quarters summed."""
    return x.reshape(-1, *SHAPE).sum(axis=1) @ MAJOR.matrix.T


def _sums(blocks, values, width, ordinary_only=True):
    """(geocodes, sums) of ``values`` over the blocks under each geocode of ``width``
    characters (the AIAN part left out by default)."""
    keep = np.array([not ordinary_only or b.startswith("0") for b in blocks])
    codes, index = np.unique([b[:width] for b in blocks[keep]], return_inverse=True)
    out = np.zeros((len(codes), *values.shape[1:]), dtype=np.int64)
    np.add.at(out, index, values[keep])
    return codes, out


def test_segregated_groups_live_in_a_few_tracts(tmp_path):
    """Black alone, asian alone and Hispanic persons: 40-90% of their enclave tracts, < 2%
    of every other tract, nearly all in their enclaves (dissimilarity index D =
    1/2 sum_t |g_t/G - o_t/O| > 0.75), against the hierarchical truth of the same seed (same
    counties and tracts), where D < 0.5 and the same tracts hold few of them."""
    manifest, blocks, x = _scenario(tmp_path / "s", "segregated")
    _, h_blocks, h_x = _scenario(tmp_path / "h", "hierarchical")
    enclaves = manifest["scenario"]["enclaves"]
    assert set(manifest["scenario"]["county_kinds"].values()) == {"segregated", "hierarchical"}
    width = len(enclaves["black"][0])
    for group, count in {"black": lambda c: c[..., 1].sum(axis=(1, 2)),
                         "asian": lambda c: c[..., 3].sum(axis=(1, 2)),
                         "hispanic": lambda c: c[:, :, 1].sum(axis=(1, 2))}.items():
        for state in ("019", "020"):          # every state has its own enclaves
            assert any(t.startswith(state) for t in enclaves[group]), (group, state)
        shares = {}
        for name, b, xx in (("segregated", blocks, x), ("hierarchical", h_blocks, h_x)):
            tracts, c = _sums(b, _coarse(xx), width)
            g, total = count(c), c.sum(axis=(1, 2, 3))
            inside = np.isin(tracts, enclaves[group])
            assert 0 < inside.sum() <= len(enclaves[group]) and inside.mean() < 0.15  # (a tract may be empty)
            dissimilarity = 0.5 * np.abs(g / g.sum() - (total - g) / (total - g).sum()).sum()
            shares[name] = (g / total, inside, dissimilarity, g[inside].sum() / g.sum())
        share, inside, dissimilarity, enclosed = shares["segregated"]
        assert np.all((0.35 < share[inside]) & (share[inside] < 0.92)), group
        assert share[~inside].max() < 0.02 and dissimilarity > 0.75 and enclosed > 0.75, group
        share, inside, dissimilarity, enclosed = shares["hierarchical"]
        assert share.max() < 0.35 and dissimilarity < 0.5 and enclosed < 0.25, group


def test_structural_zeros_are_exact_zeros_of_whole_areas(tmp_path):
    """Absent race groups are 0 in their whole county, tracts without Hispanic persons and
    adults-only block groups are exactly that; far more (tract, pl94-28 cell) pairs and
    (county, race group) pairs are 0 than in the hierarchical truth of the same seed."""
    manifest, blocks, x = _scenario(tmp_path / "z", "structural-zeros")
    _, h_blocks, h_x = _scenario(tmp_path / "h", "hierarchical")
    details = manifest["scenario"]
    coarse = _coarse(x)
    counties, per_county = _sums(blocks, coarse, 9)
    for county, groups in details["absent_race_groups"].items():
        present = per_county[list(counties).index(county)].sum(axis=(0, 1))
        absent = [MAJOR.labels.index(g) for g in groups]
        assert np.all(present[absent] == 0) and present[0] > 0 and "white alone" not in groups
    n_absent = sum(map(len, details["absent_race_groups"].values()))
    assert 0.3 < n_absent / (6 * len(counties)) < 0.7                  # each absent w.p. 0.5
    free = details["hispanic_free_tracts"]
    tracts, per_tract = _sums(blocks, coarse, len(free[0]))
    assert np.all(per_tract[np.isin(tracts, free)][:, :, 1] == 0)
    assert 0.3 < len(free) / len(tracts) < 0.7                          # w.p. 0.5
    adults = details["adults_only_block_groups"]
    groups, per_bg = _sums(blocks, coarse, len(adults[0]))
    assert np.all(per_bg[np.isin(groups, adults)][:, 0] == 0)
    assert per_bg[np.isin(groups, adults)].sum() > 300 * len(adults)   # not empty block groups
    assert 0.1 < len(adults) / len(groups) < 0.3                        # w.p. 0.2
    zeros = {}
    for name, b, xx in (("zeros", blocks, x), ("hierarchical", h_blocks, h_x)):
        c = _coarse(xx)
        zeros[name] = (np.mean(_sums(b, c.reshape(-1, 28), len(free[0]))[1] == 0),
                       np.mean(_sums(b, c.sum(axis=(1, 2)), 9)[1][:, 1:] == 0))
    assert zeros["zeros"][0] > zeros["hierarchical"][0] + 0.25 and zeros["hierarchical"][0] < 0.4
    assert zeros["zeros"][1] > zeros["hierarchical"][1] + 0.2 and zeros["hierarchical"][1] < 0.2


def test_a_large_facility_is_added_to_the_smallest_county(tmp_path):
    """The truth is the hierarchical truth of the same seed plus, in each state, one block's
    1,500-3,000 residents of one group-quarters type, > 95% voting age, in the state's
    smallest county, with a race x Hispanic mix far from the county's households' (total
    variation distance > 0.25) and a sizeable part of that county."""
    manifest, blocks, x = _scenario(tmp_path / "f", "large-facility", n_counties=3)
    _, h_blocks, h_x = _scenario(tmp_path / "h", "hierarchical", n_counties=3)
    facilities = manifest["scenario"]["large_facilities"]
    assert [f["block"][:3] for f in facilities] == ["019", "020"]
    union = np.union1d(blocks, h_blocks)
    diff = np.zeros((len(union), 2016), dtype=np.int64)
    diff[np.searchsorted(union, blocks)] += x
    diff[np.searchsorted(union, h_blocks)] -= h_x
    assert sorted(union[diff.any(axis=1)]) == sorted(f["block"] for f in facilities)
    assert np.all(diff >= 0)
    counties, households = _sums(h_blocks, h_x.reshape(-1, 8, 252)[:, 0], 9)
    for f in facilities:
        added = diff[list(union).index(f["block"])].reshape(SHAPE)
        level = layout.LEVEL_LABELS["hhgq"].index(f["hhgq"])
        assert level in (1, 5) and added.sum() == added[level].sum() == f["residents"]
        assert 1500 <= f["residents"] <= 3000
        assert added[:, 1].sum() == f["voting_age"] and f["voting_age"] / f["residents"] > 0.95
        county = f["block"][:9]
        assert manifest["scenario"]["county_kinds"][county] == "large-facility"
        state = [c for c in counties if c[:3] == county[:3]]
        own = households[list(counties).index(county)]
        assert own.sum() == min(households[list(counties).index(c)].sum() for c in state)
        mix = lambda h: (h.reshape(2, 2, 63) @ MAJOR.matrix.T).sum(axis=0).ravel() / h.sum()  # noqa: E731
        assert 0.5 * np.abs(mix(added[level]) - mix(own)).sum() > 0.25
        assert f["residents"] > 0.02 * own.sum()


def test_the_urban_county_has_many_small_diverse_blocks(tmp_path):
    """County 001 of each state: 2 x 14 tracts, 4-6 block groups a tract, at most 20 blocks
    a block group, populated blocks of ~60 persons (the rural ones ~760) and a Gini-Simpson
    diversity 1 - sum_g p_g^2 over (Hispanic, race group) far above the rural counties'."""
    manifest, blocks, x = _scenario(tmp_path, "urban", n_counties=3)
    kinds = manifest["scenario"]["county_kinds"]
    assert [c for c, k in kinds.items() if k == "urban"] == ["019100011", "020100011"]
    size = x.sum(axis=1)
    counties, mix = _sums(blocks, _coarse(x).sum(axis=1).reshape(-1, 14), 9)
    diversity = 1 - ((mix / mix.sum(axis=1, keepdims=True)) ** 2).sum(axis=1)
    for county, d in zip(counties, diversity):
        mine = np.array([b.startswith(county) for b in blocks])
        if kinds[county] == "urban":
            codes = pd.Series(blocks[mine])  # 28 tracts: 2-digit tract numbers, 1-digit block groups
            per_tract = codes.str[:12].groupby(codes.str[:11]).nunique()
            assert len(per_tract) == 28 and per_tract.between(4, 6).all()
            assert codes.str[:12].value_counts().max() <= 20
            assert mine.sum() > 28 * 4 * 10 * 0.5
            assert 45 < size[mine].mean() < 75 and d > 0.65, (size[mine].mean(), d)
        else:
            assert size[mine].mean() > 400 and d < 0.5, (size[mine].mean(), d)


def test_mixed_has_one_county_of_each_kind(tmp_path):
    manifest, blocks, x = _scenario(tmp_path, "mixed", n_counties=5)
    details = manifest["scenario"]
    for state in ("019", "020"):
        kinds = {c[3:]: k for c, k in details["county_kinds"].items() if c.startswith(state)}
        assert [kinds[f"10{c}1"] for c in ("001", "003", "005")] == ["urban", "segregated", "structural-zeros"]
        assert sorted(kinds.values()).count("large-facility") == 1
        assert sorted(kinds.values()).count("hierarchical") == 1
        segregated = state + "10003"
        assert all(any(t.startswith(segregated) for t in details["enclaves"][g]) for g in ("black", "asian", "hispanic"))
    assert all(t[3:8] == "10003" for g in details["enclaves"].values() for t in g)
    assert all(c[3:8] == "10005" for c in details["absent_race_groups"])
    assert all(b[3:8] == "10005" for b in details["adults_only_block_groups"] + details["hispanic_free_tracts"])
    assert {details["county_kinds"][f["block"][:9]] for f in details["large_facilities"]} == {"large-facility"}
    urban = np.array([b[3:8] == "10001" for b in blocks])
    assert urban.sum() > 0.5 * (~urban).sum()                 # one county, most of the blocks
    with pytest.raises(ValueError, match=r"truth='mixed' needs n_counties >= 4 in every state"):
        dp.write_synthetic_nmf(tmp_path / "three", **{**IOWA_SHAPE, "n_counties": (3, 5), "truth": "mixed"})


#: Small instances written at every level (the Block level's noise is most of the cost: an
#: urban county's ~150 blocks take one state).
FILE_SHAPE = dict(state_fips=("19", "20"), n_counties=4, tracts_per_county=1, block_groups_per_tract=(1, 2),
                  blocks_per_block_group=(1, 3), aian_tracts=1, mean_block_population=300.0, seed=5)


@pytest.mark.parametrize("truth", persons.TRUTHS[1:])
def test_every_scenario_is_read_back_and_meets_its_constraints(tmp_path, truth):
    """Whatever the truth, the files read back, the release of 28 coarse cells on the block
    groups is built, and every constraint holds for the truth."""
    states = ["19"] if truth in ("urban", "mixed") else ["19", "20"]
    manifest = dp.write_synthetic_nmf(tmp_path, **{**FILE_SHAPE, "state_fips": states}, truth=truth)
    assert manifest["parameters"]["truth"] == truth
    nmf = dp.read_nmf(tmp_path, states)
    geo = nmf.geography
    assert {lv: len(g.geocodes) for lv, g in geo.items()} == manifest["geounits"]
    assert set(manifest["scenario"]["county_kinds"]) == set(geo["County"].geocodes)
    truth_long = pd.read_parquet(tmp_path / "truth.parquet")
    blocks, x = _block_histograms(truth_long)
    _assert_constraints_hold(nmf, blocks, x)
    table = census_table(nmf, "Block_Group", "pl94-28")
    counts = table.aggregate(truth_long["geocode"], truth_long["cell"], truth_long["count"])
    assert counts.shape == (manifest["geounits"]["Block_Group"], 28) and counts.sum() == manifest["population"]
    if truth in ("urban", "mixed"):            # 2 x 1 tracts, 4-6 block groups, 10-20 blocks each
        n_blocks = sum(b.startswith("019100011") for b in geo["Block"].geocodes)
        assert 2 * 4 * 10 <= n_blocks <= 2 * 6 * 20
    con = nmf.constraints("Block")
    for facility in manifest["scenario"]["large_facilities"]:       # counted among the facilities
        row = ((np.asarray(con.geocodes) == facility["block"]) & (con.cell == layout.LEVEL_LABELS["hhgq"].index(
            facility["hhgq"])) & (con.query_index == con.query_axes.index(PL94_QUERIES["hhgq"])))
        assert row.sum() == 1 and con.lower[row] >= 1 and con.upper[row] >= facility["residents"]
    assert len(manifest["scenario"]["large_facilities"]) == (len(states) if truth in ("large-facility", "mixed") else 0)
