"""dp.fit_many: serial, process pool and Dask runs give the draws of direct dp.sample fits;
files and summary rows stream as fits finish; a killed Dask worker costs only its own fit;
reruns resume.

Every fit is theta ~ Beta(10, 10), x ~ Binomial(1000, theta), s = x + DoubleGeometric(0.1)
with 1 chain of 200 + 200 draws (the compiled engine). Worker processes are few (a fresh
process spends ~10-20 s importing and compiling before its first fit).
"""

import concurrent.futures
import json
import multiprocessing
import os
import re
import signal
import threading
import time
from functools import partial

import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt
import pytest
import xarray as xr

import dpinfer as dp

distributed = pytest.importorskip("distributed")

SAMPLE = {"draws": 200, "tune": 200, "chains": 1}


def beta_binomial(release=612):
    with pm.Model() as model:
        theta = pm.Beta("theta", 10.0, 10.0)
        x = pm.Binomial("x", 1000, theta)
        dp.DoubleGeometric(epsilon=0.1).observe("release", x, observed=pm.Data("s", release))
    return model


def logged_beta_binomial(log, name, first_sleep=0.0):
    """beta_binomial() after appending "name pid" to ``log``; on a job's first attempt (no
    earlier line of ``name``) sleep ``first_sleep`` seconds first, so it is surely running."""
    with open(log) as f:
        first = all(line.split()[0] != name for line in f)
    with open(log, "a") as f:
        f.write(f"{name} {os.getpid()}\n")
    if first:
        time.sleep(first_sleep)
    return beta_binomial()


def slowly_saved_beta_binomial(log, name):
    """beta_binomial() after appending "name pid" to ``log``, in a process whose checkpoint
    saves of fits named ``name`` take 0.2 s more (a slow disk), so the fit is surely running
    when the test kills it."""
    from dpinfer.inference import checkpoint as checkpoints

    with open(log, "a") as f:
        f.write(f"{name} {os.getpid()}\n")
    save = getattr(checkpoints.Checkpoint.save, "undelayed", checkpoints.Checkpoint.save)

    def slow_save(self, chain, state):
        save(self, chain, state)
        if self.path.name == name:
            time.sleep(0.2)

    slow_save.undelayed = save
    checkpoints.Checkpoint.save = slow_save
    return beta_binomial()


def beta_binomial_after_constants(*arrays):
    """beta_binomial() once PyTensor has taken every array as a constant (it refuses
    misaligned arrays)."""
    for a in arrays:
        pt.as_tensor(a)
    return beta_binomial()


def not_a_model():
    return "model"


@pytest.fixture(scope="module")
def direct():
    """direct(release, seed): posterior of dp.sample on one model, refitted after pm.set_data."""
    model = beta_binomial()

    def fit(release, seed):
        pm.set_data({"s": release}, model=model)
        idata = dp.sample(**SAMPLE, cores=1, random_seed=seed, progressbar=False, model=model)
        return idata.posterior.to_dataset()

    return fit


def posterior_of(path):
    with xr.open_datatree(path, engine="h5netcdf") as idata:
        return idata.posterior.to_dataset().load()


def assert_same_draws(path, expected):
    got = posterior_of(path)
    for name in ("theta", "x"):
        np.testing.assert_array_equal(got[name].values, expected[name].values)


RELEASES = (612, 580)


def jobs_for(releases):
    """One job per release, seed = its index, all on one shared model (model_key) whose
    release pm.set_data sets."""
    return [dp.FitJob(f"rep{i}", beta_binomial, dict(SAMPLE, random_seed=i), data={"s": s},
                      model_key="beta_binomial") for i, s in enumerate(releases)]


def test_serial_and_process_pool_give_the_draws_of_direct_fits(tmp_path, direct):
    jobs = jobs_for(RELEASES)
    serial = dp.fit_many(jobs, tmp_path / "serial", progressbar=False)
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pooled = dp.fit_many(jobs, tmp_path / "pool", executor=pool, progressbar=False)
    for table, where in ((serial, "serial"), (pooled, "pool")):
        assert list(table["name"]) == ["rep0", "rep1"]
        streamed = pd.read_csv(tmp_path / where / "summary.csv")  # in the order fits finished
        pd.testing.assert_frame_equal(table, streamed.set_index("name").loc[table["name"]].reset_index())
        for i, release in enumerate(RELEASES):
            assert table["path"][i] == str(tmp_path / where / f"rep{i}.nc")
            assert_same_draws(table["path"][i], direct(release, i))
        assert (table["engine"] == "compiled").all()
        assert (table["seconds"] > 0).all() and (table["min_ess_bulk"] > 10).all()
        assert table["max_rhat"].isna().all()  # one chain: no R-hat
        assert (table["divergences"] >= 0).all()
    assert (serial["pid"] == os.getpid()).all() and (pooled["pid"] != os.getpid()).all()


def test_dask_cluster_streams_files_and_reuses_one_model_per_worker(tmp_path, client, direct,
                                                                    capsys):
    releases = (612, 580, 640, 600)
    table = dp.fit_many(jobs_for(releases), tmp_path, executor=client)
    out = capsys.readouterr().out
    assert "fit_many: 4 jobs, 0 already in" in out
    assert "fit_many: 4/4 " in out and "s elapsed, 2 workers)" in out
    assert re.search(r"fit_many: 1/4 rep\d in [\d.]+ s \(\d+ s elapsed, about \d+ s left, 2 workers\)", out), out
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rep{i}.nc" for i in range(4)] + ["summary.csv"]
    assert len(pd.read_csv(tmp_path / "summary.csv")) == 4
    for i, release in enumerate(releases):  # each job's own release reached the shared model
        assert_same_draws(tmp_path / f"rep{i}.nc", direct(release, i))
    # each worker process built the model once, for its first job, and reused it after
    assert table["pid"].nunique() == 2
    assert (~table["model_reused"]).sum() == table["pid"].nunique()
    assert set(table["pid"]) == set(client.run(os.getpid).values())


def test_numpy_arrays_inside_a_job_reach_dask_workers_usable(tmp_path, client, direct):
    """Dask sends the buffers of arrays pickled inside an object out of band and can hand them
    over misaligned, which PyTensor refuses; fit_many sends each job pickled whole."""
    arrays = [np.arange(n, dtype=float) for n in (102, 92, 83, 88)] + [np.arange(7), np.arange(3)]
    job = dp.FitJob("arrays", partial(beta_binomial_after_constants, *arrays),
                    dict(SAMPLE, random_seed=5), data={"s": np.array(600)})
    dp.fit_many([job], tmp_path, executor=client, progressbar=False)
    assert_same_draws(tmp_path / "arrays.nc", direct(600, 5))


def test_a_killed_worker_costs_only_its_own_fit(tmp_path, client, direct):
    """Kill (SIGKILL) the worker running "slow" once another job has finished: every job still
    completes, no finished fit is redone, and the lost fit, run again, is the direct fit."""
    log = tmp_path / "builds.log"
    log.touch()
    out = tmp_path / "fits"
    jobs = [dp.FitJob(name, partial(logged_beta_binomial, str(log), name, sleep),
                      dict(SAMPLE, random_seed=seed))
            for name, seed, sleep in (("fast0", 10, 0.0), ("fast1", 11, 0.0), ("slow", 12, 120.0))]
    result = {}
    runner = threading.Thread(target=lambda: result.update(
        table=dp.fit_many(jobs, out, executor=client, progressbar=False)))
    runner.start()

    def started():
        return dict(line.split() for line in log.read_text().splitlines())

    deadline = time.monotonic() + 120
    summary = out / "summary.csv"
    while not (summary.exists() and summary.stat().st_size > 0 and "slow" in started()):
        assert time.monotonic() < deadline, "no job finished while 'slow' was running"
        time.sleep(0.05)
    finished = set(pd.read_csv(summary)["name"])  # streamed before fit_many returned
    assert runner.is_alive() and "slow" not in finished
    mtimes = {name: os.stat(out / f"{name}.nc").st_mtime_ns for name in finished}
    victim = int(started()["slow"])
    assert victim in client.run(os.getpid).values()
    os.kill(victim, signal.SIGKILL)
    runner.join(timeout=180)
    assert not runner.is_alive()

    table = result["table"]
    assert list(table["name"]) == ["fast0", "fast1", "slow"]
    assert sorted(pd.read_csv(summary)["name"]) == ["fast0", "fast1", "slow"]  # one row each
    builds = [line.split() for line in log.read_text().splitlines()]
    for name in finished:  # built once, file untouched since the kill
        assert [b for b, _ in builds].count(name) == 1
        assert os.stat(out / f"{name}.nc").st_mtime_ns == mtimes[name]
    slow_pids = [int(pid) for b, pid in builds if b == "slow"]
    assert len(slow_pids) == 2 and slow_pids[0] == victim != slow_pids[1]
    assert table.set_index("name")["pid"]["slow"] == slow_pids[1]
    for job in jobs:  # every file is complete and loads; no partial file is left
        assert posterior_of(out / f"{job.name}.nc").sizes["draw"] == SAMPLE["draws"]
    assert not list(out.glob(".*"))
    assert_same_draws(out / "slow.nc", direct(612, 12))


def test_a_killed_workers_fit_continues_from_its_checkpoint(tmp_path, client):
    """With checkpoint_every, kill (SIGKILL) the worker once the fit has saved a checkpoint:
    Dask runs the fit again on a worker that resumes it (the file's sample_stats say at which
    iteration), its draws are those of a direct fit, and the checkpoint is removed."""
    log = tmp_path / "builds.log"
    log.touch()
    out = tmp_path / "fits"
    settings = {"draws": 1000, "tune": 200, "chains": 1, "random_seed": 5}
    job = dp.FitJob("long", partial(slowly_saved_beta_binomial, str(log), "long"), settings)
    result = {}
    runner = threading.Thread(target=lambda: result.update(
        table=dp.fit_many([job], out, executor=client, progressbar=False, checkpoint_every=100)))
    runner.start()
    deadline = time.monotonic() + 120
    while not (out / ".checkpoints" / "long" / "chain-0.nc").exists():
        assert time.monotonic() < deadline and runner.is_alive(), "the fit saved no checkpoint"
        time.sleep(0.02)
    victim = int(log.read_text().split()[1])
    os.kill(victim, signal.SIGKILL)
    runner.join(timeout=180)
    assert not runner.is_alive()
    pids = [int(line.split()[1]) for line in log.read_text().splitlines()]
    assert len(pids) == 2 and pids[0] == victim != pids[1]
    with xr.open_datatree(out / "long.nc", engine="h5netcdf") as idata:
        resumed_at = json.loads(idata.sample_stats.attrs["resumed_at_iterations"])
    assert 100 <= resumed_at[0] < 1200
    direct = dp.sample(**settings, cores=1, progressbar=False, model=beta_binomial(612))
    assert_same_draws(out / "long.nc", direct.posterior.to_dataset())
    assert not (out / ".checkpoints").exists()


class RecordingExecutor:
    """Runs each submitted call at once and records the job names: any object with submit()."""

    def __init__(self):
        self.submitted = []

    def submit(self, fn, job, *args):
        self.submitted.append(job.name)
        future = concurrent.futures.Future()
        future.set_result(fn(job, *args))
        return future


def test_rerun_submits_only_unfinished_jobs_and_rebuilds_lost_rows(tmp_path):
    jobs = jobs_for((612, 580, 640))
    first = dp.fit_many(jobs[:2], tmp_path, progressbar=False)
    mtimes = [os.stat(tmp_path / f"rep{i}.nc").st_mtime_ns for i in range(2)]
    executor = RecordingExecutor()
    second = dp.fit_many(jobs, tmp_path, executor=executor, progressbar=False)
    assert executor.submitted == ["rep2"]
    assert mtimes == [os.stat(tmp_path / f"rep{i}.nc").st_mtime_ns for i in range(2)]
    pd.testing.assert_frame_equal(second.iloc[:2], first)
    # a driver stopped between a worker's write and its summary row: the row comes from the file
    (tmp_path / "summary.csv").unlink()
    third = dp.fit_many(jobs, tmp_path, executor=executor, progressbar=False)
    assert executor.submitted == ["rep2"]
    pd.testing.assert_frame_equal(third, second)


def test_a_failed_job_is_named_after_the_others_finish(tmp_path):
    jobs = [dp.FitJob("bad", not_a_model), *jobs_for((612,))]
    with pytest.raises(RuntimeError, match=r"1 of 2 fits failed \(bad: TypeError: FitJob 'bad': "
                                           r"build\(\) must return a pm.Model, got str\)"):
        dp.fit_many(jobs, tmp_path, progressbar=False)
    assert (tmp_path / "rep0.nc").exists() and not (tmp_path / "bad.nc").exists()
    assert list(pd.read_csv(tmp_path / "summary.csv")["name"]) == ["rep0"]


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden", "x y", "é", "a" * 201, 3])
def test_unsafe_names_are_refused(name):
    with pytest.raises(ValueError, match="FitJob name must be a safe file stem"):
        dp.FitJob(name, beta_binomial)


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(TypeError, match="build must be a zero-argument callable"):
        dp.FitJob("a", "beta_binomial")
    with pytest.raises(ValueError, match="sample_kwargs must not contain 'model'"):
        dp.FitJob("a", beta_binomial, {"model": None})
    with pytest.raises(TypeError, match="data must be None or a dict"):
        dp.FitJob("a", beta_binomial, data=[1])
    job = dp.FitJob("a", beta_binomial)
    with pytest.raises(ValueError, match=r"unique names .*repeated: \['a'\]"):
        dp.fit_many([job, job], tmp_path)
    with pytest.raises(TypeError, match=r"jobs\[0\] must be a FitJob"):
        dp.fit_many([beta_binomial], tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="out_dir must be a directory"):
        dp.fit_many([job], tmp_path / "file")
    with pytest.raises(TypeError, match="executor must be None"):
        dp.fit_many([job], tmp_path, executor=object())
