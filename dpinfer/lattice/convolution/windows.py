r"""Windows of the convolution tree's nodes, from Chernoff bounds (part of step 2 of
:mod:`dpinfer.lattice.convolution`).

Each node of the linear-space tree (:mod:`dpinfer.lattice.convolution.tree`) keeps only a
**window** of partial sums outside which its tilted mass is provably below 1e-25 on either
side (Chernoff bounds from the cells' exact cumulant generating functions, which add up the
tree): a node of ``m`` cells spans ``m (W - 1) + 1`` sums but its bulk only ~``sqrt(m)`` of
them, so long nodes stay short. All windows -- hence every level's array and FFT length -- are
fixed before any convolution.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpinfer._kernel import kernel


# A node's window leaves out tilted mass <= exp(-WINDOW_LOG) = 1e-25 on either side.
WINDOW_LOG = 25 * math.log(10.0)


@functools.lru_cache(maxsize=16)
def _cgf_table(W):
    """Grid s (S,) and the matrix [k, exp(s k), exp(-s k)] (W, 1 + 2S) of :func:`_cgf_grid`."""
    s_max = min(4.0, 300.0 / max(W - 1, 1))
    s = s_max * 2.0 ** (-np.arange(24) / 2.0)
    k = np.arange(W, dtype=np.float64)
    sk = np.outer(k, s)
    return s, np.concatenate([k[:, None], np.exp(sk), np.exp(-sk)], axis=1)


def _cgf_grid(P):
    """Per-cell tilted means and upper bounds on the cumulant generating functions K_i(+-s)
    on a grid of s > 0.

    K_i(s) = log E exp(s (k_i - mu_i)); by Chernoff, P(S - mu >= a) <= exp(K(s) - s a) for the
    sum S of any set of cells (K and mu add). Entries of P below 1e-150 are left out of the
    matrix product (their products with exp(-s k) would be subnormal, which is ~30x slower)
    and their total mass r is added back at the largest factor, so the K's stay upper
    bounds; s (W - 1) <= 300 keeps that correction below ~1e-16 relative."""
    W = P.shape[-1]
    s, E = _cgf_table(W)
    S = s.size
    small = P < 1e-150
    has_small = small.any()
    if has_small:
        r = np.where(small, P, 0.0).sum(axis=-1)[..., None]
        P = np.where(small, 0.0, P)
    M = (P.reshape(-1, W) @ E).reshape(P.shape[:-1] + (1 + 2 * S,))  # one 2-D product (BLAS)
    mu, Mp, Mn = M[..., 0], M[..., 1 : S + 1], M[..., S + 1 :]
    if has_small:
        Mp = Mp + r * np.exp(s * (W - 1))
        Mn = Mn + r
    with np.errstate(divide="ignore"):
        Kp = np.log(Mp) - mu[..., None] * s
        Kn = np.log(Mn) + mu[..., None] * s
    return mu, Kp, Kn, s


@kernel(nogil=True)
def _plan_kernel(mu, Kp, Kn, s, kmin, kmax, sizes, log_tail):
    """Windows of all nodes, level after level, in flat (B, sum(sizes)) arrays (see plan_windows)."""
    B, m, S = Kp.shape
    total = 0
    for n in sizes:
        total += n
    start = np.zeros((B, total), np.int64)
    end = np.zeros((B, total), np.int64)
    n0 = sizes[0]
    for b in range(B):
        # per-node mean, CGF bounds and reachable range at the current level; identity
        # nodes (beyond the real ones) have mu = K = 0 and range [0, 0]
        cmu = np.zeros(n0)
        cKp = np.zeros((n0, S))
        cKn = np.zeros((n0, S))
        lo = np.zeros(n0, np.int64)
        hi = np.zeros(n0, np.int64)
        cmu[:m] = mu[b]
        cKp[:m] = Kp[b]
        cKn[:m] = Kn[b]
        lo[:m] = kmin[b]
        hi[:m] = kmax[b]
        n = m  # real nodes of the current level
        pos = 0
        for lev in range(sizes.size):
            for j in range(n):
                a_plus = np.inf
                a_minus = np.inf
                for q in range(S):
                    a_plus = min(a_plus, (cKp[j, q] + log_tail) / s[q])
                    a_minus = min(a_minus, (cKn[j, q] + log_tail) / s[q])
                st = max(lo[j], int(math.floor(cmu[j] - a_minus)) - 1)
                en = min(hi[j], int(math.ceil(cmu[j] + a_plus)) + 1)
                start[b, pos + j] = st
                end[b, pos + j] = max(en, st)
            nl = sizes[lev]
            for j in range(n, nl):
                cmu[j] = 0.0
                cKp[j] = 0.0
                cKn[j] = 0.0
            n = nl // 2
            for j in range(n):  # parents: CGFs add; range = sum of the children's windows
                cmu[j] = cmu[2 * j] + cmu[2 * j + 1]
                cKp[j] = cKp[2 * j] + cKp[2 * j + 1]
                cKn[j] = cKn[2 * j] + cKn[2 * j + 1]
                lo[j] = start[b, pos + 2 * j] + start[b, pos + 2 * j + 1]
                hi[j] = end[b, pos + 2 * j] + end[b, pos + 2 * j + 1]
            pos += nl
    return start, end


def plan_windows(P, kmin, kmax, sizes):
    """Windows [start, end] (two (B, n) int arrays per level) of every node of the tree.

    A node's window is [floor(mu - a_-) - 1, ceil(mu + a_+) + 1] with the Chernoff distances
    a_+- = min_s (K(+-s) + WINDOW_LOG) / s, clipped for a leaf to its finite range
    [kmin, kmax] and for an inner node to the sum of its children's windows (where its
    computed values live); identity nodes get [0, 0]. The Chernoff bounds only need the
    cells' CGFs, which add up the tree, so all windows (hence all array and FFT lengths) are
    known before any convolution."""
    mu, Kp, Kn, s = _cgf_grid(P)
    start, end = _plan_kernel(mu, Kp, Kn, s, kmin, kmax, np.asarray(sizes, np.int64), WINDOW_LOG)
    bounds = np.cumsum([0] + list(sizes))
    # contiguous copies: a view's layout (numba's type) would depend on B
    starts = [np.ascontiguousarray(start[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    ends = [np.ascontiguousarray(end[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return starts, ends
