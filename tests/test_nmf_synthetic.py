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

import dpinfer as dp
from dpinfer.io.nmf import layout, synthetic
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
        assert len(con.geocodes) > 0
        geocodes = nmf.geography[level].geocodes
        width = nmf.geography[level].width
        prefix = np.array([b[:width] for b in blocks])
        agg = np.stack([x[prefix == g].sum(axis=0) for g in geocodes])
        answer = np.asarray([(con.matrix[[i]] @ agg[np.searchsorted(geocodes, g)]).item()
                             for i, g in enumerate(con.geocodes)])
        assert np.all(con.lower <= answer) and np.all(answer <= con.upper), level
        assert all(len(g) == width for g in con.geocodes)


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


def test_the_command_line_writes_a_preset(tmp_path, capsys):
    synthetic.main(["--out", str(tmp_path / "out"), "--levels", "US,State", "--seed", "5"])
    assert "wrote" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["parameters"]["seed"] == 5 and manifest["parameters"]["levels"] == ["US", "State"]
    assert "write_synthetic_nmf(root, **" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"state_fips": "72"}, ValueError, "Puerto Rico"),
    ({"state_fips": "9"}, ValueError, "2-digit FIPS"),
    ({"block_groups_per_tract": (2, 10)}, ValueError, r"block_groups_per_tract must satisfy 1 <= low <= high <= 9"),
    ({"n_counties": 2.5}, TypeError, "n_counties must be an int or a"),
    ({"levels": ["Place"]}, ValueError, "levels must be a non-empty subset"),
    ({"aian_tracts": -1}, ValueError, "aian_tracts must be an int in 0..99"),
    ({"budget": "production"}, TypeError, "budget must be a PrivacyBudget"),
])
def test_bad_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        dp.write_synthetic_nmf(tmp_path, **{**TINY, **kwargs})


def test_an_existing_instance_is_not_overwritten(tmp_path):
    dp.write_synthetic_nmf(tmp_path, **TINY, levels=["US"])
    with pytest.raises(FileExistsError, match="US_Person_PL_PROD exists"):
        dp.write_synthetic_nmf(tmp_path, **TINY)

