r"""Which directions a sweep of nested sums moves along, for cells that cross several axes.

When the cells are a product of axes (votingage x hispanic x race group) and the measurements
include precise margins over them (each area's total, its votingage x race table, ...), a
move along one cell, or one pair of cells, changes some of those margins and is pinned by
them: the chain would creep. The moves that keep margins are the **interaction directions** of
the cross-classification (the basic moves of contingency tables; Diaconis & Sturmfels 1998):
for a set S of axes, two levels a_k != b_k on each axis k in S and one level on every other
axis, the 2^|S| cells get signs prod_{k in S} (+1 at a_k, -1 at b_k). Such a move keeps every
margin that sums over at least one axis of S, so it is only as constrained as the margins that
keep all of S, the least precise ones. |S| = 1 are the pairs along one axis, |S| = 2 the
2 x 2 squares, |S| = 3 the cubes.

A sweep (:func:`sweep_products`) moves along every cell alone (random order), then, for every
non-empty set S of axes, along random interaction directions of S (levels drawn uniformly):
2 ceil(n_cells / 2) pairs for each axis, ceil(n_cells / 2^(|S| + 1)) squares or cubes for each
larger S. Each draw of the kernel is an exact Gibbs update given everything else
(:func:`dpinfer.lattice.nested.kernel.move`), so a sweep of random directions drawn
independently of the counts leaves the law invariant (a random-scan mixture of exact
updates). With one axis (``cell_shape = (n_cells,)``) the sweep is the cells and random pairs.

Why these counts (``benchmarks/README.md``, "Directions of a sweep"): a pair keeps every total
and margin the precise measurements pin, so it moves the split between two cells that a
single cell's move cannot; twice as many pairs and half as many squares and cubes as the
earlier ceil(n_cells / 2^|S|) of each raised the counts' ESS per sweep on 3 Iowa-shaped
counties given their empirical-Bayes hyperparameters (1% quantile over the counts 0.46 to
0.63-0.65, median 0.81 to 0.88) at 1.3 times the time of a sweep: about even per second, and
fewer stored draws for the same ESS (memory at the size of a state). The squares and cubes
stay, at a lower rate, because pairs alone do not connect the counts under equalities on two
crossed margins.
Together the directions of all S span every move of the cells, so with the single-cell moves
they connect the counts under equalities of disjoint or nested cell sets.
"""

from __future__ import annotations

import numpy as np

from dpinfer._kernel import kernel
from dpinfer._random_stream import below
from dpinfer.lattice.nested.kernel import move, settle_term_sums, workspace


@kernel(nogil=True)
def _shuffle(a, rng):
    for i in range(a.size - 1, 0, -1):
        j = below(rng, i + 1)
        a[i], a[j] = a[j], a[i]


@kernel(nogil=True)
def _interaction(subset, cell_shape, rng, cells, signs):
    """A random interaction direction of the axes in the bit mask ``subset`` into cells/signs;
    returns its number of cells (2^|S|)."""
    ndim = cell_shape.size
    a = np.empty(ndim, np.int64)
    b = np.empty(ndim, np.int64)
    for k in range(ndim):
        a[k] = below(rng, cell_shape[k])
        if subset >> k & 1:
            b[k] = below(rng, cell_shape[k] - 1)
            if b[k] >= a[k]:
                b[k] += 1
    in_s = np.empty(ndim, np.int64)
    m = 0
    for k in range(ndim):
        if subset >> k & 1:
            in_s[m] = k
            m += 1
    n = 1 << m
    for corner in range(n):
        flat = 0
        sign = 1
        j = 0
        for k in range(ndim):
            level = a[k]
            if j < m and in_s[j] == k:
                if corner >> j & 1:
                    level = b[k]
                    sign = -sign
                j += 1
            flat = flat * cell_shape[k] + level
        cells[corner] = flat
        signs[corner] = sign
    return n


@kernel(nogil=True)
def sweep_directions(n_cells, cell_shape, rng, pairs=2, larger=2):
    """The directions of one sweep (module docstring), drawn from ``rng``: (ptr, cells, signs),
    direction i the cells cells[ptr[i]:ptr[i + 1]] with their signs. ``pairs`` x
    ceil(n_cells / 2) pairs per axis and ceil(n_cells / (``larger`` 2^|S|)) directions per
    larger S (0: none; the defaults; ``benchmarks/bench_sweep_directions.py`` compares others)."""
    ndim = cell_shape.size
    counts = np.zeros(1 << ndim, np.int64)
    counts[0] = n_cells
    for subset in range(1, 1 << ndim):
        size = 0
        usable = True
        for k in range(ndim):
            if subset >> k & 1:
                size += 1
                if cell_shape[k] < 2:
                    usable = False
        if usable:
            counts[subset] = pairs * ((n_cells + 1) >> 1) if size == 1 else -(-n_cells // (larger << size)) if larger else 0
    total = 0
    width = 0
    for subset in range(1 << ndim):
        total += counts[subset]
        size = 0
        for k in range(ndim):
            size += subset >> k & 1
        width += counts[subset] << size
    ptr = np.zeros(total + 1, np.int64)
    cells = np.empty(width, np.int64)
    signs = np.empty(width, np.int64)
    perm = np.arange(n_cells)
    _shuffle(perm, rng)
    for i in range(n_cells):
        cells[i] = perm[i]
        signs[i] = 1
        ptr[i + 1] = i + 1
    i = n_cells
    for subset in range(1, 1 << ndim):
        for _ in range(counts[subset]):
            at = ptr[i]
            n = _interaction(subset, cell_shape, rng, cells[at:], signs[at:])
            ptr[i + 1] = at + n
            i += 1
    return ptr, cells, signs


@kernel(nogil=True)
def sweep_products(x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, prior_start, order, child_ptr,
                   child_area, area_leaf, term_ptr, term_cells, term_value, term_table, meta,
                   inv2v, values, trim, cell_shape, rng, stats, pairs=2, larger=2):
    """One sweep (module docstring) along :func:`sweep_directions`; returns the number of
    moves that found no mass."""
    work = workspace(order, child_area, term_ptr, term_cells, term_value, term_table, meta, inv2v, values, box_lo, box_hi)
    ptr, cells, signs = sweep_directions(x.shape[1], cell_shape, rng, pairs, larger)
    failed = 0
    for i in range(ptr.size - 1):
        if not move(cells[ptr[i]:ptr[i + 1]], signs[ptr[i]:ptr[i + 1]], x, S, tsum, box_lo, box_hi, lo_open, hi_open,
                    prior, prior_start, order, child_ptr, child_area, area_leaf, term_cells, term_value, term_table,
                    meta, inv2v, values, trim, rng, stats, work):
            failed += 1
    settle_term_sums(tsum, S, term_ptr, term_cells, work[2])
    return failed
