r"""The published layout of the 2020 Census PL94 person noisy measurement files (NMF), as data.

Everything here is transcribed from ``docs/dev/census-nmf-layout.md`` (the fact sheet; its §
numbers are cited below), itself read from the Census Bureau's production code
(``DAS_2020_Redistricting_Production_Code``) and from the public readers of the files. Points
the fact sheet lists as *unverified* are marked so here.

Histogram (§4)
--------------
The person histogram has the axes (hhgq, votingage, hispanic, cenrace) of sizes (8, 2, 2, 63),
2,016 cells in C order (cenrace fastest). cenrace lists the 6 single races, then the 2-race, ...,
6-race combinations, each group in lexicographic order over (white, black, aian, asian, nhopi,
sor): the order of ``itertools.combinations``.

Axis specs and query matrices (§2)
----------------------------------
A row of the files names, per axis, a *spec*: ``"*"`` (summed over: one level), ``"detailed"``
or the axis's own name (every level kept), or a recode (levels grouped). :func:`axis_partition`
turns a spec into a 0/1 matrix P (query levels x axis levels), P[i, j] = 1 if axis level j lies
in query level i. A query's answer over a geounit's histogram x (2016 cells) is

    value = (P_hhgq kron P_votingage kron P_hispanic kron P_cenrace) x,

flattened in C order over (hhgq, votingage, hispanic, cenrace), which is what
``np.asarray(value).reshape(query_shape)`` of §2 expects (:func:`query_matrix`). Recodes:

* hhgq ``"hhinstlevels"``: household [0], institutional [1-4], non-institutional [5-7]; hhgq
  ``"gqNursingTotal"``: [3] (§4);
* votingage ``"nonvoting"``: [0] (§4);
* cenrace ``"majorrace"`` (7 levels: the 6 single races, then "two or more races") and
  ``"numraces"`` (6 levels: one race, ..., six races) are dpinfer's own recodes for coarsening a
  model; they are not known to occur in the files.

The spellings are inferred from reader code and synthetic fixtures (fact sheet, unverified 3).

Queries, constraints and budget (§2, §3, §5)
--------------------------------------------
:data:`PL94_QUERIES` maps the 11 strategy query names to their axis specs; in the files a
query's name carries the 4-character suffix ``"_dpq"`` (DPQuery) or ``"_con"`` (Constraint).
:data:`PL94_CONSTRAINTS` holds the four PL94 person constraints and :data:`US_CONSTRAINT_LEVELS`
where the US run creates them. :data:`PRODUCTION_BUDGET` is the US run's privacy-loss budget:
rho = 1/global_scale^2 with global_scale = 339/542, so rho = (542/339)^2 = 293764/114921
= 2.556226..., split over the geolevels in the shares 104/1440/447/687/1256/165 (of 4099) for
US/State/County/Tract/Block_Group/Block and over the queries of each level in the shares of
§5. A query gets rho_q = rho x level share x query share and discrete Gaussian noise with
sigma^2 = 1/rho_q (bounded neighbours: a substitution moves two cells, so l2 sensitivity
sqrt(2) and rho_q = 2/(2 sigma^2); §5).

Files (§1)
----------
A run root holds ``<Level>.parquet/{DPQuery,Constraint}/State=<int>/*.parquet`` for the levels
:data:`LEVELS`. The run-root names :data:`PRODUCTS` (``US_Person_PL_PROD``,
``PR_Person_PL_PROD``) come from a third-party reader and are **unverified** against the real
bucket (fact sheet, unverified 1).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse

__all__ = [
    "AXES", "SHAPE", "N_CELLS", "LEVEL_LABELS", "CENRACE_LABELS", "RACES", "LEVELS", "PRODUCTS",
    "DPQUERY_DIR", "CONSTRAINT_DIR", "DPQUERY_SUFFIX", "CONSTRAINT_SUFFIX", "SIGNS",
    "PL94_QUERIES", "PL94_CONSTRAINTS", "US_CONSTRAINT_LEVELS", "ConstraintSpec",
    "AxisPartition", "axis_partition", "known_specs", "query_matrix", "PrivacyBudget",
    "PRODUCTION_BUDGET", "GLOBAL_SCALE",
]

#: The person histogram's axes, in schema order (§4).
AXES = ("hhgq", "votingage", "hispanic", "cenrace")
#: The six races of cenrace, in the order that defines its 63 levels (§4).
RACES = ("white", "black", "aian", "asian", "nhopi", "sor")
#: cenrace's 63 levels: combinations of 1..6 races, each group lexicographic (§4).
CENRACE_LABELS = tuple("-".join(combo) for k in range(1, len(RACES) + 1)
                       for combo in itertools.combinations(RACES, k))
#: Level labels per axis (§4).
LEVEL_LABELS = {
    "hhgq": ("Household", "Correctional facilities for adults", "Juvenile facilities",
             "Nursing facilities/Skilled-nursing facilities", "Other institutional facilities",
             "College/University student housing", "Military quarters",
             "Other noninstitutional facilities"),
    "votingage": ("17 and under", "18 and over"),
    "hispanic": ("Not Hispanic or Latino", "Hispanic or Latino"),
    "cenrace": CENRACE_LABELS,
}
#: (8, 2, 2, 63)
SHAPE = tuple(len(LEVEL_LABELS[a]) for a in AXES)
#: 2016
N_CELLS = math.prod(SHAPE)

#: Geolevels of the US run, top down (§1). The PR run has no "US".
LEVELS = ("US", "State", "County", "Tract", "Block_Group", "Block")
#: Run-root directory names (§1; unverified 1).
PRODUCTS = {"US": "US_Person_PL_PROD", "PR": "PR_Person_PL_PROD"}
DPQUERY_DIR = "DPQuery"
CONSTRAINT_DIR = "Constraint"
DPQUERY_SUFFIX = "_dpq"
CONSTRAINT_SUFFIX = "_con"
#: Constraint signs as written in the files (§3).
SIGNS = ("=", "<=", ">=")

#: The 11 PL94 person strategy queries -> axis specs in :data:`AXES` order (§2, §4).
PL94_QUERIES = {
    "total": ("*", "*", "*", "*"),
    "hhgq": ("hhgq", "*", "*", "*"),
    "hhinstlevels": ("hhinstlevels", "*", "*", "*"),
    "votingage": ("*", "votingage", "*", "*"),
    "hispanic": ("*", "*", "hispanic", "*"),
    "cenrace": ("*", "*", "*", "cenrace"),
    "votingage * hispanic": ("*", "votingage", "hispanic", "*"),
    "votingage * cenrace": ("*", "votingage", "*", "cenrace"),
    "hispanic * cenrace": ("*", "*", "hispanic", "cenrace"),
    "votingage * hispanic * cenrace": ("*", "votingage", "hispanic", "cenrace"),
    "detailed": ("detailed", "detailed", "detailed", "detailed"),
}


@dataclass(frozen=True)
class ConstraintSpec:
    """One PL94 person constraint (§3): its query's axis specs, its sign and its meaning."""

    name: str
    axes: tuple
    sign: str
    meaning: str


#: The PL94 person constraints (§3; PROD ``Constraints_PL94.py``).
PL94_CONSTRAINTS = {
    "total": ConstraintSpec("total", PL94_QUERIES["total"], "=",
                            "total population of the geounit is invariant"),
    "hhgq_total_lb": ConstraintSpec("hhgq_total_lb", PL94_QUERIES["hhgq"], ">=",
                                    "lower bound on the persons in each GQ type"),
    "hhgq_total_ub": ConstraintSpec("hhgq_total_ub", PL94_QUERIES["hhgq"], "<=",
                                    "upper bound on the persons in each GQ type"),
    "nurse_nva_0": ConstraintSpec("nurse_nva_0", ("gqNursingTotal", "nonvoting", "*", "*"), "=",
                                  "structural zero: no minors in nursing facilities"),
}
#: Where the US run creates constraints (§3; PROD ``person_US.ini``, ``person_default.ini``).
#: Whether County, Tract and Block_Group carry them too is unverified (fact sheet, unverified 5).
US_CONSTRAINT_LEVELS = {"US": ("total",), "State": ("hhgq_total_lb", "hhgq_total_ub"),
                        "Block": ("hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0")}


# --- axis specs -----------------------------------------------------------------------------

def _groups_by_count(k_values) -> tuple:
    return tuple(tuple(i for i, label in enumerate(CENRACE_LABELS) if label.count("-") + 1 == k)
                 for k in k_values)


_SINGLE_RACES = tuple((i,) for i in range(len(RACES)))
#: axis -> recode name -> (labels, groups of axis levels)
_RECODES = {
    "hhgq": {
        "hhinstlevels": (("Household", "Institutional facility", "Non-institutional facility"),
                         ((0,), (1, 2, 3, 4), (5, 6, 7))),
        "gqNursingTotal": (("Nursing facilities/Skilled-nursing facilities",), ((3,),)),
    },
    "votingage": {"nonvoting": (("17 and under",), ((0,),))},
    "hispanic": {},
    "cenrace": {
        "majorrace": (tuple(f"{r} alone" for r in RACES) + ("two or more races",),
                      _SINGLE_RACES + (tuple(range(len(RACES), len(CENRACE_LABELS))),)),
        "numraces": (tuple(f"{k} race{'s' if k > 1 else ''}" for k in range(1, 7)),
                     _groups_by_count(range(1, 7))),
    },
}


@dataclass(frozen=True)
class AxisPartition:
    """A spec on one axis: ``labels`` of its query levels and the 0/1 ``matrix``
    (len(labels), axis size), matrix[i, j] = 1 if axis level j lies in query level i."""

    axis: str
    spec: str
    labels: tuple
    matrix: np.ndarray


def known_specs(axis: str) -> tuple:
    """The specs :func:`axis_partition` accepts on ``axis``."""
    _check_axis(axis)
    return ("*", "detailed", axis, *_RECODES[axis])


def _check_axis(axis) -> None:
    if not isinstance(axis, str) or axis not in AXES:
        raise ValueError(f"axis must be one of {AXES}, got {axis!r}")


@functools.cache
def axis_partition(axis: str, spec: str) -> AxisPartition:
    """The partition of ``axis``'s levels that ``spec`` names (module docstring): ``"*"`` one
    level (the sum), ``"detailed"`` or ``axis`` every level, or a recode of :func:`known_specs`.
    The matrix is read-only (the result is cached)."""
    _check_axis(axis)
    levels = LEVEL_LABELS[axis]
    if spec == "*":
        labels, groups = ("total",), (tuple(range(len(levels))),)
    elif spec in ("detailed", axis):
        labels, groups = levels, tuple((j,) for j in range(len(levels)))
    elif isinstance(spec, str) and spec in _RECODES[axis]:
        labels, groups = _RECODES[axis][spec]
    else:
        raise ValueError(f"unknown spec {spec!r} on axis {axis!r}; known specs: {known_specs(axis)}")
    matrix = np.zeros((len(groups), len(levels)), dtype=np.int8)
    for i, group in enumerate(groups):
        matrix[i, list(group)] = 1
    matrix.flags.writeable = False
    return AxisPartition(axis, spec, labels, matrix)


def query_matrix(axes) -> tuple[tuple, scipy.sparse.csr_array]:
    """(query_shape, Q) for a query given by its axis specs in :data:`AXES` order: Q is the
    (prod(query_shape), 2016) 0/1 csr matrix P_hhgq kron P_votingage kron P_hispanic kron
    P_cenrace, so Q @ x is the query's value in C order (module docstring). Q is a fresh copy."""
    shape, matrix = _query_matrix(tuple(axes))
    return shape, matrix.copy()


@functools.cache
def _query_matrix(axes: tuple) -> tuple[tuple, scipy.sparse.csr_array]:
    if len(axes) != len(AXES):
        raise ValueError(f"a query needs one spec per axis {AXES}, got {axes!r}")
    parts = [axis_partition(a, s).matrix for a, s in zip(AXES, axes)]
    matrix = scipy.sparse.csr_array(functools.reduce(
        lambda a, b: scipy.sparse.kron(a, b, format="csr"), map(scipy.sparse.csr_array, parts)))
    return tuple(p.shape[0] for p in parts), matrix.astype(np.int8)


# --- privacy-loss budget --------------------------------------------------------------------

#: ``global_scale`` of the production PL94 person run (§5, PROD ``person_default.ini``).
GLOBAL_SCALE = Fraction(339, 542)


@dataclass(frozen=True)
class PrivacyBudget:
    """A zCDP budget split over geolevels and queries: rho_q = rho x level_shares[level] x
    query_shares[level][query], and the query's discrete Gaussian noise has sigma^2 = 1/rho_q
    (bounded neighbours, §5). Shares are exact fractions summing to 1 (checked)."""

    rho: Fraction
    level_shares: dict
    query_shares: dict

    def __post_init__(self):
        if not (isinstance(self.rho, (int, Fraction)) and self.rho > 0):
            raise ValueError(f"rho must be an exact rational > 0 (int or Fraction), got {self.rho!r}")
        if set(self.level_shares) != set(self.query_shares) or not set(self.level_shares) <= set(LEVELS):
            raise ValueError(f"level_shares and query_shares must name the same levels among {LEVELS}, "
                             f"got {sorted(self.level_shares)} and {sorted(self.query_shares)}")
        _check_shares("level_shares", self.level_shares)
        for level, shares in self.query_shares.items():
            unknown = sorted(set(shares) - set(PL94_QUERIES))
            if unknown:
                raise ValueError(f"query_shares[{level!r}] names unknown queries {unknown}; "
                                 f"known: {list(PL94_QUERIES)}")
            _check_shares(f"query_shares[{level!r}]", shares)

    def query_rho(self, level: str, query: str) -> Fraction:
        """rho_q = rho x level share x query share (exact)."""
        if level not in self.query_shares or query not in self.query_shares[level]:
            raise ValueError(f"the budget has no query {query!r} at level {level!r}; it has "
                             f"{ {lv: list(q) for lv, q in self.query_shares.items()} }")
        return self.rho * self.level_shares[level] * self.query_shares[level][query]

    def variance(self, level: str, query: str) -> float:
        """sigma^2 = 1/rho_q, as the nearest float."""
        return float(1 / self.query_rho(level, query))


def _check_shares(name: str, shares: dict) -> None:
    values = list(shares.values())
    if not all(isinstance(v, Fraction) and v > 0 for v in values) or sum(values) != 1:
        raise ValueError(f"{name} must be positive Fractions summing to 1, got {shares!r}")


def _shares(names, numerators, denominators) -> dict:
    return {n: Fraction(a, b) for n, a, b in zip(names, numerators, denominators, strict=True)}


# Query order of the strategy lists in §5.
_US_ORDER = ("cenrace", "hispanic", "votingage", "hhinstlevels", "hhgq", "hispanic * cenrace",
             "votingage * cenrace", "votingage * hispanic", "votingage * hispanic * cenrace",
             "detailed")
_ORDER = ("total",) + _US_ORDER

#: The US run's budget (§5; PROD ``person_US.ini`` and ``strategies.py``
#: ``ProductionCandidate20210527US_mult8_add02_dsepJune3``).
PRODUCTION_BUDGET = PrivacyBudget(
    rho=1 / GLOBAL_SCALE**2,
    level_shares=_shares(LEVELS, (104, 1440, 447, 687, 1256, 165), (4099,) * 6),
    query_shares={
        "US": _shares(_US_ORDER, (52, 26, 26, 26, 26, 130, 130, 26, 26, 189),
                      (4097,) * 8 + (241, 241)),
        "State": _shares(_ORDER, (3773, 6, 6, 6, 6, 6, 12, 12, 6, 2, 230),
                         (4097,) * 9 + (241, 4097)),
        "County": _shares(_ORDER, (3126, 10, 10, 10, 10, 10, 28, 28, 10, 101, 754), (4097,) * 11),
        "Tract": _shares(_ORDER, (1567, 4, 5, 5, 5, 5, 1933, 10, 5, 67, 241),
                         (4102, 2051) + (4102,) * 5 + (2051, 4102, 4102, 2051)),
        "Block_Group": _shares(_ORDER, (1705, 3, 3, 3, 3, 3, 1055, 9, 3, 24, 1288), (4099,) * 11),
        "Block": _shares(_ORDER, (5, 9, 5, 5, 5, 5, 21, 21, 5, 71, 3945), (4097,) * 11),
    },
)
