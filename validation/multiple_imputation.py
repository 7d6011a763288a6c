"""Multiple imputation (Rubin's rules) from dp.sample draws against the full posterior: coverage
of 90% intervals for a total and a share over replications drawn from the prior.

Model (a gallery-style hierarchical Poisson model, 20 cells with fixed exposures e_i):

    mu ~ Normal(-2, 0.5),  sigma ~ HalfNormal(0.5),  z_i ~ Normal(0, 1),
    mu_i = e_i exp(mu + sigma z_i),  x_i ~ Poisson(mu_i),  release s = x + DoubleGeometric(0.5).

Per replication: (mu, sigma, z, x) drawn from the prior, s released, the model fitted with
dp.sample (the compiled engine; the release is pm.Data, so one compilation serves every
replication). Two estimands per quantity, which differ:

* realised (finite population): the total S = sum x_i, the share R = X_G / S of the group G
  (the first 5 cells);
* expected (Poisson superpopulation, given the cells' means): Lambda = sum mu_i and
  rho = sum_G mu_i / Lambda.

Intervals (90%): the full posterior's equal-tailed intervals of S, Lambda, R and rho (draws of
sum x, sum mu, ...), and Rubin's rules on M = 20 imputations (posterior draws of x,
``dpinfer.utility.imputation.imputations``) with two complete-data analyses: variance 0
(``estimand="realised"``: the complete data know S exactly) and the Poisson / multinomial
variance (``estimand="expected"``: Var(sum x) = sum mu estimated by sum x; p (1 - p) / N for
the share), whose estimand is Lambda (rho). Each interval's coverage is reported for both
estimands of its quantity.

Run:  .venv/bin/python validation/multiple_imputation.py [--reps 100] [--m 20] [--out PATH]
(about 30 s for R = 100 once compiled). Writes a markdown table (default
validation/results/multiple_imputation.md).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
from scipy import stats

import dpinfer as dp
from dpinfer.utility.imputation import imputations, rubin, share_analysis, total_analysis

SEED = 20261125
N_CELLS = 20
GROUP = np.arange(5)  # the share's group G: the first 5 cells
EPSILON = 0.5
PROB = 0.9
EXPOSURE = np.random.default_rng(SEED).uniform(20.0, 200.0, N_CELLS)
OUT = Path(__file__).parent / "results" / "multiple_imputation.md"


def build(mechanism) -> pm.Model:
    with pm.Model(coords={"cell": np.arange(N_CELLS)}) as model:
        s_data = pm.Data("s_data", np.zeros(N_CELLS, dtype="int64"))
        mu = pm.Normal("mu", -2.0, 0.5)
        sigma = pm.HalfNormal("sigma", 0.5)
        z = pm.Normal("z", 0.0, 1.0, dims="cell")
        x = pm.Poisson("x", EXPOSURE * pm.math.exp(mu + sigma * z), dims="cell")
        mechanism.observe("release", x, observed=s_data, dims="cell")
    return model


def draw_truth(rng) -> dict:
    mu = rng.normal(-2.0, 0.5)
    sigma = abs(rng.normal(0.0, 0.5))
    means = EXPOSURE * np.exp(mu + sigma * rng.normal(size=N_CELLS))
    return {"means": means, "x": rng.poisson(means)}


def _eti(draws) -> tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - PROB) / 2, (1 + PROB) / 2])
    return float(lo), float(hi)


def one_replication(model, mechanism, rng, m: int, draws: int) -> dict:
    truth = draw_truth(rng)
    x, means = truth["x"], truth["means"]
    pm.set_data({"s_data": mechanism.release(x, rng)}, model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = dp.sample(draws, tune=draws, chains=2, random_seed=int(rng.integers(2**31)),
                          progressbar=False, model=model)
    post = idata.posterior
    xs = post["x"].values.reshape(-1, N_CELLS)
    mus = (EXPOSURE * np.exp(post["mu"].values.reshape(-1, 1)
                             + post["sigma"].values.reshape(-1, 1) * post["z"].values.reshape(-1, N_CELLS)))
    targets = {"total": (x.sum(), means.sum()),
               "share": (x[GROUP].sum() / x.sum(), means[GROUP].sum() / means.sum())}
    with np.errstate(invalid="ignore", divide="ignore"):
        posterior_draws = {
            "total": (xs.sum(1), mus.sum(1)),
            "share": (xs[:, GROUP].sum(1) / xs.sum(1), mus[:, GROUP].sum(1) / mus.sum(1)),
        }
    completed = imputations(idata, "x", m, rng)
    analyses = {
        "total": {e: rubin(*total_analysis(completed, estimand=e)) for e in ("realised", "expected")},
        "share": {e: rubin(*share_analysis(completed, GROUP, estimand=e)) for e in ("realised", "expected")},
    }
    out = {"held": json.loads(post.attrs["dpinfer"])["x"].get("held_cells_after_tuning", 0)}
    for quantity in ("total", "share"):
        realised, expected = targets[quantity]
        intervals = {
            "posterior of the realised": _eti(posterior_draws[quantity][0]),
            "posterior of the expected": _eti(posterior_draws[quantity][1]),
            "Rubin, complete-data variance 0": analyses[quantity]["realised"].interval(PROB),
            "Rubin, Poisson/multinomial variance": analyses[quantity]["expected"].interval(PROB),
        }
        for name, (lo, hi) in intervals.items():
            out[(quantity, name)] = (lo <= realised <= hi, lo <= expected <= hi, hi - lo)
        out[(quantity, "lam")] = analyses[quantity]["expected"].lam
        out[(quantity, "df")] = analyses[quantity]["expected"].df
    return out


def run(reps: int, m: int, draws: int, seed: int) -> tuple[str, float]:
    mechanism = dp.DoubleGeometric(epsilon=EPSILON)
    model = build(mechanism)
    start = time.perf_counter()
    results = [one_replication(model, mechanism, np.random.default_rng([seed, r]), m, draws)
               for r in range(reps)]
    seconds = time.perf_counter() - start
    command = f"validation/multiple_imputation.py --reps {reps} --m {m} --draws {draws} --seed {seed}"
    return report(results, reps, m, draws, seed, seconds, command), seconds


def report(results, reps, m, draws, seed, seconds, command="") -> str:
    half_band = stats.norm.ppf(0.975) * np.sqrt(PROB * (1 - PROB) / reps)
    lines = [
        "# Multiple imputation from dp.sample draws vs the full posterior",
        "",
        "Generated by `validation/multiple_imputation.py`. Hierarchical Poisson model with "
        f"{N_CELLS} cells (exposures 20-200; mu ~ N(-2, 0.5), sigma ~ HalfNormal(0.5)), release "
        f"by DoubleGeometric({EPSILON}); per replication the parameters and counts are drawn from "
        f"the prior, released and fitted by dp.sample ({draws} draws and {draws} tuning steps, 2 "
        f"chains). Rubin's rules on M = {m} imputations (posterior draws of the counts spread over "
        f"the chains), t intervals with Barnard-Rubin degrees of freedom (complete-data df "
        f"infinite, so Rubin's 1987 nu). {PROB:.0%} intervals; share = the first 5 cells' share of "
        "the total.",
        "",
        f"R = {reps} replications, seed {seed}, {seconds:.0f} s. Monte Carlo band for a coverage of "
        f"{PROB:.2f}: ± {half_band:.3f} (95%). Held cells after tuning (compiled engine), summed "
        f"over replications: {sum(r['held'] for r in results)}." + (f" Command: `{command}`." if command else ""),
        "",
        "Estimands: *realised* = the total S = sum x_i (share X_G / S) of the counts that exist; "
        "*expected* = Lambda = sum mu_i (share sum_G mu_i / Lambda), the Poisson means of the "
        "cells. Each interval targets one of them (column 3); its coverage of both is shown.",
        "",
        "| quantity | interval | targets | coverage of realised | coverage of expected | mean width |",
        "|---|---|---|---:|---:|---:|",
    ]
    targets = {"posterior of the realised": "realised", "posterior of the expected": "expected",
               "Rubin, complete-data variance 0": "realised",
               "Rubin, Poisson/multinomial variance": "expected"}
    for quantity in ("total", "share"):
        for name, target in targets.items():
            cells = np.array([r[(quantity, name)] for r in results], dtype=float)
            width = f"{cells[:, 2].mean():.1f}" if quantity == "total" else f"{cells[:, 2].mean():.4f}"
            lines.append(f"| {quantity} | {name} | {target} | {cells[:, 0].mean():.2f} | "
                         f"{cells[:, 1].mean():.2f} | {width} |")
    lines += ["", "Poisson/multinomial analyses: mean fraction of the variance due to the noise "
              "(lambda = (1 + 1/M) B / T) and median degrees of freedom:", ""]
    for quantity in ("total", "share"):
        lam = np.array([r[(quantity, "lam")] for r in results])
        df = np.array([r[(quantity, "df")] for r in results])
        widths = {name: np.mean([r[(quantity, name)][2] for r in results])
                  for name in ("posterior of the expected", "Rubin, Poisson/multinomial variance")}
        lines.append(f"* {quantity}: lambda {np.nanmean(lam):.2f}, df {np.nanmedian(df):.0f}; mean width "
                     "of the Rubin interval / of the posterior interval of the expected: "
                     f"{widths['Rubin, Poisson/multinomial variance'] / widths['posterior of the expected']:.2f}")
    lines += [
        "",
        "Reading the table: the realised total and share are known exactly given the complete "
        "data, so their complete-data variance is 0 and Rubin's T reduces to (1 + 1/M) B, the "
        "between-imputation variance (nu = M - 1): an approximation of the posterior interval "
        "of S from M draws. A complete-data Poisson variance (sum x) adds the sampling variance "
        "of the counts themselves around their means: that interval targets the expected total "
        "Lambda (a superpopulation quantity, not the realised S), and for S it is too wide. "
        "The full posterior's interval of S targets S and the posterior interval of Lambda "
        "targets Lambda; the two estimands, and so the intervals, differ by the Poisson "
        "variation of the counts (sd about sqrt(Lambda)), which for totals of a few hundred is "
        "comparable to the noise's.",
        "",
        "The complete-data analyses are saturated (a free mean per cell), while the imputation "
        "model pools the cells through (mu, sigma): the two are uncongenial (Meng 1994). Where "
        "the pooling informs the estimand, the posterior of the expected quantity is narrower "
        "than Rubin's interval with the saturated variance, which then over-covers (Rubin's "
        "rules are conservative when the imputer assumes more than the analyst); where it does "
        "not, the two agree.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100, help="replications (default 100)")
    parser.add_argument("--m", type=int, default=20, help="imputations (default 20)")
    parser.add_argument("--draws", type=int, default=1000, help="draws and tuning steps per chain (default 1000)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed (default {SEED})")
    parser.add_argument("--out", type=Path, default=OUT, help=f"markdown output (default {OUT})")
    args = parser.parse_args(argv)
    text, seconds = run(args.reps, args.m, args.draws, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"written to {args.out} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
