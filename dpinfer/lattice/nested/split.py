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
the shards and the driver: per shard and direction, a message up and one sum down.

:class:`ShardCounts` is one shard: its counts and its halves of each move. :class:`SplitGibbs`
is the driver: it holds the upper areas, draws each sweep's directions and the roots' sums, and
runs its shards in this process or as Dask actors (``client=``): the sweep's directions go to
every shard once, then one call per shard and direction (a shard splits the last direction's
sum and passes up along the next in one call; a sum and an index in, a message out).
Each shard draws from its own random stream and the driver from its own, so the draws are the
same wherever the shards run.

With the census model's prior (:func:`~dpinfer.distributions.GroupedNegativeBinomial`) each
group's factor lies in the piece that holds its area (:func:`split_mixing`), and before a sweep
every piece writes its factors and tilts them towards its current sums
(:func:`~dpinfer.lattice.nested.terms.write_group_mixing`, as the one-machine engine does). A
tilt cancels between a group and its children, so where they lie in different pieces (a
county's factor in a shard, the state's in the upper areas) the shard takes the tilt of the
group above its root from the driver (:meth:`SplitGibbs.refill`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer._random_stream import new_stream
from dpinfer._validation import check_count
from dpinfer.lattice.nested.directions import sweep_directions
from dpinfer.lattice.nested.kernel import (DEFAULT_TRIM, move, move_from_root, root_message, settle_term_sums,
                                           with_injected, workspace)
from dpinfer.lattice.nested.sampler import NestedGibbs, check_exact_terms
from dpinfer.lattice.nested.structure import NestedSums, SplitSums
from dpinfer.lattice.nested.terms import write_group_mixing


@dataclass(frozen=True)
class PieceMixing:
    """The group-mixing factors of one piece of a split tree (the upper areas or a shard), in
    the arguments of :func:`~dpinfer.lattice.nested.terms.write_group_mixing`: ``groups`` (the
    whole tree's group indices it holds, in order), ``at`` (each group and cell's table start in
    the values, (len(groups) * C,)), ``group_area`` (its area in the piece), ``group_parent``
    (the parent group's index in ``groups``, -1 if outside the piece or none), ``leaf_group``
    (each of the piece's leaves' finest group in ``groups``, -1 if outside; empty for the
    upper areas, whose leaves are the shards' roots) and ``outer`` (a shard's: the whole
    tree's group index of the nearest group above its root, -1 for none)."""

    groups: np.ndarray
    at: np.ndarray
    group_area: np.ndarray
    group_parent: np.ndarray
    leaf_group: np.ndarray
    outer: int = -1


def split_mixing(split: SplitSums, areas, tables, leaf_group, group_parent) -> tuple:
    """(the upper areas' :class:`PieceMixing`, each shard's) of the group-mixing factors of the
    groups at the whole tree's ``areas`` (G,; several groups may share an area, e.g. a state's
    and the nation's when the nation is that state), with the table indices ``tables`` (G, C)
    (:meth:`~dpinfer.lattice.nested.structure.NestedSums.with_group_mixing`'s), each leaf's
    finest group ``leaf_group`` (n_leaves,) and each group's parent group ``group_parent`` (G,;
    -1 for none). The groups' parameters are then one (G, C, 3) array of (a, A, M) in that
    order. A shard's groups and leaves may have one group outside it above them (its
    ``outer``), no more."""
    n = split.parent.size
    C = split.top.n_cells
    n_leaves = sum(leaves.size for leaves in split.shard_leaves)
    areas, leaf_group, group_parent = (np.asarray(a, dtype=np.int64).reshape(-1)
                                       for a in (areas, leaf_group, group_parent))
    tables = np.asarray(tables, dtype=np.int64)
    G = areas.size
    if tables.shape != (G, C):
        raise ValueError(f"tables must be one table index per group and cell, shape {(G, C)}, got {tables.shape}")
    if np.any((areas < 0) | (areas >= n)):
        raise ValueError(f"areas must be areas of the tree (0 .. {n - 1}), got {areas.tolist()[:10]}")
    if leaf_group.shape != (n_leaves,) or np.any((leaf_group < 0) | (leaf_group >= G)):
        raise ValueError(f"leaf_group must be each of the {n_leaves} leaves' finest group (0 .. {G - 1})")
    if group_parent.shape != (G,) or np.any((group_parent < -1) | (group_parent >= G)):
        raise ValueError(f"group_parent must be each of the {G} groups' parent group, or -1")
    owner = np.full(n, -1, dtype=np.int64)  # the piece holding each whole area: 0 the upper areas, k + 1 shard k
    local_area = np.full(n, -1, dtype=np.int64)
    owner[split.top_areas], local_area[split.top_areas] = 0, np.arange(split.top_areas.size)
    for k, whole in enumerate(split.shard_areas):
        here = np.flatnonzero(whole >= 0)
        owner[whole[here]], local_area[whole[here]] = k + 1, here
    piece_of = owner[areas]
    meta = split.top.tables.arrays()[0]

    def piece(p: int, leaf_rows: np.ndarray) -> PieceMixing:
        groups = np.flatnonzero(piece_of == p)
        local = np.full(G + 1, -1, dtype=np.int64)  # whole group -> its index here (-1 -> -1)
        local[groups] = np.arange(groups.size)
        parents, finest = group_parent[groups], leaf_group[leaf_rows]
        above = np.unique(np.concatenate([parents[(parents >= 0) & (piece_of[parents] != p)],
                                          finest[piece_of[finest] != p]]))
        if above.size > 1:
            raise ValueError(f"a shard's groups and leaves have {above.size} groups above them outside the shard "
                             f"({above.tolist()[:5]}); the parts must be whole groups' areas")
        return PieceMixing(groups, np.ascontiguousarray(meta[tables[groups].reshape(-1), 2]),
                           local_area[areas[groups]], local[parents], local[finest],
                           int(above[0]) if above.size else -1)

    top = piece(0, np.zeros(0, np.int64))
    return top, [piece(k + 1, leaves) for k, leaves in enumerate(split.shard_leaves)]


class ShardCounts:
    """One shard of a split tree: the counts ``x0`` (its leaves, n_cells) of the structure
    ``sums`` on the boxes ``box_lo .. box_hi``, with the flat prior table ``prior`` (on
    ``self.gibbs.grid()``, :class:`~dpinfer.lattice.nested.sampler.NestedGibbs`), and its
    halves of each move (:func:`~dpinfer.lattice.nested.kernel.root_message`,
    :func:`~dpinfer.lattice.nested.kernel.move_from_root`), its random stream from ``seed``.
    Built where it runs (a Dask actor's constructor arguments are its whole state).
    ``prior`` may be None when :meth:`refill` gives it before the first sweep. ``mixing``: its
    group-mixing factors (:class:`PieceMixing`, :func:`split_mixing`), written
    by :meth:`refill` before each sweep; None without any."""

    def __init__(self, sums: NestedSums, box_lo, box_hi, x0, prior, seed: int, *, support=(0, None),
                 trim: float = DEFAULT_TRIM, mixing: PieceMixing | None = None):
        self.gibbs = g = NestedGibbs(sums, box_lo, box_hi, support=support, trim=trim)
        self.mixing = mixing
        self.set_counts(x0)
        self.prior = None
        if prior is not None:
            self.set_prior(prior)
        self.stream = new_stream(np.random.default_rng(seed))
        self.stats = np.zeros(3, np.int64)
        self._tables = sums.tables.arrays()
        meta, inv2v, values = self._tables
        self.work = workspace(sums.order, sums.child_area, sums.term_ptr, sums.term_cells, sums.term_value,
                              sums.term_table, meta, inv2v, values, g.box_lo, g.box_hi)

    def set_counts(self, x) -> None:
        """Replace the counts (e.g. from a checkpoint); they must lie in the boxes and meet every term."""
        self.x = self.gibbs.check_start(x)
        sums = self.gibbs.sums
        self.S, self.t = sums.area_sums(self.x), sums.term_sums(self.x).astype(np.int64)

    def set_prior(self, prior) -> None:
        """Replace the flat prior table (e.g. at new parameters)."""
        prior = np.ascontiguousarray(prior, dtype=float)
        if prior.shape != (self.gibbs.prior_start[-1],):
            raise ValueError(f"prior must be the shard's flat table on grid(), shape "
                             f"{(int(self.gibbs.prior_start[-1]),)}, got {prior.shape}")
        self.prior = prior

    def refill(self, prior, parameters, outer_tilt) -> None:
        """Take the flat prior table ``prior`` (untilted, copied) and write the group factors
        from ``parameters`` (each of :attr:`mixing`'s groups' (a, A, M) by cell, (G, C, 3)),
        both tilted towards the current sums, the groups above the root by ``outer_tilt`` (C,)
        (:func:`~dpinfer.lattice.nested.terms.write_group_mixing`)."""
        m = self.mixing
        if m is None:
            raise ValueError("this shard has no group-mixing factors to refill (built without mixing=)")
        self.set_prior(np.array(prior, dtype=float))
        C = self.gibbs.sums.n_cells
        parameters = np.ascontiguousarray(parameters, dtype=float)
        if parameters.shape != (m.groups.size, C, 3):
            raise ValueError(f"parameters must be the shard's groups' (a, A, M) by cell, shape "
                             f"{(m.groups.size, C, 3)}, got {parameters.shape}")
        g = self.gibbs
        write_group_mixing(parameters.reshape(-1, 3), m.at, self._tables[2], m.group_area, m.leaf_group,
                           m.group_parent, self.S, np.ascontiguousarray(outer_tilt, dtype=float), g.box_lo, g.box_hi,
                           g.prior_start, self.prior, np.empty(m.at.size))

    def root_sums(self) -> np.ndarray:
        """The root's sums (n_cells,): the upper areas' counts of this shard's leaf."""
        return self.S[self.gibbs.sums.order[-1]].copy()

    def begin_sweep(self, ptr, cells, signs) -> tuple:
        """Take the sweep's directions (:func:`~dpinfer.lattice.nested.directions.sweep_directions`:
        direction i the cells cells[ptr[i]:ptr[i + 1]] with their signs; sent once a sweep, then
        named by index) and return the root's message along the first."""
        if self.prior is None:
            raise ValueError("the shard has no prior table yet: give prior= or refill() before a sweep")
        self.directions = [(cells[ptr[i]:ptr[i + 1]], signs[ptr[i]:ptr[i + 1]]) for i in range(len(ptr) - 1)]
        return self.message(0)

    def message(self, i: int) -> tuple:
        """The root's message along direction ``i`` (weights, first sum); empty if no mass."""
        g, sums = self.gibbs, self.gibbs.sums
        meta, inv2v, values = self._tables
        return root_message(*self.directions[i], self.x, self.S, self.t, g.box_lo, g.box_hi, self.prior,
                            g.prior_start, sums.order, sums.child_ptr, sums.child_area, sums.area_leaf,
                            sums.term_cells, sums.term_value, sums.term_table, meta, inv2v, values, g.trim, self.work)

    def split_then_message(self, root_sum, i: int):
        """Split ``root_sum`` (the root's sum drawn along direction ``i``, whose message this
        shard sent last; None: the move was not made) down the tree, then the message along
        direction i + 1 (None after the last)."""
        if root_sum is not None:
            g, sums = self.gibbs, self.gibbs.sums
            if not move_from_root(root_sum, *self.directions[i], self.x, self.S, self.t, g.box_lo, g.box_hi,
                                  g.lo_open, g.hi_open, sums.order, sums.child_ptr, sums.child_area, sums.area_leaf,
                                  sums.term_cells, self.stream, self.stats, self.work):
                raise RuntimeError(f"a shard could not split the sum {root_sum} its root's message allowed")
        return self.message(i + 1) if i + 1 < len(self.directions) else None

    def end_sweep(self) -> np.ndarray:
        """Settle the quadratic terms' sums (:func:`~dpinfer.lattice.nested.kernel.settle_term_sums`)
        and return the trimmed edges and open box edges hit since the last call."""
        sums = self.gibbs.sums
        settle_term_sums(self.t, self.S, sums.term_ptr, sums.term_cells, self.work[2])
        hits, self.stats[:] = self.stats[1:].copy(), 0
        return hits

    def counts(self) -> np.ndarray:
        return self.x.copy()


def gathered(calls) -> list:
    """The values of shard calls: a Dask actor's are futures, this process's values."""
    return [r.result() if hasattr(r, "result") else r for r in calls]


class SplitGibbs:
    """Sweeps of the counts of a split tree (:meth:`~dpinfer.lattice.nested.structure.NestedSums.split`)
    on the boxes ``box_lo .. box_hi`` of the whole tree's counts (n_leaves, n_cells), the same
    law as :class:`~dpinfer.lattice.nested.sampler.NestedGibbs`'s sweeps of the whole tree.
    ``mixing``: (areas, tables, leaf_group, group_parent) of the census prior's group factors
    on the whole tree (:func:`split_mixing`), written with their tilts before each sweep
    (:meth:`refill`); None without any."""

    def __init__(self, split: SplitSums, box_lo, box_hi, *, support=(0, None), trim: float = DEFAULT_TRIM,
                 mixing=None):
        if not isinstance(split, SplitSums):
            raise TypeError(f"split must be a SplitSums (NestedSums.split), got {type(split).__name__}")
        self.split = split
        self.n_leaves = sum(leaves.size for leaves in split.shard_leaves)
        shape = (self.n_leaves, split.top.n_cells)
        self.box_lo, self.box_hi = (np.broadcast_to(np.asarray(b, dtype=np.int64), shape) for b in (box_lo, box_hi))
        self.support, self.trim = support, trim
        top = split.top
        # the upper areas' leaves are the shards' roots: their messages are given, so their boxes
        # and prior are never read, and no edge of theirs is a box's
        self._top_box = np.zeros((top.n_leaves, top.n_cells), np.int64)
        self._top_open = np.zeros((top.n_leaves, top.n_cells), np.bool_)
        self._top_prior = np.zeros(1)
        self._top_prior_start = np.zeros(top.n_leaves * top.n_cells + 1, np.int64)
        self._tables = top.tables.arrays()
        self.directions_swept = 0  # directions moved by :meth:`sweep`, in all
        self.mixing_top, self.mixing_shards = (None, [None] * len(split.shards)) if mixing is None else \
            split_mixing(split, *mixing)

    def shard_grids(self) -> list:
        """Each shard's (grid, rows) of its flat prior table, in the layout :class:`ShardCounts`
        uses (:meth:`NestedGibbs.grid`, :meth:`NestedGibbs.rows`; rows index the shard's counts)."""
        out = []
        for sums, leaves in zip(self.split.shards, self.split.shard_leaves):
            g = NestedGibbs(sums, self.box_lo[leaves], self.box_hi[leaves], support=self.support, trim=self.trim)
            out.append((g.grid(), g.rows()))
        return out

    def start(self, x0, priors, rng: np.random.Generator, client=None) -> list:
        """The shards (:class:`ShardCounts`) at the whole tree's counts x0 with their prior
        tables ``priors``: in this process, or each a Dask actor on ``client``'s workers (round
        robin). Each shard's seed is drawn from ``rng``."""
        split = self.split
        if len(priors) != len(split.shards):
            raise ValueError(f"priors must be one flat table per shard ({len(split.shards)}), got {len(priors)}")
        x = np.asarray(x0, dtype=np.int64).reshape(self.n_leaves, split.top.n_cells)
        seeds = rng.integers(0, 2**63, size=len(split.shards))
        args = [(sums, self.box_lo[leaves], self.box_hi[leaves], x[leaves], prior, int(seed))
                for sums, leaves, prior, seed in zip(split.shards, split.shard_leaves, priors, seeds)]
        options = {"support": self.support, "trim": self.trim}
        if client is None:
            return [ShardCounts(*a, **options, mixing=m) for a, m in zip(args, self.mixing_shards)]
        workers = sorted(client.scheduler_info(n_workers=-1).get("workers", {}))
        if not workers:
            raise ValueError("client has no workers to hold the shards")
        futures = [client.submit(ShardCounts, *a, **options, mixing=m, actor=True,
                                 workers=[workers[k % len(workers)]], allow_other_workers=False, pure=False)
                   for k, (a, m) in enumerate(zip(args, self.mixing_shards))]
        return [f.result() for f in futures]

    def refill_top(self, state, parameters) -> list:
        """Write the upper areas' group factors from ``parameters`` ((a, A, M) by cell of
        :attr:`mixing_top`'s groups, (G_top, C, 3)), tilted towards their current sums
        (``state``, :meth:`sweep`'s); return each shard's tilt of the group above its root
        (C,), zeros where there is none."""
        m = self.mixing_top
        C = self.split.top.n_cells
        parameters = np.ascontiguousarray(parameters, dtype=float)
        if parameters.shape != (m.groups.size, C, 3):
            raise ValueError(f"parameters must be the upper areas' groups' (a, A, M) by cell, shape "
                             f"{(m.groups.size, C, 3)}, got {parameters.shape}")
        tilt = np.empty(m.at.size)
        write_group_mixing(parameters.reshape(-1, 3), m.at, self._tables[2], m.group_area, m.leaf_group,
                           m.group_parent, state[1], np.zeros(C), self._top_box, self._top_box,
                           self._top_prior_start, self._top_prior, tilt)
        local = {int(g): i for i, g in enumerate(m.groups)}
        return [tilt[local[sh.outer] * C:(local[sh.outer] + 1) * C].copy() if sh.outer >= 0 else np.zeros(C)
                for sh in self.mixing_shards]

    def refill(self, shards, state, parameters, priors) -> None:
        """Before a sweep: every piece's group factors from ``parameters`` (the whole tree's
        groups' (a, A, M) by cell, (G, C, 3), in ``mixing``'s order) and each shard's flat
        prior table ``priors[k]`` (untilted), tilted towards the current sums."""
        if self.mixing_top is None:
            raise ValueError("this sampler has no group-mixing factors to refill (built without mixing=)")
        parameters = np.asarray(parameters, dtype=float)
        outer = self.refill_top(state, parameters[self.mixing_top.groups])
        gathered([sh.refill(prior, parameters[m.groups], t)
                  for sh, prior, m, t in zip(shards, priors, self.mixing_shards, outer)])

    def run(self, x0, priors, n_sweeps: int, rng: np.random.Generator, client=None, parameters=None):
        """(draws (n_sweeps, n_leaves, n_cells) of the whole tree's counts, stats) from
        ``n_sweeps`` sweeps from x0 with each shard's fixed flat prior table ``priors[k]`` (on
        its grid, :meth:`shard_grids`) and, with ``mixing``, the group factors' fixed
        ``parameters`` (:meth:`refill`, before each sweep), the shards in this process or on
        ``client`` (:meth:`start`). Every draw is gathered from the shards (tests and small
        fits). stats as :meth:`NestedGibbs.run`'s."""
        n_sweeps = check_count("n_sweeps", n_sweeps, 1)
        if (parameters is None) != (self.mixing_top is None):
            raise ValueError("parameters must be given exactly when the sampler has group-mixing factors (mixing=)")
        shards = self.start(x0, priors, rng, client)
        top = self.split.top
        x_top = np.array(gathered([sh.root_sums() for sh in shards]), dtype=np.int64).reshape(len(shards), -1)
        check_exact_terms(top, x_top)
        state = (x_top, top.area_sums(x_top), top.term_sums(x_top).astype(np.int64))
        work = self.top_workspace()
        stream = new_stream(rng)
        stats = np.zeros(3, np.int64)
        failed = 0
        draws = np.empty((n_sweeps, self.n_leaves, top.n_cells), dtype=np.int64)
        for i in range(n_sweeps):
            if parameters is not None:
                self.refill(shards, state, parameters, priors)
            failed += self.sweep(shards, state, work, stream, stats)
            draws[i] = self.split.whole(gathered([sh.counts() for sh in shards]), self.n_leaves)
        return draws, {"moves": int(stats[0]), "trimmed_edges_hit": int(stats[1]),
                       "open_box_edges_hit": int(stats[2]), "moves_without_mass": int(failed)}

    def top_workspace(self) -> tuple:
        """The upper areas' workspace for :meth:`sweep` (:func:`~dpinfer.lattice.nested.kernel.workspace`)."""
        top = self.split.top
        meta, inv2v, values = self._tables
        return workspace(top.order, top.child_area, top.term_ptr, top.term_cells, top.term_value, top.term_table,
                         meta, inv2v, values, self._top_box, self._top_box)

    def sweep(self, shards, state, work, stream, stats) -> int:
        """One sweep: ``state`` = (the upper areas' counts, area sums, term sums), updated in
        place, and the shards'; ``work`` the upper areas' workspace; directions and the roots'
        sums drawn from ``stream``. One call per shard and direction. Returns the number of
        moves that found no mass."""
        top = self.split.top
        x_top, S_top, t_top = state
        meta, inv2v, values = self._tables
        ptr, cells, signs = sweep_directions(top.n_cells, np.array(top.cell_shape, np.int64), stream)
        messages = gathered([sh.begin_sweep(ptr, cells, signs) for sh in shards])
        self.directions_swept += ptr.size - 1
        failed = 0
        for i in range(ptr.size - 1):
            d, s = cells[ptr[i]:ptr[i + 1]], signs[ptr[i]:ptr[i + 1]]
            moved = all(w.size > 0 for w, _ in messages) and move(
                d, s, x_top, S_top, t_top, self._top_box, self._top_box, self._top_open, self._top_open,
                self._top_prior, self._top_prior_start, top.order, top.child_ptr, top.child_area, top.area_leaf,
                top.term_cells, top.term_value, top.term_table, meta, inv2v, values, self.trim, stream, stats,
                with_injected(work, messages))
            failed += not moved
            drawn = work[14][top.leaf_area] if moved else [None] * len(shards)  # shard k's root: leaf k
            messages = gathered([sh.split_then_message(None if r is None else int(r), i)
                                 for sh, r in zip(shards, drawn)])
        for hits in gathered([sh.end_sweep() for sh in shards]):
            stats[1:] += hits
        settle_term_sums(t_top, S_top, top.term_ptr, top.term_cells, work[2])
        return failed
