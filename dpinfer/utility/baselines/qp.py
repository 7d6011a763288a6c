"""The exact quadratic-programme solver behind the general least-squares baselines.

``min 1/2 x^T H x - h^T x  s.t.  A x = a, x >= 0``: a strictly convex quadratic programme solved
by a primal active-set method (Nocedal & Wright 2006, *Numerical Optimization*, 2nd ed.,
Algorithm 16.3). Each step solves the equality-constrained sub-problem on the free cells exactly
(Cholesky of ``H_FF + rho C_F^T C_F`` plus a Schur complement for the multipliers; with a
diagonal ``H``, as for ``Q = I``, only an m x m system), so the answer is exact up to
floating-point rounding. Feasibility is decided by a linear programme (HiGHS). The starting
working set comes from a few primal-dual active-set sweeps (Hintermueller, Ito & Kunisch 2002),
which usually hit the optimal set, so the active-set method only confirms it. The result is then
checked against the KKT conditions; see :data:`KKT_TOLERANCE`. Cost per step O(d^3) for a dense
``H``: fine for hundreds to a few thousand cells, not for millions.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.optimize

from dpinfer.utility.baselines.inputs import _constraint_basis

#: Relative tolerances of the KKT check applied to every general-QP solution. With
#: ``g = H x - h`` the gradient of ``1/2 sum_r ||Q_r x - s_r||^2 / v_r``:
#: primal ``|A x - a| <= 1e-9 * max(1, max_k sum_j |A_kj x_j|, max |a|)`` and ``x >= 0`` exactly;
#: dual: some ``lambda`` gives ``mu = g - A^T lambda`` with ``|mu_i| <= 1e-8 * G`` where
#: ``x_i > 0`` and ``mu_i >= -1e-8 * G`` where ``x_i = 0``, ``G = max(1, max(|H| |x|), max |h|)``.
KKT_TOLERANCE = {"primal": 1e-9, "dual": 1e-8}


class _QP:
    """min 1/2 x^T H x - h^T x  s.t.  C x = c (orthonormal rows), x >= 0 (optional).

    ``H`` is a 1-D array (a positive diagonal: Q = I, or queries on disjoint cells; each step
    then costs O(d m^2)) or a dense symmetric matrix (each step: a Cholesky factorisation of the
    free block, O(|F|^3))."""

    def __init__(self, H, h, C, c):
        self.h, self.C, self.c = h, C, c
        self.d = h.size
        if H.ndim == 1:
            self.diag, self.H = H, None
            self.rho = max(1.0, float(np.max(H)))
        else:
            self.diag, self.H = None, H
            self.rho = max(1.0, float(np.max(np.abs(np.diag(H)))))
        self.abs_h = float(np.max(np.abs(h)))

    def gradient(self, x: np.ndarray) -> np.ndarray:
        return (self.diag * x if self.diag is not None else self.H @ x) - self.h

    def gradient_scale(self, x: np.ndarray) -> float:
        hx = self.diag * np.abs(x) if self.diag is not None else np.abs(self.H) @ np.abs(x)
        return max(1.0, float(np.max(hx)), self.abs_h)

    def eqp(self, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Minimiser over the free cells (the others fixed at 0) subject to C x = c, and the
        multipliers lambda of C x = c (H y - h = C^T lambda on the free cells)."""
        h_f = self.h[free]
        C_f = self.C[:, free]
        if self.diag is not None:  # y = D^-1 (h + C^T lam),  C D^-1 C^T lam = c - C D^-1 h
            D = self.diag[free]
            y = h_f / D
            if self.C.shape[0] == 0:
                return y, np.zeros(0)
            CDi = C_f / D
            lam = np.linalg.lstsq(CDi @ C_f.T, self.c - C_f @ y, rcond=1e-12)[0]
            return y + CDi.T @ lam, lam
        # augmented Lagrangian form: K = H_FF + rho C_F^T C_F is positive definite when the
        # estimate is identified, and has the same constrained minimiser
        H_ff = self.H[np.ix_(free, free)]
        K = H_ff + self.rho * (C_f.T @ C_f)
        rhs = h_f + self.rho * (C_f.T @ self.c)
        try:
            factor = scipy.linalg.cho_factor(K, check_finite=False)
        except np.linalg.LinAlgError:
            raise RuntimeError(
                "quadratic-programme solver failed: the reduced Hessian is not positive definite "
                "(numerically unidentifiable estimate)"
            ) from None
        y = scipy.linalg.cho_solve(factor, rhs, check_finite=False)
        if self.C.shape[0] == 0:
            return y, np.zeros(0)
        KiCt = scipy.linalg.cho_solve(factor, C_f.T, check_finite=False)
        nu = np.linalg.lstsq(C_f @ KiCt, C_f @ y - self.c, rcond=1e-12)[0]
        return y - KiCt @ nu, -nu

    def solve(self, x0: np.ndarray, fixed0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """From a feasible x0 with x0 = 0 on ``fixed0``: (x, lambda, free set) at the optimum
        (Nocedal & Wright 2006, Algorithm 16.3, with bounds x_i >= 0 as the inequalities)."""
        x = np.maximum(x0, 0.0)
        fixed = fixed0.copy()
        x[fixed] = 0.0
        max_iter = 20 * (self.d + self.C.shape[0]) + 100
        for _ in range(max_iter):
            free = ~fixed
            idx = np.flatnonzero(free)
            y, lam = self.eqp(free)
            p = y - x[free]
            scale = max(1.0, float(np.max(np.abs(x))), float(np.max(np.abs(y), initial=0.0)))
            if np.max(np.abs(p), initial=0.0) <= 1e-11 * scale:
                x[free] = np.maximum(y, 0.0)  # y >= 0 up to rounding here
                x[fixed] = 0.0
                if not np.any(fixed):
                    return x, lam, free
                mu = self.gradient(x) - self.C.T @ lam
                fixed_idx = np.flatnonzero(fixed)
                j = int(np.argmin(mu[fixed_idx]))
                if mu[fixed_idx[j]] >= -1e-10 * self.gradient_scale(x):
                    return x, lam, free
                fixed[fixed_idx[j]] = False  # release the most negative multiplier
                continue
            xf = x[free]
            blocking = p < 0
            ratios = np.full(p.size, np.inf)
            ratios[blocking] = xf[blocking] / -p[blocking]
            k = int(np.argmin(ratios))
            if ratios[k] >= 1.0:
                x[free] = y
                continue
            x[free] = np.maximum(xf + ratios[k] * p, 0.0)
            x[idx[k]] = 0.0
            fixed[idx[k]] = True  # the first bound hit joins the working set
        raise RuntimeError(
            f"quadratic-programme solver failed: no convergence within {max_iter} active-set steps"
        )


def _feasible_point(A: np.ndarray, a: np.ndarray, zero: np.ndarray | None = None) -> np.ndarray | None:
    """Some x >= 0 with A x = a (and x = 0 where ``zero``), by linear programming; None if none."""
    d = A.shape[1]
    upper = np.full(d, np.inf)
    if zero is not None:
        upper[zero] = 0.0
    res = scipy.optimize.linprog(np.zeros(d), A_eq=A.astype(float), b_eq=a,
                                 bounds=np.column_stack([np.zeros(d), upper]), method="highs")
    if res.status == 2:
        return None
    if res.status != 0:
        raise RuntimeError(f"feasibility linear programme failed: {res.message}")
    return np.maximum(res.x, 0.0)


def _check_kkt(qp: _QP, A, a, x, lam, free, *, nonnegative: bool = True) -> None:
    """Verify the KKT conditions to KKT_TOLERANCE with the multipliers ``lam`` of C x = c
    (``range(C^T) = range(A^T)``) and the free set ``free``; RuntimeError if they fail."""
    if nonnegative and (np.any(x < 0) or np.any(x[~free] != 0)):
        raise RuntimeError("quadratic-programme solver failed: negative or non-zero fixed cell")
    if A is not None:
        Af = A.astype(float)
        pscale = max(1.0, float(np.max(np.abs(Af) @ np.abs(x))), float(np.max(np.abs(a))))
        presid = float(np.max(np.abs(Af @ x - a)))
        if presid > KKT_TOLERANCE["primal"] * pscale:
            raise RuntimeError(
                f"quadratic-programme solver failed: |A x - a| = {presid:.3g} exceeds the tolerance "
                f"{KKT_TOLERANCE['primal'] * pscale:.3g}"
            )
    mu = qp.gradient(x) - qp.C.T @ lam
    dual_tol = KKT_TOLERANCE["dual"] * qp.gradient_scale(x)
    bad_free = float(np.max(np.abs(mu[free]), initial=0.0))
    bad_sign = float(-np.min(mu[~free], initial=0.0))
    if bad_free > dual_tol or bad_sign > dual_tol:
        raise RuntimeError(
            "quadratic-programme solver failed the KKT check: stationarity residual "
            f"{bad_free:.3g}, most negative bound multiplier {-bad_sign:.3g} (tolerance {dual_tol:.3g})"
        )


def _warm_start(qp: _QP, A, a, guess: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A feasible start (x0, fixed set) for the active-set method. A few primal-dual active-set
    sweeps (fix the cells that are negative, free those whose multiplier is negative) usually
    find the optimal set outright; the active-set method then only confirms it. This only
    chooses the starting point: the answer is decided by the active-set method and its KKT check."""
    d = qp.d
    fixed = guess.copy()
    for _ in range(30):
        y, lam = qp.eqp(~fixed)
        x = np.zeros(d)
        x[~fixed] = y
        mu = qp.gradient(x) - qp.C.T @ lam
        new = np.where(fixed, mu > 0, x < 0)
        if np.array_equal(new, fixed):
            break
        fixed = new
    x = np.zeros(d)
    y, _ = qp.eqp(~fixed)
    x[~fixed] = y
    if np.all(x >= 0):
        if A is None:
            return x, fixed
        Af = A.astype(float)
        scale = max(1.0, float(np.max(np.abs(Af) @ np.abs(x))), float(np.max(np.abs(a))))
        if np.max(np.abs(Af @ x - a)) <= 1e-10 * scale:
            return x, fixed
    if A is None:
        return np.maximum(x, 0.0), fixed
    x0 = _feasible_point(A, a, zero=fixed)
    if x0 is not None:
        return x0, fixed
    return _feasible_point(A, a), np.zeros(d, dtype=bool)


def _solve_qp(H: np.ndarray, h: np.ndarray, A: np.ndarray | None, a: np.ndarray | None,
              *, nonnegative: bool = True, dense: bool = False, warm: bool = True) -> np.ndarray:
    """argmin 1/2 x^T H x - h^T x s.t. A x = a (if A given), x >= 0 (if nonnegative); exact
    primal active set, KKT-checked. For least squares ||M x - b||^2: H = M^T M, h = M^T b.

    ``H``: 1-D (a diagonal) or 2-D; a diagonal 2-D H is used as 1-D unless ``dense``. H must be
    positive definite on the null space of A (checked: ValueError otherwise). ``warm=False``
    starts the active-set method from a vertex of the feasible set (for testing the method)."""
    d = h.size
    if H.ndim == 2 and not dense:
        diag = np.diag(H)
        if np.all(diag > 0) and np.count_nonzero(H - np.diag(diag)) == 0:
            H = diag.copy()
    if A is not None:
        C, c = _constraint_basis(A, a)
    else:
        C, c = np.zeros((0, d)), np.zeros(0)
    if H.ndim == 1:
        if np.any(H <= 0):
            raise ValueError("the diagonal of the least-squares Hessian must be > 0")
    else:
        Hn = H / max(1e-300, float(np.max(np.abs(H))))
        rank = np.linalg.matrix_rank(Hn + C.T @ C, hermitian=True)
        if rank < d:
            raise ValueError(
                f"the queries and invariants do not determine the {d} cells (rank {rank} < {d}): "
                "the least-squares estimate is not unique; add queries or invariants"
            )
    qp = _QP(H, h, C, c)
    everything = np.ones(d, dtype=bool)
    y0, lam0 = qp.eqp(everything)
    if not nonnegative:
        _check_kkt(qp, A, a, y0, lam0, everything, nonnegative=False)
        return y0
    if A is not None and _feasible_point(A, a) is None:
        raise ValueError(
            "infeasible invariants: no x >= 0 satisfies invariants_matrix @ x = invariant_values"
        )
    if np.all(y0 >= 0):
        x, lam, free = y0, lam0, everything
    else:
        if warm:
            x0, fixed0 = _warm_start(qp, A, a, y0 < 0)
        else:
            x0 = np.zeros(d) if A is None else _feasible_point(A, a)
            fixed0 = np.zeros(d, dtype=bool)
        x, lam, free = qp.solve(x0, fixed0)
    _check_kkt(qp, A, a, x, lam, free)
    return x
