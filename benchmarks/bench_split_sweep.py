"""A state's counts sharded by county: the split sweep (dpinfer.lattice.nested.split) against
the whole tree's, its parts, and a cost model for N workers checked on 2.

The table is bench_nested's synthetic state (``--counties`` counties shaped like Iowa's: ~9
tracts of ~3 block groups, the leaves, 28 cells; measurements at every level, the state's
total exact), its prior table the true Poisson rates, from the truth. The counties are cut into
``--shards`` runs of about equal numbers of leaves (:meth:`NestedSums.split`). Measured, each
the median of ``--rounds`` rounds of ``--sweeps`` sweeps (wall seconds; the first sweep, which
may compile, apart):

* **whole**: :class:`~dpinfer.lattice.nested.sampler.NestedGibbs` sweeps of the whole tree (the
  one-machine engine's count draw, the baseline);
* **split, this process**: :class:`~dpinfer.lattice.nested.split.SplitGibbs` with the shards in
  this process, and its parts: each shard's own time (its calls, timed around them), the
  driver's (its moves of the upper areas and the Python between calls), the message entries
  sent per direction;
* **split, Dask**: the same on a LocalCluster of ``--workers`` one-thread worker processes, and
  the round trip of an actor call that does nothing (:meth:`ShardCounts.root_sums`).

The cost model: a sweep on W workers costs the busiest worker's share of the shards' work plus,
per direction (and once to start the sweep), a synchronisation: the driver's move of the upper
areas and one call to every shard, which sends a sum and an index and returns a message:

    T(W) = max over workers of its shards' time + (directions + 1) x sync(W)

Printed: the prediction with sync = the driver's part + a no-op actor call's round trip to every
shard, against the Dask measurement (the check); the synchronisation measured, (T - the busiest
worker's work) / (directions + 1); and the projection to 2, 4 and 16 workers, one shard a
worker, with the measured synchronisation scaled by the no-op round trip's growth with the
shards contacted (linear through one shard's and all shards'). ``--scale S`` (seconds of a
whole-tree sweep at a larger size, e.g. 31 for the synthetic Iowa at blocks,
benchmarks/README.md) projects the shards' work to that size (times S over this run's
whole-tree sweep; the synchronisation does not grow with the counts).

Run:  .venv/bin/python benchmarks/bench_split_sweep.py [--counties 12] [--shards 4] [--workers 2]
      [--sweeps 5] [--rounds 3] [--scale 31 --directions 126]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_nested  # noqa: E402

from dpinfer._random_stream import new_stream  # noqa: E402
from dpinfer.lattice.nested.directions import sweep_directions  # noqa: E402
from dpinfer.lattice.nested.sampler import NestedGibbs  # noqa: E402
from dpinfer.lattice.nested.split import SplitGibbs  # noqa: E402


class Timed:
    """A shard in this process whose calls are timed (seconds accumulated in ``seconds``)."""

    def __init__(self, shard):
        self.shard, self.seconds = shard, 0.0

    def __getattr__(self, name):
        method = getattr(self.shard, name)

        def timed(*args):
            t0 = time.perf_counter()
            out = method(*args)
            self.seconds += time.perf_counter() - t0
            return out
        return timed


def county_parts(sums, county_area, shards: int) -> list:
    """The county areas cut into ``shards`` contiguous runs of about equal numbers of leaves."""
    leaves = np.array([u.size for u in sums.leaves_under()])[county_area]
    edges = np.searchsorted(np.cumsum(leaves), np.arange(1, shards) * leaves.sum() / shards)
    return [part.tolist() for part in np.split(county_area, edges) if part.size]


def setup(counties: int, seed: int):
    from scipy import stats

    size = dict(bench_nested.IOWA, counties=counties)
    nm, truth, _, rates = bench_nested.synthetic_state(**size, seed=seed)
    sums = nm.sums
    lo, hi = bench_nested.planned_boxes(nm, truth)
    county_area = np.flatnonzero(sums.parent == 0)  # the state is area 0, its children the counties
    return sums, truth, rates, lo, hi, county_area, stats


def measure(args) -> dict:
    sums, truth, rates, lo, hi, county_area, stats = setup(args.counties, args.seed)
    whole = NestedGibbs(sums, lo, hi)
    prior = np.ascontiguousarray(stats.poisson.logpmf(whole.grid(), rates.reshape(-1)[whole.rows()]))
    parts = county_parts(sums, county_area, args.shards)
    split = SplitGibbs(sums.split(parts), lo, hi)
    priors = [stats.poisson.logpmf(grid, rates[leaves].reshape(-1)[rows])
              for (grid, rows), leaves in zip(split.shard_grids(), split.split.shard_leaves)]
    row = {"counties": args.counties, "leaves": sums.n_leaves, "counts": truth.size, "shards": len(parts)}

    whole.run(truth, prior, 1, np.random.default_rng(1))  # compile / load
    rounds = []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        whole.run(truth, prior, args.sweeps, np.random.default_rng(r))
        rounds.append((time.perf_counter() - t0) / args.sweeps)
    row["whole s/sweep"] = statistics.median(rounds)

    def split_sweeps(client, n, rng, timed=False):
        shards = split.start(truth, priors, rng, client)
        if timed:
            shards = [Timed(sh) for sh in shards]
        top = split.split.top
        x_top = np.array([sh.root_sums() if client is None else sh.root_sums().result() for sh in shards])
        state = (x_top, top.area_sums(x_top), top.term_sums(x_top).astype(np.int64))
        work, stream, st = split.top_workspace(), new_stream(rng), np.zeros(3, np.int64)
        split.sweep(shards, state, work, stream, st)  # first sweep (compiles where the shards are)
        if timed:
            for sh in shards:
                sh.seconds = 0.0
        t0 = time.perf_counter()
        for _ in range(n):
            split.sweep(shards, state, work, stream, st)
        seconds = (time.perf_counter() - t0) / n
        return seconds, shards

    here, shard_s = [], []
    for r in range(args.rounds):
        seconds, shards = split_sweeps(None, args.sweeps, np.random.default_rng(r), timed=True)
        here.append(seconds)
        shard_s.append([sh.seconds / args.sweeps for sh in shards])
    row["split here s/sweep"] = statistics.median(here)
    per_shard = np.median(np.array(shard_s), axis=0)
    row["shards s/sweep (sum)"] = float(per_shard.sum())
    row["driver s/sweep"] = row["split here s/sweep"] - row["shards s/sweep (sum)"]
    ptr, _, _ = sweep_directions(
        sums.n_cells, np.array(sums.cell_shape, np.int64), new_stream(np.random.default_rng(0)))
    directions = ptr.size - 1
    row["directions/sweep"] = directions
    row["driver ms/direction"] = 1000 * row["driver s/sweep"] / directions
    shards_here = split.start(truth, priors, np.random.default_rng(0))
    widths = []
    for sh in shards_here:  # along each cell alone
        sh.begin_sweep(np.arange(sums.n_cells + 1), np.arange(sums.n_cells), np.ones(sums.n_cells, np.int64))
        widths += [sh.message(c)[0].size for c in range(sums.n_cells)]
    row["message entries (median, max)"] = f"{int(np.median(widths))}, {max(widths)}"

    if args.workers:
        import distributed

        with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                      dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
            dask_rounds, trips, one = [], [], []
            for r in range(args.rounds):
                seconds, shards = split_sweeps(client, args.sweeps, np.random.default_rng(r))
                dask_rounds.append(seconds)
                for _ in range(50):
                    t0 = time.perf_counter()
                    [f.result() for f in [sh.root_sums() for sh in shards]]
                    trips.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    shards[0].root_sums().result()
                    one.append(time.perf_counter() - t0)
            row[f"split Dask ({args.workers} workers) s/sweep"] = dask = statistics.median(dask_rounds)
            row["no-op round trip ms, one shard"] = 1000 * statistics.median(one)
            row["no-op round trip ms, all shards"] = 1000 * statistics.median(trips)
        busiest = max(per_shard[k::args.workers].sum() for k in range(args.workers))
        row["sync ms/direction (measured)"] = 1000 * (dask - busiest) / (directions + 1)
        row[f"predicted from no-op trips ({args.workers} workers) s/sweep"] = predicted = (
            busiest + (directions + 1) * (row["driver ms/direction"] + row["no-op round trip ms, all shards"]) / 1000)
        row["measured / predicted"] = dask / predicted
    return row, per_shard


def sync_ms(row: dict, shards: int) -> float:
    """The synchronisation per direction with ``shards`` shards: the measured one, scaled by the
    no-op round trip's growth with the shards contacted (linear through this run's one-shard
    and all-shard trips)."""
    one, every = row["no-op round trip ms, one shard"], row["no-op round trip ms, all shards"]
    per_shard = (every - one) / max(row["shards"] - 1, 1)
    return row["sync ms/direction (measured)"] * (one + per_shard * (shards - 1)) / every


def project(per_shard, workers: int, row: dict, scale: float, directions: int) -> float:
    """T(W), one shard a worker, at ``scale`` times this run's shards' work cut into W equal
    shares times this run's imbalance (its largest shard over its mean), with ``directions``
    directions a sweep."""
    imbalance = per_shard.max() / per_shard.mean()
    return per_shard.sum() * scale / workers * imbalance + (directions + 1) * sync_ms(row, workers) / 1000

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counties", type=int, default=12)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes (0: none, no cost model)")
    parser.add_argument("--sweeps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--scale", type=float, default=None,
                        help="seconds of a whole-tree sweep at a larger size to project the cost model to")
    parser.add_argument("--directions", type=int, default=None,
                        help="directions a sweep to project with (default this table's; 126 for the "
                             "Census table's 2 x 2 x 7 cells)")
    args = parser.parse_args(argv)
    row, per_shard = measure(args)
    width = max(len(k) for k in row)
    for key, value in row.items():
        print(f"{key:<{width}}  {value:.4g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    if "sync ms/direction (measured)" not in row:
        return
    scale = 1.0 if args.scale is None else args.scale / row["whole s/sweep"]
    label = "this table" if args.scale is None else f"a whole-tree sweep of {args.scale:g} s"
    print(f"\ncost model at {label}, s per sweep, one shard a worker (the shards' work in W equal shares "
          f"times this run's imbalance {per_shard.max() / per_shard.mean():.2f}; per direction the measured "
          f"synchronisation, scaled with the shards contacted):")
    directions = args.directions or row["directions/sweep"]
    print(f"  one machine, the whole tree: {row['whole s/sweep'] * scale:.3f}")
    for workers in (2, 4, 16):
        print(f"  {workers:>2} workers ({directions} directions a sweep): "
              f"{project(per_shard, workers, row, scale, directions):.3f}")

if __name__ == "__main__":
    main()
