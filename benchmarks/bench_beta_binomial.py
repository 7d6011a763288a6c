"""ESS per second: dpinfer.sample vs PyMC's default treatment of a privatised binomial count.

Model:  theta ~ Beta(10, 10);  x ~ Binomial(1000, theta);  release s = x + DoubleGeometric(eps = 0.1),
observed s = 612.

* dpinfer.sample: the compiled exact Gibbs engine (x drawn exactly given theta, with exact
  geometric tails beyond its window; then NUTS transitions of theta given x, compiled).
* plain pm.sample: PyMC's default step assignment, NUTS on theta and Metropolis on the integer x.

Both compile once in a warm-up call; then each is timed on ``--repeats`` runs of the same size
(2 chains, sequential, so the figure is compute, not parallelism; seeds differ per run).
Reported per run and as medians: bulk ESS (arviz) of theta and x, wall seconds, ESS/s and the
ratio of the medians, and the posterior mean/sd of theta (first run) against the exact values
computed here by enumeration: p(x | s) ∝ BetaBinomial(x; 1000, 10, 10) f(s - x), f the double
geometric pmf, and E[theta | x] = (10 + x)/1020, Var[theta | x] = (10 + x)(1010 - x)/(1020^2 1021).

Run:  .venv/bin/python benchmarks/bench_beta_binomial.py [--repeats 5]   (or `make bench`)
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

import arviz as az
import numpy as np
import pymc as pm
from scipy import stats

from dpinfer.inference import sample
from dpinfer.mechanisms.geometric import DoubleGeometric

A, B, N, EPSILON, RELEASE = 10.0, 10.0, 1000, 0.1, 612


def build_model():
    mech = DoubleGeometric(epsilon=EPSILON)
    with pm.Model() as model:
        theta = pm.Beta("theta", A, B)
        x = pm.Binomial("x", n=N, p=theta)
        mech.observe("s", x, observed=np.int64(RELEASE))
    return model, mech


def exact_theta_moments(mech) -> tuple[float, float]:
    """Posterior mean and sd of theta by enumerating x = 0..N (the noise pmf is positive
    everywhere, so every x contributes; no window is needed)."""
    xs = np.arange(N + 1)
    logw = stats.betabinom.logpmf(xs, N, A, B) + mech.log_likelihood(np.full(N + 1, RELEASE), xs)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    a, b = A + xs, B + N - xs
    mean_x = a / (a + b)
    var_x = a * b / ((a + b) ** 2 * (a + b + 1))
    mean = float(np.sum(w * mean_x))
    var = float(np.sum(w * (var_x + mean_x**2)) - mean**2)
    return mean, var**0.5


def run_dpinfer(model, draws, tune, seed):
    return sample(draws, tune=tune, chains=2, cores=1, model=model, random_seed=seed, progressbar=False)


def run_pymc(model, draws, tune, seed):
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # dpinfer's "use dpinfer.sample" advice
        return pm.sample(draws, tune=tune, chains=2, cores=1, random_seed=seed, progressbar=False)


def measure(run, model, draws, tune, seed) -> dict:
    t0 = time.perf_counter()
    idata = run(model, draws, tune, seed)
    seconds = time.perf_counter() - t0
    ess = az.ess(idata, var_names=["theta", "x"], method="bulk").to_dataset()
    theta = idata.posterior.to_dataset()["theta"].values
    return {
        "seconds": seconds,
        "ess_theta": float(ess["theta"]),
        "ess_x": float(ess["x"]),
        "mean": float(theta.mean()),
        "sd": float(theta.std()),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)

    model, mech = build_model()
    exact_mean, exact_sd = exact_theta_moments(mech)
    print(f"Beta-binomial: theta ~ Beta({A:g}, {B:g}), x ~ Binomial({N}, theta), "
          f"release {RELEASE} = x + DoubleGeometric(epsilon={EPSILON})")
    print(f"exact posterior of theta (enumeration over x): mean {exact_mean:.4f}, sd {exact_sd:.4f}")
    print(f"timed runs: {args.repeats} x 2 chains x ({args.tune} tune + {args.draws} draws), "
          "sequential; compiles warmed first")

    results = {}
    for name, run in (("dpinfer.sample", run_dpinfer), ("pm.sample (NUTS + Metropolis)", run_pymc)):
        run(model, 100, 100, args.seed + 1)  # warm-up: compile
        runs = [measure(run, model, args.draws, args.tune, args.seed + 10 * r)
                for r in range(args.repeats)]
        for r in runs:
            r["ess_per_s_theta"] = r["ess_theta"] / r["seconds"]
            r["ess_per_s_x"] = r["ess_x"] / r["seconds"]
        results[name] = {k: (float(np.median([r[k] for r in runs])) if k not in ("mean", "sd")
                             else runs[0][k]) for k in runs[0]}

    header = f"{'method':32s} {'seconds':>8s} {'ESS theta':>10s} {'ESS x':>8s} {'ESS/s theta':>12s} {'ESS/s x':>9s} {'mean':>7s} {'sd':>7s}"
    print(f"\nmedians over {args.repeats} runs\n" + header)
    for name, r in results.items():
        print(f"{name:32s} {r['seconds']:8.3f} {r['ess_theta']:10.0f} {r['ess_x']:8.0f} "
              f"{r['ess_per_s_theta']:12.1f} {r['ess_per_s_x']:9.1f} {r['mean']:7.4f} {r['sd']:7.4f}")
    print(f"{'exact':32s} {'':8s} {'':10s} {'':8s} {'':12s} {'':9s} {exact_mean:7.4f} {exact_sd:7.4f}")
    ours, theirs = results.values()
    print(f"\nESS/s ratio dpinfer / PyMC default: theta {ours['ess_per_s_theta'] / theirs['ess_per_s_theta']:.1f}x, "
          f"x {ours['ess_per_s_x'] / theirs['ess_per_s_x']:.1f}x")
    return results


if __name__ == "__main__":
    main()
