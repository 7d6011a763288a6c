"""The districts example of docs/site/census-nmf.md ("Districts and other unions of blocks"), run
and written to validation/results/areas_example.md: the page's synthetic state (2 counties,
2 tracts each, seed 1) read down to its blocks (``--leaves Block``), a plan of three districts
along tract lines but for block group 190010002001, whose first four blocks go to A and the rest
to B (B also crosses the county line), ``dpinfer nmf --areas`` with two events, and what it
wrote; its figure is copied to docs/census-nmf-areas.png.

Run: .venv/bin/python validation/areas_example.py   (~1-2 min on a 2-core VM)
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "areas_example.md"
FIGURE = Path(__file__).resolve().parents[1] / "docs" / "census-nmf-areas.png"  # the page's figure
DISTRICTS = {"19001000100": "A", "19001940100": "A", "19001000200": "B", "19003000100": "B", "19003000200": "C"}
CUT = "190010002001"  # the block group the plan cuts: its first CUT_BLOCKS blocks in A, the rest in B
CUT_BLOCKS = 4
EVENTS = ("share_vap_hisp > 0.1", "vap_hisp > vap_nh_black")
SHOWN = ("pop", "vap", "vap_hisp", "share_vap_hisp", "share_vap_nh_white")


def main() -> None:
    import pandas as pd

    import dpinfer as dp
    from dpinfer.io.nmf.reading import block_geocodes
    from dpinfer.io.nmf.store import tabulation_geoid

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        dp.write_synthetic_nmf(scratch / "nmf", state_fips="19", n_counties=2, tracts_per_county=2, seed=1)
        blocks = pd.Series(tabulation_geoid(block_geocodes(scratch / "nmf", 19)), name="GEOID20")
        plan = pd.DataFrame({"GEOID20": blocks, "district": blocks.str[:11].map(DISTRICTS)})
        plan.loc[plan.GEOID20.isin(sorted(blocks[blocks.str[:12] == CUT])[:CUT_BLOCKS]), "district"] = "A"
        plan.to_csv(scratch / "plan.csv", index=False)
        command = [str(Path(sys.executable).with_name("dpinfer")), "nmf", "nmf", "--state", "19", "--leaves", "Block", "--out", "nmf-19",
                   "--areas", "plan.csv"] + [a for e in EVENTS for a in ("--probability", e)]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=scratch, capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - start
        out = scratch / "nmf-19"
        store_mb = sum(f.stat().st_size for f in (out / "posterior.zarr").rglob("*") if f.is_file()) / 1e6
        header = [line[2:] for line in (out / "areas.csv").read_text().splitlines() if line.startswith("# ")]
        table = pd.read_csv(out / "areas.csv", comment="#")
        probs = pd.read_csv(out / "areas-probabilities.csv", comment="#")
        shutil.copyfile(out / "areas.png", FIGURE)
    lines = [line for line in (done.stderr + done.stdout).splitlines() if "sampling: " not in line]
    shown = table[table.quantity.isin(SHOWN)]
    buffer = io.StringIO()
    buffer.write("# The districts example of docs/site/census-nmf.md\n\nWritten by `validation/areas_example.py` "
                 f"(its docstring). Blocks per district: {plan.groupby('district').size().to_dict()}. The command "
                 f"took {seconds:.0f} s in all; the stored fit is {store_mb:.1f} MB.\n\n")
    buffer.write("The command's lines (progress lines left out):\n\n```\n" + "\n".join(lines) + "\n```\n\n")
    buffer.write("`areas.csv`'s comment lines:\n\n```\n" + "\n".join(header) + "\n```\n\n")
    buffer.write("| area | quantity | median | 90% interval | R-hat | bulk ESS | GLS | GLS sd |\n"
                 "|---|---|---:|---|---:|---:|---:|---:|\n")
    for row in shown.itertuples():
        buffer.write(f"| {row.area} | {row.quantity} | {row.median:.4g} | {row.lower:.4g} - {row.upper:.4g} | "
                     f"{row.r_hat:.4g} | {row.ess_bulk:.0f} | {row.gls:.4g} | {row.gls_sd:.4g} |\n")
    buffer.write("\n| area | event | probability | MC se | ESS |\n|---|---|---:|---:|---:|\n")
    for row in probs.itertuples():
        buffer.write(f"| {row.area} | {row.event} | {row.probability:.4g} | {row.mc_se:.4g} | {row.ess:.0f} |\n")
    RESULTS.write_text(buffer.getvalue())
    print(buffer.getvalue())


if __name__ == "__main__":
    main()
