"""Chains of dpinfer's compiled Gibbs sampler: counts given parameters, then parameters given
counts.

One iteration (sweep) of a chain, which gives one stored draw, is ``nuts_per_sweep`` NUTS
transitions (3 by default) of the continuous parameters q given all counts
(:mod:`dpinfer.inference.engines.compiled.nuts`; the log density is the model with the counts as data), with
``counts_per_sweep`` draws (2 by default) of every count block given the current parameters
(:mod:`dpinfer.inference.engines.compiled.exact_counts`; for nested measurements one sweep of
:mod:`dpinfer.lattice.nested`) spread among them, the first before the first
transition: with the defaults, counts, NUTS, counts, NUTS, NUTS.

Why these defaults (``benchmarks/README.md``): a small count and its log rate are tightly
coupled, so the counts' effective sample size grows with the number of count draws that
alternate with parameter moves (two per sweep nearly double it on the nation table); the
hyperparameters gain from more NUTS moves per sweep, and a draw of the counts costs one to
two NUTS transitions on county tables.

Both steps leave the joint posterior p(q, x | releases) invariant, so their composition does
(a Gibbs sampler with a Metropolis-within-Gibbs block). During tuning the step size is adapted
by dual averaging after every transition and the diagonal metric in Stan's windows (counted in
sweeps, one point per sweep), each entry sqrt(Var q_i / Var grad_i) as nutpie's (on the county
model it lets the step size double against Stan's Var q_i: 0.40 against 0.21); before the
first window the metric is 1 / |grad_i| at the start, nutpie's first guess (county model: the
first 50 sweeps 3x cheaper than with the unit metric, whose trees ran deep). A tuning sweep is
one count draw and one NUTS transition, and its iterations are discarded: the kernel that must
leave the posterior invariant is the one after tuning. (Against tuning sweeps of the stored
draws' shape, three transitions and one count draw, this made county fits about 20% faster,
0.66-0.73 s -> 0.54-0.55 s with the same or better ESS, and the nation's sampling 31 -> 22 s
with every ESS up: benchmarks/README.md.) A draw's statistics are its last
transition's, except the tree depth (the largest), the leapfrog steps (summed) and divergences
(any).

The sweeps run inside one compiled function (numba, cached on disk per combination of block
kinds), called in chunks of about half a second (at most 1/40 of the run) so that progress can
be reported and a stop (Ctrl-C) waits little; all state lives in arrays, so a chain saved
between two calls continues exactly (:mod:`dpinfer.inference.checkpoint`). Chains
run in threads: the function releases the GIL, so two chains use two cores. Each chain has its
own random stream (xoshiro256**) seeded from the caller's ``numpy.random.Generator``, so a
seed gives the same draws whatever the thread scheduling.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import literal_unroll

from dpinfer._kernel import kernel
from dpinfer._random_stream import new_stream, standard_normal
from dpinfer.inference.checkpoint import ChainState, Interrupted, interrupted_message
from dpinfer.inference.engines.compiled.count_blocks import GroupTotals, IndependentCells
from dpinfer.inference.engines.compiled.exact_counts import (
    HOLD_RATIO,
    HOLD_RATIO_TUNING,
    draw_given_totals,
    draw_independent,
    flat_prior_table,
    group_mixing_tables,
)
from dpinfer.inference.engines.compiled.nuts import (
    log_density_at,
    metric_windows,
    nuts_transition,
    reasonable_step_size,
)
from dpinfer.lattice.nested.directions import sweep_products
from dpinfer.lattice.nested.kernel import cells_redrawn_alone, current_sums

MAX_TREE_DEPTH = 10
NUTS_STATS = ("lp", "tree_depth", "n_steps", "acceptance_rate", "diverging", "energy",
              "energy_error", "step_size")
_CHUNKS = 40  # progress reports per chain, at least
_CALL_SECONDS = 0.5  # a compiled call's target length (a stop waits for the running one)
NUTS_PER_SWEEP = 3  # NUTS transitions of the parameters per stored draw (benchmarks/README.md)
COUNTS_PER_SWEEP = 2  # draws of the counts per stored draw, spread among those transitions

# dual averaging state (Hoffman & Gelman 2014 §3.2): mu, log eps, log eps-bar, h-bar, t, eps,
# and the target acceptance
_MU, _LOG_EPS, _LOG_EPS_BAR, _H_BAR, _T, _EPS, _TARGET = range(7)
_GAMMA, _T0, _KAPPA = 0.05, 10.0, 0.75


@kernel(nogil=True)
def _restart_step_size(adapt, eps):
    adapt[_MU] = math.log(10.0 * eps)
    adapt[_LOG_EPS] = math.log(eps)
    adapt[_LOG_EPS_BAR] = 0.0
    adapt[_H_BAR] = 0.0
    adapt[_T] = 0.0
    adapt[_EPS] = eps


@kernel(nogil=True)
def _update_step_size(adapt, accept):
    adapt[_T] += 1.0
    t = adapt[_T]
    eta = 1.0 / (t + _T0)
    adapt[_H_BAR] = (1.0 - eta) * adapt[_H_BAR] + eta * (adapt[_TARGET] - accept)
    adapt[_LOG_EPS] = adapt[_MU] - math.sqrt(t) / _GAMMA * adapt[_H_BAR]
    weight = t ** -_KAPPA
    adapt[_LOG_EPS_BAR] = weight * adapt[_LOG_EPS] + (1.0 - weight) * adapt[_LOG_EPS_BAR]
    adapt[_EPS] = math.exp(adapt[_LOG_EPS])


METRIC_TOWARD_DRAWS = 0.25  # where the metric sits between nutpie's (0) and Stan's (1), log scale


@kernel(nogil=True)
def _metric_variance(m2_q, m2_grad, c):
    """The diagonal metric's entry (inverse mass) from ``c`` points' sums of squared
    deviations of a parameter and of its gradient:

        sqrt(Var q / Var grad) * (Var q * Var grad) ** (a / 2),  a = METRIC_TOWARD_DRAWS,

    i.e. Var q ** ((1 + a) / 2) / Var grad ** ((1 - a) / 2): nutpie's sqrt(Var q / Var grad)
    (Seyboldt et al.) at a = 0, Stan's Var q at a = 1, and for a Gaussian whose coordinate is
    independent of the others Var q whatever a (Var grad = 1 / Var q). Where a coordinate is
    coupled to others, nutpie's is sqrt(marginal x conditional variance) and gives it a small
    scale; a = 1/4 moves it a quarter of the way (in log scale) to the marginal variance. Measured
    over 16 seeds each (benchmarks/README.md, "The metric between nutpie's and Stan's"): on B3
    (100 latent records and beta) the min ESS of beta 286 -> 339 with 68.7 -> 64.5 leapfrog
    steps a draw; on the demo's county model the min ESS of mu and sigma 777 -> 879 with 43.8 ->
    44.8 steps; a = 1/2 did about as well on both, a = 1 (Stan's) worse than a = 0 on both. Var q
    where the gradient does not vary."""
    var_q = m2_q / max(c - 1.0, 1.0)
    var_grad = m2_grad / max(c - 1.0, 1.0)
    if var_grad > 0.0 and var_q > 0.0:
        return math.sqrt(var_q / var_grad) * (var_q * var_grad) ** (0.5 * METRIC_TOWARD_DRAWS)
    return var_q


@kernel(nogil=True)
def nested_tables(block, q, counts, env):
    """Bring a nested count block (:meth:`~dpinfer.inference.engines.compiled.count_blocks.NestedCounts.native`)
    to the parameters q and the counts: its counts and their area and term sums from
    ``counts``, the prior's flat table and a GroupedNegativeBinomial's group factors from q."""
    (flat, hoisted, offset, grid, rows, prior_start, table, x, S, tsum, box_lo, box_hi, lo_open, hi_open,
     order, child_ptr, child_area, area_leaf, term_ptr, term_cells, term_value, term_table,
     term_area, meta, inv2v, values, mixing_address, mixing_at, mixing_out, group_area, leaf_group,
     group_parent, trim, cell_shape, stats, column) = block
    flat_prior_table(flat, hoisted, q, env, grid, rows, table)
    n_leaves, n_cells = x.shape
    for i in range(n_leaves * n_cells):
        x[i // n_cells, i % n_cells] = counts[offset + i]
    current_sums(x, S, tsum, order, child_ptr, child_area, area_leaf, term_cells, term_area)
    if mixing_at.size:
        group_mixing_tables(mixing_address, q, env, mixing_out, mixing_at, values, group_area,
                            leaf_group, group_parent, S, box_lo, box_hi, prior_start, table)


@kernel(nogil=True)
def _draw_blocks(q, counts, env, cells, totals, nested, hold_ratio, rng, row, refill):
    """Every count block's draw; their statistics into ``row`` at each block's columns.
    ``refill``: bring nested blocks to q and the counts first (:func:`nested_tables`); False
    only when neither has changed since the last draw (the parameters held, the counts moved by
    these blocks alone), which keeps their tables: the group factors' tilt towards the counts
    is then the last refill's, which leaves every move's law unchanged (its docstring)."""
    for b in literal_unroll(cells):
        (full, hoisted, point, offset, grid, release_table, release, tails, shape, log_eta,
         lw, w, cdf, envelope, column) = b
        if grid.shape[0] == 0:
            continue
        bound, kept = draw_independent(full, hoisted, point, q, counts, env, offset, grid, release_table,
                                       lw, w, cdf, envelope, release, tails, shape, log_eta,
                                       hold_ratio, rng)
        if bound < 0.0:
            return False
        row[column] = max(row[column], math.expm1(bound))  # the sweep's largest bound
        row[column + 1] += kept
    for b in literal_unroll(totals):
        (full, hoisted, point, offset, grid, release_table, release, tails, shape, group_ptr,
         group_cells, targets, lw, w, cdf, envelope, stats, column) = b
        if grid.shape[0] == 0:
            continue
        draw_given_totals(full, hoisted, point, q, counts, env, offset, grid, release_table, lw, w, cdf,
                          envelope, release, tails, shape, group_ptr, group_cells, targets,
                          hold_ratio, rng, stats)
        row[column] += stats[0]
        row[column + 1] += stats[2]
        row[column + 2] += stats[3]
    if nested is not None:  # None: pruned at compile time, the nested kernels are not compiled
        for b in literal_unroll(nested):
            (flat, hoisted, offset, grid, rows, prior_start, table, x, S, tsum, box_lo, box_hi, lo_open, hi_open,
             order, child_ptr, child_area, area_leaf, term_ptr, term_cells, term_value, term_table,
             term_area, meta, inv2v, values, mixing_address, mixing_at, mixing_out, group_area, leaf_group,
             group_parent, trim, cell_shape, stats, column) = b
            if grid.shape[0] == 0:
                continue
            if refill:
                nested_tables(b, q, counts, env)
            n_leaves, n_cells = x.shape
            stats[:] = 0
            failed = sweep_products(x, S, tsum, box_lo, box_hi, lo_open, hi_open, table, prior_start, order, child_ptr,
                                    child_area, area_leaf, term_ptr, term_cells, term_value, term_table,
                                    meta, inv2v, values, trim, cell_shape, rng, stats)
            for i in range(n_leaves * n_cells):
                counts[offset + i] = x[i // n_cells, i % n_cells]
            row[column] += stats[1]
            row[column + 1] += stats[2]
            row[column + 2] += failed
    return True


@kernel(nogil=True)
def _sweeps(first, last, tune, warm_start, logp_grad, q, grad, counts, env, inv_mass, moving, adapt,
            metric_count, metric_mean, metric_m2, window_ends, max_depth, cells, totals, nested, rng, out_q,
            out_counts, out_stats, row, nuts_per_sweep, counts_per_sweep, spread, spread_every, spread_burn):
    """Iterations first..last-1 of a chain (module docstring). Returns 0, or 1 if a count
    block found a window without mass, 2 if the parameters' log density is not finite.

    The counts are drawn before transition t of the sweep's ``nuts_per_sweep`` when
    floor(t c / nuts_per_sweep) steps up (c = ``counts_per_sweep``): c draws spread evenly,
    the first before the first transition.

    The first ``warm_start`` tuning iterations (:class:`Stepper`: min(50, tune / 10), 0 for
    empirical Bayes) leave the counts at their start (on the releases' fibre) so that the
    parameters first move to agree with them; the others are one
    count draw and one NUTS transition (the extra moves buy the stored draws' mixing); tuning holds cells
    whose windows miss their conditional law at a lower ratio (tuning draws are discarded:
    only the kernel used after tuning must, and does, leave the posterior invariant).

    ``nuts_per_sweep`` = 0 **holds the parameters** at q (empirical Bayes: the counts' posterior
    given them, :mod:`dpinfer.inference.empirical_bayes`): an iteration is ``counts_per_sweep``
    count draws (one while tuning, which is then a burn-in), no NUTS and no adaptation; the
    nested blocks' tables are filled only when q has changed (and once per call), as the counts
    move by their own draws alone otherwise. With ``spread_every`` > 0, every ``spread_every``
    stored draws q is drawn afresh, q = spread[0] + spread[1] * z with z standard normal (the
    parameters' approximate marginal posterior: empirical Bayes with their uncertainty), and
    ``spread_burn`` count draws follow it before the next stored one (the counts forget the
    previous q).

    ``moving`` (one flag per parameter) holds the parameters without it at q while NUTS moves
    the others (their inverse mass 0: :func:`~dpinfer.inference.engines.compiled.nuts._momentum`;
    empirical Bayes with some parameters drawn with the counts); ``spread`` then redraws only
    the held ones, and its ``spread_burn`` burn-in sweeps are each a count draw and a NUTS
    transition."""
    n = q.shape[0]
    held = nuts_per_sweep == 0
    stale = True  # the nested blocks' tables are not those of q and the counts
    moved = nuts_per_sweep > 0  # NUTS moves q between count draws, so their tables are refilled
    for it in range(first, last):
        row[:] = 0.0
        hold_ratio = HOLD_RATIO if it >= tune else HOLD_RATIO_TUNING
        if held:
            burn = 0
            if spread_every > 0 and it >= tune and (it - tune) % spread_every == 0:
                for i in range(n):
                    q[i] = spread[0, i] + spread[1, i] * standard_normal(rng)
                stale, burn = True, spread_burn
            for t in range(burn + (counts_per_sweep if it >= tune else 1)):
                if not _draw_blocks(q, counts, env, cells, totals, nested, hold_ratio, rng, row, stale):
                    return 1
                stale = False
            if it >= tune:
                k = it - tune
                out_q[k] = q
                out_counts[k] = counts
                out_stats[k] = row
            continue
        n_sweep = nuts_per_sweep if it >= tune else 1  # tuning: one transition, one count draw
        c_sweep = counts_per_sweep if it >= tune else 1
        burn = 0
        if spread_every > 0 and it >= tune and (it - tune) % spread_every == 0:
            for i in range(n):
                if not moving[i]:
                    q[i] = spread[0, i] + spread[1, i] * standard_normal(rng)
            burn = spread_burn
        for t in range(-burn, n_sweep):  # t < 0: the spread's burn-in, a count draw and a transition each
            if it >= warm_start and (t < 0 or (t * c_sweep) // n_sweep > ((t - 1) * c_sweep) // n_sweep):
                if not _draw_blocks(q, counts, env, cells, totals, nested, hold_ratio, rng, row, moved):
                    return 1
            if n == 0:
                continue
            f_lp = log_density_at(logp_grad, q, grad, env)
            if f_lp == -math.inf:
                return 2
            if adapt[_EPS] <= 0.0:  # first iteration: Hoffman & Gelman's initial step size and,
                for i in range(n):  # where none was given (0), nutpie's first metric, 1 / |gradient| (bounded)
                    if not moving[i]:
                        inv_mass[i] = 0.0
                    elif inv_mass[i] <= 0.0:
                        inv_mass[i] = min(max(1.0 / abs(grad[i]), 1e-4), 1e4) if grad[i] != 0.0 else 1.0
                _restart_step_size(adapt, reasonable_step_size(logp_grad, env, q, grad, f_lp,
                                                               1.0, inv_mass, rng))
            eps = adapt[_EPS]
            lp, depth, steps, accept, diverging, energy, energy_error = nuts_transition(
                logp_grad, env, q, grad, f_lp, eps, inv_mass, max_depth, rng)
            row[0] = lp  # the sweep's last transition; the tree's largest depth, the steps
            row[1] = max(row[1], depth)  # summed, a divergence in any of its transitions
            row[2] += steps
            row[3] = accept
            row[4] = max(row[4], diverging)
            row[5] = energy
            row[6] = energy_error
            row[7] = eps
            if it < tune:
                _update_step_size(adapt, accept)
        if n > 0 and it < tune:  # the metric: once per sweep, in Stan's windows of sweeps
            metric_count[0] += 1.0
            c = metric_count[0]
            for i in range(n):  # Welford's running moments of q (row 0) and its gradient (row 1)
                for r, v in ((0, q[i]), (1, grad[i])):
                    delta = v - metric_mean[r, i]
                    metric_mean[r, i] += delta / c
                    metric_m2[r, i] += delta * (v - metric_mean[r, i])
            for end in window_ends:
                if it == end:  # the variances' ratio, regularised as Stan's; a fresh step size
                    for i in range(n):
                        inv_mass[i] = ((c / (c + 5.0)) * _metric_variance(metric_m2[0, i], metric_m2[1, i], c)
                                       + 1e-3 * (5.0 / (c + 5.0))) if moving[i] else 0.0
                        metric_mean[:, i] = 0.0
                        metric_m2[:, i] = 0.0
                    metric_count[0] = 0.0
                    lp0 = log_density_at(logp_grad, q, grad, env)
                    _restart_step_size(adapt, reasonable_step_size(
                        logp_grad, env, q, grad, lp0, adapt[_EPS], inv_mass, rng))
            if it == tune - 1:
                adapt[_EPS] = math.exp(adapt[_LOG_EPS_BAR])
        if it >= tune:
            k = it - tune
            out_q[k] = q
            out_counts[k] = counts
            out_stats[k] = row
    return 0


@dataclass
class ChainResult:
    """Draws of one chain after tuning: q (draws, n), counts (draws, n_counts) and statistics
    (name -> (draws,)): NUTS's under PyMC's names, then each count block's."""

    q: np.ndarray
    counts: np.ndarray
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    resumed_at: int = 0  # iterations a checkpoint had done before this process continued it
    stopped: str = ""  # why run_chains' stop_when stopped the chain before its draws ended


class SamplingError(RuntimeError):
    """A chain could not continue (a window without mass, a non-finite log density)."""


class TimeUpError(SamplingError):
    """``max_minutes`` ended before the chains had stored enough draws to keep."""


def stat_columns(blocks) -> tuple[list, list]:
    """Names of the statistics columns, and each block's first column."""
    names, starts = list(NUTS_STATS), []
    for b in blocks:
        starts.append(len(names))
        names.extend(b.stat_names)
    return names, starts


def fresh_state(model, n_stats: int, *, draws: int, rng: np.random.Generator,
                q0: np.ndarray, counts0: np.ndarray, target_accept: float,
                count_dtype=np.int64, inv_mass0: np.ndarray | None = None) -> ChainState:
    """A chain before its first iteration: at (q0, counts0), its stream drawn from ``rng``;
    its stored counts of ``count_dtype`` (int32 halves a state's draws where every count is
    known to stay below 2^31: :func:`~dpinfer.inference.engines.compiled.engine.count_dtype`);
    its first diagonal metric (inverse mass) ``inv_mass0`` where positive, 1 / |gradient| at
    the start elsewhere (:func:`_sweeps`)."""
    n = model.n
    adapt = np.zeros(7)
    adapt[_TARGET] = target_accept
    counts = np.array(counts0, dtype=np.int64)
    inv_mass = np.zeros(n) if inv_mass0 is None else np.array(inv_mass0, dtype=float)
    return ChainState(q=np.array(q0, dtype=float), counts=counts, inv_mass=inv_mass, adapt=adapt,
                      metric_count=np.zeros(1), metric_mean=np.zeros((2, n)), metric_m2=np.zeros((2, n)),
                      stream=new_stream(rng), draws_q=np.empty((draws, n)),
                      draws_counts=np.empty((draws, counts.size), dtype=count_dtype),
                      draws_stats=np.zeros((draws, n_stats)))


def continued_state(model, state: ChainState, n_stats: int, *, draws: int) -> ChainState:
    """``state``'s chain before a fresh warm-up: its point, counts, metric (as the first
    metric) and random stream carried over, its step size, adaptation and draws anew (after an
    empirical-Bayes estimate whose E-steps moved the chain: :mod:`dpinfer.io.nmf.state_scan`)."""
    fresh = fresh_state(model, n_stats, draws=draws, rng=np.random.default_rng(0), q0=state.q,
                        counts0=state.counts, target_accept=state.adapt[_TARGET],
                        count_dtype=state.draws_counts.dtype, inv_mass0=state.inv_mass)
    fresh.stream = state.stream
    return fresh


class Stepper:
    """One chain's compiled kernel, its count blocks' data and scratch, advanced from its
    ``state`` a given number of iterations at a time (:func:`run_chain`; the shards of
    :mod:`dpinfer.inference.sharded`, one iteration at a time). ``model`` is a
    :class:`dpinfer.inference.engines.compiled.model.CompiledModel`, ``blocks`` the count
    blocks (objects with ``kind`` ("cells", "totals" or "nested"), ``native(column)`` giving
    the kernel's data tuple with fresh scratch, and ``stat_names``). ``moving``: the parameters
    NUTS moves (default all; the others held, :func:`_sweeps`); ``adapt_metric`` False keeps the
    state's metric through tuning (only the step size adapts); ``warm_start``: tuning iterations
    that leave the counts at their start (default min(50, tune / 10), 0 with the parameters
    held)."""

    def __init__(self, model, blocks, state: ChainState, *, tune: int, draws: int,
                 max_tree_depth: int = MAX_TREE_DEPTH, nuts_per_sweep: int = NUTS_PER_SWEEP,
                 counts_per_sweep: int = COUNTS_PER_SWEEP, spread=None, moving: np.ndarray | None = None,
                 adapt_metric: bool = True, warm_start: int | None = None):
        self.model, self.state, self.tune, self.total = model, state, tune, tune + draws
        self.env = model.environment(state.counts)  # the model functions' view of the counts and the data
        self.use_blocks(blocks)
        self.row = np.zeros(len(self.names))
        self.grad = np.empty(model.n)
        self.window_ends = np.asarray((metric_windows(tune) if adapt_metric else []) or [-1], dtype=np.int64)
        self.moving = np.ones(model.n, bool) if moving is None else np.asarray(moving, bool)
        self.warm_start = (0 if nuts_per_sweep == 0 else min(50, tune // 10)) if warm_start is None else warm_start
        self.max_tree_depth, self.nuts_per_sweep, self.counts_per_sweep = (
            max_tree_depth, nuts_per_sweep, counts_per_sweep)
        # spread: (centre, sd, every, burn) of held parameters drawn afresh (_sweeps), or None
        centre, sd, self.spread_every, self.spread_burn = spread or (np.zeros(model.n), np.zeros(model.n), 0, 0)
        self.spread = np.stack([np.asarray(centre, float), np.asarray(sd, float)])

    def use_blocks(self, blocks) -> None:
        """Draw the counts with ``blocks`` from the next iteration on (the same latents, in the
        same order; wider boxes of a nested block, say): their kernels' data, fresh scratch."""
        self.names, columns = stat_columns(blocks)
        cells = tuple(b.native(c) for b, c in zip(blocks, columns) if b.kind == "cells")
        totals = tuple(b.native(c) for b, c in zip(blocks, columns) if b.kind == "totals")
        nested = tuple(b.native(c) for b, c in zip(blocks, columns) if b.kind == "nested")
        self.cells = cells or (IndependentCells.placeholder(),)
        self.totals = totals or (GroupTotals.placeholder(),)
        self.nested = nested or None  # no nested block: the kernels' nested branch is pruned

    def advance(self, last: int) -> None:
        """Run iterations ``state.done`` .. ``last`` - 1 (raises :class:`SamplingError`)."""
        s = self.state
        code = _sweeps(s.done, last, self.tune, self.warm_start, self.model.logp_grad_address, s.q, self.grad,
                       s.counts, self.env, s.inv_mass, self.moving, s.adapt, s.metric_count, s.metric_mean,
                       s.metric_m2, self.window_ends,
                       self.max_tree_depth, self.cells, self.totals, self.nested, s.stream, s.draws_q,
                       s.draws_counts, s.draws_stats, self.row, self.nuts_per_sweep, self.counts_per_sweep,
                       self.spread, self.spread_every, self.spread_burn)
        if code == 1:
            raise SamplingError("a count block's window holds no mass (a release far outside "
                                "its window without exact tails)")
        if code == 2:
            raise SamplingError("the parameters' log density is not finite at the current point; "
                                "check the model's initial values and priors")
        s.done = last

    def log_density(self, q: np.ndarray | None = None, grad: np.ndarray | None = None) -> float:
        """The parameters' log density (the model with the counts as data) at ``q`` (default:
        the state's), its gradient written into ``grad`` (default: the stepper's scratch)."""
        return float(log_density_at(self.model.logp_grad_address, self.state.q if q is None else q,
                                    self.grad if grad is None else grad, self.env))

    def e_step(self, q: np.ndarray) -> np.ndarray:
        """The E-step of :mod:`dpinfer.inference.empirical_bayes` at the estimated parameters
        ``q``; returns the chain's whole parameter point after it. No parameter ``moving``: one
        draw of every count block given q (after-tuning rules; the point is q). Else the held
        parameters are set to q's and the chain makes one tuning iteration: a draw of the counts
        and a NUTS transition of the moving parameters given them (its step size and metric
        adapting as in tuning). Raises :class:`SamplingError`."""
        if not self.moving.any():
            self.draw_counts(q)
            return q
        held = ~self.moving
        self.state.q[held] = q[held]
        self.advance(self.state.done + 1)
        return self.state.q

    def draw_counts(self, q: np.ndarray) -> None:
        """One draw of every count block given the parameters ``q`` (not the chain's own),
        after-tuning rules, into the state's counts. Raises :class:`SamplingError`."""
        self.row[:] = 0.0
        if not _draw_blocks(q, self.state.counts, self.env, self.cells, self.totals, self.nested, HOLD_RATIO,
                            self.state.stream, self.row, True):
            raise SamplingError("a count block's window holds no mass (a release far outside "
                                "its window without exact tails)")

    def cells_redrawn_alone(self, q: np.ndarray, out: np.ndarray) -> bool:
        """Copies of the chain's counts (the rows of ``out``, (copies, counts)) with every cell
        of every nested count block redrawn alone given the others at the parameters ``q``
        (:func:`~dpinfer.lattice.nested.kernel.cells_redrawn_alone`; the other blocks' counts
        as they are), from the chain's random stream; the chain's counts are left as they
        were. Returns False if a cell's law has no mass."""
        out[:] = self.state.counts
        for b in self.nested or ():
            (flat, hoisted, offset, grid, rows, prior_start, table, x, S, tsum, box_lo, box_hi, lo_open, hi_open,
             order, child_ptr, child_area, area_leaf, term_ptr, term_cells, term_value, term_table,
             term_area, meta, inv2v, values, *_, trim, cell_shape, stats, column) = b
            if grid.shape[0] == 0:  # no counts in the block: nothing to fill or redraw (as _draw_blocks)
                continue
            nested_tables(b, q, self.state.counts, self.env)
            n_leaves, n_cells = x.shape
            copies = np.empty((out.shape[0], n_leaves, n_cells), np.int64)
            if not cells_redrawn_alone(x, S, tsum, box_lo, box_hi, table, prior_start, order, child_ptr, child_area,
                                       area_leaf, term_ptr, term_cells, term_value, term_table, meta, inv2v, values,
                                       trim, self.state.stream, copies):
                return False
            out[:, offset:offset + n_leaves * n_cells] = copies.reshape(out.shape[0], -1)
        return True

    def nested_columns(self) -> list:
        """Each nested count block's cells, as the positions of their counts in the chain's
        count vector: a list per block of one index array per cell."""
        columns = []
        for b in self.nested or ():
            offset, x = b[2], b[7]
            n_leaves, n_cells = x.shape
            at = offset + np.arange(n_leaves * n_cells).reshape(n_leaves, n_cells)
            columns.append([at[:, c] for c in range(n_cells)])
        return columns

    def result(self, seconds: float) -> ChainResult:
        """The chain's stored draws and statistics (after its last iteration)."""
        return chain_result(self.model, self.names, self.state, self.state.draws_q.shape[0], seconds)


def chain_result(model, names: list, state: ChainState, kept: int, seconds: float) -> ChainResult:
    """A chain's first ``kept`` stored draws and their statistics (``names``: the columns)."""
    stats = {name: state.draws_stats[:kept, j] for j, name in enumerate(names)}
    if not model.n:
        for name in NUTS_STATS:
            del stats[name]
    return ChainResult(state.draws_q[:kept], state.draws_counts[:kept], stats, seconds)


def run_chain(model, blocks, state: ChainState, *, tune: int, draws: int,
              max_tree_depth: int = MAX_TREE_DEPTH, nuts_per_sweep: int = NUTS_PER_SWEEP,
              counts_per_sweep: int = COUNTS_PER_SWEEP, progress=None, save=None,
              save_every: int = 0, stop: threading.Event | None = None, spread=None,
              moving: np.ndarray | None = None, adapt_metric: bool = True) -> ChainResult | None:
    """Run a chain (module docstring) from ``state`` (:func:`fresh_state`, or a checkpoint's)
    to its ``tune + draws`` iterations (``model``, ``blocks``, ``spread``, ``moving`` and
    ``adapt_metric`` as :class:`Stepper`'s).
    ``save(state)`` is called every ``save_every`` iterations, at the end and when the chain
    stops early: when ``stop`` is set, after the compiled call running (returning None).
    Calls take about half a second each (sized from the last one), so a stop is prompt."""
    start_time = time.perf_counter() - state.seconds
    stepper = Stepper(model, blocks, state, tune=tune, draws=draws, max_tree_depth=max_tree_depth,
                      nuts_per_sweep=nuts_per_sweep, counts_per_sweep=counts_per_sweep, spread=spread,
                      moving=moving, adapt_metric=adapt_metric)
    total = tune + draws
    longest = max(1, math.ceil(total / _CHUNKS))
    chunk = 1

    saved_at = [-1]

    def saved():  # once per iteration count: a stop right after a periodic save writes nothing more
        state.seconds = time.perf_counter() - start_time
        if save is not None and saved_at[0] != state.done:
            save(state)
            saved_at[0] = state.done

    while state.done < total:
        if stop is not None and stop.is_set():
            saved()
            return None
        first = state.done
        last = min(total, first + chunk)
        if save_every:
            last = min(last, (first // save_every + 1) * save_every)
        began = time.perf_counter()
        stepper.advance(last)
        seconds = time.perf_counter() - began
        chunk = int(min(longest, max(1, (last - first) * _CALL_SECONDS / max(seconds, 1e-3))))
        if progress is not None:
            progress.advance(last - first)
        if (save_every and last % save_every == 0) or last == total:
            saved()
    return stepper.result(time.perf_counter() - start_time)


def _kernels_on_disk() -> bool:
    """Whether numba's cache holds the sampler's compiled kernels (from an earlier process)."""
    try:
        return Path(_sweeps._cache._cache_file._index_path).exists()
    except AttributeError:  # numba's cache internals moved: say nothing rather than guess
        return True


class Progress:
    """Iterations done over all chains, on one updating line of a terminal (stderr), or a
    line every 10 s otherwise (logs). The first call compiles the sampler's kernels once per
    machine (numba's cache); that is announced, since it takes tens of seconds."""

    def __init__(self, total: int, label: str, enabled: bool, done: int = 0, status=None):
        self.total, self.label, self.enabled, self.status = total, label, enabled, status
        self.tty = enabled and sys.stderr.isatty()
        self.every = 1.0 if self.tty else 10.0
        self.done = self._resumed = done  # iterations done before (a resumed fit)
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._last = self._start
        if enabled and not _sweeps.signatures and not _kernels_on_disk():
            print(f"{label}: compiling the sampler's kernels (once per machine and dpinfer "
                  "version, about 30 s; then read from numba's cache)", file=sys.stderr, flush=True)

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.perf_counter()
            if self.enabled and (now - self._last >= self.every or self.done == self.total):
                self._last = now
                line = self.line(now - self._start)
                if self.tty:
                    print("\r" + line, end="\n" if self.done == self.total else "",
                          file=sys.stderr, flush=True)
                else:
                    print(line, file=sys.stderr, flush=True)

    def line(self, seconds: float) -> str:
        """"<label>: done/total iterations, elapsed, iterations per second over all chains and
        the time left at that rate" (the rate of this process: a resumed fit's earlier
        iterations are not counted in it), then ``status()`` if given (a cluster's workers)."""
        text = f"{self.label}: {self.done}/{self.total} iterations, {_duration(seconds)}"
        rate = (self.done - self._resumed) / seconds if seconds > 0 else 0.0
        if rate > 0 and self.done < self.total:
            text += f", {rate:.3g} it/s, about {_duration((self.total - self.done) / rate)} left"
        if self.status is not None:
            text += f", {self.status()}"
        return text


def _duration(seconds: float) -> str:
    """12.3 s, 4 min 05 s, 2 h 07 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


_WATCH = 0.25  # seconds between two looks at the deadline
_DRAW_WATCH = 30.0  # seconds between two looks at the draws (stop_when)
_STOP_LAG = 3 * _WATCH  # a stop takes effect after the compiled calls running (~0.5 s): draws made meanwhile


def run_chains(model, blocks, *, chains: int, cores: int, tune: int, draws: int,
               seeds: list, starts: list, progressbar: bool = True,
               max_tree_depth: int = MAX_TREE_DEPTH, target_accept: float = 0.8,
               nuts_per_sweep: int = NUTS_PER_SWEEP, counts_per_sweep: int = COUNTS_PER_SWEEP,
               checkpoint=None, more=None, spread=None, count_dtype=np.int64,
               deadline: float | None = None, reserve_per_draw: float = 0.0,
               inv_mass0: np.ndarray | None = None, moving: np.ndarray | None = None,
               adapt_metric: bool = True, stop_when=None) -> list[ChainResult]:
    """``chains`` chains, ``cores`` at a time in threads; ``starts`` gives (q0, counts0) per
    chain, ``seeds`` a ``numpy.random.Generator`` per chain for its random stream. Returns the
    chains' results in order. With ``checkpoint``
    (:class:`dpinfer.inference.checkpoint.Checkpoint`) each chain starts from its saved state
    where there is one and saves its state every ``checkpoint.every`` iterations; Ctrl-C
    stops every chain after its running call, saves them, and raises
    :class:`~dpinfer.inference.checkpoint.Interrupted` saying how to resume.

    ``more(states, seconds)``: called when every chain has its draws, with the chains' states
    and the seconds an iteration of the round took; it returns how many more draws every chain should make
    (0: none). The chains then **sample on** from where they are (the kernel after tuning is
    fixed, so the continued chains are the same Markov chains; a saved chain carries its draws
    so far, so a resumed fit continues with them). ``spread``: :class:`Stepper`'s;
    ``count_dtype``: :func:`fresh_state`'s. ``deadline`` (``time.monotonic()`` seconds): the
    chains stop then, after their running calls, with the draws every chain has made (a time
    limit the caller set: not an error unless no draw is stored by then); ``reserve_per_draw``
    seconds per draw stored by every chain are kept back from it for the work on the draws
    after sampling (their verdict, summaries): the chains stop at
    ``deadline - reserve_per_draw x draws kept`` (the draws counted as they will be when the
    stop takes effect, at the rate of the last look). ``inv_mass0``: every fresh chain's first
    metric (:func:`fresh_state`); ``moving``, ``adapt_metric``: :class:`Stepper`'s.
    ``stop_when(states, kept)``: looked at every ``_DRAW_WATCH`` seconds while the chains
    make their draws, with the first ``kept`` stored draws of every chain; a message (not
    None) stops the chains there and they return those draws, as at the deadline (a fit the
    draws already show to fail, e.g. a count on an edge of its box, need not run on to the
    end before it is fitted again)."""
    n_stats = len(stat_columns(blocks)[0])
    states = []
    for c in range(chains):
        saved = checkpoint.load(c) if checkpoint is not None else None
        q0, counts0 = starts[c]
        states.append(saved if saved is not None else fresh_state(
            model, n_stats, draws=draws, rng=seeds[c], q0=q0, counts0=counts0,
            target_accept=target_accept, count_dtype=count_dtype, inv_mass0=inv_mass0))
    draws = max([draws] + [s.draws_q.shape[0] for s in states])  # a resumed fit may have sampled on
    for s in states:
        _extend(s, draws - s.draws_q.shape[0])
    resumed_at = [s.done for s in states]
    total = chains * (tune + draws)
    progress = Progress(total, "dpinfer: sampling", progressbar, done=sum(resumed_at))
    stop, expired, finished = threading.Event(), threading.Event(), threading.Event()
    flagged: list = []
    if stop_when is not None:
        def look():  # the draws so far, every _DRAW_WATCH seconds
            while not finished.wait(_DRAW_WATCH):
                kept = min(max(s.done - tune, 0) for s in states)
                reason = stop_when(states, kept) if kept else None
                if reason is not None:
                    flagged.append((kept, reason))
                    stop.set()
                    return

        threading.Thread(target=look, daemon=True).start()
    if deadline is not None:
        def watch():  # the deadline, less the time the draws kept by the stop will take afterwards
            seen, rate = (time.monotonic(), 0), 0.0
            while True:
                now, kept = time.monotonic(), min(max(s.done - tune, 0) for s in states)
                if now > seen[0]:
                    rate, seen = (kept - seen[1]) / (now - seen[0]), (now, kept)
                if now + reserve_per_draw * (kept + rate * _STOP_LAG) >= deadline:
                    expired.set()
                    stop.set()
                    return
                if finished.wait(_WATCH):
                    return

        threading.Thread(target=watch, daemon=True).start()

    def one(c):
        save = (lambda state: checkpoint.save(c, state)) if checkpoint is not None else None
        return run_chain(model, blocks, states[c], tune=tune, draws=draws, max_tree_depth=max_tree_depth,
                         nuts_per_sweep=nuts_per_sweep, counts_per_sweep=counts_per_sweep,
                         progress=progress, save=save, save_every=checkpoint.every if checkpoint else 0,
                         stop=stop, spread=spread, moving=moving, adapt_metric=adapt_metric)

    with _ctrl_c_sets(stop, progressbar):
        try:
            while True:
                began, before = time.perf_counter(), max(s.done for s in states)
                if cores <= 1 or chains == 1:
                    results = [one(c) for c in range(chains)]
                else:
                    with ThreadPoolExecutor(max_workers=min(cores, chains)) as pool:
                        results = list(pool.map(one, range(chains)))
                iterations = max(s.done for s in states) - before
                extra = 0 if more is None or any(r is None for r in results) else int(
                    more(states, (time.perf_counter() - began) / max(iterations, 1)))
                if extra <= 0:
                    break
                for s in states:
                    _extend(s, extra)
                draws += extra
                total += chains * extra
                progress.total = total
        finally:
            finished.set()  # the watch ends
    timed_out = expired.is_set()
    names = stat_columns(blocks)[0]
    if any(r is None for r in results) and flagged:  # the draws looked at, which show the fit fails
        kept, reason = flagged[0]
        results = [chain_result(model, names, s, kept, s.seconds) for s in states]
        for result in results:
            result.stopped = f"stopped at {kept} of {draws} draws per chain: {reason}"
        if progressbar:
            print(f"dpinfer: {results[0].stopped}", file=sys.stderr, flush=True)
    elif any(r is None for r in results) and timed_out:  # the time is up: the draws every chain has
        kept = min(max(s.done - tune, 0) for s in states)
        if kept < 4:
            raise TimeUpError(f"max_minutes ended with {kept} draws stored per chain (tuning: {tune} "
                                "iterations): give more time, or fewer tuning iterations")
        results = [chain_result(model, names, s, kept, s.seconds) for s in states]
        if progressbar:
            print(f"dpinfer: max_minutes is up: {kept} draws per chain kept", file=sys.stderr, flush=True)
    for result, done in zip(results, resumed_at):
        if result is not None:
            result.resumed_at = done
    if any(r is None for r in results):  # stopped by Ctrl-C before the end
        path = checkpoint.path if checkpoint is not None else None
        raise Interrupted(interrupted_message(path, sum(s.done for s in states), total))
    return results


def _extend(state: ChainState, extra: int) -> None:
    """Room for ``extra`` more stored draws in a chain's state."""
    if extra > 0:
        state.draws_q = np.concatenate([state.draws_q, np.empty((extra, state.draws_q.shape[1]))])
        state.draws_counts = np.concatenate([state.draws_counts, np.empty((extra, state.draws_counts.shape[1]),
                                                                          state.draws_counts.dtype)])
        state.draws_stats = np.concatenate([state.draws_stats, np.zeros((extra, state.draws_stats.shape[1]))])


@contextlib.contextmanager
def _ctrl_c_sets(stop: threading.Event, announce: bool):
    """Within the block, the first Ctrl-C (SIGINT) sets ``stop`` instead of raising, so the
    chains stop between two compiled calls with their state whole (a second Ctrl-C raises
    KeyboardInterrupt as usual). Only in the main thread (where Python delivers signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        stop.set()
        signal.signal(signal.SIGINT, previous)
        if announce:
            print("\ndpinfer: stopping the chains after their running iterations (Ctrl-C again to "
                  "abort at once)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
