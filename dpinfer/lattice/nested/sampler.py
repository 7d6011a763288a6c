"""Gibbs sweeps of nested-sum counts given the cells' prior log pmfs on their boxes.

:class:`NestedGibbs` holds the boxes (each count's range of values, lo .. hi) and runs the
kernels' sweeps (:func:`dpinfer.lattice.nested.directions.sweep_products`) from a start that meets every
term. The prior enters as a flat table of every count's box:
``prior[prior_start[l * n_cells + c] + j] = log p_{l,c}(lo[l, c] + j)``, j = 0 .. hi - lo
(``-inf`` where the count's support ends; :meth:`NestedGibbs.grid` lists the candidates,
:meth:`NestedGibbs.rows` their counts; ``prior_start[-1]`` is the table's size); the compiled
engine refills it from the parameters before every sweep, a test gives it once. Flat rather
than padded to the widest box: at the size of a state the widest box is ~10 times the
median. The rows lie **cell by cell** (every leaf's row of cell 0, then of cell 1, ...): a
move along a cell reads its leaves' rows in order through one stretch of memory (at the size
of a state 0.90-0.94 of the sweep's time of the leaf-by-leaf order, ``benchmarks/README.md``),
so a row's end is its start plus its box's width, not the next count's start.
"""

from __future__ import annotations

import numpy as np

from dpinfer._random_stream import new_stream
from dpinfer.lattice.nested.directions import sweep_products
from dpinfer.lattice.nested.kernel import DEFAULT_TRIM
from dpinfer.lattice.nested.structure import NestedSums
from dpinfer.lattice.nested.terms import term_log


class NestedGibbs:
    """Sweeps of the counts of ``sums`` on the boxes ``box_lo .. box_hi`` (n_leaves, n_cells),
    inclusive; ``support`` = (lowest, highest) count (None: open) tells a box edge that only
    the box makes (counted when a draw lands on it) from an end of the support."""

    def __init__(self, sums: NestedSums, box_lo, box_hi, *, support=(0, None), trim: float = DEFAULT_TRIM):
        shape = (sums.n_leaves, sums.n_cells)
        self.sums = sums
        # copies, always writable: a read-only box (the view broadcast_to returns when the box
        # has its full shape already) would make the kernels compile a second specialisation
        self.box_lo = np.array(np.broadcast_to(box_lo, shape), dtype=np.int64)
        self.box_hi = np.array(np.broadcast_to(box_hi, shape), dtype=np.int64)
        if np.any(self.box_hi < self.box_lo):
            raise ValueError("box_hi must be >= box_lo for every count")
        lower, upper = support
        self.lo_open = self.box_lo > (-np.inf if lower is None else lower)
        self.hi_open = self.box_hi < (np.inf if upper is None else upper)
        self.widths = (self.box_hi - self.box_lo + 1).reshape(-1)  # each count's row, count l * n_cells + c
        self._layout = np.arange(self.widths.size).reshape(shape).T.reshape(-1)  # the counts cell by cell
        self.prior_start = np.empty(self.widths.size + 1, np.int64)
        self.prior_start[self._layout] = np.concatenate([[0], np.cumsum(self.widths[self._layout])[:-1]])
        self.prior_start[-1] = self.widths.sum()
        if not trim > 0:
            raise ValueError(f"trim must be > 0 nats, got {trim!r}")
        self.trim = float(trim)
        self._tables = sums.tables.arrays()

    def rows(self) -> np.ndarray:
        """(K,): the count (l * n_cells + c) of each entry of the flat prior table."""
        return np.repeat(self._layout, self.widths[self._layout]).astype(np.int64)

    def grid(self) -> np.ndarray:
        """(K,): the value of each entry of the flat prior table (each row its count's box, lo .. hi)."""
        rows = self.rows()
        return (self.box_lo.reshape(-1)[rows] + np.arange(rows.size) - self.prior_start[rows]).astype(np.int64)

    def check_start(self, x0) -> np.ndarray:
        """x0 as int64 (n_leaves, n_cells), if it lies in the boxes and meets every term."""
        s = self.sums
        x = np.array(x0, dtype=np.int64).reshape(s.n_leaves, s.n_cells)
        outside = (x < self.box_lo) | (x > self.box_hi)
        if np.any(outside):
            l, c = np.argwhere(outside)[0]
            raise ValueError(f"the start x0[{l}, {c}] = {x[l, c]} lies outside its box "
                             f"{self.box_lo[l, c]} .. {self.box_hi[l, c]}")
        check_exact_terms(s, x)
        return x

    def run(self, x0, prior: np.ndarray, n_sweeps: int, rng: np.random.Generator):
        """(draws (n_sweeps, n_leaves, n_cells), stats) from ``n_sweeps`` sweeps from x0 with the
        fixed flat prior table ``prior`` (on :meth:`grid`). stats: moves made, trimmed
        edges hit, counts at an open box edge, moves without mass."""
        s = self.sums
        x = self.check_start(x0)
        prior = np.ascontiguousarray(prior, dtype=float)
        if prior.shape != (self.prior_start[-1],):
            raise ValueError(f"prior must be the flat table on grid(), shape {(int(self.prior_start[-1]),)}, "
                             f"got {prior.shape}")
        S = s.area_sums(x)
        tsum = s.term_sums(x).astype(np.int64)
        stream = new_stream(rng)
        stats = np.zeros(3, np.int64)
        failed = 0
        draws = np.empty((n_sweeps, s.n_leaves, s.n_cells), dtype=np.int64)
        meta, inv2v, values = self._tables
        for i in range(n_sweeps):
            failed += sweep_products(x, S, tsum, self.box_lo, self.box_hi, self.lo_open, self.hi_open,
                                     prior, self.prior_start, s.order, s.child_ptr, s.child_area, s.area_leaf, s.term_ptr,
                                     s.term_cells, s.term_value, s.term_table, meta, inv2v, values,
                                     self.trim, np.array(s.cell_shape, np.int64), stream, stats)
            draws[i] = x
        return draws, {"moves": int(stats[0]), "trimmed_edges_hit": int(stats[1]),
                       "open_box_edges_hit": int(stats[2]), "moves_without_mass": int(failed)}


def check_exact_terms(sums: NestedSums, x) -> None:
    """Raise if the counts x of ``sums`` break an exact term (an equality or a bound), naming it."""
    e = sums.term_value - sums.term_sums(x)
    meta, inv2v, values = sums.tables.arrays()
    bad = [r for r in range(e.size) if term_log(int(sums.term_table[r]), int(e[r]), meta, inv2v, values) == -np.inf]
    if bad:
        names = sorted({str(sums.term_name[r]) for r in bad})
        raise ValueError(f"the start x0 breaks {len(bad)} exact term(s) (equalities or bounds): {names[:5]}")
