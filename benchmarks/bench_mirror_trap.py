"""Chains trapped with the slope's sign reversed (issue 39, Must show 5): how many chains of
many fits end away from the others, by the method records='auto' (or a forced one) takes.

Issue 39's regression (x ~ N(0, 1), y = 1 + 2x + N(0, 1), both clamped to [-5, 5], the five
regression statistics with Laplace noise of sensitivity 125 at epsilon 1, beta ~ N(0, 5)), one
release (numpy seed 5), fitted with dp.sample seeds 0, 1, ... (2 chains each, each fit a new
model object). Under data augmentation a chain can settle with the slope near -2 and stay: its
records would have to leave all together. A chain is "away" when its mean slope is more than 10
posterior sds (the median over fits of the slope's sd) from the median chain's.

    .venv/bin/python benchmarks/bench_mirror_trap.py [--n 1000] [--fits 24] [--records auto] [--draws 500]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pymc as pm

import dpinfer as dp


def release(n: int):
    """(mechanism, released statistics) of the regression of ``n`` records."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 1))
    y = 1 + 2 * x[:, 0] + rng.normal(size=n)
    mechanism = dp.Laplace(1.0, sensitivity=125.0)
    return mechanism, mechanism.release(dp.regression_statistic(dp.clamp(x, -5, 5), dp.clamp(y, -5, 5)), rng)


def fit(n: int, mechanism, statistics, seed: int, records: str, draws: int) -> dict:
    """One fit: each chain's mean and sd of the slope, the verdict, the method and seconds."""
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 5.0, shape=2)
        xs = pm.Normal("x", 0.0, 1.0, shape=(n, 1))
        ys = pm.Normal("y", beta[0] + xs @ beta[1:], 1.0, shape=n)
        mechanism.observe("s", dp.regression_statistic(dp.clamp(xs, -5, 5), dp.clamp(ys, -5, 5)), observed=statistics)
    start = time.perf_counter()
    idata = dp.sample(draws, tune=draws, chains=2, random_seed=seed, progressbar=False, records=records, model=model)
    slope = idata.posterior["beta"].values[:, :, 1]
    verdict = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    entry = json.loads(idata.posterior.attrs["dpinfer"])["s"]
    method = entry["records"].split(":")[0] if "records" in entry else entry["method"].split(":")[0]
    return {"seed": seed, "means": slope.mean(axis=1), "sd": float(slope.std()), "converged": verdict["converged"],
            "modes": "chains_in_different_modes" in verdict, "method": method,
            "seconds": time.perf_counter() - start}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--fits", type=int, default=24)
    parser.add_argument("--records", default="auto", choices=("auto", "law-of-the-sum", "data-augmentation"))
    parser.add_argument("--draws", type=int, default=500, help="draws and tuning steps per chain")
    args = parser.parse_args(argv)
    for name, least in (("n", 2), ("fits", 1), ("draws", 10)):
        if getattr(args, name) < least:
            parser.error(f"--{name} must be at least {least}, got {getattr(args, name)}")
    mechanism, statistics = release(args.n)
    fits = []
    for seed in range(args.fits):
        result = fit(args.n, mechanism, statistics, seed, args.records, args.draws)
        fits.append(result)
        print(f"seed {seed}: {result['method']}, {result['seconds']:.1f} s, chain means of the slope "
              f"{np.round(result['means'], 3).tolist()}, {'converged' if result['converged'] else 'NOT converged'}"
              f"{', chains in different modes' if result['modes'] else ''}", flush=True)
    means = np.concatenate([f["means"] for f in fits])
    centre = np.median(means)
    sd = np.median([f["sd"] for f in fits])
    away = np.abs(means - centre) > 10 * sd
    rest = [f["seconds"] for f in fits[1:]] or [fits[0]["seconds"]]
    print(f"n = {args.n:,}, records={args.records!r}, 2 chains x {args.draws} + {args.draws} draws: {away.sum()} of "
          f"{len(means)} chains away (more than 10 x {sd:.3f} from the median chain's slope {centre:.3f}); "
          f"{sum(f['converged'] for f in fits)} of {len(fits)} fits converged; seconds a fit: first "
          f"{fits[0]['seconds']:.1f}, median of the rest {np.median(rest):.1f}")


if __name__ == "__main__":
    main()
