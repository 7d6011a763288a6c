r"""Ready-made comparisons (``dpinfer compare --preset NAME``): the seeds' studies and a curator's
question on the shipped data.

* ``seed002``: seed 002's study (Liu 2019 / reference note 002 §3, §5.2): a proportion p of n
  records (sensitivity 1/n on [0, 1]) released by the truncated and the boundary-inflated
  truncated (BIT) Laplace mechanisms at the same epsilon, across n, epsilon and p: bias, MSE
  and n^2 MSE (bounded as n grows: MSE-consistency at rate O(n^-2), Proposition 2), from the
  mechanisms' exact moments (note §3.3).
* ``seed004``: seed 004's valid 1-D comparisons (Vinterbo 2022; reference note 004 §3.4-3.6):
  noise sd of Laplace, Logistic and Gaussian noise calibrated to the same (epsilon, delta), the
  variance ratios, and the separators epsilon*(delta) where Logistic and Laplace noise have
  equal variance; then the withdrawn Section 4.1 (Theorem 9) Subbotin scales next to their true
  delta, by Monte Carlo of the k-dimensional privacy loss (note §5.4).
* ``midwest``: the curator's question on the shipped 1990 county counts (the demo's American
  Indian counts of Illinois): at one privacy budget, which mechanism gives the analyst the
  narrowest valid intervals, and what the state-total invariant costs or gains, by
  :func:`~dpinfer.utility.compare.compare` at the release and analysis levels.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import optimize

from dpinfer.mechanisms import BITLaplace, Conditioned, DiscreteGaussian, DoubleGeometric, Subbotin, TruncatedLaplace
from dpinfer.lattice.invariants import Invariants
from dpinfer.utility.compare import Analysis, Comparison, compare
from dpinfer.utility.equal_privacy import PrivacyTarget, calibrate

__all__ = ["PRESETS", "midwest", "seed002", "seed002_figure", "seed004", "seed004_figure"]


def seed002(ns=(50, 200, 1000, 5000), epsilons=(0.1, 0.5, 1.0), proportions=(0.05, 0.25, 0.5)) -> pd.DataFrame:
    """Seed 002's proportion study (module docstring): one row per (n, epsilon, p, mechanism)."""
    rows = []
    for n in ns:
        for eps in epsilons:
            mechs = {"truncated Laplace": TruncatedLaplace(eps, 0.0, 1.0, sensitivity=1.0 / n),
                     "BIT Laplace": BITLaplace(eps, 0.0, 1.0, sensitivity=1.0 / n)}
            for p in proportions:
                for name, mech in mechs.items():
                    bias = float(mech.bias(np.array([p]))[0])
                    mse = float(mech.mse(np.array([p]))[0])
                    rows.append({"n": n, "epsilon": eps, "p": p, "mechanism": name,
                                 "scale": mech.scale, "bias": bias, "mse": mse, "n2_mse": n * n * mse})
    return pd.DataFrame(rows)


def _panels_by_epsilon(table: pd.DataFrame, draw, xlabel: str, ylabel: str):
    """One log-x panel per epsilon of ``table``; ``draw(ax, part)`` plots a panel's lines."""
    import matplotlib.pyplot as plt

    epsilons = sorted(table["epsilon"].unique())
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.2 * len(epsilons), 3.4), squeeze=False,
                             layout="constrained")
    for ax, eps in zip(axes[0], epsilons):
        draw(ax, table[table["epsilon"] == eps])
        ax.set_xscale("log")
        ax.set_title(f"epsilon = {eps:g}", fontsize=9)
        ax.set_xlabel(xlabel)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=6)
    return fig


def seed002_figure(table: pd.DataFrame):
    """n^2 MSE against n (log scales), one panel per epsilon, a line per mechanism and p: flat
    lines are MSE-consistency at rate n^-2."""
    def draw(ax, part):
        for (mech, p), line in part.groupby(["mechanism", "p"]):
            ax.plot(line["n"], line["n2_mse"], marker="o", ls="-" if mech.startswith("BIT") else "--",
                    label=f"{mech}, p = {p:g}")
        ax.set_yscale("log")

    return _panels_by_epsilon(table, draw, "n", "n^2 x MSE")


def seed004_figure(tables: dict):
    """Noise sd at equal (epsilon, delta): Laplace, Logistic and Gaussian against delta, one
    panel per epsilon."""
    def draw(ax, part):
        for family in ("Laplace", "Logistic", "Gaussian"):
            ax.plot(part["delta"], part[f"sd {family}"], marker="o", label=family)

    return _panels_by_epsilon(tables["sd"], draw, "delta", "noise sd at equal (epsilon, delta)")


def _sd(family, eps, delta):
    return calibrate(family, PrivacyTarget.approximate(eps, delta)).noise_sd


def seed004(epsilons=(0.1, 1.0, 2.0), deltas=(1e-2, 1e-5, 1e-8), monte_carlo=200_000,
            rng=None) -> dict[str, pd.DataFrame]:
    """Seed 004's valid comparisons and the withdrawn Section 4.1 numbers with their true delta
    (module docstring): {"sd": ..., "separators": ..., "withdrawn": ...}."""
    rng = np.random.default_rng(2022) if rng is None else rng
    rows = []
    for eps in epsilons:
        for delta in deltas:
            lap, log, gau = (_sd(f, eps, delta) for f in ("Laplace", "Logistic", "Gaussian"))
            rows.append({"epsilon": eps, "delta": delta, "sd Laplace": lap, "sd Logistic": log,
                         "sd Gaussian": gau, "Var Log / Var Lap": (log / lap) ** 2,
                         "Var Lap / Var Gauss": (lap / gau) ** 2, "Var Log / Var Gauss": (log / gau) ** 2})
    sd = pd.DataFrame(rows)
    separators = []
    for delta in (0.1, 1e-2, 1e-4):
        root = optimize.brentq(lambda e: _sd("Logistic", e, delta) / _sd("Laplace", e, delta) - 1.0,
                               1e-4, 10.0, xtol=1e-12)
        separators.append({"delta": delta, "epsilon* (Var Logistic = Var Laplace)": root})
    withdrawn = []
    n_records, target_delta, eps = 1000, 1e-4, 1.0
    for k, r in ((100, 4.0), (1000, 7.0)):
        sensitivity = 2 * k ** (1 / r) / n_records  # the l_r sensitivity Theorem 9 calibrated to
        mech = Subbotin(r, eps, target_delta, sensitivity=sensitivity)
        draws = max(monte_carlo // k, 100)
        x = mech.sample_noise((draws, k), rng)
        loss = (mech.noise_logpdf(x) - mech.noise_logpdf(x - 2.0 / n_records)).sum(axis=1)
        terms = -np.expm1(np.minimum(eps - loss, 0.0))
        withdrawn.append({"k": k, "r": r, "claimed (epsilon, delta)": f"({eps:g}, {target_delta:g})",
                          "Sub(r) scale (Theorem 9)": mech.scale, "true delta (Monte Carlo)": terms.mean(),
                          "standard error": terms.std() / math.sqrt(draws), "draws": draws})
    return {"sd": sd, "separators": pd.DataFrame(separators), "withdrawn": pd.DataFrame(withdrawn)}


def midwest(epsilon=0.25, replications=100, rng=None, progress=True) -> Comparison:
    """The curator's question on the shipped Illinois counts (module docstring): double
    geometric noise at ``epsilon`` per county, the same conditioned on the state total (the
    invariant), and the discrete Gaussian calibrated to rho = epsilon^2 / 2, the zCDP that
    epsilon-DP implies (all three meet that target; the double geometric's exact rho is a little
    smaller), scored
    by the demo's hierarchical Poisson model over ``replications`` releases of the true counts
    (fixed: the curator's data), beside the naive analysis."""
    from dpinfer.demo import county_model, load_midwest

    data = load_midwest()
    data = data[data["state"] == "IL"].reset_index(drop=True)
    population = data["population"].to_numpy(float)
    truth = data["american_indian"].to_numpy(np.int64)
    counties = data["county"].str.title().tolist()
    dg = DoubleGeometric(epsilon)
    target = PrivacyTarget.zcdp(epsilon**2 / 2)  # what epsilon-DP implies (Bun & Steinke 1.4)
    mechanisms = {
        f"double geometric, epsilon {epsilon:g}": dg,
        f"double geometric, epsilon {epsilon:g}, state total kept": Conditioned(dg, Invariants.total(len(truth))),
        f"discrete Gaussian, rho {target.rho:.4g}": calibrate(DiscreteGaussian, target).mechanism,
    }

    def build():
        return county_model(population, counties)[0]

    analysis = Analysis(build, "count", "sigma", lambda rng: (truth, None), draws=500, tune=500)
    return compare(mechanisms, truth, target=target, levels=("release", "analysis"), analysis=analysis,
                   replications=replications, rng=np.random.default_rng(2026) if rng is None else rng,
                   progress=progress, tails=(5.0, 20.0))


PRESETS = {"seed002": seed002, "seed004": seed004, "midwest": midwest}
