r"""Every area's GLS covariance by two passes over the tree.

A target that is one area's sum over a cell set (a leaf's cell, a county's cell, a county's
voting-age population; a ratio of two cell sets of one area) needs only that area's covariance
of the GLS estimate (:mod:`~dpinfer.utility.baselines.nested.gls`), and every area's covariance
comes from one **two-pass algorithm on the tree** (:func:`_tree_pass`; the bottom-up / top-down
GLS passes of the Census Bureau's GLS evaluation,
uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation, here as a Kalman filter and
Rauch-Tung-Striebel smoother on the tree of sums) in
O(n_areas * n_cells^3), when every leaf's own measurements determine its cells (otherwise, and
for any other target, the KKT solves of :mod:`~dpinfer.lattice.nested.kkt` serve).
Both give the same numbers (tested).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from dpinfer.lattice.nested.structure import NestedSums


def _pinvh(M: np.ndarray) -> np.ndarray:
    w, V = np.linalg.eigh(0.5 * (M + M.T))
    keep = w > 1e-11 * max(float(np.max(np.abs(w))), 1e-300)
    return (V[:, keep] / w[keep]) @ V[:, keep].T


def _update(mu, cov, A, y, R):
    """Condition N(mu, cov) on A S = y + noise of variances R (0: exact), Kalman form with a
    pseudo-inverse (degenerate laws, redundant rows)."""
    if A.shape[0] == 0:
        return mu, cov
    CA = cov @ A.T
    Sg = A @ CA + np.diag(R)
    if np.all(R > 0):  # noisy rows: S is positive definite
        K = scipy.linalg.cho_solve(scipy.linalg.cho_factor(Sg), CA.T).T
    else:
        K = CA @ _pinvh(Sg)
    mu = mu + K @ (y - A @ mu)
    cov = cov - K @ CA.T
    return mu, 0.5 * (cov + cov.T)


def _tree_pass(sums: NestedSums):
    """(mean (n_areas, C), cov (n_areas, C, C)) of the GLS estimates of every area's sums, by two
    passes over the tree (a Kalman filter and Rauch-Tung-Striebel smoother on the tree of sums):
    up, each area's GLS estimate from the data of its subtree alone -- at a leaf from its own
    measurements (flat prior: needs them to determine all its cells), inside as the sum of its
    children's (independent: disjoint data) conditioned on its own measurements and
    equalities; down, the children's joint law given their sum S_v (m_v = sum of the children's
    up means, P_v = sum of their covariances) carries the parent's final law down:
    mu_u = mu_u^up + G (mu_v - m_v), Cov_u = Cov_u^up - G Cov_u^up + G Cov_v G', G = Cov_u^up P_v^+.
    None when a leaf's own measurements do not determine its cells (then the KKT solves serve)."""
    C = sums.n_cells
    measured, equal, _, _, variance = sums.term_kinds()
    n = sums.n_areas
    mu = np.zeros((n, C))
    cov = np.zeros((n, C, C))
    m_pre = np.zeros((n, C))
    P_pre = np.zeros((n, C, C))
    cells = sums.term_cells.astype(float)
    y_all = sums.term_value.astype(float)
    for v in sums.order:
        rows = np.arange(sums.term_ptr[v], sums.term_ptr[v + 1])
        meas, eq = rows[measured[rows]], rows[equal[rows]]
        A, y, R = cells[meas], y_all[meas], variance[meas]
        if sums.area_leaf[v] >= 0:
            J = (A.T / R) @ A
            w, V = np.linalg.eigh(J)
            if w[0] <= 1e-9 * max(float(w[-1]), 1e-300):
                return None
            c = (V / w) @ V.T
            m = c @ (A.T @ (y / R))
        else:
            kids = sums.child_area[sums.child_ptr[v]:sums.child_ptr[v + 1]]
            m = mu[kids].sum(0)
            c = cov[kids].sum(0)
            m_pre[v], P_pre[v] = m, c
            m, c = _update(m, c, A, y, R)
        mu[v], cov[v] = _update(m, 0.5 * (c + c.T), cells[eq], y_all[eq], np.zeros(eq.size))
    for v in sums.order[::-1]:
        kids = sums.child_area[sums.child_ptr[v]:sums.child_ptr[v + 1]]
        if kids.size == 0:
            continue
        Pinv = _pinvh(P_pre[v])
        d = mu[v] - m_pre[v]
        for u in kids:
            G = cov[u] @ Pinv
            mu[u] = mu[u] + G @ d
            cu = cov[u] - G @ cov[u] + G @ cov[v] @ G.T
            cov[u] = 0.5 * (cu + cu.T)
    return mu, cov

