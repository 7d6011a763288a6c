"""Where a Gibbs sweep of ``dpinfer nmf``'s counts goes, and the counts' prior table filled
over each count's own box (flat) against the same table padded to the widest box.

Before every count sweep the compiled engine refills the counts' prior log pmf over each
count's box (:class:`dpinfer.inference.engines.compiled.model.PriorTable`). Nested sums'
boxes differ in width by an order of magnitude (a block group's 3-person cell against a
county-sized one), so the engine fills a flat table, each box one after the other
(``PriorTable.flat_address``); the padded table (``full_address``, every row as wide as the
widest box, what the engine filled before) is its baseline here. Both are computed by the
same model's compiled functions on the same parameters and compared entry by entry.

Per size (a synthetic state written by ``dp.write_synthetic_nmf`` with the "iowa" preset's
shape and ``N`` counties, read down to block groups, 28 coarse cells, ``census_model``):
entries and MB of each table, ms per refill of each (min over ``--repeats``), the ratio; ms
per count sweep (the engine's whole count block: refill, the group factors, the moves) and
per log density with gradient (min over repeats), all inside one ``dp.sample`` call whose
chain runner is replaced by this timing (the model compiled, warm).

Run:  .venv/bin/python benchmarks/bench_prior_tables.py [--counties 3 10 99] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _min_ms(call, repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def one_size(n_counties: int, repeats: int) -> dict:
    import dpinfer as dp
    import dpinfer.inference.engines.compiled.engine as engine
    from dpinfer._random_stream import new_stream
    from dpinfer.inference.engines.compiled import chains
    from dpinfer.inference.engines.compiled.count_blocks import GroupTotals, IndependentCells
    from dpinfer.inference.engines.compiled.exact_counts import flat_prior_table, log_weight_tables
    from dpinfer.io.nmf.model import census_model

    from bench_nmf_models import _table

    table, _ = _table(f"bg{n_counties}")
    model = census_model(table)
    row = {"counties": n_counties, "counts": int(table.release.sums.n_leaves * table.release.sums.n_cells)}

    def timing_fit(model, compiled, blocks, initial_counts, **_):
        [block] = [b for b in blocks if b.kind == "nested"]
        counts = compiled.counts_vector(initial_counts)
        q = compiled.initial_q(1, model, None)
        env = compiled.environment(counts)
        names, columns = chains._stat_columns(blocks)
        nested = tuple(b.native(c) for b, c in zip(blocks, columns) if b.kind == "nested")
        cells, totals = (IndependentCells.placeholder(),), (GroupTotals.placeholder(),)
        stats_row, stream = np.zeros(len(names)), new_stream(np.random.default_rng(0))
        prior = compiled.prior_tables[block.name]
        widths = block.gibbs.widths
        padded_grid = (block.gibbs.box_lo.reshape(-1, 1) + np.arange(widths.max())[None, :]).astype(np.int64)
        padded_buffers, padded_hoisted = prior.prepare(padded_grid)
        padded = np.empty(padded_grid.shape)
        flat = np.empty(block.grid.size)
        row.update({"widest box": int(widths.max()), "median box": int(np.median(widths)),
                    "flat entries": flat.size, "padded entries": padded.size,
                    "flat table MB": round(flat.nbytes / 1e6, 1), "padded table MB": round(padded.nbytes / 1e6, 1)})
        row["flat refill ms"] = _min_ms(lambda: flat_prior_table(prior.flat_address, block.hoisted, q, env,
                                                                 block.grid, block.rows, flat), repeats)
        zeros = np.zeros(padded.shape)
        row["padded refill ms"] = _min_ms(lambda: log_weight_tables(prior.full_address, padded_hoisted, q, env,
                                                                    padded_grid, zeros, padded), repeats)
        row["padded / flat"] = row["padded refill ms"] / row["flat refill ms"]
        same = padded[block.rows, block.grid - block.gibbs.box_lo.reshape(-1)[block.rows]]
        row["max |flat - padded|"] = float(np.max(np.abs(np.where(np.isfinite(same), flat - same, 0.0))))
        row["count sweep ms"] = _min_ms(lambda: chains._draw_blocks(q, counts, env, cells, totals, nested, 1.0,
                                                                    stream, stats_row, True), repeats)
        grad = np.empty(compiled.n)
        row["logp+grad ms"] = _min_ms(lambda: chains.log_density_at(compiled.logp_grad_address, q, grad, env),
                                      20 * repeats)
        raise _Measured

    fit = engine._fit
    engine._fit = timing_fit
    try:
        dp.sample(model=model, draws=10, tune=10, chains=1, progressbar=False)
    except _Measured:
        pass
    finally:
        engine._fit = fit
    return row


class _Measured(Exception):
    """Raised by the timing in place of the chains, to leave dp.sample."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, nargs="+", default=[3, 10, 99])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import pandas as pd

    rows = []
    for n in args.counties:
        rows.append({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in one_size(n, args.repeats).items()})
        print(pd.DataFrame(rows).set_index("counties").T.to_string(), flush=True)


if __name__ == "__main__":
    main()
