"""The NMF reader (dpinfer/io/nmf/reading.py) on the shipped synthetic instance and on tiny
synthetic trees: what it reads (only the requested states' partitions), the geography, the
releases and their privacy (the production budget's total), the constraints, the tolerated
drift between partitions, and every error on a hand-broken copy naming file, column and row."""

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpinfer as dp
from dpinfer.io.nmf import NMFFileError
from dpinfer.io.nmf.layout import LEVELS, PL94_QUERIES, PRODUCTION_BUDGET

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "synthetic_state_nmf"
PRODUCT = "US_Person_PL_PROD"
TINY = dict(n_counties=1, tracts_per_county=2, block_groups_per_tract=1, blocks_per_block_group=2,
            aian_tracts=1, seed=7)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A one-state tree: State 019 and its AIAN part 119, 6 blocks."""
    root = tmp_path_factory.mktemp("tiny")
    dp.write_synthetic_nmf(root, **TINY)
    return root


@pytest.fixture
def broken(tiny, tmp_path):
    """A fresh copy of the tiny tree and a function rewriting one of its files."""
    root = tmp_path / "copy"
    shutil.copytree(tiny, root)

    def rewrite(relative: str, change) -> Path:
        path = root / PRODUCT / relative
        frame = pq.read_table(path).to_pandas()
        frame = change(frame)
        table = frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, preserve_index=False)
        pq.write_table(table, path)
        return path

    return root, rewrite


def _set(frame, row, column, value):
    """``frame`` with ``frame[column][row] = value`` (a list cell may change length)."""
    values = frame[column].tolist()
    values[row] = value
    frame[column] = values
    return frame


# --- reading ------------------------------------------------------------------------------

def test_reads_the_shipped_instance():
    nmf = dp.read_nmf(SHIPPED, "19")
    assert nmf.product == PRODUCT and nmf.states == (19,) and nmf.levels == LEVELS
    assert {lv: g.width for lv, g in nmf.geography.items()} == {
        "US": 0, "State": 3, "County": 9, "Tract": 10, "Block_Group": 11, "Block": 27}
    assert [q for lv, q in nmf.dpqueries if lv == "US"] == [q for q in PL94_QUERIES if q != "total"]
    assert [q for lv, q in nmf.dpqueries if lv == "Block"] == list(PL94_QUERIES)
    assert sorted(q for lv, q in nmf.constraint_rows if lv == "Block") == [
        "hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"]
    detailed = nmf.dpqueries[("Block", "detailed")]
    assert detailed.shape == (8, 2, 2, 63) and detailed.values.shape == (146, 2016)
    assert detailed.values.dtype == np.int64 and detailed.variance.dtype == np.float64
    assert detailed.axes == ("detailed",) * 4 and detailed.kind == "DPQuery"
    tract = nmf.geography["Tract"]
    assert tract.parent_level == "County" and all(p == g[:9] for g, p in zip(tract.geocodes, tract.parents))
    assert set(detailed.files) == {str(SHIPPED / PRODUCT / f"Block.parquet/DPQuery/State={s}/part-0.parquet")
                                   for s in (19, 119)}
    # a row is found where its files/rows say
    i = 5
    row = pq.read_table(detailed.files[i]).slice(int(detailed.rows[i]), 1).to_pylist()[0]
    assert row["geocode"] == detailed.geocodes[i] and row["value"] == detailed.values[i].tolist()
    assert row["query_name"] == "detailed_dpq"


def test_privacy_total_is_the_production_budget_share_of_the_levels_read():
    rho = float(PRODUCTION_BUDGET.rho)
    assert rho == pytest.approx(2.5562, abs=1e-4)
    nmf = dp.read_nmf(SHIPPED, 19)
    privacy = nmf.privacy()
    assert abs(privacy.rho - rho) < 1e-9
    table = privacy.table
    assert len(table) == 65 and np.allclose(table["rho"], 1 / table["min_variance"])
    assert table.loc[("Block", "detailed"), "rho"] == pytest.approx(
        float(PRODUCTION_BUDGET.query_rho("Block", "detailed")), rel=1e-12)
    part = dp.read_nmf(SHIPPED, 19, levels=["Block", "County"])
    assert part.levels == ("County", "Block")
    assert abs(part.privacy().rho - rho * (447 + 165) / 4099) < 1e-9
    # epsilon from rho-zCDP (Bun & Steinke Prop. 1.3)
    assert privacy.epsilon(1e-10) == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e10)))


def test_releases_are_discrete_gaussians_per_level_query_and_variance():
    nmf = dp.read_nmf(SHIPPED, 19)
    releases = nmf.releases()
    assert len(releases) == len(nmf.dpqueries) == 65
    for r in releases:
        q = nmf.dpqueries[(r.level, r.query)]
        assert r.mechanism.sigma**2 == pytest.approx(r.variance, rel=1e-15)
        assert r.mechanism.neighbour == "substitution" and r.mechanism.sensitivity == 1
        np.testing.assert_array_equal(r.values, q.values)
        assert r.matrix.shape == (math.prod(r.shape), 2016)
    # substitution moves two cells: a release of one variance is 2 * 1/(2 sigma^2) = 1/sigma^2
    r = releases[-1]
    assert 2 * r.mechanism.zcdp_rho == pytest.approx(1 / r.variance)


def test_a_state_is_read_without_opening_other_states(tmp_path):
    dp.write_synthetic_nmf(tmp_path, state_fips=["19", "20"], **TINY)
    both = dp.read_nmf(tmp_path, ["19", "20"])
    us = both.dpqueries[("US", "detailed")].values
    states = both.dpqueries[("State", "detailed")]
    assert states.geocodes.tolist() == ["019", "020", "119", "120"]
    # the US is the nation of both states: its noisy detailed cells sum to about the states'
    assert abs(us.sum() - states.values.sum()) < 20 * math.sqrt(2016 * 25)
    other = [p for p in (tmp_path / PRODUCT).rglob("*.parquet") if "State=20" in str(p) or "State=120" in str(p)]
    assert len(other) == 14  # (5 levels' DPQuery + State and Block Constraint) x State=20, 120
    for p in other:
        p.write_bytes(b"not a parquet file")
    one = dp.read_nmf(tmp_path, "19")
    assert one.states == (19,) and not [f for f in one.files if "State=20" in f or "State=120" in f]
    assert one.geography["State"].geocodes.tolist() == ["019", "119"]
    mine, all_ = one.dpqueries[("Block", "detailed")], both.dpqueries[("Block", "detailed")]
    assert len(mine.geocodes) == 6 and all(g[1:3] == "19" for g in mine.geocodes)
    position = {g: i for i, g in enumerate(all_.geocodes)}
    np.testing.assert_array_equal(mine.values, all_.values[[position[g] for g in mine.geocodes]])
    with pytest.raises(NMFFileError, match=r"State.parquet/DPQuery/State=20/part-0.parquet: not a readable parquet file"):
        dp.read_nmf(tmp_path, 20)


def test_a_file_url_is_read(tiny):
    by_url = dp.read_nmf(tiny.as_uri(), 19, levels=["Tract"])
    by_path = dp.read_nmf(tiny, 19, levels=["Tract"])
    np.testing.assert_array_equal(by_url.dpqueries[("Tract", "total")].values,
                                  by_path.dpqueries[("Tract", "total")].values)


def test_unknown_states_levels_and_products_list_what_exists(tiny):
    with pytest.raises(ValueError, match=r"states \[20\] have no partition .* at level State .* states there: \[19\]"):
        dp.read_nmf(tiny, [19, 20])
    with pytest.raises(ValueError, match=r"levels \['Place'\] are not in .*; it has \['US', 'State', "
                                         r"'County', 'Tract', 'Block_Group', 'Block'\]"):
        dp.read_nmf(tiny, 19, levels=["Place"])
    with pytest.raises(ValueError, match=r"no run root 'PR_Person_PL_PROD' under .*; it holds "
                                         r"\['README.md', 'US_Person_PL_PROD', 'manifest.json', 'truth.parquet'\]"):
        dp.read_nmf(tiny, 72)
    with pytest.raises(ValueError, match="states must be FIPS codes 1..99"):
        dp.read_nmf(tiny, "019")
    with pytest.raises(ValueError, match="level must be one of"):
        dp.read_nmf(tiny, 19, levels=["US"]).constraints("Block")


def test_integer_width_drift_and_a_null_sign_column_are_tolerated(broken):
    root, rewrite = broken
    before = dp.read_nmf(root, 19)

    def narrow(frame):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        table = table.set_column(table.schema.get_field_index("value"), "value",
                                 table.column("value").cast(pa.list_(pa.int32())))
        table = table.set_column(table.schema.get_field_index("query_shape"), "query_shape",
                                 table.column("query_shape").cast(pa.large_list(pa.int16())))
        table = table.set_column(table.schema.get_field_index("variance"), "variance",
                                 table.column("variance").cast(pa.float32()))
        return table.append_column("sign", pa.nulls(len(table), pa.string()))

    rewrite("Tract.parquet/DPQuery/State=19/part-0.parquet", narrow)
    after = dp.read_nmf(root, 19)
    for key, q in before.dpqueries.items():
        np.testing.assert_array_equal(after.dpqueries[key].values, q.values)
        if key[0] != "Tract":
            np.testing.assert_array_equal(after.dpqueries[key].variance, q.variance)
    tract = after.dpqueries[("Tract", "hhgq")]
    np.testing.assert_allclose(tract.variance, before.dpqueries[("Tract", "hhgq")].variance, rtol=1e-7)


def test_constraints_equalities_bounds_and_structural_zeros():
    nmf = dp.read_nmf(SHIPPED, 19)
    us = nmf.constraints("US")
    assert us.equalities.tolist() == [True] and us.query_axes == (("*",) * 4,)
    assert nmf.constraints("County").geocodes.size == 0
    block = nmf.constraints("Block")
    hhgq = block.query_axes.index(("hhgq", "*", "*", "*"))
    rows = block.query_index == hhgq
    assert rows.sum() == 146 * 8                          # lb and ub share the hhgq cells
    assert np.all(block.lower[rows & (block.cell == 0)] == 0)
    assert np.all(block.lower <= block.upper)
    geocodes, zeros = nmf.structural_zeros("Block")
    assert zeros.shape == (146, 2016) and zeros.dtype == bool
    cells = np.arange(2016).reshape(8, 2, 2, 63)
    assert zeros[:, cells[3, 0].ravel()].toarray().all()  # nurse_nva_0 at every block
    # a GQ type without a facility in the state (ub = 0 at State) is zero in every block below
    state_geo, state_zeros = nmf.structural_zeros("State")
    state = nmf.constraints("State")
    for g, z in zip(state_geo, state_zeros.toarray()):
        below = [i for i, b in enumerate(geocodes) if b.startswith(g)]
        assert np.all(zeros[below][:, np.flatnonzero(z)].toarray())
    assert state.structural_zeros.any()


# --- errors -------------------------------------------------------------------------------

DPQ = "Tract.parquet/DPQuery/State=19/part-0.parquet"
CON = "Block.parquet/Constraint/State=19/part-0.parquet"


def _row_of(frame, query, k=0):
    return int(np.flatnonzero(frame["query_name"] == query)[k])


def test_missing_column(broken):
    root, rewrite = broken
    path = rewrite(DPQ, lambda f: f.drop(columns=["variance"]))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'variance': missing column") as err:
        dp.read_nmf(root, 19)
    assert err.value.file == str(path) and err.value.column == "variance" and err.value.row is None


def test_value_length_differs_from_the_query_shape(broken):
    root, rewrite = broken
    row = {}

    def change(f):
        row["i"] = _row_of(f, "hhgq_dpq", 1)
        return _set(f, row["i"], "value", f.at[row["i"], "value"][:-1])

    path = rewrite(DPQ, change)
    with pytest.raises(NMFFileError, match=rf"{path}, column 'value', row {row['i']}: holds 7 values, "
                                           r"but query_shape \[8, 1, 1, 1\] has 8 cells"):
        dp.read_nmf(root, 19)


def test_query_shape_inconsistent_with_the_axis_specs(broken):
    root, rewrite = broken
    row = {}

    def change(f):
        row["i"] = _row_of(f, "hhgq_dpq", 1)
        return _set(f, row["i"], "query_shape", np.array([4, 2, 1, 1]))

    path = rewrite(DPQ, change)
    with pytest.raises(NMFFileError, match=rf"{path}, column 'query_shape', row {row['i']}: \[4, 2, 1, 1\] "
                                           r"does not match the axis specs \('hhgq', '\*', '\*', '\*'\), "
                                           r"which give \[8, 1, 1, 1\]"):
        dp.read_nmf(root, 19)


@pytest.mark.parametrize("variance", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_variance(broken, variance):
    root, rewrite = broken
    path = rewrite(DPQ, lambda f: _set(f, 4, "variance", variance))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'variance', row 4: must be finite and > 0"):
        dp.read_nmf(root, 19)


def test_geocode_without_a_parent(broken):
    root, rewrite = broken
    # county 019100011 has tracts 0191000111, 0191000112: move one into a county that is not there
    path = rewrite(DPQ, lambda f: _set(f, 1, "geocode", "0191000212"))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'geocode', row 1: Tract geocode '0191000212' "
                                           r"has no parent in County: no geocode '019100021' there"):
        dp.read_nmf(root, 19)
    # read without County, the parent is the State 019, which exists
    assert dp.read_nmf(root, 19, levels=["State", "Tract"]).geography["Tract"].parent_level == "State"


def test_geocode_outside_its_partition_or_of_another_width(broken):
    root, rewrite = broken
    path = rewrite(DPQ, lambda f: _set(f, 2, "geocode", "1191000111"))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'geocode', row 2: '1191000111' is not a geocode "
                                           r"whose first 3 characters are 019 \(partition State=19\)"):
        dp.read_nmf(root, 19)
    path = rewrite(DPQ, lambda f: _set(f, 2, "geocode", "01910001110"))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'geocode', row 2: '01910001110' has width 11, "
                                           r"but Tract geocode .* has width 10"):
        dp.read_nmf(root, 19)


def test_lower_bound_above_upper_bound(broken):
    root, rewrite = broken
    row = {}

    def change(f):  # a GQ type without a facility (upper bound 0) gets lower bound 1
        row["i"] = _row_of(f, "hhgq_total_lb_con")
        value = f.at[row["i"], "value"].copy()
        ub = f.at[_row_of(f, "hhgq_total_ub_con"), "value"]
        row["cell"] = int(np.flatnonzero(ub == 0)[0])
        value[row["cell"]] = 1
        return _set(f, row["i"], "value", value)

    path = rewrite(CON, change)
    with pytest.raises(NMFFileError, match=rf"{path}, column 'value', row \d+: infeasible constraints at Block "
                                           rf"geocode '\d+', query cell {row['cell']} of .*'hhgq_total_ub' <= 0 "
                                           rf"contradicts 'hhgq_total_lb' >= 1 \({path}, row {row['i']}\)"):
        dp.read_nmf(root, 19)


def test_equality_outside_its_bounds(broken):
    root, rewrite = broken

    def change(f):  # the upper bounds become equalities 0, below a lower bound 3 on cell 2
        i, j = _row_of(f, "hhgq_total_ub_con"), _row_of(f, "hhgq_total_lb_con")
        f = _set(_set(f, i, "sign", "="), i, "value", np.zeros(8, dtype=np.int64))
        return _set(f, j, "value", np.where(np.arange(8) == 2, 3, f.at[j, "value"]))

    path = rewrite(CON, change)
    with pytest.raises(NMFFileError, match=rf"{path}, column 'value', row \d+: infeasible constraints .* "
                                           r"query cell 2 .*'hhgq_total_ub' = 0 contradicts 'hhgq_total_lb' >= 3"):
        dp.read_nmf(root, 19)


def test_negative_equality(broken):
    root, rewrite = broken
    row = {}

    def change(f):
        row["i"] = _row_of(f, "nurse_nva_0_con", 1)
        return _set(f, row["i"], "value", np.array([-1]))

    path = rewrite(CON, change)
    with pytest.raises(NMFFileError, match=rf"{path}, column 'value', row {row['i']}: constraint 'nurse_nva_0' "
                                           r"\(=\) of geocode '\d+' sets cell 0 to -1 < 0"):
        dp.read_nmf(root, 19)


@pytest.mark.parametrize("column, value, match", [
    ("hhgq", "gqtype", (r"unknown spec 'gqtype' on axis 'hhgq'; known specs: \('\*', 'detailed', 'hhgq', "
                        r"'hhinstlevels', 'gqNursingTotal'\)")),
    ("query_name", "total", r"'total' does not end with '_dpq'"),
    ("geocode", None, r"is null"),
])
def test_bad_cells(broken, column, value, match):
    root, rewrite = broken
    path = rewrite(DPQ, lambda f: _set(f, 3, column, value))
    with pytest.raises(NMFFileError, match=rf"{path}, column '{column}', row 3: {match}"):
        dp.read_nmf(root, 19)


def test_a_bad_sign_and_a_sign_in_dpquery(broken):
    root, rewrite = broken
    path = rewrite(CON, lambda f: _set(f, 0, "sign", "le"))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'sign', row 0: 'le' is not one of \('=', '<=', '>='\)"):
        dp.read_nmf(root, 19)
    path = rewrite(DPQ, lambda f: f.assign(sign=["="] + [None] * (len(f) - 1)))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'sign', row 0: a DPQuery row has a sign"):
        dp.read_nmf(root, 19)


def test_duplicate_rows(broken):
    root, rewrite = broken
    path = rewrite(DPQ, lambda f: pd.concat([f, f.iloc[[0]]], ignore_index=True))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'geocode', row \d+: DPQuery query 'total' of "
                                           r"geocode '\d+' appears twice"):
        dp.read_nmf(root, 19)


def test_specs_that_contradict_the_query_name(broken):
    root, rewrite = broken
    path = rewrite("County.parquet/DPQuery/State=19/part-0.parquet",
                   lambda f: _set(f, _row_of(f, "hhgq_dpq"), "hhgq", "hhinstlevels"))
    with pytest.raises(NMFFileError, match=rf"{path}, column 'query_name', row \d+: query 'hhgq' has axis specs "
                                           r"\('hhinstlevels', .*\), but the layout gives it \('hhgq', "):
        dp.read_nmf(root, 19)
