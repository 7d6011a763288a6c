r"""The census model's complete-data score in its split concentrations theta = ``log_split``:
what the sharded state scan's empirical-Bayes estimate of theta reads from each shard and the
driver (:mod:`dpinfer.io.nmf.state_scan`).

Given the counts x and the leaf sizes, theta enters the census model
(:func:`~dpinfer.io.nmf.model.census_model`) through its Dirichlet-multinomial splits alone
(module docstring of :mod:`dpinfer.io.nmf.county_sizes`; the nation's negative binomial has a
fixed shape): for the areas h of level k, with sums S_h[c], splitting among their children j
(sums S_j[c], size shares w_j) with A = A_k[c] = exp(theta_k[c]),

    f_k[c](theta) = sum_h [lgamma(A) - lgamma(A + S_h) + sum_j (lgamma(A w_j + S_j) - lgamma(A w_j))],

so, with psi the digamma and psi_1 the trigamma function,

    df/dtheta   = A sum_h [psi(A) - psi(A + S_h) + sum_j w_j (psi(A w_j + S_j) - psi(A w_j))],
    d2f/dtheta2 = df/dtheta + A^2 sum_h [psi_1(A) - psi_1(A + S_h)
                                         + sum_j w_j^2 (psi_1(A w_j + S_j) - psi_1(A w_j))].

Each (level, cell) is a coordinate of its own (the complete-data Hessian in theta is
diagonal), and the sums over areas split over any partition of the areas: a shard sums its
counties' areas (levels up to the counties'), the driver the levels above, from the counties'
sizes and counts. The prior, log A_k[c] ~ Normal(2, 1.5), adds -(theta - 2) / 1.5^2 and
-1 / 1.5^2 once (:func:`prior_terms`). Checked against finite differences of the
log-gamma sums (``tests/test_split_score.py``).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.special import digamma, polygamma

PRIOR_MEAN, PRIOR_SD = 2.0, 1.5  # log A_k[c] ~ Normal(2, 1.5), census_model's prior


def split_score(log_size: np.ndarray, counts: np.ndarray, groups: list, log_split: np.ndarray) -> tuple:
    """The splits' score and curvature in theta of the tree whose units (the leaves, or the
    counties) have log sizes ``log_size`` (n_units,; up to a constant) and counts ``counts``
    (n_units, n_cells), and whose areas at each level are ``groups`` (a list: each unit's area
    at each level, finest first, numbered 0 .. n - 1; level 0 splits among the units, level k
    among the areas of level k - 1). ``log_split`` (len(groups), n_cells): theta at those levels.

    Returns (df/dtheta, d2f/dtheta2), each (len(groups), n_cells), without the prior's terms."""
    counts = np.asarray(counts, dtype=float)
    A = np.exp(np.asarray(log_split, dtype=float))
    units = np.exp(np.asarray(log_size, dtype=float) - np.max(log_size))
    score, curvature = np.zeros(A.shape), np.zeros(A.shape)
    for k, group in enumerate(groups):
        child = np.arange(units.size) if k == 0 else groups[k - 1]  # the children: units, or level k - 1's areas
        n_children = int(child.max()) + 1
        W, S = _summed(child, units[:, None], n_children)[:, 0], _summed(child, counts, n_children)
        parent = np.empty(n_children, dtype=np.int64)
        parent[child] = group
        n_parents = int(parent.max()) + 1
        W_parent, S_parent = _summed(parent, W[:, None], n_parents)[:, 0], _summed(parent, S, n_parents)
        w = (W / W_parent[parent])[:, None]
        aw = A[k][None, :] * w
        held = S > 0  # a child with no count adds nothing (and its share may underflow to 0)
        first = (n_parents * digamma(A[k]) - digamma(A[k][None, :] + S_parent).sum(axis=0)
                 + np.where(held, w * (digamma(aw + S) - digamma(np.where(held, aw, 1.0))), 0.0).sum(axis=0))
        second = (n_parents * polygamma(1, A[k]) - polygamma(1, A[k][None, :] + S_parent).sum(axis=0)
                  + np.where(held, w ** 2 * (polygamma(1, aw + S) - polygamma(1, np.where(held, aw, 1.0))),
                             0.0).sum(axis=0))
        score[k] = A[k] * first
        curvature[k] = score[k] + A[k] ** 2 * second
    return score, curvature


def prior_terms(log_split: np.ndarray) -> tuple:
    """The prior's score and curvature in theta (log A ~ Normal(2, 1.5)), each the shape of
    ``log_split``."""
    theta = np.asarray(log_split, dtype=float)
    return -(theta - PRIOR_MEAN) / PRIOR_SD ** 2, np.full(theta.shape, -1.0 / PRIOR_SD ** 2)


def _summed(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """The sums of the rows of ``values`` over each group of ``group`` (n_groups, columns)."""
    members = sparse.csr_matrix((np.ones(group.size), (group, np.arange(group.size))), shape=(n_groups, group.size))
    return np.asarray(members @ values)
