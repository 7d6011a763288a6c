r"""The made-up persons behind a synthetic noisy measurement file: the geography of made-up
states and their true person histograms, under one of several truth scenarios.

:func:`draw_geography` lays out the blocks, :func:`draw_truth` draws every block's 2,016-cell
histogram (hhgq x votingage x hispanic x cenrace, :data:`~dpinfer.io.nmf.layout.SHAPE`), its
group-quarters facilities and housing units; :func:`dpinfer.io.nmf.synthetic.write_synthetic_nmf`
turns any such truth into the published files by one code path (the same exact noise, layout
and constraint rule whatever the scenario).

Geography
---------
Each state has ``n_counties`` counties (FIPS 001, 003, ...), each with ``tracts_per_county``
tracts, each with ``block_groups_per_tract`` block groups, each with ``blocks_per_block_group``
blocks; a size is an int or an inclusive range (low, high) drawn uniformly per parent. With
``aian_tracts`` > 0 the state also has an AIAN part (State geocode "1" + FIPS, partition
State=100+FIPS): one AIAN-area spine county (synthetic AIANNHCE 9001, tabulated in county 001)
with that many tracts (tabulation tracts 940100, 940200, ...). Geocodes:

* US ``""``; State ``"0" + FIPS`` (``"1" + FIPS`` for the AIAN part);
* County: the 8-character root AIAN flag + FIPS + ``"1" + "0" + county`` (``"0" + AIANNHCE``
  in the AIAN part) + ``"1"``, 9 characters like the fixture county ``"050100011"`` of the
  fact sheet;
* Tract, Block_Group: parent + the child's number (from 1), zero-padded to the number of
  digits of the largest fanout in the nation (widths are uniform across the nation);
* Block: block-group geocode + geocode16 = FIPS(2) county(3) tract(6) block-group digit(1)
  block(4), the block's 4 digits starting with the block-group digit.

So every geocode starts with its parent's, and the last 16 characters of a block geocode are
its tabulation geocode16 (spine tract and block-group numbers are not tabulation codes, as in
production). The urban county of the ``"urban"`` and ``"mixed"`` scenarios has its own sizes
(below).

The hierarchical truth (``truth="hierarchical"``, the default)
--------------------------------------------------------------
Race distributions over the 63 cenrace levels have base vectors (mostly white alone, then
black, asian, sor, a few 2-race codes, a thin floor of 1e-5 on every level; Hispanic persons
mostly white, sor or white-sor; the AIAN part mostly aian and white-aian). Per county
c: Hispanic share h_c ~ Beta(2, 25) (mean 7%; Beta(1, 30) in the AIAN part) and race
vectors r_c ~ Dirichlet(300 base); per tract r_t ~ Dirichlet(1000 r_c). Per block b:

* empty with probability 0.25, else household population n_b = max(1, round(L)),
  L ~ LogNormal(log(m) - 0.9^2/2, 0.9) (mean m = ``mean_block_population``);
* voting-age share v_b ~ Beta(46.2, 13.8) (mean 77%);
* each household person independently: 18+ with prob v_b, Hispanic with prob h_c, race from
  r_t (Hispanic or not), with the 2+-race levels' weight doubled for minors: the household
  cells are Multinomial(n_b, p) over (votingage, hispanic, cenrace);
* with probability 0.02 one group-quarters facility, of type 1..7 with probabilities
  (0.15, 0.03, 0.35, 0.05, 0.2, 0.02, 0.2), 1 + Poisson(f_k m) residents,
  f = (1.0, 0.3, 1.1, 0.4, 3.0, 1.5, 0.4), 18+ with probability
  (0.99, 0.1, 1, 0.8, 0.99, 0.98, 0.85) by type (none under 18 in nursing facilities, so
  ``nurse_nva_0`` holds), Hispanic and race as the block's households;
* housing units H_b = ceil(n_b / 2.4) + Poisson(0.1 ceil(n_b / 2.4)) if n_b > 0, else
  Poisson(0.3) (vacant units).

This is close to what ``dpinfer nmf``'s model (:func:`dpinfer.io.nmf.model.census_model`:
gamma rates split down the spine by Dirichlets, a concentration per level and cell) puts its
prior on, so coverage on it is coverage on (nearly) the model's own law. The other scenarios
keep this law and change one feature of it that the model's prior does not generate.
They change the state's ordinary counties only; the AIAN part keeps the hierarchical law.
Every scenario's extra draws come from a stream of their own, so for the same seed a
scenario that keeps the geography (all but ``"urban"`` and ``"mixed"``) perturbs the
hierarchical truth's own county and tract draws, and ``"large-facility"`` is the hierarchical
truth itself plus its facilities.

``"segregated"``: residential segregation
-----------------------------------------
Every ordinary county is segregated. For each group g of black alone, asian alone and
Hispanic, max(1, round(0.1 C)) of the state's C segregated counties host it (drawn
uniformly); in a host county's T tracts (randomly ordered) each hosted group takes the next
max(1, round(0.2 T)) tracts as its enclaves (a tract is the enclave of one group at most;
a group left without tracts has none there). In an enclave tract the group's share is
s ~ Uniform(0.4, 0.9): the tract's Hispanic share is s (group Hispanic), or s of the
non-Hispanic persons are of the group's race code (the others' weights scaled by (1 - s) /
(1 - their old total)); in every other tract of a segregated county the group's weight (the
county's h_c, or the race code's weight in both race vectors r_t, renormalised) is multiplied
by 0.02 (near zero, not zero).
Why the model does not produce it: its Dirichlet splits are independent between cells with
one concentration per level and cell, so a group's cells (e.g. its 4 cells voting age x
Hispanic of pl94-28, or the 14 Hispanic cells) are not placed in the same tracts, and a
small concentration gives a continuum of small and large shares in every county, not a
two-point pattern (40-90% in a handful of tracts, ~0 in all others, the rest of the tract
displaced accordingly, while the leaf sizes are shared by the cells).

``"structural-zeros"``: cells absent from whole areas
------------------------------------------------------
Every ordinary county has structural zeros: each of the six major race groups other than
white alone (black, aian, asian, nhopi, sor alone, two or more races: 57 cenrace codes) is
absent from the county with probability 0.5 (its cenrace codes get weight exactly 0 in every
tract's race vectors, which are renormalised: the restriction of the tract Dirichlet to the
codes left); each tract has no Hispanic persons with probability 0.5 (share exactly 0); each
block group is adults-only (a retirement community) with probability 0.2: every person of
its blocks, in households or group quarters, is 18+. So many (area, cell) pairs are exact
zeros however large the area. Why the model does not produce it: under its prior every
area's share of every cell is positive with probability 1 (a Dirichlet split), so a cell is
zero in a county of thousands of persons only by the Poisson chance of a tiny share, and
independently of the group's other cells; here whole groups of cells are absent together.

``"large-facility"``: one large group-quarters facility
-------------------------------------------------------
The hierarchical truth plus, in each state, one facility in a block drawn uniformly among
the blocks of the state's smallest county (household population): with probability 1/2 a
prison (correctional facility for adults, hhgq 1; 99.5% voting age, 22% Hispanic, non-Hispanic
persons 45% black, 45% white) or a college dormitory (hhgq 5; 97% voting age, 10% Hispanic,
non-Hispanic persons 50% white, 25% asian, 12% black), with Uniform{1500, ..., 3000}
residents (cells Multinomial with those shares and the Hispanic base races). The facility is
counted in the block's facilities, so the group-quarters bounds and ``nurse_nva_0`` hold as
for the others. Why the model does not produce it: the coarse cells (pl94-28) sum the group
quarters, and the model's leaf sizes are shared by the cells: one block group gets
thousands of voting-age persons of a mix unlike its county's (a large part of a small
county), with its minors' cells ordinary; the model's independent per-cell splits would have
to put an extreme share in the same block group for every adult cell at once.

``"urban"``: an urban county of many small blocks
-------------------------------------------------
County 001 of each state is urban, the others hierarchical: it has min(99, 2 x the largest
``tracts_per_county``) tracts, 4-6 block groups per tract, 10-20 blocks per block group and
a mean block population of 60 (not ``mean_block_population``); its Hispanic share
h_c ~ Beta(6, 14) (mean 30%), its non-Hispanic race vector ~ Dirichlet(300 urban base)
(49% white, 23% black, 12% asian, 4% sor, 10% two or more races) and its tracts'
r_t ~ Dirichlet(100 r_c). Why the model does not quite produce it: its counties are
exchangeable given their sizes, with one concentration per cell shared by all counties of
the state and all tracts of every county; the urban county's profile and the spread of its
many tracts come from another law than the rural counties', and its block groups are sums of
many small blocks. (Of the four this is the closest to the model's prior: a test of
heterogeneity between counties rather than of a shape the prior cannot reach.)

``"mixed"``: one county of each kind
------------------------------------
Counties 001, 003 and 005 of each state are urban, segregated (hosting all three groups) and
structural-zeros; the large facility goes into the smallest of the state's other counties,
which stay hierarchical (so ``n_counties`` must be at least 4).

The scenario's choices (each county's kind, the enclave tracts, the absent groups, the tracts
without Hispanic persons, the adults-only block groups, the large facilities) are returned in
:attr:`Truth.details` by geocode (``manifest.json``'s ``"scenario"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpinfer.io.nmf.layout import CENRACE_LABELS, LEVEL_LABELS, N_CELLS, SHAPE, axis_partition

__all__ = ["TRUTHS", "Truth", "draw_geography", "draw_truth"]

#: The truth scenarios (module docstring); the first is the default.
TRUTHS = ("hierarchical", "segregated", "structural-zeros", "large-facility", "urban", "mixed")
#: Counties 001, 003, 005 of each state under ``truth="mixed"``; the large facility needs one more.
MIXED_KINDS = ("urban", "segregated", "structural-zeros")

# --- the hierarchical law's constants (module docstring) --------------------------------------
P_EMPTY = 0.25
LOG_SD = 0.9
VOTING_AGE = (46.2, 13.8)
HISPANIC_SHARE = {False: (2.0, 25.0), True: (1.0, 30.0)}  # Beta, by "in the AIAN part"
COUNTY_CONCENTRATION, TRACT_CONCENTRATION = 300.0, 1000.0
P_FACILITY = 0.02
FACILITY_TYPES = np.array([0.15, 0.03, 0.35, 0.05, 0.2, 0.02, 0.2])
FACILITY_SIZE = np.array([1.0, 0.3, 1.1, 0.4, 3.0, 1.5, 0.4])
FACILITY_VOTING_AGE = np.array([0.99, 0.1, 1.0, 0.8, 0.99, 0.98, 0.85])
PERSONS_PER_UNIT, VACANT_RATE, VACANT_EMPTY = 2.4, 0.1, 0.3
AIANNHCE = "9001"
_FLOOR = 1e-5

# --- the scenarios' constants (module docstring) ----------------------------------------------
SEGREGATED_GROUPS = ("black", "asian", "hispanic")  # cenrace codes, or the Hispanic share
ENCLAVE_COUNTIES, ENCLAVE_TRACTS = 0.1, 0.2  # shares of the segregated counties / a host's tracts
ENCLAVE_SHARE = (0.4, 0.9)  # Uniform
SEGREGATION_RESIDUAL = 0.02
P_ABSENT_GROUP, P_NO_HISPANIC_TRACT, P_ADULTS_ONLY = 0.5, 0.5, 0.2
LARGE_FACILITY_RESIDENTS = (1500, 3000)  # Uniform, inclusive
URBAN_TRACTS = 2  # x the largest tracts_per_county, at most 99
URBAN_BLOCK_GROUPS, URBAN_BLOCKS = (4, 6), (10, 20)
URBAN_BLOCK_POPULATION = 60.0
URBAN_HISPANIC_SHARE = (6.0, 14.0)
URBAN_TRACT_CONCENTRATION = 100.0


def _race_base(weights: dict) -> np.ndarray:
    base = np.full(len(CENRACE_LABELS), _FLOOR)
    for label, w in weights.items():
        base[CENRACE_LABELS.index(label)] = w
    return base / base.sum()


RACE_BASE = {
    "non-hispanic": _race_base({"white": 0.88, "black": 0.04, "aian": 0.004, "asian": 0.025,
                                "nhopi": 0.001, "sor": 0.003, "white-black": 0.012,
                                "white-aian": 0.008, "white-asian": 0.006, "white-sor": 0.01,
                                "black-sor": 0.001, "white-black-aian": 0.001}),
    "hispanic": _race_base({"white": 0.25, "sor": 0.35, "white-sor": 0.25, "black": 0.02,
                            "aian": 0.02, "white-aian": 0.01, "black-sor": 0.005,
                            "aian-sor": 0.005, "white-black": 0.005}),
    "aian": _race_base({"aian": 0.7, "white": 0.18, "white-aian": 0.08, "black-aian": 0.01,
                        "aian-sor": 0.005, "black": 0.005}),
    "urban": _race_base({"white": 0.47, "black": 0.22, "aian": 0.008, "asian": 0.12,
                         "nhopi": 0.005, "sor": 0.04, "white-black": 0.035, "white-aian": 0.01,
                         "white-asian": 0.025, "white-sor": 0.015, "black-sor": 0.005,
                         "black-asian": 0.003, "asian-nhopi": 0.002, "white-black-aian": 0.003}),
}
_MULTI = np.array([label.count("-") > 0 for label in CENRACE_LABELS])

#: hhgq level -> (voting-age share, Hispanic share, non-Hispanic race vector) of the large facility
LARGE_FACILITIES = {
    1: (0.995, 0.22, _race_base({"white": 0.45, "black": 0.45, "aian": 0.03, "asian": 0.01,
                                 "sor": 0.01, "white-black": 0.03, "white-aian": 0.02})),
    5: (0.97, 0.10, _race_base({"white": 0.50, "asian": 0.25, "black": 0.12, "white-asian": 0.05,
                                "white-black": 0.03, "sor": 0.02, "white-sor": 0.015,
                                "nhopi": 0.01, "aian": 0.005})),
}


# --- geography -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tract:
    state: str          # FIPS
    aian: bool
    county: str         # tabulation county (3 digits)
    county_key: tuple   # (state, aian, spine county root)
    code: str           # tabulation tract (6 digits)
    block_groups: tuple  # blocks per block group
    kind: str           # the county's kind: a scenario of TRUTHS other than "mixed"


def _draw(rng, bounds) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _county_kinds(truth: str, n_counties: int) -> list[str]:
    """The kinds of a state's ``n_counties`` ordinary counties under scenario ``truth``, before
    the large facility is placed (it goes into the smallest "hierarchical" county)."""
    if truth in ("segregated", "structural-zeros"):
        return [truth] * n_counties
    if truth == "urban":
        return ["urban"] + ["hierarchical"] * (n_counties - 1)
    if truth == "mixed":
        return [*MIXED_KINDS, *["hierarchical"] * (n_counties - len(MIXED_KINDS))]
    return ["hierarchical"] * n_counties


def draw_geography(parameters: dict, rng) -> pd.DataFrame:
    """One row per block: the geocode of every level, its county key, tract key and the
    county's kind. ``parameters`` as checked by ``write_synthetic_nmf`` (sizes as
    [low, high], ``truth``)."""
    urban_sizes = {"tracts": [min(99, URBAN_TRACTS * parameters["tracts_per_county"][1])] * 2,
                   "block_groups_per_tract": URBAN_BLOCK_GROUPS, "blocks_per_block_group": URBAN_BLOCKS}

    def tract(state, aian, county, root, code, kind):
        sizes = urban_sizes if kind == "urban" else parameters
        block_groups = tuple(_draw(rng, sizes["blocks_per_block_group"])
                             for _ in range(_draw(rng, sizes["block_groups_per_tract"])))
        return _Tract(state, aian, county, (state, aian, root), code, block_groups, kind)

    tracts = []
    for state in parameters["state_fips"]:
        for c, kind in enumerate(_county_kinds(parameters["truth"], _draw(rng, parameters["n_counties"]))):
            county = f"{2 * c + 1:03d}"
            n_tracts = _draw(rng, urban_sizes["tracts"] if kind == "urban" else parameters["tracts_per_county"])
            tracts += [tract(state, False, county, "10" + county, f"{(t + 1) * 100:06d}", kind)
                       for t in range(n_tracts)]
        tracts += [tract(state, True, "001", "0" + AIANNHCE, f"{9401 + t:04d}00", "hierarchical")
                   for t in range(parameters["aian_tracts"])]
    per_county = pd.Series([t.county_key for t in tracts]).value_counts()
    tract_width = len(str(int(per_county.max())))
    bg_width = len(str(max(len(t.block_groups) for t in tracts)))
    rows, numbered = [], {}
    for t in tracts:
        key = t.county_key
        numbered[key] = numbered.get(key, 0) + 1
        state_geo = ("1" if t.aian else "0") + t.state
        county_geo = state_geo + key[2] + "1"
        tract_geo = county_geo + f"{numbered[key]:0{tract_width}d}"
        for g, n_blocks in enumerate(t.block_groups, start=1):
            bg_geo = tract_geo + f"{g:0{bg_width}d}"
            for k in range(n_blocks):
                geocode16 = t.state + t.county + t.code + str(g) + f"{g}{k:03d}"
                rows.append((state_geo, county_geo, tract_geo, bg_geo, bg_geo + geocode16,
                             t.aian, key, (key, t.code), t.kind))
    frame = pd.DataFrame(rows, columns=["State", "County", "Tract", "Block_Group", "Block", "aian",
                                        "county_key", "tract_key", "kind"])
    frame.insert(0, "US", "")
    return frame


# --- truth ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Truth:
    """A drawn truth: ``histograms`` (blocks, 2016) int64 in C order of
    :data:`~dpinfer.io.nmf.layout.SHAPE`, ``facilities`` (blocks, 8) int64 (facilities of each
    hhgq level, column 0 unused), ``units`` (blocks,) housing units, and ``details`` (JSON:
    the scenario's choices by geocode, module docstring)."""

    histograms: np.ndarray
    facilities: np.ndarray
    units: np.ndarray
    details: dict


def draw_truth(geo: pd.DataFrame, parameters: dict, rng, scenario_rng) -> Truth:
    """The truth of scenario ``parameters["truth"]`` on the blocks of ``geo``
    (:func:`draw_geography`): the hierarchical law's draws from ``rng`` in the order of the
    default scenario, the scenario's own draws from ``scenario_rng`` (module docstring)."""
    mean_population = parameters["mean_block_population"]
    kinds = dict(zip(geo["county_key"], geo["kind"]))
    counties = {}
    for key, kind in kinds.items():
        urban = kind == "urban"
        counties[key] = (
            rng.beta(*(URBAN_HISPANIC_SHARE if urban else HISPANIC_SHARE[key[1]])),
            {h: rng.dirichlet(COUNTY_CONCENTRATION
                              * RACE_BASE["urban" if urban and not h else _race_group(key[1], h)])
             for h in (False, True)})
    tracts = {}
    for key in dict.fromkeys(geo["tract_key"]):
        concentration = URBAN_TRACT_CONCENTRATION if kinds[key[0]] == "urban" else TRACT_CONCENTRATION
        tracts[key] = {h: rng.dirichlet(concentration * counties[key[0]][1][h]) for h in (False, True)}
    hispanic = {key: counties[key[0]][0] for key in tracts}

    names = _Names(geo)
    details = {"county_kinds": {names.county[key]: kind for key, kind in kinds.items()},
               "enclaves": _segregate(kinds, hispanic, tracts, scenario_rng, names)}
    adults_only, zeros = _remove_cells(geo, kinds, hispanic, tracts, scenario_rng, names)
    details.update(zeros)

    n = len(geo)
    hist = np.zeros((n, SHAPE[0], SHAPE[1] * SHAPE[2] * SHAPE[3]), dtype=np.int64)
    facilities = np.zeros((n, SHAPE[0]), dtype=np.int64)
    units = np.zeros(n, dtype=np.int64)
    block_mean = np.where(geo["kind"].to_numpy() == "urban", URBAN_BLOCK_POPULATION, mean_population)
    adult = geo["Block_Group"].isin(adults_only).to_numpy()
    for b, tract_key in enumerate(geo["tract_key"]):
        hispanic_share, races = hispanic[tract_key], tracts[tract_key]
        voting = 1.0 if adult[b] else rng.beta(*VOTING_AGE)
        mu = math.log(block_mean[b]) - LOG_SD**2 / 2
        population = 0 if rng.random() < P_EMPTY else max(1, round(rng.lognormal(mu, LOG_SD)))
        if population:
            hist[b, 0] = rng.multinomial(population, _cell_probabilities(voting, hispanic_share, races))
            base_units = math.ceil(population / PERSONS_PER_UNIT)
            units[b] = base_units + rng.poisson(VACANT_RATE * base_units)
        else:
            units[b] = rng.poisson(VACANT_EMPTY)
        if rng.random() < P_FACILITY:
            k = int(rng.choice(len(FACILITY_TYPES), p=FACILITY_TYPES))
            residents = 1 + rng.poisson(FACILITY_SIZE[k] * block_mean[b])
            probs = _cell_probabilities(1.0 if adult[b] else FACILITY_VOTING_AGE[k], hispanic_share, races)
            hist[b, k + 1] += rng.multinomial(residents, probs)
            facilities[b, k + 1] += 1
    details["large_facilities"] = (_add_large_facilities(geo, hist, facilities, scenario_rng, details)
                                   if parameters["truth"] in ("large-facility", "mixed") else [])
    return Truth(hist.reshape(n, N_CELLS), facilities, units, details)


def _race_group(aian: bool, hispanic: bool) -> str:
    return "hispanic" if hispanic else ("aian" if aian else "non-hispanic")


def _cell_probabilities(voting: float, hispanic_share: float, races: dict) -> np.ndarray:
    """P(votingage, hispanic, cenrace), C order: minors' 2+-race levels weighted x2."""
    p = np.empty((2, 2, len(CENRACE_LABELS)))
    for va, p_va in ((0, 1 - voting), (1, voting)):
        for h, p_h in ((0, 1 - hispanic_share), (1, hispanic_share)):
            r = races[bool(h)] * np.where(_MULTI & (va == 0), 2.0, 1.0)
            p[va, h] = p_va * p_h * r / r.sum()
    p = p.ravel()
    return p / p.sum()


class _Names:
    """Geocodes of the county keys, tract keys and the block groups of each tract key."""

    def __init__(self, geo: pd.DataFrame):
        self.county = dict(zip(geo["county_key"], geo["County"]))
        self.tract = dict(zip(geo["tract_key"], geo["Tract"]))
        self.block_groups = geo.groupby("tract_key", sort=False)["Block_Group"].unique().to_dict()


def _segregate(kinds: dict, hispanic: dict, tracts: dict, rng, names: _Names) -> dict:
    """Enclaves in the segregated counties (module docstring), in place on the tracts'
    Hispanic shares and race vectors; returns group -> enclave tract geocodes."""
    segregated = [key for key, kind in kinds.items() if kind == "segregated"]
    by_county = {}
    for key in tracts:
        by_county.setdefault(key[0], []).append(key)
    enclave_of = {}
    for state in dict.fromkeys(key[0] for key in segregated):
        counties = [key for key in segregated if key[0] == state]
        hosted = {key: [] for key in counties}
        for group in SEGREGATED_GROUPS:
            n_hosts = max(1, round(ENCLAVE_COUNTIES * len(counties)))
            for i in rng.choice(len(counties), size=n_hosts, replace=False):
                hosted[counties[i]].append(group)
        for county, groups in hosted.items():
            own = by_county[county]
            order = [own[i] for i in rng.permutation(len(own))]
            k = max(1, round(ENCLAVE_TRACTS * len(own)))
            for i, group in enumerate(sorted(groups, key=SEGREGATED_GROUPS.index)):
                enclave_of.update((tract, group) for tract in order[i * k:(i + 1) * k])
    for county in segregated:
        for tract in by_county[county]:
            group = enclave_of.get(tract)
            share = rng.uniform(*ENCLAVE_SHARE) if group else None
            hispanic[tract] = share if group == "hispanic" else hispanic[tract] * SEGREGATION_RESIDUAL
            races = {h: r.copy() for h, r in tracts[tract].items()}
            for race in SEGREGATED_GROUPS[:-1]:
                if race != group:
                    for r in races.values():
                        r[CENRACE_LABELS.index(race)] *= SEGREGATION_RESIDUAL
            races = {h: r / r.sum() for h, r in races.items()}
            if group in SEGREGATED_GROUPS[:-1]:
                code = CENRACE_LABELS.index(group)
                races[False] *= (1 - share) / (1 - races[False][code])
                races[False][code] = share
            tracts[tract] = races
    return {group: sorted(names.tract[t] for t, g in enclave_of.items() if g == group)
            for group in SEGREGATED_GROUPS}


def _remove_cells(geo: pd.DataFrame, kinds: dict, hispanic: dict, tracts: dict, rng,
                  names: _Names) -> tuple[set, dict]:
    """Structural zeros in the structural-zeros counties (module docstring), in place on the
    tracts' Hispanic shares and race vectors; returns (the adults-only block groups, their
    details by geocode)."""
    major = axis_partition("cenrace", "majorrace")
    absent, no_hispanic, adults_only = {}, [], []
    for county in (key for key, kind in kinds.items() if kind == "structural-zeros"):
        gone = [g for g in range(1, len(major.labels)) if rng.random() < P_ABSENT_GROUP]
        absent[names.county[county]] = [major.labels[g] for g in gone]
        keep = 1 - major.matrix[gone].sum(axis=0)
        for tract in (key for key in tracts if key[0] == county):
            tracts[tract] = {h: r * keep / (r * keep).sum() for h, r in tracts[tract].items()}
            if rng.random() < P_NO_HISPANIC_TRACT:
                hispanic[tract] = 0.0
                no_hispanic.append(names.tract[tract])
            adults_only += [bg for bg in names.block_groups[tract] if rng.random() < P_ADULTS_ONLY]
    return set(adults_only), {"absent_race_groups": absent, "hispanic_free_tracts": sorted(no_hispanic),
                              "adults_only_block_groups": sorted(adults_only)}


def _add_large_facilities(geo: pd.DataFrame, hist: np.ndarray, facilities: np.ndarray, rng,
                          details: dict) -> list[dict]:
    """One large facility per state in a block of its smallest "hierarchical" county (module
    docstring), added in place; returns where it is and whom it holds."""
    households = pd.Series(hist[:, 0].sum(axis=1)).groupby(geo["County"].to_numpy()).sum()
    added = []
    for state in dict.fromkeys(geo["State"][~geo["aian"]]):
        candidates = [c for c in dict.fromkeys(geo["County"][geo["State"] == state])
                      if details["county_kinds"][c] == "hierarchical"]
        county = min(candidates, key=lambda c: (households[c], c))
        blocks = np.flatnonzero(geo["County"].to_numpy() == county)
        b = int(blocks[rng.integers(len(blocks))])
        level = sorted(LARGE_FACILITIES)[rng.integers(len(LARGE_FACILITIES))]
        voting, hispanic_share, races = LARGE_FACILITIES[level]
        residents = int(rng.integers(LARGE_FACILITY_RESIDENTS[0], LARGE_FACILITY_RESIDENTS[1] + 1))
        cells = rng.multinomial(residents, _cell_probabilities(
            voting, hispanic_share, {False: races, True: RACE_BASE["hispanic"]}))
        hist[b, level] += cells
        facilities[b, level] += 1
        details["county_kinds"][county] = "large-facility"
        added.append({"block": geo["Block"].iloc[b], "hhgq": LEVEL_LABELS["hhgq"][level],
                      "residents": residents, "voting_age": int(cells.reshape(2, -1)[1].sum())})
    return added
