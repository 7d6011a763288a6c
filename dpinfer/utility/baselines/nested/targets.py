"""Targets: the quantities the nested baselines are compared on.

A target is a linear functional d'x of the counts x[l, c] (leaf l, cell c; integer weights d
over the n_leaves * n_cells counts, flattened row-major) -- one cell at one leaf, an area's sum
of a cell S_{v,c} = sum_{l under v} x[l, c], an area's sum over a set of cells -- or a ratio
d_A'x / d_B'x (a share: Hispanic over total). :class:`NestedTargets` holds them, built by
:func:`area_cell_targets`, :func:`area_sum_targets`, :func:`ratio_targets` and joined by
:func:`concat_targets`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse

from dpinfer.utility.baselines.nested.inputs import _area_names, _as_sums, _cell_mask

__all__ = ["NestedTargets", "area_cell_targets", "area_sum_targets", "concat_targets", "ratio_targets"]


@dataclass(frozen=True)
class NestedTargets:
    """Targets d'x or d_A'x / d_B'x of the counts x (n_leaves, n_cells), flattened row-major.

    ``numerator`` (k, n_leaves * n_cells) integer weights; ``denominator`` the same shape, all
    zero in a row for a linear target (``is_ratio`` False). ``num_area``/``num_cells`` (and
    ``den_area``/``den_cells``): the area and cell set when the numerator (denominator) is one
    area's sum over a cell set (area -1 otherwise) -- what a per-cell tool would look up as a
    published cell. ``label`` names each target, ``group`` groups them for the comparison."""

    label: np.ndarray
    group: np.ndarray
    numerator: scipy.sparse.csr_matrix
    denominator: scipy.sparse.csr_matrix
    num_area: np.ndarray
    num_cells: np.ndarray
    den_area: np.ndarray
    den_cells: np.ndarray

    def __len__(self) -> int:
        return self.label.size

    @property
    def is_ratio(self) -> np.ndarray:
        return np.diff(self.denominator.indptr) > 0

    def values(self, counts) -> np.ndarray:
        """The targets at counts (n_leaves, n_cells) -> (k,), or at draws (D, n_leaves, n_cells)
        -> (D, k); a ratio with denominator 0 is NaN."""
        x = np.asarray(counts, dtype=float)
        single = x.ndim == 2
        X = x.reshape(1 if single else x.shape[0], -1)
        num = np.asarray((self.numerator @ X.T).T)
        den = np.asarray((self.denominator @ X.T).T)
        ratio = self.is_ratio
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(ratio, num / np.where(den == 0, np.nan, den), num)
        return out[0] if single else out


def _weights(sums, under, areas, masks) -> scipy.sparse.csr_matrix:
    """Rows: 1 on (l, c) for l under areas[i] and c in masks[i]."""
    rows, cols = [], []
    for i, (v, mask) in enumerate(zip(areas, masks)):
        leaves = under[int(v)]
        cells = np.flatnonzero(mask)
        c = (leaves[:, None] * sums.n_cells + cells[None, :]).reshape(-1)
        rows.append(np.full(c.size, i))
        cols.append(c)
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    return scipy.sparse.csr_matrix((np.ones(r.size, np.int64), (r, c)),
                                   shape=(len(areas), sums.n_leaves * sums.n_cells))


def _make_targets(release, labels, group, areas, masks, den_areas=None, den_masks=None) -> NestedTargets:
    sums = _as_sums(release)
    under = sums.leaves_under()
    k = len(areas)
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    if np.any((areas < 0) | (areas >= sums.n_areas)):
        raise ValueError(f"areas must be area indices 0 .. {sums.n_areas - 1}")
    masks = np.asarray(masks, dtype=bool).reshape(k, sums.n_cells)
    num = _weights(sums, under, areas, masks)
    if den_areas is None:
        den = scipy.sparse.csr_matrix(num.shape, dtype=np.int64)
        den_areas = np.full(k, -1, np.int64)
        den_masks = np.zeros((k, sums.n_cells), bool)
    else:
        den_areas = np.asarray(den_areas, dtype=np.int64).reshape(-1)
        den_masks = np.asarray(den_masks, dtype=bool).reshape(k, sums.n_cells)
        den = _weights(sums, under, den_areas, den_masks)
    groups = np.broadcast_to(np.asarray(group, dtype=object), (k,)).copy()
    return NestedTargets(np.asarray(labels, dtype=object), groups, num, den, areas, masks, den_areas, den_masks)


def area_cell_targets(release, areas, group: str, *, cells=None) -> NestedTargets:
    """Every (area, cell) for the ``areas`` and ``cells`` (default: all cells): the count of one
    cell summed over the area's leaves (at a leaf area: one latent count)."""
    sums = _as_sums(release)
    names = _area_names(release, sums)
    cells = np.arange(sums.n_cells) if cells is None else np.flatnonzero(_cell_mask(cells, sums.n_cells))
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    a = np.repeat(areas, cells.size)
    c = np.tile(cells, areas.size)
    masks = np.zeros((a.size, sums.n_cells), bool)
    masks[np.arange(a.size), c] = True
    labels = [f"{names[v]}, cell {j}" for v, j in zip(a, c)]
    return _make_targets(release, labels, group, a, masks)


def area_sum_targets(release, areas, cells, group: str, *, name: str | None = None) -> NestedTargets:
    """Every area's sum over one cell set ``cells`` (a mask or cell indices), e.g. a county's
    voting-age population."""
    sums = _as_sums(release)
    names = _area_names(release, sums)
    mask = _cell_mask(cells, sums.n_cells)
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    what = name or group
    return _make_targets(release, [f"{names[v]}, {what}" for v in areas], group, areas,
                         np.tile(mask, (areas.size, 1)))


def ratio_targets(release, areas, numerator_cells, denominator_cells, group: str, *,
                  name: str | None = None) -> NestedTargets:
    """Every area's ratio (sum over ``numerator_cells``) / (sum over ``denominator_cells``),
    e.g. the share Hispanic."""
    sums = _as_sums(release)
    names = _area_names(release, sums)
    num = _cell_mask(numerator_cells, sums.n_cells)
    den = _cell_mask(denominator_cells, sums.n_cells)
    areas = np.asarray(areas, dtype=np.int64).reshape(-1)
    what = name or group
    return _make_targets(release, [f"{names[v]}, {what}" for v in areas], group, areas,
                         np.tile(num, (areas.size, 1)), areas, np.tile(den, (areas.size, 1)))


def concat_targets(*targets: NestedTargets) -> NestedTargets:
    """The targets of several :class:`NestedTargets` in one."""
    if not targets:
        raise ValueError("give at least one NestedTargets")
    return NestedTargets(
        np.concatenate([t.label for t in targets]), np.concatenate([t.group for t in targets]),
        scipy.sparse.vstack([t.numerator for t in targets]).tocsr(),
        scipy.sparse.vstack([t.denominator for t in targets]).tocsr(),
        np.concatenate([t.num_area for t in targets]), np.concatenate([t.num_cells for t in targets]),
        np.concatenate([t.den_area for t in targets]), np.concatenate([t.den_cells for t in targets]))
