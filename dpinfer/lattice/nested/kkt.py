r"""The augmented least-squares system of a nested release and its exact KKT solves (shared by
:mod:`~dpinfer.utility.baselines.nested.gls` and :mod:`~dpinfer.lattice.nested.nnls`).

With x-space matrices a measurement at the root touches every leaf (M' V^-1 M is dense), so both
GLS and NNLS work on the **augmented system** of all area sums: variables z = S (n_areas *
n_cells), the measurements local to their area (Hessian H = A' V^-1 A block diagonal per area),
the tree as constraints S_{v,c} - sum_{u child of v} S_{u,c} = 0, and the equalities
sum_{c in cells_r} S_{v_r,c} = y_r. The KKT system ``[[H, C'], [C, 0]] [z; nu] = [A' V^-1 y; c]``
is sparse; it is factorised once by SuperLU (``scipy.sparse.linalg.splu``) in its regularised,
symmetric quasi-definite form ``[[H + eps I, C'], [C, -delta I]]`` (eps = delta = 1e-10 times
the median diagonal of H; this factorises without pivoting and tolerates redundant equalities)
and every solve is corrected by iterative refinement against the exact system until the
relative residual is below 1e-10, so the answer is the exact KKT solution up to rounding. A
solve whose refinement does not converge is reported as such (the system does not determine
its answer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from dpinfer.lattice.nested.structure import NestedSums

_REFINE_TOL = 1e-10  # relative residual of the refined KKT solves
_REFINE_STEPS = 30
_REG = 1e-10  # eps and delta of the regularised factor, relative to the median diagonal of H


@dataclass
class _System:
    """z = S (n_areas * n_cells); H = A' V^-1 A, h = A' V^-1 y; constraint rows (tree,
    equalities) C z = c; bound rows sign * (B z) <= sign * value."""

    sums: NestedSums
    H: scipy.sparse.csr_matrix
    h: np.ndarray
    C: scipy.sparse.csr_matrix
    c: np.ndarray
    eq_rows: np.ndarray  # term indices of the equality rows (after the tree rows)
    n_tree: int
    B: scipy.sparse.csr_matrix
    b: np.ndarray
    b_sign: np.ndarray
    leaf_z: np.ndarray  # (n_leaves * n_cells,) z index of each count
    scale: float

    @property
    def N(self) -> int:
        return self.H.shape[0]


def _term_rows(sums, rows) -> scipy.sparse.csr_matrix:
    """0/1 rows over z of the terms ``rows``: (area_r, c) for c in cells_r."""
    C = sums.n_cells
    r_idx, c_idx = np.nonzero(sums.term_cells[rows])
    cols = sums.term_area[rows][r_idx] * C + c_idx
    return scipy.sparse.csr_matrix((np.ones(r_idx.size), (r_idx, cols)), shape=(len(rows), sums.n_areas * C))


def _system(sums: NestedSums) -> _System:
    C = sums.n_cells
    N = sums.n_areas * C
    measured, equal, at_most, at_least, variance = sums.term_kinds()
    rows = np.flatnonzero(measured)
    A = _term_rows(sums, rows)
    w = 1.0 / variance[rows]
    H = (A.T @ scipy.sparse.diags(w) @ A).tocsr()
    h = A.T @ (w * sums.term_value[rows])
    # tree: S_{p,c} - sum_{u: parent u = p} S_{u,c} = 0, one row per (internal p, c)
    internal = np.flatnonzero(sums.area_leaf < 0)
    row_of = np.full(sums.n_areas, -1, np.int64)
    row_of[internal] = np.arange(internal.size)
    child = np.flatnonzero(sums.parent >= 0)
    cc = np.arange(C)
    r1 = (row_of[internal][:, None] * C + cc).reshape(-1)
    k1 = (internal[:, None] * C + cc).reshape(-1)
    r2 = (row_of[sums.parent[child]][:, None] * C + cc).reshape(-1)
    k2 = (child[:, None] * C + cc).reshape(-1)
    T = scipy.sparse.csr_matrix((np.concatenate([np.ones(r1.size), -np.ones(r2.size)]),
                                 (np.concatenate([r1, r2]), np.concatenate([k1, k2]))), shape=(internal.size * C, N))
    eq = np.flatnonzero(equal)
    E = _term_rows(sums, eq)
    Cmat = scipy.sparse.vstack([T, E]).tocsr()
    c = np.concatenate([np.zeros(T.shape[0]), sums.term_value[eq].astype(float)])
    bnd = np.flatnonzero(at_most | at_least)
    B = _term_rows(sums, bnd)
    sign = np.where(at_most[bnd], 1.0, -1.0)
    d = H.diagonal()
    scale = float(np.median(d[d > 0])) if np.any(d > 0) else 1.0
    leaf_z = (sums.leaf_area[:, None] * C + cc).reshape(-1)
    return _System(sums, H, np.asarray(h, float), Cmat, c, eq, T.shape[0], B,
                   sums.term_value[bnd].astype(float), sign, leaf_z, scale)


class _KKTSolver:
    """Exact solves of [[H_FF, C_F'], [C_F, 0]] [z_F; nu] = [top; bottom] (F the free z's): a
    SuperLU factor of the regularised quasi-definite matrix plus iterative refinement (module
    docstring). Constraint rows are scaled by the median diagonal of H."""

    def __init__(self, H, C, scale: float):
        self.n, self.m = H.shape[0], C.shape[0]
        self.scale = scale
        Cs = (C * scale).tocsr()
        self.K0 = scipy.sparse.bmat([[H, Cs.T], [Cs, None]], format="csc")
        reg = _REG * scale
        D = scipy.sparse.diags(np.concatenate([np.full(self.n, reg), np.full(self.m, -reg)]))
        Kr = (self.K0 + D).tocsc()
        self.lu = scipy.sparse.linalg.splu(Kr, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                                           options={"SymmetricMode": True})

    def solve(self, top, bottom):
        """(z, nu, converged): z (n, k), nu (m, k) multipliers of the unscaled rows, converged (k,)."""
        top = np.asarray(top, float)
        one = top.ndim == 1
        top = top.reshape(self.n, -1)
        bottom = np.asarray(bottom, float).reshape(self.m, -1) * self.scale
        b = np.vstack([top, bottom])
        norm = np.maximum(np.linalg.norm(b, axis=0), 1e-300)
        u = self.lu.solve(b)
        ok = np.zeros(b.shape[1], bool)
        for _ in range(_REFINE_STEPS):
            r = b - self.K0 @ u
            rel = np.linalg.norm(r, axis=0) / norm
            ok = rel <= _REFINE_TOL
            if np.all(ok):
                break
            u = u + self.lu.solve(r)
        else:
            r = b - self.K0 @ u
            ok = np.linalg.norm(r, axis=0) / norm <= _REFINE_TOL
        z, nu = u[:self.n], u[self.n:] * self.scale
        if one:
            return z[:, 0], nu[:, 0], bool(ok[0])
        return z, nu, ok

