r"""Census-style noisy measurement files (NMF) read as dpinfer releases of one latent count vector.

The 2020 Disclosure Avoidance System of the US Census Bureau (Abowd et al. 2022, "The 2020
Census Disclosure Avoidance System TopDown Algorithm", Harvard Data Science Review) publishes,
for geographic units at several levels and several queries, integer noisy counts

    s = q + e,   e ~ N_Z(0, sigma^2)  (discrete Gaussian, Canonne, Kamath & Steinke 2020),

with sigma^2 fixed per (geolevel, query), and some counts exactly (invariants). Every query is a
marginal of one detailed histogram of person attributes, so every measurement is a 0/1 linear
query of the leaf-level detailed counts x: s_r = Q_r x + e_r. :func:`read_noisy_measurements`
turns such a table into those releases, so that an analyst writes a PyMC model for x and fits it
with ``dp.sample``.

Input format
------------
A long table (a pandas DataFrame, or a path to a ``.csv`` or ``.parquet`` file), one row per
noisy count, with the columns (names configurable by keyword arguments, defaults shown):

* ``geocode``: the unit's GEOID as a string; a county "01001" lies in the state "01"
  (a measurement at geocode g covers every leaf whose geocode starts with g). CSV files are
  read with this column and the attribute columns as strings, so leading zeros survive;
  a DataFrame must already hold strings there.
* ``query``: the query's name ("total", "votingage", "votingage x hispanic", "detailed", ...).
* one column per attribute of ``histogram``: the attribute's level in the cells the query
  keeps, empty (NaN) where the query sums over the attribute. A query keeps the same
  attributes in every row.
* ``noisy_count``: whole numbers, possibly negative.
* ``variance``: sigma^2 of the discrete Gaussian noise, > 0, the same for every row of one
  (geocode, query) unit.

``histogram`` maps each attribute to its list of levels; the detailed cells are their
Cartesian product in C order of the attributes as given. The leaves are the geocodes of
greatest length in the table (or ``leaves=``), and the latent vector x is leaf-major: x[(leaf,
cell)] at position leaf_index * n_cells + cell_index (:attr:`NoisyMeasurements.cells`).

``invariants=`` (optional) is a table of the same shape with a ``value`` column in place of
``noisy_count`` and ``variance``: counts published exactly, b = A x, A the 0/1 matrix of
their queries.

Releases and privacy
--------------------
Rows with the same (query, geocode length, variance) form one release, named
"<geolevel>/<query>" (geolevels by geocode length: Census GEOID lengths 2 state, 5 county,
11 tract, 12 block group, 15 block, or ``geolevels=``). Its mechanism is one
``DiscreteGaussian(sigma, sensitivity=1, neighbour=neighbour)``: one measured count, which a
neighbouring data set changes by at most 1. The release's vector is a marginal query over a
partition of the person records (each record lies in one unit of the level and one cell of the
marginal), so a neighbour changes it in at most

* one coordinate by 1 under ``"add-remove"`` (l2 sensitivity 1),
* two coordinates by 1 under ``"substitution"`` (bounded DP, the Census convention, replace
  one record: -1 where the old record was, +1 where the new one is; l2 sensitivity sqrt(2),
  an upper bound that is attained as soon as a record can move between two parts of the
  release or out of the table's geography, which the table cannot rule out).

The coordinates' noises are independent, so Renyi divergences add over coordinates: a shift
d with d_i in {-1, 0, 1} gives D_alpha = sum_i D_alpha(shift d_i) <= alpha ||d||_2^2 rho_1,
rho_1 = 1/(2 sigma^2) the one-count mechanism's ``zcdp_rho`` (CKS Theorem 4). The release is
therefore rho-zCDP with rho = Delta_2^2 rho_1 = Delta_2^2 / (2 sigma^2), and the table, by
composition (Bun & Steinke 2016: zCDP composes additively), with the sum of the releases' rho
(:meth:`NoisyMeasurements.privacy`). Splitting one (query, level) by variance over disjoint
geocodes would allow parallel composition; the sum does not use it, so it is an upper bound.

The table as one nested release
-------------------------------
A measurement at geocode g covers the leaves whose geocodes start with g, so the geocodes
form a tree of areas: every geocode of the table and of the invariants, and every leaf, lies
under the longest other one that is a prefix of it (the prefixes of a leaf form a chain), and
under a virtual root (geocode "", geolevel "(all)") when several have none
(:attr:`NoisyMeasurements.areas`). The leaves under an area are then exactly the leaves its
geocode covers (the reader's coverage rule), provided no leaf is a prefix of another (then
leaves would overlap; refused). With x[l, c] the counts of leaf l and histogram cell c, each
row of the table is a term at its geocode's area summing the cells that have the row's level
of every attribute its query keeps, and each invariant an equality there:

    s_r = sum_{c in cells_r} S_{g_r, c} + e_r,   b_i = sum_{c in cells_i} S_{g_i, c},

S_{v, c} = sum of x[l, c] over the leaves under area v, which is Q_r x and A_i x of the
releases' matrices. :meth:`NoisyMeasurements.nested` gives that
:class:`~dpinfer.mechanisms.nested.NestedMeasurements` (terms named "<geolevel>/<query>
[<geocode>, <attribute>=<level>, ...]", invariants "<geolevel>/<query> (=) [...]", the cells'
shape the histogram's, so that its interaction moves are made) and
:meth:`NoisyMeasurements.observe` registers it as one release of the counts:

    p(s, b | x) = prod_r f_{sigma_r^2}(s_r - Q_r x) * 1{A x = b},

the releases' likelihood times the exact observation of b. ``dp.sample`` then draws the
counts on the compiled engine with exact sum-tree moves (:mod:`dpinfer.lattice.nested`,
planned by :mod:`dpinfer.inference.planning.nested`), which keep A x = b on every draw, and the
parameters by NUTS. ``invariants="drop"`` leaves the equalities out (with a warning: it throws
away information and the posterior no longer respects the published counts).

The sum-tree moves keep equalities at one area only when their cell sets are disjoint or
nested (a total and its margins, structural zeros). Invariants at one geocode that overlap
partly (the voting-age and the Hispanic-origin margins both exact at one county) cannot be
kept by them: for those tables :meth:`NoisyMeasurements.observe` registers each release as an
observation of Q @ x (:meth:`QueryRelease.observe`) and the invariants as a release
conditioned on invariants on every cell (:class:`~dpinfer.mechanisms.conditioned.Conditioned`,
whose likelihood is 1{A x = b}), which ``dp.sample`` draws with Markov moves of the fibre on
the PyMC engine (:mod:`dpinfer.inference.planning.fibre`), far slower; a warning names the
overlapping invariants.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.optimize

from dpinfer._graphs import shape_of
from dpinfer._validation import check_delta
from dpinfer.lattice.invariants import Invariants
from dpinfer.mechanisms.base import check_neighbour
from dpinfer.mechanisms.conditioned import Conditioned
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian
from dpinfer.mechanisms.nested import NestedMeasurements
from dpinfer.utility.baselines import generalized_least_squares

__all__ = ["NoisyMeasurements", "QueryRelease", "ZCDPComposition", "read_noisy_measurements"]

#: Geolevel names of Census GEOIDs by length (state, county, tract, block group, block).
CENSUS_GEOLEVELS = {2: "state", 5: "county", 11: "tract", 12: "block_group", 15: "block"}
#: The l2 sensitivity of a marginal query over a partition of the records (module docstring).
L2_SENSITIVITY = {"add-remove": 1.0, "substitution": math.sqrt(2.0)}
INVARIANT_OPTIONS = ("impose", "drop")
#: The virtual root's geolevel, when the table has several top geocodes.
ROOT_GEOLEVEL = "(all)"


@dataclass(frozen=True)
class QueryRelease:
    """The noisy counts of one query at one geolevel with one variance: values = Q x + e.

    ``matrix`` is the 0/1 (rows, cells) matrix Q, ``labels`` the rows' (geocode, kept
    attributes...) and ``l2_sensitivity`` the release vector's l2 sensitivity (module
    docstring); ``mechanism`` is the discrete Gaussian of one count."""

    name: str
    variable: str
    query: str
    geolevel: str
    mechanism: DiscreteGaussian
    l2_sensitivity: float
    matrix: np.ndarray
    values: np.ndarray
    labels: pd.Index

    @property
    def rho(self) -> float:
        """rho-zCDP of the release: l2_sensitivity^2 * mechanism.zcdp_rho
        = Delta_2^2 / (2 sigma^2) (module docstring)."""
        return self.l2_sensitivity**2 * self.mechanism.zcdp_rho

    def observe(self, flat_counts, *, model=None):
        """``mechanism.observe(variable, Q @ flat_counts, values)`` in the current PyMC model."""
        import pytensor.tensor as pt

        query = pt.dot(pt.constant(self.matrix), flat_counts)
        return self.mechanism.observe(self.variable, query, self.values, model=model)


@dataclass(frozen=True)
class ZCDPComposition:
    """rho-zCDP of a whole table: the sum of its releases' rho (``per_release``)."""

    rho: float
    neighbour: str
    per_release: dict

    def epsilon(self, delta) -> float:
        """An (epsilon, delta)-DP guarantee implied by rho-zCDP (Bun & Steinke 2016,
        Proposition 1.3): epsilon = rho + 2 sqrt(rho log(1/delta))."""
        delta = check_delta(delta)
        return self.rho + 2.0 * math.sqrt(self.rho * math.log(1.0 / delta))

    def __str__(self) -> str:
        return (f"{self.rho:.6g}-zCDP under {self.neighbour} neighbours, by composition of "
                f"{len(self.per_release)} releases")


@dataclass(frozen=True)
class NoisyMeasurements:
    """A noisy measurement table as releases of linear queries of one latent count vector x
    (module docstring). Built by :func:`read_noisy_measurements`.

    Attributes
    ----------
    cells : pandas.MultiIndex
        (leaf geocode, attributes...) of x, leaf-major, then the histogram cells in C order.
    releases : list of QueryRelease
    invariants : Invariants or None
        ``Invariants.from_matrix(A)`` of the exact counts b = A x.
    invariant_values : numpy.ndarray or None
        b.
    invariant_labels : pandas.MultiIndex or None
        (query, geocode, attributes...) of the rows of A (NaN where a query sums over the
        attribute).
    neighbour : str
    areas : pandas.DataFrame
        The tree of areas (module docstring), one row per area: ``geocode``, ``geolevel`` and
        ``parent`` (the parent's row, -1 for the root).
    """

    cells: pd.MultiIndex
    releases: list
    invariants: Invariants | None
    invariant_values: np.ndarray | None
    invariant_labels: pd.MultiIndex | None
    neighbour: str
    areas: pd.DataFrame

    @property
    def shape(self) -> tuple:
        """(n_leaves, n_cells): the shape of the counts the nested release observes."""
        return self.cells.levshape[0], len(self.cells) // self.cells.levshape[0]

    def privacy(self) -> ZCDPComposition:
        """rho = sum over releases of Delta_2^2 / (2 sigma^2) (module docstring); invariants
        are published without noise and carry no privacy guarantee."""
        per_release = {r.name: r.rho for r in self.releases}
        return ZCDPComposition(float(sum(per_release.values())), self.neighbour, per_release)

    def nested(self, invariants: str = "impose") -> NestedMeasurements:
        """The table as one :class:`~dpinfer.mechanisms.nested.NestedMeasurements` of counts of
        shape :attr:`shape` (module docstring): each release's rows as measurements at their
        geocodes' areas, each invariant as an equality (left out with
        ``invariants="drop"``). A new object on every call (its terms freeze when used)."""
        _check_invariant_option(invariants)
        index = {g: i for i, g in enumerate(self.areas["geocode"])}
        leaves = self.cells.get_level_values(0)[::self.shape[1]]
        release = NestedMeasurements(
            self.areas["parent"].to_numpy(), [index[g] for g in leaves], self.shape[1],
            area_names=[g or ROOT_GEOLEVEL for g in self.areas["geocode"]],
            cell_shape=self.cells.levshape[1:])
        for r in self.releases:
            _add_terms(release.measure, r.name, r.labels.get_level_values("geocode"), self._row_cells(r.matrix),
                       r.values, _cell_names(r.labels, ["geocode"]), index, sigma2=r.mechanism.sigma**2)
        if self.invariants is None or invariants == "drop":
            return release
        geocodes = self.invariant_labels.get_level_values("geocode")
        level = self.areas.set_index("geocode")["geolevel"]
        names = [f"{level[g]}/{q} (=)" for q, g in zip(self.invariant_labels.get_level_values("query"), geocodes)]
        row_cells = self._row_cells(self.invariants.constraint_matrix)
        cell_names = _cell_names(self.invariant_labels, ["query", "geocode"])
        for name in dict.fromkeys(names):
            rows = np.flatnonzero(np.array(names) == name)
            _add_terms(release.equal, name, geocodes[rows], row_cells[rows], self.invariant_values[rows],
                       [cell_names[i] for i in rows], index)
        return release

    def _row_cells(self, matrix: np.ndarray) -> np.ndarray:
        """(rows, n_cells) bool: the cells each row of a query matrix sums at its geocode (the
        matrix's row is the geocode's leaves times these cells)."""
        return np.asarray(matrix).reshape(-1, *self.shape).any(axis=1)

    def overlapping_invariants(self) -> tuple | None:
        """Two invariants at one geocode whose cell sets overlap partly (labels of
        :attr:`invariant_labels`), which the sum-tree moves cannot keep together (module
        docstring), or None."""
        if self.invariants is None:
            return None
        row_cells = self._row_cells(self.invariants.constraint_matrix)
        geocodes = np.asarray(self.invariant_labels.get_level_values("geocode"))
        for g in dict.fromkeys(geocodes):
            rows = np.flatnonzero(geocodes == g)
            for k, i in enumerate(rows):
                for j in rows[k + 1:]:
                    a, b = row_cells[i], row_cells[j]
                    if np.any(a & b) and np.any(a & ~b) and np.any(b & ~a):
                        return self.invariant_labels[i], self.invariant_labels[j]
        return None

    def observe(self, counts, *, name: str = "nmf", invariants: str = "impose", model=None) -> list:
        """Register the table in the current PyMC model as one nested release named ``name``
        of ``counts`` (:meth:`nested`): the counts of shape :attr:`shape` (leaves x histogram
        cells), or of any shape whose C-order flattening is leaf-major (one entry per
        :attr:`cells`), reshaped. ``invariants="drop"`` leaves the exact counts out (a warning
        says so: the posterior then ignores published information). Returns the observed
        variables: the one release, or, when invariants overlap partly at one geocode
        (:meth:`overlapping_invariants`; a warning says so), every release as an observation
        of Q @ counts and the invariants as a conditioned release named ``"invariants"``
        (module docstring)."""
        import pytensor.tensor as pt

        _check_invariant_option(invariants)
        counts = pt.as_tensor_variable(counts)
        size = int(np.prod(shape_of(counts)))
        if size != len(self.cells):
            raise ValueError(f"counts has {size} entries, but the table has {len(self.cells)} cells "
                             "(leaves x histogram cells, NoisyMeasurements.cells)")
        if self.invariants is not None and invariants == "drop":
            warnings.warn(
                f"observe(invariants='drop'): the {len(self.invariant_values)} exact counts of the "
                "table are left out of the model, so the posterior does not respect them",
                UserWarning, stacklevel=2)
        overlap = self.overlapping_invariants() if invariants == "impose" else None
        if overlap is None:
            if tuple(shape_of(counts)) != self.shape:
                counts = counts.reshape(self.shape)
            return [self.nested(invariants).observe(name, counts, model=model)]
        warnings.warn(
            f"the invariants {overlap[0]} and {overlap[1]} overlap partly at one geocode, which the "
            "sum-tree moves cannot keep together: the table is observed as separate releases of "
            "Q @ counts and a conditioned release 'invariants', drawn with fibre moves on the "
            "PyMC engine (much slower)", UserWarning, stacklevel=2)
        flat = counts.flatten()
        observed = [r.observe(flat, model=model) for r in self.releases]
        m = len(self.invariant_values)
        exact = Conditioned(DiscreteGaussian(1.0), Invariants.from_matrix(np.eye(m, dtype=np.int64)))
        matrix = pt.constant(self.invariants.constraint_matrix)
        observed.append(exact.observe("invariants", pt.dot(matrix, flat), self.invariant_values,
                                      model=model))
        return observed

    def baseline(self) -> pd.Series:
        """The least-squares estimate an analyst without a likelihood uses (TopDown style):
        x_hat = argmin_x sum_r ||Q_r x - s_r||^2 / v_r subject to A x = b, x >= 0, v_r the
        exact noise variance of release r (``mechanism.noise_variance``), by
        :func:`dpinfer.utility.baselines.generalized_least_squares`. Indexed by :attr:`cells`."""
        kwargs = {}
        if self.invariants is not None:
            kwargs = {"invariants_matrix": self.invariants.constraint_matrix,
                      "invariant_values": self.invariant_values}
        x_hat = generalized_least_squares(
            [r.matrix for r in self.releases], [r.values for r in self.releases],
            [r.mechanism.noise_variance for r in self.releases], **kwargs)
        return pd.Series(x_hat, index=self.cells, name="baseline")


# --- reading -------------------------------------------------------------------------------------


def read_noisy_measurements(
    table,
    histogram: dict,
    *,
    leaves=None,
    invariants=None,
    neighbour: str = "substitution",
    geolevels: dict | None = None,
    geocode_column: str = "geocode",
    query_column: str = "query",
    count_column: str = "noisy_count",
    variance_column: str = "variance",
    value_column: str = "value",
) -> NoisyMeasurements:
    """Read a noisy measurement table (module docstring: format, releases, privacy).

    Parameters
    ----------
    table : pandas.DataFrame or path to a .csv / .parquet file
    histogram : dict
        attribute -> list of its levels; the attribute columns of the table.
    leaves : list of str, optional
        The leaf geocodes, in the order of x; default: the table's geocodes of greatest length,
        sorted.
    invariants : pandas.DataFrame or path, optional
        Exact counts: the same columns with ``value_column`` instead of the count and variance.
    neighbour : {"substitution", "add-remove"}
        The neighbour relation of the privacy guarantee (Census: substitution, bounded DP).
    geolevels : dict, optional
        geocode length -> geolevel name (default :data:`CENSUS_GEOLEVELS`; other lengths are
        named "geo<length>").
    geocode_column, query_column, count_column, variance_column, value_column : str
        Column names.

    Raises
    ------
    ValueError
        Naming the column or argument: missing columns, an unknown attribute level, a query
        whose kept attributes differ between rows, a geocode covering no leaf, duplicate
        measurements, non-integer counts, a variance <= 0 or differing within a unit, invariant
        values that are negative, non-integer or inconsistent (no x >= 0 with A x = b).
    TypeError
        Geocodes that are not strings, ``histogram`` not a dict of level lists.
    """
    neighbour = check_neighbour(neighbour)
    attributes, levels = _check_histogram(histogram)
    names = {"geocode_column": geocode_column, "query_column": query_column,
             "count_column": count_column, "variance_column": variance_column,
             "value_column": value_column}
    clash = sorted(set(attributes) & set(names.values()))
    if clash:
        raise ValueError(f"histogram attributes {clash} are also the names of the geocode, query, "
                         "count, variance or value columns")
    geolevels = dict(CENSUS_GEOLEVELS if geolevels is None else geolevels)
    frame = _load("table", table, geocode_column, attributes)
    rows = _parse_rows("table", frame, attributes, levels, geocode_column, query_column,
                       (count_column, variance_column))
    counts = _whole_numbers("table", count_column, frame[count_column])
    variances = _variances(frame, rows, variance_column)
    leaves = _leaves(rows["geocode"], leaves)
    _check_disjoint(leaves)
    cells = pd.MultiIndex.from_product([leaves, *levels], names=["geocode", *attributes])
    cover = _coverage("table", geocode_column, rows["geocode"], leaves)
    cell_levels = np.stack(np.unravel_index(np.arange(int(np.prod([len(v) for v in levels]))),
                                            [len(v) for v in levels]), axis=1)
    matrix = _query_matrix(rows, cover, cell_levels)
    releases = _releases(rows, variances, matrix, counts, cover, attributes, levels, geolevels,
                         neighbour)
    inv, inv_values, inv_labels = None, None, None
    if invariants is not None:
        inv_frame = _load("invariants", invariants, geocode_column, attributes)
        inv_rows = _parse_rows("invariants", inv_frame, attributes, levels, geocode_column,
                               query_column, (value_column,))
        inv_values = _whole_numbers("invariants", value_column, inv_frame[value_column])
        if np.any(inv_values < 0):
            bad = int(np.flatnonzero(inv_values < 0)[0])
            raise ValueError(f"invariants: column {value_column!r} must hold counts >= 0, got "
                             f"{inv_values[bad]} (geocode {inv_rows['geocode'][bad]!r}, query "
                             f"{inv_rows['query'][bad]!r})")
        inv_cover = _coverage("invariants", geocode_column, inv_rows["geocode"], leaves)
        a_matrix = _query_matrix(inv_rows, inv_cover, cell_levels)
        _check_feasible(a_matrix, inv_values, value_column)
        inv = Invariants.from_matrix(a_matrix)
        inv_labels = pd.MultiIndex.from_arrays(
            [inv_rows["query"], inv_rows["geocode"],
             *[[lv[i] if i >= 0 else np.nan for i in inv_rows["levels"][:, k]]
               for k, lv in enumerate(levels)]],
            names=["query", "geocode", *attributes])
    geocodes = rows["geocode"] + (list(inv_labels.get_level_values("geocode")) if inv is not None else [])
    areas = _areas(leaves, geocodes, geolevels)
    return NoisyMeasurements(cells, releases, inv, inv_values, inv_labels, neighbour, areas)


def _check_invariant_option(invariants) -> None:
    if not isinstance(invariants, str) or invariants not in INVARIANT_OPTIONS:
        raise ValueError(f"invariants must be one of {INVARIANT_OPTIONS}, got {invariants!r}")


def _cell_names(labels: pd.MultiIndex, skip: list) -> list:
    """A label per row of ``labels`` from its attributes' levels, the levels ``skip`` left out
    ("votingage=18+, hispanic=no"; NaN levels, summed over, left out; "all cells" when none is
    kept)."""
    frame = labels.to_frame(index=False).drop(columns=skip)
    return [", ".join(f"{a}={v}" for a, v in row.items() if not (not isinstance(v, str) and pd.isna(v)))
            or "all cells" for _, row in frame.iterrows()]


def _add_terms(add, name: str, geocodes, row_cells, values, cell_names, index: dict, **kwargs) -> None:
    """Rows (geocode, cells summed, value) as terms of a NestedMeasurements: one call of ``add``
    (its ``measure`` or ``equal``) per set of geocodes whose rows sum the same cells in the same
    order, with values (geocodes, query cells)."""
    by_geocode = pd.Series(np.arange(len(geocodes))).groupby(np.asarray(geocodes, dtype=object), sort=False).indices
    groups: dict = {}
    for g, rows in by_geocode.items():
        key = tuple(tuple(np.flatnonzero(row_cells[i])) for i in rows)
        groups.setdefault(key, []).append(g)
    for members in groups.values():
        rows = np.stack([by_geocode[g] for g in members])
        add(name, [index[g] for g in members], row_cells[rows[0]], np.asarray(values)[rows],
            cell_names=[cell_names[i] for i in rows[0]], **kwargs)


def _check_histogram(histogram) -> tuple[list, list]:
    if not isinstance(histogram, dict) or not histogram:
        raise TypeError(f"histogram must be a non-empty dict attribute -> list of levels, got {histogram!r}")
    attributes, levels = [], []
    for attribute, values in histogram.items():
        if not isinstance(attribute, str):
            raise TypeError(f"histogram: attribute names must be strings, got {attribute!r}")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"histogram[{attribute!r}] must be a list of levels, got {values!r}")
        values = list(values)
        keys = [_level_key(v) for v in values]
        if not values or None in keys or len(set(keys)) != len(keys):
            raise ValueError(f"histogram[{attribute!r}] must be a non-empty list of distinct, "
                             f"non-missing levels, got {values!r}")
        attributes.append(attribute)
        levels.append(values)
    return attributes, levels


def _level_key(value) -> str | None:
    """A level as text, so that 1, 1.0 (an integer column with NaN) and "1" (CSV) agree;
    None for a missing value."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _load(argument: str, table, geocode_column: str, attributes: list) -> pd.DataFrame:
    """A copy of the DataFrame, or the CSV (geocode and attribute columns as strings) or
    Parquet file at the path."""
    if isinstance(table, pd.DataFrame):
        return table.reset_index(drop=True)
    if not isinstance(table, (str, Path)):
        raise TypeError(f"{argument} must be a pandas DataFrame or a path to a .csv or .parquet "
                        f"file, got {type(table).__name__}")
    path = Path(table)
    if path.suffix.lower() == ".csv":
        return pd.read_csv(path, dtype={c: str for c in [geocode_column, *attributes]})
    if path.suffix.lower() == ".parquet":
        return pd.read_parquet(path)
    raise ValueError(f"{argument}: {path} is neither a .csv nor a .parquet file")


def _parse_rows(argument, frame, attributes, levels, geocode_column, query_column, needed) -> dict:
    """Per row: geocode, query and the level index of every attribute (-1 where summed over),
    after checking the columns, the levels and that each query keeps the same attributes."""
    missing = [c for c in [geocode_column, query_column, *attributes, *needed] if c not in frame.columns]
    if missing:
        raise ValueError(f"{argument} is missing column(s) {missing} (columns: {list(frame.columns)}; "
                         "set geocode_column=, query_column=, ... or the histogram's attributes)")
    if frame.empty:
        raise ValueError(f"{argument} has no rows")
    geocodes = frame[geocode_column].tolist()
    for g in geocodes:
        if not isinstance(g, str) or not g:
            raise TypeError(f"{argument}: column {geocode_column!r} must hold non-empty strings (read "
                            f"CSV files with dtype=str so that leading zeros survive), got {g!r}")
    queries = frame[query_column].tolist()
    for q in queries:
        if not isinstance(q, str) or not q:
            raise ValueError(f"{argument}: column {query_column!r} must hold non-empty query names, "
                             f"got {q!r}")
    index = np.full((len(frame), len(attributes)), -1, dtype=np.int64)
    for k, (attribute, values) in enumerate(zip(attributes, levels)):
        lookup = {_level_key(v): i for i, v in enumerate(values)}
        for row, v in enumerate(frame[attribute].tolist()):
            key = _level_key(v)
            if key is None:
                continue
            if key not in lookup:
                raise ValueError(f"{argument}: column {attribute!r} has level {v!r} (row {row}), which "
                                 f"is not in histogram[{attribute!r}] = {values!r}")
            index[row, k] = lookup[key]
    kept = index >= 0
    for q in dict.fromkeys(queries):
        patterns = {tuple(p) for p in kept[np.array(queries) == q]}
        if len(patterns) > 1:
            shown = sorted(tuple(a for a, keep in zip(attributes, p) if keep) for p in patterns)
            raise ValueError(f"{argument}: query {q!r} (column {query_column!r}) keeps different "
                             f"attribute columns in different rows: {shown}")
    keys = pd.DataFrame({"g": geocodes, "q": queries,
                         **{str(k): index[:, k] for k in range(len(attributes))}})
    duplicated = keys.duplicated()
    if duplicated.any():
        row = int(np.flatnonzero(duplicated)[0])
        raise ValueError(f"{argument}: duplicate measurement of geocode {geocodes[row]!r} (column "
                         f"{geocode_column!r}), query {queries[row]!r}, same cell (row {row})")
    return {"geocode": geocodes, "query": queries, "levels": index}


def _whole_numbers(argument: str, column: str, series: pd.Series) -> np.ndarray:
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{argument}: column {column!r} must hold whole numbers, got "
                         f"{series.iloc[row]!r} (row {row})")
    return values.astype(np.int64)


def _variances(frame: pd.DataFrame, rows: dict, column: str) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"table: column {column!r} must hold variances > 0, got "
                         f"{frame[column].iloc[row]!r} (row {row})")
    units = pd.DataFrame({"g": rows["geocode"], "q": rows["query"], "v": values})
    spread = units.groupby(["g", "q"], sort=False)["v"].nunique()
    if (spread > 1).any():
        g, q = spread[spread > 1].index[0]
        raise ValueError(f"table: column {column!r} differs between the rows of geocode {g!r}, "
                         f"query {q!r}; one (geocode, query) unit has one noise variance")
    return values


def _leaves(geocodes: list, leaves) -> list:
    if leaves is None:
        longest = max(len(g) for g in geocodes)
        return sorted({g for g in geocodes if len(g) == longest})
    if isinstance(leaves, str) or not hasattr(leaves, "__iter__"):
        raise TypeError(f"leaves must be a list of geocode strings, got {leaves!r}")
    leaves = list(leaves)
    if not leaves or not all(isinstance(g, str) and g for g in leaves):
        raise TypeError(f"leaves must be a non-empty list of geocode strings, got {leaves!r}")
    if len(set(leaves)) != len(leaves):
        raise ValueError("leaves must not repeat a geocode")
    return leaves


def _check_disjoint(leaves: list) -> None:
    """No leaf is a prefix of another (a measurement at the shorter would cover both: leaves
    that overlap)."""
    known = set(leaves)
    for leaf in leaves:
        inside = [leaf[:k] for k in range(1, len(leaf)) if leaf[:k] in known]
        if inside:
            raise ValueError(f"leaves must not contain one another: leaf {leaf!r} starts with leaf "
                             f"{inside[-1]!r}, so the two would overlap")


def _areas(leaves: list, geocodes: list, geolevels: dict) -> pd.DataFrame:
    """The tree of areas (module docstring): every geocode and leaf under the longest other one
    that is a prefix of it, under a virtual root "" when several have none; shorter geocodes
    first. Columns geocode, geolevel, parent (row index, -1 for the root)."""
    known = set(geocodes) | set(leaves)
    parent_code = {g: next((g[:k] for k in range(len(g) - 1, 0, -1) if g[:k] in known), None) for g in known}
    if sum(p is None for p in parent_code.values()) > 1:
        parent_code = {g: "" if p is None else p for g, p in parent_code.items()} | {"": None}
    nodes = sorted(parent_code, key=lambda g: (len(g), g))
    row = {g: i for i, g in enumerate(nodes)}
    return pd.DataFrame({
        "geocode": nodes,
        "geolevel": [ROOT_GEOLEVEL if g == "" else geolevels.get(len(g), f"geo{len(g)}") for g in nodes],
        "parent": [-1 if parent_code[g] is None else row[parent_code[g]] for g in nodes]})


def _coverage(argument: str, column: str, geocodes: list, leaves: list) -> np.ndarray:
    """(rows, leaves) boolean: leaf j starts with the row's geocode."""
    unique = list(dict.fromkeys(geocodes))
    table = {g: np.array([leaf.startswith(g) for leaf in leaves]) for g in unique}
    for g in unique:
        if not table[g].any():
            raise ValueError(f"{argument}: geocode {g!r} (column {column!r}) covers no leaf: no leaf "
                             "geocode starts with it")
    return np.stack([table[g] for g in geocodes])


def _query_matrix(rows: dict, cover: np.ndarray, cell_levels: np.ndarray) -> np.ndarray:
    """Q[row, (leaf, cell)] = 1 if the row's geocode covers the leaf and the cell has the row's
    level of every attribute the row keeps."""
    index = rows["levels"]
    matches = np.all((index[:, None, :] < 0) | (index[:, None, :] == cell_levels[None, :, :]), axis=2)
    return (cover[:, :, None] & matches[:, None, :]).reshape(len(index), -1).astype(np.int64)


def _releases(rows, variances, matrix, counts, cover, attributes, levels, geolevels, neighbour) -> list:
    """One release per (query, geocode length, variance), rows ordered by their first covered
    leaf and then cell (so a leaf-level detailed release has Q = I)."""
    geocodes, queries, index = rows["geocode"], rows["query"], rows["levels"]
    groups = pd.DataFrame({"q": queries, "n": [len(g) for g in geocodes], "v": variances})
    first_leaf = np.argmax(cover, axis=1)
    taken: dict = {}
    releases = []
    for (query, length, variance), members in groups.groupby(["q", "n", "v"], sort=False).groups.items():
        members = np.asarray(members)
        kept = np.flatnonzero(index[members[0]] >= 0)
        sizes = [len(levels[k]) for k in kept]
        cell = (np.ravel_multi_index(index[members][:, kept].T, sizes) if kept.size
                else np.zeros(members.size, np.int64))
        members = members[np.lexsort((cell, first_leaf[members]))]
        level = geolevels.get(length, f"geo{length}")
        name = f"{level}/{query}"
        taken[name] = taken.get(name, 0) + 1
        if taken[name] > 1:
            name = f"{name}[{taken[name]}]"
        labels = pd.MultiIndex.from_arrays(
            [[geocodes[i] for i in members], *[[levels[k][index[i, k]] for i in members] for k in kept]],
            names=["geocode", *[attributes[k] for k in kept]])
        releases.append(QueryRelease(
            name=name, variable=re.sub(r"\W+", "_", name).strip("_"), query=query, geolevel=level,
            mechanism=DiscreteGaussian(math.sqrt(variance), sensitivity=1, neighbour=neighbour),
            l2_sensitivity=L2_SENSITIVITY[neighbour], matrix=matrix[members], values=counts[members],
            labels=labels))
    return releases


def _check_feasible(a_matrix: np.ndarray, b: np.ndarray, column: str) -> None:
    """Some x >= 0 with A x = b (a linear programme, HiGHS), else the invariants contradict
    each other (e.g. a state's count is not the sum of its counties')."""
    result = scipy.optimize.linprog(np.zeros(a_matrix.shape[1]), A_eq=a_matrix, b_eq=b,
                                    bounds=(0, None), method="highs")
    if result.status == 2:
        raise ValueError(f"invariants: the values in column {column!r} are inconsistent: no "
                         "non-negative counts x have A x = b (e.g. a state's count differs from "
                         "the sum of its counties' counts of the same query)")
    if result.status != 0:
        raise RuntimeError("scipy.optimize.linprog did not decide the invariants' feasibility: "
                           f"{result.message}")
