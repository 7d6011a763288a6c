r"""Read the 2020 Census PL94 person noisy measurement files (NMF) of some states.

:func:`read_nmf` reads ``<root>/<product>/<Level>.parquet/{DPQuery,Constraint}/State=<int>/``
(layout: :mod:`dpinfer.io.nmf.layout`; fact sheet ``docs/dev/census-nmf-layout.md``) for the
requested states only: the partitions ``State=<FIPS>`` and ``State=<100 + FIPS>`` (the state's
AIAN part) of every level, and the whole of the US level (one geounit). Other states'
partitions are listed (their directory names) but never opened.

What is read
------------
Every ``*.parquet`` file under a chosen partition (recursively, so ``County=`` subpartitions
are read too, and a partition may hold several ``part-*`` files as Spark writes them). Spark
and Hive bookkeeping is skipped without a word: names starting with ``_`` or ``.``
(``_SUCCESS``, ``.part-*.crc``, ``_temporary/``) and ``*.crc``; any other file that is not
``*.parquet`` (a ``part-00000.csv``) is not read and warned of (:class:`NMFStrayFileWarning`),
as is a State partition below US that is neither a state (1..99) nor an AIAN part (101..199).
Each file is read on its own, so partitions written by different jobs may differ in integer
widths and float precision (``value`` list<int32> or list<int64>, ``variance`` float32 or
float64, ...): integer lists become int64 (a float list is accepted only with whole values),
``variance`` float64. DPQuery files may lack ``sign`` (if present it must be null).
``query_name`` loses its 4-character suffix, which must be ``_dpq`` (DPQuery) or ``_con``
(Constraint). Columns used: geocode, query_name, hhgq, votingage, hispanic, cenrace,
query_shape, value, and variance (DPQuery) or sign (Constraint); others (``plb``, ``State``,
...) are ignored. A query name that is not one of the layout's PL94 person queries or
constraints is read as its axis specs say and warned of, naming the file and row
(:class:`NMFUnknownQueryWarning`).

Missing constraints are warned of (:class:`NMFMissingConstraintsWarning`), naming the
directory: a level's ``Constraint`` dataset that is absent while its ``DPQuery`` one is there,
at a level where the layout puts constraints (US, State, Block:
:data:`~dpinfer.io.nmf.layout.US_CONSTRAINT_LEVELS`; County, Tract and Block_Group may carry
none), and a ``Constraint`` dataset that lacks a partition its ``DPQuery`` dataset has.

Checks (each a :class:`NMFFileError` naming the file, the column and the row): missing columns,
nulls, unknown axis specs, ``query_shape`` not one entry per axis or not the shape the specs
give, ``value`` not prod(query_shape) long, a variance that is not finite and > 0, a geocode
not in its partition (State = int(geocode[:3]); "" at US) or of another width than its level's,
a geocode whose prefix of the parent level's width is not a geocode of the next level read
above (geounits are taken from DPQuery and Constraint together, since DPQuery omits bypassed
geounits), a known query name with other axis specs than the layout's, the same (query,
geocode) twice, a partition read that holds no parquet file or only files without rows (the
error names the partition's directory), and infeasible constraints (below). Nothing is
dropped or clipped.

The nation
----------
The US level's rows are of the nation: every state of the product run under it. The reader
records which states the files hold (``file_states``: the State=FIPS and State=100+FIPS
partition directories of the levels read below US, listed but not opened; the US level's own
partition, State=0 in dpinfer's synthetic files, is not a state), and
:attr:`NoisyMeasurementFiles.other_states` those not read. When every state in the files is
read, the nation is the states read. Otherwise the nation is the states read plus a remainder
R >= 0 whose counts nothing read describes: a US measurement says y_US = S + R + e, S the
states' sums, and a US constraint lower <= S + R <= upper. Given a vague prior on R, the
measurement's likelihood for S is sum_{R >= 0} p_e(y_US - S - R) = P(e <= y_US - S), which is
~1 unless S comes within a few noise sds of y_US, and the constraint says only S <= upper:
bounds on the states read by the whole nation, which their counts never approach when the
states not read hold people. So the US rows carry (essentially) no information about the
states read; :func:`~dpinfer.io.nmf.table.census_table` sets them aside (and says so in its
``usage``), and the check below gives the nation its remainder.

Constraints
-----------
A constraint row says, for each cell c of its query at geounit g, (Q x_g)_c {=, <=, >=} v_c,
x_g the geounit's histogram (2016 cells). :meth:`NoisyMeasurementFiles.constraints` merges the
rows of a level into intervals lower <= M x_g <= upper, one per (geounit, query cell), where
queries with the same matrix (``hhgq_total_lb`` and ``hhgq_total_ub``) share their cells;
lower starts at 0 (counts are >= 0) and upper at +inf. Infeasible at one geounit: an equality
v < 0, or lower > upper (a lower bound above an upper bound, an equality outside its bounds,
two different equalities), reported with the two rows. A cell with upper = 0 (``=`` 0 as
``nurse_nva_0``, or ``<=`` 0) is a *structural zero*: every histogram cell in its mask is 0 at
that geounit and every geounit below it (:meth:`NoisyMeasurementFiles.structural_zeros`).

Constraints across levels
-------------------------
The rows of all levels read must also hold together: for histograms x_l >= 0 on the geounits
l of the lowest level read, each geounit's histogram the sum of those under it (plus the
remainder R >= 0 at US when states are not read), every interval of every level. A state's
total below the sum of its blocks' lower bounds, a nation's total that its states' totals do
not add up to, or a US total imposed on one state all break this, whatever the rows of each
geounit say alone. Checked exactly for the continuous relaxation, as a linear programme
(:func:`dpinfer.lattice.infeasible.conflicting_rows`, HiGHS): the variables are the counts of each
lowest-level geounit in each *atom*, the coarsest partition of the 2016 cells that every
constraint cell is a union of (9 atoms for the PL94 constraints: the 8 hhgq types, nursing
facilities split by voting age), so a state (5,490 blocks, 49,410 intervals) is a programme
of about 50,000 columns and rows, decided in 0.3 s on a 2-core VM. Interval propagation up
the tree would be cheaper but misses conflicts through overlapping queries at different
levels (a total against the bounds of its cells below); the programme does not. If it is
infeasible, :class:`NMFInfeasibleError` names an irreducible set of published rows that cannot
all hold (each side of an interval a row of its own; a sparsest Farkas certificate, then a
deletion filter), with their level, geocode, query, cell, sign, value, file and row. Whole
counts are not checked here (the sampler's start is, and names its terms).

Releases and privacy
--------------------
Each (level, query, variance) is one release: the rows' values are Q x_g + e, e ~ N_Z(0,
sigma^2) cellwise independent, sigma^2 = variance (the fact sheet's unverified 4: the column
could be the discrete Gaussian's exact variance instead, equal to sigma^2 to < 1e-8 relative
once sigma^2 >= 1.2, which the production budget's smallest, 1.21, satisfies), so its mechanism
is ``DiscreteGaussian(sqrt(variance), sensitivity=1, neighbour="substitution")`` on each count.

Privacy, as in :mod:`dpinfer.io.noisy_measurements`: a (level, query) is a marginal over a
partition of the person records (each person is in one geounit and one query cell), so a
substitution (bounded neighbours, the Census convention) changes at most two of its counts by 1
each, in cells a and b. The noises are independent, so Renyi divergences add over the
coordinates and the (level, query) is rho-zCDP with

    rho = 1/(2 sigma_a^2) + 1/(2 sigma_b^2) <= 1/sigma_min^2,

sigma_min^2 the smallest variance among its rows; :meth:`NoisyMeasurementFiles.privacy` states
this bound, which is attained when the row of smallest variance has two cells or two rows share
it (always true of the production files' multi-cell queries, and of the total query over two
geounits). The levels and queries compose (zCDP adds; Bun & Steinke 2016): rho_total = sum.
With the production budget rho_total = (542/339)^2 x (the read levels' share of 4099), since
1/sigma^2 = rho_q. Constraints are published without noise: no privacy guarantee.

Filesystems
-----------
``root`` is a local path, or a URL that ``pyarrow.fs.FileSystem.from_uri`` understands
(``s3://...?anonymous=true``, ``gs://``, ``hdfs://``), or any fsspec URL when fsspec is
installed; ``filesystem=`` takes a ``pyarrow.fs.FileSystem`` or an fsspec filesystem. Only
local paths are tested here.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import scipy.sparse

from dpinfer.lattice.infeasible import conflicting_rows
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
    PRODUCTS,
    SIGNS,
    US_CONSTRAINT_LEVELS,
    known_specs,
    query_matrix,
)
from dpinfer.io.noisy_measurements import ZCDPComposition
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian

__all__ = ["GeoLevel", "LevelConstraints", "NMFFileError", "NMFInfeasibleError", "NMFMissingConstraintsWarning",
           "NMFPrivacy", "NMFRelease", "NMFStrayFileWarning", "NMFUnknownQueryWarning", "NMFWarning",
           "NoisyMeasurementFiles", "QueryRows", "block_geocodes", "read_nmf"]

NEIGHBOUR = "substitution"
_KINDS = {DPQUERY_DIR: DPQUERY_SUFFIX, CONSTRAINT_DIR: CONSTRAINT_SUFFIX}
_PUBLISHED = ("query", "sign", "value", "file", "row", "geocode", "cell")
_COLUMNS = {DPQUERY_DIR: ("geocode", "query_name", *AXES, "query_shape", "value", "variance"),
            CONSTRAINT_DIR: ("geocode", "query_name", *AXES, "query_shape", "value", "sign")}


class NMFFileError(ValueError):
    """A file of the NMF does not hold what the layout says: ``file``, ``column`` and ``row``
    (0-based, within the file; None when the problem is not one row) locate it."""

    def __init__(self, file: str, column: str | None, row: int | None, problem: str):
        self.file, self.column, self.row = file, column, row
        where = file + (f", column {column!r}" if column else "") + (f", row {row}" if row is not None else "")
        super().__init__(f"{where}: {problem}")


class NMFInfeasibleError(NMFFileError):
    """The constraints of the levels read cannot all hold (module docstring, "Constraints across
    levels"). ``conflict`` lists the published rows that conflict, one per row: level, geocode,
    query, axes, cell, sign, value, file, row; ``file`` and ``row`` are the first's."""

    def __init__(self, conflict: pd.DataFrame, problem: str):
        self.conflict = conflict
        first = conflict.iloc[0]
        super().__init__(first["file"], "value", int(first["row"]), problem)


class NMFWarning(UserWarning):
    """The files hold something the layout does not lead one to expect; it is read (or left
    out) as the message says."""


class NMFMissingConstraintsWarning(NMFWarning):
    """A level's Constraint dataset, or a partition of it, is missing where its DPQuery one is
    there: the constraints it would hold are not read."""


class NMFUnknownQueryWarning(NMFWarning):
    """A query name that is not one of the layout's PL94 person queries or constraints: read as
    its axis specs say."""


class NMFStrayFileWarning(NMFWarning):
    """A file or partition that is not part of the layout (a ``.csv`` beside the parquet files,
    a State partition that is not a state): not read."""


# --- results -------------------------------------------------------------------------------

@dataclass(frozen=True)
class QueryRows:
    """The rows of one query at one level of the DPQuery or Constraint dataset.

    ``axes`` are the axis specs (:data:`~dpinfer.io.nmf.layout.AXES` order), ``shape`` the
    query_shape, ``values`` (n, prod(shape)) int64 in C order; ``variance`` (n,) float64 for
    DPQuery rows, ``sign`` (n,) for Constraint rows (the other None); ``files`` and ``rows``
    locate each row (file path, 0-based row in the file)."""

    level: str
    query: str
    kind: str
    axes: tuple
    shape: tuple
    geocodes: np.ndarray
    values: np.ndarray
    variance: np.ndarray | None
    sign: np.ndarray | None
    files: np.ndarray
    rows: np.ndarray

    @property
    def matrix(self) -> scipy.sparse.csr_array:
        """The query's 0/1 matrix over a geounit's 2016 histogram cells:
        values[i] = matrix @ x_{geocodes[i]} (+ noise for DPQuery rows)."""
        return query_matrix(self.axes)[1]


@dataclass(frozen=True)
class GeoLevel:
    """The geounits of one level read: sorted ``geocodes`` (from DPQuery and Constraint),
    their common ``width``, and ``parents``: each geocode's prefix of the width of
    ``parent_level``, the next level read above (None and an empty array at the top)."""

    name: str
    width: int
    geocodes: np.ndarray
    parent_level: str | None
    parents: np.ndarray


@dataclass(frozen=True)
class NMFRelease:
    """One (level, query, variance): ``values`` (n, prod(shape)) = ``matrix`` @ x_g + e per
    geocode g, e cellwise ~ ``mechanism`` = DiscreteGaussian(sqrt(variance), 1, substitution)."""

    level: str
    query: str
    axes: tuple
    shape: tuple
    variance: float
    mechanism: DiscreteGaussian
    geocodes: np.ndarray
    values: np.ndarray
    files: np.ndarray
    rows: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.level}/{self.query}"

    @property
    def matrix(self) -> scipy.sparse.csr_array:
        return query_matrix(self.axes)[1]


@dataclass(frozen=True)
class LevelConstraints:
    """The constraints of one level as intervals lower <= (matrix @ x_g) <= upper, one per row
    (module docstring): ``geocodes`` (m,) the geounit g, ``matrix`` (m, 2016) 0/1 csr the
    histogram cells summed, ``lower`` (m,) float64 >= 0, ``upper`` (m,) float64 (inf if
    unbounded); ``query_axes`` lists the distinct query axis specs, ``query_index`` (m,) and
    ``cell`` (m,) say which query cell a row is. ``published`` holds the published cells merged
    (query, sign, value, file, row, geocode, cell), and ``lower_from``, ``upper_from`` (m,) the
    position in it of the cell that sets each row's lower and upper (-1: none does, the
    default 0 or +inf)."""

    level: str
    geocodes: np.ndarray
    matrix: scipy.sparse.csr_array
    lower: np.ndarray
    upper: np.ndarray
    query_axes: tuple
    query_index: np.ndarray
    cell: np.ndarray
    published: pd.DataFrame = field(repr=False)
    lower_from: np.ndarray = field(repr=False)
    upper_from: np.ndarray = field(repr=False)

    @property
    def equalities(self) -> np.ndarray:
        """Rows fixed to one value (lower == upper; includes the structural zeros)."""
        return self.lower == self.upper

    @property
    def structural_zeros(self) -> np.ndarray:
        """Rows with upper == 0: every histogram cell of the row's mask is 0."""
        return self.upper == 0


@dataclass(frozen=True)
class NMFPrivacy:
    """rho-zCDP of the measurements read: ``table`` per (level, query) (geounits, distinct
    variances, smallest variance, rho = 1/sigma_min^2), ``rho`` their sum (composition)."""

    table: pd.DataFrame
    rho: float
    neighbour: str = NEIGHBOUR

    def epsilon(self, delta) -> float:
        """(epsilon, delta)-DP implied by rho-zCDP (Bun & Steinke 2016, Proposition 1.3)."""
        return ZCDPComposition(self.rho, self.neighbour, {}).epsilon(delta)


@dataclass(frozen=True)
class NoisyMeasurementFiles:
    """What :func:`read_nmf` read (module docstring).

    ``states`` are the states read (FIPS); ``file_states`` every state with a partition in the
    files at a level read below US (from the partition directories' names: State=FIPS or
    State=100+FIPS), read or not. ``dpqueries`` and ``constraint_rows`` map (level, query) to
    :class:`QueryRows`; ``geography`` maps a level to its :class:`GeoLevel`; ``files`` lists
    every file opened."""

    root: str
    product: str
    states: tuple
    file_states: tuple
    levels: tuple
    dpqueries: dict
    constraint_rows: dict
    geography: dict
    files: tuple
    _constraints: dict = field(repr=False)

    @property
    def other_states(self) -> tuple:
        """The states in the files that were not read: if any, the US level's rows are of a
        nation larger than the states read (module docstring, "The nation")."""
        return tuple(s for s in self.file_states if s not in self.states)

    def releases(self) -> list[NMFRelease]:
        """One :class:`NMFRelease` per (level, query, variance), levels top down."""
        out = []
        for (level, query), q in self.dpqueries.items():
            for variance in np.unique(q.variance):
                take = q.variance == variance
                mechanism = DiscreteGaussian(math.sqrt(variance), sensitivity=1, neighbour=NEIGHBOUR)
                out.append(NMFRelease(level, query, q.axes, q.shape, float(variance), mechanism,
                                      q.geocodes[take], q.values[take], q.files[take], q.rows[take]))
        return out

    def privacy(self) -> NMFPrivacy:
        """rho per (level, query) = 1/sigma_min^2 and their sum (module docstring)."""
        records = [{"level": level, "query": query, "geounits": len(q.geocodes),
                    "variances": len(np.unique(q.variance)), "min_variance": float(q.variance.min()),
                    "rho": 1.0 / float(q.variance.min())}
                   for (level, query), q in self.dpqueries.items()]
        table = pd.DataFrame.from_records(
            records, columns=["level", "query", "geounits", "variances", "min_variance", "rho"])
        return NMFPrivacy(table.set_index(["level", "query"]), float(table["rho"].sum()))

    def constraints(self, level: str) -> LevelConstraints:
        """The level's constraints as intervals (module docstring; empty without any)."""
        _check_choice("level", level, self.levels)
        return self._constraints[level]

    def structural_zeros(self, level: str) -> tuple[np.ndarray, scipy.sparse.csr_array]:
        """(geocodes of ``level``, Z): Z (geounits, 2016) bool csr, Z[g, c] = True if cell c
        is a structural zero at g, from g's own constraints or those of its ancestors among
        the levels read."""
        _check_choice("level", level, self.levels)
        zeros = None
        for lv in self.levels[: self.levels.index(level) + 1]:
            geo, con = self.geography[lv], self._constraints[lv]
            rows = np.flatnonzero(con.structural_zeros)
            select = scipy.sparse.csr_array(
                (np.ones(rows.size), (np.searchsorted(geo.geocodes, con.geocodes[rows]), np.arange(rows.size))),
                shape=(len(geo.geocodes), rows.size))
            own = select @ con.matrix[rows]
            if zeros is not None:
                parent = self.geography[geo.parent_level].geocodes
                own = own + zeros[np.searchsorted(parent, geo.parents)]
            zeros = scipy.sparse.csr_array(own.astype(bool))
        return self.geography[level].geocodes, zeros


# --- entry point ---------------------------------------------------------------------------

def read_nmf(root, states, *, levels=None, product: str | None = None,
             filesystem=None) -> NoisyMeasurementFiles:
    """Read the PL94 person NMF of ``states`` under ``root`` (module docstring).

    Parameters
    ----------
    root : path or URL
        The directory holding the run roots (``US_Person_PL_PROD``, ...).
    states : int, str or sequence of them
        State FIPS codes (19 or "19"); each brings its partitions State=FIPS and State=100+FIPS.
    levels : sequence of str, optional
        Levels to read (default: every level directory of the product), read top down.
    product : str, optional
        The run root: default ``PR_Person_PL_PROD`` for Puerto Rico (72), else
        ``US_Person_PL_PROD``.
    filesystem : pyarrow.fs.FileSystem or fsspec filesystem, optional

    Raises
    ------
    NMFFileError
        A file breaks the layout (file, column and row named).
    ValueError
        Unknown states, levels or product (listing what exists).
    """
    fips = _check_states(states)
    fs, base = _filesystem(root, filesystem)
    product, product_dir, entries = _product(fs, base, fips, product)
    found = sorted(e.base_name[: -len(".parquet")] for e in entries
                   if e.type == pafs.FileType.Directory and e.base_name.endswith(".parquet"))
    if levels is None:
        unknown = [lv for lv in found if lv not in LEVELS]
        if unknown:
            raise ValueError(f"{product_dir} has level directories {unknown} that are not PL94 person "
                             f"levels {LEVELS}; pass levels= to read the known ones")
        levels = [lv for lv in LEVELS if lv in found]
    else:
        if not isinstance(levels, (str, list, tuple)) or not all(isinstance(lv, str) for lv in
                                                                  ([levels] if isinstance(levels, str) else levels)):
            raise TypeError(f"levels must be a level name or a sequence of them ({LEVELS}), got {levels!r}")
        chosen = [levels] if isinstance(levels, str) else list(levels)
        bad = [lv for lv in chosen if lv not in LEVELS or lv not in found]
        if bad or not chosen:
            raise ValueError(f"levels {bad or chosen} are not in {product_dir}; it has "
                             f"{[lv for lv in LEVELS if lv in found]}")
        levels = [lv for lv in LEVELS if lv in chosen]
    if not levels:
        raise ValueError(f"{product_dir} has no level directories (<Level>.parquet)")

    files_read, tables, file_states = [], {}, set()
    for level in levels:
        level_dir = f"{product_dir}/{level}.parquet"
        partitions = {kind: _partitions(fs, f"{level_dir}/{kind}", level) for kind in _KINDS}
        if level == "US":
            chosen = {kind: sorted((parts or {}).items()) for kind, parts in partitions.items()}
        else:
            for kind, parts in partitions.items():
                for value, path in sorted((parts or {}).items()):
                    if _state_of(value) is None:
                        warnings.warn(f"{path}: State={value} is neither a state (1..99) nor a state's AIAN "
                                      f"part (101..199): not read", NMFStrayFileWarning, stacklevel=2)
                    else:
                        file_states.add(_state_of(value))
            chosen = {kind: sorted((v, p) for v, p in (parts or {}).items() if _state_of(v) in fips)
                      for kind, parts in partitions.items()}
            present = {_state_of(v) for rows in chosen.values() for v, _ in rows}
            missing = sorted(set(fips) - present)
            if missing:
                available = sorted({_state_of(v) for parts in partitions.values() for v in (parts or {})
                                    if _state_of(v) is not None})
                raise ValueError(f"states {missing} have no partition (State=FIPS or State=100+FIPS) at "
                                 f"level {level} of {product_dir}; states there: {available}")
        _warn_missing_constraints(level, level_dir, partitions, chosen)
        tables[level] = {}
        for kind in _KINDS:
            rows = []
            for value, path in chosen[kind]:
                files = _parquet_files(fs, path)
                if not files:
                    raise NMFFileError(path, None, None, f"the {level} {kind} partition State={value} holds no "
                                       "parquet file")
                part = [_read_file(fs, file, kind, level, value) for file in files]
                if not any(f["n"] for f in part):
                    raise NMFFileError(path, None, None, f"the {level} {kind} partition State={value} holds "
                                       f"no rows (in {len(files)} parquet file{'s' if len(files) > 1 else ''})")
                files_read += files
                rows += part
            tables[level][kind] = rows

    dpqueries, constraint_rows = {}, {}
    for level in levels:
        dpqueries.update(_gather(level, DPQUERY_DIR, tables[level][DPQUERY_DIR]))
        constraint_rows.update(_gather(level, CONSTRAINT_DIR, tables[level][CONSTRAINT_DIR]))
    geography = _geography(levels, dpqueries, constraint_rows)
    constraints = {level: _level_constraints(level, [q for (lv, _), q in constraint_rows.items()
                                                     if lv == level])
                   for level in levels}
    file_states = tuple(sorted(file_states))
    unread = tuple(s for s in file_states if s not in fips)
    _check_consistent(levels, geography, constraints, unread if levels[0] == "US" and len(levels) > 1 else ())
    return NoisyMeasurementFiles(str(root), product, tuple(sorted(fips)), file_states, tuple(levels), dpqueries,
                                 constraint_rows, geography, tuple(files_read), constraints)


def block_geocodes(root, states, *, product: str | None = None, filesystem=None) -> np.ndarray:
    """The geocodes of every Block geounit of ``states`` under ``root`` (sorted, unique), from
    the ``geocode`` column alone of the Block level's DPQuery and Constraint files (a state's
    Block level holds ~100 MB of measurements that a fit above blocks does not use): which
    blocks lie under each leaf, for summaries of unions of blocks
    (:mod:`dpinfer.io.nmf.areas`). Arguments as :func:`read_nmf`'s. Empty if the files have no
    Block level for these states; a file that cannot be read is an :class:`NMFFileError`."""
    fips = _check_states(states)
    fs, base = _filesystem(root, filesystem)
    _, product_dir, _ = _product(fs, base, fips, product)
    level_dir = f"{product_dir}/Block.parquet"
    found = []
    for kind in _KINDS:
        for value, path in sorted((_partitions(fs, f"{level_dir}/{kind}", "Block") or {}).items()):
            if _state_of(value) not in fips:
                continue
            for file in _parquet_files(fs, path):
                try:
                    with fs.open_input_file(file) as handle:
                        column = pq.ParquetFile(handle).read(columns=["geocode"]).column("geocode")
                except (OSError, pa.ArrowException, KeyError) as err:
                    raise NMFFileError(file, "geocode", None, f"not readable ({err})") from err
                found.append(np.unique(_strings(file, "geocode", column)))
    return np.unique(np.concatenate(found)).astype(str) if found else np.empty(0, dtype=str)


def _product(fs, base: str, fips: list, product: str | None) -> tuple:
    """(the run root's name, its directory, its entries) for ``fips``: Puerto Rico's own run for
    72, else the US run, unless ``product`` names one."""
    if product is not None and (not isinstance(product, str) or not product or "/" in product):
        raise TypeError(f"product must be None or the name of a run root directory (e.g. {PRODUCTS['US']!r}), "
                        f"got {product!r}")
    given = product is not None
    if product is None:
        if set(fips) == {72}:
            product = PRODUCTS["PR"]
        elif 72 in fips:
            raise ValueError("Puerto Rico (72) is a separate run (PR_Person_PL_PROD): read it apart "
                             f"from the other states, got states {sorted(fips)}")
        else:
            product = PRODUCTS["US"]
    product_dir = f"{base}/{product}"
    entries = _listdir(fs, product_dir)
    if entries is None:
        listed = _listdir(fs, base)
        raise ValueError(f"no run root {product!r} under {base}; it holds "
                         f"{sorted(e.base_name for e in listed) if listed is not None else 'nothing (missing)'}"
                         + ("; product= names the run root's directory" if given else ""))
    return product, product_dir, entries


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _check_states(states) -> list[int]:
    if isinstance(states, (str, numbers.Integral)):
        items = [states]
    elif isinstance(states, (list, tuple, set, frozenset, range)) or (isinstance(states, np.ndarray)
                                                                       and states.ndim == 1):
        items = list(states)
    else:
        raise TypeError(f"states must be a FIPS code 1..99 (int or 1-2 digit str) or a sequence of them, "
                        f"got {states!r}")
    out = []
    for s in items:
        if isinstance(s, str) and s.isdigit() and len(s) <= 2:
            s = int(s)
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 1 <= int(s) <= 99:
            raise ValueError(f"states must be FIPS codes 1..99 (int or 1-2 digit str), got {s!r}")
        out.append(int(s))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"states must name one or more distinct states, got {states!r}")
    return out


# --- files ---------------------------------------------------------------------------------

def _filesystem(root, filesystem) -> tuple[pafs.FileSystem, str]:
    text = os.fspath(root)
    if filesystem is not None:
        if not isinstance(filesystem, pafs.FileSystem):
            filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
        return filesystem, text.rstrip("/")
    if "://" not in text:
        return pafs.LocalFileSystem(), Path(text).resolve().as_posix()
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as err:
        try:
            import fsspec
        except ImportError:
            raise ValueError(f"root {text!r}: pyarrow cannot open this URL ({err}) and fsspec is not "
                             "installed") from err
        fsspec_fs, path = fsspec.core.url_to_fs(text)
        fs = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec_fs))
    return fs, path.rstrip("/")


def _listdir(fs, path: str):
    """The entries of a directory, or None if it does not exist."""
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return None
    return fs.get_file_info(pafs.FileSelector(path, recursive=False))


def _is_metadata(name: str) -> bool:
    """Spark/Hive bookkeeping, skipped without a word: names starting with ``_`` or ``.``
    (``_SUCCESS``, ``_committed_*``, ``.part-*.crc``, ``_temporary/``) and checksums ``*.crc``."""
    return name.startswith(("_", ".")) or name.endswith(".crc")


def _state_of(value: int) -> int | None:
    """The state FIPS of a partition State=<value> below US: value (1..99) or value - 100 (its
    AIAN part, 101..199); None for any other value."""
    return value % 100 if 0 < value < 200 and value % 100 else None


def _partitions(fs, kind_dir: str, level: str) -> dict | None:
    """{State value: directory} of a DPQuery or Constraint dataset (None if it is absent)."""
    entries = _listdir(fs, kind_dir)
    if entries is None:
        return None
    out = {}
    for e in entries:
        if _is_metadata(e.base_name):
            continue
        key, _, value = e.base_name.partition("=")
        if e.type != pafs.FileType.Directory or key != "State" or not value.isdigit():
            raise NMFFileError(e.path, None, None, f"expected only State=<int> partition directories "
                               f"in the {level} dataset {kind_dir}")
        out[int(value)] = e.path
    return out


def _warn_missing_constraints(level: str, level_dir: str, partitions: dict, chosen: dict) -> None:
    """Warn where constraints of the partitions read are missing (module docstring)."""
    dpq_dir, con_dir = f"{level_dir}/{DPQUERY_DIR}", f"{level_dir}/{CONSTRAINT_DIR}"
    if partitions[CONSTRAINT_DIR] is None:
        if chosen[DPQUERY_DIR] and level in US_CONSTRAINT_LEVELS:
            warnings.warn(f"{con_dir}: no Constraint dataset, though {dpq_dir} exists and the layout puts "
                          f"constraints {list(US_CONSTRAINT_LEVELS[level])} at {level}: no constraint of "
                          f"{level} is read", NMFMissingConstraintsWarning, stacklevel=3)
        return
    for value, _ in chosen[DPQUERY_DIR]:
        if value not in partitions[CONSTRAINT_DIR]:
            warnings.warn(f"{con_dir}/State={value}: no such partition, though {dpq_dir}/State={value} "
                          f"exists: no constraint of its {level} geounits is read",
                          NMFMissingConstraintsWarning, stacklevel=3)


def _parquet_files(fs, directory: str) -> list[str]:
    """The ``*.parquet`` files under a partition (recursively); other files warn
    (:class:`NMFStrayFileWarning`) unless they are metadata (:func:`_is_metadata`)."""
    infos = fs.get_file_info(pafs.FileSelector(directory, recursive=True))
    out = []
    for i in infos:
        if i.type != pafs.FileType.File or any(_is_metadata(part) for part in i.path[len(directory):].split("/")):
            continue
        if i.base_name.endswith(".parquet"):
            out.append(i.path)
        else:
            warnings.warn(f"{i.path}: not a parquet file (its name does not end in .parquet) in a partition "
                          "directory: not read", NMFStrayFileWarning, stacklevel=3)
    return sorted(out)


def _read_file(fs, path: str, kind: str, level: str, partition: int) -> dict:
    """The validated columns of one file as numpy arrays (module docstring: the checks)."""
    try:
        with fs.open_input_file(path) as handle:
            table = pq.ParquetFile(handle).read()
    except (OSError, pa.ArrowException) as err:
        raise NMFFileError(path, None, None, f"not a readable parquet file ({err})") from err
    needed = _COLUMNS[kind]
    for column in needed:
        if column not in table.column_names:
            raise NMFFileError(path, column, None, f"missing column (the file has {table.column_names})")
    n = table.num_rows
    out = {"file": path, "n": n}
    for column in ("geocode", "query_name", *AXES) + (("sign",) if kind == CONSTRAINT_DIR else ()):
        out[column] = _strings(path, column, table.column(column))
    if kind == DPQUERY_DIR and "sign" in table.column_names:
        signs = table.column("sign")
        if signs.null_count != len(signs):
            row = int(np.flatnonzero(~np.asarray(signs.is_null()))[0])
            raise NMFFileError(path, "sign", row, "a DPQuery row has a sign; constraints belong in "
                               f"the {CONSTRAINT_DIR} dataset")
    suffix = _KINDS[kind]
    for row, name in enumerate(out["query_name"]):
        if len(name) <= len(suffix) or not name.endswith(suffix):
            raise NMFFileError(path, "query_name", row, f"{name!r} does not end with {suffix!r} "
                               f"(every {kind} query name does)")
    out["query"] = np.array([name[: -len(suffix)] for name in out["query_name"]], dtype=object)
    if kind == CONSTRAINT_DIR:
        bad = ~np.isin(out["sign"], SIGNS)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise NMFFileError(path, "sign", row, f"{out['sign'][row]!r} is not one of {SIGNS}")
    else:
        out["variance"] = _variances(path, table.column("variance"))
    lengths, flat = _integer_lists(path, "query_shape", table.column("query_shape"))
    if np.any(lengths != len(AXES)):
        row = int(np.flatnonzero(lengths != len(AXES))[0])
        raise NMFFileError(path, "query_shape", row, f"has {lengths[row]} entries; it needs one per "
                           f"axis {AXES}")
    shapes = flat.reshape(n, len(AXES))
    out["lengths"], out["values"] = _integer_lists(path, "value", table.column("value"))
    expected_len = np.prod(shapes, axis=1)
    bad = out["lengths"] != expected_len
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise NMFFileError(path, "value", row, f"holds {out['lengths'][row]} values, but query_shape "
                           f"{shapes[row].tolist()} has {expected_len[row]} cells")
    specs = np.stack([out[a] for a in AXES], axis=1) if n else np.empty((0, len(AXES)), dtype=object)
    keys = pd.DataFrame(specs, columns=list(AXES))
    keys["query"] = out["query"]
    for first, group in keys.groupby(list(keys.columns), sort=False).indices.items():
        axes, query = tuple(first[: len(AXES)]), first[-1]
        row = int(group[0])
        try:
            shape, _ = query_matrix(axes)
        except ValueError as err:
            column = next(a for a, s in zip(AXES, axes) if s not in known_specs(a))
            raise NMFFileError(path, column, row, str(err)) from None
        known = (PL94_QUERIES.get(query) if kind == DPQUERY_DIR
                 else getattr(PL94_CONSTRAINTS.get(query), "axes", None))
        if known is not None and known != axes:
            raise NMFFileError(path, "query_name", row, f"query {query!r} has axis specs {axes}, but the "
                               f"layout gives it {known}")
        if known is None:
            names = list(PL94_QUERIES if kind == DPQUERY_DIR else PL94_CONSTRAINTS)
            warnings.warn(f"{path}, row {row}: {kind} query {query!r} is not one of the layout's PL94 person "
                          f"queries {names}; it is read as its axis specs {axes} say",
                          NMFUnknownQueryWarning, stacklevel=3)
        wrong = np.flatnonzero(np.any(shapes[group] != shape, axis=1))
        if wrong.size:
            row = int(group[wrong[0]])
            raise NMFFileError(path, "query_shape", row, f"{shapes[row].tolist()} does not match the "
                               f"axis specs {axes}, which give {list(shape)}")
    starts = np.concatenate([[0], np.cumsum(out["lengths"])[:-1]]).astype(np.int64)
    out["starts"] = starts
    _check_partition(path, level, partition, out["geocode"])
    return out


def _strings(path: str, column: str, values: pa.ChunkedArray) -> np.ndarray:
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
            or (pa.types.is_dictionary(values.type) and pa.types.is_string(values.type.value_type))):
        raise NMFFileError(path, column, None, f"must hold strings, got {values.type}")
    if values.null_count:
        row = int(np.flatnonzero(np.asarray(values.is_null()))[0])
        raise NMFFileError(path, column, row, "is null")
    return np.asarray(values.cast(pa.string()).to_pylist(), dtype=object)


def _variances(path: str, values: pa.ChunkedArray) -> np.ndarray:
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise NMFFileError(path, "variance", None, f"must hold numbers, got {values.type}")
    v = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    bad = ~(np.isfinite(v) & (v > 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise NMFFileError(path, "variance", row, f"must be finite and > 0, got {v[row]}")
    return v


def _integer_lists(path: str, column: str, values: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(length per row, all entries as int64) of a list column of integers (or whole floats)."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    kind = array.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        raise NMFFileError(path, column, None, f"must hold lists of integers, got {kind}")
    if array.null_count:
        row = int(np.flatnonzero(np.asarray(array.is_null()))[0])
        raise NMFFileError(path, column, row, "is null")
    lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(array)
    row_of = np.repeat(np.arange(len(array)), lengths)
    if flat.null_count:
        row = int(row_of[np.flatnonzero(np.asarray(flat.is_null()))[0]])
        raise NMFFileError(path, column, row, "has a null entry")
    if pa.types.is_integer(flat.type):
        return lengths, flat.cast(pa.int64()).to_numpy(zero_copy_only=False)
    if pa.types.is_floating(flat.type):
        real = flat.to_numpy(zero_copy_only=False).astype(np.float64)
        bad = ~np.isfinite(real) | (real != np.round(real)) | (np.abs(real) > 2**53)
        if bad.any():
            row = int(row_of[np.flatnonzero(bad)[0]])
            raise NMFFileError(path, column, row, f"must hold whole numbers, got {real[bad][0]!r}")
        return lengths, real.astype(np.int64)
    raise NMFFileError(path, column, None, f"must hold lists of integers, got {kind}")


def _check_partition(path: str, level: str, partition: int, geocodes: np.ndarray) -> None:
    for row, g in enumerate(geocodes):
        ok = g == "" if level == "US" else (len(g) >= 3 and g[:3].isdigit() and int(g[:3]) == partition)
        if not ok:
            expect = 'the US geocode ""' if level == "US" else f"a geocode whose first 3 characters are {partition:03d}"
            raise NMFFileError(path, "geocode", row, f"{g!r} is not {expect} (partition State={partition})")


# --- assembling ----------------------------------------------------------------------------

def _gather(level: str, kind: str, files: list) -> dict:
    """{(level, query): QueryRows} from the files' validated columns."""
    pieces: dict = {}
    for f in files:
        for query, idx in pd.Series(f["query"]).groupby(f["query"], sort=False).indices.items():
            pieces.setdefault(query, []).append((f, idx))
    out = {}
    order = {q: i for i, q in enumerate(PL94_QUERIES if kind == DPQUERY_DIR else PL94_CONSTRAINTS)}
    for query in sorted(pieces, key=lambda q: (order.get(q, len(order)), q)):
        first_file, first_idx = pieces[query][0]
        axes = tuple(first_file[a][first_idx[0]] for a in AXES)
        shape, _ = query_matrix(axes)
        k = math.prod(shape)
        geocodes, values, variance, sign, files, rows = [], [], [], [], [], []
        for f, idx in pieces[query]:
            for a, spec in zip(AXES, axes):
                differs = np.flatnonzero(f[a][idx] != spec)
                if differs.size:
                    raise NMFFileError(f["file"], a, int(idx[differs[0]]), f"query {query!r} has spec "
                                       f"{f[a][idx[differs[0]]]!r} here but {spec!r} in "
                                       f"{first_file['file']}, row {int(first_idx[0])}")
            geocodes.append(f["geocode"][idx])
            values.append(f["values"][f["starts"][idx][:, None] + np.arange(k)])
            if kind == DPQUERY_DIR:
                variance.append(f["variance"][idx])
            else:
                sign.append(f["sign"][idx])
            files.append(np.full(idx.size, f["file"], dtype=object))
            rows.append(idx.astype(np.int64))
        q = QueryRows(level, query, kind, axes, shape, np.concatenate(geocodes),
                      np.concatenate(values).reshape(-1, k),
                      np.concatenate(variance) if variance else None,
                      np.concatenate(sign) if sign else None,
                      np.concatenate(files), np.concatenate(rows))
        dup = pd.Series(q.geocodes).duplicated(keep=False).to_numpy()
        if dup.any():
            a, b = np.flatnonzero(dup)[:2]
            raise NMFFileError(q.files[b], "geocode", int(q.rows[b]),
                               f"{kind} query {query!r} of geocode {q.geocodes[b]!r} appears twice "
                               f"(also {q.files[a]}, row {int(q.rows[a])})")
        out[(level, query)] = q
    return out


def _geography(levels, dpqueries: dict, constraint_rows: dict) -> dict:
    """Per level: geocodes, width and parents (checked: one width, parents exist)."""
    out = {}
    above = None
    for level in levels:
        sources = [q for (lv, _), q in [*dpqueries.items(), *constraint_rows.items()] if lv == level]
        first = {}
        for q in sources:
            for g, file, row in zip(q.geocodes, q.files, q.rows):
                first.setdefault(g, (file, int(row)))
        geocodes = np.array(sorted(first), dtype=object)
        widths = sorted({len(g) for g in geocodes})
        if len(widths) > 1:
            g = next(g for g in geocodes if len(g) == widths[-1])
            other = next(x for x in geocodes if len(x) == widths[0])
            raise NMFFileError(first[g][0], "geocode", first[g][1],
                               f"{g!r} has width {len(g)}, but {level} geocode {other!r} ({first[other][0]}, "
                               f"row {first[other][1]}) has width {len(other)}; a level has one width")
        width = widths[0] if widths else 0
        if above is None:
            parents = np.array([], dtype=object)
        else:
            if width <= above.width:
                raise ValueError(f"{level} geocodes have width {width}, not more than the {above.name} "
                                 f"width {above.width}: the levels do not nest")
            parents = np.array([g[: above.width] for g in geocodes], dtype=object)
            orphan = np.flatnonzero(~np.isin(parents, above.geocodes))
            if orphan.size:
                g = geocodes[orphan[0]]
                raise NMFFileError(first[g][0], "geocode", first[g][1],
                                   f"{level} geocode {g!r} has no parent in {above.name}: no geocode "
                                   f"{parents[orphan[0]]!r} there")
        out[level] = GeoLevel(level, width, geocodes, above.name if above else None, parents)
        above = out[level]
    return out


def _level_constraints(level: str, queries: list) -> LevelConstraints:
    """The level's constraint rows merged into intervals (module docstring)."""
    axes_list, matrices, parts = [], [], []
    for q in queries:
        matrix = q.matrix
        for i, m in enumerate(matrices):  # queries with the same matrix share their cells
            if m.shape == matrix.shape and (m != matrix).nnz == 0:
                qid = i
                break
        else:
            qid = len(matrices)
            axes_list.append(q.axes)
            matrices.append(matrix)
        n, k = q.values.shape
        parts.append(pd.DataFrame({
            "geocode": np.repeat(q.geocodes, k), "qid": qid, "cell": np.tile(np.arange(k), n),
            "value": q.values.ravel(), "sign": np.repeat(q.sign, k), "query": q.query,
            "file": np.repeat(q.files, k), "row": np.repeat(q.rows, k)}))
    if not parts:
        empty, none = np.array([], dtype=object), np.zeros(0, np.int64)
        return LevelConstraints(level, empty, scipy.sparse.csr_array((0, N_CELLS), dtype=np.int8),
                                np.zeros(0), np.zeros(0), (), none, none,
                                pd.DataFrame(columns=list(_PUBLISHED)), none, none)
    frame = pd.concat(parts, ignore_index=True)
    negative = (frame["sign"] == "=") & (frame["value"] < 0)
    if negative.any():
        r = frame[negative].iloc[0]
        raise NMFFileError(r["file"], "value", int(r["row"]),
                           f"constraint {r['query']!r} (=) of geocode {r['geocode']!r} sets cell "
                           f"{int(r['cell'])} to {int(r['value'])} < 0, but counts are >= 0")
    frame["low"] = np.where(frame["sign"] != "<=", frame["value"], -np.inf)
    frame["up"] = np.where(frame["sign"] != ">=", frame["value"], np.inf)
    groups = frame.groupby(["geocode", "qid", "cell"], sort=True)
    low_at, up_at = groups["low"].idxmax(), groups["up"].idxmin()
    lower = np.maximum(frame["low"].to_numpy()[low_at.to_numpy()], 0.0)
    upper = frame["up"].to_numpy()[up_at.to_numpy()].astype(np.float64)
    bad = np.flatnonzero(lower > upper)
    if bad.size:
        i = bad[0]
        hi = frame.loc[up_at.iloc[i]]
        lo = frame.loc[low_at.iloc[i]]
        low_text = (f"{lo['query']!r} {lo['sign']} {int(lo['value'])} ({lo['file']}, row {int(lo['row'])})"
                    if lo["low"] > 0 else "counts >= 0")
        raise NMFFileError(hi["file"], "value", int(hi["row"]),
                           f"infeasible constraints at {level} geocode {hi['geocode']!r}, query cell "
                           f"{int(hi['cell'])} of {axes_list[int(hi['qid'])]}: {hi['query']!r} "
                           f"{hi['sign']} {int(hi['value'])} contradicts {low_text}")
    keys = low_at.index.to_frame(index=False)
    qid, cell = keys["qid"].to_numpy(), keys["cell"].to_numpy()
    blocks = [matrices[i][cell[qid == i]] for i in range(len(matrices))]
    order = np.concatenate([np.flatnonzero(qid == i) for i in range(len(matrices))])
    stacked = scipy.sparse.vstack(blocks, format="csr")
    matrix = scipy.sparse.csr_array(stacked[np.argsort(order)])
    low_from, up_from = low_at.to_numpy(), up_at.to_numpy()
    return LevelConstraints(level, keys["geocode"].to_numpy(dtype=object), matrix, lower, upper,
                            tuple(axes_list), qid.astype(np.int64), cell.astype(np.int64),
                            frame[list(_PUBLISHED)],
                            np.where(frame["low"].to_numpy()[low_from] >= 0, low_from, -1),
                            np.where(np.isfinite(upper), up_from, -1))


# --- consistency across levels -------------------------------------------------------------

def _check_consistent(levels, geography: dict, constraints: dict, unread: tuple) -> None:
    """Raise :class:`NMFInfeasibleError` naming the published rows that conflict if the
    constraints of every level read cannot all hold for histograms >= 0 that add up the tree
    (module docstring, "Constraints across levels"); ``unread``: the states in the files not
    read, whose counts join the US level's as a remainder >= 0."""
    with_rows = [lv for lv in levels if constraints[lv].geocodes.size]
    if not with_rows:
        return
    # atoms: the coarsest partition of the histogram cells that every constraint cell is a union of
    masks = {}
    for lv in with_rows:
        con = constraints[lv]
        for qid, cell in {(int(q), int(c)) for q, c in zip(con.query_index, con.cell)}:
            masks[(lv, qid, cell)] = query_matrix(con.query_axes[qid])[1][[cell]].toarray()[0] > 0
    keys = list(masks)
    signature = np.stack([masks[k] for k in keys])  # (masks, 2016)
    _, atom = np.unique(signature.T, axis=0, return_inverse=True)
    n_atoms = int(atom.max()) + 1
    in_mask = np.zeros((len(keys), n_atoms), bool)  # mask k holds atom a
    for k in range(len(keys)):
        in_mask[k, np.unique(atom[signature[k]])] = True
    mask_id = {k: i for i, k in enumerate(keys)}
    # columns: x[leaf, atom] for the leaves (the lowest level read), then the remainder's atoms
    leaves = geography[levels[-1]].geocodes
    n_leaves = leaves.size
    blocks, lower, upper, origin = [], [], [], []
    for lv in with_rows:
        con, geo = constraints[lv], geography[lv]
        area = np.searchsorted(geo.geocodes, [g[: geo.width] for g in leaves]) if lv != levels[-1] \
            else np.arange(n_leaves)
        under = scipy.sparse.csr_array((np.ones(n_leaves), (area, np.arange(n_leaves))),
                                       shape=(geo.geocodes.size, n_leaves))
        rows = np.arange(con.geocodes.size)
        equal = (con.lower == con.upper) & (con.lower_from == con.upper_from)
        low_side = ~equal & (con.lower > 0)
        up_side = ~equal & np.isfinite(con.upper)
        for take, lo_on, up_on in ((equal, True, True), (low_side, True, False), (up_side, False, True)):
            r = rows[take]
            if r.size == 0:
                continue
            m = in_mask[[mask_id[(lv, int(q), int(c))] for q, c in zip(con.query_index[r], con.cell[r])]]
            R = under[np.searchsorted(geo.geocodes, con.geocodes[r])].tocoo()
            cols = [R.col * n_atoms + a for a in range(n_atoms)]
            keep = [m[R.row, a] for a in range(n_atoms)]
            coo_r = np.concatenate([R.row[k] for k in keep])
            coo_c = np.concatenate([c[k] for c, k in zip(cols, keep)])
            if lv == "US" and unread:  # the remainder of the nation
                extra_r, extra_a = np.nonzero(m)
                coo_r = np.concatenate([coo_r, extra_r])
                coo_c = np.concatenate([coo_c, n_leaves * n_atoms + extra_a])
            blocks.append(scipy.sparse.csr_array((np.ones(coo_r.size), (coo_r, coo_c)),
                                                 shape=(r.size, (n_leaves + 1) * n_atoms)))
            lower.append(con.lower[r] if lo_on else np.full(r.size, -np.inf))
            upper.append(con.upper[r] if up_on else np.full(r.size, np.inf))
            origin += [(lv, i, "=" if lo_on and up_on else ">=" if lo_on else "<=") for i in r]
    A = scipy.sparse.vstack(blocks, format="csr")
    n = A.shape[1]
    conflict = conflicting_rows(A, np.concatenate(lower), np.concatenate(upper), np.zeros(n), np.full(n, np.inf))
    if conflict is None:
        return
    records = []
    for i in conflict:
        lv, row, side = origin[i]
        con = constraints[lv]
        source = con.lower_from[row] if side in ("=", ">=") else con.upper_from[row]
        p = con.published.iloc[source]
        records.append({"level": lv, "geocode": p["geocode"], "query": p["query"],
                        "axes": con.query_axes[con.query_index[row]], "cell": int(p["cell"]),
                        "sign": p["sign"], "value": int(p["value"]), "file": p["file"], "row": int(p["row"]),
                        "leaves": int(A[[i]].nnz)})
    table = pd.DataFrame.from_records(records)
    shown = [f"{r.level} {r.geocode!r}: {r.query!r} {r.sign} {r.value} on cell {r.cell} of {r.axes} "
             f"({r.file}, row {r.row})" + (f" (no {levels[-1]} geounit under it)" if r.leaves == 0 else "")
             for r in table.itertuples()]
    more = f"; and {len(shown) - 12} more" if len(shown) > 12 else ""
    nation = (f" (the US rows are the nation's: the states {list(unread)} in the files but not read add a "
              "remainder >= 0)" if unread else "")
    raise NMFInfeasibleError(table.drop(columns="leaves"), (
        f"the constraints of the levels read cannot all hold for counts >= 0 that add up from {levels[-1]} "
        f"to {levels[0]}{nation}; these {len(shown)} rows conflict: " + "; ".join(shown[:12]) + more))
