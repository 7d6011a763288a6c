"""Validation tier (`make validate`): the SBC study of validation/sbc_record_sums.py (issue 39's
privatised regression at n = 10^2, 10^3, 10^4 and 10^6 records, the method records="auto"
chooses at each: data augmentation at 10^2, the law of the sum beyond), 100 replications per n; writes
validation/results/sbc_record_sums.md and prints it. About half an hour on 2 cores.
Smoke run by hand: `.venv/bin/python validation/sbc_record_sums.py --reps 20`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import sbc_record_sums  # noqa: E402


@pytest.mark.validation
def test_sbc_record_sums_study():
    """Every row passes (coverage in its exact binomial band, rank tests above the Bonferroni
    threshold; family-wise alpha = 1% per n), with data augmentation below CROSSOVER_RECORDS
    and the law of the sum from there (the report names the method)."""
    from dpinfer.inference.planning.record_sums import CROSSOVER_RECORDS

    results = sbc_record_sums.run_study(sbc_record_sums.N_FULL, seed=sbc_record_sums.SEED)
    text = sbc_record_sums.write_report(results, seed=sbc_record_sums.SEED)
    print("\n" + text)
    for n, df in results.items():
        method = df.attrs["engine"]["method"]
        assert method.startswith("law of the sum") == (n >= CROSSOVER_RECORDS), f"n = {n}: {method}"
        assert df["passed"].all(), f"n = {n}\n{text}"
