r"""The noisy measurement files as one release of coarse counts on chosen leaves.

:func:`census_table` turns what :func:`~dpinfer.io.nmf.reading.read_nmf` read into a
:class:`~dpinfer.mechanisms.nested.NestedMeasurements` over latent counts x[g, c]: g a geounit
of the **leaf level** (e.g. Tract or Block_Group), c a **coarse cell**, a union of the 2016
histogram cells given per axis by a spec (:func:`coarsening`; e.g. ``"pl94-28"`` = votingage x
hispanic x 7 race groups, hhgq summed). The tree of areas is the geography read from the top
level down to the leaves (a virtual root joins several top geounits).

Which measurements are used, and how (the ``usage`` table says it per level and query):

* a query whose cells are unions of coarse cells is used **as it is**, one term per
  (geounit, query cell);
* a **finer** query (63 race codes where the cells have 7 race groups) is **summed**: its cells
  are grouped by the connected components of "query cell and coarse cell share a histogram
  cell" (the finest grouping whose sums are sums of coarse cells), and each group's published
  counts are added, a measurement of the group's coarse cells with noise the sum of the group's
  discrete Gaussians (``summed`` = group size). Conditioning on these sums, a statistic of the
  release, keeps the posterior valid; it gives up what the split inside each sum says, which is
  information about the finer cells the model does not have (module
  :mod:`dpinfer.mechanisms.nested`);
* a group whose histogram cells do not cover its coarse cells (``nurse_nva_0``'s nursing-home
  minors when hhgq is summed) is **not a query of the coarse cells** and is not used;
* levels below the leaves are not used (their measurements would add independent noisy sums of
  the leaves, their bounds weaker bounds: both left out, said in ``usage``);
* the **US level's** measurements and constraints are of the nation. If the files hold states
  that were not read (:attr:`~dpinfer.io.nmf.reading.NoisyMeasurementFiles.other_states`), the
  nation is the states read plus a remainder nothing read describes, and the US rows say
  essentially nothing about the states read (only that their sums lie below the nation's: the
  reader's module docstring, "The nation"); imposing them on the states read would be wrong
  (the nation's exact total on one state). They are not used, each listed in ``usage`` with
  the reason ("the nation's measurement; the files hold states [...] not read"), and the tree
  starts at the states read (a virtual root "(all)" joins several). Leaving terms out keeps
  the posterior valid: it is the posterior given the rest of the release. If every state in
  the files is read, the nation is the states read and the US rows are used as any level's;
* a query name that is not one of the layout's PL94 queries or constraints is used as its axis
  specs say, and ``usage`` says so.

Constraints (:meth:`~dpinfer.io.nmf.reading.NoisyMeasurementFiles.constraints`, intervals
lower <= M x_g <= upper) are grouped the same way: a group's sum lies between the sums of its
lowers and uppers (an equality when every row of it is one; a structural zero when the uppers
sum to 0), which the truth satisfies because each row does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse
from scipy.sparse.csgraph import connected_components

from dpinfer.io.nmf.layout import (
    AXES,
    LEVELS,
    PL94_CONSTRAINTS,
    PL94_QUERIES,
    axis_partition,
    known_specs,
    query_matrix,
)
from dpinfer.mechanisms.nested import NestedMeasurements

#: Named coarsenings: axis specs in AXES order.
COARSENINGS = {
    "pl94-28": {"hhgq": "*", "votingage": "votingage", "hispanic": "hispanic", "cenrace": "majorrace"},
    "pl94-4": {"hhgq": "*", "votingage": "votingage", "hispanic": "hispanic", "cenrace": "*"},
    "total": {"hhgq": "*", "votingage": "*", "hispanic": "*", "cenrace": "*"},
    "detailed": {a: "detailed" for a in AXES},
}


@dataclass(frozen=True)
class Coarsening:
    """Coarse cells: per axis a spec (:func:`~dpinfer.io.nmf.layout.axis_partition`); the
    cells are their Cartesian product in C order, ``matrix`` (n_cells, 2016) 0/1."""

    axes: tuple
    cells: pd.MultiIndex
    matrix: scipy.sparse.csr_array

    @property
    def n_cells(self) -> int:
        return self.matrix.shape[0]

    @property
    def shape(self) -> tuple:
        """The cells as a product of the kept axes' levels (C order)."""
        return tuple(len(axis_partition(a, s).labels) for a, s in zip(AXES, self.axes) if s != "*") or (1,)


def coarsening(cells) -> Coarsening:
    """The coarse cells named by ``cells``: a name of :data:`COARSENINGS` or a dict axis -> spec
    (axes left out are summed, ``"*"``)."""
    if isinstance(cells, str):
        if not isinstance(cells, str) or cells not in COARSENINGS:
            raise ValueError(f"cells must be one of {sorted(COARSENINGS)} or a dict axis -> spec, got {cells!r}")
        cells = COARSENINGS[cells]
    if not isinstance(cells, dict) or set(cells) - set(AXES):
        raise ValueError(f"cells must map axes {AXES} to specs, got {cells!r}")
    axes = tuple(cells.get(a, "*") for a in AXES)
    for a, s in zip(AXES, axes):
        if s not in known_specs(a):
            raise ValueError(f"cells[{a!r}] must be one of {known_specs(a)}, got {s!r}")
    shape, matrix = query_matrix(axes)
    labels = [axis_partition(a, s).labels for a, s in zip(AXES, axes)]
    index = pd.MultiIndex.from_product(labels, names=list(AXES))
    kept = [a for a, s in zip(AXES, axes) if s != "*"]
    index = index.droplevel([a for a in AXES if a not in kept]) if kept else pd.Index(["total"], name="cell")
    return Coarsening(axes, index, matrix)


def _groups(query: scipy.sparse.csr_array, coarse: scipy.sparse.csr_array):
    """The usable groups of a query's cells: [(query cells, coarse cells)], and the number of
    query cells in groups that do not cover their coarse cells (module docstring)."""
    k = query.shape[0]
    query, coarse = query.astype(np.int32), coarse.astype(np.int32)  # int8 products overflow
    link = (query @ coarse.T) > 0  # (k, C)
    graph = scipy.sparse.bmat([[None, link], [link.T, None]], format="csr")
    n, label = connected_components(graph, directed=False)
    q_label, c_label = label[:k], label[k:]
    covered = np.asarray(query.sum(0)).reshape(-1) > 0
    groups, unusable = [], 0
    for g in np.unique(q_label):
        rows = np.flatnonzero(q_label == g)
        cells = np.flatnonzero(c_label == g)
        fine = np.asarray(coarse[cells].sum(0)).reshape(-1) > 0
        if np.all(covered[fine]) and np.array_equal(fine, np.asarray(query[rows].sum(0)).reshape(-1) > 0):
            groups.append((rows, cells))
        else:
            unusable += rows.size
    return groups, unusable


@dataclass(frozen=True)
class CensusTable:
    """Coarse counts on the leaves and the release of every usable measurement and constraint
    (module docstring). ``leaves``: the leaf geocodes (the counts' rows), ``cells`` the coarse
    cells (columns), ``areas`` (geocode, level, parent) of the tree, ``usage`` one row per
    (level, query, kind) with what was used."""

    release: NestedMeasurements
    leaf_level: str
    leaves: pd.Index
    cells: pd.Index
    coarse: Coarsening
    areas: pd.DataFrame
    usage: pd.DataFrame

    @property
    def coords(self) -> dict:
        """PyMC coords for counts of shape (leaves, cells): {"geocode": ..., "cell": ...}."""
        return {"geocode": list(self.leaves), "cell": [" x ".join(map(str, c)) if isinstance(c, tuple) else str(c)
                                                       for c in self.cells]}

    def aggregate(self, geocodes, cell_index, counts) -> np.ndarray:
        """(n_leaves, n_cells) int64: histogram counts given in long form (the geocode of a
        geounit at or below the leaves, the histogram cell 0..2015, the count) summed to the
        leaves and the coarse cells (e.g. a synthetic file's truth). Rows of states the table
        does not hold (their State geocode, the first 3 characters, is no leaf's: the truth of
        a whole synthetic nation given to a table of some of its states) are left out; any
        other geocode under no leaf is an error, and so is a table of none of the rows."""
        geocodes = np.asarray(geocodes).astype(str)
        width = len(self.leaves[0])
        leaf = self.leaves.get_indexer([g[:width] for g in geocodes])
        states = {g[:3] for g in self.leaves} if width >= 3 else set()
        elsewhere = np.array([width >= 3 and g[:3] not in states for g in geocodes], dtype=bool)
        if np.any((leaf < 0) & ~elsewhere):
            raise ValueError(f"geocodes {sorted(map(str, set(geocodes[(leaf < 0) & ~elsewhere])))[:3]} lie under "
                             "no leaf of the table")
        if geocodes.size and elsewhere.all():
            raise ValueError(f"none of the geocodes is of the table's states {sorted(states)}: e.g. "
                             f"{sorted(map(str, set(geocodes)))[:3]}")
        keep = ~elsewhere
        cell = self.coarse.matrix.toarray().argmax(axis=0)[np.asarray(cell_index, dtype=np.int64)[keep]]
        out = np.zeros((len(self.leaves), self.coarse.n_cells), dtype=np.int64)
        np.add.at(out, (leaf[keep], cell), np.asarray(counts, dtype=np.int64)[keep])
        return out


def census_table(nmf, leaf_level: str, cells="pl94-28") -> CensusTable:
    """The release of the coarse counts of ``cells`` on the geounits of ``leaf_level`` from the
    files ``nmf`` read (module docstring)."""
    if leaf_level not in nmf.levels:
        raise ValueError(f"leaf_level must be one of the levels read {nmf.levels}, got {leaf_level!r}")
    coarse = coarsening(cells)
    used_levels = [lv for lv in LEVELS if lv in nmf.levels and LEVELS.index(lv) <= LEVELS.index(leaf_level)]
    nation = ""  # why the US rows are set aside, if they are
    if used_levels[0] == "US" and len(used_levels) > 1 and nmf.other_states:
        nation = f"the files hold states {list(nmf.other_states)} not read"
        used_levels = used_levels[1:]
    # the tree: geounits top down, parents by the reader's prefix rule
    geocodes, level_of, parent = [], [], []
    index: dict = {}
    top = nmf.geography[used_levels[0]]
    if len(top.geocodes) > 1:
        geocodes.append("")
        level_of.append("(all)")
        parent.append(-1)
    for lv in used_levels:
        geo = nmf.geography[lv]
        for j, g in enumerate(geo.geocodes):
            index[(lv, g)] = len(geocodes)
            geocodes.append(g)
            level_of.append(lv)
            if lv == used_levels[0]:
                parent.append(0 if len(top.geocodes) > 1 else -1)
            else:
                parent.append(index[(geo.parent_level, geo.parents[j])])
    leaf_geo = nmf.geography[leaf_level].geocodes
    leaf_areas = [index[(leaf_level, g)] for g in leaf_geo]
    release = NestedMeasurements(parent, leaf_areas, coarse.n_cells, cell_shape=coarse.shape,
                                 area_names=[f"{lv} {g}" if g else lv for lv, g in zip(level_of, geocodes)])
    usage = []
    for (lv, query), rows in nmf.dpqueries.items():
        unknown = "" if query in PL94_QUERIES else "not a PL94 query of the layout, used as its axis specs say: "
        if lv == "US" and nation:
            usage.append(_usage(lv, query, "measurement", f"not used: the nation's measurement; {nation}",
                                0, rows.values.size))
            continue
        if lv not in used_levels:
            usage.append(_usage(lv, query, "measurement", "not used: below the leaves", 0, 0))
            continue
        groups, unusable = _groups(rows.matrix, coarse.matrix)
        areas = np.array([index[(lv, g)] for g in rows.geocodes])
        if groups:
            mask = np.zeros((len(groups), coarse.n_cells), bool)
            for j, (_, c) in enumerate(groups):
                mask[j, c] = True
            values = np.stack([rows.values[:, q].sum(1) for q, _ in groups], axis=1)
            summed = np.array([q.size for q, _ in groups])
            release.measure(f"{lv}/{query}", areas, mask, values, rows.variance, summed=summed)
        how = ("as is" if groups and summed.max() == 1 else
               f"summed ({summed.min()}-{summed.max()} published cells per term)" if groups else "")
        if unusable:
            how = (how + "; " if how else "") + f"{unusable} query cells not a query of the coarse cells: not used"
        usage.append(_usage(lv, query, "measurement", unknown + how, len(groups) * len(areas), rows.values.size))
    for lv in nmf.levels:
        con = nmf.constraints(lv)
        if con.geocodes.size == 0:
            continue
        if lv == "US" and nation:
            for qi, axes in enumerate(con.query_axes):
                usage.append(_usage(lv, "+".join(axes), "constraint", f"not used: the nation's constraint; {nation}",
                                    0, int(np.sum(con.query_index == qi))))
            continue
        if lv not in used_levels:
            usage.append(_usage(lv, "(constraints)", "constraint", "not used: below the leaves", 0, con.geocodes.size))
            continue
        for qi, axes in enumerate(con.query_axes):
            take = np.flatnonzero(con.query_index == qi)
            names = sorted(name for (level, name), q in nmf.constraint_rows.items()
                           if level == lv and q.axes == axes and name not in PL94_CONSTRAINTS)
            unknown = f"{names} not PL94 constraints of the layout, used as their axis specs say: " if names else ""
            _, qmatrix = query_matrix(axes)
            groups, unusable = _groups(qmatrix, coarse.matrix)
            geos = np.unique(con.geocodes[take])
            n_terms = 0
            for q, c in groups:
                mask = np.zeros((1, coarse.n_cells), bool)
                mask[0, c] = True
                lower = np.zeros(geos.size)
                upper = np.zeros(geos.size)
                for cell in q:  # sum the rows of the group's query cells, geounit by geounit
                    sel = take[con.cell[take] == cell]
                    pos = np.searchsorted(geos, con.geocodes[sel])
                    np.add.at(lower, pos, con.lower[sel])
                    np.add.at(upper, pos, con.upper[sel])
                areas = np.array([index[(lv, g)] for g in geos])
                eq = lower == upper
                name = f"{lv}/{'+'.join(map(str, axes))}"
                if np.any(eq):
                    release.equal(f"{name} (=)", areas[eq], mask, lower[eq].reshape(-1, 1))
                lo = ~eq & (lower > 0)
                if np.any(lo):
                    release.at_least(f"{name} (>=)", areas[lo], mask, lower[lo].reshape(-1, 1))
                hi = ~eq & np.isfinite(upper)
                if np.any(hi):
                    release.at_most(f"{name} (<=)", areas[hi], mask, upper[hi].reshape(-1, 1))
                n_terms += int(eq.sum() + lo.sum() + hi.sum())
            how = f"{len(groups)} groups of query cells as equalities and bounds" if groups else ""
            if unusable:
                how = (how + "; " if how else "") + f"{unusable} query cells not a query of the coarse cells: not used"
            usage.append(_usage(lv, "+".join(axes), "constraint", unknown + how, n_terms, take.size))
    areas = pd.DataFrame({"geocode": geocodes, "level": level_of, "parent": parent})
    return CensusTable(release, leaf_level, pd.Index(leaf_geo, name="geocode"), coarse.cells, coarse, areas,
                       pd.DataFrame.from_records(usage))


def _usage(level, query, kind, how, terms, published) -> dict:
    return {"level": level, "query": query, "kind": kind, "used": how, "terms": terms, "published": published}
