"""The NMF reader (dpinfer/io/nmf/reading.py) on the shipped synthetic instance and on tiny
synthetic trees: what it reads (only the requested states' partitions), the geography, the
releases and their privacy (the production budget's total), the constraints, the tolerated
drift between partitions, files as Spark writes them, every error on a hand-broken copy naming
file, column and row, the warnings for what the layout does not lead one to expect (missing
constraints, unknown queries, stray files), and ``dpinfer nmf``'s one-line errors."""

import math
import shutil
import uuid
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpinfer as dp
from dpinfer.cli import main
from dpinfer.io.nmf import NMFFileError
from dpinfer.io.nmf.layout import LEVELS, PL94_QUERIES, PRODUCTION_BUDGET
from dpinfer.io.nmf.reading import (
    NMFMissingConstraintsWarning,
    NMFStrayFileWarning,
    NMFUnknownQueryWarning,
    NMFWarning,
)
from dpinfer.io.nmf.table import census_table

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


# --- files as Spark writes them -------------------------------------------------------------

def _as_spark(plain: Path, root: Path) -> None:
    """A copy of a plain tree rewritten as Spark writes a partitioned dataset: below State,
    County=<spine county> subpartitions; in each, two part-0000N-<uuid>.c000.snappy.parquet
    files (one may be empty) with query_shape as list<int32>, each beside its .crc checksum;
    _SUCCESS in every dataset and partition directory."""
    shutil.copytree(plain, root)
    for dataset in (root / PRODUCT).glob("*.parquet/*"):
        (dataset / "_SUCCESS").write_bytes(b"")
        level = dataset.parent.name[: -len(".parquet")]
        for part in sorted(dataset.glob("State=*/part-0.parquet")):
            table = pq.read_table(part)
            part.unlink()
            (part.parent / "_SUCCESS").write_bytes(b"")
            shape = table.schema.get_field_index("query_shape")
            table = table.set_column(shape, "query_shape", table.column(shape).cast(pa.list_(pa.int32())))
            keys = np.array([g[3:9] if level not in ("US", "State") else "" for g in table.column("geocode").to_pylist()])
            for key in sorted(set(keys)):
                directory = part.parent / f"County={key}" if key else part.parent
                directory.mkdir(exist_ok=True)
                for k, rows in enumerate(np.array_split(np.flatnonzero(keys == key), 2)):
                    name = f"part-{k:05d}-{uuid.UUID(int=k + 1)}.c000.snappy.parquet"
                    pq.write_table(table.take(rows), directory / name, compression="snappy")
                    (directory / f".{name}.crc").write_bytes(b"checksum")


def test_files_as_spark_writes_them_give_the_same_release(tmp_path):
    plain = tmp_path / "plain"
    dp.write_synthetic_nmf(plain, state_fips=["19", "20"], **TINY)
    spark = tmp_path / "spark"
    _as_spark(plain, spark)
    parts = sorted((spark / PRODUCT / "Block.parquet" / "DPQuery" / "State=19").rglob("*.parquet"))
    assert [p.parent.name for p in parts] == ["County=100011"] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", NMFWarning)  # _SUCCESS and .crc files are skipped without a word
        ours = dp.read_nmf(spark, 19)
    theirs = dp.read_nmf(plain, 19)
    assert ours.file_states == theirs.file_states == (19, 20) and len(ours.files) > len(theirs.files)
    assert ours.dpqueries.keys() == theirs.dpqueries.keys()
    for key, q in theirs.dpqueries.items():
        mine = ours.dpqueries[key]
        a, b = np.argsort(mine.geocodes), np.argsort(q.geocodes)
        np.testing.assert_array_equal(mine.geocodes[a], q.geocodes[b])
        np.testing.assert_array_equal(mine.values[a], q.values[b])
        np.testing.assert_array_equal(mine.variance[a], q.variance[b])
    for level in LEVELS:
        for name in ("geocodes", "lower", "upper", "cell"):
            np.testing.assert_array_equal(getattr(ours.constraints(level), name),
                                          getattr(theirs.constraints(level), name))

    def terms(nmf):
        sums = census_table(nmf, "Tract").release.sums
        return sorted((str(n), int(v), sums.tables.params(int(t)))
                      for n, v, t in zip(sums.term_name, sums.term_value, sums.term_table))

    assert terms(ours) == terms(theirs)


# --- what the layout does not lead one to expect ------------------------------------------

def test_missing_constraints_are_warned_of(broken):
    root, _ = broken
    product = root / PRODUCT
    shutil.rmtree(product / "Block.parquet" / "Constraint" / "State=119")
    with pytest.warns(NMFMissingConstraintsWarning) as caught:
        nmf = dp.read_nmf(root, 19)
    assert [str(w.message) for w in caught if issubclass(w.category, NMFWarning)] == [
        f"{product}/Block.parquet/Constraint/State=119: no such partition, though "
        f"{product}/Block.parquet/DPQuery/State=119 exists: no constraint of its Block geounits is read"]
    assert {g[:3] for g in nmf.constraints("Block").geocodes} == {"019"}
    shutil.rmtree(product / "Block.parquet" / "Constraint")
    with pytest.warns(NMFMissingConstraintsWarning, match=rf"^{product}/Block.parquet/Constraint: no Constraint "
                                                          r"dataset, though .*Block.parquet/DPQuery exists and the "
                                                          r"layout puts constraints \['hhgq_total_lb', "
                                                          r"'hhgq_total_ub', 'nurse_nva_0'\] at Block"):
        nmf = dp.read_nmf(root, 19)
    assert nmf.constraints("Block").geocodes.size == 0
    # County, Tract and Block_Group have no Constraint dataset, which the layout allows: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", NMFWarning)
        dp.read_nmf(root, 19, levels=["County", "Tract", "Block_Group"])


def test_an_unknown_query_is_read_as_its_specs_say_and_warned_of(broken):
    root, rewrite = broken
    row = {}

    def rename(frame, old, new):
        row[new] = _row_of(frame, old)
        frame["query_name"] = frame["query_name"].replace(old, new)
        return frame

    path = rewrite(DPQ, lambda f: rename(f, "hhinstlevels_dpq", "institutions_dpq"))
    con = rewrite("State.parquet/Constraint/State=19/part-0.parquet",
                  lambda f: rename(f, "hhgq_total_ub_con", "gq_upper_con"))
    with pytest.warns(NMFUnknownQueryWarning) as caught:
        nmf = dp.read_nmf(root, 19, levels=LEVELS[:4])
    assert sorted(str(w.message) for w in caught if issubclass(w.category, NMFWarning)) == [
        f"{con}, row {row['gq_upper_con']}: Constraint query 'gq_upper' is not one of the layout's PL94 "
        "person queries ['total', 'hhgq_total_lb', 'hhgq_total_ub', 'nurse_nva_0']; it is read as its axis specs "
        "('hhgq', '*', '*', '*') say",
        f"{path}, row {row['institutions_dpq']}: DPQuery query 'institutions' is not one of the layout's PL94 "
        f"person queries {list(PL94_QUERIES)}; it is read as its axis specs ('hhinstlevels', '*', '*', '*') say"]
    q = nmf.dpqueries[("Tract", "institutions")]
    assert q.axes == ("hhinstlevels", "*", "*", "*") and len(q.geocodes) == 2  # the State=19 tracts
    assert nmf.constraint_rows[("State", "gq_upper")].sign.tolist() == ["<="]
    usage = census_table(nmf, "Tract").usage.set_index(["level", "query"])
    assert usage.loc[("Tract", "institutions"), "used"] == (
        "not a PL94 query of the layout, used as its axis specs say: summed (3-3 published cells per term)")
    assert usage.loc[("County", "hhinstlevels"), "used"] == "summed (3-3 published cells per term)"
    assert usage.loc[("State", "hhgq+*+*+*"), "used"] == (
        "['gq_upper'] not PL94 constraints of the layout, used as their axis specs say: 1 groups of query cells "
        "as equalities and bounds")


def test_stray_files_are_warned_of_and_spark_metadata_is_not(broken):
    root, _ = broken
    before = dp.read_nmf(root, 19)
    partition = root / PRODUCT / "Tract.parquet" / "DPQuery" / "State=19"
    for name in ("_SUCCESS", ".part-0.parquet.crc", "part-0.parquet.crc", "_committed_123"):
        (partition / name).write_bytes(b"")
    (partition / "_temporary" / "0").mkdir(parents=True)
    shutil.copy(partition / "part-0.parquet", partition / "_temporary" / "0" / "part-0.parquet")
    (partition / "part-00000.csv").write_text("geocode,value\n")
    with pytest.warns(NMFStrayFileWarning) as caught:
        after = dp.read_nmf(root, 19)
    assert [str(w.message) for w in caught if issubclass(w.category, NMFWarning)] == [
        f"{partition}/part-00000.csv: not a parquet file (its name does not end in .parquet) in a partition "
        "directory: not read"]
    assert after.files == before.files
    (partition / "part-00000.csv").unlink()
    other = root / PRODUCT / "County.parquet" / "DPQuery" / "State=250"
    other.mkdir()
    with pytest.warns(NMFStrayFileWarning, match=rf"^{other}: State=250 is neither a state \(1..99\) nor a state's "
                                                 r"AIAN part \(101..199\): not read"):
        dp.read_nmf(root, 19)


def test_an_empty_partition_is_named(broken):
    root, rewrite = broken
    partition = root / PRODUCT / "Tract.parquet" / "DPQuery" / "State=119"
    rewrite("Tract.parquet/DPQuery/State=119/part-0.parquet",
            lambda f: pa.Table.from_pandas(f, preserve_index=False).slice(0, 0))
    with pytest.raises(NMFFileError, match=rf"^{partition}: the Tract DPQuery partition State=119 holds no rows "
                                           r"\(in 1 parquet file\)$"):
        dp.read_nmf(root, 19)
    (partition / "part-0.parquet").unlink()
    (partition / "_SUCCESS").write_bytes(b"")
    with pytest.raises(NMFFileError, match=rf"^{partition}: the Tract DPQuery partition State=119 holds no "
                                           r"parquet file$"):
        dp.read_nmf(root, 19)


# --- the command's errors ------------------------------------------------------------------

def test_dpinfer_nmf_reports_a_bad_root_or_file_in_one_line(broken, tmp_path):
    root, rewrite = broken
    with pytest.raises(SystemExit) as err:
        main(["nmf", str(tmp_path / "nowhere"), "--state", "19", "--out", str(tmp_path / "a")])
    assert err.value.code == (f"dpinfer nmf: no run root 'US_Person_PL_PROD' under {tmp_path / 'nowhere'}; "
                              "it holds nothing (missing)")
    path = rewrite(DPQ, lambda f: f.drop(columns=["variance"]))
    with pytest.raises(SystemExit) as err:
        main(["nmf", str(root), "--state", "19", "--out", str(tmp_path / "b")])
    assert err.value.code == f"dpinfer nmf: {path}, column 'variance': missing column (the file has " + str(
        pq.read_table(path).column_names) + ")"
    (path).write_bytes(b"PAR1 and then\nnot parquet")
    with pytest.raises(SystemExit) as err:
        main(["nmf", str(root), "--state", "19", "--out", str(tmp_path / "c")])
    assert err.value.code.startswith(f"dpinfer nmf: {path}: not a readable parquet file") and "\n" not in err.value.code
