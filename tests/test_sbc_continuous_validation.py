"""Validation tier (`make validate`): the SBC study of validation/sbc_continuous.py (continuous
latents on dp.sample's default (compiled) engine: Normal latents summed out of Laplace and Gaussian releases,
and a record-level clamped regression) with 200 replications per model; writes
validation/results/sbc_continuous.md and prints it. A few minutes on 2 cores.
Smoke run by hand: `.venv/bin/python validation/sbc_continuous.py --reps 20`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm
import pytest

import dpinfer as dp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import sbc_continuous  # noqa: E402

N_REPS = 200
SEED = sbc_continuous.SEED


@pytest.mark.validation
def test_sbc_continuous_study():
    """Every dpinfer row passes (coverage in its exact binomial band, rank tests above the
    Bonferroni threshold; family-wise alpha = 1% per model and method), on the engine the study
    means to validate (the compiled engine; the latent summed out in closed form in (a) and (b)). The naive
    analysis of (a) and (b) (release taken as the true ybar) under-covers theta and every ybar
    (90% coverage below the band)."""
    results = sbc_continuous.run_study(N_REPS, seed=SEED, progress_every=20)
    text = sbc_continuous.write_report(results, seed=SEED)
    print("\n" + text)
    for name, df in results.items():
        engine = df.attrs["engine"]["s"]
        assert engine["engine"] == "compiled", f"{name}: {engine}"
        if name.startswith(("(a)", "(b)")):
            assert engine["method"].startswith("summed out in closed form"), f"{name}: {engine}"
        assert df[df.method == "dpinfer"]["passed"].all(), f"{name}\n{text}"
    for name, df in results.items():
        if name.startswith(("(a)", "(b)")):
            naive = df[df.method == "naive"]
            assert len(naive) == 1 + sbc_continuous.N_GROUPS
            assert (naive["coverage90"] < naive["band90_lo"]).all(), f"{name}\n{text}"


@pytest.mark.validation
def test_refits_take_the_new_release():
    """The study's premise: one compiled model, releases swapped with pm.set_data. Model (b)'s
    exact posterior, theta | s ~ N(v sum(s) / (0.3^2 + 0.5^2), v), v = 1 / (1/4 + 3 / 0.34),
    is matched (within 4.5 Monte Carlo standard errors) for two far-apart releases fitted in turn."""
    model, _, _ = sbc_continuous.normal_gaussian()
    var_s = sbc_continuous.YBAR_SD**2 + sbc_continuous.SIGMA_B**2
    var = 1.0 / (1.0 / sbc_continuous.THETA_SD**2 + sbc_continuous.N_GROUPS / var_s)
    for seed, release in enumerate([np.array([3.1, 2.4, 3.6]), np.array([-4.0, -3.2, -4.4])]):
        pm.set_data({"s_data": release}, model=model)
        idata = dp.sample(1000, tune=500, chains=2, cores=2, model=model, random_seed=seed,
                          progressbar=False)
        theta = idata.posterior["theta"].values
        ybar = idata.posterior["ybar"].values
        assert abs(theta.mean() - var * release.sum() / var_s) < 4.5 * np.sqrt(var / 400)
        # ybar | theta, s is drawn exactly: its mean follows the release
        assert np.all(np.abs(ybar.mean(axis=(0, 1)) - release) < 1.0)
