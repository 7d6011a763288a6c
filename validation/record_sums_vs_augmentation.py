"""The law of the sum against exact data augmentation where both run (issue 39, Must show 2):
the 5%, 50% and 95% posterior quantiles of every parameter, fitted both ways on the same
release, compared in units of their Monte Carlo standard errors.

Cases (records x ~ N(0, 1) per covariate, y | x ~ N(1 + x'b, 1) with b = 2/sqrt(p) each, one
release per case from the mechanism's own sampler, ``dp.Laplace(1, sensitivity=25 d)`` on the
d released sums; beta ~ N(0, 5)):

* regression, p = 1 and p = 5, both clamped to [-5, 5];
* regression, p = 1, the response clamped hard to [-1.5, 2.5] (the clamp binds on 38% of
  the records: the clamped response's law is far from normal);
* a clamped mean and variance: y ~ N(mu, sigma), mu ~ N(0, 2), sigma ~ HalfNormal(2), truth
  (1, 1.5), ``dp.power_sums(dp.clamp(y, -1, 3), degree=2)`` (the clamp binds on 18% of records);

each at n = 100 and 1,000 records. Data augmentation (NUTS on the records and the parameters)
is exact; the law of the sum replaces the records by the normal law of their sum. For each
parameter and quantile, z = (law - augmentation) / sqrt(se_law^2 + se_aug^2), the standard
errors ArviZ's quantile MCSE; |z| < 3 is agreement within Monte Carlo error.

Run:  .venv/bin/python validation/record_sums_vs_augmentation.py [--sizes 100 1000] [--draws 2000]
      [--cases CASE ...] [--seed 7] [--out PATH]
      (about 30 minutes on 2 cores, most of it compiling the law's density for each structure
      and data augmentation at p = 5); writes validation/results/record_sums_vs_augmentation.md.
      The long recheck of p = 1 at 1,000 records: ``--sizes 1000 --cases "regression, p = 1"
      --draws 6000 --seed 11 --out validation/results/record_sums_vs_augmentation-p1-long.md``.
      At the crossover (records='auto' takes the law from 300 records): ``--sizes 300 --draws 20000
      --cases "regression, p = 1" "regression, p = 1, response clamped to [-1.5, 2.5]" "clamped
      mean and variance (power sums)" --out validation/results/record_sums_vs_augmentation-300.md``.
      At 10,000 records (about 18 minutes, data augmentation 4-7 minutes a fit): ``--sizes 10000
      --cases "regression, p = 1" "clamped mean and variance (power sums)" "regression, p = 1,
      response clamped to [-1.5, 2.5]" --out validation/results/record_sums_vs_augmentation-10000.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import dpinfer as dp

RESULTS = Path(__file__).parent / "results" / "record_sums_vs_augmentation.md"
SEED = 20261201
QUANTILES = (0.05, 0.5, 0.95)
AGREE = 3.0  # |z| below this: within Monte Carlo error


def regression(n: int, p: int, y_clamp=(-5.0, 5.0), seed: int = SEED):
    """(model, parameter names) for a regression release of ``n`` records with ``p`` covariates."""
    rng = np.random.default_rng([seed, n, p])
    x = rng.normal(size=(n, p))
    b = np.r_[1.0, np.full(p, 2.0 / np.sqrt(p))]
    y = b[0] + x @ b[1:] + rng.normal(size=n)
    d = len(dp.regression_statistic_labels(p))
    mechanism = dp.Laplace(1.0, sensitivity=25.0 * d)
    release = mechanism.release(dp.regression_statistic(dp.clamp(x, -5, 5), dp.clamp(y, *y_clamp)), rng)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 5.0, shape=p + 1)
        xs = pm.Normal("x", 0.0, 1.0, shape=(n, p))
        ys = pm.Normal("y", beta[0] + xs @ beta[1:], 1.0, shape=n)
        mechanism.observe("s", dp.regression_statistic(dp.clamp(xs, -5, 5), dp.clamp(ys, *y_clamp)),
                          observed=release)
    return model, ["beta"]


def mean_and_variance(n: int, seed: int = SEED):
    """(model, parameter names) for a clamped mean and variance (power sums of degree 2)."""
    rng = np.random.default_rng([seed, n, 0])
    y = rng.normal(1.0, 1.5, size=n)
    mechanism = dp.Laplace(1.0, sensitivity=3.0 + 9.0)
    release = mechanism.release(dp.power_sums(dp.clamp(y, -1.0, 3.0), degree=2), rng)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        ys = pm.Normal("y", mu, sigma, shape=n)
        mechanism.observe("s", dp.power_sums(dp.clamp(ys, -1.0, 3.0), degree=2), observed=release)
    return model, ["mu", "sigma"]


CASES = {
    "regression, p = 1": lambda n: regression(n, 1),
    "regression, p = 5": lambda n: regression(n, 5),
    "regression, p = 1, response clamped to [-1.5, 2.5]": lambda n: regression(n, 1, (-1.5, 2.5)),
    "clamped mean and variance (power sums)": mean_and_variance,
}


def fit(model, records: str, draws: int, seed: int) -> tuple:
    """(posterior, seconds, the convergence summary) of one fit by ``records``."""
    start = time.perf_counter()
    idata = dp.sample(draws, tune=1000, chains=2, random_seed=seed, progressbar=False, records=records, model=model)
    seconds = time.perf_counter() - start
    return idata.posterior, seconds, json.loads(idata.posterior.attrs["dpinfer_convergence"])


def compare(law, augmented, names) -> list[dict]:
    """One row per parameter element and quantile: both values, their MCSEs and z."""
    rows = []
    for name in names:
        a, b = law[name], augmented[name]
        for index in np.ndindex(a.shape[2:]):
            label = f"{name}[{', '.join(map(str, index))}]" if index else name
            xa, xb = a.values[(slice(None), slice(None), *index)], b.values[(slice(None), slice(None), *index)]
            for q in QUANTILES:
                qa, qb = np.quantile(xa, q), np.quantile(xb, q)
                sa = float(az.mcse(xa, method="quantile", prob=q))
                sb = float(az.mcse(xb, method="quantile", prob=q))
                rows.append({"parameter": label, "q": q, "law": qa, "augmentation": qb, "se_law": sa, "se_aug": sb,
                             "z": (qa - qb) / np.hypot(sa, sb)})
    return rows


def run_study(sizes=(100, 1000), draws: int = 2000, cases=tuple(CASES), seed: int = 7,
              out: Path | None = None) -> list[dict]:
    """Every case at every size; the report (``out``) rewritten after each, so that a failed or
    stopped run keeps what it measured."""
    results = []
    for case in cases:
        for n in sizes:
            model, names = CASES[case](n)
            law, t_law, c_law = fit(model, "law-of-the-sum", draws, seed)
            augmented, t_aug, c_aug = fit(model, "data-augmentation", draws, seed)
            rows = compare(law, augmented, names)
            worst = max(abs(r["z"]) for r in rows)
            print(f"{case}, n = {n}: max |z| {worst:.2f}; law {t_law:.0f} s, augmentation {t_aug:.0f} s", flush=True)
            results.append({"case": case, "n": n, "rows": rows, "seconds": (t_law, t_aug),
                            "converged": (c_law["converged"], c_aug["converged"]),
                            "ess": (c_law.get("min_ess_bulk"), c_aug.get("min_ess_bulk"))})
            if out is not None:
                write_report(results, draws, seed, out)
    return results


def write_report(results: list[dict], draws: int, seed: int, path: Path | None = RESULTS) -> str:
    lines = [
        "# The law of the sum against exact data augmentation",
        "",
        "Generated by `validation/record_sums_vs_augmentation.py` (issue 39, Must show 2). Each case:",
        f"one release, fitted both ways (2 chains x {draws} draws after 1000 tuning, seed {seed}). z = (law -",
        f"augmentation) / sqrt(se_law^2 + se_aug^2) with ArviZ's quantile MCSEs; |z| < {AGREE:.0f} is",
        "agreement within Monte Carlo error. Verdicts are dp.sample's (parameters and latents).",
        "",
        "| case | n | max abs z | agree | law: s, verdict, min ESS | augmentation: s, verdict, min ESS |",
        "|---|---:|---:|---|---|---|",
    ]
    for r in results:
        worst = max(abs(row["z"]) for row in r["rows"])
        verdict = ["converged" if c else "NOT converged" for c in r["converged"]]
        ess = [f"{e:.0f}" if e is not None else "" for e in r["ess"]]
        lines.append(f"| {r['case']} | {r['n']:,} | {worst:.2f} | {'yes' if worst < AGREE else 'NO'} "
                     f"| {r['seconds'][0]:.0f} s, {verdict[0]}, {ess[0]} | {r['seconds'][1]:.0f} s, {verdict[1]}, {ess[1]} |")
    lines += ["", "## Every quantile", "",
              "| case | n | parameter | q | law | augmentation | se law | se aug | z |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for row in r["rows"]:
            lines.append(f"| {r['case']} | {r['n']:,} | {row['parameter']} | {row['q']:.2f} | {row['law']:.4f} "
                         f"| {row['augmentation']:.4f} | {row['se_law']:.4f} | {row['se_aug']:.4f} | {row['z']:.2f} |")
    return save_report(lines, path)


def save_report(lines: list[str], path: Path | None) -> str:
    """The report's text (``lines`` joined), written to ``path`` unless it is None."""
    text = "\n".join(lines) + "\n"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE",
                        help=f"cases to run (default all): {list(CASES)}")
    parser.add_argument("--seed", type=int, default=7, help="dp.sample's random_seed (the releases keep theirs)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    results = run_study(args.sizes, args.draws, args.cases, args.seed, args.out)
    print(write_report(results, args.draws, args.seed, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
