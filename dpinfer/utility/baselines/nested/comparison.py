r"""The comparison: the targets' estimates and intervals of dpinfer's posterior draws and of every
nested baseline (:func:`nested_target_table`), scored against the truth by group
(:func:`compare_nested`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpinfer.utility.baselines.nested.gls import GLSFit, nested_gls
from dpinfer.utility.baselines.nested.inputs import _as_sums
from dpinfer.lattice.nested.nnls import nested_nnls
from dpinfer.utility.baselines.nested.per_cell import per_cell_posteriors
from dpinfer.utility.baselines.nested.targets import NestedTargets

__all__ = ["compare_nested", "nested_target_table"]

METHODS = ("dpinfer", "GLS", "per-cell", "per-cell aggregated", "NNLS")


def _draw_summary(targets: NestedTargets, draws: np.ndarray, a: float, b: float):
    """(median, a-quantile, b-quantile, share of the draws in [a-quantile, b-quantile]) of each
    target over the draws, in blocks of targets (one transposed copy of the draws; at most ~2e7
    target values at a time). The share is the interval's posterior mass: above b - a for
    integer targets with few values (a count of 0-3), so it, not b - a, is the coverage a
    calibrated posterior's intervals have on average."""
    XT = np.ascontiguousarray(draws.reshape(draws.shape[0], -1).T)  # (n, D)
    k = len(targets)
    out = np.full((4, k), np.nan)
    step = max(1, 20_000_000 // max(draws.shape[0], 1))
    ratio = targets.is_ratio
    for i0 in range(0, k, step):
        sl = slice(i0, min(k, i0 + step))
        num = np.asarray(targets.numerator[sl] @ XT, dtype=float)
        if np.any(ratio[sl]):
            den = np.asarray(targets.denominator[sl] @ XT, dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                num = np.where(ratio[sl, None], num / np.where(den == 0, np.nan, den), num)
        out[:3, sl] = np.nanquantile(num, [0.5, a, b], axis=1)
        out[3, sl] = np.mean((num >= out[1, sl, None]) & (num <= out[2, sl, None]), axis=1)
    return out[0], out[1], out[2], out[3]


def nested_target_table(release, truth, draws, targets: NestedTargets, *, prob: float = 0.9,
                        methods=METHODS, gls: GLSFit | None = None, nnls: np.ndarray | None = None,
                        n_draws: int = 4000, seed: int = 0) -> pd.DataFrame:
    """One row per (method, target): truth, estimate, lower, upper (NaN where the method has no
    interval or cannot give the target) and mass. dpinfer: the posterior median of the target's
    draws, the equal-tailed interval of the draws (``numpy.quantile``, as
    dpinfer.utility.compare) and its posterior mass (:func:`_draw_summary`; NaN for the others);
    GLS: :func:`nested_gls` (pass ``gls`` to reuse a fit); per-cell and per-cell aggregated:
    :func:`per_cell_posteriors`; NNLS: :func:`nested_nnls` (pass ``nnls`` to reuse it), ratios
    as ratios of the fitted sums."""
    sums = _as_sums(release)
    truth = np.asarray(truth).reshape(sums.n_leaves, sums.n_cells)
    true = targets.values(truth)
    a, b = 0.5 * (1.0 - prob), 0.5 * (1.0 + prob)
    frames = []

    def add(method, est, lo=None, hi=None, mass=None):
        k = len(targets)
        frames.append(pd.DataFrame({
            "method": method, "group": targets.group, "label": targets.label, "truth": true,
            "estimate": np.asarray(est, float),
            "lower": np.full(k, np.nan) if lo is None else np.asarray(lo, float),
            "upper": np.full(k, np.nan) if hi is None else np.asarray(hi, float),
            "mass": np.full(k, np.nan) if mass is None else np.asarray(mass, float)}))

    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose among {METHODS}")
    if "dpinfer" in methods:
        if draws is None:
            raise ValueError("draws (draws, n_leaves, n_cells) are needed for the dpinfer rows")
        draws = np.asarray(draws)
        if draws.ndim != 3 or draws.shape[1:] != (sums.n_leaves, sums.n_cells):
            raise ValueError(f"draws must have shape (draws, {sums.n_leaves}, {sums.n_cells}), got {draws.shape}")
        add("dpinfer", *_draw_summary(targets, draws, a, b))
    if "GLS" in methods:
        g = (gls or nested_gls(sums)).targets(targets, prob)
        add("GLS", g["estimate"], g["lower"], g["upper"])
    for method, agg in (("per-cell", False), ("per-cell aggregated", True)):
        if method in methods:
            p = per_cell_posteriors(sums, targets, aggregate=agg, prob=prob, n_draws=n_draws, seed=seed)
            add(method, p["estimate"], p["lower"], p["upper"])
    if "NNLS" in methods:
        fit = nested_nnls(sums) if nnls is None else nnls
        add("NNLS", targets.values(fit))
    return pd.concat(frames, ignore_index=True)


def compare_nested(release, truth, draws, targets: NestedTargets, *, prob: float = 0.9, methods=METHODS,
                   gls: GLSFit | None = None, nnls: np.ndarray | None = None, n_draws: int = 4000,
                   seed: int = 0, table: pd.DataFrame | None = None) -> pd.DataFrame:
    r"""Score every method on the targets against the truth, per (method, group): a tidy frame
    with ``targets`` (how many the method gave), ``coverage`` of the ``prob`` intervals and its
    Monte Carlo standard error sqrt(p (1 - p) / n) (NaN for a method without intervals),
    ``expected_coverage``, the mean posterior mass of dpinfer's intervals (the coverage a
    calibrated posterior gives: above ``prob`` where targets are small integers; NaN for the
    other methods), ``below`` and ``above``: the shares of targets whose truth lies below the
    interval's lower end and above its upper end (coverage + below + above = 1; misses all on
    one side mean the estimates lean the other way), ``mean_width`` of the intervals, ``mae``
    and ``rmse`` of the point estimates (dpinfer: the posterior median). ``table``: a :func:`nested_target_table` already computed."""
    if table is None:
        table = nested_target_table(release, truth, draws, targets, prob=prob, methods=methods, gls=gls,
                                    nnls=nnls, n_draws=n_draws, seed=seed)
    rows = []
    for (method, group), t in table.groupby(["method", "group"], sort=False):
        t = t[np.isfinite(t["estimate"]) & np.isfinite(t["truth"])]
        n = len(t)
        err = t["estimate"].to_numpy() - t["truth"].to_numpy()
        has = np.isfinite(t["lower"]).all() and np.isfinite(t["upper"]).all() and n > 0
        if has:
            below = float((t["truth"] < t["lower"]).mean())
            above = float((t["truth"] > t["upper"]).mean())
            # counted, not 1 - below - above, which rounds below 0 when every truth is missed
            p = float(((t["truth"] >= t["lower"]) & (t["truth"] <= t["upper"])).mean())
            se = math.sqrt(p * (1 - p) / n)
            width = float((t["upper"] - t["lower"]).mean())
        else:
            p = se = width = below = above = np.nan
        rows.append({"method": method, "group": group, "targets": n, "coverage": p, "coverage_se": se,
                     "below": below, "above": above,
                     "expected_coverage": float(t["mass"].mean()) if n and t["mass"].notna().all() else np.nan,
                     "mean_width": width, "mae": float(np.abs(err).mean()) if n else np.nan,
                     "rmse": float(np.sqrt(np.mean(err ** 2))) if n else np.nan})
    return pd.DataFrame.from_records(rows)
