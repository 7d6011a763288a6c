"""Fit the hierarchical Poisson model to the shipped release and print posterior summaries.

Run from the repository root: .venv/bin/python models/midwest_american_indian/fit.py
"""

from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd

import dpinfer as dp
from dpinfer.demo import county_model

HERE = Path(__file__).parent
EPSILON = 0.25  # the curator's published mechanism: DoubleGeometric(epsilon=0.25), sensitivity 1


def main() -> None:
    data = pd.read_csv(HERE / "release.csv")
    mechanism = dp.DoubleGeometric(epsilon=EPSILON)
    model, count = county_model(data["population"].to_numpy(float), data["county"].tolist())
    with model:
        mechanism.observe("release", count, observed=data["release"].to_numpy(), dims="county")
        idata = dp.sample(1000, random_seed=1)
    summary = az.summary(idata, var_names=["mu", "sigma"], ci_prob=0.9, ci_kind="eti")
    print("\nHyperparameters (90% equal-tailed intervals):")
    print(summary.to_string())
    counts = idata.posterior["count"]
    lo, med, hi = (counts.quantile(q, dim=("chain", "draw")).values for q in (0.05, 0.5, 0.95))
    table = data[["county", "population", "release"]].assign(
        median=med.astype(int), lower90=lo.astype(int), upper90=hi.astype(int)
    )
    print("\nPosterior of the true counts: median and 90% interval (first 15 counties):")
    print(table.head(15).to_string(index=False))
    print(f"\nmean 90% interval width {np.mean(hi - lo):.1f}; method: {idata.posterior.attrs['dpinfer']}")


if __name__ == "__main__":
    main()
