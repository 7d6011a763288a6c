"""One plan per latent count vector: what ``dpinfer.sample`` does with it.

``plan_releases`` reads the releases recorded by ``Mechanism.observe`` and gives each latent
count vector one plan of four kinds. Each kind owns its window, its start on the releases'
fibre, what each engine runs for it and its report:

* :class:`CellsPlan` -- one release of the counts themselves, their only child: the cells
  are independent given the parameters (inference notes §1). Compiled engine: exact draws of
  every cell given the parameters (:class:`~dpinfer.inference.count_blocks.IndependentCells`).
  PyMC engine: the counts summed out over a proven window, then drawn exactly for every
  posterior draw.
* :class:`TotalsPlan` -- one release conditioned on one total or on disjoint group totals,
  the counts' only child (inference notes §2). Compiled engine: exact joint draws on the
  totals (:class:`~dpinfer.inference.count_blocks.GroupTotals`). PyMC engine: summed out by
  convolution over each group, then drawn jointly and exactly.
* :class:`ChildrenPlan` -- counts with children besides their first release (further releases
  of the counts, Binomial thinnings, ...): windowed exact Gibbs updates of each cell given
  the rest (PyMC engine, :class:`~dpinfer.inference.gibbs.WindowedCountGibbs`).
* :class:`~dpinfer.inference.fibre.FibrePlan` -- invariants other than group totals, linear
  queries, releases conditioned on non-negativity, the l2 generalized Laplace: exact Gibbs
  updates along Markov moves of the fibre (PyMC engine).

Windows. The PyMC engine sums over or updates on windows whose neglected likelihood mass is
bounded relative to ``tol`` and checked on every draw (:mod:`dpinfer.inference.window`); the
compiled engine's draws are exact beyond the window for additive noise (geometric tail
envelopes), so its window only sets the cost, and a window without exact tails (clamped or
truncated mechanisms) is checked as on the PyMC engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytensor.tensor as pt

from dpinfer.inference.count_blocks import (
    CellTables,
    GroupTotals,
    IndependentCells,
    has_exact_tails,
    tail_half_width,
)
from dpinfer.inference.convolution_likelihood import ConvolutionLogLikelihood
from dpinfer.inference.fibre import entries_from, plan_fibre, respects_invariants
from dpinfer.inference.gibbs import terms_depending_on
from dpinfer.inference.latents import NotMarginalisableError, current_value, prior_support
from dpinfer.inference.marginal import symbolic_centres
from dpinfer.inference.queries import resolve_query
from dpinfer.inference.window import (
    Window,
    initial_half_width,
    make_window,
    neglected_log_mass,
    window_centres,
)
from dpinfer.lattice.convolution import log_convolution_at, sample_given_sums
from dpinfer.mechanisms.records import ReleaseRecord, closest_free_variables
from pytensor.tensor.random.op import RandomVariable


@dataclass
class CellsPlan:
    """A release of latent counts that is their only child: independent cells given the
    parameters (module docstring)."""

    record: ReleaseRecord
    latent_name: str
    release_value: np.ndarray  # the latent's shape
    support: tuple  # (lowest, highest) supported count; None where open
    window: Window | None = None

    kind: ClassVar[str] = "cells"
    compiled_method: ClassVar[str] = (
        "exact Gibbs (compiled): the counts drawn exactly given the parameters, alternating with "
        "NUTS transitions of the parameters given the counts (counts_per_sweep and "
        "nuts_per_sweep per draw, in sample_stats.attrs)")
    pymc_method: ClassVar[str] = (
        "exact marginalisation over a proven window (NUTS on parameters) "
        "+ exact conditional draws of the counts")

    @property
    def mechanism(self):
        """The per-cell likelihood p(s_i | x_i) of the release."""
        return self.record.mechanism

    @property
    def exact_tails(self) -> bool:
        return has_exact_tails(self.mechanism)

    # --- windows ---------------------------------------------------------------------------
    def first_half_width(self, tol: float, compiled: bool) -> int:
        """The compiled engine's exact-tail window, or the smallest window whose every cell's
        tail bound is tol / (n_cells margin) of the likelihood at its centre (then checked on
        every draw; the prior rarely puts less than 1e-4 of its mass near the release)."""
        if compiled and self.exact_tails:
            return tail_half_width(self.mechanism)
        mech, s = self.mechanism, self.release_value
        log_peak = float(np.min(mech.log_likelihood(s, window_centres(s, self.support))))
        target = np.log(tol) - np.log(np.size(s)) - self._log_margin() + log_peak
        return initial_half_width(mech, s, log_target=target, support=self.support)

    def _log_margin(self) -> float:
        return float(np.log(1e4))

    def set_half_width(self, k: int) -> None:
        self.window = make_window(self.mechanism, self.release_value, self.support, k)

    def widened_half_width(self, bound: float, tol: float) -> int:
        """A half-width whose bound should come out 10 times below ``tol``: every bound here
        is proportional to the tail bound eta for small values, so shrink eta by
        tol / (10 bound); double it where the bound is infinite (a window without mass)."""
        k = self.window.half_width
        if not np.isfinite(bound):
            return 2 * k
        target = float(np.max(self.window.log_eta)) + np.log(tol / (10.0 * bound))
        return max(k + 1, initial_half_width(self.mechanism, self.release_value,
                                             log_target=target, support=self.support))

    # --- compiled engine -------------------------------------------------------------------
    def start(self) -> np.ndarray:
        """Counts to start from (flattened): the window centres."""
        return self.window.centres.reshape(-1)

    def block(self, compiled):
        """The compiled engine's count block."""
        return IndependentCells(self.latent_name, compiled.latent_slices[self.latent_name].start,
                                self._tables(), compiled.prior_tables[self.latent_name])

    def _tables(self) -> CellTables:
        log_eta = None if self.exact_tails else self.window.log_eta
        return CellTables.build(self.mechanism, self.release_value, self.support,
                                self.window.half_width, log_eta=log_eta)

    def compiled_report(self, stats, block, tol: float) -> tuple[dict, float | None]:
        """(report entry, the largest neglected-mass bound if it exceeds tol, else None;
        infinite when cells were held too often: :func:`held_too_often`)."""
        entry = self._compiled_entry(stats, block, tol)
        if held_too_often(stats[block.stat_names[1]].values):
            return entry, math.inf
        if self.exact_tails:
            return entry, None
        bound = float(np.max(stats[block.stat_names[0]].values))
        entry["max_relative_error_bound"] = bound
        return entry, (None if bound <= tol else bound)

    def _compiled_entry(self, stats, block, tol: float) -> dict:
        """The report entry with the held cells counted (the block's second statistic)."""
        held = stats[block.stat_names[1]].values
        entry = self.report_entry(self.compiled_method, 0.0, tol)
        entry.update(exact_tails=self.exact_tails, held_cells_after_tuning=int(held.sum()),
                     draws_with_held_cells=int(np.count_nonzero(held)))
        return entry

    # --- PyMC engine -----------------------------------------------------------------------
    def marginal_log_likelihood(self, terms, release):
        """log p(s | theta) per cell from the window terms (W, *cells): a log-sum-exp."""
        return pt.logsumexp(terms, axis=0)

    def draw(self, log_weights, rng) -> tuple[np.ndarray, float]:
        """Exact draws of the counts, one per posterior draw, from their window weights
        (draws, W, *cells), and the largest log1p bound on the neglected relative mass."""
        grid = self.window.grid()
        log_l = np.logaddexp.reduce(log_weights, axis=1)
        worst = float(np.max(neglected_log_mass(self.window.log_eta, log_l)))
        cdf = np.cumsum(np.exp(log_weights - log_l[:, None]), axis=1)
        u = rng.random((cdf.shape[0], 1) + cdf.shape[2:]) * cdf[:, -1:]
        index = np.minimum(np.sum(cdf < u, axis=1), grid.shape[0] - 1)
        return np.take_along_axis(grid[None, ...], index[:, None, ...], axis=1)[:, 0], worst

    def report_entry(self, method: str, bound: float, tol: float) -> dict:
        return {
            "release": self.record.name,
            "mechanism": repr(self.record.mechanism),
            "method": method,
            "window_half_width": self.window.half_width,
            "max_relative_error_bound": bound,
            "tol": tol,
        }


@dataclass
class TotalsPlan(CellsPlan):
    """A release conditioned on one total or on disjoint group totals, the counts' only child
    (module docstring)."""

    group_codes: np.ndarray | None = None  # the group of each cell, flattened

    kind: ClassVar[str] = "totals"
    compiled_method: ClassVar[str] = (
        "exact Gibbs (compiled): the counts drawn exactly and jointly on the group totals given "
        "the parameters, alternating with NUTS transitions of the parameters given the counts "
        "(counts_per_sweep and nuts_per_sweep per draw, in sample_stats.attrs)")
    pymc_method: ClassVar[str] = (
        "exact marginalisation over group totals by convolution (NUTS on parameters) "
        "+ exact joint draws of the counts on the fibre")

    @property
    def mechanism(self):
        """The per-cell law of the release before conditioning (the base noise)."""
        return self.record.mechanism.base

    @property
    def targets(self) -> np.ndarray:
        """Each group's released (= true) total."""
        return np.rint(np.bincount(self.group_codes, weights=self.release_value.reshape(-1))).astype(np.int64)

    def _log_margin(self) -> float:
        # the bound is relative to the convolution V = P(S = t) prod_j L_j under the cells'
        # product law: 1 / P(S = t) ~ sqrt(2 pi n) sd / phi(z) for a group of n cells, z the
        # total's standardised distance, so the margin grows with sqrt(n) (inference notes §2)
        return float(np.log(1e4) + np.log(1e3) + 0.5 * np.log(np.max(np.bincount(self.group_codes))))

    def start(self) -> np.ndarray:
        """Window centres moved onto the totals (:func:`point_on_totals`)."""
        return point_on_totals(self.window.centres.reshape(-1), self.group_codes, self.targets,
                               self.support, self.latent_name)

    def block(self, compiled):
        return GroupTotals(self.latent_name, compiled.latent_slices[self.latent_name].start,
                           self._tables(), compiled.prior_tables[self.latent_name],
                           self.group_codes, self.targets)

    def compiled_report(self, stats, block, tol: float) -> tuple[dict, float | None]:
        entry = self._compiled_entry(stats, block, tol)
        entry.update(mean_tries_per_sweep=float(stats[block.stat_names[0]].values.mean()),
                     blocks_kept_after_tuning=int(stats[block.stat_names[2]].values.sum()))
        return entry, (math.inf if held_too_often(stats[block.stat_names[1]].values) else None)

    def marginal_log_likelihood(self, terms, release):
        """log p(s | theta) (inference notes §2): sum over groups of log (g_1 * ... * g_n)(t_g)
        - log P(A e = 0), g_i the cell's window terms and t_g the group total of s minus the
        windows' lower ends; spread evenly over the cells (only the sum is meaningful)."""
        codes = self.group_codes
        d = codes.size
        lower = symbolic_centres(release, self.support).reshape((-1,)) - self.window.half_width
        indicator = pt.constant(np.eye(codes.max() + 1, dtype=np.int64)[:, codes])  # (G, d)
        targets = pt.dot(indicator, release.reshape((-1,)).astype("int64") - lower)
        log_g = terms.reshape((terms.shape[0], d)).T
        total = ConvolutionLogLikelihood(tuple(int(c) for c in codes))(log_g, targets)
        total = total - self.record.mechanism.log_normaliser()
        return pt.broadcast_to(total / d, release.shape)

    def draw(self, log_weights, rng) -> tuple[np.ndarray, float]:
        """Exact joint draws on the totals, one per posterior draw (backward sampling through
        the convolution tree, inference notes §2), and the largest log1p bound on the
        neglected relative mass.

        For group g with window sums L_i, tail bounds eta_i and in-window convolution V_g,
        the fibre mass with some cell outside its window is at most sum_i eta_i
        prod_{j != i} (L_j + eta_j) (drop the total constraint, which only adds mass), so the
        relative error is at most exp(sum_j log(L_j + eta_j) - log V_g) sum_i eta_i / (L_i + eta_i)."""
        n, width = log_weights.shape[0], log_weights.shape[1]
        codes = self.group_codes
        log_l = np.logaddexp.reduce(log_weights, axis=1)
        log_g = log_weights.reshape(n, width, -1).transpose(0, 2, 1)
        lower = self.window.centres.reshape(-1) - self.window.half_width
        targets = np.bincount(codes, weights=self.release_value.reshape(-1) - lower).astype(np.int64)
        draws = lower + sample_given_sums(log_g, codes, targets, rng)
        eta = self.window.log_eta.reshape(-1)
        log_tot = np.logaddexp(log_l.reshape(n, -1), eta)
        worst = -np.inf
        for b in range(n):
            log_v, _ = log_convolution_at(log_g[b], codes, targets)
            total = 0.0
            for g in range(codes.max() + 1):
                cells = codes == g
                log_ratio = (np.logaddexp.reduce(eta[cells] - log_tot[b, cells])
                             + np.sum(log_tot[b, cells]) - log_v[g])
                total += np.log1p(np.exp(min(log_ratio, 700.0)))
            worst = max(worst, total)
        return draws.reshape((n, *log_weights.shape[2:])), worst


@dataclass
class ChildrenPlan(CellsPlan):
    """Counts with children besides their first release: windowed exact Gibbs updates of each
    cell given the rest, next to NUTS (PyMC engine)."""

    kind: ClassVar[str] = "children"
    pymc_method: ClassVar[str] = (
        "windowed exact Gibbs updates of each count (the counts have other children), "
        "NUTS on the continuous parameters")


def point_on_totals(centres, codes, targets, support, name: str) -> np.ndarray:
    """Counts near ``centres`` inside ``support`` whose group sums equal ``targets``: each
    group's surplus (or deficit) spread as evenly as the support allows, so that no cell moves
    by more than about surplus / cells (+1) beyond what its support forces.

    Why evenly: the chains start here, and a cell started far outside its window (it once took
    a whole group's surplus, hundreds of counts, when clipping the releases of many small cells
    at 0 raised the group's sum) drags its rate along and is then held at every sweep, its
    window holding almost none of its conditional law: a chain stuck at the start (seen on the
    30,000-cell benchmark)."""
    lower, upper = support
    lo = -np.inf if lower is None else lower
    hi = np.inf if upper is None else upper
    x = np.clip(np.asarray(centres, dtype=np.int64), lo, hi).astype(np.int64)
    for g, target in enumerate(targets):
        cells = np.flatnonzero(codes == g)
        cells = cells[np.argsort(-x[cells], kind="stable")]
        diff = int(x[cells].sum() - target)
        while diff != 0:
            sign = 1 if diff > 0 else -1
            room = np.minimum(x[cells] - lo if sign > 0 else hi - x[cells], abs(diff)).astype(np.int64)
            movable = cells[room > 0]
            if movable.size == 0:
                raise ValueError(
                    f"the released total {int(target)} of group {g} of {name!r} is outside "
                    f"what its cells can reach in their support {support}"
                )
            share = -(-abs(diff) // movable.size)  # ceil: one pass moves at least ...
            step = np.minimum(room[room > 0], share)
            step = np.diff(np.minimum(np.cumsum(step), abs(diff)), prepend=0)  # ... no more than diff
            x[movable] -= sign * step
            diff -= sign * int(step.sum())
    return x


def _cells_plan(model, record: ReleaseRecord) -> CellsPlan:
    """A release of the counts themselves: a CellsPlan if it is their only child, else a
    ChildrenPlan (the further children enter the windowed Gibbs step)."""
    latent = record.latent
    name = getattr(latent, "name", None)
    if latent not in model.free_RVs:
        raise NotMarginalisableError(
            f"the true values of release {record.name!r} must be a free random variable of the "
            f"model (e.g. pm.Poisson('x', ...)); got {latent!r}"
        )
    node = latent.owner
    if not isinstance(node.op, RandomVariable) or node.op.ndim_supp != 0:
        raise NotMarginalisableError(
            f"latent {name!r} must be an elementwise distribution (Poisson, Binomial, "
            f"NegativeBinomial, ...); got {node.op}"
        )
    if not latent.type.dtype.startswith("int"):
        raise NotMarginalisableError(f"latent {name!r} must be integer valued (counts)")
    children, named = terms_depending_on(model, latent, exclude=(record.release_rv,))
    kind = CellsPlan if not children and not named else ChildrenPlan
    return kind(record=record, latent_name=name,
                release_value=current_value(model.rvs_to_values[record.release_rv]),
                support=prior_support(node))


STUCK_SHARE = 0.5  # a chain holding cells in more than this share of its draws is stuck


def held_too_often(held) -> bool:
    """True if some chain (rows of ``held``, the held cells per stored draw) held cells in
    more than ``STUCK_SHARE`` of its draws. The hold rule of the compiled engine
    (:mod:`dpinfer.inference.exact_counts`) leaves p(x | theta) invariant, but where the
    posterior puts a cell far outside its window (a release far from anything the prior
    allows) the cell is held at every sweep and never leaves its start: the chain is not
    ergodic. ``dpinfer.sample`` then widens the windows and fits again."""
    held = np.asarray(held).reshape(-1, np.shape(held)[-1])
    return bool(np.any(np.mean(held > 0, axis=1) > STUCK_SHARE))


def is_continuous_release(model, record: ReleaseRecord) -> bool:
    """A continuous mechanism's release of real-valued latents (a mean, a sum, a regression
    statistic): an ordinary observed variable of the model, which NUTS samples with the
    latent; nothing to marginalise or draw, so no plan."""
    latents = closest_free_variables(model, record.latent) if hasattr(record.latent, "owner") else []
    return (not record.mechanism.discrete and bool(latents)
            and all(not v.type.dtype.startswith(("int", "uint")) for v in latents))


def plan_releases(model, records, *, method: str = "auto") -> list:
    """One plan per latent count vector (module docstring; releases of continuous latents by
    continuous mechanisms need none: :func:`is_continuous_release`). Latents whose releases are all
    of the counts themselves get a cells plan (the first release sets the window; further
    releases make it a children plan); latents with a conditioned release or a release of a
    linear query get a fibre plan, or a totals plan for group totals (``method="fibre"``:
    a fibre plan there too)."""
    plans = []
    records = [r for r in records if not is_continuous_release(model, r)]
    for latent, entries in entries_from(model, records, resolve_query).items():
        special = [e for e in entries if respects_invariants(e.record.mechanism) or e.query is not None]
        if not special:
            plans.append(_cells_plan(model, entries[0].record))
            continue
        plan = plan_fibre(model, latent, entries, allow_convolution=method != "fibre")
        if plan.method == "fibre":
            plans.append(plan)
            continue
        plans.append(TotalsPlan(
            record=plan.record, latent_name=plan.latent_name,
            release_value=entries[0].value.reshape(plan.shape), support=plan.support,
            group_codes=np.asarray(plan.record.mechanism.invariants.group_codes).reshape(-1),
        ))
    return plans
