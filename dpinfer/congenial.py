r"""Privacy and normaliser of seed 000's congenial mechanism: additive noise conditioned on
equality invariants **and** non-negativity of the release (reference note 000 §2.6).

With base noise e_i ~ f i.i.d. and S*(x) = {s : A s = A x, s >= 0},

    p(s | x) = prod_i f(s_i - x_i) / P_x,      P_x = P(A e = 0, x + e >= 0),

on S*(x). Unlike the equality-only case the normaliser P_x depends on x, so

    log p(s | x) - log p(s | x') = [sum_i log f(s_i - x_i) - log f(s_i - x'_i)] + log(P_x' / P_x).

Theorem 2.1: for a base that is epsilon-DP, both terms are at most epsilon per unit distance,
so the conditioned mechanism is (1 + gamma) epsilon-DP with

    gamma* = max over neighbours of log(P_x' / P_x) / (epsilon ||x - x'||_1 / Delta)  in [0, 1].

:func:`congenial_privacy_audit` computes, by enumeration on small cases, the exact worst loss
per unit distance and gamma*; :func:`log_normaliser` gives log P_x exactly
(:meth:`dpinfer.Conditioned.log_normaliser` with ``nonnegative=True``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer.lattice.invariants import Invariants
from dpinfer.mechanisms.conditioned import Conditioned


def log_normaliser(base, invariants: Invariants, true_values) -> float:
    """log P(A e = 0, x + e >= 0) under i.i.d. ``base`` noise: per group by convolution for
    totals and group totals, with each cell's noise set to 0 below -x_i; otherwise a sum over
    the class-level noise lattice (:mod:`dpinfer.lattice.class_convolution`; noise tabulated to a tail
    mass of 1e-20 per cell)."""
    return Conditioned(base, invariants, nonnegative=True).log_normaliser(true_values)


@dataclass(frozen=True)
class CongenialAudit:
    """Exact privacy of the non-negativity-conditioned mechanism on a small case."""

    epsilon: float            # the base's epsilon (per unit of ||x - x'||_1 / Delta)
    measured_epsilon: float   # worst log p(s|x)/p(s|x') per unit distance
    gamma: float              # gamma*: worst log(P_x'/P_x) per unit distance, over epsilon
    worst_pair: tuple         # (x, x', s) attaining measured_epsilon

    @property
    def holds(self) -> bool:
        """Theorem 2.1: measured <= (1 + gamma*) epsilon <= 2 epsilon."""
        return self.measured_epsilon <= (1 + self.gamma) * self.epsilon * (1 + 1e-9) + 1e-12 and \
            self.gamma <= 1 + 1e-9


def congenial_privacy_audit(base, invariants: Invariants, *, max_true: int = 4,
                            margin: int = 12) -> CongenialAudit:
    """Every pair x != x' in {0..max_true}^d with equal invariants, every release s in S*(x)
    with |s_i - x_i| <= ``margin``: the exact loss (with both normalisers) divided by
    ||x - x'||_1 / Delta, and gamma*. For at most 4 cells."""
    d = invariants.n_cells
    if d > 4:
        raise ValueError(f"the audit enumerates all tables: at most 4 cells, got {d}")
    claim = base.privacy
    if claim.delta != 0:
        raise ValueError("Theorem 2.1 needs a pure-DP base (delta = 0)")
    grid = np.indices((max_true + 1,) * d).reshape(d, -1).T
    values = invariants.values(grid)
    log_p = {tuple(x): log_normaliser(base, invariants, x) for x in grid}
    box = np.indices((2 * margin + 1,) * d).reshape(d, -1).T - margin
    lattice = box[np.all(invariants.values(box) == 0, axis=1)]
    worst, gamma, pair = 0.0, 0.0, None
    for i, x in enumerate(grid):
        s = x + lattice
        s = s[np.all(s >= 0, axis=1)]
        for x2 in grid[np.all(values == values[i], axis=1)]:
            dist = np.abs(x - x2).sum() / claim.sensitivity
            if dist == 0:
                continue
            norm_gap = log_p[tuple(x2)] - log_p[tuple(x)]
            gamma = max(gamma, norm_gap / (claim.epsilon * dist))
            loss = (base.noise_logpdf(s - x).sum(axis=1) - base.noise_logpdf(s - x2).sum(axis=1)
                    + norm_gap) / dist
            j = int(np.argmax(loss))
            if loss[j] > worst:
                worst, pair = float(loss[j]), (tuple(x), tuple(x2), tuple(s[j]))
    return CongenialAudit(epsilon=claim.epsilon, measured_epsilon=worst, gamma=gamma, worst_pair=pair)
