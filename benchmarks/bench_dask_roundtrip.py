"""What one synchronisation costs on Dask (issue 24's cost model): the round trip of a small
parameter vector to every worker and of a per-shard summary back, on a LocalCluster.

A sharded sampler of one posterior (shards of counts and their local parameters on the workers,
the shared parameters on the driver) needs, per sweep, at least one exchange: the shared
parameters out, each shard's summary back. If the shared parameters are moved by NUTS whose
log density sums the shards' terms, it needs one exchange per leapfrog step (tens per sweep).
This script measures that exchange, side by side, for the two ways Dask offers:

* a task per shard per exchange (``client.submit`` of a function of the shard's state held
  on its worker, gathered with ``client.gather``): the scheduler is on every path;
* an actor per shard (``client.submit(Shard, actor=True)``): the shard's state lives in an
  object on its worker and each exchange is a direct call from the driver (no scheduler).

For each: median and 90th percentile of one exchange with all shards (the driver waits for the
slowest), over ``--rounds`` exchanges, with a payload of ``--params`` float64 out and back per
shard; the same exchange's cost in this process (a function call per shard) is the baseline.

    .venv/bin/python benchmarks/bench_dask_roundtrip.py [--workers 2] [--params 64] [--rounds 300]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from distributed import Client, LocalCluster


class Shard:
    """A stand-in for a shard's state: its summary is a dot product with the parameters."""

    def __init__(self, n_params: int, seed: int):
        self.weights = np.random.default_rng(seed).normal(size=n_params)

    def summary(self, theta: np.ndarray) -> np.ndarray:
        return self.weights * float(theta @ self.weights)


def _summary(shard: Shard, theta: np.ndarray) -> np.ndarray:
    return shard.summary(theta)


def _timed(exchange, rounds: int) -> np.ndarray:
    exchange()  # warm
    seconds = np.empty(rounds)
    for i in range(rounds):
        start = time.perf_counter()
        exchange()
        seconds[i] = time.perf_counter() - start
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--params", type=int, default=64, help="float64 parameters sent out and back per shard")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    theta = np.linspace(0.0, 1.0, args.params)
    local = [Shard(args.params, s) for s in range(args.workers)]
    rows = [("in this process (baseline)", _timed(lambda: [s.summary(theta) for s in local], args.rounds))]
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        workers = list(client.scheduler_info()["workers"])
        shards = [client.submit(Shard, args.params, s, workers=[w], pure=False)
                  for s, w in enumerate(workers)]
        client.wait_for_workers(args.workers)

        def by_tasks():
            futures = [client.submit(_summary, shard, theta, workers=[w], pure=False)
                       for shard, w in zip(shards, workers)]
            return client.gather(futures)

        rows.append(("a task per shard", _timed(by_tasks, args.rounds)))
        actors = [client.submit(Shard, args.params, s, workers=[w], actor=True).result()
                  for s, w in enumerate(workers)]

        def by_actors():
            calls = [a.summary(theta) for a in actors]
            return [c.result() for c in calls]

        rows.append(("an actor per shard", _timed(by_actors, args.rounds)))
    print(f"\n{args.workers} workers (LocalCluster, processes), {args.params} float64 each way per shard, "
          f"{args.rounds} exchanges\n")
    print("| exchange | median | 90th percentile | against the baseline |")
    print("|---|---:|---:|---:|")
    base = float(np.median(rows[0][1]))
    for name, seconds in rows:
        median, p90 = float(np.median(seconds)), float(np.quantile(seconds, 0.9))
        print(f"| {name} | {median * 1e3:.3f} ms | {p90 * 1e3:.3f} ms | {median / base:,.0f}x |")


if __name__ == "__main__":
    main()
