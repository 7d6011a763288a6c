"""``dpinfer compile`` (dpinfer/warm_up.py): its fits run once per source, are recorded only
when all of them succeeded, and run again when the source changes or with --force. (The real
fits run in every fresh clone's set-up, tools/ensure-venv, before this suite.)"""

import pytest

from dpinfer import warm_up as warm
from dpinfer.cli import main


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """warm_up with its record in tmp_path and two workloads that note their calls."""
    calls = []
    monkeypatch.setattr(warm, "WARM", tmp_path / "pycache" / "dpinfer-kernels.warm")
    monkeypatch.setattr(warm, "WORKLOADS", (("first", lambda rng: calls.append("first")),
                                            ("second", lambda rng: calls.append("second"))))
    return calls


def test_the_fits_run_once_per_source(recorded, monkeypatch, capsys):
    assert not warm.is_warm()
    main(["compile"])
    out = capsys.readouterr().err
    assert recorded == ["first", "second"] and warm.is_warm()
    assert "dpinfer compile: [1/2] first (0 s)" in out and "[2/2] second" in out and "done in" in out
    main(["compile"])
    assert recorded == ["first", "second"]
    assert "compiled for this source already" in capsys.readouterr().err
    main(["compile", "--force"])
    assert recorded == ["first", "second"] * 2
    monkeypatch.setattr(warm, "source_hash", lambda: "an edited source")
    assert not warm.is_warm()
    warm.warm_up()
    assert recorded == ["first", "second"] * 3 and warm.is_warm()


def test_a_failed_fit_is_not_recorded_as_warm(recorded, monkeypatch):
    def broken(rng):
        raise RuntimeError("a kernel that does not compile")

    monkeypatch.setattr(warm, "WORKLOADS", (("broken", broken),))
    with pytest.raises(RuntimeError, match="does not compile"):
        warm.warm_up()
    assert not warm.is_warm() and not warm.WARM.exists()


def test_bad_options_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["compile", "--forced"])
    assert "unrecognized arguments: --forced" in capsys.readouterr().err


def test_a_cache_that_cannot_be_written_is_reported(recorded, monkeypatch, tmp_path, capsys):
    """Where the record cannot be written (a read-only install: here its directory is a file),
    the fits still run and the command says so instead of failing."""
    (tmp_path / "a file").write_text("")
    monkeypatch.setattr(warm, "WARM", tmp_path / "a file" / "dpinfer-kernels.warm")
    warm.warm_up()
    assert recorded == ["first", "second"] and not warm.is_warm()
    assert "could not record it" in capsys.readouterr().err
