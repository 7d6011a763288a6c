r"""Measurements of latent counts at every level of a tree of areas, as one release.

The 2020 Census noisy measurement files (:mod:`dpinfer.io.nmf`) measure one histogram at the
nation, states, counties, tracts, block groups and blocks, with exact equalities and published
bounds. With latent counts x[l, c] on the leaf areas l (cells c of the histogram, or of a
coarsening of it) and area sums S_{v,c} = sum_{l under v} x[l, c], each published number is a
**term**

* a measurement y = sum_{c in cells} S_{v,c} + e, e the sum of ``summed`` independent discrete
  Gaussians N_Z(0, sigma^2) (``summed`` = 1: one published count; more: published counts of a
  finer query added up to the coarser cells, see below);
* an equality sum_{c in cells} S_{v,c} = y (an invariant; y = 0 on a set of cells is a
  structural zero);
* a bound sum_{c in cells} S_{v,c} <= y or >= y.

The likelihood of the release given x is the product of the terms' weights
(:mod:`dpinfer.lattice.nested.terms`):

    p(y | x) = prod_measurements f_{sigma^2, summed}(y - t(x)) * 1{equalities and bounds hold}.

**Summing finer measurements.** A measurement of a query finer than the analyst's cells (63
race codes where the model has 7 race groups) is summed to the cells: y_g = sum_{j in g} y_j =
t_g(x) + sum_{j in g} e_j, whose noise is the sum of |g| discrete Gaussians. Conditioning on the
sums (a statistic of the release) instead of the published counts keeps the posterior valid:
p(x | sums) is the posterior given less data, not an approximation of p(x | y). What it gives up
is the information in the split of each sum, i.e. about the finer cells' counts, which the coarse
model does not have; for the coarse counts themselves the split carries information only
through the prior's non-negativity of the finer counts.

:class:`NestedMeasurements` holds the tree, the terms and their names, gives the log-likelihood
(numpy), and ``observe`` adds it to a PyMC model for latent counts of shape (n_leaves,
n_cells). ``dpinfer.sample`` then draws the counts with exact sum-tree moves
(:mod:`dpinfer.lattice.nested`) on the compiled engine.
"""

from __future__ import annotations

import numbers

import numpy as np

from dpinfer._validation import as_integer_array, as_real_array, check_count
from dpinfer.lattice.nested.structure import NestedSums, tree_of
from dpinfer.lattice.nested.terms import TermTables


MAX_CELLS = 2**20  # cells per area (the detailed histogram of the 2020 files has 2,016)
MAX_SUMMED = 10_000  # published counts added up to one query cell (the detailed histogram has 2,016)


class NestedMeasurements:
    """Terms over the area sums of counts on a tree's leaves (module docstring).

    ``parent[v]``: area v's parent (-1 for the root); ``leaves``: the areas of the counts'
    rows, in order; ``n_cells``: the counts' columns; ``area_names`` (optional): a label per
    area for messages and tables; ``cell_shape`` (optional): the cells as a product of axes in
    C order (e.g. (2, 2, 7)), whose interaction moves the sampler then makes
    (:mod:`dpinfer.lattice.nested.directions`). Add terms with :meth:`measure`, :meth:`equal`,
    :meth:`at_most`, :meth:`at_least` and :meth:`zero`; they are frozen at the first call of
    :attr:`sums` (or ``observe``)."""

    discrete = True
    keeps_invariants = False

    def __init__(self, parent, leaves, n_cells: int, *, area_names=None, cell_shape=None):
        self.parent = as_integer_array("parent", parent).reshape(-1)
        self.leaves = as_integer_array("leaves", leaves).reshape(-1)
        tree_of(self.parent, self.leaves)  # one tree, its leaves each once (errors name them)
        self.n_cells = check_count("n_cells", n_cells, 1)
        if self.n_cells > MAX_CELLS:
            raise ValueError(f"n_cells must be 1 .. {MAX_CELLS:,} (the cells of one area's histogram), got {n_cells!r}")
        self.cell_shape = _cell_shape(cell_shape, self.n_cells)
        self.area_names = (_names("area_names", area_names, self.parent.size) if area_names is not None
                           else np.arange(self.parent.size).astype(str).astype(object))
        self.tables = TermTables()
        self._terms: list[tuple] = []  # (areas, cells mask (R, C), values, table ids, names)
        self._sums: NestedSums | None = None
        self.releases: list[dict] = []  # one entry per measure() call: name, sigma2, rows

    # ---- adding terms -------------------------------------------------------------------------
    def _cells(self, cells) -> np.ndarray:
        if isinstance(cells, (str, bytes)) or not hasattr(cells, "__len__") or len(cells) == 0:
            raise TypeError(f"cells must be a (k, {self.n_cells}) bool mask or a non-empty list of k lists of "
                            f"cell indices, got {cells!r}")
        ragged = not isinstance(cells, np.ndarray) and len({np.size(g) for g in cells}) > 1
        if not ragged and np.asarray(cells).dtype == bool:
            mask = np.atleast_2d(np.asarray(cells))
        else:  # a list of cell index lists, one per query cell (of any lengths)
            mask = np.zeros((len(cells), self.n_cells), bool)
            for j, group in enumerate(cells):
                index = as_integer_array("cells", group).reshape(-1)
                if np.any((index < 0) | (index >= self.n_cells)):
                    raise ValueError(f"cells must hold cell indices 0 .. {self.n_cells - 1}; query cell {j} "
                                     f"has {index[(index < 0) | (index >= self.n_cells)][:3].tolist()}")
                mask[j, index] = True
        if mask.ndim != 2 or mask.shape[1] != self.n_cells:
            raise ValueError(f"cells must select among the {self.n_cells} cells, got a mask of width {mask.shape[1]}")
        if not np.all(mask.any(1)):
            raise ValueError("every query cell must sum at least one cell")
        return mask

    def _areas(self, areas) -> np.ndarray:
        areas = as_integer_array("areas", areas).reshape(-1)
        if np.any((areas < 0) | (areas >= self.parent.size)):
            raise ValueError(f"areas must be area indices 0 .. {self.parent.size - 1}")
        return areas

    def _add(self, name: str, areas, cells, values, tables, cell_names=None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string (the terms' label), got {name!r}")
        if self._sums is not None:
            raise RuntimeError("the terms are frozen once the release is used; add every term first")
        areas, mask = self._areas(areas), self._cells(cells)
        values = as_real_array(f"{name}: values", values)
        if values.shape != (areas.size, mask.shape[0]):
            raise ValueError(f"{name}: values must have shape (areas, query cells) = "
                             f"{(areas.size, mask.shape[0])}, got {values.shape}")
        if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
            raise ValueError(f"{name}: values must be whole numbers")
        tables = np.broadcast_to(np.asarray(tables, dtype=np.int64), values.shape)
        n, k = values.shape
        cell_names = ([f"query cell {j}" for j in range(k)] if cell_names is None
                      else _names(f"{name}: cell_names", cell_names, k))
        labels = np.array([f"{name} [{self.area_names[a]}, {cell_names[j]}]" for a in areas for j in range(k)],
                          dtype=object)
        self._terms.append((np.repeat(areas, k), np.tile(mask, (n, 1)), values.astype(np.int64).reshape(-1),
                            tables.reshape(-1), labels))

    def measure(self, name: str, areas, cells, values, sigma2, summed=1, *, cell_names=None) -> None:
        """Noisy measurements y[i, j] = sum of cells[j] at areas[i] + e, e the sum of
        ``summed[j]`` discrete Gaussians N_Z(0, sigma2[i]). ``cells``: a (k, n_cells) bool mask
        or k lists of cell indices; ``values`` (n_areas, k); ``sigma2`` a scalar or (n_areas,);
        ``cell_names`` (optional): k labels of the query cells for the terms' names (default
        "query cell j"), which messages quote."""
        areas = self._areas(areas)
        k = self._cells(cells).shape[0]
        sigma2 = _broadcast(f"{name}: sigma2", as_real_array(f"{name}: sigma2", sigma2), (areas.size,), "areas")
        summed = _broadcast(f"{name}: summed", as_integer_array(f"{name}: summed", summed), (k,), "query cells")
        bad = sigma2 <= 0
        if np.any(bad):
            raise ValueError(f"{name}: sigma2 must be finite and > 0, got {sigma2[bad][0]!r} at row "
                             f"{int(np.flatnonzero(bad)[0])}")
        if np.any(summed < 1) or np.any(summed > MAX_SUMMED):
            raise ValueError(f"{name}: summed must be 1 .. {MAX_SUMMED} (published counts added up) for every "
                             "query cell")
        try:
            tables = np.array([[self.tables.add_discrete_gaussian(s, m) for m in summed] for s in sigma2],
                              dtype=np.int64).reshape(areas.size, k)
        except ValueError as err:  # a variance too large for its noise table
            raise ValueError(f"{name}: {err}") from None
        self._add(name, areas, cells, values, tables, cell_names)
        self.releases.append({"name": name, "sigma2": sigma2.copy(), "summed": summed.copy(),
                              "areas": areas.size, "query_cells": k})

    def equal(self, name: str, areas, cells, values, *, cell_names=None) -> None:
        """Exact equalities: sum of cells[j] at areas[i] == values[i, j] (``cell_names`` as in
        :meth:`measure`)."""
        self._add(name, areas, cells, values, self.tables.add_equality(), cell_names)

    def zero(self, name: str, areas, cells) -> None:
        """Structural zeros: every count of ``cells`` under ``areas`` is 0 (an equality to 0)."""
        mask = self._cells(cells)
        self.equal(name, areas, mask, np.zeros((np.size(areas), mask.shape[0]), np.int64))

    def at_most(self, name: str, areas, cells, values) -> None:
        """Bounds: sum of cells[j] at areas[i] <= values[i, j]."""
        self._add(name, areas, cells, values, self.tables.add_at_most())

    def at_least(self, name: str, areas, cells, values) -> None:
        """Bounds: sum of cells[j] at areas[i] >= values[i, j]."""
        self._add(name, areas, cells, values, self.tables.add_at_least())

    # ---- the frozen structure -----------------------------------------------------------------
    @property
    def sums(self) -> NestedSums:
        """The terms as :class:`~dpinfer.lattice.nested.structure.NestedSums` (freezes them)."""
        if self._sums is None:
            if not self._terms:
                raise ValueError("the release has no terms: add measurements first")
            area, cells, value, table, name = (np.concatenate(p) for p in zip(*self._terms))
            self._sums = NestedSums(self.parent, self.leaves, self.n_cells, area, cells, value, table,
                                    self.tables, name, self.cell_shape)
        return self._sums

    @property
    def values(self) -> np.ndarray:
        """The terms' values y (in the order of :attr:`sums`)."""
        return self.sums.term_value

    def release(self, counts, rng: np.random.Generator) -> np.ndarray:
        """A new release of the counts x (n_leaves, n_cells), in the order of :attr:`values`: each
        measurement is its sum plus ``summed`` exact discrete Gaussian draws
        (:func:`~dpinfer.mechanisms.exact_sampling.sample_discrete_gaussian`), each equality its
        sum; bounds keep their published value (they are facts about the data, not noise), and a
        count vector that breaks one is refused."""
        from dpinfer.mechanisms.exact_sampling import sample_discrete_gaussian

        sums = self.sums
        t = sums.term_sums(counts)
        measured, equal, at_most, at_least, _ = sums.term_kinds()
        out = sums.term_value.copy()
        out[equal] = t[equal]
        broken = (at_most & (t > out)) | (at_least & (t < out))
        if np.any(broken):
            raise ValueError(f"the counts break the bounds {sorted(set(sums.term_name[broken]))[:5]}")
        for table in np.unique(sums.term_table[measured]):
            rows = np.flatnonzero(measured & (sums.term_table == table))
            _, sigma2, m = sums.tables.params(int(table))
            noise = sample_discrete_gaussian(np.sqrt(sigma2), (rows.size, m), rng).sum(axis=1)
            out[rows] = t[rows] + noise
        return out

    def log_likelihood(self, counts) -> float:
        """log p(y | x) = sum of the terms' log weights at counts x (n_leaves, n_cells)."""
        return self.sums.log_weight(counts)

    def __repr__(self) -> str:
        s = self._sums
        terms = s.term_value.size if s is not None else sum(t[2].size for t in self._terms)
        return (f"NestedMeasurements({self.parent.size} areas, {self.leaves.size} leaves x "
                f"{self.n_cells} cells, {terms} terms)")

    # ---- PyMC ---------------------------------------------------------------------------------
    def observe(self, name: str, counts, values=None, *, model=None):
        """Add the release to the current PyMC model as an observed variable of the latent
        counts ``counts`` (shape (n_leaves, n_cells)), and record it for ``dpinfer.sample``.
        ``values``: the terms' values in the order of :attr:`values` (default: those given to
        the builder), or a ``pm.Data`` of them, which ``pm.set_data`` can replace between fits
        (a simulation study refits one model; make it float64 where values exceed 2^31 - 1, as
        PyMC stores integer data as int32)."""
        import pymc as pm

        from dpinfer._graphs import observed_integers, shape_of
        from dpinfer.mechanisms.guard import install as install_guard
        from dpinfer.mechanisms.records import check_latent_type, latent_candidates, record_release

        model = pm.modelcontext(model)
        check_latent_type(model, counts, self, name)
        sums = self.sums
        shape = tuple(shape_of(counts))
        if shape != (sums.n_leaves, sums.n_cells):
            raise ValueError(f"counts must have shape (n_leaves, n_cells) = {(sums.n_leaves, sums.n_cells)}, "
                             f"got {shape}")
        term_sums, logp = _symbolic_terms(sums)
        rv = pm.CustomDist.dist(term_sums(counts), logp=logp, dtype="int64", class_name="NestedMeasurements")
        if values is None:
            values = sums.term_value
        current = values.get_value() if hasattr(values, "get_value") else np.asarray(values)
        if np.shape(current) != sums.term_value.shape:
            raise ValueError(f"values must hold one value per term ({sums.term_value.size}), got shape "
                             f"{np.shape(current)}")
        rv = model.register_rv(rv, name, observed=observed_integers(values))
        if hasattr(counts, "owner"):
            latents = latent_candidates(model, counts)
            if len(latents) == 1:
                latents[0].tag.dpinfer_release = name
                install_guard()
        record_release(model, name=name, release_rv=rv, latent=counts, mechanism=self)
        return rv


def _symbolic_terms(sums: NestedSums):
    """(term_sums(x), logp(value, t)) as PyTensor graphs: the terms' sums t of the counts x
    (the leaves reordered so that every area's leaves are contiguous, area sums as differences
    of cumulative sums) and each term's log weight at e = value - t (elementwise)."""
    import pytensor.tensor as pt

    order, start, stop = _contiguous_leaves(sums)
    meta, inv2v, values = sums.tables.arrays()
    table = sums.term_table
    lo, n, off = meta[table, 0], meta[table, 1], meta[table, 2]
    left, right = meta[table, 3], meta[table, 4]
    cells = sums.term_cells.astype(np.int64)

    def term_sums(x):
        cum = pt.concatenate([pt.zeros((1, sums.n_cells), dtype="int64"),
                              pt.cumsum(pt.as_tensor(x)[order], axis=0)], axis=0)
        S = cum[stop] - cum[start]  # (n_areas, n_cells)
        return pt.sum(S[sums.term_area] * cells, axis=1)

    def logp(value, t):
        e = value - t
        j = e - lo
        inside = (j >= 0) & (j < n)
        jc = pt.clip(j, 0, n - 1)
        w = pt.as_tensor(values)[off + jc]
        edge = lo + jc
        gauss = w - (pt.cast(e, "float64") ** 2 - pt.cast(edge, "float64") ** 2) * inv2v[table]
        mode = pt.switch(j < 0, left, right)
        return pt.switch(inside, w, pt.switch(pt.eq(mode, 0), -np.inf, pt.switch(pt.eq(mode, 1), w, gauss)))

    return term_sums, logp


def _contiguous_leaves(sums: NestedSums):
    """(order, start, stop): a depth-first order of the leaves, and each area's range in it."""
    n = sums.n_areas
    start = np.zeros(n, np.int64)
    stop = np.zeros(n, np.int64)
    order = []
    root = int(sums.order[-1])
    stack = [(root, False)]
    while stack:
        v, done = stack.pop()
        if done:
            stop[v] = len(order)
            continue
        start[v] = len(order)
        stack.append((v, True))
        if sums.area_leaf[v] >= 0:
            order.append(int(sums.area_leaf[v]))
        children = sums.child_area[sums.child_ptr[v]:sums.child_ptr[v + 1]]
        stack.extend((int(c), False) for c in children[::-1])
    return np.array(order, np.int64), start, stop


def _cell_shape(cell_shape, n_cells: int) -> tuple | None:
    """None, or positive whole axis lengths whose product is ``n_cells``."""
    if cell_shape is None:
        return None
    if isinstance(cell_shape, (str, bytes)) or not hasattr(cell_shape, "__iter__"):
        raise TypeError(f"cell_shape must be None or a tuple of axis lengths, got {cell_shape!r}")
    axes = tuple(cell_shape)
    if not axes or not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) and a >= 1 for a in axes):
        raise ValueError(f"cell_shape must hold whole axis lengths >= 1, got {cell_shape!r}")
    if int(np.prod(axes, dtype=object)) != n_cells:
        raise ValueError(f"cell_shape {axes} must multiply to n_cells = {n_cells}")
    return tuple(int(a) for a in axes)


def _names(what: str, names, n: int) -> np.ndarray:
    """``n`` labels (a sequence, not a string), as an object array."""
    if isinstance(names, (str, bytes)) or not hasattr(names, "__len__"):
        raise TypeError(f"{what} must be a sequence of {n} labels, got {names!r}")
    out = np.asarray(list(names), dtype=object).reshape(-1)
    if out.size != n:
        raise ValueError(f"{what} must hold {n} labels, got {out.size}")
    return out


def _broadcast(what: str, values: np.ndarray, shape: tuple, per: str) -> np.ndarray:
    try:
        return np.broadcast_to(values, shape)
    except ValueError:
        raise ValueError(f"{what} must be a scalar or one value per {per} {shape}, got shape "
                         f"{values.shape}") from None
