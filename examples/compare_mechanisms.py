"""Curator's view: compare mechanisms for a count at equal privacy.

Every mechanism below releases a count with sensitivity 1 under add-remove neighbours at
epsilon = 0.5 (the Gaussians at delta = 1e-6). For each, the exact privacy audit, the utility
(bias, RMSE) at a few true counts, and the width of the interval that holds the release with
probability 90%. Run: .venv/bin/python examples/compare_mechanisms.py
"""

import numpy as np
import pandas as pd

import dpinfer as dp

EPSILON, DELTA = 0.5, 1e-6
true_counts = np.array([0.0, 2.0, 10.0, 100.0])

mechanisms = {
    "DoubleGeometric": dp.DoubleGeometric(epsilon=EPSILON),
    "ClampedGeometric [0, inf)": dp.ClampedGeometric(epsilon=EPSILON, lower=0),
    "Laplace": dp.Laplace(epsilon=EPSILON),
    "BITLaplace [0, inf)": dp.BITLaplace(epsilon=EPSILON, lower=0.0),
    "TruncatedLaplace [0, 120]": dp.TruncatedLaplace(epsilon=EPSILON, lower=0.0, upper=120.0),
    "DiscreteGaussian": dp.DiscreteGaussian.from_privacy(epsilon=EPSILON, delta=DELTA),
    "Gaussian (analytic)": dp.Gaussian(epsilon=EPSILON, delta=DELTA),
}

rows = []
for name, mech in mechanisms.items():
    audit = mech.audit()
    lo, hi = mech.release_interval(true_counts, prob=0.9)
    row = {
        "mechanism": name,
        "claimed (eps, delta)": f"({mech.epsilon:.3g}, {mech.delta:.0e})",
        "audit holds": audit.holds,
        "sampler": "exact" if mech.exact_sampler else "simulation",
    }
    for x, bias, mse, width in zip(true_counts, mech.bias(true_counts), mech.mse(true_counts), hi - lo):
        row[f"bias@{x:g}"] = round(float(bias), 3)
        row[f"rmse@{x:g}"] = round(float(np.sqrt(mse)), 3)
        row[f"90%w@{x:g}"] = round(float(width), 1)
    rows.append(row)

pd.set_option("display.width", 250)
print(f"Count queries, sensitivity 1, epsilon = {EPSILON} (Gaussians: delta = {DELTA})\n")
print(pd.DataFrame(rows).set_index("mechanism").T.to_string())
