"""``fit_many``: many independent fits (one per geography, replication or scenario) sent
through a concurrent.futures-style executor, each result streamed to its own netCDF file.

Design
------
A :class:`FitJob` names one fit: a picklable ``build()`` that returns a ``pm.Model`` with its
releases registered by ``Mechanism.observe``, the keyword arguments of ``dpinfer.sample``, and
optionally new values for the model's ``pm.Data`` and a ``model_key``. The unit of work is
``_fit_and_write(job, out_dir)``, which runs **on the worker**: it fits, writes
``out_dir/<name>.nc`` (``DataTree.to_netcdf``, h5netcdf) under a temporary name in the same
directory and renames it with ``os.replace`` (atomic on POSIX), and returns one summary row
(a few numbers, not the draws). So

* a finished fit is on disk the moment it finishes, and a worker killed mid-write leaves at
  most a ``.<name>.<hex>.part`` file (removed at the end of the run), never a partial ``.nc``;
* a file present means the fit is done: ``fit_many`` submits only jobs without one (a rerun
  after a crash redoes only unfinished fits), and a task that Dask recomputes after its
  finished result was lost with a worker reads the file instead of refitting;
* the summary row is a function of the file (``fit_many`` rebuilds it from the file when a
  stopped driver never appended it), so ``summary.csv`` always agrees with the files.

The driver appends each row to ``out_dir/summary.csv`` as results arrive (``as_completed``)
and prints a progress line. Scheduling, retries and worker management are the executor's:

* ``executor=None`` fits in this process, one job after another;
* any object with ``submit(fn, *args)`` returning ``concurrent.futures`` futures, such as
  ``ProcessPoolExecutor`` (for Dask, pass the Client itself rather than
  ``client.get_executor()``: that wrapper keeps finished results alive and sends jobs as
  plain task arguments, see below);
* a ``distributed.Client`` itself: its futures are not ``concurrent.futures`` futures, so
  they are collected with ``distributed.as_completed`` and each is released as soon as its row
  is written (a finished result kept on a worker that then dies would be recomputed); each
  job travels as one cloudpickle bytes object, because Dask can deliver the arrays inside
  a task's arguments misaligned, which PyTensor refuses (``_fit_pickled``).

What happens when a Dask worker dies (sources: ``Scheduler.remove_worker`` in ``distributed``
2026.8 and the "Resilience" page of its documentation): the tasks assigned to it (running or
queued there), and results held only in its memory that a client still wants, go back to the
scheduler and run on another worker; a task that was assigned to dying workers more than
``distributed.scheduler.allowed-failures`` times (3 by default) fails with ``KilledWorker``.
With ``checkpoint_every`` the fit run again continues from its checkpoint
(``out_dir/.checkpoints/<name>``, written by the dead worker every ``checkpoint_every``
iterations) instead of starting over, and gives the draws of an uninterrupted fit.
Dask's ``retries=`` is a different thing (it reruns a task that *raised*), so ``fit_many``
does not pass it: a fit that raises would raise again with the same seed. A failed job does
not stop the others; ``fit_many`` raises a ``RuntimeError`` naming the failures after the
rest are done, and a rerun redoes only them. With ``ProcessPoolExecutor`` a killed process
breaks the whole pool (``BrokenProcessPool`` for every pending job): rerun to resume.

Each fit runs ``dpinfer.sample(..., cores=1, progressbar=False)`` unless its
``sample_kwargs`` say otherwise: one worker process per core, instead of chains in threads.
With a ``random_seed`` in ``sample_kwargs`` a fit's draws are the same wherever it runs (in
this process, a process pool, a Dask worker, or a retry after a worker died).

**Model reuse.** dpinfer keeps its compiled model on the ``pm.Model`` and reuses it when only
the releases' data change (:mod:`dpinfer.inference.engines.compiled.model`). Jobs with the same
``model_key`` that run in the same worker process therefore share one model, built by the
first of them: each job only calls ``pm.set_data(job.data)`` before fitting, so a replication
study compiles once per worker instead of once per fit (about 0.1 s instead of 2-4 s per fit
on the beta-binomial model of the tests). The key must name the model's structure: jobs with
the same key must have builds that return the same model up to ``pm.Data`` values. A lock per
model keeps workers with several threads correct (their jobs of one key run one at a time).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import arviz as az
import cloudpickle  # a dependency of pymc
import numpy as np
import pandas as pd
import pymc as pm
import xarray as xr

from dpinfer._validation import check_count
from dpinfer.inference import sample
from dpinfer.inference.checkpoint import resume_or_start

SUMMARY = "summary.csv"
CHECKPOINTS = ".checkpoints"  # out_dir's directory of unfinished fits' checkpoints
COLUMNS = ("name", "path", "seconds", "engine", "max_rhat", "min_ess_bulk", "divergences",
           "model_reused", "host", "pid")
_ATTR = "dpinfer_fit_many"  # root attribute of each file: how the fit ran (JSON)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_MODELS: dict[str, tuple[pm.Model, threading.Lock]] = {}  # model_key -> (model, its lock)
_MODELS_LOCK = threading.Lock()


@dataclass(frozen=True)
class FitJob:
    """One independent fit.

    name
        The output file's stem (``<name>.nc``): 1-200 characters from ``A-Z a-z 0-9 . _ -``,
        starting with a letter or digit; unique within a ``fit_many`` call.
    build
        A zero-argument callable returning a ``pm.Model`` with releases registered by
        ``Mechanism.observe``; it must pickle for a process pool or a cluster (a module-level
        function or a ``functools.partial`` of one; Dask also pickles functions of
        ``__main__`` by value).
    sample_kwargs
        Keyword arguments of ``dpinfer.sample`` (``model`` excluded); ``cores=1`` and
        ``progressbar=False`` unless given. Give ``random_seed`` for reproducible fits.
    data
        Values for ``pm.set_data`` before fitting (e.g. this replication's release).
    model_key
        Jobs with the same key share one built model per worker process (module docstring).
    """

    name: str
    build: Callable[[], pm.Model]
    sample_kwargs: Mapping[str, Any] = field(default_factory=dict)
    data: Mapping[str, Any] | None = None
    model_key: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"FitJob name must be a safe file stem: 1-200 characters from A-Z a-z 0-9 . _ -, "
                f"starting with a letter or digit; got {self.name!r}"
            )
        if not callable(self.build):
            raise TypeError(f"FitJob {self.name!r}: build must be a zero-argument callable "
                            f"returning a pm.Model, got {self.build!r}")
        if not isinstance(self.sample_kwargs, Mapping):
            raise TypeError(f"FitJob {self.name!r}: sample_kwargs must be a dict, "
                            f"got {type(self.sample_kwargs).__name__}")
        if "model" in self.sample_kwargs:
            raise ValueError(f"FitJob {self.name!r}: sample_kwargs must not contain 'model' "
                             "(the model is what build returns)")
        if self.data is not None and not isinstance(self.data, Mapping):
            raise TypeError(f"FitJob {self.name!r}: data must be None or a dict for pm.set_data, "
                            f"got {type(self.data).__name__}")
        if self.model_key is not None and not isinstance(self.model_key, str):
            raise TypeError(f"FitJob {self.name!r}: model_key must be None or a str, "
                            f"got {self.model_key!r}")
        object.__setattr__(self, "sample_kwargs", dict(self.sample_kwargs))


def fit_many(jobs: Iterable[FitJob], out_dir, *, executor=None, progressbar: bool = True,
             checkpoint_every: int | None = None) -> pd.DataFrame:
    """Fit every job whose ``out_dir/<name>.nc`` does not exist yet and return the summary.

    Parameters
    ----------
    jobs
        :class:`FitJob` objects with unique names.
    out_dir
        Directory for ``<name>.nc`` (one per job) and ``summary.csv`` (created if missing).
        On a cluster it must be the same shared filesystem path on the workers and here.
    executor
        None (fit here, one job after another), an executor whose ``submit`` returns
        ``concurrent.futures`` futures (e.g. ``ProcessPoolExecutor``), or a
        ``distributed.Client`` (module docstring).
    progressbar
        Print a line per finished job: done/total, its fit seconds, time elapsed, the time
        left at the rate so far, and (on Dask) the workers alive.
    checkpoint_every
        Checkpoint each fit every this many iterations in ``out_dir/.checkpoints/<name>``
        (``dpinfer.sample(checkpoint=...)``; fits on the compiled engine only): a fit whose
        worker died, or that a stopped run left unfinished, continues from its checkpoint when
        Dask reruns it on another worker or ``fit_many`` is called again, with the draws of an
        uninterrupted fit (given its ``random_seed``). A fit's checkpoint is removed once its
        file is written. None: no checkpoints (an interrupted fit starts again).

    Returns
    -------
    pandas.DataFrame with one row per job, in the order of ``jobs`` (earlier runs' rows for
    jobs already done): ``name``, ``path``, ``seconds`` (build + fit + write, on the worker),
    ``engine`` (from ``posterior.attrs["dpinfer"]``), ``max_rhat`` and ``min_ess_bulk`` (over
    every posterior quantity, arviz; R-hat is NaN with one chain), ``divergences``,
    ``model_reused`` (the worker's cached model was used), ``host``, ``pid``.

    Raises
    ------
    RuntimeError
        After every other job is done, if some jobs failed (each named with its error).
    """
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, FitJob):
            raise TypeError(f"jobs[{i}] must be a FitJob, got {type(job).__name__}")
    names = [job.name for job in jobs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"jobs must have unique names (they name the output files); repeated: {repeated}")
    if checkpoint_every is not None:
        checkpoint_every = check_count("checkpoint_every", checkpoint_every, 1)
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise TypeError("executor must be None, a concurrent.futures-style executor or a "
                        f"distributed.Client (an object with submit(fn, *args)), got {executor!r}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir must be a directory (or not exist yet), got the file {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    summary = out / SUMMARY

    recorded = set(_read_summary(summary)["name"])
    for job in jobs:  # finished by an earlier run that stopped before writing its row
        path = out / f"{job.name}.nc"
        if path.exists() and job.name not in recorded:
            _append(summary, _row_from_file(job.name, path))
    todo = [job for job in jobs if not (out / f"{job.name}.nc").exists()]
    if progressbar:
        print(f"fit_many: {len(jobs)} jobs, {len(jobs) - len(todo)} already in {out}, "
              f"fitting {len(todo)}", flush=True)

    start = time.perf_counter()
    failures = {}
    for done, (job, outcome) in enumerate(_completed(executor, todo, str(out), checkpoint_every), start=1):
        elapsed = time.perf_counter() - start
        if isinstance(outcome, Exception):
            failures[job.name] = outcome
            if progressbar:
                print(f"fit_many: {done}/{len(todo)} {job.name} FAILED: {outcome!r} "
                      f"({_progress(elapsed, done, len(todo), executor)})", flush=True)
            continue
        _append(summary, outcome)
        if progressbar:
            print(f"fit_many: {done}/{len(todo)} {job.name} in {outcome['seconds']:.1f} s "
                  f"({_progress(elapsed, done, len(todo), executor)})", flush=True)
    for part in out.glob(".*.part"):  # left by workers killed while writing
        part.unlink(missing_ok=True)
    if (out / CHECKPOINTS).is_dir() and not any((out / CHECKPOINTS).iterdir()):
        (out / CHECKPOINTS).rmdir()  # every fit finished (a failed fit's checkpoint stays)
    if failures:
        listed = "; ".join(f"{name}: {type(err).__name__}: {err}" for name, err in failures.items())
        raise RuntimeError(
            f"fit_many: {len(failures)} of {len(todo)} fits failed ({listed}); the others are in "
            f"{summary}; calling fit_many again redoes only the failed ones"
        ) from next(iter(failures.values()))
    table = _read_summary(summary).drop_duplicates("name", keep="last").set_index("name")
    return table.loc[names].reset_index()


def _progress(elapsed: float, done: int, total: int, executor) -> str:
    """"12 s elapsed, about 40 s left, 2 workers": the time left at the rate so far, and the
    workers alive when the executor is a Dask client."""
    text = f"{elapsed:.0f} s elapsed"
    if done < total:
        text += f", about {elapsed / done * (total - done):.0f} s left"
    distributed = sys.modules.get("distributed")
    if distributed is not None and isinstance(executor, distributed.Client):
        text += f", {len(executor.scheduler_info().get('workers', {}))} workers"
    return text


def _completed(executor, jobs: list[FitJob], out_dir: str, checkpoint_every: int | None):
    """Yield (job, summary row or the exception it raised) as each job finishes."""
    if executor is None:
        for job in jobs:
            try:
                yield job, _fit_and_write(job, out_dir, checkpoint_every)
            except Exception as err:
                yield job, err
        return
    distributed = sys.modules.get("distributed")
    dask = distributed is not None and isinstance(executor, distributed.Client)
    if dask:  # each job as one bytes object: see _fit_pickled
        futures = {executor.submit(_fit_pickled, cloudpickle.dumps(job), out_dir, checkpoint_every, pure=False,
                                   key=f"fit_many-{job.name}-{uuid.uuid4().hex}"): job
                   for job in jobs}
        as_completed = distributed.as_completed
    else:
        futures = {executor.submit(_fit_and_write, job, out_dir, checkpoint_every): job for job in jobs}
        as_completed = concurrent.futures.as_completed
    for future in as_completed(list(futures)):
        job = futures.pop(future)
        try:
            outcome = future.result()
        except Exception as err:
            outcome = err
        if dask:
            future.release()  # the row is here now: no need for the worker to keep it
        yield job, outcome


def _fit_pickled(payload: bytes, out_dir: str, checkpoint_every: int | None) -> dict:
    """``_fit_and_write`` of a job sent as cloudpickle bytes. Dask pickles task arguments with
    their arrays' buffers out of band and may hand those over misaligned (measured with
    ``distributed`` 2026.8: an array inside a ``functools.partial`` arrived at an odd address),
    which PyTensor refuses ("The numpy.ndarray object is not aligned"); unpickled from one
    bytes object here, every array of the job gets buffers numpy can use."""
    return _fit_and_write(cloudpickle.loads(payload), out_dir, checkpoint_every)


def _fit_and_write(job: FitJob, out_dir: str, checkpoint_every: int | None = None) -> dict:
    """Fit ``job`` and write ``out_dir/<name>.nc`` atomically; return its summary row. Runs
    on the worker. If the file exists (an earlier attempt of this task finished), read it;
    with ``checkpoint_every``, continue from the fit's checkpoint if an earlier attempt left one."""
    path = os.path.join(out_dir, f"{job.name}.nc")
    if os.path.exists(path):
        return _row_from_file(job.name, path)
    start = time.perf_counter()
    kwargs = {"cores": 1, "progressbar": False, **job.sample_kwargs}
    checkpoint = os.path.join(out_dir, CHECKPOINTS, job.name)
    if checkpoint_every is not None:
        kwargs |= resume_or_start(checkpoint, checkpoint_every)
    model, lock, reused = _model_for(job)
    with lock:
        if job.data:
            pm.set_data(dict(job.data), model=model)
        idata = sample(model=model, **kwargs)
    seconds = time.perf_counter() - start
    idata.attrs[_ATTR] = json.dumps({"seconds": seconds, "model_reused": reused,
                                     "host": socket.gethostname(), "pid": os.getpid()})
    part = os.path.join(out_dir, f".{job.name}.{uuid.uuid4().hex}.part")
    try:
        idata.to_netcdf(part, engine="h5netcdf")
        os.replace(part, path)
    finally:
        if os.path.exists(part):  # the write failed
            os.remove(part)
    shutil.rmtree(checkpoint, ignore_errors=True)  # the fit is in its file now
    return _row(job.name, path, idata)


def _model_for(job: FitJob) -> tuple[pm.Model, threading.Lock, bool]:
    """(model, its lock, whether it was built by an earlier job of this process)."""
    if job.model_key is None:
        return _built(job), threading.Lock(), False
    with _MODELS_LOCK:
        entry = _MODELS.get(job.model_key)
        reused = entry is not None
        if not reused:
            entry = _MODELS[job.model_key] = (_built(job), threading.Lock())
    return entry[0], entry[1], reused


def _built(job: FitJob) -> pm.Model:
    model = job.build()
    if not isinstance(model, pm.Model):
        raise TypeError(f"FitJob {job.name!r}: build() must return a pm.Model, "
                        f"got {type(model).__name__}")
    return model


def _row(name: str, path: str, idata: xr.DataTree) -> dict:
    """The summary row of one fit (``fit_many``'s Returns)."""
    info = json.loads(idata.attrs[_ATTR])
    report = json.loads(idata.posterior.attrs["dpinfer"])
    stats = idata.children.get("sample_stats")
    divergences = (int(stats["diverging"].values.sum())
                   if stats is not None and "diverging" in stats else None)
    return {
        "name": name,
        "path": str(path),
        "seconds": info["seconds"],
        "engine": ",".join(sorted({entry["engine"] for entry in report.values()})),
        "max_rhat": _finite_extreme(az.rhat(idata), np.max),
        "min_ess_bulk": _finite_extreme(az.ess(idata, method="bulk"), np.min),
        "divergences": divergences,
        "model_reused": info["model_reused"],
        "host": info["host"],
        "pid": info["pid"],
    }


def _row_from_file(name: str, path) -> dict:
    with xr.open_datatree(path, engine="h5netcdf") as idata:
        return _row(name, path, idata.load())


def _finite_extreme(diagnostic: xr.DataTree, extreme) -> float:
    """max or min of a diagnostic over every variable and element, ignoring NaN (e.g. R-hat
    of one chain, or of a quantity that never moves); NaN if nothing is finite."""
    values = np.concatenate([np.ravel(v.values) for v in diagnostic.to_dataset().data_vars.values()])
    values = values[np.isfinite(values)]
    return float(extreme(values)) if values.size else float("nan")


def _read_summary(path: Path) -> pd.DataFrame:
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=COLUMNS)
    return pd.read_csv(path)


def _append(path: Path, row: dict) -> None:
    """Append one row to summary.csv (with the header if the file is new)."""
    new = not path.exists() or path.stat().st_size == 0
    text = pd.DataFrame([row], columns=COLUMNS).to_csv(header=new, index=False)
    with open(path, "a") as f:  # one write: a reader never sees half a row
        f.write(text)
