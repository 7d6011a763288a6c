"""dpinfer._blas: while chains run side by side in threads, each has its share of the cores for
BLAS (two chains on two cores: one BLAS thread each), and the user's setting comes back after."""

from __future__ import annotations

import os

import numpy as np
import pymc as pm
import pytest
from threadpoolctl import threadpool_info

import dpinfer as dp
import dpinfer.inference.engines.compiled.chains as chains_module
from dpinfer._blas import blas_threads_for


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


pytestmark = pytest.mark.skipif(not blas_threads(), reason="no BLAS library that threadpoolctl controls is loaded")


def test_the_limit_holds_inside_and_the_setting_comes_back_after():
    before = blas_threads()
    share = max(1, (os.cpu_count() or 1) // 2)
    with blas_threads_for(2):
        assert blas_threads() == [share] * len(before)
    assert blas_threads() == before
    with blas_threads_for(1):  # one chain at a time: BLAS keeps every thread it has
        assert blas_threads() == before


def test_dp_sample_runs_two_chains_on_two_cores_with_their_share_each(monkeypatch):
    seen = []
    original = chains_module.run_chain

    def recording(*args, **kwargs):
        seen.append(blas_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(chains_module, "run_chain", recording)
    before = blas_threads()
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 2.0)
        mean = pm.Normal("mean", theta, 0.1)
        dp.Gaussian.from_sigma(1 / 3).observe("s", mean, observed=np.float64(-2.1))
    with pytest.warns(UserWarning, match="NOT CONVERGED"):  # 20 draws: only the threads are looked at
        dp.sample(20, tune=20, chains=2, cores=2, random_seed=1, progressbar=False, model=model)
    share = max(1, (os.cpu_count() or 1) // 2)
    assert seen and all(threads == [share] * len(before) for threads in seen), seen
    assert blas_threads() == before
