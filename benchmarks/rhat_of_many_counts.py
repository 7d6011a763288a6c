"""The largest split R-hat over many quantities when nothing is wrong: independent Poisson draws
(2 chains), as many quantities as a state's counts, for several numbers of draws. A verdict of
"R-hat <= 1.01 on every count" over ~76,000 counts is a statement about this maximum.

With ``--fit PATH`` (a kept fit, netCDF or Zarr, with ``counts`` (chain, draw, ...)), the same
from the first n draws of each chain of a real fit instead: the largest R-hat, its 99.9%
quantile, the smallest bulk and tail ESS per draw and the median bulk ESS per draw over the
counts that vary, where the draws are autocorrelated and some counts mix slower than others.

Run:  .venv/bin/python benchmarks/rhat_of_many_counts.py [--quantities 75768] [--draws 400 800 1600 3200]
      .venv/bin/python benchmarks/rhat_of_many_counts.py --fit FIT.nc --draws 250 500 1000 2000
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quantities", type=int, default=75768)
    parser.add_argument("--draws", type=int, nargs="+", default=[400, 800, 1600, 3200])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit", default=None, help="a kept fit whose counts' first draws to judge instead")
    args = parser.parse_args(argv)
    from dpinfer.inference.convergence import diagnostics, tail_ess

    if args.fit is not None:
        from dpinfer.io.nmf.store import open_posterior

        with open_posterior(args.fit) as tree:
            counts = tree.posterior["counts"].values
        chains, total = counts.shape[:2]
        values = counts.reshape(chains, total, -1).astype(float)
        values = values[:, :, values.std(axis=(0, 1)) > 0]
        print(f"{args.fit}: {values.shape[2]:,} counts that vary, {chains} chains x {total:,} draws")
        print("| draws per chain | largest R-hat | 99.9% quantile | smallest bulk / tail ESS per draw | median bulk ESS per draw |")
        print("|---:|---:|---:|---|---:|")
        for n in [d for d in args.draws if d <= total]:
            rhat, ess = diagnostics(values[:, :n])
            tail = tail_ess(values[:, :n])
            print(f"| {n} | {np.nanmax(rhat):.4f} | {np.nanquantile(rhat, 0.999):.4f} | {np.nanmin(ess) / (chains * n):.3f} / "
                  f"{np.nanmin(tail) / (chains * n):.3f} | {np.nanmedian(ess) / (chains * n):.3f} |", flush=True)
        return

    rng = np.random.default_rng(args.seed)
    print("| draws per chain | largest R-hat | 99.9% quantile | smallest bulk ESS |")
    print("|---:|---:|---:|---:|")
    for n in args.draws:
        rhat, ess = diagnostics(rng.poisson(5.0, size=(2, n, args.quantities)).astype(float))
        print(f"| {n} | {np.nanmax(rhat):.4f} | {np.nanquantile(rhat, 0.999):.4f} | {np.nanmin(ess):.0f} |", flush=True)


if __name__ == "__main__":
    main()
