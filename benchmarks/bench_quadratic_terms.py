"""The nested count sweep with the quadratic terms summed into one quadratic per area, against
the kernel that read every term from its table (commit ``BASELINE``), side by side on one state.

The table: a synthetic state of ``--counties`` Iowa-shaped counties (block-group leaves, 28
cells, every level's measurements: ~100 terms a block group, ~20 on each cell),
``census_model`` with the leaf sizes at their published totals and the concentrations at their
empirical-Bayes estimate (``dp.sample(inference="empirical-bayes")``, whose last counts start
the sweeps). Both kernels run :func:`~dpinfer.lattice.nested.directions.sweep_products` (126
moves: cells, pairs, squares, cubes) from the same counts with the same prior tables, in turns
(``--rounds`` rounds of ``--sweeps`` sweeps each, after one untimed sweep per kernel). Reported:
CPU milliseconds per sweep (``time.process_time``, the median over rounds) of each and their
ratio, and the counts' posterior means after the sweeps, each kernel's own chain (the same law:
they differ by Monte Carlo error only).

The baseline's ``kernel.py`` and ``directions.py`` are read from the repository's history
(``git show``) into a temporary package (numba caches its kernels beside it).

``--baseline REV`` times the kernel of any other commit the same way (the loop order of the
convolutions: ``--baseline a8d99e3^ --counties 99``).

Run:  .venv/bin/python benchmarks/bench_quadratic_terms.py [--counties 10] [--sweeps 10] [--rounds 5]
      [--leaves Block_Group] [--cells pl94-28] [--baseline REV]   (--leaves Tract --cells detailed: 2,016 cells)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

BASELINE = "a9c8012"  # the last commit whose kernel read every term from its table


def rows_leaf_by_leaf(rev: str) -> bool:
    """Whether commit ``rev``'s kernels read the flat prior table leaf by leaf (each count's row
    ending where the next count's starts), as every commit before the cell-by-cell layout
    (:mod:`dpinfer.lattice.nested.sampler`) did."""
    shown = subprocess.run(["git", "show", f"{rev}:dpinfer/lattice/nested/sampler.py"],
                           cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    return "**cell by cell**" not in shown.stdout


def leaf_by_leaf(prior, box_lo, box_hi, prior_start):
    """(table, starts): the flat prior table laid out leaf by leaf, for kernels before the
    cell-by-cell layout."""
    widths = (box_hi - box_lo + 1).reshape(-1)
    table = np.concatenate([prior[prior_start[i]:prior_start[i] + widths[i]] for i in range(widths.size)])
    return table, np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)


def baseline_sweep(rev: str = BASELINE):
    """sweep_products of commit ``rev`` (its directions.py over its kernel.py)."""
    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp())
    name = "nested_baseline"
    for module in ("kernel", "directions"):
        shown = subprocess.run(["git", "show", f"{rev}:dpinfer/lattice/nested/{module}.py"], cwd=root,
                               capture_output=True, text=True)
        if shown.returncode:
            raise SystemExit(f"this benchmark needs the repository's history (commit {rev}): "
                             f"{shown.stderr.strip()}")
        text = shown.stdout.replace("from dpinfer.lattice.nested.kernel import", f"from {name}_kernel import")
        (folder / f"{name}_{module}.py").write_text(text)
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"{name}_directions", folder / f"{name}_directions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sweep_products


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, default=10)
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--leaves", default="Block_Group", choices=("County", "Tract", "Block_Group"))
    parser.add_argument("--cells", default="pl94-28", choices=("pl94-28", "detailed"))
    parser.add_argument("--baseline", default=BASELINE, help=f"the commit whose kernel runs beside today's "
                        f"(default {BASELINE}, the last that read every term from its table)")
    args = parser.parse_args(argv)
    import dpinfer as dp
    from dpinfer.inference import planning
    from dpinfer.inference.engines.compiled import engine
    from dpinfer.inference.engines.compiled.chains import Stepper, fresh_state, nested_tables, stat_columns
    from dpinfer.inference.convergence import ConvergenceWarning
    from dpinfer.io.nmf.model import census_model
    from dpinfer.io.nmf.synthetic import PRESETS
    from dpinfer.io.nmf.table import census_table
    from dpinfer.lattice.nested.directions import sweep_products
    from dpinfer.lattice.nested.terms import quadratic_tables
    from dpinfer.mechanisms.records import releases_of

    levels = ("US", "State", "County", "Tract", "Block_Group")
    levels = levels[:levels.index(args.leaves) + 1]
    with tempfile.TemporaryDirectory() as root:
        dp.write_synthetic_nmf(root, **(PRESETS["iowa"] | {"n_counties": args.counties}), levels=levels)
        table = census_table(dp.read_nmf(root, 19, levels=levels), args.leaves, args.cells)
    model = census_model(table, leaf_sizes="published")
    with warnings.catch_warnings():  # 20 draws start the sweeps: not meant to be a converged fit
        warnings.simplefilter("ignore", ConvergenceWarning)
        idata = dp.sample(model=model, draws=20, chains=1, random_seed=1, progressbar=False,
                          inference="empirical-bayes", max_minutes=3)
    q = np.asarray(json.loads(idata.posterior.attrs["dpinfer_empirical_bayes"])["parameters"]["log_split"]).ravel()
    start = idata.posterior["counts"].values[0, -1].reshape(-1).astype(np.int64)
    plan = planning.plan_model(model, releases_of(model))
    compiled, _ = engine.compile_for(model, plan.latents)
    planning.first_windows(plan.latents, 1e-10, exact_tails=True, at_least={})
    blocks = [engine.count_block(p, compiled) for p in plan.latents]

    def kernel_state(seed):
        state = fresh_state(compiled, len(stat_columns(blocks)[0]), draws=1, rng=np.random.default_rng(seed), q0=q,
                            counts0=start, target_accept=0.8)
        stepper = Stepper(compiled, blocks, state, tune=0, draws=1)
        block = stepper.nested[0]
        nested_tables(block, q, state.counts, stepper.env)
        return state, block

    sweeps = {(f"baseline {args.baseline} (every term from its table)" if args.baseline == BASELINE
               else f"baseline {args.baseline}"): baseline_sweep(args.baseline), "now": sweep_products}
    states = {label: kernel_state(i) for i, label in enumerate(sweeps)}
    layouts = {label: label != "now" and rows_leaf_by_leaf(args.baseline) for label in sweeps}
    converted = {}  # the baseline's table laid out leaf by leaf, once (the prior does not change here)
    seconds = {label: [] for label in sweeps}
    means = {label: 0.0 for label in sweeps}
    for r in range(args.rounds + 1):
        for label, sweep in sweeps.items():
            state, block = states[label]
            (_, _, _, _, _, prior_start, prior, x, S, tsum, box_lo, box_hi, lo_open, hi_open, order, child_ptr,
             child_area, area_leaf, term_ptr, term_cells, term_value, term_table, _, meta, inv2v, values,
             *_, trim, cell_shape, stats, _) = block
            if layouts[label]:
                if label not in converted:
                    converted[label] = leaf_by_leaf(prior, box_lo, box_hi, prior_start)
                prior, prior_start = converted[label]
            n = 1 if r == 0 else args.sweeps
            began = time.process_time()
            for _ in range(n):
                sweep(x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, prior_start, order, child_ptr, child_area,
                      area_leaf, term_ptr, term_cells, term_value, term_table, meta, inv2v, values, trim, cell_shape,
                      state.stream, stats)
                if r:
                    means[label] += x / (args.rounds * args.sweeps)
            if r:
                seconds[label].append((time.process_time() - began) / n)
    meta, inv2v, values = states[next(iter(sweeps))][1][23:26]
    term_table = states[next(iter(sweeps))][1][21]
    quadratic = quadratic_tables(meta, inv2v, values)[term_table]
    print(f"{len(table.leaves):,} {args.leaves} leaves x {len(table.cells)} cells, {term_table.size:,} terms "
          f"({quadratic.mean():.1%} quadratic); {args.rounds} rounds of {args.sweeps} sweeps per kernel\n")
    print("| kernel | ms per sweep (median over rounds) | ratio to baseline |")
    print("|---|---:|---:|")
    base = np.median(next(iter(seconds.values())))
    for label, s in seconds.items():
        print(f"| {label} | {1000 * np.median(s):.0f} | {np.median(s) / base:.2f} |")
    a, b = means.values()
    print(f"\nposterior means of the counts after the sweeps, the two chains: largest difference "
          f"{np.max(np.abs(a - b)):.2f}, median {np.median(np.abs(a - b)):.2f} (Monte Carlo error; "
          f"{args.rounds * args.sweeps} sweeps each)")


if __name__ == "__main__":
    main()
