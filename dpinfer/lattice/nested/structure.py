"""The data of nested sums: a tree of areas, the latent counts on its leaves, and the terms.

:class:`NestedSums` is what the kernels (:mod:`dpinfer.lattice.nested.kernel`) read: the tree
in arrays (parents, children, a bottom-up order), the counts' leaves, and the terms sorted by
area with the cells each one sums and its table (:mod:`dpinfer.lattice.nested.terms`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpinfer.lattice.nested.terms import TermTables


@dataclass(frozen=True)
class NestedSums:
    """Counts x (n_leaves, n_cells) on the leaves of a tree of areas, and terms
    w_r(y_r - sum_{c in cells_r} S_{area_r, c}) with S_{v, c} = sum of x[l, c] over the leaves
    l under area v.

    ``parent[v]`` is area v's parent (-1 for the one root), ``leaf_area[l]`` the area of the
    counts' row l; every area without children is a leaf. Terms: ``term_area`` (R,),
    ``term_cells`` (R, n_cells) bool, ``term_value`` (R,) int64, ``term_table`` (R,) indices
    into ``tables``; ``term_name`` (R,) says where each term came from (for messages).
    ``cell_shape``: the cells as a product of axes, which sets the sweep's directions
    (:mod:`dpinfer.lattice.nested.directions`); default one axis of n_cells."""

    parent: np.ndarray
    leaf_area: np.ndarray
    n_cells: int
    term_area: np.ndarray
    term_cells: np.ndarray
    term_value: np.ndarray
    term_table: np.ndarray
    tables: TermTables
    term_name: np.ndarray
    cell_shape: tuple | None = None  # the cells as a product of axes (C order); None: one axis
    # derived (see __post_init__)
    order: np.ndarray = field(init=False, repr=False)  # areas, children before parents
    child_ptr: np.ndarray = field(init=False, repr=False)
    child_area: np.ndarray = field(init=False, repr=False)
    area_leaf: np.ndarray = field(init=False, repr=False)  # leaf row of an area, -1 inside
    term_ptr: np.ndarray = field(init=False, repr=False)  # terms of area v: term_ptr[v]:term_ptr[v+1]

    def __post_init__(self):
        parent = np.asarray(self.parent, dtype=np.int64).reshape(-1)
        leaf_area = np.asarray(self.leaf_area, dtype=np.int64).reshape(-1)
        order, children, child_ptr, area_leaf = tree_of(parent, leaf_area)
        term_area = np.asarray(self.term_area, dtype=np.int64).reshape(-1)
        by_area = np.argsort(term_area, kind="stable")
        cells = np.asarray(self.term_cells, dtype=bool).reshape(term_area.size, int(self.n_cells))
        set_ = object.__setattr__
        shape = (int(self.n_cells),) if self.cell_shape is None else tuple(int(k) for k in self.cell_shape)
        if int(np.prod(shape)) != int(self.n_cells) or min(shape) < 1:
            raise ValueError(f"cell_shape {self.cell_shape!r} must multiply to n_cells = {self.n_cells}")
        set_(self, "cell_shape", shape)
        set_(self, "parent", parent)
        set_(self, "leaf_area", leaf_area)
        set_(self, "term_area", term_area[by_area])
        set_(self, "term_cells", np.ascontiguousarray(cells[by_area]))
        set_(self, "term_value", np.asarray(self.term_value, dtype=np.int64).reshape(-1)[by_area])
        set_(self, "term_table", np.asarray(self.term_table, dtype=np.int64).reshape(-1)[by_area])
        set_(self, "term_name", np.asarray(self.term_name, dtype=object).reshape(-1)[by_area])
        set_(self, "order", order)
        set_(self, "child_ptr", child_ptr)
        set_(self, "child_area", children.astype(np.int64))
        set_(self, "area_leaf", area_leaf)
        set_(self, "term_ptr", np.searchsorted(self.term_area, np.arange(parent.size + 1)).astype(np.int64))
        self._check_equalities()

    @property
    def n_areas(self) -> int:
        return self.parent.size

    @property
    def n_leaves(self) -> int:
        return self.leaf_area.size

    def term_kinds(self) -> tuple:
        """(measured, equal, at_most, at_least, variance) per term: a noisy measurement (GAUSS
        ends), an equality, t <= y, t >= y, and each measurement's noise variance
        1/(2 inv2v) = summed * sigma^2 (inf for the exact terms)."""
        meta, inv2v, _ = self.tables.arrays()
        left, right = meta[self.term_table, 3], meta[self.term_table, 4]
        measured = (left == 2) & (right == 2)
        with np.errstate(divide="ignore"):
            variance = np.where(measured, 1.0 / (2.0 * inv2v[self.term_table]), np.inf)
        return (measured, (left == 0) & (right == 0), (left == 0) & (right == 1),
                (left == 1) & (right == 0), variance)

    def leaves_under(self) -> list:
        """For each area, the leaf rows under it (int64 arrays)."""
        under = [[] for _ in range(self.n_areas)]
        for leaf, area in enumerate(self.leaf_area):
            v = int(area)
            while v >= 0:
                under[v].append(leaf)
                v = int(self.parent[v])
        return [np.array(u, dtype=np.int64) for u in under]

    def with_values(self, values) -> "NestedSums":
        """The same tree and terms with the terms' values replaced (``values`` in the order of
        ``term_value``), e.g. a new release of the same design."""
        values = np.asarray(values).reshape(-1)
        if values.shape != self.term_value.shape or np.any(values != np.round(values)):
            raise ValueError(f"values must be {self.term_value.size} whole numbers, one per term")
        new = object.__new__(NestedSums)
        new.__dict__.update(self.__dict__)
        object.__setattr__(new, "term_value", values.astype(np.int64))
        return new

    def with_group_mixing(self, areas, alpha=1.0, leaf_alpha=1.0, mean=1.0) -> tuple["NestedSums", np.ndarray]:
        """(the same tree and terms plus a group-mixing factor on every cell's sum at each of
        ``areas`` (G,), the table index of each (G, n_cells)): the prior's factor of
        :func:`dpinfer.distributions.GroupedNegativeBinomial`
        (:meth:`~dpinfer.lattice.nested.terms.TermTables.add_group_mixing`), at the
        parameters ``alpha``, ``leaf_alpha``, ``mean`` (each broadcast to (G, n_cells); the
        compiled engine rewrites them from the model's before every sweep). The tables are
        added to a copy: this structure is unchanged."""
        areas = np.asarray(areas, dtype=np.int64).reshape(-1)
        if np.any((areas < 0) | (areas >= self.n_areas)):
            raise ValueError(f"areas must be areas of the tree (0 .. {self.n_areas - 1})")
        tables = self.tables.copy()
        G, C = areas.size, self.n_cells
        a, b, m = (np.broadcast_to(np.asarray(v, dtype=float), (G, C)) for v in (alpha, leaf_alpha, mean))
        index = np.array([[tables.add_group_mixing(a[g, c], b[g, c], m[g, c]) for c in range(C)]
                          for g in range(G)], dtype=np.int64).reshape(G, C)
        cells = np.zeros((G * C, C), dtype=bool)
        cells[np.arange(G * C), np.tile(np.arange(C), G)] = True
        names = np.array([f"group mixing: area {v}, cell {c}" for v in areas for c in range(C)], dtype=object)
        sums = NestedSums(self.parent, self.leaf_area, self.n_cells,
                          np.concatenate([self.term_area, np.repeat(areas, C)]),
                          np.concatenate([self.term_cells, cells]),
                          np.concatenate([self.term_value, np.zeros(G * C, np.int64)]),
                          np.concatenate([self.term_table, index.reshape(-1)]), tables,
                          np.concatenate([self.term_name, names]), self.cell_shape)
        return sums, index

    def split(self, parts) -> "SplitSums":
        """The tree cut into shards and the upper areas that join them (:class:`SplitSums`).

        ``parts`` lists, for each shard, areas whose subtrees it holds (e.g. counties), all
        children of one area (a part of several gets a root of its own above them, with no
        terms); the parts' subtrees must be disjoint and cover every leaf. Each shard keeps its
        areas' terms; the upper areas (every area above the parts) keep theirs and have one leaf
        per shard, whose counts are the shard root's sums. A move along a direction is then a
        shard's upward pass (:func:`~dpinfer.lattice.nested.kernel.root_message`), the upper
        areas' move with those messages as their leaves'
        (:func:`~dpinfer.lattice.nested.kernel.with_injected`), and each shard's split of the
        sum it was given (:func:`~dpinfer.lattice.nested.kernel.move_from_root`): the same law
        as the whole tree's move (the sum tree's passes, regrouped)."""
        if isinstance(parts, (str, bytes)) or not all(np.atleast_1d(np.asarray(part)).dtype.kind in "iu"
                                                      for part in parts):
            raise TypeError(f"parts must be a list of lists of area indices (integers), got {parts!r}")
        parts = [np.atleast_1d(np.asarray(part, dtype=np.int64)) for part in parts]
        if not parts or any(part.size == 0 for part in parts):
            raise ValueError("parts must be a non-empty list of non-empty lists of areas")
        n = self.n_areas
        for part in parts:
            if np.any((part < 0) | (part >= n)):
                raise ValueError(f"parts hold areas out of range (0 .. {n - 1}): {part.tolist()}")
            if np.unique(self.parent[part]).size != 1 or self.parent[part[0]] < 0:
                raise ValueError(f"the areas of a part must be children of one area (not the root); "
                                 f"{part.tolist()} have parents {np.unique(self.parent[part]).tolist()}")
        owner = np.full(n, -1, dtype=np.int64)  # the shard an area belongs to
        for k, part in enumerate(parts):
            for v in part:
                if owner[v] >= 0:
                    raise ValueError(f"area {int(v)} is in two parts")
                owner[v] = k
        for v in self.order[::-1]:  # parents before children: inherit the part's shard
            p = self.parent[v]
            if p >= 0 and owner[p] >= 0:
                if owner[v] >= 0 and owner[v] != owner[p]:
                    raise ValueError(f"area {int(v)} is in a part and under another part's area {int(p)}")
                owner[v] = owner[p]
        if np.any(owner[self.leaf_area] < 0):
            bad = np.flatnonzero(owner[self.leaf_area] < 0)[:5]
            raise ValueError(f"parts must cover every leaf; leaves {bad.tolist()} lie under none")
        shards, shard_leaves, shard_areas = [], [], []
        for k, part in enumerate(parts):
            areas = np.flatnonzero(owner == k)
            shard_areas.append(np.append(areas, -1) if part.size > 1 else areas)
            extra = part.size > 1  # a root of its own above the part's areas
            index = np.full(n, -1, dtype=np.int64)
            index[areas] = np.arange(areas.size)
            parent = np.where(np.isin(areas, part), areas.size if extra else -1, index[self.parent[areas]])
            if extra:
                parent = np.append(parent, -1)
            leaves = np.flatnonzero(owner[self.leaf_area] == k)
            shards.append(self._restricted(parent, index[self.leaf_area[leaves]], index, owner == k))
            shard_leaves.append(leaves)
        upper = np.flatnonzero(owner < 0)
        index = np.full(n, -1, dtype=np.int64)
        index[upper] = np.arange(upper.size)
        joins = np.array([self.parent[part[0]] for part in parts], dtype=np.int64)
        parent = np.concatenate([np.where(self.parent[upper] < 0, -1, index[self.parent[upper]]), index[joins]])
        top = self._restricted(parent, upper.size + np.arange(len(parts)), index, owner < 0)
        return SplitSums(top, shards, shard_leaves, upper, shard_areas, self.parent)

    def _restricted(self, parent, leaf_area, index, keep) -> "NestedSums":
        """The structure of the areas ``keep`` (bool per area), renumbered by ``index``, with
        the tree ``parent`` and leaves ``leaf_area``, and their terms."""
        rows = keep[self.term_area]
        return NestedSums(parent, leaf_area, self.n_cells, index[self.term_area[rows]], self.term_cells[rows],
                          self.term_value[rows], self.term_table[rows], self.tables, self.term_name[rows],
                          self.cell_shape)

    def area_sums(self, x: np.ndarray) -> np.ndarray:
        """S (n_areas, n_cells): every area's sums of the counts x (n_leaves, n_cells)."""
        x = np.asarray(x, dtype=np.int64).reshape(self.n_leaves, self.n_cells)
        S = np.zeros((self.n_areas, self.n_cells), dtype=np.int64)
        S[self.leaf_area] = x
        for v in self.order:
            if self.parent[v] >= 0:
                S[self.parent[v]] += S[v]
        return S

    def term_sums(self, x: np.ndarray) -> np.ndarray:
        """t (R,): each term's sum of counts."""
        S = self.area_sums(x)
        return np.einsum("rc,rc->r", self.term_cells, S[self.term_area])

    def log_weight(self, x: np.ndarray) -> float:
        """sum_r log w_r(y_r - t_r) at counts x (the terms' part of the log density)."""
        t = self.term_sums(x)
        e = self.term_value - t
        return float(sum(self.tables.log_weight(int(k), int(v)) for k, v in zip(self.term_table, e)))

    def _check_equalities(self) -> None:
        """The pair moves connect the counts under equalities whose cell sets, per area, are
        pairwise disjoint or nested (:mod:`dpinfer.lattice.nested`); refuse any other."""
        if self.term_value.size == 0:
            return
        hard = self.term_kinds()[1]
        for v in np.unique(self.term_area[hard]):
            rows = np.flatnonzero(hard & (self.term_area == v))
            sets = [frozenset(np.flatnonzero(self.term_cells[r])) for r in rows]
            for i, a in enumerate(sets):
                for b in sets[i + 1:]:
                    if a & b and not (a <= b or b <= a):
                        raise ValueError(
                            f"equalities at one area must sum disjoint or nested sets of cells; "
                            f"{self.term_name[rows[i]]!r} and another equality there overlap partly")


@dataclass(frozen=True)
class SplitSums:
    """A :class:`NestedSums` cut by :meth:`NestedSums.split`: ``top``, the upper areas, whose
    leaf k stands for shard k's root (its counts are that root's sums); ``shards``, each a
    structure of its own; ``shard_leaves[k]``, the rows of the whole tree's counts that are
    shard k's leaves, in its order; ``top_areas`` and ``shard_areas[k]``, the whole tree's area
    of each of the upper areas' and of shard k's areas, in their order (-1: a shard's root of
    its own above its part's areas; the upper areas' leaves, shard k's root at the upper
    areas' area top_areas.size + k, are not listed); ``parent``, the whole tree's."""

    top: NestedSums
    shards: list
    shard_leaves: list
    top_areas: np.ndarray
    shard_areas: list
    parent: np.ndarray

    def pieces(self, x: np.ndarray) -> tuple:
        """(the upper areas' counts, each shard's counts) of the whole tree's counts x."""
        xs = [np.ascontiguousarray(x[leaves], dtype=np.int64) for leaves in self.shard_leaves]
        top = np.array([shard.area_sums(xk)[shard.order[-1]] for shard, xk in zip(self.shards, xs)], dtype=np.int64)
        return top.reshape(len(xs), -1), xs

    def whole(self, shard_counts, n_leaves: int) -> np.ndarray:
        """The whole tree's counts (n_leaves, n_cells) from each shard's."""
        x = np.empty((n_leaves, self.top.n_cells), dtype=np.int64)
        for leaves, xk in zip(self.shard_leaves, shard_counts):
            x[leaves] = xk
        return x


def as_sums(release) -> "NestedSums":
    """The :class:`NestedSums` of ``release``: itself, or a release's ``sums`` (a
    :class:`~dpinfer.mechanisms.nested.NestedMeasurements`); anything else is a TypeError."""
    if isinstance(release, NestedSums):
        return release
    sums = getattr(release, "sums", None)
    if isinstance(sums, NestedSums):
        return sums
    raise TypeError(f"release must be a NestedMeasurements or NestedSums, got {type(release).__name__}")


def tree_of(parent: np.ndarray, leaves: np.ndarray) -> tuple:
    """Check that ``parent`` (area -> its parent, -1 at the root) is one tree and ``leaves`` (the
    counts' rows) are exactly its childless areas, each once; return (order: areas, children
    before parents; children: areas sorted by parent; child_ptr; area_leaf: leaf row of an area,
    -1 inside). Errors name the public arguments ``parent`` and ``leaves``."""
    n = parent.size
    roots = np.flatnonzero(parent < 0)
    if roots.size != 1:
        raise ValueError(f"parent must describe one tree with one root (parent -1), found {roots.size} roots")
    if np.any(parent >= n) or np.any(parent == np.arange(n)) or np.any(parent < -1):
        raise ValueError("parent holds an area index out of range (-1 .. areas - 1) or an area that is its "
                         "own parent")
    depth = np.full(n, -1, dtype=np.int64)
    depth[roots[0]] = 0
    for _ in range(n):  # propagate depths down; a cycle leaves -1
        todo = (depth < 0) & (parent >= 0)
        if not np.any(todo):
            break
        ready = todo & (depth[np.maximum(parent, 0)] >= 0)
        if not np.any(ready):
            break
        depth[ready] = depth[parent[ready]] + 1
    if np.any(depth < 0):
        raise ValueError("parent has a cycle: not every area reaches the root")
    order = np.argsort(-depth, kind="stable").astype(np.int64)
    children = np.flatnonzero(parent >= 0)
    children = children[np.argsort(parent[children], kind="stable")]
    counts = np.bincount(parent[children], minlength=n)
    child_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    area_leaf = np.full(n, -1, dtype=np.int64)
    if np.unique(leaves).size != leaves.size or np.any((leaves < 0) | (leaves >= n)):
        raise ValueError(f"leaves must list distinct areas of the tree (0 .. {n - 1})")
    area_leaf[leaves] = np.arange(leaves.size)
    childless = counts == 0
    if np.any(childless != (area_leaf >= 0)):
        bad = np.flatnonzero(childless != (area_leaf >= 0))[:5]
        raise ValueError(f"leaves must be exactly the areas without children; areas {bad.tolist()} "
                         "are not (an area with no leaf under it, or a leaf with children)")
    return order, children.astype(np.int64), child_ptr, area_leaf
