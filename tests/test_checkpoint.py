"""Checkpoints of dp.sample (dpinfer.inference.checkpoint): a fit interrupted by Ctrl-C or a
killed process resumes from its checkpoint, and with the same seed the resumed fit's draws are
the uninterrupted fit's, bit for bit; a checkpoint of another fit is refused; checkpoints hold
data only and are readable by their owner only."""

import json
import signal
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pymc as pm
import pytest

import dpinfer as dp
from dpinfer.inference import checkpoint as checkpoints
from dpinfer.inference.checkpoint import CheckpointMismatchError, Interrupted
from dpinfer.io.report import recoveries_html

# short fits: their convergence is not what is tested
pytestmark = pytest.mark.filterwarnings("ignore::dpinfer.inference.convergence.ConvergenceWarning")
SETTINGS = dict(draws=150, tune=150, chains=2, random_seed=11, progressbar=False)
MODEL_SOURCE = """
import numpy as np
import pymc as pm
import dpinfer as dp

def model(shift=0):
    rng = np.random.default_rng(0)
    with pm.Model() as m:
        log_rate = pm.Normal("log_rate", 2.0, 1.0)
        x = pm.Poisson("x", pm.math.exp(log_rate), shape=40)
        dp.Laplace(epsilon=0.5).observe("release", x, observed=rng.poisson(8, 40) + rng.integers(-3, 4, 40) + shift)
    return m
"""
namespace: dict = {}
exec(MODEL_SOURCE, namespace)
model = namespace["model"]


@pytest.fixture(scope="module")
def uninterrupted():
    return dp.sample(model=model(), **SETTINGS)


def _same_draws(a, b):
    for name in ("log_rate", "x"):
        np.testing.assert_array_equal(a.posterior[name].values, b.posterior[name].values)
    for name in ("lp", "step_size", "n_steps"):
        np.testing.assert_array_equal(a.sample_stats[name].values, b.sample_stats[name].values)


def test_a_checkpointed_fit_draws_as_a_plain_one_and_keeps_data_only_for_its_owner(tmp_path, uninterrupted):
    path = tmp_path / "fit"
    _same_draws(uninterrupted, dp.sample(model=model(), checkpoint=path, checkpoint_every=40, **SETTINGS))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.iterdir()) == ["chain-0.nc", "chain-1.nc", "checkpoint.json"]
    for f in path.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    ident = json.loads((path / "checkpoint.json").read_text())
    assert ident["settings"]["draws"] == 150 and ident["entropy"] == "11"
    for f in path.glob("*.nc"):
        assert f.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"  # netCDF-4 (HDF5): arrays, no pickle
    state = checkpoints.Checkpoint(path, ident, 40).load(1)
    assert state.done == 300 and state.stream.dtype == np.uint64
    np.testing.assert_array_equal(state.draws_q[:, 0], uninterrupted.posterior["log_rate"].values[1])


@pytest.mark.parametrize("cores", [1, 2])
def test_ctrl_c_saves_the_chains_and_the_resumed_fit_gives_the_uninterrupted_draws(tmp_path, ctrl_c_after_saves,
                                                                                    uninterrupted, cores):
    """Ctrl-C (SIGINT to the process) after the second save: the chains stop after their
    running call, are saved, and Interrupted says how to resume; resuming (without the seed:
    it is in the checkpoint) gives the uninterrupted fit's draws."""
    path = tmp_path / "fit"
    disarm = ctrl_c_after_saves(2)
    with pytest.raises(Interrupted, match=f"resume='{path}'"):
        dp.sample(model=model(), checkpoint=path, checkpoint_every=20, cores=cores, **SETTINGS)
    disarm()
    ident = checkpoints.read_identity(path)
    done = [checkpoints.Checkpoint(path, ident, 20).load(c).done for c in range(2)]
    assert min(done) < 300, done  # stopped before the end
    with pytest.warns(dp.RecoveryWarning, match="resumed the fit from the checkpoint"):
        resumed = dp.sample(model=model(), resume=path, **(SETTINGS | {"random_seed": None}))
    _same_draws(uninterrupted, resumed)
    assert json.loads(resumed.sample_stats.attrs["resumed_at_iterations"]) == done
    [entry] = dp.recoveries_of(resumed)
    assert entry["kind"] == "resumed" and entry["iterations"] == done and entry["checkpoint"] == str(path)
    assert dp.recoveries_of(uninterrupted) == [] and recoveries_html(uninterrupted) == ""


def test_a_killed_process_resumes_from_its_last_checkpoint(tmp_path, uninterrupted):
    """A fit in another process, killed (SIGKILL) once its first chain has saved a checkpoint,
    resumes here to the uninterrupted fit's draws."""
    path = tmp_path / "fit"
    script = tmp_path / "fit.py"
    script.write_text(MODEL_SOURCE + textwrap.dedent(f"""
        import time
        from dpinfer.inference import checkpoint as checkpoints
        save = checkpoints.Checkpoint.save
        def slow_save(self, chain, state):  # a slow disk: the process is killed mid-fit
            save(self, chain, state)
            time.sleep(0.5)
        checkpoints.Checkpoint.save = slow_save
        dp.sample(model=model(), checkpoint={str(path)!r}, checkpoint_every=20, **{SETTINGS!r})
        """))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (path / "chain-0.nc").exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert child.poll() is None, "the fit ended before it could be killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    ident = checkpoints.read_identity(path)
    assert checkpoints.Checkpoint(path, ident, 20).load(0).done < 300
    _same_draws(uninterrupted, dp.sample(model=model(), resume=path, **SETTINGS))


def test_a_checkpoint_of_another_fit_is_refused(tmp_path):
    path = tmp_path / "fit"
    dp.sample(model=model(), checkpoint=path, **SETTINGS)
    with pytest.raises(CheckpointMismatchError, match="another model or other data"):
        dp.sample(model=model(shift=1), resume=path, **SETTINGS)
    with pytest.raises(CheckpointMismatchError, match="draws=150 there, 100 now"):
        dp.sample(model=model(), resume=path, **(SETTINGS | {"draws": 100}))
    with pytest.raises(CheckpointMismatchError, match="nuts_per_sweep=3 there, 2 now"):
        dp.sample(model=model(), resume=path, nuts_per_sweep=2, **SETTINGS)
    with pytest.raises(CheckpointMismatchError, match="random_seed"):
        dp.sample(model=model(), resume=path, **(SETTINGS | {"random_seed": 12}))
    ident = json.loads((path / "checkpoint.json").read_text())
    ident["versions"]["dpinfer"] = "0.0.1"
    (path / "checkpoint.json").write_text(json.dumps(ident))
    with pytest.raises(CheckpointMismatchError, match="another dpinfer version"):
        dp.sample(model=model(), resume=path, **SETTINGS)


def test_bad_checkpoint_arguments_are_refused_by_name(tmp_path):
    path = tmp_path / "fit"
    dp.sample(model=model(), checkpoint=path, **SETTINGS)
    with pytest.raises(FileExistsError, match="already holds a checkpoint; resume it"):
        dp.sample(model=model(), checkpoint=path, **SETTINGS)
    with pytest.raises(FileNotFoundError, match="holds no dpinfer checkpoint"):
        dp.sample(model=model(), resume=tmp_path / "nothing", **SETTINGS)
    with pytest.raises(ValueError, match="checkpoint_every must be a whole number >= 1"):
        dp.sample(model=model(), checkpoint=tmp_path / "other", checkpoint_every=0, **SETTINGS)
    with pytest.raises(ValueError, match="need the compiled engine; this model is fitted by the pymc engine"):
        dp.sample(model=model(), checkpoint=tmp_path / "marginal", method="marginal", **SETTINGS)
    with pytest.raises(ValueError, match="give checkpoint= or resume=, not both"):
        dp.sample(model=model(), checkpoint=tmp_path / "a", resume=path, **SETTINGS)


def test_the_progress_line_gives_the_rate_and_the_time_left():
    """One line for all chains: iterations done of all, elapsed, iterations per second in this
    process (a resumed fit's earlier iterations excluded) and the time left at that rate."""
    from dpinfer.inference.engines.compiled.chains import Progress

    progress = Progress(4000, "dpinfer: sampling", enabled=False, done=1000)  # resumed at 1000
    progress.advance(500)
    assert progress.line(20.0) == ("dpinfer: sampling: 1500/4000 iterations, 20.0 s, 25 it/s, "
                                   "about 1 min 40 s left")
    progress.advance(2500)
    assert progress.line(4000.0) == "dpinfer: sampling: 4000/4000 iterations, 1 h 06 min"


def _far_release():
    """A release far from the prior (test_inference's widening case): the first fit's windows
    miss tol and are widened."""
    with pm.Model() as m:
        lam = pm.Gamma("lam", 50.0, 5.0)
        x = pm.Poisson("x", lam, shape=2)
        dp.DoubleGeometric(epsilon=0.5).observe("release", x, observed=[10, 100])
    return m


def test_a_fit_that_widened_its_windows_resumes_with_the_same_widenings(tmp_path, ctrl_c_after_saves):
    """A release far from the prior (test_inference's widening case): the first fit holds a
    cell, its windows are widened and the model refitted. Ctrl-C during the refit; the resume
    replays the recorded widening without refitting (the same windows, the same draws from the
    seed) and ends with the uninterrupted fit's draws and report."""

    settings = dict(draws=150, tune=150, chains=2, random_seed=1, progressbar=False)
    with pytest.warns(dp.RecoveryWarning, match=r"the windows of \['x'\] missed tol"):  # progressbar=False
        whole = dp.sample(model=_far_release(), **settings)
    report = json.loads(whole.posterior.attrs["dpinfer"])["x"]
    assert report["widenings"] >= 1
    widened = dp.recoveries_of(whole)
    assert [(r["kind"], r["replayed"], list(r["bounds"])) for r in widened] == \
        [("windows widened", False, ["x"])] * report["widenings"]
    disarm = ctrl_c_after_saves(2, when=lambda checkpoint: checkpoint.identity["widenings"])  # in the refit
    path = tmp_path / "fit"
    with pytest.raises(Interrupted):
        dp.sample(model=_far_release(), checkpoint=path, checkpoint_every=20, cores=1, **settings)
    disarm()
    done = len(checkpoints.read_identity(path)["widenings"])  # when it was stopped
    assert done >= 1
    resumed = dp.sample(model=_far_release(), resume=path, **settings)
    for name in ("lam", "x"):
        np.testing.assert_array_equal(resumed.posterior[name].values, whole.posterior[name].values)
    assert json.loads(resumed.posterior.attrs["dpinfer"])["x"] == report
    # in order: the widenings replayed, the resume, any made after it
    kinds = [(r["kind"], r.get("replayed")) for r in dp.recoveries_of(resumed)]
    assert kinds == [("windows widened", True)] * done + [("resumed", None)] + \
        [("windows widened", False)] * (len(widened) - done)
    assert [dict(r, replayed=False) for r in dp.recoveries_of(resumed) if r["kind"] != "resumed"] == widened
    page = recoveries_html(resumed)  # the reports' section (dpinfer fit, dpinfer nmf)
    assert f"Recoveries ({len(kinds)})" in page and page.count("<li>") == len(kinds)
    assert "resumed the fit from the checkpoint" in page


def _whole_and_resumed(build, empirical_bayes: dict, tmp_path, ctrl_c_after_saves):
    """An empirical-Bayes fit of ``build()`` uninterrupted, and the same fit interrupted after two
    checkpoint saves (every 40 iterations) and resumed."""
    settings = SETTINGS | {"inference": "empirical-bayes", "tune": 20, "empirical_bayes": empirical_bayes}
    whole = dp.sample(model=build(), **settings)
    path = tmp_path / "fit"
    disarm = ctrl_c_after_saves(2)
    with pytest.raises(Interrupted):
        dp.sample(model=build(), checkpoint=path, checkpoint_every=40, **settings)
    disarm()
    return whole, dp.sample(model=build(), resume=path, **(settings | {"random_seed": None}))


def test_an_empirical_bayes_fit_resumes_with_the_uninterrupted_draws(tmp_path, ctrl_c_after_saves):
    """Empirical Bayes with the parameters drawn from their normal approximation (they change
    every few draws, from the chains' own streams): interrupted after a save and resumed, the
    estimate is made again (the same: a seeded, deterministic computation) and the draws are
    the uninterrupted fit's."""
    whole, resumed = _whole_and_resumed(model, {"uncertainty": "normal", "every": 10, "burn": 2}, tmp_path,
                                        ctrl_c_after_saves)
    for name in ("log_rate", "x"):
        np.testing.assert_array_equal(whole.posterior[name].values, resumed.posterior[name].values)
    assert np.ptp(whole.posterior["log_rate"].values) > 0  # drawn afresh, not held
    assert json.loads(resumed.posterior.attrs["dpinfer_empirical_bayes"])["uncertainty"] == "normal"


def test_an_empirical_bayes_fit_with_parameters_drawn_resumes_with_the_uninterrupted_draws(tmp_path,
                                                                                           ctrl_c_after_saves):
    """The same with area effects drawn with the counts (NUTS on them, their metric carried from
    the estimate's E-steps) and the other parameters redrawn from their normal approximation:
    interrupted and resumed, the draws are the uninterrupted fit's."""
    def grouped():
        rng = np.random.default_rng(1)
        with pm.Model() as m:
            log_rate = pm.Normal("log_rate", 2.0, 1.0)
            sd = pm.HalfNormal("sd", 1.0)
            effect = pm.Normal("effect", 0.0, sd, shape=4)
            x = pm.Poisson("x", pm.math.exp(log_rate + effect[np.arange(24) % 4]), shape=24)
            dp.Laplace(epsilon=0.5).observe("release", x, observed=rng.poisson(8, 24) + rng.integers(-3, 4, 24))
        return m

    whole, resumed = _whole_and_resumed(grouped, {"uncertainty": "normal", "every": 10, "burn": 2, "drawn": "effect"},
                                        tmp_path, ctrl_c_after_saves)
    for name in ("log_rate", "sd", "effect", "x"):
        np.testing.assert_array_equal(whole.posterior[name].values, resumed.posterior[name].values)
    effect = whole.posterior["effect"].values
    assert np.all(np.abs(np.diff(effect, axis=1)).max(axis=1) > 0)  # drawn within each block of 10
    assert json.loads(resumed.posterior.attrs["dpinfer_empirical_bayes"])["drawn"] == ["effect"]


def test_a_refit_after_widening_that_runs_out_of_time_says_so(monkeypatch, tmp_path):
    """The windows missed tol when the chains stopped at max_minutes, were widened, and the
    refit had no time left: the error names the windows, the widening and the time, says the
    draws before it are not a result, and where the checkpoint carries on (not a bare "max_minutes
    ended" that blames the tuning)."""
    import functools

    from dpinfer.inference.engines.compiled import engine as compiled_engine
    from dpinfer.inference.engines.compiled.chains import TimeUpError

    run, calls = compiled_engine.run, []

    @functools.wraps(run)  # the engine's settings are read from run's signature
    def out_of_time_on_the_refit(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # what the chains raise when max_minutes ends before 4 draws
            raise TimeUpError("dpinfer.sample: max_minutes ended with 1 draws stored per chain (tuning: 150 "
                              "iterations): give more time, or fewer tuning iterations")
        return run(*args, **kwargs)

    monkeypatch.setattr(compiled_engine, "run", out_of_time_on_the_refit)
    path = tmp_path / "fit"
    with pytest.warns(dp.RecoveryWarning), pytest.raises(RuntimeError) as stopped:
        dp.sample(model=_far_release(), draws=150, tune=150, chains=2, random_seed=1, progressbar=False,
                  checkpoint=path, checkpoint_every=50)
    message = str(stopped.value)
    assert message.startswith("dpinfer.sample: the windows of ['x'] missed tol (bounds reached: ")
    assert "widened them" not in message and "were widened and the fit run again, and then max_minutes ended " \
        "with 1 draws stored per chain" in message
    assert "not a result" in message and f"resuming from the checkpoint {str(path)!r}" in message
    assert len(calls) == 2
