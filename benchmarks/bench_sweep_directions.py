"""Which directions a sweep of the nested counts should move along: ESS per sweep and per
second of every count, given fixed hyperparameters, for several mixes of single cells, pairs
and larger interaction directions (:func:`dpinfer.lattice.nested.directions.sweep_products`'s
``pairs`` and ``larger``).

The table: a synthetic state of ``--counties`` Iowa-shaped counties (block-group leaves, 28
cells), ``census_model`` with the leaf sizes at their published totals and the concentrations
at their empirical-Bayes estimate (``dp.sample(inference="empirical-bayes")``, whose last
counts start the chains). Per mix: 2 chains of 20 + ``--sweeps`` sweeps, each count's ESS
(the smaller of bulk and tail, :mod:`dpinfer.inference.convergence`) per sweep (its minimum,
1% quantile and median over the counts) and the smallest per second of sweeping.

Run:  .venv/bin/python benchmarks/bench_sweep_directions.py [--counties 3] [--sweeps 800]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

MIXES = [("cells + pairs + squares + cubes, once each (before)", 1, 1), ("cells + 2x pairs + half the larger (now)", 2, 2),
         ("cells + pairs", 1, 0), ("cells + 2x pairs", 2, 0), ("cells + 3x pairs + half the larger", 3, 2)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, default=3)
    parser.add_argument("--sweeps", type=int, default=800)
    args = parser.parse_args(argv)
    import dpinfer as dp
    from dpinfer.inference import planning
    from dpinfer.inference.convergence import diagnostics, tail_ess
    from dpinfer.inference.engines.compiled import engine
    from dpinfer.inference.engines.compiled.chains import Stepper, fresh_state, nested_tables, stat_columns
    from dpinfer.io.nmf.model import census_model
    from dpinfer.io.nmf.synthetic import PRESETS
    from dpinfer.io.nmf.table import census_table
    from dpinfer.lattice.nested.directions import sweep_products
    from dpinfer.mechanisms.records import releases_of

    levels = ("US", "State", "County", "Tract", "Block_Group")
    with tempfile.TemporaryDirectory() as root:
        dp.write_synthetic_nmf(root, **(PRESETS["iowa"] | {"n_counties": args.counties}), levels=levels)
        table = census_table(dp.read_nmf(root, 19, levels=levels), "Block_Group", "pl94-28")
    model = census_model(table, leaf_sizes="published")
    idata = dp.sample(model=model, draws=20, chains=2, random_seed=1, progressbar=False, inference="empirical-bayes")
    q = np.asarray(json.loads(idata.posterior.attrs["dpinfer_empirical_bayes"])["parameters"]["log_split"]).ravel()
    starts = idata.posterior["counts"].values[:, -1].reshape(2, -1).astype(np.int64)
    plan = planning.plan_model(model, releases_of(model))
    compiled, _ = engine.compile_for(model, plan.latents)
    planning.first_windows(plan.latents, 1e-10, exact_tails=True, at_least={})
    blocks = [engine.count_block(p, compiled) for p in plan.latents]
    print(f"{len(table.leaves)} block groups x {len(table.cells)} cells; {2 * args.sweeps} sweeps per mix\n")
    print("| directions (pairs, larger) | ms per sweep | min ESS per sweep | 1% quantile | median | min ESS per second |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, pairs, larger in MIXES:
        draws = np.empty((2, args.sweeps, starts.shape[1]))
        seconds = 0.0
        for c in range(2):
            state = fresh_state(compiled, len(stat_columns(blocks)[0]), draws=1, rng=np.random.default_rng(c), q0=q,
                                counts0=starts[c], target_accept=0.8)
            stepper = Stepper(compiled, blocks, state, tune=0, draws=1)
            block = stepper.nested[0]
            nested_tables(block, q, state.counts, stepper.env)  # the tables at q, as a draw of the engine
            (_, _, _, _, _, prior_start, prior, x, S, tsum, box_lo, box_hi, lo_open, hi_open, order, child_ptr,
             child_area, area_leaf, term_ptr, term_cells, term_value, term_table, _, meta, inv2v, values,
             *_, trim, cell_shape, stats, _) = block
            for i in range(20 + args.sweeps):
                began = time.perf_counter()
                sweep_products(x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, prior_start, order, child_ptr,
                               child_area, area_leaf, term_ptr, term_cells, term_value, term_table, meta, inv2v,
                               values, trim, cell_shape, state.stream, stats, pairs, larger)
                if i >= 20:
                    seconds += time.perf_counter() - began
                    draws[c, i - 20] = x.reshape(-1)
        _, bulk = diagnostics(draws)
        ess = np.fmin(bulk, tail_ess(draws)) / (2 * args.sweeps)
        print(f"| {label} ({pairs}, {larger}) | {1000 * seconds / (2 * args.sweeps):.1f} | {np.nanmin(ess):.3f} | "
              f"{np.nanquantile(ess, 0.01):.3f} | {np.nanmedian(ess):.3f} | "
              f"{np.nanmin(ess) * 2 * args.sweeps / seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
