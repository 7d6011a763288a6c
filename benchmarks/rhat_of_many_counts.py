"""The largest split R-hat over many quantities when nothing is wrong: independent Poisson draws
(2 chains), as many quantities as a state's counts, for several numbers of draws. A verdict of
"R-hat <= 1.01 on every count" over ~76,000 counts is a statement about this maximum.

Run:  .venv/bin/python benchmarks/rhat_of_many_counts.py [--quantities 75768] [--draws 400 800 1600 3200]
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quantities", type=int, default=75768)
    parser.add_argument("--draws", type=int, nargs="+", default=[400, 800, 1600, 3200])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from dpinfer.inference.convergence import diagnostics

    rng = np.random.default_rng(args.seed)
    print("| draws per chain | largest R-hat | 99.9% quantile | smallest bulk ESS |")
    print("|---:|---:|---:|---:|")
    for n in args.draws:
        rhat, ess = diagnostics(rng.poisson(5.0, size=(2, n, args.quantities)).astype(float))
        print(f"| {n} | {np.nanmax(rhat):.4f} | {np.nanquantile(rhat, 0.999):.4f} | {np.nanmin(ess):.0f} |", flush=True)


if __name__ == "__main__":
    main()
