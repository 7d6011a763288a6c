"""Simulation-based calibration of dp.sample with releases conditioned on invariants
(validation/sbc_invariants.py): (i) counties with exact state totals, (ii) a 3 x 3 table with
both margins exact.

Validation tier (`make validate`): 200 replications per model, writes
validation/results/sbc_invariants.md. Fast tier: a few replications of dp.sample (gross errors
only), and the release-only analyses (naive, post-processing baseline) on many replications,
which cost no fit.

Every band is exact (binomial, per quantity, Bonferroni within a method) or, for pooled rows,
the Chernoff-Hoeffding bound on the mean of R independent per-replicate coverage fractions, valid
whatever the dependence between the cells of a replicate; family-wise alpha = 1% throughout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
from scipy.special import gammaln

import dpinfer as dp
from dpinfer.inference.sbc import format_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import sbc_invariants as study  # noqa: E402


def _rows(df, method, quantity=None):
    rows = df[df.method == method]
    if quantity == "pooled":
        return rows[rows.quantity == "x[pooled]"].iloc[0]
    if quantity == "cells":
        return rows[rows.quantity.str.startswith("x[")
                    & ~rows.quantity.isin(["x[pooled]", "x[smallest release]"])]
    return rows


# --- validation tier ------------------------------------------------------------------------------
@pytest.mark.validation
def test_sbc_invariants_study():
    """200 replications per model. Every dpinfer row passes (each quantity's coverage in its
    band and rank tests above the Bonferroni threshold; the pooled count coverage in its band).
    The naive analysis under-covers every count (90% coverage below the band, per cell and
    pooled). The post-processing baseline's noise-only intervals over-cover: pooled 90% count
    coverage above the pooled band in both models (the conditioned noise is narrower than the
    base noise whose interval it uses; see test_release_only_analyses_are_miscalibrated)."""
    results = study.run_study(200, seed=study.SEED, progress_every=20)
    text = study.write_report(results, seed=study.SEED)
    print("\n" + text)
    for name, df in results.items():
        assert _rows(df, "dpinfer")["passed"].all(), f"{name}\n{text}"
        cells = _rows(df, "naive", "cells")
        assert (cells["coverage90"] < cells["band90_lo"]).all(), f"{name}\n{text}"
        naive = _rows(df, "naive", "pooled")
        assert naive.coverage90 < naive.band90_lo, f"{name}\n{text}"
        base = _rows(df, "baseline", "pooled")
        assert base.coverage90 > base.band90_hi, f"{name}\n{text}"


# --- dp.sample, a few replications (validation tier: 9 s; the study above is the check) ------------
@pytest.mark.validation
def test_sbc_invariants_few_replications():
    """4 replications of the table model (rebuilt per replication) and 1 of the counties model
    (2 x 100 draws): every dpinfer row passes at family-wise alpha = 1%. With so few
    replications this catches gross errors only (a posterior that misses the truth in every
    replication, draws off the fibre, crashes); the calibration itself is the validation
    tier's study above, and the exact posteriors are checked by enumeration below."""
    for i, (make, n_reps, fit) in enumerate([
        (study.table, 4, None),
        (study.counties, 1, {"draws": 100, "tune": 150, "n_ranks": 39}),
    ]):
        df = study.run_one(make(), n_reps, np.random.default_rng([7, i]), progress_every=1, fit=fit)
        print("\n" + format_table(df))
        assert _rows(df, "dpinfer")["passed"].all(), format_table(df)


# --- fast tier: naive and baseline on many replications (no fits) -------------------------------
@pytest.mark.parametrize("make, n_reps", [(study.counties, 400), (study.table, 100)])
def test_release_only_analyses_are_miscalibrated(make, n_reps):
    """The analyses that use the release alone, on the study's prior and mechanism:
    - naive (release taken as the truth): pooled 90% count coverage below the pooled band (it
      covers when the conditioned noise of the cell is 0, about 30% of the time);
    - post-processing baseline (rounded least-squares projection +/- the base noise's central
      interval): pooled 90% count coverage ABOVE the pooled band. It does not under-cover in
      these models: the projection leaves a release that already meets the invariants unchanged
      unless x >= 0 binds (rare with these counts), and the noise conditioned on the invariants
      is narrower than the base noise (variance about 5.1 instead of 7.8 for 6 counties per
      state; (r-1)(c-1)/(rc) = 4/9 of it for the table's interior), so +/-5 covers about 97%
      (counties) and about 100% (table)."""
    setup = make()
    rng = np.random.default_rng(2026)
    for _ in range(n_reps):
        setup.simulate(rng)
    ro = setup.release_only
    naive = _rows(ro.naive_table(rng), "naive", "pooled")
    base = _rows(ro.baseline_table(), "baseline", "pooled")
    print(f"\nnaive {naive.coverage90:.3f} [{naive.band90_lo:.3f}, {naive.band90_hi:.3f}]; "
          f"baseline {base.coverage90:.3f} [{base.band90_lo:.3f}, {base.band90_hi:.3f}]")
    assert naive.coverage90 < naive.band90_lo
    assert base.coverage90 > base.band90_hi


def test_pooled_band_is_a_valid_bound():
    """The pooled band holds for perfectly dependent cells (each replicate's fraction is 0 or 1,
    the widest law with mean p): the exact Binomial(R, p) probability outside is <= alpha."""
    from scipy import stats

    for n, p in [(20, 0.9), (200, 0.5), (200, 0.9)]:
        lo, hi = study.pooled_band(n, p, 0.01)
        k = np.arange(n + 1)
        outside = stats.binom.pmf(k, n, p)[(k / n < lo) | (k / n > hi)].sum()
        assert outside <= 0.01 and lo < p < hi


# --- refits after pm.set_data (the study relies on them) ----------------------------------------
# Counts Poisson(lam w), lam ~ Gamma(2, 1): on the fibre the grand total N is fixed, so
# p(x | s) is proportional to prod_i w_i^x_i / x_i! f(s_i - x_i) on the fibre (lam integrates
# out in closed form) and lam | s ~ Gamma(2 + N, 1 + sum w), whatever the noise.
WEIGHTS = np.array([[1.0, 2.0, 0.5], [3.0, 0.7, 1.2]])
FIRST = np.array([[2, -1, 1], [0, 2, 3]])
SECOND = np.array([[0, 4, 2], [5, 0, -1]])


def _refit(inv):
    """Fit FIRST, pm.set_data SECOND, refit the same model; (x draws (S, 6), lam draws, exact
    posterior mean of x given SECOND)."""
    mech = dp.Conditioned(dp.DoubleGeometric(0.7), inv)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        x = pm.Poisson("x", lam * WEIGHTS.reshape(inv_shape(inv)))
        mech.observe("s", x, pm.Data("s_data", FIRST.reshape(inv_shape(inv))))
    kw = dict(draws=400, tune=300, chains=2, progressbar=False, model=model)
    dp.sample(random_seed=1, **kw)
    pm.set_data({"s_data": SECOND.reshape(inv_shape(inv))}, model=model)
    idata = dp.sample(random_seed=2, **kw)
    s = SECOND.reshape(-1)
    points = inv.fibre(inv.values(s))
    log_w = ((points * np.log(WEIGHTS.reshape(-1)) - gammaln(points + 1)).sum(1)
             + mech.base.noise_logpdf(s - points).sum(1))
    exact = np.exp(log_w - np.logaddexp.reduce(log_w)) @ points
    draws = idata.posterior["x"].values.reshape(-1, 6)
    assert np.all(inv.values(draws) == inv.values(s))
    return draws, idata.posterior["lam"].values.reshape(-1), exact


def inv_shape(inv):
    return (6,) if inv.kind == "groups" else (2, 3)


def _check_refit(inv):
    """Posterior means after the refit: cells within 0.25 of exact enumeration, lam within 0.25
    of (2 + N) / (1 + sum w) (posterior sds at most 0.8 and 0.33, 800 draws: Monte Carlo errors
    about 0.05; a model built afresh for SECOND is within them, a stale one is off by 1-3)."""
    draws, lam, exact = _refit(inv)
    lam_mean = (2.0 + SECOND.sum()) / (1.0 + WEIGHTS.sum())
    assert np.max(np.abs(draws.mean(0) - exact)) < 0.25, (draws.mean(0), exact)
    assert abs(lam.mean() - lam_mean) < 0.25, (lam.mean(), lam_mean)


def test_convolution_refit_after_set_data_matches_exact_posterior():
    """Group totals (the counties model's path): a refit after pm.set_data samples the
    posterior of the new release."""
    _check_refit(dp.Invariants.groups([0, 0, 0, 1, 1, 1]))


def test_fibre_refit_after_set_data_matches_exact_posterior():
    """Both margins of a 2 x 3 table (the fibre path): a refit after pm.set_data should sample
    the posterior of the new release."""
    _check_refit(dp.Invariants.margins((2, 3), [(0,), (1,)]))
