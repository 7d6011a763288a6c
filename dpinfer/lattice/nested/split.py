"""Sweeps of nested-sum counts with the tree split into shards and the upper areas that join them.

A state's blocks are too many counts for one machine's sweeps, but the upper areas' measurements
(the state's, the nation's) couple the counties, so the counties are not independent given the
parameters. Along a direction the law of the moves is still tree-structured
(:mod:`dpinfer.lattice.nested.kernel`), and a sum tree's passes regroup: a shard (a run of
counties) passes up to its root and sends the root's message (the law of its sum along the
direction, summed over the shard's own counts: tens to hundreds of numbers); the upper areas
take those messages as their leaves', multiply in their own terms and draw every shard root's
sum; each shard splits its sum down its tree. That is the whole tree's exact move, so a sweep of
the split tree has the same law as :func:`~dpinfer.lattice.nested.directions.sweep_products`'s
on the whole tree (tested against enumeration), and only the messages and the sums cross between
the shards and the driver: two numbers an entry per shard and direction.

:class:`SplitGibbs` runs such sweeps in one process given each shard's prior table, the shards
one after another: the unit the sharded engine places on workers, and the reference it is tested
against.
"""

from __future__ import annotations

import numpy as np

from dpinfer._random_stream import new_stream
from dpinfer.lattice.nested.directions import sweep_directions
from dpinfer.lattice.nested.kernel import (DEFAULT_TRIM, move, move_from_root, root_message, settle_term_sums,
                                           with_injected, workspace)
from dpinfer.lattice.nested.sampler import NestedGibbs
from dpinfer.lattice.nested.structure import SplitSums


class SplitGibbs:
    """Sweeps of the counts of a split tree (:meth:`~dpinfer.lattice.nested.structure.NestedSums.split`)
    on the boxes ``box_lo .. box_hi`` of the whole tree's counts (n_leaves, n_cells), as
    :class:`~dpinfer.lattice.nested.sampler.NestedGibbs`'s on the whole tree. Each shard has a
    :class:`NestedGibbs` of its own (``shards``: its boxes, its prior table's layout)."""

    def __init__(self, split: SplitSums, box_lo, box_hi, *, support=(0, None), trim: float = DEFAULT_TRIM):
        if not isinstance(split, SplitSums):
            raise TypeError(f"split must be a SplitSums (NestedSums.split), got {type(split).__name__}")
        self.split = split
        n_leaves = sum(leaves.size for leaves in split.shard_leaves)
        shape = (n_leaves, split.top.n_cells)
        lo, hi = (np.broadcast_to(np.asarray(b, dtype=np.int64), shape) for b in (box_lo, box_hi))
        self.shards = [NestedGibbs(shard, lo[leaves], hi[leaves], support=support, trim=trim)
                       for shard, leaves in zip(split.shards, split.shard_leaves)]
        self.n_leaves = n_leaves
        self.trim = self.shards[0].trim
        top = split.top
        # the upper areas' leaves are the shards' roots: their messages are given, so their boxes
        # and prior are never read, and no edge of theirs is a box's
        self._top_box = np.zeros((top.n_leaves, top.n_cells), np.int64)
        self._top_open = np.zeros((top.n_leaves, top.n_cells), np.bool_)
        self._top_prior = np.zeros(1)
        self._top_prior_start = np.zeros(top.n_leaves * top.n_cells + 1, np.int64)
        self._tables = top.tables.arrays()

    def run(self, x0, priors, n_sweeps: int, rng: np.random.Generator):
        """(draws (n_sweeps, n_leaves, n_cells) of the whole tree's counts, stats) from
        ``n_sweeps`` sweeps from x0 with each shard's fixed flat prior table ``priors[k]`` (on
        ``shards[k].grid()``). stats as :meth:`NestedGibbs.run`'s."""
        split, top = self.split, self.split.top
        if len(priors) != len(self.shards):
            raise ValueError(f"priors must be one flat table per shard ({len(self.shards)}), got {len(priors)}")
        x_top, xs = split.pieces(np.asarray(x0, dtype=np.int64).reshape(self.n_leaves, top.n_cells))
        xs = [g.check_start(xk) for g, xk in zip(self.shards, xs)]
        priors = [np.ascontiguousarray(p, dtype=float) for p in priors]
        S_top, t_top = top.area_sums(x_top), top.term_sums(x_top).astype(np.int64)
        Ss = [g.sums.area_sums(xk) for g, xk in zip(self.shards, xs)]
        ts = [g.sums.term_sums(xk).astype(np.int64) for g, xk in zip(self.shards, xs)]
        streams = [new_stream(rng) for _ in range(len(self.shards) + 1)]  # the driver's first
        stats = np.zeros(3, np.int64)
        failed = 0
        draws = np.empty((n_sweeps, self.n_leaves, top.n_cells), dtype=np.int64)
        works = self.workspaces()
        for i in range(n_sweeps):
            failed += self.sweep(x_top, S_top, t_top, xs, Ss, ts, priors, streams, stats, works)
            draws[i] = split.whole(xs, self.n_leaves)
        return draws, {"moves": int(stats[0]), "trimmed_edges_hit": int(stats[1]),
                       "open_box_edges_hit": int(stats[2]), "moves_without_mass": int(failed)}

    def workspaces(self) -> tuple:
        """(the upper areas' workspace, each shard's) for :meth:`sweep`
        (:func:`~dpinfer.lattice.nested.kernel.workspace`: made once, reused by every sweep)."""
        top = self.split.top
        meta, inv2v, values = top.tables.arrays()
        return (workspace(top.order, top.child_area, top.term_ptr, top.term_cells, top.term_value, top.term_table,
                          meta, inv2v, values, self._top_box, self._top_box),
                [workspace(g.sums.order, g.sums.child_area, g.sums.term_ptr, g.sums.term_cells, g.sums.term_value,
                           g.sums.term_table, meta, inv2v, values, g.box_lo, g.box_hi) for g in self.shards])

    def sweep(self, x_top, S_top, t_top, xs, Ss, ts, priors, streams, stats, workspaces) -> int:
        """One sweep in place (the upper areas' counts, sums and term sums, then each shard's);
        the directions drawn by the driver's stream ``streams[0]``, shard k's splits by
        ``streams[k + 1]``; ``workspaces`` from :meth:`workspaces`. Returns the number of moves
        that found no mass."""
        top = self.split.top
        meta, inv2v, values = self._tables
        top_work, works = workspaces
        ptr, cells, signs = sweep_directions(top.n_cells, np.array(top.cell_shape, np.int64), streams[0])
        roots = top.leaf_area  # shard k's root is the upper areas' leaf k
        shard_stats = np.zeros(3, np.int64)  # a move is counted once, by the driver
        failed = 0
        for i in range(ptr.size - 1):
            d, s = cells[ptr[i]:ptr[i + 1]], signs[ptr[i]:ptr[i + 1]]
            messages = []
            for g, xk, Sk, tk, prior, work in zip(self.shards, xs, Ss, ts, priors, works):
                sums = g.sums
                messages.append(root_message(d, s, xk, Sk, tk, g.box_lo, g.box_hi, prior, g.prior_start, sums.order,
                                             sums.child_ptr, sums.child_area, sums.area_leaf, sums.term_cells,
                                             sums.term_value, sums.term_table, meta, inv2v, values, self.trim, work))
            if any(w.size == 0 for w, _ in messages) or not move(
                    d, s, x_top, S_top, t_top, self._top_box, self._top_box, self._top_open, self._top_open,
                    self._top_prior, self._top_prior_start, top.order, top.child_ptr, top.child_area, top.area_leaf,
                    top.term_cells, top.term_value, top.term_table, meta, inv2v, values, self.trim, streams[0], stats,
                    with_injected(top_work, messages)):
                failed += 1
                continue
            drawn = top_work[14][roots]
            for k, (g, xk, Sk, tk, work) in enumerate(zip(self.shards, xs, Ss, ts, works)):
                sums = g.sums
                if not move_from_root(drawn[k], d, s, xk, Sk, tk, g.box_lo, g.box_hi, g.lo_open, g.hi_open,
                                      sums.order, sums.child_ptr, sums.child_area, sums.area_leaf, sums.term_cells,
                                      streams[k + 1], shard_stats, work):
                    raise RuntimeError(f"shard {k} could not split the sum {drawn[k]} its root's message allowed")
        stats[1:] += shard_stats[1:]
        settle_term_sums(t_top, S_top, top.term_ptr, top.term_cells, top_work[2])
        for g, Sk, tk, work in zip(self.shards, Ss, ts, works):
            settle_term_sums(tk, Sk, g.sums.term_ptr, g.sums.term_cells, work[2])
        return failed
