"""Shared test set-up: mpmath's working precision per test module; a Dask LocalCluster per module.

A module that needs more digits than mpmath's default 15 sets ``MPMATH_DPS``; every test runs
inside ``mpmath.workdps`` of it, so a precision set by one module (or changed inside a test)
never leaks into another module's tests, whatever order pytest-xdist gives them."""

import mpmath
import pytest


@pytest.fixture(autouse=True)
def _mpmath_precision(request):
    with mpmath.workdps(getattr(request.module, "MPMATH_DPS", 15)):
        yield


@pytest.fixture
def ctrl_c_after_saves(monkeypatch):
    """ctrl_c_after_saves(n, when=None): from now on, Ctrl-C (SIGINT to this process) right
    after the n-th checkpoint save for which ``when(checkpoint)`` holds (every save if None),
    then a 0.2 s pause so that the main thread's handler runs before the saving chain's next
    compiled call. Returns a function that restores the plain save."""
    import os
    import signal
    import time

    from dpinfer.inference import checkpoint as checkpoints

    save = checkpoints.Checkpoint.save

    def arm(n: int, when=None):
        calls = []

        def save_then_ctrl_c(self, chain, state):
            save(self, chain, state)
            if when is None or when(self):
                calls.append(state.done)
                if len(calls) == n:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.2)

        monkeypatch.setattr(checkpoints.Checkpoint, "save", save_then_ctrl_c)
        return lambda: monkeypatch.setattr(checkpoints.Checkpoint, "save", save)

    return arm


@pytest.fixture(scope="module")
def client():
    """A LocalCluster of 2 one-thread worker processes and its client, per test module."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as c:
            yield c
