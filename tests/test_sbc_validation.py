"""Validation tier (`make validate`): the SBC study of validation/sbc_study.py with 200
replications per model; writes validation/results/sbc.md and prints it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import sbc_study  # noqa: E402

N_REPS = 200
SEED = 20260501


@pytest.mark.validation
def test_sbc_study():
    """Every dpinfer row passes (coverage in its exact binomial band, rank tests above the
    Bonferroni threshold; family-wise alpha = 1% per model); the naive analysis of model (a)
    under-covers every true count (90% coverage below the band)."""
    results = sbc_study.run_study(N_REPS, seed=SEED, progress_every=20)
    text = sbc_study.write_report(results, seed=SEED)
    print("\n" + text)
    for name, df in results.items():
        assert df[df.method == "dpinfer"]["passed"].all(), f"{name}\n{text}"
    a = next(df for name, df in results.items() if name.startswith("(a)"))
    counts = a[(a.method == "naive") & a.quantity.str.startswith("x[")]
    assert (counts["coverage90"] < counts["band90_lo"]).all(), text
