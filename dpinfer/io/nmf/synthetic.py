r"""A synthetic 2020 Census PL94 person noisy measurement file (NMF) with a known truth.

:func:`write_synthetic_nmf` draws person histograms for the blocks of a made-up state (or
several), aggregates them up the spine Block -> Block_Group -> Tract -> County -> State -> US,
adds exact discrete Gaussian noise with the production budget's variances, and writes the
result in the published layout (:mod:`dpinfer.io.nmf.layout`; fact sheet
``docs/dev/census-nmf-layout.md``), beside the truth. The nation is the states written, so with
one state US = that state.

    python -m dpinfer.io.nmf.synthetic --out models/synthetic_state_nmf --preset small

Geography and truth (fact sheet §6)
-----------------------------------
The made-up states' geography and their true person histograms are drawn by
:mod:`dpinfer.io.nmf.persons` (its docstring gives the geocodes and the generative laws):
``truth="hierarchical"`` (the default) is a hierarchical model of persons (county and tract
race Dirichlets, lognormal block sizes, a few group-quarters facilities); the other
scenarios change one feature of it that ``dpinfer nmf``'s model's prior does not generate,
so that the coverage of its intervals is not judged on a truth drawn from (something like)
the model itself:

* ``"segregated"``: black alone, asian alone and Hispanic persons at 40-90% in a few tracts
  of a few counties, near 0 in the counties' other tracts;
* ``"structural-zeros"``: race groups absent from whole counties, tracts without Hispanic
  persons, adults-only block groups: exact zeros in many (area, cell) pairs;
* ``"large-facility"``: a prison or college dormitory of 1,500-3,000 persons in one block of
  each state's smallest county, almost all voting age, its mix unlike the county's;
* ``"urban"``: county 001 urban, with many tracts, 4-6 block groups per tract, 10-20 blocks of
  ~60 persons per block group and a diverse population, beside rural counties;
* ``"mixed"``: one county of each kind (urban, segregated, structural-zeros, large
  facility) in each state, the others hierarchical.

Whatever the scenario, the files are written from the truth by the one code path below.

Measurements and constraints
----------------------------
For every level written and every query of ``budget`` at that level, a row per geounit:
value = Q x + e, x the geounit's histogram (sum of its blocks), Q the query's matrix
(:func:`~dpinfer.io.nmf.layout.query_matrix`), e exact discrete Gaussian noise with
sigma^2 = ``budget.variance(level, query)`` = 1/rho_q
(:meth:`DiscreteGaussian.sample_noise <dpinfer.mechanisms.DiscreteGaussian.sample_noise>`,
Canonne-Kamath-Steinke Algorithm 3 in integer arithmetic; 2.5 to 3.5 microseconds a draw, so a
geounit's 2603 noisy cells cost about 10 ms). The ``variance`` column holds sigma^2.

Constraints at the levels of :data:`~dpinfer.io.nmf.layout.US_CONSTRAINT_LEVELS` (variance
0.0), by a synthetic rule that the truth satisfies: ``total_con`` (=) at US, the true total;
at Block ``hhgq_total_lb_con`` (>=) = (0, number of facilities of each GQ type) and
``hhgq_total_ub_con`` (<=) = 99999 x (H_b, facilities of each type) (99999 times the units, as
the production residence-hall bound; a type without a facility is a structural zero), and
``nurse_nva_0_con`` (=) 0; at State the sums of the blocks' bounds (as production sums node
constraints).

Files
-----
``<root>/US_Person_PL_PROD/<Level>.parquet/{DPQuery,Constraint}/State=<int>/part-0.parquet``,
State = int(geocode[:3]) (FIPS, or 100 + FIPS for the AIAN part); the US rows (geocode "")
go to ``State=0``, a choice: the fact sheet does not say how the US level is partitioned.
Columns: geocode, query_name (name + ``_dpq`` / ``_con``), hhgq, votingage, hispanic, cenrace
(axis specs), query_shape (list<int64>, one entry per axis), value (list<int64>, C order),
variance (float64); Constraint files also sign ("=", "<=", ">="). DPQuery files have no sign
column (as some published partitions). ``<root>/truth.parquet``: block geocode, cell
(0..2015, C order of the 2016 histogram cells), count (nonzero counts only).
``<root>/manifest.json`` and ``<root>/README.md``: the parameters and geounit counts.

Cost
----
The exact noise of a (level, query) is drawn at once, in Python integers, so the writer's
peak memory grows with the geounits of the largest level written: about 1 MB per block for
the Block level's 2,016-cell ``detailed`` query. Measured on a 2-core VM (peak resident
memory of the writing process): the "iowa" preset's shape with 10 counties, 1.05 GB and 7 s
with the hierarchical truth (649 blocks), 3.35 GB and 26 s with ``truth="urban"`` or
``"mixed"`` (2,765 blocks: the urban county's), 0.79 GB for ``"mixed"`` without the Block
level; with Iowa's 99 counties (~5,400 blocks) 6.18 GB. A fit at block-group leaves does not
use the Block level: ``levels=LEVELS[:-1]`` skips it.

Randomness: ``numpy.random.SeedSequence(seed)`` spawns one stream for the truth, one per level
for the noise and one for the scenario's own draws, so the truth does not depend on ``levels``
and the default scenario writes the files it wrote before there were others.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpinfer.io.nmf.layout import (
    AXES,
    CONSTRAINT_DIR,
    CONSTRAINT_SUFFIX,
    DPQUERY_DIR,
    DPQUERY_SUFFIX,
    LEVELS,
    N_CELLS,
    PL94_CONSTRAINTS,
    PL94_QUERIES,
    PRODUCTION_BUDGET,
    PRODUCTS,
    SHAPE,
    US_CONSTRAINT_LEVELS,
    PrivacyBudget,
    query_matrix,
)
from dpinfer.io.nmf.persons import MIXED_KINDS, TRUTHS, draw_geography, draw_truth
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian

__all__ = ["PRESETS", "write_synthetic_nmf"]

#: Named parameter sets; "small" is the default of :func:`write_synthetic_nmf` and the
#: instance shipped in ``models/synthetic_state_nmf``; "iowa" has Iowa's 99 counties and
#: about its tracts (~900) and block groups (~2700), with few blocks.
PRESETS = {
    "small": dict(state_fips="19", n_counties=3, tracts_per_county=3, block_groups_per_tract=(2, 3),
                  blocks_per_block_group=(4, 8), aian_tracts=1, mean_block_population=40.0,
                  seed=2020),
    "iowa": dict(state_fips="19", n_counties=99, tracts_per_county=(4, 14), block_groups_per_tract=3,
                 blocks_per_block_group=(1, 3), aian_tracts=1, mean_block_population=760.0,
                 seed=2020),
}

UB_MULTIPLE = 99999


# --- arguments ---------------------------------------------------------------------------------

def _size_range(name: str, value, high_limit: int) -> list[int]:
    """An int n or an inclusive (low, high) as [low, high], 1 <= low <= high <= high_limit."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)):
        raise TypeError(f"{name} must be an int or a (low, high) pair of ints, got {value!r}")
    low, high = int(value[0]), int(value[1])
    if not 1 <= low <= high <= high_limit:
        raise ValueError(f"{name} must satisfy 1 <= low <= high <= {high_limit}, got {value!r}")
    return [low, high]


def _states(state_fips) -> list[str]:
    states = [state_fips] if isinstance(state_fips, str) else list(state_fips)
    for s in states:
        if not (isinstance(s, str) and len(s) == 2 and s.isdigit() and s != "00"):
            raise ValueError(f"state_fips must be 2-digit FIPS strings ('01'..'99'), got {s!r}")
        if s == "72":
            raise ValueError("state_fips '72' (Puerto Rico) is a separate run (PR_Person_PL_PROD) "
                             "with its own budget, which this generator does not model")
    if not states or len(set(states)) != len(states):
        raise ValueError(f"state_fips must name one or more distinct states, got {state_fips!r}")
    return states


def _levels(levels) -> list[str]:
    chosen = [levels] if isinstance(levels, str) else list(levels)
    unknown = [lv for lv in chosen if lv not in LEVELS]
    if unknown or not chosen:
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {levels!r}")
    return [lv for lv in LEVELS if lv in chosen]


def _parameters(state_fips, n_counties, tracts_per_county, block_groups_per_tract,
                blocks_per_block_group, aian_tracts, mean_block_population, seed, levels,
                truth="hierarchical") -> dict:
    """The checked arguments of :func:`write_synthetic_nmf`, as JSON values (ranges as
    [low, high])."""
    if not isinstance(truth, str) or truth not in TRUTHS:
        raise ValueError(f"truth must be one of {TRUTHS}, got {truth!r}")
    if isinstance(aian_tracts, bool) or not isinstance(aian_tracts, numbers.Integral) \
            or not 0 <= aian_tracts <= 99:
        raise ValueError(f"aian_tracts must be an int in 0..99, got {aian_tracts!r}")
    if isinstance(mean_block_population, bool) or not isinstance(mean_block_population, numbers.Real) \
            or not (math.isfinite(mean_block_population) and mean_block_population > 0):
        raise ValueError(f"mean_block_population must be a finite number > 0, got {mean_block_population!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    counties = _size_range("n_counties", n_counties, 500)
    if truth == "mixed" and counties[0] <= len(MIXED_KINDS):
        raise ValueError(f"truth='mixed' needs n_counties >= {len(MIXED_KINDS) + 1} in every state "
                         f"(one county of each kind: {', '.join(MIXED_KINDS)}, large-facility), "
                         f"got {n_counties!r}")
    return {"state_fips": _states(state_fips),
            "n_counties": counties,
            "tracts_per_county": _size_range("tracts_per_county", tracts_per_county, 99),
            "block_groups_per_tract": _size_range("block_groups_per_tract", block_groups_per_tract, 9),
            "blocks_per_block_group": _size_range("blocks_per_block_group", blocks_per_block_group, 1000),
            "aian_tracts": int(aian_tracts), "mean_block_population": float(mean_block_population),
            "seed": int(seed), "truth": truth, "levels": _levels(levels)}


# --- writing -------------------------------------------------------------------------------

def _list_array(matrix: np.ndarray) -> pa.ListArray:
    """Rows of a 2-D int64 array as a list<int64> column."""
    n, k = matrix.shape
    offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32) if n * k < 2**31
                       else np.arange(0, (n + 1) * k, k, dtype=np.int64))
    values = pa.array(np.ascontiguousarray(matrix, dtype=np.int64).ravel())
    if offsets.type == pa.int64():
        return pa.LargeListArray.from_arrays(offsets, values).cast(pa.list_(pa.int64()))
    return pa.ListArray.from_arrays(offsets, values)


def _rows_table(parts: list, with_sign: bool) -> pa.Table:
    """One table from parts (name, axes, shape, geocodes, values (n, k), variance, sign)."""
    columns = {"geocode": [], "query_name": [], **{a: [] for a in AXES}, "query_shape": [],
               "value": [], "variance": [], "sign": []}
    for name, axes, shape, geocodes, values, variance, sign in parts:
        n = len(geocodes)
        columns["geocode"].append(pa.array(geocodes, pa.string()))
        columns["query_name"].append(pa.array([name] * n, pa.string()))
        for a, spec in zip(AXES, axes):
            columns[a].append(pa.array([spec] * n, pa.string()))
        columns["query_shape"].append(_list_array(np.tile(np.array(shape, dtype=np.int64), (n, 1))))
        columns["value"].append(_list_array(values))
        columns["variance"].append(pa.array(np.full(n, variance, dtype=np.float64)))
        columns["sign"].append(pa.array([sign] * n, pa.string()))
    if not with_sign:
        del columns["sign"]
    return pa.table({c: pa.concat_arrays(arrays) for c, arrays in columns.items()})


def _write_partitions(directory: Path, parts: list, with_sign: bool) -> None:
    """Rows split by State partition = int(geocode[:3]) (0 for the US geocode "")."""
    table = _rows_table(parts, with_sign)
    geocodes = table.column("geocode").to_pylist()
    partition = np.array([int(g[:3]) if g else 0 for g in geocodes])
    for value in sorted(set(partition.tolist())):
        path = directory / f"State={value}" / "part-0.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.filter(pa.array(partition == value)), path, compression="zstd")


def _constraint_parts(level: str, geocodes, hist, facilities, units) -> list:
    """Constraint rows (module docstring) for histograms ``hist`` (n, 2016), facilities
    (n, 8) and housing units (n,) of the level's geounits."""
    n = len(geocodes)
    parts = []
    for name in US_CONSTRAINT_LEVELS.get(level, ()):
        spec = PL94_CONSTRAINTS[name]
        shape, matrix = query_matrix(spec.axes)
        if name == "total":
            values = (matrix @ hist.T).T
        elif name == "hhgq_total_lb":
            values = facilities.copy()
        elif name == "hhgq_total_ub":
            values = UB_MULTIPLE * np.column_stack([units, facilities[:, 1:]])
        else:  # nurse_nva_0
            values = np.zeros((n, 1), dtype=np.int64)
        parts.append((name + CONSTRAINT_SUFFIX, spec.axes, shape, geocodes, values, 0.0, spec.sign))
    return parts


def write_synthetic_nmf(
    root,
    *,
    state_fips="19",
    n_counties=3,
    tracts_per_county=3,
    block_groups_per_tract=(2, 3),
    blocks_per_block_group=(4, 8),
    aian_tracts: int = 1,
    mean_block_population: float = 40.0,
    seed: int = 2020,
    truth: str = "hierarchical",
    budget: PrivacyBudget = PRODUCTION_BUDGET,
    levels=LEVELS,
) -> dict:
    """Write a synthetic PL94 person NMF with its truth under ``root`` (module docstring).

    Parameters
    ----------
    root : path
        A directory; it may exist, but must not hold a previous instance.
    state_fips : str or sequence of str
        2-digit FIPS codes of the states (the nation); not "72" (Puerto Rico is another run).
    n_counties, tracts_per_county, block_groups_per_tract, blocks_per_block_group : int or (low, high)
        Sizes, drawn uniformly in the inclusive range per parent (block groups per tract <= 9,
        the tabulation block-group digit; blocks per block group <= 1000).
    aian_tracts : int
        Tracts in each state's AIAN part (0: no AIAN part).
    mean_block_population : float
        Mean household population of a populated block (outside the urban county).
    seed : int
    truth : str
        The truth scenario, one of :data:`~dpinfer.io.nmf.persons.TRUTHS`: "hierarchical"
        (the default), "segregated", "structural-zeros", "large-facility", "urban" or "mixed"
        (needs ``n_counties`` >= 4); their laws are in :mod:`dpinfer.io.nmf.persons`.
    budget : PrivacyBudget
        The production budget by default; it must cover every level written.
    levels : sequence of str
        The levels to write (all by default); the truth is always written.

    Returns
    -------
    dict
        The manifest written to ``root/manifest.json``: parameters, geounits per level,
        population, and the scenario's choices by geocode (``"scenario"``: each county's kind,
        enclave tracts, absent race groups, tracts without Hispanic persons, adults-only block
        groups, large facilities).
    """
    parameters = _parameters(state_fips, n_counties, tracts_per_county, block_groups_per_tract,
                             blocks_per_block_group, aian_tracts, mean_block_population, seed, levels,
                             truth)
    if not isinstance(budget, PrivacyBudget):
        raise TypeError(f"budget must be a PrivacyBudget, got {type(budget).__name__}")
    levels = parameters["levels"]
    missing = [lv for lv in levels if lv not in budget.query_shares]
    if missing:
        raise ValueError(f"budget has no shares for levels {missing}; it covers {list(budget.query_shares)}")
    root = Path(root)
    product = root / PRODUCTS["US"]
    for existing in (product, root / "truth.parquet", root / "manifest.json"):
        if existing.exists():
            raise FileExistsError(f"{existing} exists: write_synthetic_nmf writes a fresh instance "
                                  "(remove it first)")

    # children 0..len(LEVELS) are the truth's and the levels' whatever the number spawned
    streams = np.random.SeedSequence(parameters["seed"]).spawn(2 + len(LEVELS))
    truth_rng = np.random.default_rng(streams[0])
    geo = draw_geography(parameters, truth_rng)
    drawn = draw_truth(geo, parameters, truth_rng, np.random.default_rng(streams[-1]))
    hist, facilities, units = drawn.histograms, drawn.facilities, drawn.units

    counts = {}
    for level in levels:
        codes, index = np.unique(geo[level].to_numpy(dtype=str), return_inverse=True)
        counts[level] = len(codes)
        aggregate = np.zeros((len(codes), N_CELLS), dtype=np.int64)
        np.add.at(aggregate, index, hist)
        rng = np.random.default_rng(streams[1 + LEVELS.index(level)])
        parts = []
        for query, variance in ((q, budget.variance(level, q)) for q in budget.query_shares[level]):
            axes = PL94_QUERIES[query]
            shape, matrix = query_matrix(axes)
            exact = (matrix @ aggregate.T).T
            mechanism = DiscreteGaussian(math.sqrt(variance), sensitivity=1, neighbour="substitution")
            noisy = exact + mechanism.sample_noise(exact.shape, rng)
            parts.append((query + DPQUERY_SUFFIX, axes, shape, codes.tolist(), noisy, variance, None))
        level_dir = product / f"{level}.parquet"
        _write_partitions(level_dir / DPQUERY_DIR, parts, with_sign=False)
        if level in US_CONSTRAINT_LEVELS:
            agg_fac = np.zeros((len(codes), SHAPE[0]), dtype=np.int64)
            np.add.at(agg_fac, index, facilities)
            agg_units = np.bincount(index, weights=units, minlength=len(codes)).astype(np.int64)
            _write_partitions(level_dir / CONSTRAINT_DIR,
                              _constraint_parts(level, codes.tolist(), aggregate, agg_fac, agg_units),
                              with_sign=True)

    block, cell = np.nonzero(hist)
    truth = pa.table({"geocode": pa.array(geo["Block"].to_numpy(dtype=str)[block], pa.string()),
                      "cell": pa.array(cell.astype(np.int16)),
                      "count": pa.array(hist[block, cell].astype(np.int64))})
    pq.write_table(truth, root / "truth.parquet", compression="zstd")

    manifest = {
        "generator": "dpinfer.io.nmf.synthetic.write_synthetic_nmf",
        "parameters": parameters,
        "budget": {"rho": str(budget.rho),
                   "level_shares": {k: str(v) for k, v in budget.level_shares.items()},
                   "production": budget == PRODUCTION_BUDGET},
        "product": PRODUCTS["US"],
        "geounits": {level: int(geo[level].nunique()) for level in LEVELS},
        "written_geounits": counts,
        "population": int(hist.sum()),
        "group_quarters_population": int(hist.reshape(-1, SHAPE[0], N_CELLS // SHAPE[0])[:, 1:].sum()),
        "empty_blocks": int((hist.sum(axis=1) == 0).sum()),
        "scenario": drawn.details,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (root / "README.md").write_text(_readme(manifest))
    return manifest


def _preset_of(parameters: dict) -> str | None:
    """The name of the preset with these (normalised) parameters and every level, the truth
    aside, if any."""
    for name, preset in PRESETS.items():
        if {**_parameters(**preset, levels=LEVELS), "truth": parameters["truth"]} == parameters:
            return name
    return None


def _readme(manifest: dict) -> str:
    p = manifest["parameters"]
    preset = _preset_of(p)
    truth = "" if p["truth"] == "hierarchical" else f" --truth {p['truth']}"
    command = (f"python -m dpinfer.io.nmf.synthetic --out <this directory> --preset {preset}{truth}"
               if preset else f"dpinfer.io.nmf.synthetic.write_synthetic_nmf(root, **{p!r})")
    geounits = ", ".join(f"{lv} {n}" for lv, n in manifest["written_geounits"].items())
    return f"""# Synthetic 2020 Census PL94 person noisy measurement file

Made-up data in the layout of the published noisy measurement files (NMF), with its truth.
Not Census data. The generator and the file layout are described in
`dpinfer/io/nmf/synthetic.py`, the geography and the truth in `dpinfer/io/nmf/persons.py`;
read the files with `dpinfer.read_nmf(<this directory>, "{p['state_fips'][0]}")`.

- `{manifest['product']}/<Level>.parquet/DPQuery/State=<int>/part-0.parquet`: noisy
  measurements, discrete Gaussian noise with the production budget's variances.
- `{manifest['product']}/<Level>.parquet/Constraint/State=<int>/part-0.parquet`: constraints.
- `truth.parquet`: the true block histograms (block geocode, cell 0..2015, count; nonzero only).
- `manifest.json`: the parameters below and the geounit counts.

Truth scenario "{p['truth']}" (its choices by geocode are in `manifest.json`, "scenario").
States {", ".join(p['state_fips'])}; geounits: {geounits}; population {manifest['population']}
(in group quarters {manifest['group_quarters_population']}); empty blocks {manifest['empty_blocks']}.

Regenerate (after removing the directory's contents):

    {command}
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m dpinfer.io.nmf.synthetic",
        description="Write a synthetic 2020 Census PL94 person noisy measurement file.")
    parser.add_argument("--out", required=True, help="output directory (must not hold an instance)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--seed", type=int, help="override the preset's seed")
    parser.add_argument("--truth", choices=TRUTHS, default=TRUTHS[0],
                        help="the truth scenario (dpinfer/io/nmf/persons.py; default %(default)s)")
    parser.add_argument("--levels", help=f"comma-separated levels to write (default all: {','.join(LEVELS)})")
    args = parser.parse_args(argv)
    kwargs = dict(PRESETS[args.preset], truth=args.truth)
    if args.seed is not None:
        kwargs["seed"] = args.seed
    if args.levels:
        kwargs["levels"] = args.levels.split(",")
    start = time.perf_counter()
    manifest = write_synthetic_nmf(args.out, **kwargs)
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    print(f"wrote {args.out}: geounits {manifest['written_geounits']}, population "
          f"{manifest['population']}, {size / 1e6:.2f} MB in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
