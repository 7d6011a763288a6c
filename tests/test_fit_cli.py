"""`dpinfer fit` (issue 14, part 2): release file -> model -> dp.sample -> report, on the
gallery's releases and on a release of every mechanism family that dp.sample takes; the
report checked in a headless browser (the page renders and its images load)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpinfer as dp
from dpinfer.cli import main
from dpinfer.io.fit import baseline, fit_release
from dpinfer.io.release import read_release, write_release

ROOT = Path(__file__).resolve().parents[1]
GALLERY = sorted(ROOT.glob("models/*/release.toml"))
# max_minutes=0: these check the files and the plumbing with one short fit each; sampling
# again until the fit converges is tested in tests/test_fit_converge.py
FAST = {"draws": 100, "tune": 100, "chains": 2, "seed": 1, "progressbar": False, "max_minutes": 0}


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_image_count(index: Path) -> tuple[int, int]:
    """(loaded, total) images of the page after load, as Chromium renders it headless."""
    dom = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
         "--virtual-time-budget=5000", "--dump-dom", index.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r'data-images="(\d+)/(\d+)"', dom)
    assert found, "the page's load script did not run"
    return int(found.group(1)), int(found.group(2))


def check_report(index: Path, n_cells: int) -> None:
    out = index.parent
    for name in ("posterior.nc", "summary.csv", "counts.csv", "counts.png"):
        assert (out / name).stat().st_size > 0, name
    counts = pd.read_csv(out / "counts.csv")
    assert len(counts) == n_cells
    assert (counts["lower 90%"] <= counts["posterior median"]).all()
    assert (counts["posterior median"] <= counts["upper 90%"]).all()
    page = index.read_text()
    assert "What dpinfer did" in page and "max R-hat" in page


@pytest.mark.parametrize("manifest", GALLERY, ids=[p.parent.name for p in GALLERY])
def test_every_gallery_release_fits_from_its_file(manifest, tmp_path):
    release = read_release(manifest)
    model = "loglinear" if np.ndim(release.values) == 2 else "poisson-hierarchical"
    # 300 tuning steps: the county tables span 3 orders of magnitude, and a shorter adaptation
    # leaves chains where cells are held (dp.sample then refuses, rightly)
    index = fit_release(manifest, model=model, out=tmp_path / "report", **{**FAST, "tune": 300})
    check_report(index, np.size(release.values))
    attrs = json.loads(pd.read_csv(tmp_path / "report" / "counts.csv").to_json())
    assert attrs  # a table was written


def _mechanisms():
    """A release of every mechanism family, 4 true cells summing to 40 (fitted with
    ``--model auto``: TruncatedLaplace with binomial counts out of its upper bound,
    RandomizedResponse with a Dirichlet-multinomial table; MultiLevelGeometric releases two
    levels per cell)."""
    total = dp.Invariants.total(4)
    return {
        "DoubleGeometric": dp.DoubleGeometric(0.5),
        "DiscreteGaussian": dp.DiscreteGaussian(2.0),
        "Laplace": dp.Laplace(0.5),
        "Gaussian": dp.Gaussian.from_sigma(2.0),
        "ClampedGeometric": dp.ClampedGeometric(0.5, lower=0, upper=40),
        "Conditioned": dp.Conditioned(dp.DoubleGeometric(0.5), total),
        "GeneralizedLaplace": dp.GeneralizedLaplace(0.5, total, "l1"),
        "GeneralizedGaussian": dp.GeneralizedGaussian(2.0, total, epsilon=1.0),
        "BITLaplace": dp.BITLaplace(0.5, 0, 40),
        "TruncatedLaplace": dp.TruncatedLaplace(0.5, 0, 40),
        "Logistic": dp.Logistic(0.5),
        "Subbotin": dp.Subbotin(1.5, 0.5, 1e-6),
        "MultiLevelGeometric": dp.MultiLevelGeometric([0.5, 0.25]),
        "RandomizedResponse": dp.RandomizedResponse(0.75, attributes=2),
    }


def test_every_mechanism_family_is_in_the_round_trip():
    """Every mechanism the release file format writes is fitted below."""
    from dpinfer.io.release import FAMILIES

    assert set(_mechanisms()) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(_mechanisms()))
def test_release_file_fit_report_round_trip_for_every_mechanism(family, tmp_path):
    mechanism = _mechanisms()[family]
    truth = np.array([5, 12, 8, 15])
    rng = np.random.default_rng(3)
    values = mechanism.release(truth, rng)
    manifest = write_release(tmp_path / "release.toml", mechanism, values,
                             index=["a", "b", "c", "d"], name=f"synthetic-{family}",
                             extra_columns={"truth": truth})
    index = fit_release(manifest, out=tmp_path / "report", truth="truth", **FAST)
    check_report(index, 4)
    counts = pd.read_csv(tmp_path / "report" / "counts.csv")
    np.testing.assert_array_equal(counts["release"], values[:, 0] if values.ndim == 2 else values)
    np.testing.assert_array_equal(counts["truth"], truth)
    if family in ("Conditioned", "GeneralizedLaplace", "GeneralizedGaussian", "RandomizedResponse"):
        import xarray as xr

        posterior = xr.open_datatree(tmp_path / "report" / "posterior.nc")["posterior"]
        assert np.all(posterior["counts"].sum("counts_dim_0") == values.sum())


def test_baseline_keeps_the_invariants_and_is_non_negative():
    mechanism = dp.Conditioned(dp.DoubleGeometric(0.5), dp.Invariants.total(4))
    def fake(values, mechanism):  # what baseline reads of a release
        return type("R", (), {"values": values, "mechanism": mechanism,
                              "per_true_value": lambda self: (self.values, None)})()

    release = fake(np.array([-3, 10, 20, 13]), mechanism)
    base = baseline(release)
    assert base.sum() == 40 and np.all(base >= 0)
    plain = fake(np.array([-3.4, 10.6, 2.2]), dp.Laplace(1.0))
    np.testing.assert_array_equal(baseline(plain), [0, 11, 2])
    rr = dp.RandomizedResponse(0.75, attributes=2)  # the unbiased table, kept at n = 40 and >= 0
    base = baseline(fake(np.array([2, 9, 14, 15]), rr))
    assert base.sum() == 40 and np.all(base >= 0)
    np.testing.assert_allclose(base, rr.unbiased_table([2, 9, 14, 15]).clip(0) * 40
                               / rr.unbiased_table([2, 9, 14, 15]).clip(0).sum(), atol=1.0)


def test_templates_refuse_releases_they_do_not_fit(tmp_path):
    def release_file(name, mechanism, values, **kw):
        return write_release(tmp_path / name / "release.toml", mechanism, np.asarray(values),
                             name=name, **kw)

    counts = release_file("counts", dp.DoubleGeometric(1.0), [3, 5, 8, 2])
    table = release_file("table", dp.RandomizedResponse(0.75, attributes=2), [3, 5, 8, 2])
    query = release_file("query", dp.DoubleGeometric(1.0), [8, 10],
                         query={"kind": "totals", "groups": ["g", "g", "h", "h"], "columns": list("abcd")})
    for path, model, message in (
            (counts, "binomial-hierarchical", "needs the number of trials"),
            (counts, "dirichlet-multinomial", "is for randomised-response releases"),
            (table, "poisson-hierarchical", "use --model dirichlet-multinomial"),
            (table, "loglinear", "use --model dirichlet-multinomial"),
            (query, "auto", r"declares a \[query\]")):
        with pytest.raises(ValueError, match=message):
            fit_release(path, model=model, out=tmp_path / "out", **FAST)


def test_the_cli_writes_the_report_and_refuses_bad_input(tmp_path, capsys):
    manifest = GALLERY[0]
    main(["fit", str(manifest), "--out", str(tmp_path / "r"), "--draws", "100", "--tune", "100",
          "--seed", "2", "--max-minutes", "0", "--quiet"])
    assert "report:" in capsys.readouterr().out
    assert (tmp_path / "r" / "index.html").exists()
    with pytest.raises(SystemExit, match="--model must be one of"):
        main(["fit", str(manifest), "--model", "no-such-model", "--quiet"])
    with pytest.raises(SystemExit, match="no column 'nope'"):
        main(["fit", str(manifest), "--exposure", "nope", "--quiet"])
    with pytest.raises(SystemExit, match="no such file"):
        main(["fit", str(manifest), "--model", str(tmp_path / "missing.py"), "--quiet"])


def test_a_users_model_file(tmp_path):
    model_file = tmp_path / "my_model.py"
    model_file.write_text(
        "import pymc as pm\n"
        "def build_model(release):\n"
        "    with pm.Model() as model:\n"
        "        lam = pm.Gamma('lam', 2.0, 0.1)\n"
        "        x = pm.Poisson('x', lam, shape=len(release.values))\n"
        "        release.observe(x)\n"
        "    return model, 'x'\n")
    rng = np.random.default_rng(0)
    mechanism = dp.DoubleGeometric(1.0)
    manifest = write_release(tmp_path / "r.toml", mechanism, mechanism.release(np.full(5, 20), rng),
                             name="user-model")
    index = fit_release(manifest, model=str(model_file), out=tmp_path / "out", **FAST)
    check_report(index, 5)


@pytest.mark.skipif(chromium() is None, reason="no chromium (tools/ensure-chromium installs it)")
def test_the_report_renders_in_a_browser_with_its_images(tmp_path):
    index = fit_release(GALLERY[0], out=tmp_path / "report", **FAST)
    loaded, total = browser_image_count(index)
    assert total >= 2 and loaded == total
    (tmp_path / "report" / "counts.png").unlink()  # a missing figure is seen as missing
    loaded, total = browser_image_count(index)
    assert loaded == total - 1


def test_dpinfer_fit_says_in_one_line_why_a_fit_could_not_go_on(monkeypatch):
    """A fit that stops with a RuntimeError ends the command with one line naming the cause and
    the release, not a traceback."""
    from dpinfer.io import fit as io_fit

    def no_time(*args, **kwargs):
        raise RuntimeError("dpinfer.sample: max_minutes ended with 0 draws stored per chain\n(tuning: 20 iterations)")

    monkeypatch.setattr(io_fit, "fit", no_time)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "my-release.json"])
    assert str(stopped.value.code) == ("dpinfer fit: dpinfer.sample: max_minutes ended with 0 draws stored per chain "
                                      "(tuning: 20 iterations) (release: my-release.json)")
