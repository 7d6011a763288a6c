"""Any union of blocks summarised from stored draws (dpinfer.io.nmf.areas, dpinfer.io.nmf.store):
every number against a direct computation from the draws, every bad plan against its error."""

import json
from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd
import pytest

import dpinfer as dp
from dpinfer.io.nmf.areas import area_quantities, parse_event, read_plan, summarise_areas, write_summary
from dpinfer.io.nmf.layout import LEVELS
from dpinfer.io.nmf.reading import block_geocodes
from dpinfer.io.nmf.store import block_leaves, geography, open_posterior, tabulation_geoid, write_posterior
from dpinfer.io.nmf.table import census_table

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "synthetic_state_nmf"
CHAINS, DRAWS = 2, 40


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    """A stored fit of the shipped state's 22 block groups x 28 cells, its draws made up
    (Poisson(3): small counts, so that shares of 0 persons happen), with a verdict that says
    it has not converged; the blocks' GEOID20s and each block's leaf by plain prefixes."""
    table = census_table(dp.read_nmf(SHIPPED, 19, levels=LEVELS[:5]), "Block_Group", "pl94-28")
    counts = np.random.default_rng(3).poisson(3, size=(CHAINS, DRAWS, len(table.leaves), len(table.cells)))
    counts[:, ::3, 5] = 0  # leaf 5 empty in every third draw
    idata = az.from_dict({"posterior": {"counts": counts}}, dims={"counts": ["geocode", "cell"]},
                         coords=table.coords)
    idata["posterior"].attrs["dpinfer_convergence"] = json.dumps(
        {"converged": False, "max_rhat": 1.2, "min_ess_bulk": 30.0, "min_ess_tail": 20.0})
    nmf_blocks = block_geocodes(SHIPPED, 19)
    path = write_posterior(tmp_path_factory.mktemp("fit") / "posterior.zarr", idata,
                           geography_group=geography(table.leaves, "Block_Group", table.cells.names, nmf_blocks))
    leaves = list(table.leaves)
    leaf_of = np.array([next(i for i, g in enumerate(leaves) if b.startswith(g)) for b in nmf_blocks])
    geoids = np.array([b[-16:-5] + b[-4:] for b in nmf_blocks])  # drop the repeated block-group digit
    return {"path": path, "counts": counts, "table": table, "geoids": geoids, "leaf_of": leaf_of,
            "idata": idata}


def by_leaf(fit, labels):
    """A plan giving every block its leaf's label."""
    return pd.DataFrame({"GEOID20": fit["geoids"], "district": np.asarray(labels)[fit["leaf_of"]]})


def test_the_store_keeps_every_draw_as_integers_chunked_by_leaf(fit):
    with open_posterior(fit["path"]) as tree:
        stored = tree.posterior["counts"]
        assert stored.dtype == np.int32
        assert stored.encoding["chunks"][:2] == (CHAINS, DRAWS)
        np.testing.assert_array_equal(stored.values, fit["counts"])
        geo = tree["geography"].to_dataset()
        assert geo.attrs["leaf_level"] == "Block_Group"
        assert json.loads(geo.attrs["cell_axes"]) == ["votingage", "hispanic", "cenrace"]
        np.testing.assert_array_equal(geo["block"].values, fit["geoids"])
        np.testing.assert_array_equal(geo["block_leaf"].values, fit["leaf_of"])


def test_tabulation_geoids_and_block_leaves():
    """The shipped state's 146 blocks: 15-digit GEOID20s of state 19, unique, the block-group
    digit of each the first of its block's 4; a geocode not ending so, or a block under no
    leaf, is an error naming it."""
    blocks = block_geocodes(SHIPPED, 19)
    geoids = tabulation_geoid(blocks)
    assert len(set(geoids)) == len(blocks) == 146
    assert all(len(g) == 15 and g.isdigit() and g.startswith("19") for g in geoids)
    assert all(b[-5] == g[11] for b, g in zip(blocks, geoids))
    with pytest.raises(ValueError, match="0191000111119001000100x1000"):
        tabulation_geoid(["0191000111119001000100x1000"])
    with pytest.raises(ValueError, match="0191000111119001000100210000"):
        tabulation_geoid(["0191000111119001000100210000"])  # block-group digit 2, block 1000
    with pytest.raises(ValueError, match="under no leaf.*'99"):
        block_leaves(["0191"], ["0191000", "99"])


def test_area_draws_are_their_leaves_draws_summed(fit):
    """Five districts of random leaves: each district's pop, vap, Hispanic VAP and its share,
    in every draw, equal the leaves' counts summed directly; the table's mean, sd, median and
    interval are those draws' (a share undefined where the district has no adults)."""
    rng = np.random.default_rng(0)
    labels = np.array([f"district {k}" for k in rng.integers(0, 5, len(fit["table"].leaves))], dtype=object)
    labels[5] = "empty every third draw"
    summary = summarise_areas(fit["path"], by_leaf(fit, labels), interval=0.8)
    cells = list(fit["table"].cells)
    adult = np.array([c[0] == "18 and over" for c in cells])
    hisp = np.array([c[1] == "Hispanic or Latino" for c in cells])
    for area in np.unique(labels):
        x = fit["counts"][:, :, labels == area, :].sum(axis=2)  # (chains, draws, cells)
        want = {"pop": x.sum(-1), "vap": x[..., adult].sum(-1), "vap_hisp": x[..., adult & hisp].sum(-1)}
        with np.errstate(invalid="ignore", divide="ignore"):
            want["share_vap_hisp"] = np.where(want["vap"] > 0, want["vap_hisp"] / want["vap"], np.nan)
        for name, values in want.items():
            np.testing.assert_array_equal(summary.draws[name].sel(area=area).values, values)
            row = summary.table[(summary.table.area == area) & (summary.table.quantity == name)].iloc[0]
            pooled = values.ravel()[np.isfinite(values.ravel())]
            assert row["mean"] == pytest.approx(pooled.mean(), rel=1e-12)
            assert row["sd"] == pytest.approx(pooled.std(ddof=1), rel=1e-12)
            np.testing.assert_allclose([row["lower"], row["median"], row["upper"]],
                                       np.quantile(pooled, [0.1, 0.5, 0.9]), rtol=1e-12)
    empty = summary.draws["share_vap_hisp"].sel(area="empty every third draw").values
    assert np.isnan(empty[:, ::3]).all() and np.isfinite(empty[:, 1::3]).all()
    assert az.summary(summary.draws[["pop", "share_vap_hisp"]]).shape[0] == 2 * 6


def test_probabilities_are_the_shares_of_draws_where_the_event_holds(fit):
    """P(share_vap_hisp > 0.5) and P(vap_hisp >= vap_nh_white) per district: the share of
    draws (where defined) in which it holds, with MC se sqrt(p (1 - p) / ESS)."""
    labels = np.where(np.arange(len(fit["table"].leaves)) == 5, "lone", "rest")
    summary = summarise_areas(fit["path"], by_leaf(fit, labels),
                              probabilities=["share_vap_hisp > 0.5", "P(vap_hisp >= vap_nh_white)"])
    probs = summary.probabilities.set_index(["area", "event"])
    for area in ("lone", "rest"):
        share = summary.draws["share_vap_hisp"].sel(area=area).values
        defined = np.isfinite(share)
        got = probs.loc[(area, "share_vap_hisp > 0.5")]
        assert got["draws_defined"] == defined.sum()
        assert got["probability"] == pytest.approx(np.mean(share[defined] > 0.5), rel=1e-12)
        assert got["mc_se"] == pytest.approx(np.sqrt(got["probability"] * (1 - got["probability"]) / got["ess"]))
        a, b = (summary.draws[q].sel(area=area).values for q in ("vap_hisp", "vap_nh_white"))
        assert probs.loc[(area, "P(vap_hisp >= vap_nh_white)"), "probability"] == pytest.approx(np.mean(a >= b))
    assert probs.loc[("lone", "share_vap_hisp > 0.5"), "draws_defined"] == CHAINS * (DRAWS - len(range(0, DRAWS, 3)))


def test_a_plan_that_does_not_fit_the_leaves_is_an_error_naming_what(fit, tmp_path):
    n = len(fit["table"].leaves)
    plan = by_leaf(fit, [f"d{k % 3}" for k in range(n)])
    with pytest.raises(ValueError, match=f"does not list 1 block.*{fit['geoids'][7]}.*partial=True"):
        summarise_areas(fit["path"], plan.drop(index=7))
    part = summarise_areas(fit["path"], plan[fit["leaf_of"] != fit["leaf_of"][7]], partial=True)
    assert part.unassigned_blocks == np.sum(fit["leaf_of"] == fit["leaf_of"][7])
    assert "in no area" in part.lines()[-1]
    leaf = fit["leaf_of"][7]
    with pytest.raises(ValueError, match=f"splits 1 leaf of.*{fit['table'].leaves[leaf]} \\(d{leaf % 3} / elsewhere\\)"):
        moved = plan.copy()
        moved.loc[7, "district"] = "elsewhere"
        summarise_areas(fit["path"], moved)
    with pytest.raises(ValueError, match="splits 1 leaf.*no area"):
        summarise_areas(fit["path"], plan.drop(index=7), partial=True)
    with pytest.raises(ValueError, match="does not have.*190019999999999"):
        summarise_areas(fit["path"], pd.concat([plan, pd.DataFrame({"GEOID20": ["190019999999999"],
                                                                    "district": ["d0"]})]))
    national = pd.concat([plan, pd.DataFrame({"GEOID20": ["010010201001000", "010010201001001", "550010001001000"],
                                              "district": ["AL-1", "AL-1", "WI-3"]})])
    assert summarise_areas(fit["path"], national).set_aside == {"01": 2, "55": 1}
    path = tmp_path / "twice.csv"
    pd.concat([plan, plan.iloc[[4]]]).to_csv(path, index=False)
    with pytest.raises(ValueError, match=f"twice.csv: 1 block.*more than once.*{plan.GEOID20[4]} \\(data rows 5, "):
        read_plan(path)


def test_read_plan_keeps_codes_as_text_and_names_bad_columns(tmp_path):
    path = tmp_path / "plan.csv"
    path.write_text("District,geoid20\n7,010010201001000\n 7 ,010010201001001\n")
    plan = read_plan(path)
    assert list(plan.index) == ["010010201001000", "010010201001001"] and list(plan) == ["7", "7"]
    path.write_text("GEOID20,district,county\n010010201001000,1,001\n")
    with pytest.raises(ValueError, match="which column holds the areas.*'district', 'county'"):
        read_plan(path)
    assert list(read_plan(path, area_column="county")) == ["001"]
    path.write_text("GEOID20,district\n010010201001000,\n")
    with pytest.raises(ValueError, match="'district' is empty in 1 row.*\\[1\\]"):
        read_plan(path)
    with pytest.raises(FileNotFoundError, match="no-such.csv"):
        read_plan(tmp_path / "no-such.csv")
    with pytest.raises(TypeError, match="plan must be"):
        read_plan(42)
    assert read_plan({"a": "x", "b": "y"}).to_dict() == {"a": "x", "b": "y"}


def test_events_name_quantities_or_numbers(fit):
    names = [q[0] for q in area_quantities(fit["table"].coords["cell"], fit["table"].cells.names)]
    assert parse_event("P( share_vap_hisp>0.5 )", names) == ("share_vap_hisp", ">", 0.5)
    assert parse_event("1e3 <= vap", names) == (1000.0, "<=", "vap")
    with pytest.raises(ValueError, match="unknown quantity 'vap_latino'"):
        parse_event("vap_latino > 0.5", names)
    with pytest.raises(ValueError, match="compares two numbers"):
        parse_event("1 > 0.5", names)
    with pytest.raises(ValueError, match="expected 'A OP B'"):
        parse_event("vap == pop", names)
    with pytest.raises(ValueError, match="interval must be"):
        summarise_areas(fit["path"], {"x": "y"}, interval=90)


def test_quantities_of_the_pl94_cells():
    """28 cells: pop and vap, each Hispanic and 7 non-Hispanic race groups, 16 shares, then the
    14 minors' cells and the 7 Hispanic adults' cells (the non-Hispanic adults' cells are the
    vap_nh_<race> groups); masks as their names say."""
    table = census_table(dp.read_nmf(SHIPPED, 19, levels=LEVELS[:3]), "County", "pl94-28")
    wanted = {q[0]: q for q in area_quantities(table.coords["cell"], table.cells.names)}
    assert len(wanted) == 2 * 9 + 2 * 8 + 14 + 7
    cells = list(table.cells)
    np.testing.assert_array_equal(wanted["vap_nh_black"][1], [c == ("18 and over", "Not Hispanic or Latino",
                                                                    "black alone") for c in cells])
    np.testing.assert_array_equal(wanted["share_pop_hisp"][2], np.ones(28, bool))
    assert wanted["u18_hisp_two_or_more_races"][1].sum() == 1
    total = census_table(dp.read_nmf(SHIPPED, 19, levels=LEVELS[:3]), "County", "total")
    assert [q[0] for q in area_quantities(total.coords["cell"], total.cells.names)] == ["pop", "total"]


def test_a_fit_without_blocks_is_matched_by_its_leaves(fit):
    """dp.sample's own result (no geography): the plan's keys are the leaves' geocodes."""
    leaves = list(fit["table"].leaves)
    summary = summarise_areas(fit["idata"], {g: "north" if k < 10 else "south" for k, g in enumerate(leaves)})
    np.testing.assert_array_equal(summary.draws["pop"].sel(area="north").values,
                                  fit["counts"][:, :, :10].sum(axis=(2, 3)))
    with pytest.raises(ValueError, match="no block list: the plan's keys must be its leaves' geocodes"):
        summarise_areas(fit["idata"], by_leaf(fit, ["x"] * len(leaves)))


def test_dpinfer_areas_writes_the_csv_with_the_verdict_first(fit, tmp_path, capsys):
    from dpinfer.cli import main

    plan = tmp_path / "plan.csv"
    by_leaf(fit, ["A"] * 11 + ["B"] * 11).to_csv(plan, index=False)
    main(["areas", str(fit["path"]), str(plan), "--probability", "share_vap_hisp > 0.5"])
    printed = capsys.readouterr().out
    assert printed.startswith("dpinfer areas: NOT CONVERGED")
    written = tmp_path / "areas.csv"
    assert written.read_text().startswith("# NOT CONVERGED")
    table = pd.read_csv(written, comment="#")
    assert set(table.area) == {"A", "B"} and table.quantity.nunique() == 55
    probs = pd.read_csv(tmp_path / "areas-probabilities.csv", comment="#")
    assert list(probs.event.unique()) == ["share_vap_hisp > 0.5"]
    for argv, message in ((["areas", str(fit["path"]), str(tmp_path / "none.csv")], "none.csv: no such file"),
                          (["areas", str(tmp_path / "nothing.zarr"), str(plan)], "no stored fit at"),
                          (["areas", str(fit["path"]), str(plan), "--probability", "vap >> 3"], "expected 'A OP B'")):
        with pytest.raises(SystemExit, match=message) as stopped:
            main(argv)
        assert "\n" not in str(stopped.value)


def test_write_summary_without_events_writes_one_file(fit, tmp_path):
    summary = summarise_areas(fit["path"], by_leaf(fit, ["one"] * len(fit["table"].leaves)))
    table, probs = write_summary(summary, tmp_path / "x.csv")
    assert probs is None and not (tmp_path / "x-probabilities.csv").exists()
    assert len(pd.read_csv(table, comment="#")) == 55


def test_tabulation_areas_are_rebuilt_from_the_blocks(fit, tmp_path, capsys):
    """Tracts and block groups from the blocks' GEOID20s: the shipped state's spine block groups
    are its tabulation block groups, so these fit the leaves; single blocks split them."""
    from dpinfer.cli import main
    from dpinfer.io.nmf.areas import tabulation_plan

    plan = tabulation_plan(fit["path"], "tract")
    assert plan.to_dict() == {g: g[:11] for g in fit["geoids"]}
    summary = summarise_areas(fit["path"], plan)
    tract_of_leaf = pd.Series(fit["geoids"]).str[:11].groupby(fit["leaf_of"]).first()
    for tract in ("19001000300", "19005000100"):
        leaves = tract_of_leaf.index[tract_of_leaf == tract]
        np.testing.assert_array_equal(summary.draws["pop"].sel(area=tract).values,
                                      fit["counts"][:, :, leaves].sum(axis=(2, 3)))
    assert summarise_areas(fit["path"], tabulation_plan(fit["path"], "block-group")).draws.sizes["area"] == 22
    with pytest.raises(ValueError, match="splits 22 leaves"):
        summarise_areas(fit["path"], tabulation_plan(fit["path"], "block"))
    with pytest.raises(ValueError, match="level must be one of"):
        tabulation_plan(fit["path"], "Tract")
    with pytest.raises(ValueError, match="lists no blocks"):
        tabulation_plan(fit["idata"], "tract")
    main(["areas", str(fit["path"]), "--tabulation", "county", "--out", str(tmp_path / "c.csv")])
    assert set(pd.read_csv(tmp_path / "c.csv", comment="#", dtype={"area": str}).area) == {"19001", "19003", "19005"}
    with pytest.raises(SystemExit):
        main(["areas", str(fit["path"])])
    assert "give a PLAN.csv or --tabulation LEVEL" in capsys.readouterr().err


def test_gls_beside_each_area_is_the_baselines_own_estimate_of_its_sum(fit):
    """With the GLS fit of the release, each district's gls and gls_sd are the GLS estimate
    and sd of its sum over its leaves (by KKT solves): for districts that are the spine's
    counties, equal to the GLS's own county targets from its tree pass (the covariance of
    each area), for a sum and a share (delta method)."""
    from dpinfer.io.nmf.fit import _members
    from dpinfer.utility.baselines.nested.gls import nested_gls
    from dpinfer.utility.baselines.nested.targets import area_sum_targets, ratio_targets

    table = fit["table"]
    gls = nested_gls(table.release)
    rows, M = _members(table, "County")
    county = table.areas.geocode.to_numpy()[rows]
    leaf_county = np.asarray(M.argmax(axis=0)).ravel()
    summary = summarise_areas(fit["path"], by_leaf(fit, county[leaf_county]), gls=gls)
    cells = list(table.cells)
    adult = np.array([c[0] == "18 and over" for c in cells])
    hisp = np.array([c[1] == "Hispanic or Latino" for c in cells])
    want = {"pop": gls.targets(area_sum_targets(table.release, rows, np.ones(28, bool), "County")),
            "share_vap_hisp": gls.targets(ratio_targets(table.release, rows, adult & hisp, adult, "County"))}
    for quantity, expected in want.items():
        got = summary.table[summary.table.quantity == quantity].set_index("area").loc[county]
        np.testing.assert_allclose(got["gls"], expected["estimate"], rtol=1e-9)
        np.testing.assert_allclose(got["gls_sd"], expected["sd"], rtol=1e-6)
    assert np.all(summary.table["gls_sd"] > 0)


def test_the_figure_shows_each_area_with_its_interval_and_gls(fit, tmp_path):
    """plot_areas: one panel per quantity, a point and interval per area (the table's), GLS
    beside when given, NOT CONVERGED in the title of a fit that has not converged; write_summary
    saves it beside the CSV."""
    from dpinfer.io.nmf.areas import plot_areas
    from dpinfer.utility.baselines.nested.gls import nested_gls

    labels = [f"d{k % 4}" for k in range(len(fit["table"].leaves))]
    summary = summarise_areas(fit["path"], by_leaf(fit, labels), gls=nested_gls(fit["table"].release))
    figure = plot_areas(summary, ["share_vap_hisp", "vap"])
    left, right = figure.axes
    assert [t.get_text() for t in left.get_yticklabels()] == ["d0", "d1", "d2", "d3"]
    medians = summary.table[summary.table.quantity == "vap"].set_index("area").loc[["d0", "d1", "d2", "d3"], "median"]
    np.testing.assert_allclose(np.asarray(right.lines[0].get_xdata(), dtype=float), medians.to_numpy())
    assert len(right.containers) == 2 and figure._suptitle.get_text().startswith("NOT CONVERGED")
    with pytest.raises(ValueError, match="unknown quantities \\['share_latino'\\]"):
        plot_areas(summary, "share_latino")
    write_summary(summary, tmp_path / "areas.csv")
    assert (tmp_path / "areas.png").stat().st_size > 10_000


def test_block_codes_read_as_numbers_are_refused_with_the_reason(fit):
    """A plan read as numbers loses the leading zero of states 01-09: refused, naming the
    codes and the cause, not set aside as another state's blocks."""
    plan = by_leaf(fit, ["x"] * len(fit["table"].leaves))
    plan.loc[0, "GEOID20"] = "10010201001000"  # Alabama's 010010201001000 read as a number
    with pytest.raises(ValueError, match="1 block code.*'10010201001000'.*14 digits: a leading zero lost"):
        summarise_areas(fit["path"], plan)
    plan.loc[0, "GEOID20"] = "19-001"
    with pytest.raises(ValueError, match="not 15-digit GEOID20s: \\['19-001'\\]$"):
        summarise_areas(fit["path"], plan)
