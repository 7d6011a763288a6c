"""Empirical Bayes where nearly all of a parameter's information is missing: the estimate, its
Monte Carlo error and its approximate posterior sd against the exact marginal posterior, over
many seeds.

The case (``tests/test_empirical_bayes.py``'s, over seeds): N = 200 counts x_i ~ Poisson(e^m),
m ~ N(2, 1), each released with double geometric noise at epsilon = 0.05 (sd ~28). Given the
counts m is pinned (sd ~0.027); given the release it is not (curvature sd 0.216 at the mode):
~98% of its information is missing, where Louis's D - V is mostly Monte Carlo noise
(``dpinfer/inference/empirical_bayes.py``). The exact log marginal posterior of m is a sum over
the counts of one-dimensional sums over each count's values (0 .. 99: the Poisson's mass beyond
99 at the rates that matter is below 1e-40), maximised by a bounded scalar search; its curvature
sd by a central difference.

Per seed, ``dp.sample(inference="empirical-bayes", chains=2)`` at its defaults gives the
estimate, its Monte Carlo error and its approximate posterior sd. Over the seeds:

* the estimate's error in exact sds (mean, and its standard error over seeds): unbiased within
  its error if the average finds the mode and not the root of the smoothed score;
* sum over seeds of (error / reported Monte Carlo error)^2 against chi-square with as many
  degrees of freedom (a calibrated error gives that law); the RMS ratio beside it;
* the reported sd over the exact curvature sd (mean, range).

Run:  .venv/bin/python validation/eb_missing_information.py [--seeds 1-16]
Writes validation/results/eb_missing_information.md.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
from scipy import optimize, special, stats

import dpinfer as dp

N, EPSILON, RELEASE_SEED = 200, 0.05, 4
SUPPORT = np.arange(100)
RESULTS = Path(__file__).resolve().parent / "results" / "eb_missing_information.md"


def case():
    """(model, exact mode, exact curvature sd at the mode) of the module docstring's case."""
    rng = np.random.default_rng(RELEASE_SEED)
    mechanism = dp.DoubleGeometric(epsilon=EPSILON)
    release = mechanism.release(rng.poisson(7.0, size=N), rng=rng)
    with pm.Model() as model:
        m = pm.Normal("m", 2.0, 1.0)
        x = pm.Poisson("x", mu=pm.math.exp(m), shape=N)
        mechanism.observe("r", x, observed=release)
    noise = np.array([mechanism.log_likelihood(np.array([r]), np.array([v])) for r in release for v in SUPPORT])
    noise = noise.reshape(N, SUPPORT.size)

    def log_marginal(m):
        return stats.norm.logpdf(m, 2.0, 1.0) + special.logsumexp(
            stats.poisson.logpmf(SUPPORT, np.exp(m))[None, :] + noise, axis=1).sum()

    mode = optimize.minimize_scalar(lambda v: -log_marginal(v), bounds=(0.5, 3.5), method="bounded",
                                    options={"xatol": 1e-10}).x
    h = 1e-3
    curvature = -(log_marginal(mode + h) - 2 * log_marginal(mode) + log_marginal(mode - h)) / h**2
    return model, float(mode), float(1.0 / np.sqrt(curvature))


def study(seeds) -> dict:
    """Every seed's estimate against the exact mode, and the summary of the module docstring."""
    model, mode, sd = case()
    rows = []
    started = time.perf_counter()
    for seed in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = dp.sample(model=model, draws=20, tune=10, chains=2, random_seed=seed, progressbar=False,
                              inference="empirical-bayes")
        entry = json.loads(idata.posterior.attrs["dpinfer_empirical_bayes"])
        estimate, mc_se = entry["parameters"]["m"], entry["mc_se"]["m"]
        rows.append({"seed": seed, "estimate": estimate, "mc_se": mc_se, "posterior_sd": entry["posterior_sd"]["m"],
                     "conditional_sd": entry["conditional_sd"]["m"], "iterations": entry["iterations"],
                     "settled": entry["settled"], "error_in_sd": (estimate - mode) / sd,
                     "error_in_mc_se": (estimate - mode) / mc_se})
    error = np.array([r["error_in_sd"] for r in rows])
    z = np.array([r["error_in_mc_se"] for r in rows])
    ratio = np.array([r["posterior_sd"] for r in rows]) / sd
    chi2 = float(np.sum(z**2))
    return {"mode": mode, "sd": sd, "rows": rows, "seconds": time.perf_counter() - started,
            "mean_error": float(error.mean()), "mean_error_se": float(error.std(ddof=1) / np.sqrt(len(error))),
            "chi2": chi2, "chi2_p": float(stats.chi2.sf(chi2, len(z))), "rms_z": float(np.sqrt(np.mean(z**2))),
            "sd_ratio_mean": float(ratio.mean()), "sd_ratio_se": float(ratio.std(ddof=1) / np.sqrt(len(ratio))),
            "sd_ratio_range": (float(ratio.min()), float(ratio.max())),
            "missing": float(1 - np.mean([r["conditional_sd"] for r in rows]) ** 2 / sd**2)}


def report(result: dict) -> list[str]:
    rows = result["rows"]
    lines = [
        "# Empirical Bayes where nearly all of a parameter's information is missing",
        "",
        "Written by `validation/eb_missing_information.py` (its docstring has the case and the method): "
        f"{len(rows)} seeds, {result['seconds']:.0f} s. Exact marginal posterior of m: mode "
        f"{result['mode']:.4f}, curvature sd {result['sd']:.4f}; {100 * result['missing']:.1f}% of m's "
        "information missing given the counts.",
        "",
        f"- estimate's error: mean {result['mean_error']:+.3f} exact sds (standard error over seeds "
        f"{result['mean_error_se']:.3f})",
        f"- error / reported Monte Carlo error: RMS {result['rms_z']:.2f}; sum of squares {result['chi2']:.1f} on "
        f"{len(rows)} degrees of freedom, p = {result['chi2_p']:.3f}",
        f"- reported posterior sd / exact: mean {result['sd_ratio_mean']:.2f} (standard error "
        f"{result['sd_ratio_se']:.2f}), range "
        f"{result['sd_ratio_range'][0]:.2f}-{result['sd_ratio_range'][1]:.2f}",
        "",
        "| seed | estimate | Monte Carlo error | error / exact sd | error / Monte Carlo error | reported sd | "
        "iterations | settled |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r['seed']} | {r['estimate']:.4f} | {r['mc_se']:.4f} | {r['error_in_sd']:+.3f} | "
              f"{r['error_in_mc_se']:+.2f} | {r['posterior_sd']:.4f} | {r['iterations']} | {r['settled']} |"
              for r in rows]
    return lines


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    try:
        seeds = list(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds must be N or N-M (whole numbers), got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"--seeds {text!r} names no seed")
    return seeds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=_seeds, default=_seeds("1-16"))
    args = parser.parse_args(argv)
    lines = report(study(args.seeds))
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
