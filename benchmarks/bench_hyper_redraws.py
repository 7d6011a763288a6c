"""How often empirical Bayes with ``uncertainty="normal"`` should redraw the hyperparameters:
ESS per second of every count, and the bar against full Bayes, for several (``every``,
``burn``) of ``dp.sample(empirical_bayes=...)``.

With ``every`` = K stored draws per hyperparameter draw and ``burn`` = B count draws after
each, a count whose posterior variance is a share f due to the hyperparameters keeps, within
a block of K draws, the same hyperparameter part: its ESS per stored draw is about
1 / (tau (1 - f) + K f) (tau its autocorrelation time given them), and a stored draw costs
(K + B) / K sweeps. Small K gives more hyperparameter draws per sweep; small B lets the
counts keep part of the previous draw's hyperparameters (by about 2 rho^B (1 - rho^B) of
their variance share, rho a count's lag-one autocorrelation given them): the share of the
variance their uncertainty adds is then understated. Which is best is measured here, and the
bias is judged by the bar of ``validation/eb_vs_full_bayes.py`` against a full-Bayes fit of
the same state (``--reference``).

The table: a synthetic state of ``--counties`` Iowa-shaped counties (seed ``--seed``, as the
validation's), ``census_model`` with the leaf sizes at their published totals; per setting,
``dp.sample(inference="empirical-bayes", chains=2, random_seed=11)`` with as many draws as
``--sweeps`` count sweeps a chain buy ((K + B) / K sweeps a draw), the estimate's time
subtracted from the run's; each count's ESS is the smaller of bulk and tail.

Run:  .venv/bin/python benchmarks/bench_hyper_redraws.py [--counties 3] [--seed 2020]
      [--sweeps 3000] [--reference FULL_BAYES.nc] [--settings 25,5 5,5 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SETTINGS = [(25, 5), (10, 5), (5, 5), (5, 3), (3, 3), (2, 2)]


def setting(text: str) -> tuple[int, int]:
    every, burn = (int(v) for v in text.split(","))
    return every, burn


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, default=3)
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--sweeps", type=int, default=3000)
    parser.add_argument("--reference", type=Path, default=None,
                        help="a full-Bayes fit of the same state (validation/eb_vs_full_bayes.py --fits)")
    parser.add_argument("--settings", type=setting, nargs="+", default=SETTINGS, help="every,burn pairs")
    args = parser.parse_args(argv)
    import arviz as az

    import dpinfer as dp
    from dpinfer.inference.convergence import diagnostics, tail_ess
    from dpinfer.io.nmf.model import census_model
    from dpinfer.io.nmf.synthetic import PRESETS
    from dpinfer.io.nmf.table import census_table

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
    from eb_vs_full_bayes import compare

    levels = ("US", "State", "County", "Tract", "Block_Group")
    with tempfile.TemporaryDirectory() as root:
        dp.write_synthetic_nmf(root, **(PRESETS["iowa"] | {"n_counties": args.counties, "seed": args.seed}),
                               levels=levels)
        table = census_table(dp.read_nmf(root, 19, levels=levels), "Block_Group", "pl94-28")
    reference = az.from_netcdf(args.reference) if args.reference is not None else None
    print(f"{args.counties} counties, seed {args.seed}: {len(table.leaves)} block groups x 28 cells; "
          f"{args.sweeps} count sweeps a chain per setting", flush=True)
    header = ("| every, burn | draws a chain | s sampling | min ESS | 1% quantile | median | "
              "min ESS per s | median per s" + (" | targets missing the bar (of judged) | counts missing" if reference
                                                  is not None else "") + " |")
    rows = []
    for every, burn in args.settings:
        draws = max(1, round(args.sweeps * every / (every + burn)))
        start = time.perf_counter()
        idata = dp.sample(model=census_model(table, leaf_sizes="published"), draws=draws, chains=2, random_seed=11,
                          progressbar=False, inference="empirical-bayes",
                          empirical_bayes={"uncertainty": "normal", "every": every, "burn": burn})
        seconds = time.perf_counter() - start - json.loads(idata.posterior.attrs["dpinfer_empirical_bayes"])["seconds"]
        values = idata.posterior["counts"].values
        values = values.reshape(*values.shape[:2], -1).astype(float)
        _, bulk = diagnostics(values)
        ess = np.fmin(bulk, tail_ess(values))
        ess = ess[np.isfinite(ess)]
        row = (f"| {every}, {burn} | {draws} | {seconds:.0f} | {ess.min():.0f} | {np.quantile(ess, 0.01):.0f} | "
               f"{np.median(ess):.0f} | {ess.min() / seconds:.2f} | {np.median(ess) / seconds:.2f}")
        if reference is not None:
            frame = compare(table, reference, idata)
            judged = frame[frame.judged]
            cells = judged[judged.group.str.endswith("cells")]
            row += f" | {int((~judged.meets_bar).sum())} of {len(judged):,} | {int((~cells.meets_bar).sum())}"
        rows.append(row + " |")
        print(header, *rows, sep="\n", flush=True)


if __name__ == "__main__":
    main()
