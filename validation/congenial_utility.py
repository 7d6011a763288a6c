"""Seed 000's Figure 1: accuracy of the congenial (conditioned) mechanism against the raw
double geometric mechanism and its non-negative least-squares projection.

Setup (reference note 000 §4.2): tables of 46 cells s_i ~ NegativeBinomial(100, 0.95) (mean
5.26), laid out as seed 000's 2 x 23 sex x age table with three equality invariants (total,
female total, voting-age total) and non-negativity. Per table, releases from
    (a) raw double geometric noise, epsilon = 1 per cell;
    (b) (a) projected by non-negative least squares onto {A s = a, s >= 0} (real-valued, as in the
        paper; ``dpinfer.utility.baselines.nonnegative_least_squares``);
    (c) the congenial mechanism: double geometric at epsilon_0 = 0.5 conditioned on the
        invariants and non-negativity, by seed 000's Algorithm 1 (proposal epsilon 0.6, the
        paper's solved cells {1, 23, 46}); its guarantee is at most 2 epsilon_0 = 1 (Theorem 2.1);
    (d) raw double geometric noise, epsilon = 0.5.
Metrics: L1 and L2 distance to the confidential table, averaged over the releases of a table;
reported as the median (min-max) over tables. The paper's Figure 1 ordering: (a) ~ (b) < (c)
< (d) (its text: (c) "between the unconstrained mechanisms with epsilon = 0.5 and 1"; (b) "on
par" with (a)). Releases of (c) are the states of one chain per table, after a burn-in,
evenly spaced (as the note's reproduction; they are dependent draws of the right law).

Run:  .venv/bin/python validation/congenial_utility.py [n_tables] [n_releases]
(default 20 x 100: about 2 minutes). Prints the table.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd

import dpinfer as dp
from dpinfer.lattice.independence_sampler import run_independence_chain, unimodular_block
from dpinfer.utility.baselines import nonnegative_least_squares

SEED = 2020
EPS_RAW, EPS_0, EPS_PROPOSAL = 1.0, 0.5, 0.6
PAPER_SOLVED = [0, 22, 45]  # Female <5, Female 85+, Male 85+
CHAIN_BURN_IN, CHAIN_SPACING = 50_000, 2_500


def sex_by_age_invariants() -> np.ndarray:
    """Rows: total, female total (cells 1-23), voting age (age columns 5-23 of both rows)."""
    A = np.zeros((3, 46), dtype=np.int64)
    A[0] = 1
    A[1, :23] = 1
    A[2, 4:23] = A[2, 27:46] = 1
    return A


def _dgeom(epsilon):
    a = math.exp(-epsilon)
    log_norm = math.log((1 - a) / (1 + a))
    return (lambda e: log_norm + np.abs(e) * math.log(a),
            lambda shape, rng: rng.geometric(1 - a, shape) - rng.geometric(1 - a, shape))


def releases_of_one_table(s, A, n_releases, rng) -> dict:
    raw1 = dp.DoubleGeometric(EPS_RAW)
    raw05 = dp.DoubleGeometric(EPS_0)
    a = A @ s
    out = {"(a) raw, epsilon = 1": np.array([raw1.release(s, rng) for _ in range(n_releases)])}
    out["(b) NNLS of (a)"] = np.array([nonnegative_least_squares(r, invariants_matrix=A, invariant_values=a)
                                       for r in out["(a) raw, epsilon = 1"]])
    log_f, _ = _dgeom(EPS_0)
    log_q, sample_q = _dgeom(EPS_PROPOSAL)
    chain = run_independence_chain(
        s, A, log_f, log_q, sample_q, unimodular_block(A, prefer_solved=PAPER_SOLVED),
        n_iterations=CHAIN_BURN_IN + n_releases * CHAIN_SPACING, burn_in=CHAIN_BURN_IN,
        thin=CHAIN_SPACING, rng=rng)
    out["(c) congenial, epsilon_0 = 0.5"] = chain.draws[:n_releases]
    out["(d) raw, epsilon = 0.5"] = np.array([raw05.release(s, rng) for _ in range(n_releases)])
    return out, chain.acceptance


def run(n_tables: int = 20, n_releases: int = 100, seed: int = SEED) -> pd.DataFrame:
    """Per-table average L1 and L2 distances of every method; columns method, table, L1, L2."""
    rng = np.random.default_rng(seed)
    A = sex_by_age_invariants()
    tables = rng.negative_binomial(100, 0.95, size=(n_tables, 46))
    rows = []
    for t, s in enumerate(tables):
        releases, acceptance = releases_of_one_table(s, A, n_releases, rng)
        for method, r in releases.items():
            diff = r - s
            rows.append({"method": method, "table": t, "L1": np.abs(diff).sum(axis=1).mean(),
                         "L2": np.sqrt((diff.astype(float) ** 2).sum(axis=1)).mean(),
                         "acceptance": acceptance if method.startswith("(c)") else math.nan})
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    def fmt(v):
        return f"{np.median(v):.2f} [{np.min(v):.2f}, {np.max(v):.2f}]"

    return df.groupby("method").agg(L1=("L1", fmt), L2=("L2", fmt))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n_tables = int(argv[0]) if argv else 20
    n_releases = int(argv[1]) if len(argv) > 1 else 100
    df = run(n_tables, n_releases)
    print(f"{n_tables} tables x {n_releases} releases; median [min, max] over tables of the mean distance")
    print(summary(df).to_string())
    acc = df["acceptance"].dropna()
    print(f"Algorithm 1 acceptance: median {acc.median():.2%} [{acc.min():.2%}, {acc.max():.2%}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
