"""The empirical-Bayes score averaged over each cell redrawn alone (Rao-Blackwell), against the
score read at the chains' own counts, on a county at Block leaves.

The estimate's Monte Carlo error shrinks as V / (chains x iterations x I^2), V the variance of
an iteration's score and I the marginal information (``dpinfer.inference.empirical_bayes``),
so where most of a parameter's information is missing it needs hundreds of iterations. For a
parameter whose score is a function of one cell's counts (a block-level split concentration of
``census_model``), averaging the score over ``copies`` exact redrawings of that cell given the
others (``dpinfer.lattice.nested.kernel.cells_redrawn_alone``) removes the part of V that the
cell's counts given the others make. Two measurements on the same files:

1. **The scores' variance** (``--variance``): ``dp.sample``'s estimate is run for
   ``--iterations`` iterations (to reach the mode), then, at the estimate, ``--samples`` more
   E-steps of chain 0, each with the score at the chain's counts and the scores at 16
   redrawings; printed, over the parameters whose score is a function of one cell alone, the
   ratio Var(average over M redrawings) / Var(score at the chain's counts) for M = 1, 2, 4, 8,
   16, beside each parameter's fraction of missing information.
2. **The estimate** (default): ``dp.sample(inference="empirical-bayes")`` with ``copies`` 16
   (the default) and 0 (the score at the chains' counts), each at most ``--iterations``
   iterations: iterations, seconds an iteration, parameters over the tolerance and the largest
   Monte Carlo error / approximate posterior sd, apart for the split concentrations
   (``log_split``) and the others.

Files: ``write_synthetic_nmf(DIR, n_counties=1, tracts_per_county=8, block_groups_per_tract=3,
blocks_per_block_group=(60, 74), aian_tracts=0, mean_block_population=60.0, seed=2020)`` (the
county of 1,633 blocks of ``benchmarks/README.md``), written to ``--files`` if it holds none.

Run:  .venv/bin/python benchmarks/bench_eb_rao_blackwell.py [--files DIR] [--iterations 400]
          [--variance [--samples 40]]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

COUNTY = dict(n_counties=1, tracts_per_county=8, block_groups_per_tract=3, blocks_per_block_group=(60, 74),
              aian_tracts=0, mean_block_population=60.0, seed=2020)
COPIES = (1, 2, 4, 8, 16)


def county_model(files: Path):
    from dpinfer.io.nmf.layout import LEVELS
    from dpinfer.io.nmf.model import census_model, empirical_bayes_settings
    from dpinfer.io.nmf.reading import read_nmf
    from dpinfer.io.nmf.synthetic import write_synthetic_nmf
    from dpinfer.io.nmf.table import census_table

    if not (files / "US_Person_PL_PROD").exists():
        files.mkdir(parents=True, exist_ok=True)
        write_synthetic_nmf(files, **COUNTY)
    table = census_table(read_nmf(files, "19", levels=LEVELS), "Block", "pl94-28")
    model = census_model(table)
    return model, empirical_bayes_settings(model, "Block", "normal"), len(table.leaves)


class _Measured(Exception):
    pass


def score_variances(files: Path, iterations: int, samples: int) -> None:
    """Measurement 1 of the module docstring (dp.sample's estimate run through a wrapper that
    measures at its end and stops the fit)."""
    import dpinfer as dp
    from dpinfer.inference import empirical_bayes as eb

    model, settings, blocks = county_model(files)
    estimate = eb.estimate

    def measure(steppers, q0, **options):
        options.pop("max_iterations", None)
        held = estimate(steppers, q0, **{**options, "iterations": iterations})
        s = steppers[0]
        estimated = np.flatnonzero(~s.moving)
        one_cell = eb._one_cell_components(s, np.array(s.e_step(held.q)), estimated, max(COPIES))
        grad = np.empty(held.q.size)
        own, averaged = [], []
        began = time.perf_counter()
        for _ in range(samples):
            point = np.array(s.e_step(held.q))
            s.log_density(point, grad)
            own.append(grad[estimated].copy())
            copies = np.empty((max(COPIES), s.state.counts.size), np.int64)
            assert s.cells_redrawn_alone(point, copies)
            saved = s.state.counts.copy()
            scores = []
            for row in copies:
                s.state.counts[:] = row
                s.log_density(point, grad)
                scores.append(grad[estimated].copy())
            s.state.counts[:] = saved
            averaged.append(scores)
        seconds = (time.perf_counter() - began) / samples
        own, averaged = np.array(own)[:, one_cell], np.array(averaged)[:, :, one_cell]
        missing = held.missing_information[estimated][one_cell]
        print(f"{blocks} blocks; estimate {held.iterations} iterations; {one_cell.sum()} of {estimated.size} "
              f"parameters' scores are functions of one cell's counts; {samples} E-steps of chain 0, "
              f"{seconds:.2f} s each with 16 redrawings and their scores")
        print("\n| missing information | parameters | " + " | ".join(f"M = {m}" for m in COPIES) + " |")
        print("|---|---:|" + "---:|" * len(COPIES))
        var_own = own.var(axis=0, ddof=1)
        for low, high in ((0.9, 1.0), (0.5, 0.9), (-np.inf, 0.5)):
            chosen = (missing >= low) & (missing < high)
            if not chosen.any():
                continue
            cells = []
            for m in COPIES:
                ratio = averaged[:, :m, chosen].mean(axis=1).var(axis=0, ddof=1) / var_own[chosen]
                cells.append(f"{np.median(ratio):.2f} ({np.quantile(ratio, 0.25):.2f}-{np.quantile(ratio, 0.75):.2f})")
            label = f"{max(low, 0):.0%}-{min(high, 1):.0%}"
            print(f"| {label} | {chosen.sum()} | " + " | ".join(cells) + " |")
        print("\n(median and quartiles of Var(the score averaged over M redrawings) / Var(the score at the "
              f"chain's counts) over {samples} E-steps; se of a ratio about {np.sqrt(4 / (samples - 1)):.2f} x it)")
        raise _Measured

    eb.estimate = measure
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dp.sample(model=model, draws=10, chains=2, random_seed=1, inference="empirical-bayes",
                      empirical_bayes=settings, progressbar=False)
    except _Measured:
        pass
    finally:
        eb.estimate = estimate


def estimates(files: Path, iterations: int) -> None:
    """Measurement 2 of the module docstring."""
    import dpinfer as dp
    from dpinfer.inference.convergence import ConvergenceWarning

    print("| copies | iterations | s an iteration | over tolerance: log_split | largest error / sd: log_split "
          "| over tolerance: others | largest error / sd: others |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for copies in (16, 0):
        model, settings, _ = county_model(files)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            idata = dp.sample(model=model, draws=10, chains=2, random_seed=1, inference="empirical-bayes",
                              empirical_bayes=settings | {"copies": copies, "max_iterations": iterations},
                              progressbar=False)
        entry = json.loads(idata.posterior.attrs["dpinfer_empirical_bayes"])
        row = [str(copies), str(entry["iterations"]), f"{entry['seconds'] / entry['iterations']:.2f}"]
        for split in (True, False):
            ratios = np.concatenate([np.ravel(np.array(entry["mc_se"][name]) / np.array(entry["posterior_sd"][name]))
                                     for name in entry["mc_se"] if (name == "log_split") == split])
            row += [f"{int(np.sum(~(ratios <= entry['tolerance'])))} of {ratios.size}", f"{np.nanmax(ratios):.2f}"]
        print("| " + " | ".join(row) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=Path, default=None, help="the county's files (default: a temporary directory)")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--variance", action="store_true", help="measurement 1: the scores' variances")
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        files = args.files or Path(tmp) / "county"
        if args.variance:
            score_variances(files, args.iterations, args.samples)
        else:
            estimates(files, args.iterations)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
