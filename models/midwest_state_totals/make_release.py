"""The curator's step: privatise two county tables of the 1990 midwest census with double
geometric noise conditioned on each state's total (epsilon = 0.192, reference note 001 §9.3),
and write the releases. Run from the repository root:

    .venv/bin/python models/midwest_state_totals/make_release.py

- release_population.csv: every county's total population (large counts);
- release_american_indian.csv: every county's American Indian population (small counts, many
  releases negative: non-negativity of the truth binds).
"""

from pathlib import Path

import numpy as np

import dpinfer as dp
from dpinfer.demo import load_midwest

HERE = Path(__file__).parent
EPSILON = 0.192
SEED = 20261121
TABLES = {"population": "release_population.csv", "american_indian": "release_american_indian.csv"}


def main() -> None:
    data = load_midwest()
    mechanism = dp.Conditioned(dp.DoubleGeometric(EPSILON), dp.Invariants.groups(data["state"]))
    rng = np.random.default_rng(SEED)
    for column, filename in TABLES.items():
        release = mechanism.release(data[column].to_numpy(), rng)
        out = data[["pid", "county", "state", "population"]].assign(
            county=data["county"].str.title(), release=release
        )
        if column == "population":
            out = out.drop(columns="population")  # the population itself is what is privatised
        out.to_csv(HERE / filename, index=False)
        print(f"{filename}: {len(out)} counties, {np.sum(release < 0)} negative releases")
    print(f"mechanism: {mechanism!r}")


if __name__ == "__main__":
    main()
