"""Bernstein & Sheldon's Beta-Binomial experiment, side by side (issue 39, Must show 4).

Bernstein & Sheldon, "Differentially Private Bayesian Inference for Exponential Families"
(NeurIPS 2018), release the sufficient statistic of N individuals' Bernoulli(theta) answers,
the count s, with Laplace noise, z = s + Laplace(Delta / epsilon), Delta = 1, and put the prior
theta ~ Beta(10, 10) on the proportion (their code's driver, gbernstein6/private_bayesian_expfam,
Bounded_Suff_Stats/driver.py: N = 1,000, epsilon = 0.1). Their claim is calibration: posterior
beliefs that are right in the non-asymptotic regime, where the naive posterior (the release read
as the count) is not. Each trial here draws theta from the prior, the answers and the release,
so a calibrated method's PIT of the true theta, P(theta' <= theta | z), is uniform (Cook,
Gelman & Rubin 2006) and its central intervals cover at their nominal rate. Methods, all on
the same releases:

* **exact** (the reference): the count enumerated, p(s | z) ∝ BetaBinomial(s; N, 10, 10)
  f(z - s) with f the Laplace density, and theta | z = sum_s p(s | z) Beta(10 + s, 10 + N - s).
* **dpinfer**: the analyst's model as dpinfer's docs write it (theta ~ Beta(10, 10),
  count ~ Binomial(N, theta), ``dp.Laplace(epsilon).observe("release", count, ...)``),
  ``dp.sample`` at its defaults for tune, 2 chains of ``--draws``, a new model object per trial.
* **Gibbs-SS**: Bernstein & Sheldon's sampler as their paper describes it, written here from
  that description: Gibbs on (theta, s, omega) with s real-valued; s | theta, omega, z from the
  central-limit normal N(N theta, N theta (1 - theta)) times N(z; s, omega), truncated to
  [0, N]; the Laplace noise as a scale mixture of normals, 1 / omega | s, z ~
  InverseGaussian(1 / (b |z - s|), 1 / b^2) with b = Delta / epsilon (Park & Casella 2008);
  theta | s ~ Beta(10 + s, 10 + N - s); 500 burn-in and 1,000 kept draws, as in their code.
* **naive**: Beta(10 + z', 10 + N - z'), z' the release clipped to [0, N].
* **non-private**: Beta(10 + s, 10 + N - s) from the confidential count, the floor that privacy
  raises.

Reported per (N, epsilon): coverage of the central 50%, 90% and 95% intervals (a calibrated
method is inside the binomial Monte Carlo band, 99% two-sided, of the number of trials), the
Kolmogorov-Smirnov test of the PITs against uniform, mean 90% width, mean absolute error of the
posterior mean, and for the two samplers their agreement with the exact posterior on each trial:
for q in 5%, 50%, 95%, the fraction of draws below the exact q-quantile, in units of its Monte
Carlo error sqrt(q (1 - q) / ESS) (z; |z| > 4 on a trial is a disagreement beyond Monte Carlo
error), and seconds per fit. The published figures of the paper are plots; their Gibbs-SS is
run here instead of read from them.

Run:  .venv/bin/python validation/bernstein_sheldon.py [--trials 500] [--sizes 10 100 1000 10000]
      [--epsilons 0.01 0.1 1] [--draws 1000] [--seed 20181203] [--out PATH]
      (about 30 minutes on 2 cores at the defaults; 35 minutes beside other work on 2026-12-02);
      writes validation/results/bernstein_sheldon.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
from scipy import optimize, special, stats

import dpinfer as dp

RESULTS = Path(__file__).parent / "results" / "bernstein_sheldon.md"
SEED = 20181203
PRIOR = (10.0, 10.0)
LEVELS = (0.5, 0.9, 0.95)
QUANTILES = (0.05, 0.5, 0.95)
DISAGREE = 4.0  # |z| above this on a trial: beyond Monte Carlo error (about 6e-5 per test if exact)
BAND = 0.99  # coverage band: two-sided binomial probability
GIBBS_BURN, GIBBS_KEEP = 500, 1000
METHODS = ("exact", "dpinfer", "Gibbs-SS", "naive", "non-private")


class ExactPosterior:
    """theta | z for the Beta-Binomial with a Laplace-noised count, by enumerating the count:
    p(s | z) ∝ BetaBinomial(s; N, a, b) exp(-|z - s| / scale), theta | z a mixture of
    Beta(a + s, b + N - s). Components below 1e-15 of the total weight are dropped."""

    def __init__(self, z: float, n: int, scale: float, prior=PRIOR):
        s = np.arange(n + 1)
        log_w = stats.betabinom.logpmf(s, n, *prior) - np.abs(z - s) / scale
        w = np.exp(log_w - special.logsumexp(log_w))
        keep = w > 1e-15
        self.w, self.a, self.b = w[keep] / w[keep].sum(), prior[0] + s[keep], prior[1] + n - s[keep]

    def cdf(self, theta: float) -> float:
        return float(np.sum(self.w * special.betainc(self.a, self.b, theta)))

    def mean(self) -> float:
        return float(np.sum(self.w * self.a / (self.a + self.b)))

    def quantile(self, q: float) -> float:
        return optimize.brentq(lambda t: self.cdf(t) - q, 0.0, 1.0, xtol=1e-13)


def truncated_normal(rng: np.random.Generator, mean: float, sd: float, low: float, high: float) -> float:
    """One draw of N(mean, sd^2) truncated to [low, high] by the inverse CDF, taken in whichever
    tail keeps the normal CDF accurate."""
    a, b = (low - mean) / sd, (high - mean) / sd
    if a > 0:  # the interval lies in the upper tail: draw the mirror image from the lower one
        return mean - sd * truncated_normal(rng, 0.0, 1.0, -b, -a)
    lo, hi = special.ndtr(a), special.ndtr(b)
    u = lo + (hi - lo) * rng.random()
    return mean + sd * float(np.clip(special.ndtri(u), a, b))


def gibbs_ss(z: float, n: int, scale: float, rng: np.random.Generator, prior=PRIOR) -> np.ndarray:
    """Bernstein & Sheldon's Gibbs sampler on (theta, s, omega), GIBBS_KEEP draws of theta after
    GIBBS_BURN (see the module docstring)."""
    s = float(np.clip(z, 0, n))
    theta = (prior[0] + s) / (prior[0] + prior[1] + n)
    draws = np.empty(GIBBS_KEEP)
    for i in range(GIBBS_BURN + GIBBS_KEEP):
        omega = 1.0 / rng.wald(1.0 / (scale * max(abs(z - s), 1e-12)), 1.0 / scale**2)
        clt_var = n * theta * (1.0 - theta)
        precision = 1.0 / clt_var + 1.0 / omega
        mean = (n * theta / clt_var + z / omega) / precision
        s = truncated_normal(rng, mean, precision**-0.5, 0.0, n)
        theta = rng.beta(prior[0] + s, prior[1] + n - s)
        if i >= GIBBS_BURN:
            draws[i - GIBBS_BURN] = theta
    return draws


def dpinfer_fit(z: float, n: int, epsilon: float, draws: int, seed: int) -> tuple[np.ndarray, bool]:
    """(theta's draws, converged) of dp.sample on the analyst's model, a new model object."""
    with pm.Model():
        theta = pm.Beta("theta", *PRIOR)
        count = pm.Binomial("count", n, theta)
        dp.Laplace(epsilon).observe("release", count, observed=z)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = dp.sample(draws, chains=2, random_seed=seed, progressbar=False)
    converged = not any("NOT CONVERGED" in str(w.message) for w in caught)
    return idata.posterior["theta"].values, converged


def ess(draws: np.ndarray) -> float:
    return float(az.ess(draws.reshape(-1, draws.shape[-1]) if draws.ndim > 1 else draws[None, :]))


def run_cell(n: int, epsilon: float, trials: int, draws: int, seed: int) -> dict:
    """Every method on ``trials`` releases at (n, epsilon)."""
    rng = np.random.default_rng([seed, n, int(round(epsilon * 1e6))])
    scale = 1.0 / epsilon
    pit = {m: np.empty(trials) for m in METHODS}
    width = {m: np.empty(trials) for m in METHODS}
    abs_error = {m: np.empty(trials) for m in METHODS}
    z_scores = {m: np.empty((trials, len(QUANTILES))) for m in ("dpinfer", "Gibbs-SS")}
    seconds = {"dpinfer": 0.0, "Gibbs-SS": 0.0, "exact": 0.0}
    esss = {"dpinfer": [], "Gibbs-SS": []}
    not_converged = 0
    for t in range(trials):
        theta = rng.beta(*PRIOR)
        s = rng.binomial(n, theta)
        z = s + rng.laplace(0.0, scale)
        start = time.perf_counter()
        exact = ExactPosterior(z, n, scale)
        exact_q = [exact.quantile(q) for q in QUANTILES]
        lo90, hi90 = exact.quantile(0.05), exact.quantile(0.95)
        seconds["exact"] += time.perf_counter() - start
        pit["exact"][t], width["exact"][t], abs_error["exact"][t] = exact.cdf(theta), hi90 - lo90, abs(exact.mean() - theta)
        conjugate = {"naive": float(np.clip(z, 0, n)), "non-private": float(s)}
        for name, count in conjugate.items():
            law = stats.beta(PRIOR[0] + count, PRIOR[1] + n - count)
            pit[name][t], width[name][t] = law.cdf(theta), law.ppf(0.95) - law.ppf(0.05)
            abs_error[name][t] = abs(law.mean() - theta)
        start = time.perf_counter()
        dp_draws, converged = dpinfer_fit(z, n, epsilon, draws, seed=int(rng.integers(2**31)))
        seconds["dpinfer"] += time.perf_counter() - start
        not_converged += not converged
        start = time.perf_counter()
        gibbs_draws = gibbs_ss(z, n, scale, rng)
        seconds["Gibbs-SS"] += time.perf_counter() - start
        for name, chain_draws in (("dpinfer", dp_draws), ("Gibbs-SS", gibbs_draws)):
            flat = chain_draws.ravel()
            pit[name][t] = np.mean(flat <= theta)
            width[name][t] = np.subtract(*np.quantile(flat, [0.95, 0.05]))
            abs_error[name][t] = abs(flat.mean() - theta)
            e = ess(chain_draws)
            esss[name].append(e)
            for k, (q, xq) in enumerate(zip(QUANTILES, exact_q)):
                z_scores[name][t, k] = (np.mean(flat <= xq) - q) / np.sqrt(q * (1 - q) / e)
    rows = []
    for m in METHODS:
        row = {"N": n, "epsilon": epsilon, "method": m}
        centred = np.abs(pit[m] - 0.5)
        for level in LEVELS:
            row[f"cover {level:.0%}"] = float(np.mean(centred <= level / 2))
        row["KS p"] = float(stats.kstest(pit[m], "uniform").pvalue)
        row["90% width"] = float(np.mean(width[m]))
        row["mean abs error"] = float(np.mean(abs_error[m]))
        if m in z_scores:
            zs = z_scores[m]
            row["max abs z vs exact"] = float(np.max(np.abs(zs)))
            row["trials abs z > 4"] = int(np.sum(np.any(np.abs(zs) > DISAGREE, axis=1)))
            row["mean z (5%, 50%, 95%)"] = ", ".join(f"{v:+.2f}" for v in zs.mean(axis=0))
            row["median ESS"] = float(np.median(esss[m]))
        if m in seconds:
            row["s per fit"] = seconds[m] / trials
        rows.append(row)
    return {"rows": rows, "not_converged": not_converged, "trials": trials}


def coverage_band(trials: int, level: float) -> tuple[float, float]:
    lo, hi = stats.binom.interval(BAND, trials, level)
    return lo / trials, hi / trials


def markdown_table(table: pd.DataFrame) -> str:
    """The table in GitHub markdown, numbers to 4 significant digits, blanks for missing."""
    def cell(v):
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.4g}"
        return str(v)
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def summary(table: pd.DataFrame, trials: int) -> list[str]:
    """One line per method: in how many settings its 90% coverage lies in the band, and for the
    samplers the trials beyond Monte Carlo error of the exact posterior."""
    lo, hi = coverage_band(trials, 0.9)
    lines = []
    for method, rows in table.groupby("method", sort=False):
        inside = int(((rows["cover 90%"] >= lo) & (rows["cover 90%"] <= hi)).sum())
        line = f"- {method}: 90% coverage inside [{lo:.3f}, {hi:.3f}] in {inside} of {len(rows)} settings"
        if "trials abs z > 4" in rows and rows["trials abs z > 4"].notna().all():
            line += (f"; trials with a quantile beyond {DISAGREE:g} Monte Carlo errors of the exact "
                     f"posterior's: {int(rows['trials abs z > 4'].sum())} of {trials * len(rows):,} "
                     f"(largest abs z {rows['max abs z vs exact'].max():.3f})")
        lines.append(line + ".")
    return lines


def write_report(cells: list[dict], args, path: Path | None) -> str:
    table = pd.DataFrame([row for cell in cells for row in cell["rows"]])
    trials = args.trials
    bands = ", ".join(f"{level:.0%}: [{lo:.3f}, {hi:.3f}]" for level in LEVELS
                      for lo, hi in [coverage_band(trials, level)])
    lines = [
        "# Bernstein & Sheldon's Beta-Binomial experiment, side by side",
        "",
        f"`validation/bernstein_sheldon.py --trials {trials} --sizes {' '.join(map(str, args.sizes))} "
        f"--epsilons {' '.join(map(str, args.epsilons))} --draws {args.draws} --seed {args.seed}` "
        f"({time.strftime('%Y-%m-%d')}, this 2-core VM). theta ~ Beta(10, 10), the count of N "
        "Bernoulli(theta) answers released with Laplace noise of scale 1 / epsilon; each trial draws "
        "theta from the prior. Bernstein & Sheldon's own setting (their driver) is N = 1000, "
        "epsilon = 0.1. Methods and measures: the script's docstring.",
        "",
        f"Coverage bands (99% binomial, {trials} trials): {bands}. dpinfer fits reported NOT "
        "CONVERGED: " + ", ".join(f"N = {c['rows'][0]['N']}, eps = {c['rows'][0]['epsilon']}: "
                                  f"{c['not_converged']}" for c in cells) + ".",
        "",
        *summary(table, trials),
        "",
        markdown_table(table),
        "",
    ]
    text = "\n".join(lines)
    if path is not None:
        path.write_text(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.trials < 10 or args.draws < 100:
        parser.error(f"--trials must be >= 10 and --draws >= 100 (got {args.trials}, {args.draws})")
    if min(args.sizes) < 1 or min(args.epsilons) <= 0:
        parser.error(f"--sizes must be >= 1 and --epsilons > 0 (got {args.sizes}, {args.epsilons})")
    cells = []
    for n in args.sizes:
        for epsilon in args.epsilons:
            start = time.perf_counter()
            cells.append(run_cell(n, epsilon, args.trials, args.draws, args.seed))
            worst = cells[-1]["rows"][1]
            print(f"N = {n}, epsilon = {epsilon}: {time.perf_counter() - start:.0f} s; dpinfer cover 90% "
                  f"{worst['cover 90%']:.3f}, max |z| vs exact {worst['max abs z vs exact']:.2f}", flush=True)
            write_report(cells, args, args.out)
    print(write_report(cells, args, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
