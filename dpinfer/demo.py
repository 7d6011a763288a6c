"""``dpinfer demo``: privatise small census counts, then recover them with a Bayesian model.

The curator releases each county's American Indian population (1990 census, ggplot2's
``midwest`` data) with double geometric noise. The analyst fits a hierarchical Poisson model
for the true counts,

    count_i ~ Poisson(population_i * exp(mu + sigma * z_i)),   z_i ~ N(0, 1),
    mu ~ N(-6, 2),  sigma ~ HalfNormal(1),
    release_i | count_i ~ count_i + DoubleGeometric(epsilon),

with ``dpinfer.sample`` (counts summed out exactly, then drawn exactly). The output compares
posterior medians and 90% intervals with the truth, with the intervals an analyst without a
likelihood would use (release ± the noise's 90% interval), and with the naive analysis that
treats the release as the true counts. The hyperparameters are compared with the same model
fitted to the confidential counts.
"""

from __future__ import annotations

import argparse
import time
from importlib import resources

import numpy as np
import pandas as pd
import pymc as pm

from dpinfer.inference import sample
from dpinfer.mechanisms.geometric import DoubleGeometric

PROB = 0.9


def load_midwest() -> pd.DataFrame:
    """The shipped 1990 census extract (see dpinfer/data/README.md)."""
    with resources.files("dpinfer.data").joinpath("midwest_1990.csv").open() as f:
        return pd.read_csv(f)


def county_model(population: np.ndarray, counties) -> tuple[pm.Model, pm.Data]:
    """The hierarchical Poisson model for true counts; returns (model, count variable)."""
    with pm.Model(coords={"county": counties}) as model:
        mu = pm.Normal("mu", -6.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="county")
        rate = pm.Deterministic("rate", pm.math.exp(mu + sigma * z), dims="county")
        count = pm.Poisson("count", population * rate, dims="county")
    return model, count


def _interval(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, med, hi = np.quantile(draws, [(1 - PROB) / 2, 0.5, (1 + PROB) / 2], axis=0)
    return med, lo, hi


def _fit_observed(population, counties, counts, draws, seed, label):
    """The same model with the counts observed (oracle: true counts; naive: releases)."""
    model, count = county_model(population, counties)
    print(f"\n[{label}] fitting the model with counts observed")
    with pm.observe(model, {count: counts}):
        idata = pm.sample(draws, tune=draws, chains=2, random_seed=seed, progressbar=True)
    return idata.posterior.to_dataset()


def run(state: str = "IL", epsilon: float = 0.25, draws: int = 500, seed: int = 2026) -> dict:
    data = load_midwest()
    if state not in set(data["state"]):
        raise ValueError(f"state must be one of {sorted(set(data['state']))}, got {state!r}")
    data = data[data["state"] == state].reset_index(drop=True)
    counties = data["county"].str.title().tolist()
    population = data["population"].to_numpy(float)
    truth = data["american_indian"].to_numpy(np.int64)
    rng = np.random.default_rng(seed)

    mechanism = DoubleGeometric(epsilon=epsilon)
    release = mechanism.release(truth, rng)
    print(f"dpinfer demo: American Indian population of the {len(truth)} counties of {state}, 1990 census")
    print(f"curator: {mechanism}")
    print(f"  release - truth: mean {np.mean(release - truth):+.2f}, sd {np.std(release - truth):.2f}, "
          f"{np.sum(release < 0)} negative releases")

    model, count = county_model(population, counties)
    with model:
        mechanism.observe("release", count, observed=release, dims="county")
    print("\n[dpinfer] fitting: counts summed out exactly, NUTS on (mu, sigma, z), exact count draws")
    start = time.perf_counter()
    idata = sample(draws, tune=draws, chains=2, random_seed=seed, model=model)
    seconds = time.perf_counter() - start
    post = idata.posterior.to_dataset()

    oracle = _fit_observed(population, counties, truth, draws, seed, "oracle: confidential counts")
    naive_counts = np.maximum(release, 0)
    naive = _fit_observed(
        population, counties, naive_counts, draws, seed, "naive: release as truth, negatives set to 0"
    )

    stacked = post["count"].values.reshape(-1, len(truth))
    med, lo, hi = _interval(stacked)
    noise_lo, noise_hi = mechanism.noise_interval(PROB)
    base_lo, base_hi = release + int(noise_lo), release + int(noise_hi)

    table = pd.DataFrame(
        {
            "county": counties,
            "true": truth,
            "release": release,
            "dpinfer median": med.astype(int),
            "dpinfer 90%": [f"[{a:.0f}, {b:.0f}]" for a, b in zip(lo, hi)],
            "release ± noise 90%": [f"[{a}, {b}]" for a, b in zip(base_lo, base_hi)],
        }
    )
    smallest = table.sort_values("true").head(12)
    print(f"\nTrue counts, the 12 smallest counties of {state} ({PROB:.0%} intervals):")
    print(smallest.to_string(index=False))

    covered = (lo <= truth) & (truth <= hi)
    base_covered = (base_lo <= truth) & (truth <= base_hi)
    naive_exact = release == truth
    print(f"\nCoverage of the {len(truth)} true counts by {PROB:.0%} intervals:")
    print(f"  dpinfer posterior            {covered.sum():4d} / {len(truth)}   mean width {np.mean(hi - lo):6.1f}")
    print(f"  release ± noise interval     {base_covered.sum():4d} / {len(truth)}   mean width {np.mean(base_hi - base_lo):6.1f}")
    print(f"  naive (release taken exact)  {naive_exact.sum():4d} / {len(truth)}   width 0")

    rows = []
    for name in ("mu", "sigma"):
        row = {"parameter": name}
        for label, p in (("dpinfer", post), ("oracle (true counts)", oracle), ("naive (release as truth)", naive)):
            m, a, b = _interval(p[name].values.ravel())
            row[label] = f"{m:.3f} [{a:.3f}, {b:.3f}]"
        rows.append(row)
    print(f"\nHyperparameters, posterior median [{PROB:.0%} interval]:")
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"\ndpinfer.sample took {seconds:.1f} s; method: {idata.posterior.attrs['dpinfer']}")
    return {
        "coverage": float(covered.mean()),
        "baseline_coverage": float(base_covered.mean()),
        "naive_exact": float(naive_exact.mean()),
        "idata": idata,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="dpinfer demo", description=__doc__.splitlines()[0])
    parser.add_argument("--state", default="IL", help="IL, IN, MI, OH or WI (default IL)")
    parser.add_argument("--epsilon", type=float, default=0.25, help="privacy budget per count (default 0.25)")
    parser.add_argument("--draws", type=int, default=500, help="posterior draws (and tuning steps) per chain (default 500)")
    parser.add_argument("--seed", type=int, default=2026, help="random seed (default 2026)")
    args = parser.parse_args(argv)
    run(state=args.state, epsilon=args.epsilon, draws=args.draws, seed=args.seed)
