r"""Exact joint draws of the cells given their group's total by backward sampling through the
convolution tree: step 5 of :mod:`dpinfer.lattice.convolution`.

At the root the target is ``t``; at a node with target ``u`` the left child's partial sum
``v`` is drawn with probability ``\propto Left(v) Right(u - v)`` (inverse CDF), the right
child gets ``u - v``; recurse.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel


@kernel(nogil=True)
def _descend_level(A, off, is_log, tree_idx, u_par, unif):
    """One level of backward sampling.

    A (B, 2n, L) children arrays (pmf values, or logs if is_log), entry i of node c holding
    partial sum off[b, c] + i; tree_idx (S,) tree of each draw; u_par (S, >=n) parent targets
    (absolute partial sums); unif (S, n) uniforms in (0, 1]. Returns the children's targets
    (S, 2n); -1 marks a parent whose weights were all zero.
    """
    S = u_par.shape[0]
    n = A.shape[1] // 2
    L = A.shape[2]
    out = np.empty((S, 2 * n), np.int64)
    w = np.empty(L)
    for s in range(S):
        b = tree_idx[s]
        for j in range(n):
            left = A[b, 2 * j]
            right = A[b, 2 * j + 1]
            offl = off[b, 2 * j]
            u = u_par[s, j] - offl - off[b, 2 * j + 1]  # in window coordinates
            v0 = max(0, u - (L - 1))
            v1 = min(L - 1, u)
            total = 0.0
            if u_par[s, j] < 0 or v0 > v1:
                out[s, 2 * j] = -1
                out[s, 2 * j + 1] = -1
                continue
            if is_log:
                mx = -np.inf
                for v in range(v0, v1 + 1):
                    x = left[v] + right[u - v]
                    if x > mx:
                        mx = x
                for v in range(v0, v1 + 1):
                    x = left[v] + right[u - v]
                    wv = math.exp(x - mx) if mx > -np.inf else 0.0
                    w[v] = wv
                    total += wv
            else:
                for v in range(v0, v1 + 1):
                    wv = left[v] * right[u - v]
                    w[v] = wv
                    total += wv
            if not total > 0.0:
                out[s, 2 * j] = -1
                out[s, 2 * j + 1] = -1
                continue
            r = unif[s, j] * total
            cum = 0.0
            pick = -1
            last = -1
            for v in range(v0, v1 + 1):
                if w[v] > 0.0:
                    last = v
                    cum += w[v]
                    if cum >= r:
                        pick = v
                        break
            if pick < 0:  # r == total up to the summation order: take the last positive weight
                pick = last
            out[s, 2 * j] = offl + pick
            out[s, 2 * j + 1] = u_par[s, j] - offl - pick
    return out


def descend(tree, tree_idx, t, rng):
    """Backward sampling through a tree. tree_idx (S,) tree element of each draw; t (S,)."""
    S = tree_idx.shape[0]
    u = t[:, None].astype(np.int64)
    for lev in range(len(tree.levels) - 1, -1, -1):
        A = tree.levels[lev]
        n = A.shape[1] // 2
        unif = 1.0 - rng.random((S, n))
        u = _descend_level(np.ascontiguousarray(A), tree.offs[lev], tree.log_mode, tree_idx,
                           np.ascontiguousarray(u[:, :n]), unif)
    return u  # (S, padded m)
