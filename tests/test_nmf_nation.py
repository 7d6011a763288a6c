"""One state out of the nation's noisy measurement files, and constraints that cannot all hold.

On a synthetic run of three states (dpinfer/io/nmf/synthetic.py writes the US rows as the
nation's: the sum of the states), with each state's exact total added as a State constraint:
reading one state sets the nation's rows aside (no US term, the reason in ``usage``) and the
state's pilot lies within a few measurement sds of its truth; reading every state uses them.
Constraints that cannot all hold stop the reader with exactly the published rows that conflict
(built by hand here, so the expected set is known): the nation's total on one state, state
totals that do not add up to the nation's, a state's total below its blocks' lower bounds.
The conflict finder (dpinfer/lattice/infeasible.py) and the sampler's start (feasible_start) are
checked on hand-made systems whose conflicts are known."""

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpinfer as dp
from dpinfer.lattice.infeasible import MAX_FILTERED, conflicting_rows
from dpinfer.cli import main
from dpinfer.io.nmf.reading import NMFInfeasibleError
from dpinfer.io.nmf.table import census_table

PRODUCT = "US_Person_PL_PROD"
STATES = ("19", "20", "31")
SMALL = dict(n_counties=(1, 2), tracts_per_county=2, block_groups_per_tract=(1, 2), blocks_per_block_group=(2, 3),
             aian_tracts=1, seed=3)
LEVELS = ("US", "State", "County", "Tract", "Block_Group", "Block")


def _state_totals(root: Path, change=None) -> None:
    """Add a State ``total_con`` (=) row per State geounit: its true total (+ ``change``
    {geocode: delta}), as the published runs hold for states."""
    truth = pd.read_parquet(root / "truth.parquet")
    totals = truth.groupby(truth.geocode.str[:3])["count"].sum()
    for path in (root / PRODUCT / "State.parquet" / "Constraint").glob("State=*/part-0.parquet"):
        frame = pq.read_table(path).to_pandas()
        geocodes = sorted(set(frame.geocode))
        rows = pd.DataFrame({
            "geocode": geocodes, "query_name": "total_con", "hhgq": "*", "votingage": "*", "hispanic": "*",
            "cenrace": "*", "query_shape": [np.ones(4, np.int64)] * len(geocodes),
            "value": [np.array([totals.get(g, 0) + (change or {}).get(g, 0)], np.int64) for g in geocodes],
            "variance": 0.0, "sign": "="})
        pq.write_table(pa.Table.from_pandas(pd.concat([frame, rows], ignore_index=True), preserve_index=False), path)


@pytest.fixture(scope="module")
def nation(tmp_path_factory):
    """Three states with their AIAN parts, the nation's rows, and exact State totals."""
    root = tmp_path_factory.mktemp("nation")
    dp.write_synthetic_nmf(root, state_fips=STATES, **SMALL)
    _state_totals(root)
    return root


@pytest.fixture
def copy(nation, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(nation, root)
    return root


def _truth(root: Path, table, states) -> np.ndarray:
    truth = pd.read_parquet(root / "truth.parquet")
    truth = truth[truth.geocode.str[1:3].isin(states)]
    return table.aggregate(truth.geocode, truth.cell, truth["count"])


def _start(table):
    """The sampler's plan of census_model's counts at its first boxes: (pilot, sds, start,
    boxes) as dp.sample would start from them."""
    from dpinfer.inference.planning import first_windows, plan_model
    from dpinfer.inference.planning.nested import measurement_sd
    from dpinfer.io.nmf.model import census_model
    from dpinfer.mechanisms.records import releases_of

    model = census_model(table, leaf_sizes="published")
    (plan,) = plan_model(model, releases_of(model)).latents
    first_windows([plan], 0.01, exact_tails=True, at_least={})
    shape = plan.pilot.shape
    return plan.pilot, measurement_sd(plan.sums), plan.start.reshape(shape), plan.window.gibbs, plan.sums


def test_the_files_say_which_states_they_hold(nation):
    one = dp.read_nmf(nation, 19)
    assert one.states == (19,) and one.file_states == (19, 20, 31) and one.other_states == (20, 31)
    assert not [f for f in one.files if any(f"State={s}" in f for s in (20, 31, 120, 131))]
    every = dp.read_nmf(nation, [31, 19, 20])
    assert every.file_states == (19, 20, 31) and every.other_states == ()
    # the US level's own partition (State=0) is not a state
    assert dp.read_nmf(nation, 20, levels=["US", "State"]).file_states == (19, 20, 31)


@pytest.mark.parametrize("leaves", ["Tract", "Block_Group"])
def test_one_state_sets_the_nations_rows_aside(nation, leaves):
    """Before the fix the nation's exact total (and measurements) were imposed on state 19's
    counts: its pilot was pulled to the nation's 1,615 persons and the fit failed."""
    nmf = dp.read_nmf(nation, 19, levels=LEVELS[: LEVELS.index(leaves) + 1])
    table = census_table(nmf, leaves)
    assert "US" not in set(table.areas.level) and table.areas.level.iloc[0] == "(all)"
    sums = table.release.sums
    assert not [n for n in sums.term_name if n.startswith("US")]
    us = table.usage[table.usage.level == "US"]
    assert len(us) == 10 + 1  # the 10 US queries (no total) and the total constraint
    assert (us.terms == 0).all() and set(us.used) == {
        "not used: the nation's measurement; the files hold states [20, 31] not read",
        "not used: the nation's constraint; the files hold states [20, 31] not read"}
    assert {n.split(" [")[0] for n in sums.term_name if n.startswith("State/*")} == {"State/*+*+*+* (=)"}
    truth = _truth(nation, table, ["19"])
    pilot, sd, start, gibbs, sums = _start(table)
    assert np.max(np.abs(pilot - truth) / sd) < 4
    assert abs(pilot.sum() - truth.sum()) < 1  # the state's exact totals, not the nation's
    assert np.all((gibbs.box_lo <= start) & (start <= gibbs.box_hi)) and np.all(gibbs.box_lo <= truth) and np.all(truth <= gibbs.box_hi)
    measured, equal, at_most, at_least, _ = sums.term_kinds()
    t = sums.term_sums(start)
    y = sums.term_value
    assert np.all(t[equal] == y[equal]) and np.all(t[at_most] <= y[at_most]) and np.all(t[at_least] >= y[at_least])


def test_the_nations_truth_aggregates_to_the_states_read(nation):
    """A table of state 19 takes the whole nation's truth file (dpinfer nmf --truth): the other
    states' rows are left out, and the result is the sum of state 19's blocks per tract."""
    table = census_table(dp.read_nmf(nation, 19, levels=LEVELS[:4]), "Tract")
    truth = pd.read_parquet(nation / "truth.parquet")
    got = table.aggregate(truth.geocode, truth.cell, truth["count"])
    np.testing.assert_array_equal(got, _truth(nation, table, ["19"]))
    assert got.sum() == truth.loc[truth.geocode.str[1:3] == "19", "count"].sum()
    with pytest.raises(ValueError, match=r"geocodes \['01999'\] lie under no leaf of the table"):
        table.aggregate(["01999"], [0], [1])
    with pytest.raises(ValueError, match=r"none of the geocodes is of the table's states \['019', '119'\]"):
        table.aggregate(["0201000111"], [0], [1])


def test_every_state_read_uses_the_nations_rows(nation):
    nmf = dp.read_nmf(nation, ["19", "20", "31"], levels=LEVELS[:4])
    table = census_table(nmf, "Tract")
    assert table.areas.level.iloc[0] == "US" and (table.areas.level == "US").sum() == 1
    us = table.usage[table.usage.level == "US"]
    assert (us.terms > 0).all() and not us.used.str.startswith("not used").any()
    sums = table.release.sums
    (total,) = [i for i, n in enumerate(sums.term_name) if n.startswith("US/*+*+*+* (=)")]
    assert sums.term_value[total] == pd.read_parquet(nation / "truth.parquet")["count"].sum()
    truth = _truth(nation, table, list(STATES))
    pilot, sd, *_ = _start(table)
    assert np.max(np.abs(pilot - truth) / sd) < 4 and abs(pilot.sum() - truth.sum()) < 1


def _conflict(err) -> set:
    return {(r.level, r.geocode, r.query, r.sign, r.value) for r in err.conflict.itertuples()}


def _total(root, geocode) -> int:
    truth = pd.read_parquet(root / "truth.parquet")
    return int(truth.loc[truth.geocode.str.startswith(geocode), "count"].sum())


def test_the_nations_total_imposed_on_one_state_is_reported(copy, tmp_path):
    """The files of one state cut out of the nation's (the other states' partitions gone, the
    US rows still the nation's): the nation is then that state, and its total contradicts the
    state's two exact totals; the error names those three rows and no other."""
    for path in list((copy / PRODUCT).glob("*.parquet/*/State=*")):
        if path.name not in ("State=0", "State=19", "State=119"):
            shutil.rmtree(path)
    with pytest.raises(NMFInfeasibleError) as err:
        dp.read_nmf(copy, 19)
    assert _conflict(err.value) == {("US", "", "total", "=", _total(copy, "")),
                                    ("State", "019", "total", "=", _total(copy, "019")),
                                    ("State", "119", "total", "=", _total(copy, "119"))}
    text = str(err.value)
    for r in err.value.conflict.itertuples():
        assert f"({r.file}, row {r.row})" in text
        assert pq.read_table(r.file).slice(r.row, 1).column("query_name")[0].as_py() == "total_con"
    assert "these 3 rows conflict" in text and "cannot all hold" in text
    with pytest.raises(SystemExit) as exit_:
        main(["nmf", str(copy), "--state", "19", "--leaves", "Tract", "--out", str(tmp_path / "out")])
    line = str(exit_.value.code)
    assert line.startswith("dpinfer nmf: ") and "\n" not in line and "US.parquet/Constraint/State=0" in line


def test_state_totals_that_do_not_add_up_to_the_nations(nation, tmp_path):
    root = tmp_path / "off"
    shutil.copytree(nation, root)
    for path in (root / PRODUCT / "State.parquet" / "Constraint").glob("State=*/part-0.parquet"):
        frame = pq.read_table(path).to_pandas()
        pq.write_table(pa.Table.from_pandas(frame[frame.query_name != "total_con"], preserve_index=False), path)
    _state_totals(root, {"020": 1})
    with pytest.raises(NMFInfeasibleError) as err:
        dp.read_nmf(root, [19, 20, 31], levels=["US", "State", "County"])
    states = sorted({g for g in pd.read_parquet(root / "truth.parquet").geocode.str[:3]})
    assert _conflict(err.value) == {("US", "", "total", "=", _total(root, ""))} | {
        ("State", g, "total", "=", _total(root, g) + (g == "020")) for g in states}
    # one state read: the nation has a remainder, which its total does not contradict
    assert dp.read_nmf(root, 20, levels=["US", "State", "County"]).other_states == (19, 31)


def test_a_state_total_below_its_blocks_lower_bounds(copy):
    """Two blocks' lower bounds of 0.6 x the state's total each: either alone can hold, not
    both under the state's exact total."""
    path = copy / PRODUCT / "Block.parquet" / "Constraint" / "State=19" / "part-0.parquet"
    frame = pq.read_table(path).to_pandas()
    state = _total(copy, "019")
    bound = math.ceil(0.6 * state)
    ub = frame[frame.query_name == "hhgq_total_ub_con"]
    blocks = ub.geocode[ub.value.map(lambda v: v[0] >= bound)].iloc[:2].tolist()
    assert len(blocks) == 2
    values = frame["value"].tolist()
    for g in blocks:
        i = int(np.flatnonzero((frame.query_name == "hhgq_total_lb_con") & (frame.geocode == g))[0])
        values[i] = np.where(np.arange(8) == 0, bound, values[i])
    frame["value"] = values
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    with pytest.raises(NMFInfeasibleError) as err:
        dp.read_nmf(copy, 19)
    assert _conflict(err.value) == {("State", "019", "total", "=", state)} | {
        ("Block", g, "hhgq_total_lb", ">=", bound) for g in blocks}
    assert set(err.value.conflict.cell) == {0} and str(path) in str(err.value)
    # without the blocks the state's total is alone: nothing conflicts
    assert dp.read_nmf(copy, 19, levels=LEVELS[:5]).levels == LEVELS[:5]


# --- the conflict finder and the sampler's start --------------------------------------------

def test_conflicting_rows_is_an_irreducible_subset():
    """A parent's total 10 against its children's totals 3, 4 and 2 (rows 0-3), beside bounds
    that hold (rows 4-6): exactly rows 0-3 conflict; with the children adding up, none do.
    Large-scale totals (3.3e8) do not hide a conflict of one."""
    A = np.array([[1, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0], [1, 1, 0]])
    lower = np.array([10, 3, 4, 2, 0, 1, -np.inf])
    upper = np.array([10, 3, 4, 2, 5, np.inf, 50])
    free = (np.zeros(3), np.full(3, np.inf))
    assert conflicting_rows(A, lower, upper, *free).tolist() == [0, 1, 2, 3]
    ok = lower.copy(), upper.copy()
    ok[0][3] = ok[1][3] = 3
    assert conflicting_rows(A, *ok, *free) is None
    big = np.array([331_000_000, 100_000_000, 231_000_001, 0, 0, 0, -np.inf])
    assert conflicting_rows(A, big, np.where(np.arange(7) < 4, big, np.inf), *free).tolist() == [0, 1, 2]
    # a box makes a single row impossible
    assert conflicting_rows(A, lower, upper, np.zeros(3), np.array([9.0, 9.0, 1.0])).tolist() == [3]
    # a certificate larger than the deletion filter takes: the total and every positive lower bound
    n = MAX_FILTERED + 50
    lb = np.arange(n) % 3
    A = np.vstack([np.ones((1, n)), np.eye(n)])
    rows = conflicting_rows(A, np.r_[lb.sum() - 1, lb], np.r_[lb.sum() - 1, np.full(n, np.inf)], np.zeros(n),
                            np.full(n, np.inf))
    assert rows.tolist() == [0] + (1 + np.flatnonzero(lb > 0)).tolist()


def test_feasible_start_names_the_terms_that_conflict():
    """Three leaves under a root: the root's total 10 against the leaves' totals 3, 4 and 2,
    beside measurements and bounds that are not in the conflict; then a total that only the
    boxes make impossible."""
    from dpinfer.inference.planning.nested import feasible_start
    from dpinfer.mechanisms.nested import NestedMeasurements

    def release(with_leaves):
        r = NestedMeasurements([-1, 0, 0, 0], [1, 2, 3], 2, area_names=["root", "a", "b", "c"])
        r.measure("m", [1, 2, 3], [[0], [1]], np.array([[3, 1], [4, 1], [2, 2]]), 4.0)
        r.at_most("ub", [1, 2, 3], [[0], [1]], np.full((3, 2), 100))
        r.equal("tot", [0], [[0, 1]], [[10]])
        if with_leaves:
            r.equal("leaf", [1, 2, 3], [[0, 1]], [[3], [4], [2]])
        return r.sums

    with pytest.raises(ValueError) as err:
        feasible_start(release(True), np.ones((3, 2)), np.zeros((3, 2), np.int64), np.full((3, 2), 50), "nmf")
    text = str(err.value)
    assert ("these 4 terms cannot all hold for any counts >= 0: the release's equalities and bounds contradict "
            "each other: tot [root, query cell 0] = 10; leaf [a, query cell 0] = 3; leaf [b, query cell 0] = 4; "
            "leaf [c, query cell 0] = 2") in text
    assert "ub [" not in text
    with pytest.raises(ValueError, match=r"this term cannot hold within the boxes \(with counts outside them it is "
                                         r"possible\).*: tot \[root, query cell 0\] = 10$"):
        feasible_start(release(False), np.ones((3, 2)), np.zeros((3, 2), np.int64), np.ones((3, 2), np.int64), "nmf")


def test_dpinfer_nmf_says_in_one_line_why_a_fit_could_not_go_on(monkeypatch, capsys):
    """A fit that stops with a RuntimeError (here: no time left for a single draw) ends the
    command with one line naming the cause and the files, not a traceback."""
    from dpinfer.io.nmf import fit as nmf_fit

    def no_time(*args, **kwargs):
        raise RuntimeError("dpinfer.sample: max_minutes ended with 0 draws stored per chain (tuning: 20 "
                           "iterations): give more time, or fewer tuning iterations")

    monkeypatch.setattr(nmf_fit, "fit_nmf", no_time)
    with pytest.raises(SystemExit) as stopped:
        main(["nmf", "some/root", "--state", "19"])
    message = str(stopped.value.code)
    assert message.startswith("dpinfer nmf: dpinfer.sample: max_minutes ended with 0 draws") and "\n" not in message
    assert message.endswith("(files: some/root)")
