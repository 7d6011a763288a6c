"""Validation tier (`make validate`): Bernstein & Sheldon's Beta-Binomial experiment
(validation/bernstein_sheldon.py) on 4 of its cells, 200 trials each: dpinfer's posterior is
calibrated (the PITs of the true theta uniform, 90% intervals covering inside their binomial
band), agrees with the exact posterior by enumeration on every trial, and the naive analysis
is shown to fail where the noise is large against the count. About 5 minutes on 2 cores.
The full study: `.venv/bin/python validation/bernstein_sheldon.py` (writes
validation/results/bernstein_sheldon.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import bernstein_sheldon  # noqa: E402

TRIALS = 200
CELLS = [(10, 0.1), (10, 1.0), (1000, 0.1), (1000, 1.0)]
ALPHA = 0.01 / len(CELLS)  # family-wise 1% over the cells, for each check


@pytest.mark.validation
@pytest.mark.parametrize("n, epsilon", CELLS)
def test_dpinfer_calibrated_and_exact(n, epsilon):
    cell = bernstein_sheldon.run_cell(n, epsilon, TRIALS, draws=1000, seed=bernstein_sheldon.SEED)
    rows = {row["method"]: row for row in cell["rows"]}
    lo, hi = (v / TRIALS for v in stats.binom.interval(1 - ALPHA, TRIALS, 0.9))
    for method in ("exact", "dpinfer"):
        assert rows[method]["KS p"] > ALPHA, rows[method]
        assert lo <= rows[method]["cover 90%"] <= hi, rows[method]
    # agreement with the exact posterior on every trial: |z| <= 4.5 over 3 quantiles x 200
    # trials has probability about 0.996 when dpinfer is exact (normal z)
    assert rows["dpinfer"]["max abs z vs exact"] < 4.5, rows["dpinfer"]
    if (n, epsilon) == (10, 0.1):  # noise sd 14 against a count of at most 10: naive fails
        assert rows["naive"]["cover 90%"] < lo, rows["naive"]
