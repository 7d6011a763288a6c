"""The law of the sum against the exact posterior by importance sampling, where data
augmentation cannot serve as the reference (issue 39, Must show 2: p = 5 and p = 10).

Data augmentation is exact but at p = 5 its chains mix too slowly to be a reference (bulk ESS
22-53 in 2 x 2,000 draws: ``validation/results/record_sums_vs_augmentation.md``). The exact
posterior has another route that needs neither records nor the normal law:

    p(beta | s) ∝ p(beta) L(beta),   L(beta) = E[ prod_j Laplace(s_j - T_j; b) ],

the expectation over the true statistic T = sum_i t(x_i, y_i) of n records drawn from the
records' model at beta. Its Monte Carlo average over M simulated data sets (each n records,
clamped, summed: this script's own simulation, no dpinfer code; tests/test_record_sums_importance.py
checks it against dp.regression_statistic)
is an unbiased estimate of L(beta), so self-normalised importance sampling with it in the
weights is consistent (a pseudo-marginal estimate: A. Doucet, M. K. Pitt, G. Deligiannidis,
R. Kohn, "Efficient implementation of Markov chain Monte Carlo when using an unbiased
likelihood estimator", Biometrika 102, 2015). The proposal is a multivariate t (``DF`` degrees
of freedom) centred at the law's posterior mean with its covariance times ``INFLATE``^2;
weights w_k = p(beta_k) L_hat(beta_k) / q(beta_k). Where the proposal misses part of the
posterior the weights' effective sample size shows it.

Each case: one release (the same as ``record_sums_vs_augmentation.py``'s, same seed), fitted
by the law of the sum (2 chains x 2,000 draws after 1,000 tuning, seed 7); the 5%, 50% and
95% quantiles of every coefficient against the weighted quantiles, z = (law - exact) /
sqrt(se_law^2 + se_exact^2), se_law ArviZ's quantile MCSE and se_exact the bootstrap sd of
the weighted quantile over the proposals (``BOOTSTRAP`` resamples); |z| < 3 is agreement.
p = 1 at 1,000 records, where data augmentation converged, checks the reference itself.

Run:  .venv/bin/python validation/record_sums_importance.py [--cases p1 p5 p10] [--proposals 8000]
      [--seed 7] [--out PATH]  (about 35 minutes, 20 of them p = 1's 2,000 data sets per proposal);
      writes validation/results/record_sums_importance.md. The cases ``p5-10k`` and ``p10-10k``
      (10,000 records) cost ten times as much a proposal: their reports,
      validation/results/record_sums_importance-10000-p5.md and ``-10000-p10.md``, are from
      ``--cases p5-10k --proposals 4000 --out ...-p5.md`` and ``--cases p10-10k --proposals 8000
      --out ...-p10.md`` run side by side with OPENBLAS_NUM_THREADS=1 (about 25 and 40 minutes;
      the p = 10 report pools that run with one at ``--seed 8``). Runs are not bit-reproducible across
      processes (the law's chains differ in the last digits with the floating-point order), so
      each run is an independent replicate; ``--pool REPORT ...`` prints each quantile's difference
      averaged over such runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
from scipy import stats
from scipy.special import logsumexp

import dpinfer as dp

sys.path.insert(0, str(Path(__file__).parent))
from record_sums_vs_augmentation import AGREE, QUANTILES, regression, save_report  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "record_sums_importance.md"
DF, INFLATE = 7, 1.2  # the proposal: multivariate t, the law's posterior covariance x INFLATE^2
BOOTSTRAP = 200
CASES = {  # name: (n records, p covariates, simulated data sets per proposal)
    "p1": (1000, 1, 2000),
    "p5": (1000, 5, 200),
    "p10": (1000, 10, 100),
    "p5-10k": (10_000, 5, 200),  # Must show 2's 10^4 records (10 times the cost a proposal)
    "p10-10k": (10_000, 10, 100),
}
PRIOR_SD = 5.0  # beta ~ N(0, 5): regression()'s prior
CLAMP = (-5.0, 5.0)


def simulated_statistics(beta: np.ndarray, n: int, sets: int, rng: np.random.Generator) -> np.ndarray:
    """(sets, d): the regression statistic of ``sets`` data sets of n records each, x ~ N(0, I_p),
    y | x ~ N(beta_0 + x'beta_1:, 1), both clamped to CLAMP (the release's records' model), in
    ``dp.regression_statistic``'s order."""
    p = beta.size - 1
    raw = rng.standard_normal((sets, n, p))  # the unclamped covariates behind the response
    x = np.clip(raw, *CLAMP)
    y = np.clip(beta[0] + raw @ beta[1:] + rng.standard_normal((sets, n)), *CLAMP)
    design = np.concatenate([np.ones((sets, n, 1)), x], axis=2)
    transposed = design.transpose(0, 2, 1)
    gram = transposed @ design  # batched matrix products (BLAS), not einsum's loops
    rows, cols = np.tril_indices(p + 1, k=-1)
    diagonal = np.arange(1, p + 1)
    return np.concatenate([(transposed @ y[:, :, None])[:, :, 0], np.sum(y * y, axis=1)[:, None],
                           gram[:, rows, cols], gram[:, diagonal, diagonal]], axis=1)


def log_likelihood(beta, release, scale, n, sets, rng) -> float:
    """log of the Monte Carlo estimate of L(beta) (module docstring) from ``sets`` data sets."""
    t = simulated_statistics(beta, n, sets, rng)
    log_density = np.sum(-np.log(2.0 * scale) - np.abs(release - t) / scale, axis=1)
    return float(logsumexp(log_density) - np.log(sets))


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, q * cumulative[-1])])


def run_case(name: str, proposals: int, seed: int = 7) -> dict:
    n, p, sets = CASES[name]
    model, _ = regression(n, p)
    release = np.asarray(model.rvs_to_values[model["s"]].eval(), dtype=float)
    mechanism = dp.Laplace(1.0, sensitivity=25.0 * release.size)
    start = time.perf_counter()
    idata = dp.sample(2000, tune=1000, chains=2, random_seed=seed, progressbar=False, records="law-of-the-sum",
                      model=model)
    law_seconds = time.perf_counter() - start
    verdict = json.loads(idata.posterior.attrs["dpinfer_convergence"])
    law = idata.posterior["beta"].values  # (chains, draws, p + 1)
    flat = law.reshape(-1, p + 1)
    centre, cov = flat.mean(axis=0), np.cov(flat.T) * INFLATE**2
    proposal = stats.multivariate_t(centre, cov, df=DF, seed=seed)

    rng = np.random.default_rng([seed, n, p])
    start = time.perf_counter()
    betas = proposal.rvs(size=proposals).reshape(proposals, p + 1)
    log_w = np.array([stats.norm.logpdf(b, 0.0, PRIOR_SD).sum()
                      + log_likelihood(b, release, mechanism.scale, n, sets, rng) for b in betas])
    log_w -= proposal.logpdf(betas)
    weights = np.exp(log_w - log_w.max())
    is_seconds = time.perf_counter() - start
    ess = float(weights.sum() ** 2 / np.sum(weights**2))

    rows = []
    boot = np.random.default_rng(seed + 1)
    resamples = [boot.integers(0, proposals, proposals) for _ in range(BOOTSTRAP)]
    for j in range(p + 1):
        for q in QUANTILES:
            exact = weighted_quantile(betas[:, j], weights, q)
            se_exact = float(np.std([weighted_quantile(betas[r, j], weights[r], q) for r in resamples]))
            value = float(np.quantile(law[:, :, j], q))
            se_law = float(az.mcse(law[:, :, j], method="quantile", prob=q))
            rows.append({"parameter": f"beta[{j}]", "q": q, "law": value, "exact": exact, "se_law": se_law,
                         "se_exact": se_exact, "z": (value - exact) / np.hypot(se_law, se_exact)})
    worst = max(abs(r["z"]) for r in rows)
    print(f"{name}: n = {n}, p = {p}: max |z| {worst:.2f}; importance ESS {ess:.0f} of {proposals}; "
          f"law {law_seconds:.0f} s, importance sampling {is_seconds:.0f} s", flush=True)
    return {"case": name, "n": n, "p": p, "sets": sets, "proposals": proposals, "ess": ess, "rows": rows,
            "seconds": (law_seconds, is_seconds), "converged": verdict["converged"]}


def write_report(results: list[dict], seed: int, path: Path | None = RESULTS) -> str:
    lines = [
        "# The law of the sum against the exact posterior by importance sampling",
        "",
        "Generated by `validation/record_sums_importance.py` (issue 39, Must show 2). Each case: the release of",
        "`validation/record_sums_vs_augmentation.py`'s regression (same seed), fitted by the law of the sum (2",
        f"chains x 2000 draws after 1000 tuning, seed {seed}), against self-normalised importance sampling with the",
        f"likelihood estimated by simulating the records (multivariate t proposal, {DF} df, the law's covariance",
        f"x {INFLATE}^2). z = (law - exact) / sqrt(se_law^2 + se_exact^2); |z| < {AGREE:.0f} is agreement.",
        "",
        "| n | p | data sets per proposal | proposals | importance ESS | max abs z | agree | law: s, verdict | importance sampling s |",
        "|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in results:
        worst = max(abs(row["z"]) for row in r["rows"])
        lines.append(f"| {r['n']:,} | {r['p']} | {r['sets']} | {r['proposals']} | {r['ess']:.0f} | {worst:.2f} "
                     f"| {'yes' if worst < AGREE else 'NO'} | {r['seconds'][0]:.0f} s, "
                     f"{'converged' if r['converged'] else 'NOT converged'} | {r['seconds'][1]:.0f} |")
    lines += ["", "## Every quantile", "", "| n | p | parameter | q | law | exact | se law | se exact | z |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for row in r["rows"]:
            lines.append(f"| {r['n']:,} | {r['p']} | {row['parameter']} | {row['q']:.2f} | {row['law']:.4f} "
                         f"| {row['exact']:.4f} | {row['se_law']:.4f} | {row['se_exact']:.4f} | {row['z']:.2f} |")
    return save_report(lines, path)


def pooled(paths: list[Path]) -> str:
    """Markdown: each quantile's law - exact averaged over the reports ``paths`` (independent runs:
    other seeds, or the same seed in another process, whose floating-point order differs), z of
    the average with the runs' standard errors combined, and the spread of the runs' differences
    beside those standard errors."""
    rows: dict = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.startswith("## Pooled"):  # a report with its pooled table appended: its own rows end here
                break
            cells = [c.strip() for c in line.split("|")]
            if len(cells) > 9 and cells[3].startswith("beta"):
                key = (cells[1], cells[2], cells[3], cells[4])
                rows.setdefault(key, []).append([float(c) for c in cells[5:9]])
    lines = [f"## Pooled over {len(paths)} runs", "",
             "| n | p | parameter | q | runs | mean law - exact | z of the mean | sd of the runs' differences | "
             "their nominal se (rms) |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (n, p, name, q), values in rows.items():
        law, exact, se_law, se_exact = np.array(values).T
        difference = law - exact
        nominal = np.sqrt(np.mean(se_law**2 + se_exact**2))
        z = difference.mean() / (nominal / np.sqrt(len(values)))
        spread = difference.std(ddof=1) if len(values) > 1 else float("nan")
        lines.append(f"| {n} | {p} | {name} | {q} | {len(values)} | {difference.mean():.4f} | {z:.2f} | {spread:.4f} "
                     f"| {nominal:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["p1", "p5", "p10"], choices=list(CASES),
                        help="default: the 1,000-record cases (p5-10k and p10-10k are the 10,000-record ones)")
    parser.add_argument("--proposals", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=7, help="dp.sample's and the proposals' seed (the releases keep theirs)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--pool", type=Path, nargs="+", metavar="REPORT",
                        help="only pool finished reports (independent runs of the same cases): print the table")
    args = parser.parse_args(argv)
    if args.pool:
        print(pooled(args.pool))
        return 0
    results = []
    for name in args.cases:
        results.append(run_case(name, args.proposals, args.seed))
        write_report(results, args.seed, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
