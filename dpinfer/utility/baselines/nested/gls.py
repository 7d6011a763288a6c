r"""The generalised least-squares / best linear unbiased estimate of a nested release.

:func:`nested_gls` (the Census Bureau's GLS uncertainty evaluation of the 2020 noisy measurement
files, uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation; the first step of BlueDown):
``x^ = argmin_x sum_r (y_r - t_r(x))^2 / v_r  s.t.  E x = e`` over real x (no non-negativity,
no bounds, no integrality); Cov(x^) = Z (Z' M' V^-1 M Z)^-1 Z' with Z a basis of {E x = 0}; a
target's sd sqrt(d' Cov d); interval estimate -+ z_{0.95} sd (1.645 sd); a ratio by the delta
method.

The estimate is one solve of the augmented KKT system of area sums
(:mod:`~dpinfer.lattice.nested.kkt`). The covariance is never formed: for a
functional g (a target's d mapped to the leaves' sums; a ratio's delta-method gradient)
Var(g'z^) = g' P g with P the z-block of the KKT inverse, since P H P = P (Cov(A'V^-1 y) = H),
obtained by one solve with right-hand side [g; 0] -- blocks of many targets share the factor.
A target whose refinement does not converge is not estimable (the data and equalities do not
determine it): its estimate is NaN and its sd inf. A target of one area takes that area's
covariance from the two passes over the tree instead
(:mod:`~dpinfer.utility.baselines.nested.tree_pass`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scipy.sparse
import scipy.stats

from dpinfer.utility.baselines.nested.inputs import _as_sums
from dpinfer.lattice.nested.kkt import _KKTSolver, _System, _system
from dpinfer.utility.baselines.nested.targets import NestedTargets
from dpinfer.utility.baselines.nested.tree_pass import _tree_pass

__all__ = ["GLSFit", "nested_gls"]

_BLOCK = 128  # right-hand sides per block solve


@dataclass
class GLSFit:
    """The GLS/BLUE fit of a nested release (:func:`nested_gls`): ``counts`` x^ (n_leaves,
    n_cells), real and possibly negative (NaN where not estimable); :meth:`targets` gives the
    estimates, sds and intervals of targets from the one factorisation."""

    counts: np.ndarray
    method: str
    _system: _System = field(repr=False)
    _solver: _KKTSolver = field(repr=False)
    _z: np.ndarray = field(repr=False)
    #: (mean, cov) of every area's sums from the two-pass tree algorithm, or None
    tree: tuple | None = field(default=None, repr=False)

    def _functionals(self, W: scipy.sparse.csr_matrix) -> scipy.sparse.csr_matrix:
        """Weights over the counts -> the same functionals over z (the leaves' sums)."""
        W = W.tocoo()
        return scipy.sparse.csr_matrix((W.data.astype(float), (W.row, self._system.leaf_z[W.col])),
                                       shape=(W.shape[0], self._system.N))

    def _variances(self, G: scipy.sparse.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
        """g' P g for the rows g of G (blocks of right-hand sides), and whether each converged."""
        k = G.shape[0]
        var = np.empty(k)
        ok = np.empty(k, bool)
        zeros = None
        for i0 in range(0, k, _BLOCK):
            Gb = G[i0:i0 + _BLOCK]
            rhs = Gb.toarray().T
            if zeros is None or zeros.shape[1] != rhs.shape[1]:
                zeros = np.zeros((self._solver.m, rhs.shape[1]))
            u, _, conv = self._solver.solve(rhs, zeros)
            var[i0:i0 + Gb.shape[0]] = np.einsum("ij,ij->j", rhs, u)
            ok[i0:i0 + Gb.shape[0]] = conv
        return np.maximum(var, 0.0), ok

    def targets(self, targets: NestedTargets, prob: float = 0.9) -> pd.DataFrame:
        """Per target: estimate d'x^ (a ratio: a^/b^), sd sqrt(d' Cov d) (a ratio: the delta
        method, g = (d_A - r^ d_B) / b^), and the interval estimate -+ z sd, z = Phi^-1((1 + prob)/2)
        (1.645 at 0.9). Not estimable: NaN estimate and inf sd. Targets of one area use the tree
        pass's covariance of that area (module docstring), the others one KKT solve each (in
        blocks of right-hand sides sharing the factor)."""
        z = scipy.stats.norm.ppf(0.5 * (1.0 + prob))
        x = self._z[self._system.leaf_z]
        num = targets.numerator @ x
        den = targets.denominator @ x
        ratio = targets.is_ratio
        with np.errstate(divide="ignore", invalid="ignore"):
            est = np.where(ratio, num / den, num)
            # delta method: g = d_A / b - a d_B / b^2
            inv = np.where(ratio, 1.0 / den, 1.0)
            r = np.where(ratio, est, 0.0)
        inv = np.where(np.isfinite(inv), inv, 0.0)
        r = np.where(np.isfinite(r), r, 0.0)
        G = (scipy.sparse.diags(inv) @ (targets.numerator.astype(float)
                                         - scipy.sparse.diags(r) @ targets.denominator)).tocsr()
        var = np.empty(len(targets))
        ok = np.ones(len(targets), bool)
        # one area's sums (a ratio: of cell sets of the same area): g' Cov_v g from the tree pass
        local = (targets.num_area >= 0) & (~ratio | (targets.den_area == targets.num_area))
        if self.tree is not None and np.any(local):
            _, cov = self.tree
            i = np.flatnonzero(local)
            g = (inv[i, None] * (targets.num_cells[i] - r[i, None] * targets.den_cells[i]))
            var[i] = np.einsum("ki,kij,kj->k", g, cov[targets.num_area[i]], g)
        rest = np.flatnonzero(~local | (self.tree is None))
        if rest.size:
            var[rest], ok[rest] = self._variances(self._functionals(G[rest]))
        var = np.maximum(var, 0.0)
        ok &= np.isfinite(est)
        sd = np.where(ok, np.sqrt(var), np.inf)
        est = np.where(ok, est, np.nan)
        return pd.DataFrame({"label": targets.label, "group": targets.group, "estimate": est, "sd": sd,
                             "lower": est - z * sd, "upper": est + z * sd})


def nested_gls(release, *, tree: bool = True) -> GLSFit:
    r"""The GLS / BLUE of the counts from the measurements under the equalities.

    ``x^ = argmin_x sum_r (y_r - t_r(x))^2 / v_r  subject to  E x = e``, x real (no
    non-negativity, bounds or integrality), v_r = summed_r * sigma_r^2 the variance of
    measurement r. With uncorrelated noise this is the best linear unbiased estimate on the
    equality subspace (Aitken's theorem), Cov(x^) = Z (Z' M' V^-1 M Z)^-1 Z', Z a basis of
    {E x = 0}; it is the estimator of the Census Bureau's GLS uncertainty evaluation of the 2020
    NMF (uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation) and BlueDown's first step.
    Solved on the augmented system of area sums by one sparse factorisation
    (:mod:`~dpinfer.lattice.nested.kkt`: KKT system, SuperLU, iterative refinement);
    bounds are not used. Counts that the data do not determine are NaN. With ``tree`` (default)
    the two-pass tree algorithm also gives every area's covariance (``GLSFit.tree``), used by
    :meth:`GLSFit.targets` for one-area targets.
    """
    sums = _as_sums(release)
    system = _system(sums)
    solver = _KKTSolver(system.H, system.C, system.scale)
    z, _, ok = solver.solve(system.h, system.c)
    if not ok:
        raise RuntimeError("the GLS KKT system did not solve to 1e-10 (the equalities are inconsistent?)")
    passes = _tree_pass(sums) if tree else None
    fit = GLSFit(np.zeros((sums.n_leaves, sums.n_cells)), "KKT of the area sums (SuperLU + refinement)",
                 system, solver, z, passes)
    x = z[system.leaf_z]
    if passes is None and not _well_determined(sums):
        # counts the data may not determine: those whose variance solve does not converge
        eye = scipy.sparse.csr_matrix((np.ones(x.size), (np.arange(x.size), system.leaf_z)),
                                      shape=(x.size, system.N))
        _, conv = fit._variances(eye)
        x = np.where(conv, x, np.nan)
    fit.counts = x.reshape(sums.n_leaves, sums.n_cells)
    return fit


def _well_determined(sums) -> bool:
    """A sufficient check that every count is determined: every leaf's own measurements
    determine its cells (then M has full column rank)."""
    measured, *_ = sums.term_kinds()
    cells = sums.term_cells.astype(float)
    for v in sums.leaf_area:
        rows = np.arange(sums.term_ptr[v], sums.term_ptr[v + 1])
        A = cells[rows[measured[rows]]]
        if A.shape[0] < sums.n_cells or np.linalg.matrix_rank(A) < sums.n_cells:
            return False
    return True

