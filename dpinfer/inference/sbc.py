"""Simulation-based calibration (SBC) of posterior samplers, exact for integer quantities.

Source: S. Talts, M. Betancourt, D. Simpson, A. Vehtari, A. Gelman, "Validating Bayesian
inference algorithms with simulation-based calibration", arXiv:1804.06788 (2018); the ECDF
test of T. Säilynoja, P.-C. Bürkner, A. Vehtari, "Graphical test for discrete uniformity and
its applications in goodness-of-fit evaluation and multiple sample comparison", Statistics
and Computing 32:32 (2022); inference notes §5.

The idea (Talts et al. §3): draw theta* ~ p(theta), data y ~ p(y | theta*), then L draws
theta_1..theta_L from the sampler's posterior given y. If the sampler is correct, theta* and
the draws are exchangeable draws from p(theta | y), so the position of theta* among them is
uniform on {0, ..., L}, whatever y is.

Integer quantities (true counts) tie with their draws. Plain ranks #{theta_l < theta*} are
then NOT uniform (they pile up at low values), and plain quantile intervals over-cover, so a
correct sampler would fail. Ties are broken at random instead:

    rank = #{l : theta_l < theta*} + U,   U ~ Uniform{0, ..., #{l : theta_l == theta*}},

which is the position of theta* in a uniformly random ordering of the tied values, hence
exactly uniform on {0, ..., L} for exchangeable draws (:func:`randomised_ranks`). From it
the randomised PIT

    u = (rank + V) / (L + 1),   V ~ Uniform(0, 1),

is exactly Uniform(0, 1) (:func:`randomised_pit`). The central interval of probability p
"covers" theta* iff (1 - p)/2 <= u <= (1 + p)/2, which happens with probability exactly p for
a correct sampler (a randomised empirical-quantile interval of the L draws; for continuous
quantities and large L it is the usual central interval).

Across R independent replications the coverage count is Binomial(R, p) exactly, and the R
PIT values are iid Uniform(0, 1). The checks (all for a family-wise false-failure rate set by
``alpha``; a correct sampler fails any check with probability at most that):

* coverage: accepted iff the count lies in the central binomial region
  [binom.ppf(a/2; R, p), binom.isf(a/2; R, p)], a = alpha / (number of coverage checks)
  (Bonferroni over quantities x levels) — the exact version of p ± z sqrt(p(1-p)/R);
* uniformity: two tests per quantity on the PIT values, Bonferroni over quantities x 2:
  - chi-square on B equiprobable bins (B = ``n_bins``, df B - 1);
  - the simultaneous ECDF test of Säilynoja et al. (2022, §2.2): with K evaluation points
    z_k = k/K, R F_hat(z_k) ~ Binomial(R, z_k); the statistic is the smallest two-sided
    binomial tail probability over k, and its null law (hence the p-value) is simulated.

MCMC draws are autocorrelated; ranks are uniform only for (near-)independent draws, so the
driver thins the posterior to L draws and records the bulk ESS of the continuous parameters
(Talts et al. §4.1 recommend thinning to the effective sample size).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd
from scipy import stats

from dpinfer._validation import check_rng

LEVELS = (0.5, 0.9)


# --- ranks and PIT ----------------------------------------------------------------------------
def randomised_ranks(draws, truth, rng: np.random.Generator) -> np.ndarray:
    """Rank of ``truth`` among ``draws`` with ties broken uniformly at random.

    ``draws`` has shape (L, *shape) (L posterior draws along axis 0), ``truth`` shape
    (*shape). Returns int64 ranks in {0, ..., L}:
    rank = #{draws < truth} + Uniform{0, ..., #{draws == truth}} (Talts et al. 2018 §3;
    inference notes §5). Exactly uniform when truth and draws are exchangeable.
    """
    rng = check_rng(rng)
    draws = np.asarray(draws)
    truth = np.asarray(truth)
    if draws.ndim < 1 or draws.shape[0] < 1:
        raise ValueError("draws must have at least one draw along axis 0")
    if draws.shape[1:] != truth.shape:
        raise ValueError(
            f"draws must have shape (L, *truth.shape) = (L, {', '.join(map(str, truth.shape))}); "
            f"got draws {draws.shape} and truth {truth.shape}"
        )
    if np.any(np.isnan(draws)) or np.any(np.isnan(truth)):
        raise ValueError("draws and truth must not contain NaN")
    below = np.sum(draws < truth, axis=0)
    ties = np.sum(draws == truth, axis=0)
    return (below + rng.integers(0, ties + 1)).astype(np.int64)


def randomised_pit(ranks, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """u = (rank + V) / (L + 1), V ~ Uniform(0, 1): exactly Uniform(0, 1) when the ranks are
    uniform on {0, ..., L} (L = ``n_draws``)."""
    rng = check_rng(rng)
    ranks = np.asarray(ranks)
    if n_draws < 1 or np.any(ranks < 0) or np.any(ranks > n_draws):
        raise ValueError(f"ranks must lie in 0..n_draws with n_draws >= 1; n_draws={n_draws}")
    return (ranks + rng.random(ranks.shape)) / (n_draws + 1)


def covers(pit, prob: float) -> np.ndarray:
    """Whether the central interval of probability ``prob`` covers the truth:
    (1 - prob)/2 <= u <= (1 + prob)/2. Probability exactly ``prob`` for uniform u."""
    if not 0 < prob < 1:
        raise ValueError(f"prob must lie strictly between 0 and 1, got {prob!r}")
    pit = np.asarray(pit)
    return (pit >= 0.5 * (1 - prob)) & (pit <= 0.5 * (1 + prob))


# --- tests --------------------------------------------------------------------------------
def coverage_band(n_reps: int, prob: float, alpha: float) -> tuple[float, float]:
    """Acceptance region for an observed coverage fraction over ``n_reps`` independent
    replications: [binom.ppf(alpha/2), binom.isf(alpha/2)] / R for Binomial(R, prob), so a
    correct sampler falls outside with probability <= alpha."""
    if n_reps < 1:
        raise ValueError(f"n_reps must be >= 1, got {n_reps}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    lo = stats.binom.ppf(alpha / 2, n_reps, prob)
    hi = stats.binom.isf(alpha / 2, n_reps, prob)
    return float(lo) / n_reps, float(hi) / n_reps


def chisq_uniformity_pvalue(pit, n_bins: int) -> float:
    """Pearson chi-square test of Uniform(0, 1) on ``n_bins`` equiprobable bins (df = B - 1).
    Needs R / B >= 5 expected counts per bin for the chi-square approximation."""
    pit = np.asarray(pit, dtype=float).ravel()
    if n_bins < 2:
        raise ValueError(f"n_bins must be >= 2, got {n_bins}")
    if pit.size < 5 * n_bins:
        raise ValueError(
            f"chi-square needs >= 5 expected counts per bin: {pit.size} values for {n_bins} bins"
        )
    counts = np.bincount(np.minimum((pit * n_bins).astype(int), n_bins - 1), minlength=n_bins)
    return float(stats.chisquare(counts).pvalue)


def _ecdf_min_tail(counts: np.ndarray, n: int, z: np.ndarray) -> np.ndarray:
    """min_k 2 min(P(X <= c_k), P(X >= c_k)) for X ~ Binomial(n, z_k); counts (..., K)."""
    lower = stats.binom.cdf(counts, n, z)
    upper = stats.binom.sf(counts - 1, n, z)
    return np.min(np.minimum(1.0, 2.0 * np.minimum(lower, upper)), axis=-1)


_ECDF_NULL: dict = {}


def ecdf_uniformity_pvalue(pit, n_points: int = 20, n_sim: int = 20_000, seed: int = 20220322) -> float:
    """Simultaneous ECDF test of Uniform(0, 1) (Säilynoja, Bürkner & Vehtari 2022, §2.2).

    With z_k = k / K (k = 1..K-1) and c_k = #{u_i <= z_k}, c_k ~ Binomial(R, z_k) under the null.
    Statistic T = min_k 2 min(P(X <= c_k), P(X >= c_k)) (small = some ECDF point far out);
    p-value = (1 + #{T_sim <= T}) / (1 + n_sim), T_sim simulated under the null from
    multinomial bin counts (exact null law up to Monte Carlo error 1/sqrt(n_sim)). The level-
    alpha simultaneous band of the paper is {ECDF : T > gamma}, gamma the alpha-quantile of T.
    """
    pit = np.asarray(pit, dtype=float).ravel()
    n = pit.size
    if n < 1:
        raise ValueError("pit must hold at least one value")
    if n_points < 2:
        raise ValueError(f"n_points must be >= 2, got {n_points}")
    z = np.arange(1, n_points) / n_points
    key = (n, n_points, n_sim, seed)
    if key not in _ECDF_NULL:
        rng = np.random.default_rng(seed)
        bins = rng.multinomial(n, np.full(n_points, 1.0 / n_points), size=n_sim)
        _ECDF_NULL[key] = np.sort(_ecdf_min_tail(np.cumsum(bins, axis=1)[:, :-1], n, z))
    null = _ECDF_NULL[key]
    observed = _ecdf_min_tail(np.sum(pit[:, None] <= z, axis=0), n, z)
    # small tolerance: the same count vector must give the same statistic in both computations
    n_le = np.searchsorted(null, observed * (1 + 1e-12), side="right")
    return float((1 + n_le) / (1 + n_sim))


def sbc_summary(
    pit: Mapping[str, np.ndarray],
    *,
    alpha: float = 0.01,
    n_bins: int | None = None,
    n_points: int = 20,
    method: str = "",
    n_quantities: int | None = None,
) -> pd.DataFrame:
    """Coverage and uniformity checks for each quantity's R PIT values.

    ``alpha`` is split by Bonferroni: alpha/2 over the 2m rank tests (chi-square and ECDF for
    m quantities) and alpha/2 over the 2m coverage checks (50% and 90%); a correct sampler
    fails some check with probability <= alpha. ``n_quantities`` overrides m (to correct over
    several methods' quantities together). Columns: method, quantity, n_reps, coverage50,
    band50_lo, band50_hi, coverage90, band90_lo, band90_hi, p_chisq, p_ecdf, p_threshold,
    ranks_ok, coverage_ok, passed.
    """
    if not pit:
        raise ValueError("pit must hold at least one quantity")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    m = n_quantities or len(pit)
    rows = []
    for name, u in pit.items():
        u = np.asarray(u, dtype=float).ravel()
        r = u.size
        bins = n_bins or max(2, min(10, r // 5))
        row = {"method": method, "quantity": name, "n_reps": r}
        cov_ok = True
        for p in LEVELS:
            tag = f"{round(100 * p)}"
            c = float(np.mean(covers(u, p)))
            lo, hi = coverage_band(r, p, alpha / 2 / (len(LEVELS) * m))
            row[f"coverage{tag}"] = c
            row[f"band{tag}_lo"], row[f"band{tag}_hi"] = lo, hi
            cov_ok &= lo <= c <= hi
        # chi-square needs >= 5 expected per bin: not computed (NaN) for R < 10
        row["p_chisq"] = chisq_uniformity_pvalue(u, bins) if r >= 10 else math.nan
        row["p_threshold"] = alpha / 2 / (2 * m)
        # enough null simulations that the smallest attainable p-value is far below threshold
        n_sim = max(20_000, math.ceil(20 / row["p_threshold"]))
        row["p_ecdf"] = ecdf_uniformity_pvalue(u, n_points=n_points, n_sim=n_sim)
        row["ranks_ok"] = bool(np.nanmin([row["p_chisq"], row["p_ecdf"]]) >= row["p_threshold"])
        row["coverage_ok"] = bool(cov_ok)
        row["passed"] = row["ranks_ok"] and row["coverage_ok"]
        rows.append(row)
    return pd.DataFrame(rows)


# --- driver -----------------------------------------------------------------------------------
def thin(draws: np.ndarray, n_keep: int) -> np.ndarray:
    """``n_keep`` draws evenly spaced over axis 0 (stride = floor(S / n_keep))."""
    total = draws.shape[0]
    if n_keep < 1 or total < n_keep:
        raise ValueError(f"cannot keep {n_keep} of {total} draws; need 1 <= n_keep <= draws")
    stride = total // n_keep
    return draws[: stride * n_keep : stride]


def _labels(name: str, shape: tuple) -> list[str]:
    if shape == ():
        return [name]
    return [f"{name}[{','.join(map(str, i))}]" for i in np.ndindex(shape)]


@contextlib.contextmanager
def _quiet_pymc():
    logger = logging.getLogger("pymc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def dpinfer_fit(model, *, draws: int = 250, tune: int = 300, chains: int = 2, cores: int = 1, **kwargs):
    """A fit function for :func:`run_sbc`: ``dpinfer.sample`` on ``model`` (compiled once and
    reused; the release data are set with ``pm.set_data`` before each call). Returns a dict of
    name -> draws with the chain and draw axes merged into axis 0, and the bulk ESS of the
    continuous free parameters under the key ``"_ess"``."""
    import arviz as az
    import pymc as pm

    from dpinfer.inference.sample import sample

    def fit(data: Mapping[str, np.ndarray], names, rng: np.random.Generator):
        pm.set_data(dict(data), model=model)
        with _quiet_pymc():
            idata = sample(
                draws, tune=tune, chains=chains, cores=cores, model=model,
                random_seed=int(rng.integers(2**31)), progressbar=False, **kwargs,
            )
        post = idata.posterior.to_dataset()
        out = {n: post[n].values.reshape((-1,) + post[n].shape[2:]) for n in names}
        ess = [
            float(np.min(np.asarray(az.ess(post[n].values, method="bulk"))))
            for n in names
            if np.issubdtype(post[n].dtype, np.floating)
        ]
        out["_ess"] = min(ess) if ess else math.nan
        return out

    return fit


def run_sbc(
    model,
    simulate: Callable,
    n_reps: int,
    rng: np.random.Generator,
    *,
    n_ranks: int = 99,
    draws: int = 250,
    tune: int = 300,
    chains: int = 2,
    cores: int = 1,
    alternatives: Mapping[str, Callable] | None = None,
    alpha: float = 0.01,
    progress_every: int = 1,
    sample_kwargs: Mapping | None = None,
) -> pd.DataFrame:
    """Simulation-based calibration of ``dpinfer.sample`` on ``model``.

    Per replication: ``truth, data = simulate(rng)`` draws the parameters and latent counts
    from the prior (``truth``: name -> value, names of model variables) and the release from
    the mechanism (``data``: pm.Data name -> value); the release is set with ``pm.set_data``
    and ``dpinfer.sample`` refits the same (compiled once) model; the posterior is thinned to
    L = ``n_ranks`` draws and each scalar element of each truth gets a randomised rank and PIT.

    ``alternatives`` maps a method name to ``fit(data, names, rng) -> {name: draws (S, ...)}``
    run on the same replicates (e.g. a naive analysis that takes the release as the truth).

    Returns the :func:`sbc_summary` table (method "dpinfer" first, then the alternatives;
    Bonferroni within each method). ``df.attrs`` holds "ranks" and "pit" (method -> quantity
    -> array over replications), "ess" (min bulk ESS of the continuous parameters per
    replication), "n_ranks" and "seconds".
    """
    check_rng(rng)
    if n_reps < 1:
        raise ValueError(f"n_reps must be >= 1, got {n_reps}")
    if draws * chains < n_ranks:
        raise ValueError(f"draws * chains = {draws * chains} must be >= n_ranks = {n_ranks}")
    fits = {"dpinfer": dpinfer_fit(model, draws=draws, tune=tune, chains=chains, cores=cores,
                                   **dict(sample_kwargs or {}))}
    fits.update(alternatives or {})
    ranks = {m: {} for m in fits}
    ess = []
    start = time.perf_counter()
    for rep in range(n_reps):
        t0 = time.perf_counter()
        truth, data = simulate(rng)
        truth = {k: np.asarray(v) for k, v in truth.items()}
        for method, fit in fits.items():
            post = fit(data, list(truth), rng)
            if method == "dpinfer":
                ess.append(post.get("_ess", math.nan))
            for name, value in truth.items():
                kept = thin(np.asarray(post[name]), n_ranks)
                r = randomised_ranks(kept, value, rng).ravel()
                for label, rank in zip(_labels(name, value.shape), r):
                    ranks[method].setdefault(label, []).append(int(rank))
        if progress_every and ((rep + 1) % progress_every == 0 or rep + 1 == n_reps):
            print(
                f"sbc {rep + 1}/{n_reps}: {time.perf_counter() - t0:.1f} s "
                f"(total {time.perf_counter() - start:.0f} s), min bulk ESS {ess[-1]:.0f} "
                f"for L = {n_ranks}",
                flush=True,
            )
    tables, pits = [], {}
    for method, by_q in ranks.items():
        pits[method] = {q: randomised_pit(np.array(r), n_ranks, rng) for q, r in by_q.items()}
        tables.append(sbc_summary(pits[method], alpha=alpha, method=method))
    df = pd.concat(tables, ignore_index=True)
    df.attrs.update(
        ranks={m: {q: np.array(r) for q, r in by_q.items()} for m, by_q in ranks.items()},
        pit=pits,
        ess=np.array(ess),
        n_ranks=n_ranks,
        seconds=time.perf_counter() - start,
    )
    return df


def format_table(df: pd.DataFrame) -> str:
    """The summary as a markdown table (coverage with its band, p-values, verdict)."""
    lines = [
        "| method | quantity | R | cov 50% [band] | cov 90% [band] | p chi2 | p ECDF | pass |",
        "|---|---|---:|---|---|---:|---:|---|",
    ]
    for _, r in df.iterrows():
        lines.append(
            f"| {r.method} | {r.quantity} | {r.n_reps} | {r.coverage50:.3f} "
            f"[{r.band50_lo:.2f}, {r.band50_hi:.2f}] | {r.coverage90:.3f} "
            f"[{r.band90_lo:.2f}, {r.band90_hi:.2f}] | {r.p_chisq:.3g} | {r.p_ecdf:.3g} | "
            f"{'yes' if r.passed else 'NO'} |"
        )
    return "\n".join(lines)


def study_section(heading: str, df: pd.DataFrame, *, seed: int | None = None, engine: Mapping | None = None) -> list[str]:
    """The markdown lines of one model's results in a validation study: R, L, the time (in
    all and per replication), the bulk ESS per fit, the seed, the engine and method dp.sample
    reported (``engine``: a release's entry of ``posterior.attrs["dpinfer"]``), the table."""
    reps, ess = int(df["n_reps"].iloc[0]), df.attrs["ess"]
    lines = [
        f"## {heading}",
        "",
        f"R = {reps} replications, L = {df.attrs['n_ranks']} thinned draws, {df.attrs['seconds']:.0f} s "
        f"({df.attrs['seconds'] / reps:.1f} s a replication); bulk ESS per fit (min over the ranked quantities): "
        f"median {np.median(ess):.0f}, min {np.min(ess):.0f}" + (f"; seed {seed}" if seed is not None else "") + ".",
        "",
    ]
    if engine is not None:
        lines += [f"dp.sample: engine `{engine.get('engine')}`, {engine.get('method')}.", ""]
    return lines + [format_table(df), ""]


def study_report(title: str, header: str, df: pd.DataFrame) -> str:
    """A validation study's markdown report: title, a header paragraph, the summary table."""
    return "\n".join([f"# {title}", "", header, "", format_table(df), ""])


def study_main(run: Callable, results, argv=None, *, default_reps: int = 100) -> int:
    """Command line of a validation study: ``run(n_reps)`` returns (table, report text), with
    ``n_reps`` the first argument (default ``default_reps``); the report is printed and written
    to ``results`` (a pathlib.Path)."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    _, text = run(int(argv[0]) if argv else default_reps)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(text)
    print(text)
    return 0
