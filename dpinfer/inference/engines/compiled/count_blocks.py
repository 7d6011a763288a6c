"""Count blocks of the compiled Gibbs sampler: the data of one latent's exact draws.

A block holds what does not change during sampling (the window grid, the release's
log-likelihood table, the tail envelopes, the groups) and draws the latent's counts given the
parameters with the kernels of :mod:`dpinfer.inference.engines.compiled.exact_counts`. Per-chain scratch lives
in the state returned by :meth:`new_state`, so one block serves chains in several threads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer.inference.window import has_exact_tails, window_centres

@dataclass
class CellTables:
    """One latent's window grid (d, W): row i holds cell i's candidates, the release's
    log-likelihood on it (d, W) and, for additive noise, the geometric envelopes of the tails
    (6, d): left_ok, left_env, left_decay, right_ok, right_env, right_decay (see
    :mod:`dpinfer.inference.engines.compiled.exact_counts`)."""

    grid: np.ndarray
    release_table: np.ndarray
    release: np.ndarray
    tails: np.ndarray
    shape: np.ndarray
    log_eta: np.ndarray

    @property
    def width(self) -> int:
        return self.grid.shape[1]

    @property
    def n_cells(self) -> int:
        return self.grid.shape[0]

    @classmethod
    def build(cls, mechanism, release, support, half_width: int, log_eta=None) -> "CellTables":
        """Tables of a release ``release`` (flattened) of counts with prior ``support``
        (lower, upper; None where open) by ``mechanism`` (the per-cell law), on windows
        c_i - k .. c_i + k around c_i = s_i clipped to the support. ``log_eta`` bounds the
        likelihood outside the windows for mechanisms without exact tails."""
        release = np.asarray(release).reshape(-1)
        centres = window_centres(release, support)
        lo = centres - half_width
        width = 2 * half_width + 1
        grid = np.ascontiguousarray(lo[:, None] + np.arange(width)[None, :], dtype=np.int64)
        release_table = np.ascontiguousarray(
            mechanism.log_likelihood(np.broadcast_to(release[:, None], grid.shape), grid), dtype=float)
        d = release.size
        tails = np.zeros((6, d))
        shape = np.zeros(3)
        if has_exact_tails(mechanism):
            c0, c1, p = mechanism.noise_shape
            shape[:] = (c0, c1, p)
            f = lambda e: c0 - c1 * np.abs(e) ** p  # noqa: E731
            s = release.astype(float)
            lower, upper = support
            hi = lo + width - 1
            left = np.ones(d, bool) if lower is None else lo > lower
            right = np.ones(d, bool) if upper is None else hi < upper
            e_left = s - (lo - 1)  # >= 0 where the left tail is open (noise decreasing outwards)
            e_right = s - (hi + 1)  # <= 0 where the right tail is open
            if np.any(left & (e_left < 0)) or np.any(right & (e_right > 0)):
                raise AssertionError("a window does not contain its release's mode")
            tails[0] = left
            tails[1] = np.where(left, f(e_left), 0.0)
            tails[2] = np.where(left, f(e_left) - f(e_left + 1), 0.0)
            tails[3] = right
            tails[4] = np.where(right, f(e_right), 0.0)
            tails[5] = np.where(right, f(e_right) - f(e_right - 1), 0.0)
            log_eta = np.full(d, -np.inf)
        elif log_eta is None:
            raise ValueError("a mechanism without exact tails needs log_eta (its tail bound)")
        return cls(grid, release_table, release.astype(float), tails, shape,
                   np.asarray(log_eta, dtype=float).reshape(-1))


class _HoistedTerms:
    """The grid-only terms of a block's prior table (:class:`~dpinfer.inference.engines.compiled.model.PriorTable`),
    computed from the model's data when the block is built and again by :meth:`refresh_hoisted`
    when data they may depend on change (a sharded fit's shared parameters)."""

    def _hoist(self, prepare) -> None:
        self._prepare = prepare
        self._hoisted, self.hoisted = prepare()

    def refresh_hoisted(self) -> bool:
        """Recompute the terms from the model's data now, in place (the kernels keep their
        addresses); True if any changed."""
        changed = False
        for old, new in zip(self._hoisted, self._prepare()[0]):
            if not np.array_equal(old, new):
                old[...] = new
                changed = True
        return changed


class IndependentCells(_HoistedTerms):
    """Cells drawn independently given the parameters (a release of the counts themselves,
    its only child): :func:`dpinfer.inference.engines.compiled.exact_counts.draw_independent`."""

    kind = "cells"

    def __init__(self, name: str, offset: int, tables: CellTables, prior_table):
        self.name, self.offset, self.tables = name, offset, tables
        self._hoist(lambda: prior_table.prepare(tables.grid))
        # the table functions' addresses (compiled here, not in a chain's thread)
        self.prior_address, self.point_address = prior_table.full_address, prior_table.point_address
        self.stat_names = (f"{name}_neglected_mass_bound", f"{name}_held_cells")

    def native(self, column: int) -> tuple:
        """The kernel's data, with fresh scratch for one chain; statistics from ``column``."""
        t = self.tables
        W, d = t.width, t.n_cells
        return (self.prior_address, self.hoisted, self.point_address, self.offset,
                t.grid, t.release_table, t.release, t.tails, t.shape, t.log_eta,
                np.empty((d, W)), np.empty(W), np.empty(W), np.empty(4), column)

    @staticmethod
    def placeholder() -> tuple:
        """A block of no cells with the kernel's types (the compiled loop needs one)."""
        f, i = np.zeros((0, 0)), np.zeros((0, 0), np.int64)
        return (0, np.zeros(1, np.int64), 0, 0, i, f, np.zeros(0), np.zeros((6, 0)), np.zeros(3),
                np.zeros(0), f, np.zeros(0), np.zeros(0), np.zeros(4), 0)


class GroupTotals(_HoistedTerms):
    """Cells tied by group totals (a release conditioned on totals), drawn jointly and exactly
    on the fibre given the parameters: :func:`dpinfer.inference.engines.compiled.exact_counts.draw_given_totals`."""

    kind = "totals"

    def __init__(self, name: str, offset: int, tables: CellTables, prior_table,
                 group_codes: np.ndarray, targets: np.ndarray):
        if not np.all(tables.tails[0] + tables.tails[3] > 0):
            raise ValueError("group totals need a release noise with exact tails")
        codes = np.asarray(group_codes, dtype=np.int64).reshape(-1)
        self.group_cells = np.argsort(codes, kind="stable").astype(np.int64)
        self.group_ptr = np.concatenate([[0], np.cumsum(np.bincount(codes))]).astype(np.int64)
        self.targets = np.asarray(targets, dtype=np.int64)
        self.name, self.offset, self.tables = name, offset, tables
        self._hoist(lambda: prior_table.prepare(tables.grid))
        self.prior_address, self.point_address = prior_table.full_address, prior_table.point_address
        self.stat_names = (f"{name}_total_tries", f"{name}_held_cells", f"{name}_blocks_kept")

    def native(self, column: int) -> tuple:
        """The kernel's data, with fresh scratch for one chain; statistics from ``column``."""
        t = self.tables
        W, d = t.width, t.n_cells
        return (self.prior_address, self.hoisted, self.point_address, self.offset,
                t.grid, t.release_table, t.release, t.tails, t.shape, self.group_ptr,
                self.group_cells, self.targets, np.empty((d, W)), np.empty((d, W)),
                np.empty((d, W)), np.empty((4, d)), np.zeros(4), column)

    @staticmethod
    def placeholder() -> tuple:
        """A block of no cells with the kernel's types (the compiled loop needs one)."""
        f, i = np.zeros((0, 0)), np.zeros((0, 0), np.int64)
        z = np.zeros(1, np.int64)
        return (0, z, 0, 0, i, f, np.zeros(0), np.zeros((6, 0)), np.zeros(3), z, np.zeros(0, np.int64),
                np.zeros(0, np.int64), f, f, f, np.zeros((4, 0)), np.zeros(4), 0)


class NestedCounts(_HoistedTerms):
    """Counts on the leaves of a tree of areas measured at every level (a nested release),
    moved by exact sum-tree draws given the parameters: :func:`dpinfer.lattice.nested.directions.sweep_products`
    on the plan's boxes, with the prior's table (and a GroupedNegativeBinomial's group factors)
    refilled from the parameters first."""

    kind = "nested"

    def __init__(self, name: str, offset: int, gibbs, prior_table, mixing=None):
        """``mixing``: (the native GROUP_MIXING function's address, the table of each group and
        cell's factor (G, n_cells), each group's area (G,), each leaf's finest group (n_leaves,),
        each group's parent group (G,), -1 for none) of a
        GroupedNegativeBinomial prior, refilled before every sweep
        (:func:`~dpinfer.inference.engines.compiled.exact_counts.group_mixing_tables`); None
        without one."""
        self.name, self.offset, self.gibbs, self.mixing = name, offset, gibbs, mixing
        self.grid, self.rows = gibbs.grid(), gibbs.rows()  # the flat table's candidates
        self._hoist(lambda: prior_table.prepare_flat(self.grid, self.rows))
        self.prior_address = prior_table.flat_address  # compiled here, not in a chain's thread
        self.stat_names = (f"{name}_trimmed_edges_hit", f"{name}_box_edges_hit",
                           f"{name}_moves_without_mass")

    def native(self, column: int) -> tuple:
        """The kernel's data, with fresh scratch for one chain; statistics from ``column``."""
        g, s = self.gibbs, self.gibbs.sums
        meta, inv2v, values = s.tables.arrays()  # values: the chain's own (the factors are rewritten)
        if self.mixing is None:
            mixing_address, mixing_at = 0, np.zeros(0, np.int64)
            group_area, leaf_group, group_parent = (np.zeros(0, np.int64),) * 3
        else:
            mixing_address, tables, group_area, leaf_group, group_parent = self.mixing
            mixing_at = np.ascontiguousarray(meta[tables.reshape(-1), 2])
        return (self.prior_address, self.hoisted, self.offset, self.grid, self.rows, g.prior_start,
                np.empty(self.grid.shape), np.empty((s.n_leaves, s.n_cells), np.int64),
                np.empty((s.n_areas, s.n_cells), np.int64), np.empty(s.term_value.size, np.int64),
                g.box_lo, g.box_hi, g.lo_open, g.hi_open, s.order, s.child_ptr, s.child_area, s.area_leaf,
                s.term_ptr, s.term_cells, s.term_value, s.term_table, s.term_area, meta, inv2v, values,
                mixing_address, mixing_at, np.empty((mixing_at.size, 3)), group_area, leaf_group, group_parent,
                g.trim, np.array(s.cell_shape, np.int64), np.zeros(3, np.int64), column)
