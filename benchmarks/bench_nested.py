"""Nested measurements at state size: the sum-tree sampler alone, and dp.sample on it.

Synthetic 4-level tables shaped like a state of the 2020 noisy measurement files: a state of
``--counties`` counties, each with 1 + Poisson(tracts - 1) tracts, each with
1 + Poisson(bgs - 1) block groups (the leaves), C cells per leaf (defaults: Iowa, 99 counties,
~900 tracts, ~2,700 block groups, 28 cells: ~76,000 latent counts). Truth: Poisson counts with
cell effects a_c ~ N(3, 0.7) and county effects b_k ~ N(0, 0.3) (a mean of ~25 a count). The
release, at every level (block group, tract, county, state), discrete Gaussian noise:

* every cell (sigma^2 20, the production budget's "detailed" variance at tract and above);
* ``QUERIES`` multi-cell query cells, each the sum of 2-7 cells measured as ``summed`` =
  (its number of cells) published counts added up (sigma^2 5 each, a finer query summed to
  the model's cells, :mod:`dpinfer.mechanisms.nested`);
* the area's total (sigma^2 3-6); the state total is exact (an invariant).

(a) **Standalone sweeps**: :meth:`dpinfer.lattice.nested.sampler.NestedGibbs.run` with the
prior table fixed at the true Poisson rates, on boxes as ``dpinfer.sample`` plans them (half
width 15 s + 2 around the truth), from the truth; CPU seconds (``time.process_time``: other
jobs on the VM disturb them far less than wall time) per sweep and per count of
:func:`dpinfer.lattice.nested.directions.sweep_products` with one axis of cells (28 cell moves, 14 pair moves) and of
``NestedGibbs.run`` (the engine's sweep), min over interleaved runs, the first sweep (which
may compile) apart; and the phases of one cell move and one pair move: the leaves' messages,
the whole upward pass (leaves, convolutions, the areas' terms), the downward split, the whole
move. With ``--baseline`` the kernel of commit a57c0c5 (read from the repository's history
by ``git show``) runs the same sweeps, side by side, with the ratio.

(b) **dp.sample**: hierarchical Poisson model, cell ~ N(3, 1.5) (C), county ~ N(0, 0.5) (the
first county the baseline), counts ~ Poisson(exp(cell + county)), observed through the
release; 2 chains x (``--tune`` + ``--draws``), both chains in parallel. Each size runs in a
fresh process (cold: a new model object in a new process; numba's kernel cache and the model
cache as they are) and then again in the same process (warm: a new model object, the same
release). Reported: wall seconds, sampling seconds (the engine's own), peak resident memory,
min bulk ESS over the counts and over the parameters, max R-hat, and ESS per count per second.
Sizes: one county, ten counties, and (``--full``) the Iowa-size state.

Run:  .venv/bin/python benchmarks/bench_nested.py [--sweeps 10] [--baseline] [--full]
      .venv/bin/python benchmarks/bench_nested.py --only-sweeps   (part (a) only)
      (Iowa size in (b): --full --draws 300 --tune 300 --cold-only)
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

import numpy as np

BASELINE = "a57c0c5"  # the commit whose nested kernel --baseline times beside today's

QUERIES = [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16]]  # multi-cell query cells
SIGMA2_CELL, SIGMA2_QUERY = 20.0, 5.0
SIGMA2_TOTAL = {"bg": 3.0, "tract": 6.0, "county": 5.0, "state": None}  # None: exact
IOWA = {"counties": 99, "tracts": 9.1, "bgs": 3.0, "cells": 28}


def synthetic_state(counties: int, tracts: float, bgs: float, cells: int, seed: int = 2026):
    """(NestedMeasurements, truth (n_leaves, cells), county of each leaf, rates (n_leaves, cells))
    (module docstring)."""
    from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian
    from dpinfer.mechanisms.nested import NestedMeasurements

    rng = np.random.default_rng(seed)
    parent = [-1]
    level = ["state"]
    county_of_area = [-1]
    for k in range(counties):
        county = len(parent)
        parent.append(0), level.append("county"), county_of_area.append(k)
        for _ in range(1 + rng.poisson(tracts - 1)):
            tract = len(parent)
            parent.append(county), level.append("tract"), county_of_area.append(k)
            for _ in range(1 + rng.poisson(bgs - 1)):
                parent.append(tract), level.append("bg"), county_of_area.append(k)
    parent, level, county_of_area = np.array(parent), np.array(level), np.array(county_of_area)
    leaves = np.flatnonzero(level == "bg")
    county = county_of_area[leaves]
    a = rng.normal(3.0, 0.7, cells)
    b = rng.normal(0.0, 0.3, counties)
    rates = np.exp(a[None, :] + b[county][:, None])
    truth = rng.poisson(rates)
    nm = NestedMeasurements(parent, leaves, cells)
    S = np.zeros((parent.size, cells), np.int64)
    S[leaves] = truth
    for v in range(parent.size - 1, 0, -1):  # children come after their parents
        S[parent[v]] += S[v]
    queries = [q for q in QUERIES if max(q) < cells]

    def noisy(v, sigma2):
        return v + DiscreteGaussian(math.sqrt(sigma2)).sample_noise(np.shape(v), rng)

    for name in ("bg", "tract", "county", "state"):
        areas = np.flatnonzero(level == name)
        Sv = S[areas]
        nm.measure(f"{name}/cells", areas, [[c] for c in range(cells)], noisy(Sv, SIGMA2_CELL), SIGMA2_CELL)
        if queries:
            q = np.stack([Sv[:, g].sum(1) for g in queries], 1)
            var = np.array([len(g) * SIGMA2_QUERY for g in queries])
            nm.measure(f"{name}/queries", areas, queries, q + np.stack(
                [DiscreteGaussian(math.sqrt(v)).sample_noise(areas.size, rng) for v in var], 1),
                SIGMA2_QUERY, summed=[len(g) for g in queries])
        total = Sv.sum(1, keepdims=True)
        if SIGMA2_TOTAL[name] is None:
            nm.equal(f"{name}/total", areas, [list(range(cells))], total)
        else:
            nm.measure(f"{name}/total", areas, [list(range(cells))], noisy(total, SIGMA2_TOTAL[name]),
                       SIGMA2_TOTAL[name])
    return nm, truth, county, rates


def hierarchical_model(nm, county, n_counties: int):
    """The fitted model (module docstring): cell and county effects, Poisson counts."""
    import pymc as pm

    n_leaves, cells = nm.sums.n_leaves, nm.sums.n_cells
    with pm.Model() as model:
        cell = pm.Normal("cell", 3.0, 1.5, shape=cells)
        if n_counties > 1:
            others = pm.Normal("county", 0.0, 0.5, shape=n_counties - 1)
            effect = pm.math.concatenate([np.zeros(1), others])[county]
            rate = pm.math.exp(cell[None, :] + effect[:, None])
        else:
            rate = pm.math.exp(cell[None, :] + np.zeros((n_leaves, 1)))
        counts = pm.Poisson("counts", rate, shape=(n_leaves, cells))
        nm.observe("nmf", counts)
    return model


# --- (a) standalone sweeps ------------------------------------------------------------------------

def baseline_kernel():
    """dpinfer/lattice/nested/kernel.py as of commit ``BASELINE``, from ``git show`` into a
    module of its own (a temporary file: numba caches its kernels beside it)."""
    import importlib.util
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shown = subprocess.run(["git", "show", f"{BASELINE}:dpinfer/lattice/nested/kernel.py"], cwd=root,
                           capture_output=True, text=True)
    if shown.returncode:
        raise SystemExit(f"--baseline needs the repository's history (commit {BASELINE}): {shown.stderr.strip()}")
    path = Path(tempfile.mkdtemp()) / f"nested_kernel_{BASELINE}.py"
    path.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def planned_boxes(nm, centre):
    """Boxes as dpinfer.sample plans them (dpinfer.inference.planning.nested), around ``centre``."""
    from dpinfer.inference.planning.nested import FIRST_K, measurement_sd

    sd = measurement_sd(nm.sums)
    scale = np.minimum(sd, np.sqrt(np.maximum(centre, 0) + 2.0 * np.minimum(sd, 1e9) + 1.0))
    half = np.ceil(FIRST_K * scale).astype(np.int64) + 2
    return np.maximum(centre - half, 0), centre + half


def standalone(size: dict, sweeps: int, baseline: bool, seed: int = 2026) -> dict:
    """(a): seconds per sweep (min over 3 runs of ``sweeps`` sweeps, after one untimed sweep),
    the same with the kernel of a57c0c5 (:func:`baseline_kernel`) if ``baseline``, and the phases of a move."""
    from scipy import stats as st

    from dpinfer._random_stream import new_stream
    from dpinfer.lattice.nested.directions import sweep_products
    from dpinfer.lattice.nested.sampler import NestedGibbs

    nm, truth, _, rates = synthetic_state(**size, seed=seed)
    s = nm.sums
    lo, hi = planned_boxes(nm, truth)
    g = NestedGibbs(s, lo, hi)
    prior = np.ascontiguousarray(st.poisson.logpmf(g.grid(), rates.reshape(-1)[g.rows()]))  # flat
    widest = int(np.max(g.widths))
    meta, inv2v, values = s.tables.arrays()

    cell_shape = np.array([s.n_cells], np.int64)

    def now(x, S, tsum, *args):  # the engine's sweep with one axis of cells: cells, then random pairs
        *head, trim, rng, stats = args
        return sweep_products(x, S, tsum, *head, trim, cell_shape, rng, stats)

    def timed(sweep, prior_args, n):
        x = truth.copy()
        S, tsum = s.area_sums(x), s.term_sums(x)
        rng, stats = new_stream(np.random.default_rng(seed)), np.zeros(3, np.int64)
        t0 = time.process_time()
        for _ in range(n):
            sweep(x, S, tsum, g.box_lo, g.box_hi, g.lo_open, g.hi_open, *prior_args, s.order, s.child_ptr,
                  s.child_area, s.area_leaf, s.term_ptr, s.term_cells, s.term_value, s.term_table, meta,
                  inv2v, values, g.trim, rng, stats)
        return (time.process_time() - t0) / n, int(stats[0]) // n

    sweepers = {"now": (now, (prior, g.prior_start))}
    if baseline:  # its prior table: every count's row padded to the widest box
        padded = np.full((g.prior_start.size - 1, widest), -np.inf)
        for i in range(padded.shape[0]):
            padded[i, :g.widths[i]] = prior[g.prior_start[i]:g.prior_start[i] + g.widths[i]]
        sweepers[BASELINE] = (baseline_kernel().sweep, (padded,))
    row = {"leaves": s.n_leaves, "areas": s.n_areas, "counts": truth.size, "terms": s.term_value.size,
           "widest box": widest, "median box": int(np.median(g.widths))}
    for name, (sweep, prior_args) in sweepers.items():
        t0 = time.process_time()
        timed(sweep, prior_args, 1)
        row[f"first sweep s ({name})"] = time.process_time() - t0
    best = {name: math.inf for name in sweepers}
    for _ in range(3):  # interleaved: the VM's speed drifts
        for name, (sweep, prior_args) in sweepers.items():
            seconds, moves = timed(sweep, prior_args, sweeps)
            best[name] = min(best[name], seconds)
    for name in sweepers:
        row[f"s/sweep ({name})"] = best[name]
        row[f"us/count/sweep ({name})"] = best[name] / truth.size * 1e6
    row["moves/sweep"] = moves
    g.run(truth, prior, 1, np.random.default_rng(seed))  # compiles if needed
    t0 = time.process_time()
    g.run(truth, prior, sweeps, np.random.default_rng(seed))
    row["NestedGibbs.run s/sweep (the engine's sweep)"] = (time.process_time() - t0) / sweeps
    row.update(phases(g, truth, prior))
    t0 = time.process_time()
    fill = st.poisson.logpmf(g.grid(), rates.reshape(-1)[g.rows()])  # the size of the engine's refill
    row["prior table entries"] = fill.size
    row["scipy fill of the table s (for scale)"] = time.process_time() - t0
    return row


def phases(g, truth, prior, repeats: int = 5) -> dict:
    """Milliseconds of one move along cell 0 and along the pair (0, 1): the leaves' messages,
    the whole upward pass (leaves, convolutions and the areas' terms), the downward split,
    the whole move (min over ``repeats``)."""
    import numba

    from dpinfer._random_stream import new_stream
    from dpinfer.lattice.nested import kernel as K

    s = g.sums
    meta, inv2v, values = s.tables.arrays()
    work = K.workspace(s.order, s.child_area, s.term_ptr, s.term_cells, s.term_value, s.term_table, meta, inv2v,
                       values, g.box_lo, g.box_hi)

    @numba.njit
    def leaves(dc, ds, x, tsum, box_lo, box_hi, prior, prior_start, leaf_area, ac_ptr, ac_terms, S, hq, pattern, yq,
               term_cells, term_value, term_table, meta, inv2v, values, trim, buf):
        kept = np.zeros(4, np.int64)
        used = 0
        for leaf in range(leaf_area.size):
            used += K._leaf_message(leaf, leaf_area[leaf], dc, ds, x, tsum, box_lo, box_hi, prior, prior_start,
                                    ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value, term_table, meta,
                                    inv2v, values, trim, buf, used, kept)[1]

    x = truth.copy()
    S, tsum = s.area_sums(x), s.term_sums(x)
    rng, stats = new_stream(np.random.default_rng(0)), np.zeros(3, np.int64)
    ac_ptr, ac_terms, _, hq, pattern, yq, buf, mstart, mlen, mlo, cut, pstart, plen, plo, s_area = work
    out = {}
    for label, cells, signs in (("cell", [0], [1]), ("pair", [0, 1], [1, -1])):
        dc, ds = np.array(cells, np.int64), np.array(signs, np.int64)
        K._up(dc, ds, x, tsum, g.box_lo, g.box_hi, prior, g.prior_start, s.order, s.child_ptr, s.child_area,
              s.area_leaf, ac_ptr, ac_terms, S, hq, pattern, yq, s.term_cells, s.term_value, s.term_table, meta,
              inv2v, values, g.trim, buf[0], mstart, mlen, mlo, cut, pstart, plen, plo, False)  # a first pass to size the buffer
        calls = {
            "leaf messages": lambda dc=dc, ds=ds: leaves(
                dc, ds, x, tsum, g.box_lo, g.box_hi, prior, g.prior_start, s.leaf_area, ac_ptr, ac_terms, S, hq,
                pattern, yq, s.term_cells, s.term_value, s.term_table, meta, inv2v, values, g.trim, buf[0]),
            "upward pass": lambda dc=dc, ds=ds: K._up(
                dc, ds, x, tsum, g.box_lo, g.box_hi, prior, g.prior_start, s.order, s.child_ptr, s.child_area,
                s.area_leaf, ac_ptr, ac_terms, S, hq, pattern, yq, s.term_cells, s.term_value, s.term_table, meta,
                inv2v, values, g.trim, buf[0], mstart, mlen, mlo, cut, pstart, plen, plo, False),
            "downward split": lambda: K._down(buf[0], s.order, s.child_ptr, s.child_area, s.area_leaf, mstart,
                                              mlen, mlo, pstart, plen, plo, s_area, rng),
        }
        for name, call in calls.items():
            call()
            best = math.inf
            for _ in range(repeats):
                t0 = time.process_time()
                call()
                best = min(best, time.process_time() - t0)
            out[f"{label} move: {name} ms"] = best * 1e3
        best = math.inf
        for _ in range(repeats):  # a whole move (it changes x: from a copy each time)
            xx, SS, tt = x.copy(), S.copy(), tsum.copy()
            t0 = time.process_time()
            K.move(dc, ds, xx, SS, tt, g.box_lo, g.box_hi, g.lo_open, g.hi_open, prior, g.prior_start, s.order,
                   s.child_ptr, s.child_area, s.area_leaf, s.term_cells, s.term_value, s.term_table, meta, inv2v,
                   values, g.trim, rng, stats, work)
            best = min(best, time.process_time() - t0)
        out[f"{label} move: whole ms"] = best * 1e3
    return out


# --- (b) dp.sample ----------------------------------------------------------------------------------

def fit(size: dict, draws: int, tune: int, seed: int, sample_seed: int, **options) -> dict:
    """One dp.sample of a new model object (the table of ``seed``); wall seconds and
    convergence figures."""
    import dpinfer as dp
    from dpinfer.inference.convergence import diagnostics

    t0 = time.perf_counter()
    nm, truth, county, _ = synthetic_state(**size, seed=seed)
    model = hierarchical_model(nm, county, size["counties"])
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    idata = dp.sample(draws, tune=tune, chains=2, cores=2, random_seed=sample_seed, progressbar=False, model=model,
                      **options)
    wall = time.perf_counter() - t0
    post = idata.posterior
    counts = post["counts"].values.reshape(2, draws, -1).astype(float)
    params = np.concatenate([post[v].values.reshape(2, draws, -1) for v in ("cell", "county") if v in post], 2)
    rhat_c, ess_c = diagnostics(counts)
    rhat_p, ess_p = diagnostics(params)
    sampling = float(post.attrs.get("sampling_time", np.nan))
    return {"counts": truth.size, "build s": built, "dp.sample s": wall, "sampling s": sampling,
            "min ESS counts": float(np.nanmin(ess_c)), "min ESS params": float(np.nanmin(ess_p)),
            "max R-hat": float(np.nanmax(np.concatenate([rhat_c, rhat_p]))),
            "counts ESS < 100": int(np.sum(ess_c < 100)),
            "min ESS counts / s": float(np.nanmin(ess_c)) / wall,
            "peak RSS MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def fit_process(size: dict, draws: int, tune: int, seed: int, options: dict, warm: bool = True) -> dict:
    """Cold then (``warm``) warm (module docstring), in this process (run as a fresh
    subprocess)."""
    import logging
    import warnings

    logging.getLogger("pymc").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    cold = fit(size, draws, tune, seed, seed, **options)
    return {"cold": cold, "warm": fit(size, draws, tune, seed, seed + 1, **options) if warm else cold}


SIZES = {"one county": {"counties": 1, "tracts": 9.1, "bgs": 3.0, "cells": 28},
         "ten counties": {"counties": 10, "tracts": 9.1, "bgs": 3.0, "cells": 28},
         "Iowa (99 counties)": IOWA}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=10, help="standalone sweeps per timing")
    parser.add_argument("--baseline", action="store_true", help="also time the kernel of a57c0c5")
    parser.add_argument("--full", action="store_true", help="also the Iowa-size state in (a) and (b)")
    parser.add_argument("--only-sweeps", action="store_true", help="part (a) only")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--cold-only", action="store_true", help="(b): no warm fit (the Iowa size is long)")
    parser.add_argument("--options", default="{}", help="dp.sample options as JSON, e.g. "
                        '\'{"nuts_per_sweep": 3, "counts_per_sweep": 2}\'')
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:  # one size of (b), in a fresh process
        size = SIZES[args._child]
        print(json.dumps(fit_process(size, args.draws, args.tune, args.seed, json.loads(args.options),
                                     warm=not args.cold_only)))
        return
    names = list(SIZES) if args.full else list(SIZES)[:2]
    print(f"(a) standalone sweeps, min over 3 runs of {args.sweeps}:", flush=True)
    rows = {name: standalone(SIZES[name], args.sweeps, args.baseline) for name in names}
    keys = list(next(iter(rows.values())))
    print(f"{'':44s}" + "".join(f"{n:>22s}" for n in names))
    for k in keys:
        print(f"{k:44s}" + "".join(f"{rows[n][k]:22.4g}" for n in names))
    if args.baseline:
        print(f"{'speed-up a57c0c5 / now':44s}" + "".join(
            f"{rows[n]['s/sweep (a57c0c5)'] / rows[n]['s/sweep (now)']:21.2f}x" for n in names))
    if args.only_sweeps:
        return
    print(f"\n(b) dp.sample, 2 chains x ({args.tune} + {args.draws}), each size in a fresh process "
          f"(cold), then a new model in it (warm); options {args.options}:", flush=True)
    for name in names:
        out = subprocess.run([sys.executable, __file__, "--_child", name, "--draws", str(args.draws),
                              "--tune", str(args.tune), "--seed", str(args.seed), "--options", args.options]
                             + (["--cold-only"] if args.cold_only else []),
                             capture_output=True, text=True, check=False)
        if out.returncode:
            print(name, "failed:", out.stderr[-2000:])
            continue
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name}:")
        for k in result["cold"]:
            print(f"  {k:28s} cold {result['cold'][k]:12.4g}   warm {result['warm'][k]:12.4g}")


if __name__ == "__main__":
    main()
