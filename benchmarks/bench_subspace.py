"""Independent draws per second at TV <= 0.01: invariant-respecting noise (seeds 000 and 001).

For each case the number of iterations T that brings a chain within total variation 0.01 of
its target is estimated by an L-lag coupling (Biswas, Jacob & Vanetti 2019; 95% upper
confidence limit, ``MeetingTimes.iterations_for``), and a chain run for T iterations counts as
one independent draw. Every method is timed in this one run, on the same machine:

* **baseline**: a straightforward single-chain implementation of the paper's algorithm, one
  Python iteration per step (numpy for the vector arithmetic), as a reader of the paper would
  write it: seed 001's Algorithm 1 (lattice random-walk Metropolis, one joint accept) or seed
  000's Algorithm 1 (independence sampler with the solved block). Draws/s = 1 / (T x seconds
  per iteration).
* **dpinfer MCMC**: the same algorithm in dpinfer, vectorised over many independent chains
  (``LatticeWalk.run``) or over batches of proposals (``run_independence_chain``). Draws/s =
  chains / time of T iterations (one chain per draw).
* **dpinfer Gibbs**: exact Gibbs sweeps along the Markov moves of the invariants
  (``NoiseGibbs``, the default chain of ``GeneralizedLaplace``; l1 lines in closed form), its own
  T in sweeps from its common-random-number coupling; draws/s = chains / time of T sweeps.
* **dpinfer exact**: where dpinfer has an exact sampler of the same law (the l1 target on a
  total, which is i.i.d. double geometric noise conditioned on A z = 0; non-negativity on the
  2 x 23 table), i.i.d. draws per second; TV is only the tabulation error (tail mass 1e-20 per
  cell). Two-way margins have none (their noise lattice is 9-dimensional).

Cases: the 4 x 4 table with both margins, epsilon = 0.25, l1 (proposal a = e^-1) and l2
(a = e^-2) (seed 001 §6); seed 000's 2 x 23 table (total, female and voting-age totals,
non-negativity; epsilon = 0.5, proposal epsilon 0.6, solved cells {1, 23, 46}), from the
data-free start ``feasible_point``; the Illinois-size sum constraint (d = 102, epsilon = 0.192,
l1, a = e^-2.5 as in seed 001 §E.4).

Run:  .venv/bin/python benchmarks/bench_subspace.py   (about 20 minutes on 2 cores;
      --quick for a smoke run with fewer coupling runs, whose TV limits are not 0.01)
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

import dpinfer as dp
from dpinfer.lattice.independence_sampler import (independence_meeting_times, run_independence_chain,
                                                  unimodular_block)
from dpinfer.lattice.noise_gibbs import NoiseGibbs
from dpinfer.lattice.random_walk import LatticeWalk, double_geometric_draws
from dpinfer.lattice.targets import laplace_log_target

TABLE1 = Path(__file__).resolve().parents[1] / "models" / "sex_by_age_congenial" / "release.csv"


def progress(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- straightforward single-chain baselines --------------------------------------------------------


def single_chain_lattice_walk(C, log_target, a, n_iterations, rng) -> float:
    """Seed 001 Algorithm 1 as written in the paper, one chain: seconds per iteration."""
    m = C.shape[1]
    w = np.zeros(m, dtype=np.int64)
    log_q = log_target(C @ w)
    p = 1.0 - a
    start = time.perf_counter()
    for _ in range(n_iterations):
        proposal = w + rng.geometric(p, m) - rng.geometric(p, m)
        log_q_new = log_target(C @ proposal)
        if math.log(rng.random()) <= log_q_new - log_q:
            w, log_q = proposal, log_q_new
    return (time.perf_counter() - start) / n_iterations


def single_chain_independence(x, A, block, eps, eps_proposal, start_state, n_iterations, rng) -> float:
    """Seed 000 Algorithm 1 as written in the paper, one chain: seconds per iteration."""
    a, a_prop = math.exp(-eps), math.exp(-eps_proposal)
    a_val = A @ x
    free, solved, inverse = block.free, block.solved, block.inverse
    state = start_state.copy()
    log_w = (math.log(a) * np.abs(state - x).sum() - math.log(a_prop) * np.abs(state[free] - x[free]).sum())
    start = time.perf_counter()
    for _ in range(n_iterations):
        e = rng.geometric(1 - a_prop, free.size) - rng.geometric(1 - a_prop, free.size)
        s = np.empty_like(x)
        s[free] = x[free] + e
        s[solved] = inverse @ (a_val - A[:, free] @ s[free])
        if np.any(s < 0):
            continue
        log_w_new = math.log(a) * np.abs(s - x).sum() - math.log(a_prop) * np.abs(e).sum()
        if math.log(rng.random()) <= log_w_new - log_w:
            state, log_w = s, log_w_new
    return (time.perf_counter() - start) / n_iterations


# --- cases ----------------------------------------------------------------------------------------


def iterations_at_tv(meetings, runs: int, cap: int) -> tuple[int, str]:
    """T at a 95% limit of TV 0.01, or the cap (with the reason) when the runs cannot certify it."""
    try:
        return meetings.iterations_for(0.01), "certified"
    except ValueError:
        why = (f"{meetings.n_censored} of {runs} runs censored at {cap}" if meetings.n_censored
               else f"the 95% limit cannot reach 0.01 with {runs} runs")
        return cap, f"not certified ({why}); T = cap"


def gibbs_rows(name, inv, target, runs, chains, base_rate, rng, rows, cap=1000):
    """Rows for the exact Gibbs sampler: T (sweeps) from its coupling, then chains x T sweeps."""
    gibbs = NoiseGibbs(inv.markov_basis(), target)
    start = time.perf_counter()
    meetings = gibbs.meeting_times(10, runs, rng, max_sweeps=cap)
    T, status = iterations_at_tv(meetings, runs, cap)
    note = (f"T in sweeps of {gibbs.updates_per_sweep} line updates; coupling ({runs} runs, lag 10, "
            f"{time.perf_counter() - start:.0f} s), {status}")
    progress(f"{name}: Gibbs T = {T} sweeps")
    gibbs.run(2, T, rng)  # compile
    start = time.perf_counter()
    gibbs.run(chains, T, rng)
    rate = chains / (time.perf_counter() - start)
    rows.append(dict(case=name, method=f"dpinfer Gibbs along Markov moves, {chains} chains", T=T,
                     draws_per_s=rate, ratio=rate / base_rate, note=note))


def lattice_case(name, inv, eps, norm, a, lag, runs, cap, chains, exact, rng, rows, *,
                 gibbs_cap: int | None = None):
    C = np.asarray(inv.kernel_basis())
    target = laplace_log_target(eps, norm)
    walk = LatticeWalk(C, target, a)
    progress(f"{name}: coupling, {runs} runs, lag {lag}")
    start = time.perf_counter()
    meetings = walk.meeting_times(lag, runs, rng, max_iterations=cap, progress=progress)
    T, status = iterations_at_tv(meetings, runs, cap)
    t_note = f"coupling ({runs} runs, {time.perf_counter() - start:.0f} s), {status}"
    progress(f"{name}: T = {T} ({t_note})")
    per_iter = single_chain_lattice_walk(C, target, a, min(20_000, max(2000, T)), rng)
    base_rate = 1.0 / (T * per_iter)
    rows.append(dict(case=name, method="baseline: single chain (paper's Algorithm 1)", T=T,
                     draws_per_s=base_rate, ratio=1.0, note=f"{per_iter * 1e6:.1f} us/iteration; {t_note}"))
    start = time.perf_counter()
    walk.run(chains, T, rng)
    elapsed = time.perf_counter() - start
    rate = chains / elapsed
    rows.append(dict(case=name, method=f"dpinfer LatticeWalk, {chains} chains", T=T, draws_per_s=rate,
                     ratio=rate / base_rate, note=f"{elapsed:.1f} s for {chains} chains"))
    if gibbs_cap is not None:
        gibbs_rows(name, inv, target, runs, 20 * chains, base_rate, rng, rows, gibbs_cap)
    if exact is not None:
        exact.sample_noise(rng, size=10)  # compile / tabulate
        n = 20_000
        start = time.perf_counter()
        exact.sample_noise(rng, size=n)
        rate = n / (time.perf_counter() - start)
        rows.append(dict(case=name, method="dpinfer exact (conditioned double geometric)", T=0,
                         draws_per_s=rate, ratio=rate / base_rate, note="i.i.d."))


def table1_case(runs, rng, rows):
    data = pd.read_csv(TABLE1)
    adult = ~data["age"].isin(["<5", "5-9", "10-14", "15-17"]).to_numpy()
    female = (data["sex"] == "female").to_numpy()
    inv = dp.Invariants.from_matrix(np.vstack([np.ones(len(data)), female, adult]).astype(int))
    x = data["confidential"].to_numpy()
    A = inv.matrix
    base, proposal = dp.DoubleGeometric(0.5), dp.DoubleGeometric(0.6)
    block = unimodular_block(A, prefer_solved=[0, 22, 45])
    start_state = inv.feasible_point(A @ x)
    name = "2x23 table, non-negativity (seed 000)"
    progress(f"{name}: coupling, {runs} runs")
    start = time.perf_counter()
    meetings = independence_meeting_times(
        x, A, base.noise_logpdf, proposal.noise_logpdf,
        lambda shape, g: double_geometric_draws(proposal.alpha, shape, g),
        block, start=start_state, lag=2000, n_runs=runs, rng=rng, batch=2000)
    T = meetings.iterations_for(0.01)
    t_note = f"coupling ({runs} runs, lag 2000, {time.perf_counter() - start:.0f} s)"
    progress(f"{name}: T = {T} ({t_note})")
    per_iter = single_chain_independence(x, A, block, 0.5, 0.6, start_state, 20_000, rng)
    base_rate = 1.0 / (T * per_iter)
    rows.append(dict(case=name, method="baseline: single chain (paper's Algorithm 1)", T=T,
                     draws_per_s=base_rate, ratio=1.0, note=f"{per_iter * 1e6:.1f} us/iteration; {t_note}"))
    n_iter = 200_000
    start = time.perf_counter()
    run_independence_chain(x, A, base.noise_logpdf, proposal.noise_logpdf,
                           lambda shape, g: double_geometric_draws(proposal.alpha, shape, g), block,
                           n_iterations=n_iter, burn_in=n_iter - 1, rng=rng, start=start_state)
    per_iter_vec = (time.perf_counter() - start) / n_iter
    rate = 1.0 / (T * per_iter_vec)
    rows.append(dict(case=name, method="dpinfer Algorithm 1 (batched proposals, numba accept)", T=T,
                     draws_per_s=rate, ratio=rate / base_rate, note=f"{per_iter_vec * 1e6:.2f} us/iteration"))
    mech = dp.Conditioned(base, inv, nonnegative=True)
    mech.sample_noise(rng, 10, true_values=x)
    n = 20_000
    start = time.perf_counter()
    mech.sample_noise(rng, n, true_values=x)
    rate = n / (time.perf_counter() - start)
    rows.append(dict(case=name, method="dpinfer exact (class-lattice convolution)", T=0,
                     draws_per_s=rate, ratio=rate / base_rate, note="i.i.d."))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--runs", type=int, default=300,
                        help="coupling runs per case (>= 299 for a 95%% limit of 0.01 to be reachable)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 40 runs, smaller caps")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    runs = 40 if args.quick else args.runs
    rows: list[dict] = []
    margins = dp.Invariants.margins((4, 4), [(0,), (1,)])
    # no exact sampler for two-way margins: the class lattice is the 9-dimensional noise lattice
    lattice_case("4x4 margins, l1, eps 0.25", margins, 0.25, "l1", math.exp(-1), 1000, runs, 10**5,
                 2000, None, rng, rows, gibbs_cap=30 if args.quick else 1000)
    lattice_case("4x4 margins, l2, eps 0.25", margins, 0.25, "l2", math.exp(-2), 10_000, runs,
                 10**5 if args.quick else 10**6, 400, None, rng, rows,
                 gibbs_cap=30 if args.quick else 1000)
    table1_case(runs, rng, rows)
    total = dp.Invariants.total(102)
    lattice_case("Illinois-size total, l1, eps 0.192", total, 0.192, "l1", math.exp(-2.5), 10**4,
                 min(runs, 40), 2 * 10**5, 200, dp.Conditioned(dp.DoubleGeometric(0.192), total), rng, rows)
    table = pd.DataFrame(rows)
    table["draws_per_s"] = table["draws_per_s"].map(lambda v: f"{v:.4g}")
    table["ratio"] = table["ratio"].map(lambda v: f"{v:.3g}x")
    print("\nIndependent draws per second at TV <= 0.01 (95% upper limit of the coupling bound)")
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
