"""One shard of a sharded fit (:mod:`dpinfer.inference.sharded`): the groups a worker holds,
their model with the shared parameters as data, and every chain's state of it.

The shard's model is the analyst's ``build_shard(groups)``: the groups' latent counts, their
releases and their local parameters, with each shared parameter a ``pm.Data`` of its name
(or local parameters alone, their data observed or ``pm.Data``: the counties' leaf-size
shapes of :mod:`dpinfer.io.nmf.county_sizes` given the counts).
It is fitted by the compiled engine's kernel (:class:`~dpinfer.inference.engines.compiled.chains.Stepper`):
an iteration given the shared parameters theta is one sweep of the one-machine engine with
theta fixed, exact count draws and NUTS on the local parameters, so it leaves
p(local, counts | theta, releases) invariant. After it the shard returns its summaries (the
model's Deterministics the driver's model takes as data) and keeps its counts and draws: they
leave the worker once, at the end (:meth:`Shard.finish`).

A Shard runs in the driver's process or, on Dask, as an actor on one worker (its methods
called remotely, its state kept there). Chains advance one after another within a shard,
each with its own theta written into the model's data before its iteration.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import pymc as pm

from dpinfer.inference import planning
from dpinfer.inference.checkpoint import Checkpoint, model_hash
from dpinfer.inference.engines.compiled import engine as compiled_engine
from dpinfer.inference.engines.compiled.chains import Stepper, continued_state, fresh_state, stat_columns
from dpinfer.mechanisms.records import releases_of


class Shard:
    """The groups ``groups`` of a sharded fit, built by ``build_shard(groups)``.

    ``shared`` maps each shared parameter to its shape; ``summaries`` names the shard model's
    Deterministics the driver needs, each with a leading axis over ``groups``; ``starts`` and
    ``probe`` are shared parameter values (name -> array): each chain's start, and a second
    point at which the terms a count block precomputes from the data are checked for a
    dependence on them. ``seeds``: an int per chain (its jittered start and its random
    stream). ``widenings``: (the failed latents: name -> bound, the counts of a nested latent
    widened alone: name -> (leaf, cell) pairs) of each earlier fit of the shard, whose windows
    are widened as ``dpinfer.sample`` widens them. ``restore``: a
    directory written by :meth:`save` to continue the chains from (the same shard of the same
    fit: its model hash is checked)."""

    def __init__(self, build_shard, groups: list, shared: dict, summaries: list, *, chains: int,
                 tune: int, draws: int, seeds: list, starts: list, probe: dict, tol: float,
                 settings: dict, widenings: list = (), restore: str | None = None):
        began = time.perf_counter()
        self.groups = list(groups)
        model = build_shard(self.groups)
        if not isinstance(model, pm.Model):
            raise TypeError(f"build_shard must return a pymc.Model, got {type(model).__name__} "
                            f"for the groups {short(self.groups)}")
        self.model, self.tune, self.draws = model, tune, draws
        plan = planning.plan_model(model, releases_of(model), method="auto")
        reason = compiled_engine.refusal(model, plan.latents, "auto")
        compiled = None
        if reason is None and (plan.summed or plan.tables):
            reason = "its latents are summed out in closed form (no latent counts to hold)"
        if reason is None:
            compiled, reason = compiled_engine.compile_for(model, plan.latents)
        if compiled is None:
            raise ValueError(f"a shard's model must be fitted by the compiled engine, and the model of "
                             f"the groups {short(self.groups)} cannot be: {reason}")
        self.compiled, self.plans, self.tol = compiled, plan.latents, tol
        self._positions = {}
        for name, shape in shared.items():
            positions = compiled.data.positions(name)
            if not positions:
                raise ValueError(f"the shard model of the groups {short(self.groups)} does not use the "
                                 f"shared parameter {name!r}: it must be a pm.Data named {name!r} that "
                                 "the model's local parameters or counts depend on")
            for j in positions:
                if compiled.data.values[j].shape != tuple(shape):
                    raise ValueError(f"the shard's pm.Data {name!r} has shape {compiled.data.values[j].shape}, "
                                     f"the shared parameter {tuple(shape)}")
            self._positions[name] = positions
        names = set(compiled.expand_names)
        for name in summaries:
            if name not in names:
                raise ValueError(f"the shard model of the groups {short(self.groups)} has no "
                                 f"Deterministic {name!r}, a summary the shared model takes as data")
        self.summary_names = list(summaries)
        self._summaries = compiled.values_function(self.summary_names)
        self.theta_dependent = _depending_on(compiled, [j for ps in self._positions.values() for j in ps],
                                             exclude=self.summary_names)
        at_zero = self._summaries(np.zeros(compiled.n), np.zeros(compiled.n_counts, np.int64))
        for name, value in zip(summaries, at_zero):
            shape = np.shape(value)
            if not shape or shape[0] != len(self.groups):
                raise ValueError(f"the summary {name!r} of the shard model of the groups {short(self.groups)} "
                                 f"has shape {shape}; its first axis must run over the shard's "
                                 f"{len(self.groups)} groups")
        planning.first_windows(self.plans, tol, exact_tails=True, at_least={})
        for failed, counts in widenings:  # an earlier fit's: dpinfer.sample's widening, replayed
            planning.widen(self.plans, failed, tol, counts)
        self._rehoist = []  # blocks whose grid-only terms depend on theta (found below)
        self.set_shared(probe)
        self.blocks = [compiled_engine.count_block(p, compiled) for p in self.plans]
        self.set_shared(starts[0])
        self._rehoist = [b for b in self.blocks if b.refresh_hoisted()]  # terms that depend on theta
        counts0 = compiled.counts_vector({p.latent_name: p.start for p in self.plans})
        self.hash = model_hash(compiled.key, compiled.data.values, counts0)  # theta at chain 0's start
        n_stats = len(stat_columns(self.blocks)[0])
        self.steppers = []
        for c in range(chains):
            self.set_shared(starts[c])
            if restore is not None:
                state = Checkpoint(restore, {"model": self.hash}, 0).load(c)
                if state is None:
                    raise FileNotFoundError(f"{restore} holds no state of chain {c}")
            else:
                rng = np.random.default_rng(seeds[c])
                q0 = compiled.initial_q(int(rng.integers(2**31)), model)
                state = fresh_state(compiled, n_stats, draws=draws, rng=rng, q0=q0, counts0=counts0,
                                    target_accept=settings["target_accept"])
            self.steppers.append(Stepper(compiled, self.blocks, state, tune=tune, draws=draws,
                                         max_tree_depth=settings["max_treedepth"],
                                         nuts_per_sweep=settings["nuts_per_sweep"],
                                         counts_per_sweep=settings["counts_per_sweep"]))
        self.seconds = time.perf_counter() - began  # building and compiling
        self.sweep_seconds = self.steppers[0].state.seconds if restore is not None else 0.0
        self.first_sweep_seconds = 0.0

    def restart(self, tune: int, draws: int) -> None:
        """Every chain continued from its state under a fresh warm-up of ``tune`` iterations,
        then ``draws`` stored (:func:`~dpinfer.inference.engines.compiled.chains.continued_state`)."""
        self.tune, self.draws = tune, draws
        n_stats = len(stat_columns(self.blocks)[0])
        self.steppers = [Stepper(self.compiled, self.blocks,
                                 continued_state(self.compiled, s.state, n_stats, draws=draws), tune=tune,
                                 draws=draws, max_tree_depth=s.max_tree_depth, nuts_per_sweep=s.nuts_per_sweep,
                                 counts_per_sweep=s.counts_per_sweep)
                         for s in self.steppers]

    def info(self) -> dict:
        """What the driver reports: cells, local parameters, build time, the process's memory."""
        return {"groups": len(self.groups), "cells": int(self.compiled.n_counts),
                "local_parameters": int(self.compiled.n), "build_seconds": self.seconds,
                "pid": os.getpid(), "peak_memory_MB": _peak_memory_mb(),
                "theta_in_count_tables": [b.name for b in self._rehoist], "theta_dependent": self.theta_dependent}

    def save(self, path: str) -> None:
        """Write every chain's state to the directory ``path`` (created owner-only;
        :class:`~dpinfer.inference.checkpoint.Checkpoint`'s netCDF files, data only)."""
        path = Path(path)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        checkpoint = Checkpoint(path, {"model": self.hash}, 0)
        for c, stepper in enumerate(self.steppers):
            stepper.state.seconds = self.sweep_seconds
            checkpoint.save(c, stepper.state)

    def restore(self, path: str) -> None:
        """Continue every chain from the states :meth:`save` wrote to ``path`` (this shard's,
        its model hash checked), under this shard's tuning and draws."""
        checkpoint = Checkpoint(path, {"model": self.hash}, 0)
        steppers = []
        for c, s in enumerate(self.steppers):
            state = checkpoint.load(c)
            if state is None:
                raise FileNotFoundError(f"{path} holds no state of chain {c}")
            steppers.append(Stepper(self.compiled, self.blocks, state, tune=self.tune, draws=self.draws,
                                    max_tree_depth=s.max_tree_depth, nuts_per_sweep=s.nuts_per_sweep,
                                    counts_per_sweep=s.counts_per_sweep))
        self.steppers = steppers
        self.sweep_seconds = steppers[0].state.seconds

    def set_shared(self, values: dict) -> None:
        """Write the shared parameters' values (name -> array) into the model's data, and
        refill the count blocks' terms that depend on them."""
        self._write_shared(values)
        for block in self._rehoist:
            block.refresh_hoisted()

    def _write_shared(self, values: dict) -> None:
        data = self.compiled.data.values
        for name, positions in self._positions.items():
            for j in positions:
                data[j][...] = values[name]

    def summaries(self, c: int) -> dict:
        """Chain ``c``'s summaries at its state (the shared values in the data: chain c's)."""
        s = self.steppers[c].state
        return {name: np.asarray(v, dtype=float) for name, v in zip(self.summary_names, self._summaries(s.q, s.counts))}

    def start(self, thetas: list) -> list:
        """Every chain's summaries at its start, given its shared values."""
        out = []
        for c, theta in enumerate(thetas):
            self.set_shared(theta)
            out.append(self.summaries(c))
        return out

    def sweep(self, thetas: list) -> list:
        """One iteration of every chain given its shared values; their summaries after it."""
        began = time.perf_counter()
        out = []
        for c, theta in enumerate(thetas):
            self.set_shared(theta)
            stepper = self.steppers[c]
            stepper.advance(stepper.state.done + 1)
            out.append(self.summaries(c))
        seconds = time.perf_counter() - began
        if not self.sweep_seconds:  # the first: it loads (or compiles) the sampler's kernels
            self.first_sweep_seconds = seconds
        self.sweep_seconds += seconds
        return out

    def log_densities(self, thetas: list, jitter_seed: int) -> dict:
        """For chain 0's state and a copy of it with the local parameters moved by U(-0.5, 0.5)
        (in the unconstrained space), the model's log density at each shared value of
        ``thetas`` and the summaries: what the driver checks its model against
        (:func:`dpinfer.inference.sharded.check_shared_model`). Chain 0's state is restored."""
        stepper = self.steppers[0]
        q = stepper.state.q.copy()
        moved = q + np.random.default_rng(jitter_seed).uniform(-0.5, 0.5, size=q.shape)
        out = {"log_density": [], "summaries": []}
        for point in (q, moved):
            stepper.state.q[:] = point
            rows = []
            for theta in thetas:
                self.set_shared(theta)
                rows.append(stepper.log_density())
            out["log_density"].append(rows)
            out["summaries"].append(self.summaries(0))
        stepper.state.q[:] = q
        return out

    def finish(self, thetas: dict | None = None) -> dict:
        """The shard's draws and report, once every chain has run: ``posterior`` and
        ``sample_stats`` (xarray Datasets, chain x draw x the shard model's dims), ``report``
        (each latent's entry, as ``dpinfer.sample`` reports it) and ``failed`` (latents whose
        check failed: cells held in most draws). ``thetas``: the shared parameters' stored
        draws (name -> (chains, draws, ...)), which the Deterministics in
        :attr:`theta_dependent` are computed from, draw by draw (needed when there are any)."""
        results = [s.result(self.sweep_seconds) for s in self.steppers]
        s0 = self.steppers[0]
        idata = compiled_engine.datatree(self.model, self.compiled, results, tune=self.tune,
                                         seconds=self.sweep_seconds, max_tree_depth=s0.max_tree_depth,
                                         nuts_per_sweep=s0.nuts_per_sweep, counts_per_sweep=s0.counts_per_sweep)
        if self.theta_dependent:
            self._with_draws_thetas(idata.posterior, thetas)
        report, failed = {}, {}
        for plan, block in zip(self.plans, self.blocks):
            report[plan.latent_name], bound = compiled_engine.plan_report(plan, idata, block, self.tol)
            if bound is not None:
                failed[plan.latent_name] = bound
        posterior = idata.posterior.to_dataset().drop_vars(
            [n for n in self.summary_names if n in idata.posterior])
        return {"posterior": posterior, "sample_stats": idata.sample_stats.to_dataset(),
                "free": [rv.name for rv in self.model.free_RVs],
                "report": json.loads(json.dumps(report, default=float)), "failed": failed,
                "sweep_seconds": self.sweep_seconds, "first_sweep_seconds": self.first_sweep_seconds,
                "peak_memory_MB": _peak_memory_mb()}

    def _with_draws_thetas(self, posterior, thetas: dict | None) -> None:
        """Recompute the Deterministics that depend on the shared parameters at each stored
        draw's own shared values (the data hold the last sweep's; the count blocks' tables are
        not needed, so not refilled)."""
        if thetas is None:
            raise ValueError(f"the shard's Deterministics {self.theta_dependent} depend on the shared "
                             "parameters: finish needs their draws")
        values = self.compiled.values_function(self.theta_dependent)
        for c, stepper in enumerate(self.steppers):
            for d, (q, counts) in enumerate(zip(stepper.state.draws_q, stepper.state.draws_counts)):
                self._write_shared({name: draws[c, d] for name, draws in thetas.items()})
                for name, value in zip(self.theta_dependent, values(q, counts)):
                    posterior[name].values[c, d] = value


def _depending_on(compiled, data_positions: list, exclude: list) -> list:
    """The compiled model's values (free variables, Deterministics) whose graphs read any of
    the data inputs at ``data_positions``, less ``exclude``."""
    from pytensor.graph.traversal import ancestors

    inputs = {compiled.structure.data_inputs[j] for j in data_positions}
    _, _, graphs = compiled.structure.value_graphs
    return [name for name, graph in zip(compiled.expand_names, graphs)
            if name not in exclude and any(a in inputs for a in ancestors([graph]))]


def _peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def short(groups: list) -> str:
    """A list of groups for a message: whole if short, else its ends and length."""
    return repr(groups) if len(groups) <= 6 else f"[{', '.join(map(repr, groups[:3]))}, ... {groups[-1]!r}] ({len(groups)})"
