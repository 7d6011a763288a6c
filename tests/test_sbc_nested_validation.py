"""Validation tier (`make validate`): SBC of dp.sample on nested measurements
(validation/sbc_nested.py), 200 replications; writes validation/results/sbc_nested.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import sbc_nested  # noqa: E402


@pytest.mark.validation
def test_sbc_nested():
    """Every parameter and count passes: coverage in its exact binomial band and both rank
    uniformity tests above the Bonferroni threshold (family-wise alpha = 1%)."""
    results = sbc_nested.run_study(200, progress_every=20)
    text = sbc_nested.write_report(results)
    print("\n" + text)
    df = results["nested"]
    assert df["passed"].all(), text
