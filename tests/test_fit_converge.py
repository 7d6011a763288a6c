"""`dpinfer fit` converges by default: the manifest's exposure column (declared, used,
validated), the per-cell centred/non-centred choice of the hierarchical templates, fits that
converge on small releases like the shipped ones, sampling again while the targets are missed,
and the report's verdict at the top.

The releases here are small (18-24 cells) versions of the gallery's: county populations (large
counts, double geometric noise conditioned on state totals) and small county counts with a
public population column (double geometric noise)."""

import io
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import dpinfer as dp
from dpinfer.cli import main
from dpinfer.inference.convergence import Convergence, ConvergenceWarning
from dpinfer.io import templates
from dpinfer.io.fit import MAX_GROWTH, TARGET_ACCEPTS, _fitting, fit, next_round, shortfall
from dpinfer.io.release import ReleaseFileError, read_release, release_schema, write_release

ROOT = Path(__file__).resolve().parents[1]


# --- releases -----------------------------------------------------------------------------------
def small_counts(directory: Path, n: int = 24, seed: int = 7, declare: bool = True) -> Path:
    """Small county counts (about 5 to 700) with a public population column, released with
    DoubleGeometric(0.25): the midwest_american_indian release in miniature."""
    rng = np.random.default_rng(seed)
    population = np.round(np.exp(rng.uniform(np.log(2000), np.log(300000), n))).astype(np.int64)
    truth = rng.poisson(population * np.exp(-6.0 + 0.3 * rng.standard_normal(n)))
    mechanism = dp.DoubleGeometric(0.25)
    zeros = np.ones(n)
    zeros[3] = 0.0
    return write_release(directory / "small.toml", mechanism, mechanism.release(truth, rng),
                         index=pd.Index([f"c{i:02d}" for i in range(n)], name="county"),
                         name="small_counts",
                         extra_columns={"population": population, "truth": truth, "zeros": zeros},
                         exposure_column="population" if declare else None)


def county_populations(directory: Path, seed: int = 11) -> Path:
    """18 county populations (thousands to about a million) in 3 states, double geometric noise
    (epsilon 0.192) conditioned on each state's total: midwest_state_totals in miniature."""
    rng = np.random.default_rng(seed)
    states = np.repeat(["IL", "IN", "OH"], 6)
    truth = np.round(np.exp(rng.normal(10.5, 1.1, states.size))).astype(np.int64)
    mechanism = dp.Conditioned(dp.DoubleGeometric(0.192), dp.Invariants.groups(states.tolist()))
    return write_release(directory / "pop.toml", mechanism, mechanism.release(truth, rng),
                         index=pd.Index([f"k{i:02d}" for i in range(states.size)], name="county"),
                         name="county_populations", extra_columns={"state": states, "truth": truth})


def _double_geometric_variance(epsilon: float) -> float:
    a = math.exp(-epsilon)
    return 2 * a / (1 - a) ** 2


# --- exposure in the manifest ---------------------------------------------------------------------
def test_the_exposure_column_is_declared_read_and_in_the_schema(tmp_path):
    manifest = small_counts(tmp_path)
    assert 'exposure_column = "population"' in manifest.read_text()
    release = read_release(manifest)
    assert release.exposure_column == "population"
    np.testing.assert_array_equal(release.exposure, pd.read_csv(tmp_path / "small.csv")["population"])
    assert release.exposure.dtype == np.float64
    field = release_schema()["$defs"]["release"]["properties"]["exposure_column"]
    assert field["type"] == "string" and "positive and finite" in field["description"]
    assert read_release(small_counts(tmp_path / "plain", declare=False)).exposure is None
    shipped = read_release(ROOT / "models" / "midwest_american_indian" / "release.toml")
    assert shipped.exposure_column == "population" and np.all(shipped.exposure > 0)
    with pytest.raises(ValueError, match=r"exposure_column: 'nope' must name one of extra_columns"):
        write_release(tmp_path / "w.toml", dp.DoubleGeometric(1.0), np.array([3, 4]), name="w",
                      extra_columns={"pop": [5, 6]}, exposure_column="nope")


@pytest.mark.parametrize("case, edit, message", [
    ("missing column", ("manifest", "nope"), r"release\.exposure_column: column 'nope' is not in small\.csv"),
    ("a value column", ("manifest", "release"), r"release\.exposure_column: column 'release' is a value column"),
    ("zero", ("value", 0), r"release\.exposure_column: column 'population' must be positive and finite \(an exposure\), but has 0\.0 at data row 5"),
    ("negative", ("value", -40), r"column 'population' must be positive and finite \(an exposure\), but has -40\.0"),
    ("infinite", ("value", "inf"), r"column 'population' must be positive and finite \(an exposure\), but has inf"),
    ("missing value", ("value", ""), r"column 'population' has a missing value at data row 5"),
    ("text", ("value", "many"), r"column 'population' has the non-numeric value 'many'"),
])
def test_a_bad_exposure_column_is_refused_naming_it(tmp_path, case, edit, message):
    manifest = small_counts(tmp_path)
    kind, value = edit
    if kind == "manifest":
        manifest.write_text(manifest.read_text().replace('exposure_column = "population"',
                                                         f'exposure_column = "{value}"'))
    else:
        table = pd.read_csv(tmp_path / "small.csv", dtype=str)
        table.loc[4, "population"] = str(value)
        table.to_csv(tmp_path / "small.csv", index=False)
    with pytest.raises(ReleaseFileError, match=message):
        read_release(manifest)


def test_fit_takes_the_declared_exposure_an_override_or_none(tmp_path):
    from dpinfer.io.fit import resolve_exposure

    release = read_release(small_counts(tmp_path))
    values, text = resolve_exposure(release)
    np.testing.assert_array_equal(values, release.exposure)
    assert "'population'" in text and "exposure_column" in text
    values, text = resolve_exposure(release, "truth")
    np.testing.assert_array_equal(values, release.table["truth"])
    assert "--exposure" in text
    for off in (None, "none"):
        values, text = resolve_exposure(release, off)
        assert values is None and "switched off by --exposure none" in text
    plain = read_release(small_counts(tmp_path / "plain", declare=False))
    assert resolve_exposure(plain) == (None, "none (the manifest declares no exposure_column)")
    with pytest.raises(ValueError, match=r"--exposure: column 'zeros' must be positive and finite \(an exposure\), but has 0\.0"):
        resolve_exposure(release, "zeros")
    model, _ = templates.build("auto", release, release.exposure)
    assert templates.template_report(model)["exposure"] is True


def test_the_cli_refuses_a_bad_exposure_before_sampling(tmp_path):
    manifest = small_counts(tmp_path)
    with pytest.raises(SystemExit, match="no column 'nope'"):
        main(["fit", str(manifest), "--exposure", "nope", "--quiet"])
    with pytest.raises(SystemExit, match=r"--exposure: column 'zeros' must be positive and finite"):
        main(["fit", str(manifest), "--exposure", "zeros", "--quiet"])
    with pytest.raises(SystemExit, match="--max-minutes must be a finite number >= 0"):
        main(["fit", str(manifest), "--max-minutes", "-1", "--quiet"])


# --- centred where informative --------------------------------------------------------------------
def test_the_information_of_a_noisy_count_about_its_log_rate():
    """I = lambda^2 / (lambda + v): lambda without noise, lambda^2 / v when the noise dominates."""
    lam = np.array([0.0, 3.0, 30.0, 3000.0])
    v = _double_geometric_variance(0.25)
    np.testing.assert_allclose(templates.cell_information(lam, v), [0.0, 9 / (3 + v), 900 / (30 + v),
                                                                     3000**2 / (3000 + v)])
    np.testing.assert_allclose(templates.cell_information(lam, 0.0), lam)


def test_the_spread_of_the_release_is_its_reml_estimate():
    rng = np.random.default_rng(0)
    w = rng.uniform(0.01, 0.5, 3000)
    y = 0.7 + rng.normal(0.0, np.sqrt(0.4**2 + w))
    spread = templates.release_spread(y, w)
    assert abs(spread.estimate - 0.4) < 0.04 and spread.low < 0.4 < spread.high
    assert spread.low < spread.estimate < spread.high
    flat = 0.7 + rng.normal(0.0, np.sqrt(w))  # no spread beyond the noise
    assert templates.release_spread(flat[:50], w[:50]).estimate < 0.05


def _evaluate(model, name: str, point: dict) -> np.ndarray:
    expression = model.replace_rvs_by_values([model[name]])[0]
    return model.compile_fn(expression, inputs=model.value_vars, on_unused_input="ignore")(point)


def test_informative_cells_are_centred_and_the_others_not(tmp_path):
    """A tiny release of large and small counts, sigma = 0.3 (a range of one point): cells whose
    count's information lambda times sigma^2 exceeds 1 are centred (their log rates free variables with the prior
    N(mu, sigma)), the rest non-centred (mu + sigma z), combined in cell order in log_rate; by
    the release's information lambda^2 / (lambda + v) the noise makes the count of 12 (v = 31.8)
    uninformative too."""
    released = np.array([4000, 6500, 3, 1, 5200, 2, 0, -3, 7000, 5, 40, 12])
    manifest = write_release(tmp_path / "tiny.toml", dp.DoubleGeometric(0.25), released, name="tiny")
    release = read_release(manifest)
    expected = np.maximum(released, 0) * 0.3**2 > 1
    assert expected.sum() == 6  # the four thousands, 40 and 12
    model, _ = templates.poisson_hierarchical(release, spread=(0.3, 0.3))
    report = templates.template_report(model)
    assert report["centred"] == 6 and report["parameterisation"]["non-centred"] == 6
    assert model["log_rate_centred"].type.shape == (6,) and model["z"].type.shape == (6,)
    point = {"mu": 1.5, "sigma_log__": np.log(0.5), "log_rate_centred": np.arange(6.0),
             "z": np.linspace(-1, 1, 6), "counts": np.zeros(12, dtype=np.int64)}
    log_rate = _evaluate(model, "log_rate", point)
    np.testing.assert_allclose(log_rate[expected], np.arange(6.0))
    np.testing.assert_allclose(log_rate[~expected], 1.5 + 0.5 * np.linspace(-1, 1, 6))
    lam = np.maximum(released, 0)
    by_release = lam**2 / (lam + _double_geometric_variance(0.25)) * 0.3**2 > 1
    model, _ = templates.poisson_hierarchical(release, spread=(0.3, 0.3), information="release")
    assert templates.template_report(model)["centred"] == by_release.sum() == 5
    # the default sigma: the release's own spread, which is wide here: the large counts centred
    default = templates.template_report(templates.poisson_hierarchical(release)[0])
    assert default["parameterisation"]["sigma_hat"] > 1 and default["centred"] >= 6
    # all large counts: one free log_rate; all small: z and a Deterministic log_rate
    big = read_release(write_release(tmp_path / "big.toml", dp.DoubleGeometric(0.25),
                                     np.array([4000, 6500, 5200, 9000, 20000]), name="big"))
    model, _ = templates.poisson_hierarchical(big)
    assert "z" not in model.named_vars and model["log_rate"] in model.free_RVs
    small = read_release(write_release(tmp_path / "small.toml", dp.DoubleGeometric(0.25),
                                       np.array([3, 1, 0, 2, 4]), name="small"))
    model, _ = templates.poisson_hierarchical(small)
    assert model["log_rate"] in model.deterministics and model["z"].type.shape == (5,)
    with pytest.raises(ValueError, match="information must be one of"):
        templates.poisson_hierarchical(small, information="noise")
    with pytest.raises(ValueError, match="spread must be a pair 0 < sigma_low <= sigma_high"):
        templates.poisson_hierarchical(small, spread=(0.5, 0.2))


def test_the_range_of_sigma_centres_cells_informative_across_it(tmp_path):
    """Centred where lambda sigma_low sigma_high > 1: over sigma in [0.1, 0.9] the conditional
    sd of a centred log rate, (lambda + sigma^-2)^(-1/2), varies less than that of a
    non-centred z, (1 + lambda sigma^2)^(-1/2), exactly for those cells."""
    released = np.array([5, 8, 11, 13, 20, 100])
    release = read_release(write_release(tmp_path / "r.toml", dp.DoubleGeometric(0.5), released,
                                         name="r"))
    model, _ = templates.poisson_hierarchical(release, spread=(0.1, 0.9, "a test range"))
    report = templates.template_report(model)
    low, high = 0.1, 0.9
    centred_ratio = np.sqrt((released + low**-2) / (released + high**-2))
    plain_ratio = np.sqrt((1 + released * high**2) / (1 + released * low**2))
    np.testing.assert_array_equal(report["centred_cells"], np.flatnonzero(centred_ratio < plain_ratio))
    assert report["centred_cells"] == [3, 4, 5]  # 13 x 0.09 > 1 > 11 x 0.09
    assert "sigma from 0.1 to 0.9: a test range" in report["parameterisation_text"]


def test_a_fit_that_falls_short_rechooses_for_the_range_it_visited(tmp_path):
    """After a fit whose sigma reached far below the release's range, the cells that are
    informative only at the release's spread become non-centred."""
    from dpinfer.io.fit import rechoose

    release = read_release(small_counts(tmp_path))
    model, latent = templates.build("auto", release, release.exposure)
    first = templates.template_report(model)
    assert first["centred"] > 0
    sigma = np.linspace(0.01, 0.05, 100).reshape(2, 50)
    idata = xr.DataTree.from_dict({"posterior": xr.Dataset({"sigma": (("chain", "draw"), sigma)})})
    log = io.StringIO()
    again, _, chosen = rechoose(model, latent, first, idata, "auto", release, release.exposure, log)
    assert again is not model and chosen["centred"] < first["centred"]
    assert chosen["range"] == pytest.approx(list(np.quantile(sigma, [0.01, 0.99])))
    assert "the fitted sigma ranges from 0.0104 to 0.0496" in log.getvalue()
    same, _, unchanged = rechoose(again, latent, chosen, idata, "auto", release, release.exposure, log)
    assert same is again and unchanged is chosen  # the same choice: the model is kept


def test_the_binomial_and_loglinear_templates_choose_per_cell(tmp_path):
    mechanism = dp.TruncatedLaplace(2.0, 0, 1000)
    released = np.array([500.0, 480.0, 1.0, 3.0, 520.0, 2.0])
    model, _ = templates.binomial_hierarchical(
        read_release(write_release(tmp_path / "b.toml", mechanism, released, name="b")), spread=(0.5, 0.5))
    p = released / 1000
    expected = 1000 * p * (1 - p) * 0.5**2 > 1
    assert templates.template_report(model)["centred"] == expected.sum() == 3
    assert "logit_p" in model.named_vars
    table = np.array([[900, 1200, 4], [1500, 2, 700], [3, 1100, 1300]])
    model, _ = templates.loglinear(read_release(write_release(
        tmp_path / "t.toml", dp.DoubleGeometric(0.5), table, name="t", index=["a", "b", "c"])),
        spread=(0.3, 0.3))
    assert templates.template_report(model)["centred"] == 6
    assert model["log_rate"].type.shape == (3, 3) and "tau" in model.named_vars
    point = {"a": 2.0, "r": np.array([0.1, 0.2, 0.3]), "c": np.array([-1.0, 0.0, 1.0]),
             "tau_log__": np.log(0.4), "log_rate_centred": np.arange(6.0),
             "z": np.array([1.0, -1.0, 2.0]), "counts": np.zeros((3, 3), dtype=np.int64)}
    log_rate = _evaluate(model, "log_rate", point)
    centred = table * 0.09 > 1
    np.testing.assert_allclose(log_rate[centred], np.arange(6.0))
    loc = 2.0 + point["r"][:, None] + point["c"][None, :]
    np.testing.assert_allclose(log_rate[~centred], loc[~centred] + 0.4 * np.array([1.0, -1.0, 2.0]))


# --- sampling again ------------------------------------------------------------------------------
def test_the_next_fit_grows_with_the_shortfall():
    def conv(rhat=1.0, ess=1000.0, divergences=0):
        return Convergence(rhat, "mu", ess, "sigma", 10, divergences)

    assert next_round(conv(ess=230), 1000, 1000, None) == (2200, 1100, None)  # 1.25 x 400 / 230
    assert next_round(conv(ess=28), 1000, 1000, None) == (1000 * MAX_GROWTH, 2000, None)
    assert next_round(conv(ess=390), 1000, 1000, None) == (2000, 1000, None)  # at least twice
    assert next_round(conv(rhat=1.05), 1000, 1000, None) == (2000, 1000, None)
    assert next_round(conv(divergences=3), 1000, 1000, None) == (1000, 1000, TARGET_ACCEPTS[0])
    assert next_round(conv(divergences=3), 1000, 1000, 0.9)[2] == 0.99
    assert next_round(conv(divergences=3), 1000, 1000, 0.99)[2] == 0.99  # as high as it goes
    assert shortfall(conv(rhat=1.02, ess=230, divergences=2)) == (
        "max R-hat 1.020 > 1.01 for mu; min bulk ESS 230 < 400 for sigma; 2 divergent transitions")
    assert _fitting(10000, 2000) == (6600, 3300) and _fitting(2500, 2000) == (500, 2000)
    # one chain: R-hat is not computed (NaN) and not judged, as dp.sample judges it
    one_chain = conv(rhat=float("nan"), ess=230)
    assert shortfall(one_chain) == "min bulk ESS 230 < 400 for sigma"
    assert next_round(one_chain, 1000, 1000, None) == (2200, 1100, None)
    assert next_round(conv(rhat=float("nan")), 1000, 1000, None) == (1000, 1000, None)


def test_a_short_fit_samples_again_until_it_converges(tmp_path):
    manifest = small_counts(tmp_path)
    log = io.StringIO()
    result = fit(manifest, out=tmp_path / "report", draws=100, tune=100, seed=3,
                 progressbar=False, max_minutes=5, log=log)
    lines = log.getvalue()
    assert re.search(r"min (bulk|tail) ESS \d+ < 400 for \S+: sampling again with 2 x \d+ draws", lines), lines
    assert len(result.rounds) >= 2 and result.converged
    assert all(b.draws > a.draws for a, b in zip(result.rounds, result.rounds[1:]))
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Fits made" in page and 'class="converged"' in page


def test_a_fit_that_misses_the_targets_says_so_and_what_to_do(tmp_path, capsys):
    manifest = small_counts(tmp_path)
    with pytest.warns(ConvergenceWarning, match="NOT CONVERGED"):
        main(["fit", str(manifest), "--out", str(tmp_path / "r"), "--draws", "30", "--tune", "30",
              "--seed", "1", "--max-minutes", "0", "--quiet"])
    captured = capsys.readouterr()
    line = captured.out.splitlines()[0]
    assert line.startswith("dpinfer fit: NOT CONVERGED, not a result yet: max R-hat")
    assert "--max-minutes" in line and "--model" in line
    assert "not sampling again" in captured.err
    page = (tmp_path / "r" / "index.html").read_text()
    top = page[page.index("<h1>"):page.index("True counts given the release")]
    assert 'id="verdict" class="not-converged"' in top and "NOT CONVERGED" in top
    assert "What to do" in top and "min bulk ESS" in top and "max R-hat" in top
    summary = pd.read_csv(tmp_path / "r" / "summary.csv", index_col=0)
    assert {"mu", "sigma"} <= set(summary.index)
    assert sum(i.startswith("counts[") for i in summary.index) == 24


# --- fits that converge with the defaults -----------------------------------------------------------
def _check_converged(report: Path, cells: int):
    summary = pd.read_csv(report / "summary.csv", index_col=0)
    assert summary["r_hat"].max() <= 1.01 and summary["ess_bulk"].min() >= 400
    assert sum(i.startswith("counts[") for i in summary.index) == cells
    page = (report / "index.html").read_text()
    top = page[page.index("<h1>"):page.index("True counts given the release")]
    assert 'id="verdict" class="converged"' in top and "<h2>Converged</h2>" in top


def test_small_counts_with_their_exposure_converge_by_default(tmp_path, capsys):
    manifest = small_counts(tmp_path)
    main(["fit", str(manifest), "--out", str(tmp_path / "r"), "--seed", "1", "--quiet"])
    captured = capsys.readouterr()
    assert captured.out.startswith("dpinfer fit: converged: max R-hat")
    assert "(1 fit, the last 2 x 1000 draws" in captured.out  # no extra sampling
    assert "exposure: column 'population'" in captured.err
    _check_converged(tmp_path / "r", 24)
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Exposure: column &#x27;population&#x27; of the values file (the manifest&#x27;s " \
           "exposure_column)" in page


def test_county_populations_on_state_totals_converge_by_default(tmp_path, capsys):
    manifest = county_populations(tmp_path)
    main(["fit", str(manifest), "--out", str(tmp_path / "r"), "--seed", "1", "--quiet"])
    captured = capsys.readouterr()
    assert captured.out.startswith("dpinfer fit: converged:")
    assert "18 of 18 cells centred" in captured.err
    _check_converged(tmp_path / "r", 18)
    posterior = xr.open_datatree(tmp_path / "r" / "posterior.nc")["posterior"]
    release = read_release(manifest)
    totals = release.invariants.matrix @ posterior["counts"].values.reshape(-1, 18).T
    assert np.all(totals == release.invariant_values[:, None])


@pytest.mark.validation
def test_a_table_with_fixed_margins_converges_by_default(tmp_path, capsys):
    """A 3 x 3 table of small counts, double geometric noise conditioned on its row and column
    totals (fibre moves, the PyMC engine): delinquent_children_4x4 in miniature. Validation
    tier (16 s; the fast tier's gallery fits cover a conditioned table: test_fit_cli.py)."""
    rng = np.random.default_rng(5)
    truth = rng.poisson(12.0, (3, 3))
    mechanism = dp.Conditioned(dp.DoubleGeometric(0.25), dp.Invariants.margins((3, 3), [(0,), (1,)]))
    manifest = write_release(tmp_path / "table.toml", mechanism, mechanism.release(truth, rng),
                             name="table", index=pd.Index(["a", "b", "c"], name="row"))
    main(["fit", str(manifest), "--out", str(tmp_path / "r"), "--seed", "1", "--quiet"])
    assert capsys.readouterr().out.startswith("dpinfer fit: converged:")
    _check_converged(tmp_path / "r", 9)
