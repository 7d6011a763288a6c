"""The nation's county table (benchmarks/bench_nation.py) as one model sharded by state
(:func:`dpinfer.sample_sharded`), and its check against the one-machine engine.

The model is bench_nation's hierarchical Poisson, centred:
    mu0 ~ N(-5, 2), tau ~ HalfNormal(1), sigma ~ HalfNormal(1)          (shared)
    mu_s ~ N(mu0, tau), log_rate_i ~ N(mu_s(i), sigma),
    x_i ~ Poisson(population_i exp(log_rate_i)), released with double geometric noise
    conditioned on every state's total                                  (per state)
Given (mu0, tau, sigma) the states are independent, so a shard is a run of states. The
shared parameters' conditional given the states' local parameters is
    log p(mu0, tau, sigma) + sum_s log N(mu_s | mu0, tau)
      - n log sigma - sum_s SS_s / (2 sigma^2)       (SS_s = sum_{i in s} (log_rate_i - mu_s)^2)
so each state's summaries are mu_s, its number of cells n_s and SS_s.

Run:  .venv/bin/python validation/sharded_nation.py [--cells 3143] [--workers 2]
prints the one-machine and sharded posteriors side by side with the checks of
:func:`compare` (also run by tests/test_sharded.py in the validation tier).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_nation  # noqa: E402

import dpinfer as dp  # noqa: E402

HYPER = ("mu0", "tau", "sigma")


class NationShards:
    """The table of ``n_cells`` cells (bench_nation's), its one-machine model
    (:meth:`full_model`), a shard's model (calling it with a list of states) and the shared
    model (:meth:`shared_model`)."""

    def __init__(self, n_cells: int = 3143):
        self.population, self.truth, self.states = bench_nation.synthetic_table(n_cells)
        _, _, self.release = bench_nation.build(n_cells)
        self.n_states = int(self.states.max() + 1)
        self.n_cells = n_cells

    @property
    def groups(self) -> list:
        return list(range(self.n_states))

    @property
    def cells_per_state(self) -> np.ndarray:
        return np.bincount(self.states, minlength=self.n_states)

    def full_model(self):
        return bench_nation.build(self.n_cells)[0]

    def __call__(self, groups: list):
        groups = np.asarray(groups)
        cells = np.flatnonzero(np.isin(self.states, groups))
        local = np.searchsorted(groups, self.states[cells])
        G = len(groups)
        mechanism = dp.Conditioned(dp.DoubleGeometric(epsilon=bench_nation.EPSILON), dp.Invariants.groups(local))
        with pm.Model(coords={"cell": cells, "state": groups}) as model:
            mu0, tau, sigma = pm.Data("mu0", -5.0), pm.Data("tau", 1.0), pm.Data("sigma", 1.0)
            mu = pm.Normal("mu", mu0, tau, dims="state")
            log_rate = pm.Normal("log_rate", mu[local], sigma, dims="cell")
            x = pm.Poisson("x", self.population[cells] * pm.math.exp(log_rate), dims="cell")
            mechanism.observe("release", x, observed=self.release[cells], dims="cell")
            pm.Deterministic("mu_state", mu)
            pm.Deterministic("cells_state", pt.as_tensor(np.bincount(local, minlength=G).astype(float)))
            pm.Deterministic("ss_state", pt.inc_subtensor(pt.zeros(G)[local], (log_rate - mu[local]) ** 2))
        return model

    def shared_model(self):
        G = self.n_states
        with pm.Model() as model:
            mu0 = pm.Normal("mu0", -5.0, 2.0)
            tau = pm.HalfNormal("tau", 1.0)
            sigma = pm.HalfNormal("sigma", 1.0)
            mu_state = pm.Data("mu_state", np.zeros(G))
            cells_state = pm.Data("cells_state", np.zeros(G))
            ss_state = pm.Data("ss_state", np.zeros(G))
            pm.Potential("states", pm.logp(pm.Normal.dist(mu0, tau), mu_state).sum())
            pm.Potential("cells", -cells_state.sum() * pm.math.log(sigma) - ss_state.sum() / (2 * sigma**2))
        return model


def compare(one, sharded, truth, n_counts: int = 50, seed: int = 0) -> dict:
    """The one-machine and sharded posteriors side by side: for each hyperparameter and a
    random sample of ``n_counts`` counts, both means and their difference in Monte Carlo
    standard errors (ArviZ's mcse of each, combined); for each hyperparameter, the
    two-sample KS p-value on draws thinned to about their bulk ESS (so that the draws are
    nearly independent, as KS assumes)."""
    import arviz as az
    from scipy import stats

    rows = []
    picks = np.sort(np.random.default_rng(seed).choice(len(truth), size=min(n_counts, len(truth)), replace=False))
    for name, index in [(h, None) for h in HYPER] + [("x", int(i)) for i in picks]:
        a, b = (idata.posterior[name] if index is None else idata.posterior[name][..., index]
                for idata in (one, sharded))
        se = np.hypot(float(az.mcse(a, method="mean")), float(az.mcse(b, method="mean")))
        row = {"name": name if index is None else f"x[{index}]", "one_machine": float(a.mean()),
               "sharded": float(b.mean()), "z": float((a.mean() - b.mean()) / se) if se > 0 else 0.0}
        if index is None:
            thin = [max(1, int(round(a.size / float(az.ess(x, method="bulk"))))) for x in (a, b)]
            row["ks_p"] = float(stats.ks_2samp(a.values[:, ::thin[0]].ravel(), b.values[:, ::thin[1]].ravel()).pvalue)
        rows.append(row)
    return {"rows": rows, "max_abs_z": max(abs(r["z"]) for r in rows),
            "min_ks_p": min(r["ks_p"] for r in rows if "ks_p" in r)}


def main(argv=None):
    import pandas as pd
    from distributed import Client, LocalCluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=3143)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    args = parser.parse_args(argv)
    nation = NationShards(args.cells)
    t0 = time.perf_counter()
    one = dp.sample(args.draws, tune=args.tune, chains=2, random_seed=1, model=nation.full_model(), progressbar=False)
    one_seconds = time.perf_counter() - t0
    with LocalCluster(n_workers=args.workers, threads_per_worker=1) as cluster, Client(cluster) as client:
        t0 = time.perf_counter()
        sharded = dp.sample_sharded(nation, nation.shared_model(), nation.groups, client=client, draws=args.draws,
                                    tune=args.tune, chains=2, random_seed=2, weights=nation.cells_per_state)
        sharded_seconds = time.perf_counter() - t0
    result = compare(one, sharded, nation.truth)
    print(pd.DataFrame(result["rows"]).set_index("name").round(4).to_string())
    print(f"max |z| {result['max_abs_z']:.2f}, min KS p {result['min_ks_p']:.3g}; one machine {one_seconds:.1f} s, "
          f"sharded on {args.workers} workers {sharded_seconds:.1f} s, "
          f"{sharded.sample_stats.attrs['bytes_per_sweep']} bytes per sweep")


if __name__ == "__main__":
    main()
