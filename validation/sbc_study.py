"""Simulation-based calibration study of ``dpinfer.sample`` on three small models.

(a) Poisson-gamma counts with double geometric noise:
        lam ~ Gamma(4, rate 0.2);  x_i ~ Poisson(lam), i = 1..5;  s = x + DoubleGeometric(eps = 0.5)
(b) a binomial proportion released with the clamped (boundary-inflated) Laplace mechanism:
        theta ~ Beta(2, 2);  x ~ Binomial(40, theta);  s = clamp(x + Laplace(1/eps), 0, 40), eps = 0.5
(c) counts with a second, exactly observed child (dp.sample's windowed Gibbs path):
        lam ~ Gamma(4, rate 0.2);  x_i ~ Poisson(lam), i = 1..3;  y_i ~ Binomial(x_i, 0.6) observed;
        s = x + DoubleGeometric(eps = 0.5)

Each replication draws the truth from the prior and a release from the mechanism, refits the
same compiled model (release held in pm.Data) and ranks the truth among thinned posterior
draws (dpinfer.inference.sbc). On the same replicates a naive analysis takes the release as
the true count (negative releases set to 0, non-integers rounded) and uses the exact
conjugate posterior: lam | s ~ Gamma(4 + sum s, 0.2 + 5), x = s; theta | s ~ Beta(2 + s, 2 + 40 - s);
in (c) x = max(s, y), as x >= y is known.

Model (b) includes releases on both atoms (s = 0 and s = 40): the window's tail bound at the
upper atom decays because the count cannot exceed N = 40.

Run:  .venv/bin/python validation/sbc_study.py [n_reps]   (or `make validate`)
Writes validation/results/sbc.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pymc as pm

from dpinfer.inference.sbc import format_table, run_sbc
from dpinfer.mechanisms.geometric import DoubleGeometric
from dpinfer.mechanisms.truncated_laplace import BITLaplace

RESULTS = Path(__file__).parent / "results" / "sbc.md"

# model (a)
GAMMA_SHAPE, GAMMA_RATE, N_CELLS, EPS_A = 4.0, 0.2, 5, 0.5
# model (b)
BETA_A, BETA_B, N_TRIALS, EPS_B = 2.0, 2.0, 40, 0.5
# model (c)
N_CELLS_C, Q_C, EPS_C = 3, 0.6, 0.5


def poisson_gamma():
    """Model (a): returns (model, simulate, naive_fit)."""
    mech = DoubleGeometric(epsilon=EPS_A)
    with pm.Model() as model:
        s_data = pm.Data("s_data", np.zeros(N_CELLS, dtype="int64"))
        lam = pm.Gamma("lam", GAMMA_SHAPE, GAMMA_RATE)
        x = pm.Poisson("x", lam, shape=N_CELLS)
        mech.observe("s", x, observed=s_data)

    def simulate(rng):
        lam = rng.gamma(GAMMA_SHAPE, 1.0 / GAMMA_RATE)
        x = rng.poisson(lam, size=N_CELLS)
        return {"lam": lam, "x": x}, {"s_data": mech.release(x, rng)}

    def naive(data, names, rng, size=1000):
        s = np.maximum(np.asarray(data["s_data"]), 0)
        lam = rng.gamma(GAMMA_SHAPE + s.sum(), 1.0 / (GAMMA_RATE + s.size), size=size)
        return {"lam": lam, "x": np.broadcast_to(s, (size, s.size))}

    return model, simulate, naive


def beta_binomial():
    """Model (b): returns (model, simulate, naive_fit)."""
    mech = BITLaplace(epsilon=EPS_B, lower=0.0, upper=float(N_TRIALS))
    with pm.Model() as model:
        s_data = pm.Data("s_data", N_TRIALS / 2.0)
        theta = pm.Beta("theta", BETA_A, BETA_B)
        x = pm.Binomial("x", n=N_TRIALS, p=theta)
        mech.observe("s", x, observed=s_data)

    def simulate(rng):
        theta = rng.beta(BETA_A, BETA_B)
        x = rng.binomial(N_TRIALS, theta)
        s = float(mech.release(np.array(float(x)), rng))
        return {"theta": theta, "x": x}, {"s_data": np.float64(s)}

    def naive(data, names, rng, size=1000):
        s = int(np.clip(np.rint(data["s_data"]), 0, N_TRIALS))
        theta = rng.beta(BETA_A + s, BETA_B + N_TRIALS - s, size=size)
        return {"theta": theta, "x": np.full(size, s)}

    return model, simulate, naive


def poisson_binomial_child():
    """Model (c): returns (model, simulate, naive_fit)."""
    mech = DoubleGeometric(epsilon=EPS_C)
    with pm.Model() as model:
        s_data = pm.Data("s_data", np.zeros(N_CELLS_C, dtype="int64"))
        y_data = pm.Data("y_data", np.zeros(N_CELLS_C, dtype="int64"))
        lam = pm.Gamma("lam", GAMMA_SHAPE, GAMMA_RATE)
        x = pm.Poisson("x", lam, shape=N_CELLS_C)
        pm.Binomial("y", n=x, p=Q_C, observed=y_data)
        mech.observe("s", x, observed=s_data)

    def simulate(rng):
        lam = rng.gamma(GAMMA_SHAPE, 1.0 / GAMMA_RATE)
        x = rng.poisson(lam, size=N_CELLS_C)
        y = rng.binomial(x, Q_C)
        return {"lam": lam, "x": x}, {"s_data": mech.release(x, rng), "y_data": y}

    def naive(data, names, rng, size=1000):
        x = np.maximum(np.asarray(data["s_data"]), np.asarray(data["y_data"]))
        lam = rng.gamma(GAMMA_SHAPE + x.sum(), 1.0 / (GAMMA_RATE + x.size), size=size)
        return {"lam": lam, "x": np.broadcast_to(x, (size, x.size))}

    return model, simulate, naive


def run_study(n_reps: int = 200, seed: int = 20260501, **kwargs) -> dict:
    """All models, dpinfer and naive on the same replicates; returns {model name: table}."""
    results = {}
    for i, (name, setup) in enumerate(
        [("(a) Poisson-gamma + DoubleGeometric", poisson_gamma),
         ("(b) Beta-binomial + BITLaplace on [0, N]", beta_binomial),
         ("(c) Poisson counts with a Binomial child + DoubleGeometric (Gibbs path)",
          poisson_binomial_child)]
    ):
        model, simulate, naive = setup()
        print(f"\n== {name}: {n_reps} replications ==", flush=True)
        df = run_sbc(model, simulate, n_reps, np.random.default_rng([seed, i]),
                     alternatives={"naive": naive}, **kwargs)
        results[name] = df
    return results


def write_report(results: dict, path: Path = RESULTS, seed: int | None = None) -> str:
    lines = [
        "# Simulation-based calibration of dpinfer.sample",
        "",
        "Generated by `validation/sbc_study.py` (`make validate`). Randomised ranks (ties broken",
        "uniformly) of each true value among L thinned posterior draws; coverage of the central 50%",
        "and 90% intervals via the randomised PIT u = (rank + V)/(L + 1), exact for integer counts.",
        "Bands: exact binomial acceptance regions; p-values: chi-square on 10 bins and the",
        "simultaneous ECDF test (Säilynoja et al. 2022). Bonferroni within each method: a correct",
        "sampler fails any check with probability <= 1% (0.5% ranks, 0.5% coverage).",
        "The naive analysis takes the release as the true count (exact conjugate posterior).",
        "",
    ]
    for name, df in results.items():
        ess = df.attrs["ess"]
        lines += [
            f"## {name}",
            "",
            f"R = {int(df['n_reps'].iloc[0])} replications, L = {df.attrs['n_ranks']} thinned draws, "
            f"{df.attrs['seconds']:.0f} s; bulk ESS of the parameters per fit: median "
            f"{np.median(ess):.0f}, min {np.min(ess):.0f}"
            + (f"; seed {seed}" if seed is not None else ""),
            "",
            format_table(df),
            "",
        ]
    text = "\n".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n_reps = int(argv[0]) if argv else 200
    seed = 20260501
    t0 = time.perf_counter()
    results = run_study(n_reps, seed=seed, progress_every=10)
    text = write_report(results, seed=seed)
    print("\n" + text)
    print(f"\nwrote {RESULTS} ({time.perf_counter() - t0:.0f} s)")
    ok = all(df.loc[df.method == "dpinfer", "passed"].all() for df in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
