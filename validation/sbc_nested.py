"""Simulation-based calibration of ``dpinfer.sample`` on nested measurements (issue 23).

A state of 2 counties x 3 tracts, 4 cells (a 2 x 2 cross-classification), measured at every
level as the census files are:

    a_c ~ Normal(log 15, 0.5),  c = 1..4;   b_k ~ Normal(0, 0.3), k = 2 (county 1: b = 0);
    x[t, c] ~ Poisson(exp(a_c + b_county(t)));
    tract:  each cell (sigma^2 = 8), the total (sigma^2 = 3);
    county: each row of the 2 x 2 (two cells summed, sigma^2 = 4 each: noise of 2 draws),
            the total (sigma^2 = 2);
    state:  each cell (sigma^2 = 5), the total exact (an equality).

Each replication draws the parameters and counts from the prior and a release with
``NestedMeasurements.release`` (exact discrete Gaussian draws), sets it with ``pm.set_data``
and refits the same compiled model (``dpinfer.inference.sbc.run_sbc``: randomised ranks and
PIT of every parameter and count among L = 99 thinned draws, exact binomial coverage bands,
chi-square and simultaneous ECDF uniformity tests, Bonferroni within the method,
family-wise alpha = 1%).

Run:  .venv/bin/python validation/sbc_nested.py [n_reps]
Writes validation/results/sbc_nested.md.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pymc as pm

from dpinfer.inference.sbc import run_sbc, study_main, study_report
from dpinfer.mechanisms.nested import NestedMeasurements

RESULTS = Path(__file__).parent / "results" / "sbc_nested.md"
SEED = 20261127
N_COUNTIES, N_TRACTS, N_CELLS = 2, 3, 4
A_MEAN, A_SD, B_SD = math.log(15.0), 0.5, 0.3
COUNTY = np.repeat(np.arange(N_COUNTIES), N_TRACTS)


def release_design() -> NestedMeasurements:
    """The measurements of the module docstring (values are placeholders: each replication
    draws its own with ``release``)."""
    parent = [-1] + [0] * N_COUNTIES + [1 + k for k in COUNTY]
    leaves = np.arange(1 + N_COUNTIES, 1 + N_COUNTIES + N_COUNTIES * N_TRACTS)
    counties = 1 + np.arange(N_COUNTIES)
    nm = NestedMeasurements(parent, leaves, N_CELLS, cell_shape=(2, 2))
    cells = [[c] for c in range(N_CELLS)]
    everything = [list(range(N_CELLS))]
    zeros = np.zeros
    nm.measure("tract/cell", leaves, cells, zeros((leaves.size, N_CELLS)), 8.0)
    nm.measure("tract/total", leaves, everything, zeros((leaves.size, 1)), 3.0)
    nm.measure("county/row", counties, [[0, 1], [2, 3]], zeros((N_COUNTIES, 2)), 4.0, summed=2)
    nm.measure("county/total", counties, everything, zeros((N_COUNTIES, 1)), 2.0)
    nm.measure("state/cell", [0], cells, zeros((1, N_CELLS)), 5.0)
    nm.equal("state/total", [0], everything, zeros((1, 1)))
    return nm


def build():
    """(model, simulate) for run_sbc."""
    nm = release_design()
    with pm.Model() as model:
        a = pm.Normal("a", A_MEAN, A_SD, shape=N_CELLS)
        b = pm.Normal("b", 0.0, B_SD, shape=N_COUNTIES - 1)
        effect = pm.math.concatenate([np.zeros(1), b])
        x = pm.Poisson("x", pm.math.exp(a[None, :] + effect[COUNTY][:, None]),
                       shape=(N_COUNTIES * N_TRACTS, N_CELLS))
        values = pm.Data("nmf_values", nm.values)
        nm.observe("nmf", x, values)

    def simulate(rng):
        a = rng.normal(A_MEAN, A_SD, N_CELLS)
        b = rng.normal(0.0, B_SD, N_COUNTIES - 1)
        x = rng.poisson(np.exp(a[None, :] + np.concatenate([[0.0], b])[COUNTY][:, None]))
        return {"a": a, "b": b, "x": x}, {"nmf_values": nm.release(x, rng)}

    return model, simulate


def run_study(n_reps: int, seed: int = SEED, progress_every: int = 10):
    model, simulate = build()
    return {"nested": run_sbc(model, simulate, n_reps, np.random.default_rng(seed),
                              progress_every=progress_every)}


def write_report(results, seed: int = SEED) -> str:
    """The markdown report (also written to validation/results/sbc_nested.md)."""
    df = results["nested"]
    text = study_report(
        "SBC: nested measurements (2 counties x 3 tracts x 2 x 2 cells, three levels, state total exact)",
        f"seed {seed}; {len(df.attrs['ess'])} replications; L = {df.attrs['n_ranks']}; "
        f"{df.attrs['seconds']:.0f} s; min bulk ESS of the parameters per fit: "
        f"median {np.median(df.attrs['ess']):.0f}", df)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    return text


def _run(n_reps: int):
    results = run_study(n_reps)
    return results, write_report(results)


if __name__ == "__main__":
    sys.exit(study_main(_run, RESULTS, default_reps=200))
