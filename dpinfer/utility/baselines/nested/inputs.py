"""Arguments shared by the nested baselines: the release (a
:class:`~dpinfer.mechanisms.nested.NestedMeasurements` or its
:class:`~dpinfer.lattice.nested.structure.NestedSums`), its areas' names, and cell sets (a
boolean mask over the cells or cell indices)."""

from __future__ import annotations

import numpy as np

from dpinfer.lattice.nested.structure import NestedSums
from dpinfer.lattice.nested.structure import as_sums as _as_sums  # noqa: F401 - the baselines' name


def _area_names(release, sums: NestedSums) -> np.ndarray:
    names = getattr(release, "area_names", None)
    if names is not None and len(names) == sums.n_areas:
        return np.asarray(names, dtype=object)
    return np.arange(sums.n_areas).astype(str).astype(object)


def _cell_mask(cells, n_cells: int) -> np.ndarray:
    cells = np.asarray(cells)
    if cells.dtype == bool:
        if cells.shape != (n_cells,):
            raise ValueError(f"a cell mask must have {n_cells} entries, got shape {cells.shape}")
        mask = cells.copy()
    else:
        mask = np.zeros(n_cells, bool)
        idx = np.asarray(cells, dtype=np.int64).reshape(-1)
        if np.any((idx < 0) | (idx >= n_cells)):
            raise ValueError(f"cell indices must lie in 0 .. {n_cells - 1}")
        mask[idx] = True
    if not mask.any():
        raise ValueError("a cell set must hold at least one cell")
    return mask
