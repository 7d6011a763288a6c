"""``dpinfer nmf``: the noisy measurement files of a state in, a posterior of its coarse counts
at every level out: a tidy CSV of posterior summaries per geography and quantity (cells,
totals, voting-age population, shares) beside the GLS baseline, and an HTML report with the
method, the convergence verdict and figures per level (:mod:`dpinfer.io.nmf.report`). The
model is :func:`~dpinfer.io.nmf.model.census_model`.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse

from dpinfer.io.nmf.areas import area_quantities, match_plan, parse_event, read_plan, summarise_areas, write_summary
from dpinfer.io.nmf.layout import LEVELS
from dpinfer.io.nmf.model import LEAF_SIZES, census_model, empirical_bayes_settings
from dpinfer.io.nmf.reading import read_nmf
from dpinfer.io.nmf.store import write_posterior
from dpinfer.io.nmf.table import CensusTable, census_table


def quantities(table: CensusTable) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """What the summaries report per area: (label, numerator cells, denominator cells or None)
    as boolean masks over the coarse cells: every cell, the total, and, where the cells keep
    the axes, the voting-age population, the share Hispanic and the share non-Hispanic white
    alone."""
    n = len(table.cells)
    labels = list(table.coords["cell"])
    out = [(label, np.eye(n, dtype=bool)[j], None) for j, label in enumerate(labels)]
    everyone = np.ones(n, bool)
    out.append(("total", everyone, None))
    names = list(table.cells.names)

    def having(**levels):
        return np.array([all(c[names.index(a)] == v for a, v in levels.items()) for c in table.cells])

    if "votingage" in names:
        out.append(("voting-age population", having(votingage="18 and over"), None))
    if "hispanic" in names:
        out.append(("share Hispanic", having(hispanic="Hispanic or Latino"), everyone))
        if "cenrace" in names:
            out.append(("share non-Hispanic white alone",
                        having(hispanic="Not Hispanic or Latino", cenrace="white alone"), everyone))
    return out


def _members(table: CensusTable, level: str) -> tuple[np.ndarray, scipy.sparse.csr_matrix]:
    """(the areas of ``level`` (rows of ``table.areas``), a 0/1 (areas, leaves) matrix of the
    leaves under each)."""
    areas = table.areas
    rows = np.flatnonzero(areas.level.to_numpy() == level)
    parent = areas.parent.to_numpy()
    member = np.full(len(areas), -1)
    member[rows] = np.arange(rows.size)
    leaf_to = np.empty(table.release.sums.leaf_area.size, dtype=np.int64)
    for i, v in enumerate(table.release.sums.leaf_area):
        while member[v] < 0:
            v = parent[v]
        leaf_to[i] = member[v]
    return rows, scipy.sparse.csr_matrix((np.ones(leaf_to.size), (leaf_to, np.arange(leaf_to.size))),
                                         shape=(rows.size, leaf_to.size))


def _values(M, counts: np.ndarray, wanted, chunk_bytes: float = 5e7) -> np.ndarray:
    """The ``wanted`` quantities (:func:`quantities`) of the areas of M's rows from leaf counts
    (..., n_leaves, n_cells): (..., areas, quantities) float, a share of 0 persons NaN. Only
    the leaves under those areas are read, ``chunk_bytes`` of draws at a time (a state's draws
    are never copied whole)."""
    lead = counts.shape[:-2]
    L, C = counts.shape[-2:]
    flat = counts.reshape(-1, L, C)
    leaves = np.unique(M.indices)
    sub = M[:, leaves]
    num_cells = np.stack([q[1] for q in wanted], axis=1).astype(float)
    den_cells = np.stack([q[2] if q[2] is not None else q[1] for q in wanted], axis=1).astype(float)
    ratio = np.array([q[2] is not None for q in wanted])
    out = np.empty((flat.shape[0], M.shape[0], len(wanted)))
    step = max(1, int(chunk_bytes // (8 * max(leaves.size, 1) * C)))
    for d0 in range(0, flat.shape[0], step):
        x = flat[d0:d0 + step][:, leaves, :].astype(float)  # (draws, leaves, cells)
        sums = np.moveaxis(np.asarray(sub @ np.moveaxis(x, 1, 0).reshape(leaves.size, -1)).reshape(
            M.shape[0], -1, C), 0, 1)  # (draws, areas, cells)
        num, den = sums @ num_cells, sums @ den_cells
        with np.errstate(divide="ignore", invalid="ignore"):
            out[d0:d0 + step] = np.where(ratio, num / np.where(den == 0, np.nan, den), num)
    return out.reshape(*lead, M.shape[0], len(wanted))


def summaries(table: CensusTable, idata, *, name: str = "counts", truth=None, gls=None,
              block: int = 256) -> pd.DataFrame:
    """A tidy table per (level, geocode, quantity): every cell, the total and the derived
    quantities of :func:`quantities`; posterior mean, sd, median, 5% and 95% quantiles, R-hat,
    bulk and tail ESS (:mod:`dpinfer.inference.convergence`; NaN for a share never defined),
    for an empirical-Bayes fit with the hyperparameters held the share of variance their
    uncertainty would add (``hyper_var_share``, :class:`_Sensitivity`), the GLS estimate and sd (``gls``, a :func:`~dpinfer.utility.baselines.nested.gls.nested_gls`
    fit) and the truth ((n_leaves, n_cells) counts) where given. Areas are summarised ``block``
    at a time, so memory stays near that of the draws."""
    from dpinfer.inference.convergence import diagnostics, tail_ess

    draws = idata.posterior[name].values
    chains, n = draws.shape[:2]
    wanted = quantities(table)
    sensitivity = _Sensitivity.of(idata)
    K = len(wanted)
    frames = []
    for level in [lv for lv in LEVELS if lv in set(table.areas.level)]:
        rows, M = _members(table, level)
        for b0 in range(0, rows.size, block):
            part = M[b0:b0 + block]
            values = _values(part, draws, wanted).reshape(chains, n, -1)
            finite = np.where(np.isfinite(values), values, 0.0)
            rhat, ess = diagnostics(finite)
            tail = tail_ess(finite)
            pooled = values.reshape(chains * n, -1)
            undefined = np.all(np.isnan(pooled), axis=0)
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN shares: NaN, said below
                q05, q50, q95 = _column_quantiles(pooled, (0.05, 0.5, 0.95))
                mean, sd = np.nanmean(pooled, axis=0), np.nanstd(pooled, axis=0)
            frame = pd.DataFrame({
                "level": level, "geocode": np.repeat(table.areas.geocode.to_numpy()[rows[b0:b0 + block]], K),
                "cell": np.tile([q[0] for q in wanted], part.shape[0]), "mean": mean, "sd": sd, "median": q50,
                "q05": q05, "q95": q95, "r_hat": np.where(undefined, np.nan, rhat),
                "ess_bulk": np.where(undefined, np.nan, ess), "ess_tail": np.where(undefined, np.nan, tail)})
            if sensitivity is not None:
                frame["hyper_var_share"] = sensitivity.share(values)
            if truth is not None:
                frame["truth"] = _values(part, np.asarray(truth)[None], wanted).reshape(-1)
            frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    if gls is not None:
        out = out.merge(gls_summary(table, gls), on=["level", "geocode", "cell"], how="left", validate="1:1")
    return out


def _column_quantiles(values: np.ndarray, probs) -> np.ndarray:
    """np.nanquantile(values, probs, axis=0): the columns without NaN at once (nanquantile
    takes every column alone, ~60 us each: 7 of a state's 17 s of summaries), the others
    alone; NaN for a column of NaN only."""
    missing = np.isnan(values)
    out = np.full((len(probs), values.shape[1]), np.nan)
    whole = ~missing.any(axis=0)
    out[:, whole] = np.quantile(values[:, whole], probs, axis=0)
    partial = np.flatnonzero(~whole & ~missing.all(axis=0))
    if partial.size:
        out[:, partial] = np.nanquantile(values[:, partial], probs, axis=0)
    return out


class _Sensitivity:
    """How much the hyperparameters' uncertainty would add to a quantity's posterior variance,
    from an empirical-Bayes fit with them held at their estimate q^ (the delta method): the
    posterior mean m(q) of a quantity Y of the counts has gradient Cov(Y, g) at q^, g the
    complete-data score (``sample_stats["hyperparameter_score"]``, the score identity), so
    averaging over the hyperparameters' approximate posterior (sds s_i, Louis's, independent)
    adds sum_i Cov(Y, g_i)^2 s_i^2 to Var(Y). Estimated from N scored draws, each squared
    covariance is too large by about Var(Y) Var(g_i) / N, subtracted: the share is near 0 (noise
    of a few hundredths) where the hyperparameters do not matter. A share of 0.4 widens a 90%
    interval by ~18% and moves its ends by ~10% of its width."""

    def __init__(self, scored: np.ndarray, scores: np.ndarray, sd: np.ndarray):
        self.scored, self.sd2 = scored, sd**2
        centred = scores - scores.mean(axis=0)
        self.centred, self.n = centred, len(scores)
        self.bias = float(np.sum(centred.var(axis=0, ddof=1) * self.sd2) / self.n)

    @classmethod
    def of(cls, idata):
        """From a fit's scores and estimate, or None (full Bayes, or the parameters redrawn)."""
        stats = getattr(idata, "sample_stats", None)
        if stats is None or "hyperparameter_score" not in stats:
            return None
        scores = stats["hyperparameter_score"].values
        scored = np.isfinite(scores[..., 0])
        estimate = json.loads(idata.posterior.attrs["dpinfer_empirical_bayes"])
        sd = np.concatenate([np.ravel(v) for v in estimate["posterior_sd"].values()])
        return cls(scored, scores[scored], sd)

    def share(self, values: np.ndarray) -> np.ndarray:
        """Per quantity (values (chains, draws, k)): the variance added, over Var(Y)."""
        y = values[self.scored]  # (N, k)
        y = y - np.nanmean(y, axis=0)
        var = np.nanvar(y, axis=0, ddof=1)
        cov = np.nan_to_num(y).T @ self.centred / (self.n - 1)  # (k, n)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(var > 0, (cov**2 @ self.sd2) / var - self.bias, np.nan)


def gls_summary(table: CensusTable, fit) -> pd.DataFrame:
    """The GLS estimate and sd (``fit``: :func:`~dpinfer.utility.baselines.nested.gls.nested_gls`)
    of every quantity of :func:`summaries`' rows: level, geocode, cell, gls, gls_sd."""
    from dpinfer.utility.baselines.nested.targets import area_sum_targets, concat_targets, ratio_targets

    parts, keys = [], []
    for level in [lv for lv in LEVELS if lv in set(table.areas.level)]:
        rows, _ = _members(table, level)
        for label, num, den in quantities(table):
            parts.append(area_sum_targets(table.release, rows, num, level, name=label) if den is None else
                         ratio_targets(table.release, rows, num, den, level, name=label))
            keys.append(pd.DataFrame({"level": level, "geocode": table.areas.geocode.to_numpy()[rows],
                                      "cell": label}))
    estimates = fit.targets(concat_targets(*parts))
    out = pd.concat(keys, ignore_index=True)
    out["gls"], out["gls_sd"] = estimates["estimate"].to_numpy(), estimates["sd"].to_numpy()
    return out


INFERENCES = ("auto", "full-bayes", "empirical-bayes")
REPORT_SECONDS = 30.0  # kept from --max-minutes for the GLS baseline and the report
SUMMARIES = 2.0  # the summaries' cost per quantity and draw, in verdict costs (seconds_per_value)


class LeafSizesWarning(UserWarning):
    """The leaf sizes at their published totals where that is known to undercover."""


#: measured on a synthetic state read to blocks (issue 38, validation/districts_side_by_side.py
#: --leaves Block, hierarchical truth, seed 2020, 439 blocks): blocks' total population
BLOCK_LEAF_SIZES_WARNING = (
    "--leaf-sizes published at Block leaves: each block's expected size is its published total, whose "
    "noise is large against a block's size, and the same total is in the likelihood: on a synthetic state "
    "(439 blocks) the 90% intervals of the blocks' total population covered 0.624 (voting-age 0.697) "
    "against 0.936 with --leaf-sizes estimated (issue 38; 0.952 in a converged 37-minute run). --leaf-sizes "
    "estimated, the default at blocks, is slower (one leaf-size parameter a block) but covers")


def _read_truth(path) -> pd.DataFrame:
    """A truth file: parquet with columns geocode, cell and count (a synthetic file's
    truth.parquet); errors name ``truth``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"truth {path}: no such file")
    try:
        table = pd.read_parquet(path)
    except Exception as err:  # pyarrow's errors are not ValueErrors
        raise ValueError(f"truth {path}: not a parquet file ({' '.join(str(err).split())[:200]})") from None
    missing = sorted({"geocode", "cell", "count"} - set(table.columns))
    if missing:
        raise ValueError(f"truth {path}: columns {missing} are missing (it needs geocode, cell and count)")
    return table


def fit_nmf(root, state, *, leaves: str = "Block_Group", cells="pl94-28", out=None, draws: int = 1000,
            tune: int = 1000, chains: int = 2, seed: int = 0, truth=None, progressbar: bool = True,
            checkpoint_every: int | None = None, inference: str = "auto", max_minutes: float = 20.0,
            uncertainty: str = "normal", leaf_sizes: str = "auto", areas=None, probabilities=(),
            partial: bool = False, log=None) -> Path:
    """Read ``state``'s files under ``root`` down to ``leaves``, fit
    :func:`~dpinfer.io.nmf.model.census_model` (``leaf_sizes``; "auto", the default: "estimated"
    at Block leaves, where published sizes make the blocks' totals undercover
    (:data:`BLOCK_LEAF_SIZES_WARNING`), "published" above) with ``dpinfer.sample`` and write
    ``report.html``, ``summary.csv``, one figure per level and ``posterior.zarr`` into ``out``
    (default ``nmf-<state>-<leaves>``). Returns ``out``.

    Phases, each announced on ``log`` (default stderr) with the time left of ``max_minutes``:
    the files read; the table (leaves, cells, counts, terms); the fit, ``inference``
    ``"auto"`` (the default: the hyperparameters' empirical-Bayes estimate, then full Bayes
    if it is predicted to converge in the time left, else empirical Bayes with the
    hyperparameters' ``uncertainty``, ``"normal"`` or ``"none"``: ``dp.sample``'s
    ``inference`` and ``empirical_bayes``), ``"full-bayes"`` or ``"empirical-bayes"``;
    sampling on until the convergence targets are met or the time is up (``max_minutes``,
    less REPORT_SECONDS for the last phase, and the chains stop in time for the summaries:
    SUMMARIES x :func:`~dpinfer.inference.convergence.seconds_per_value` per quantity
    summarised and draw, dp.sample's ``reserve_per_draw``); the summaries beside the GLS baseline
    (:func:`~dpinfer.utility.baselines.nested.gls.nested_gls`) and the report.

    ``truth``: a parquet file of the true histogram (geocode, cell, count; a synthetic file's
    ``truth.parquet``), added to the summaries, figures and report. ``checkpoint_every``: save
    the chains every this many iterations in ``out/checkpoint`` (``dpinfer.sample(checkpoint=...)``)
    and continue from there when the same command runs again after an interruption; removed
    once the outputs are written.

    The draws are stored in ``out/posterior.zarr`` with every block under each leaf
    (:mod:`dpinfer.io.nmf.store`), so any union of blocks is summarised later without
    refitting (``dpinfer areas``, :func:`~dpinfer.io.nmf.areas.summarise_areas`). ``areas``: a
    block-assignment plan (:func:`~dpinfer.io.nmf.areas.read_plan`) summarised into
    ``out/areas.csv`` now, with the events ``probabilities`` and ``partial`` as there; the plan
    is read and checked before the fit, so a bad plan costs no fit."""
    import sys

    import dpinfer as dp
    from dpinfer.inference.checkpoint import resume_or_start
    from dpinfer.inference.convergence import seconds_per_value
    from dpinfer.io.nmf.report import write_report
    from dpinfer.utility.baselines.nested.gls import nested_gls

    if not isinstance(leaves, str) or leaves not in LEVELS:
        raise ValueError(f"leaves must be one of {LEVELS}, got {leaves!r}")
    if not isinstance(leaf_sizes, str) or leaf_sizes not in ("auto", *LEAF_SIZES):
        raise ValueError(f"leaf_sizes must be one of {('auto', *LEAF_SIZES)}, got {leaf_sizes!r}")
    if leaf_sizes == "auto":
        leaf_sizes = "estimated" if leaves == "Block" else "published"
    if not isinstance(inference, str) or inference not in INFERENCES:
        raise ValueError(f"inference must be one of {INFERENCES}, got {inference!r}")
    if isinstance(max_minutes, bool) or not isinstance(max_minutes, (int, float)) or not (
            np.isfinite(max_minutes) and max_minutes > 0):
        raise ValueError(f"max_minutes must be a finite number of minutes > 0, got {max_minutes!r}")
    log = sys.stderr if log is None else log
    start = time.perf_counter()

    def phase(k: int, text: str) -> None:
        left = max_minutes - (time.perf_counter() - start) / 60
        print(f"dpinfer nmf: [{k}/4] {text} ({time.perf_counter() - start:.0f} s; {max(left, 0):.1f} min of "
              f"--max-minutes left)", file=log, flush=True)

    if areas is None and (probabilities or partial):
        raise ValueError("probabilities (--probability) and partial (--partial) are about the areas of a plan: "
                         "give areas (--areas PLAN.csv) too")
    if areas is not None:
        areas = read_plan(areas)
    true_table = _read_truth(truth) if truth is not None else None
    nmf = read_nmf(root, state, levels=LEVELS[: LEVELS.index(leaves) + 1])
    phase(1, f"read {len(nmf.files)} files of state {state}: levels {', '.join(nmf.levels)}")
    table = census_table(nmf, leaves, cells)
    counts = len(table.leaves) * len(table.cells)
    phase(2, f"table: {len(table.leaves):,} {leaves} leaves x {len(table.cells)} cells = {counts:,} counts, "
             f"{table.release.sums.term_value.size:,} terms")
    geo = _geography(root, state, table, leaves)
    if areas is not None:  # the plan and the events checked before the fit
        match_plan(areas, table.leaves, geo, partial=partial)
        names = [q[0] for q in area_quantities(table.coords["cell"], table.cells.names)]
        for event in [probabilities] if isinstance(probabilities, str) else probabilities:
            parse_event(event, names)
    true_counts = None
    if true_table is not None:
        true_counts = table.aggregate(true_table["geocode"], true_table["cell"], true_table["count"])
    out = Path(out or f"nmf-{state}-{leaves}")
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "checkpoint"
    if leaves == "Block" and leaf_sizes == "published":
        warnings.warn(BLOCK_LEAF_SIZES_WARNING, LeafSizesWarning, stacklevel=2)
    model = census_model(table, leaf_sizes=leaf_sizes)
    summarised = len(table.areas) * len(quantities(table))
    reserve_per_draw = chains * summarised * SUMMARIES * seconds_per_value()
    sampling_minutes = max(max_minutes - (time.perf_counter() - start + REPORT_SECONDS) / 60, 0.0)
    phase(3, f"fit: {inference} inference, until converged or {sampling_minutes:.1f} min")
    idata = dp.sample(model=model, draws=draws, tune=tune, chains=chains, random_seed=seed,
                      progressbar=progressbar, inference=inference, max_minutes=sampling_minutes,
                      reserve_per_draw=reserve_per_draw,
                      **({"empirical_bayes": empirical_bayes_settings(model, leaves, uncertainty)}
                         if inference != "full-bayes" else {}),
                      **(resume_or_start(checkpoint, checkpoint_every) if checkpoint_every else {}))
    fitted = time.perf_counter() - start
    gls = nested_gls(table.release)
    summary = summaries(table, idata, truth=true_counts, gls=gls)
    summary.to_csv(out / "summary.csv", index=False)
    write_posterior(out / "posterior.zarr", idata, geography_group=geo)
    if areas is not None:
        write_summary(summarise_areas(out / "posterior.zarr", areas, probabilities=probabilities, partial=partial,
                                      gls=gls), out / "areas.csv")
    write_report(out, root=root, state=state, nmf=nmf, table=table, idata=idata, summary=summary,
                 seconds={"fit": fitted, "all": time.perf_counter() - start})
    shutil.rmtree(checkpoint, ignore_errors=True)  # the fit is in posterior.zarr now
    phase(4, f"wrote {out}/report.html, summary.csv ({len(summary):,} rows, GLS beside), posterior.zarr"
             + (", areas.csv" if areas is not None else ""))
    return out


def _geography(root, state, table: CensusTable, leaves: str):
    """The stored fit's geography group (:func:`~dpinfer.io.nmf.store.geography`): every
    block under the leaves, from the files' Block level (none if the files have no Block
    level: plans are then matched to the leaves' geocodes)."""
    from dpinfer.io.nmf.reading import block_geocodes
    from dpinfer.io.nmf.store import geography

    blocks = block_geocodes(root, state) if leaves != "Block" else None
    return geography(table.leaves, leaves, table.cells.names, blocks if blocks is None or blocks.size else None)
