r"""The non-negative weighted least-squares projection of a nested release (TopDown-style
post-processing): :func:`nested_nnls`, the least-squares objective of
:mod:`~dpinfer.utility.baselines.nested.gls` with x >= 0, the equalities and the bounds as
constraints; point estimates only. Each step solves an equality-constrained problem on the
augmented KKT system of :mod:`~dpinfer.lattice.nested.kkt`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse

from dpinfer.lattice.nested.kkt import _KKTSolver, _system
from dpinfer.lattice.nested.structure import as_sums

__all__ = ["nested_nnls"]


def nested_nnls(release, *, bounds: bool = True, max_iter: int = 100) -> np.ndarray:
    r"""The non-negative weighted least-squares projection (TopDown-style post-processing):

    ``x^ = argmin_x sum_r (y_r - t_r(x))^2 / v_r  s.t.  E x = e, x >= 0`` and, with ``bounds``,
    the published bounds ``t_r(x) <= y_r`` / ``>= y_r``; real x, point estimates only.

    Solved by block principal pivoting (Kim & Park 2011, "Fast nonnegativity-constrained least
    squares algorithm", SIAM J. Sci. Comput. 33(6); Portugal, Judice & Vicente 1994), the
    complementarity pairs being x_i >= 0 and, with ``bounds``, each bound: every step solves the
    equality-constrained problem with the active pairs as equalities (fixed counts removed,
    active bounds as rows) on the augmented KKT system of
    :mod:`~dpinfer.lattice.nested.kkt`, and exchanges the pairs whose primal or
    multiplier sign is wrong (all of them while their number falls, with Kim & Park's three-step
    allowance, else the largest index only). Equalities to 0 fix their
    counts at 0 before the start. Ends at a KKT point (x >= 0, multipliers >= 0 to 1e-9
    relative), which is the unique minimiser when the counts are determined.
    """
    sums = as_sums(release)
    system = _system(sums)
    n_x = system.leaf_z.size
    N = system.N
    # structural zeros: an equality to 0 fixes its counts at 0 (with x >= 0)
    fixed0 = np.zeros(N, bool)
    keep_eq = np.ones(system.eq_rows.size, bool)
    E = system.C[system.n_tree:]
    is_leaf_z = np.zeros(N, bool)
    is_leaf_z[system.leaf_z] = True
    under = None
    for i, r in enumerate(system.eq_rows):
        if sums.term_value[r] == 0:
            if under is None:
                under = sums.leaves_under()
            leaves = under[sums.term_area[r]]
            cells = np.flatnonzero(sums.term_cells[r])
            fixed0[(sums.leaf_area[leaves][:, None] * sums.n_cells + cells).reshape(-1)] = True
            keep_eq[i] = False
    n_b = system.B.shape[0] if bounds else 0
    # pairs: counts 0..n_x-1 (in leaf_z order), then bounds
    active = np.zeros(n_x + n_b, bool)
    active[:n_x] = fixed0[system.leaf_z]
    frozen = active.copy()
    base_rows = scipy.sparse.vstack([system.C[:system.n_tree], E[keep_eq]]).tocsr()
    base_c = np.concatenate([system.c[:system.n_tree], system.c[system.n_tree:][keep_eq]])
    Bs = (scipy.sparse.diags(system.b_sign) @ system.B).tocsr() if n_b else None
    bval = system.b_sign * system.b if n_b else None
    n_inf, allowance = n_x + n_b + 1, 3
    for _ in range(max_iter):
        free = np.ones(N, bool)
        free[system.leaf_z[active[:n_x]]] = False
        act_b = np.flatnonzero(active[n_x:]) if n_b else np.zeros(0, np.int64)
        rows = base_rows if act_b.size == 0 else scipy.sparse.vstack([base_rows, Bs[act_b]]).tocsr()
        rhs_c = base_c if act_b.size == 0 else np.concatenate([base_c, bval[act_b]])
        Fi = np.flatnonzero(free)
        solver = _KKTSolver(system.H[Fi][:, Fi], rows[:, Fi], system.scale)
        zF, nu, ok = solver.solve(system.h[Fi], rhs_c)
        if not ok:
            raise RuntimeError("NNLS: an equality-constrained step did not solve (the equalities, bounds "
                               "and x >= 0 may be infeasible)")
        z = np.zeros(N)
        z[Fi] = zF
        grad = system.H @ z - system.h + rows.T @ nu  # = multipliers of x >= 0 on fixed coords
        x = z[system.leaf_z]
        xtol = 1e-9 * max(1.0, float(np.max(np.abs(x))))
        gtol = 1e-9 * max(1.0, float(np.max(np.abs(system.h))), float(np.max(np.abs(system.H @ np.abs(z)))))
        bad = np.zeros(n_x + n_b, bool)
        bad[:n_x] = np.where(active[:n_x], grad[system.leaf_z] < -gtol, x < -xtol) & ~frozen[:n_x]
        if n_b:
            slack = Bs @ z - bval
            mult = np.zeros(n_b)
            mult[act_b] = nu[base_rows.shape[0]:]
            btol = 1e-9 * max(1.0, float(np.max(np.abs(bval))))
            bad[n_x:] = np.where(active[n_x:], mult < -gtol, slack > btol)
        v = np.flatnonzero(bad)
        if v.size == 0:
            out = np.maximum(x, 0.0)
            return out.reshape(sums.n_leaves, sums.n_cells)
        if v.size < n_inf:
            n_inf, allowance = v.size, 3
            flip = v
        elif allowance >= 1:
            allowance -= 1
            flip = v
        else:
            flip = v[-1:]
        active[flip] = ~active[flip]
    raise RuntimeError(f"NNLS: block principal pivoting did not end in {max_iter} steps")

