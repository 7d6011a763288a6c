"""Arguments shared by the baselines: cell vectors, integer constraint matrices ``A``, group
labels and totals, and the system ``A x = a`` they state (consistency, an orthonormal basis of
it, whether it is disjoint group totals)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dpinfer._validation import as_integer_array, as_real_array


def _as_vector(name: str, values) -> np.ndarray:
    arr = as_real_array(name, values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of cell values, got shape {arr.shape}")
    return arr


def _as_matrix(name: str, values, d: int) -> np.ndarray:
    """An integer matrix with d columns (a 1-D array is one row)."""
    arr = np.asarray(values)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        real = as_real_array(name, arr)
        if np.any(real != np.round(real)):
            bad = real[real != np.round(real)].ravel()[:3]
            raise ValueError(f"{name} must hold whole numbers (integer coefficients); found {bad.tolist()}")
    arr = as_integer_array(name, arr)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != d or arr.shape[0] == 0:
        raise ValueError(
            f"{name} must be an integer matrix with {d} columns (one per cell) and at least one row, "
            f"got shape {np.shape(values)}"
        )
    return arr


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _group_codes(groups, d: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(groups)
    if g.dtype == object and all(isinstance(v, str) for v in g.ravel()):
        g = g.astype(str)  # pandas string columns arrive as object arrays
    if g.ndim != 1 or g.shape[0] != d:
        raise ValueError(f"groups must be a 1-D array of {d} labels (one per cell), got shape {g.shape}")
    if g.dtype.kind not in "iubUS":
        raise TypeError(f"groups must hold integer or string labels, got dtype {g.dtype}")
    labels, codes = np.unique(g, return_inverse=True)
    return labels, codes.astype(np.int64)


def _group_totals(invariant_values, labels: np.ndarray) -> np.ndarray:
    """Totals aligned with the sorted labels, from a mapping or a 1-D array."""
    if isinstance(invariant_values, Mapping):
        wanted = labels.tolist()
        if set(invariant_values) != set(wanted):
            raise ValueError(
                "invariant_values, given as a mapping, must have exactly one total per group label "
                f"{wanted[:10]}{' ...' if len(wanted) > 10 else ''}; got keys "
                f"{sorted(invariant_values, key=str)[:10]}"
            )
        values = [invariant_values[k] for k in wanted]
    else:
        values = invariant_values
    totals = as_real_array("invariant_values", values)
    if totals.ndim == 0:
        totals = totals[None]
    if totals.shape != labels.shape:
        raise ValueError(
            f"invariant_values must give one total per group ({labels.size} groups, in the order of "
            f"the sorted labels {labels.tolist()[:10]}), got shape {totals.shape}"
        )
    return totals


def _invariant_vector(invariant_values, m: int) -> np.ndarray:
    a = as_real_array("invariant_values", invariant_values)
    if a.ndim == 0:
        a = a[None]
    if a.shape != (m,):
        raise ValueError(
            f"invariant_values must have one value per row of invariants_matrix ({m}), got shape {a.shape}"
        )
    return a


def _constraint_basis(A: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An orthonormal-row system C x = c with the same solutions as A x = a (SVD).

    Raises ValueError if A x = a has no real solution (redundant rows with contradictory values)."""
    Af = A.astype(np.float64)
    U, S, Vt = np.linalg.svd(Af, full_matrices=False)
    tol = S.max() * max(Af.shape) * np.finfo(float).eps if S.size else 0.0
    r = int(np.sum(S > tol))
    C = Vt[:r]
    c = (U[:, :r].T @ a) / S[:r]
    resid = Af @ (C.T @ c) - a
    scale = max(1.0, float(np.max(np.abs(a))))
    if np.max(np.abs(resid)) > 1e-9 * scale:
        raise ValueError(
            "invariant_values is not consistent with invariants_matrix: no real x satisfies A x = a "
            f"(least-squares residual {np.max(np.abs(resid)):.3g}; redundant rows of A must carry "
            "matching values)"
        )
    return C, c


def _group_structure(A: np.ndarray) -> np.ndarray | None:
    """Row index per column (-1: in no row) if A's non-zero rows are disjoint 0/1 group
    indicators, else None."""
    if np.any((A != 0) & (A != 1)) or np.any(A.sum(axis=0) > 1):
        return None
    codes = np.full(A.shape[1], -1, dtype=np.int64)
    rows, cols = np.nonzero(A)
    codes[cols] = rows
    return codes


def _check_group_totals(totals: np.ndarray, labels: np.ndarray) -> None:
    if np.any(totals < 0):
        bad = [(lab, float(t)) for lab, t in zip(labels.tolist(), totals) if t < 0][:5]
        raise ValueError(
            f"infeasible invariants: no x >= 0 has these group totals, some are negative: {bad} "
            "(group label, total)"
        )
