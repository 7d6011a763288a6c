r"""Conditional cell marginals by the downward (outside) pass: step 4 of
:mod:`dpinfer.lattice.convolution`.

The message of a child is the correlation of its parent's message with its sibling (on FFT
levels one batched circular correlation per level, with the siblings' spectra kept from the
upward pass; a wrapped-around term pairs the child with a parent partial sum outside the
parent's window, so it enters the marginals weighted by that tail mass, < 2e-25, like the
window truncation itself); at a leaf, ``P(k_i = k | t) = p_i(k) O_i(k) / \hat P(t)``.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel
from dpinfer.lattice.convolution.tree import finite_range, root_messages


@kernel(nogil=True)
def _corr_down_lin(O, A):
    """Downward messages. O (B, n, 2L-1) parent messages, A (B, 2n, L) children ->
    (B, 2n, L) with out[2j](v) = sum_w O[j](v+w) A[2j+1](w) and symmetrically."""
    B, n2, L = A.shape
    n = n2 // 2
    out = np.zeros((B, n2, L))
    for b in range(B):
        for j in range(n):
            o = O[b, j]
            for side in range(2):
                sib = A[b, 2 * j + 1 - side]
                res = out[b, 2 * j + side]
                for w in range(L):
                    sw = sib[w]
                    for v in range(L):
                        res[v] += sw * o[v + w]
    return out


@kernel(nogil=True)
def _corr_down_log(O, A):
    """Log-space version of _corr_down_lin."""
    B, n2, L = A.shape
    n = n2 // 2
    out = np.full((B, n2, L), -np.inf)
    for b in range(B):
        for j in range(n):
            o = O[b, j]
            for side in range(2):
                sib = A[b, 2 * j + 1 - side]
                slo, shi = finite_range(sib)
                res = out[b, 2 * j + side]
                for v in range(L):
                    mx = -np.inf
                    for w in range(slo, shi + 1):
                        x = o[v + w] + sib[w]
                        if x > mx:
                            mx = x
                    if mx == -np.inf:
                        continue
                    s = 0.0
                    for w in range(slo, shi + 1):
                        s += math.exp(o[v + w] + sib[w] - mx)
                    res[v] = mx + math.log(s)
    return out


@kernel(nogil=True)
def _rebase(X, shift, length):
    """Y[b, j, q] = max(X[b, j, q + shift[b, j]], 0) for q = 0..length-1 (0 outside X)."""
    B, n, L = X.shape
    Y = np.zeros((B, n, length))
    for b in range(B):
        for j in range(n):
            sh = shift[b, j]
            for q in range(max(0, -sh), min(length, L - sh)):
                x = X[b, j, q + sh]
                Y[b, j, q] = x if x > 0.0 else 0.0
    return Y


@kernel(nogil=True)
def _scatter_circular(X, shift, N):
    """Y[b, j, (shift[b, j] + q) mod N] = max(X[b, j, q], 0) (q < X.shape[2] <= N, 0 <= shift < N),
    0 elsewhere. (Negative entries of X are FFT round-off.)"""
    B, n, L = X.shape
    Y = np.zeros((B, n, N))
    for b in range(B):
        for j in range(n):
            sh = shift[b, j]
            for q in range(L):
                p = sh + q
                if p >= N:
                    p -= N
                x = X[b, j, q]
                Y[b, j, p] = x if x > 0.0 else 0.0
    return Y


@kernel(nogil=True)
def _times_conj_sibling(FO, F):
    """Spectra of the downward correlations, in place of the children's spectra F (B, 2n, K):
    F[b, 2j + s] <- FO[b, j] * conj(F[b, 2j + 1 - s]). Returns F."""
    B, n, K = FO.shape
    for b in range(B):
        for j in range(n):
            o = FO[b, j]
            left = F[b, 2 * j]
            right = F[b, 2 * j + 1]
            for q in range(K):
                x = left[q]
                left[q] = o[q] * np.conj(right[q])
                right[q] = o[q] * np.conj(x)
    return F


def downward_lin(tree, t):
    """Leaf messages O_i on the leaves' windows, (B, padded m, L_0), for a linear tree.

    The message of a node is the (tilted) weight of all other cells of the group summing to
    t minus the node's partial sum; a child's is its parent's correlated with its sibling:
    O_c(v) = sum_w O_parent(v + w) A_sibling(w). In an FFT step this is a product of spectra,
    FO_c = FO_parent conj(F_sibling), level by level down the step, with one batched rfft of
    the top level's messages (placed at their windows' residues mod N) and one batched irfft
    of the bottom level's. The correlations are circular: a wrapped-around term pairs v + w
    with a parent partial sum outside the parent's window, so its weight in any marginal,
    sum_v A_c(v) sum_w A_sibling(w), is the parent's tail mass outside its window (< 2e-25).
    Consumes the tree's spectra (they are overwritten by the messages' spectra)."""
    import scipy.fft  # imported where used: a large share of dpinfer's import time otherwise

    top = len(tree.levels) - 1
    O = root_messages(tree.levels[top], tree.offs[top], t, 0.0)
    for a, b, N in reversed(tree.steps):
        A, off = tree.levels[a], tree.offs[a]
        n = tree.offs[b - 1].shape[1] // 2  # parents with children
        if N == 0:
            # parent message re-based to the children's summed window start (length 2L - 1)
            base = off[:, 0::2] + off[:, 1::2]
            O = _corr_down_lin(_rebase(np.ascontiguousarray(O[:, :n]), base - tree.offs[b][:, :n],
                                       2 * A.shape[2] - 1), A)
            continue
        shift = (tree.offs[b][:, :n] - tree.origins[b][:, :n]) % N
        FO = scipy.fft.rfft(_scatter_circular(np.ascontiguousarray(O[:, :n]), shift, N), axis=-1)
        for lev in range(b - 1, a - 1, -1):
            FO = _times_conj_sibling(np.ascontiguousarray(FO[:, : tree.offs[lev].shape[1] // 2]), tree.specs[lev])
            tree.specs[lev] = None
        O = scipy.fft.irfft(FO, n=N, axis=-1, overwrite_x=True)[..., : A.shape[2]]
    return O  # FFT levels leave round-off negatives: the callers clip at 0


@kernel(nogil=True, error_model="numpy")
def leaf_marginals(P, O, off, root):
    """marg[b, i, k] = P[b, i, k] max(O[b, i, k - off[b, i]], 0) / root[b] (0 where k - off is
    outside O)."""
    B, m, W = P.shape
    L = O.shape[2]
    out = np.zeros((B, m, W))
    for b in range(B):
        inv = 1.0 / root[b]
        for i in range(m):
            o = off[b, i]
            for k in range(max(0, o), min(W, o + L)):
                x = O[b, i, k - o]
                out[b, i, k] = P[b, i, k] * x * inv if x > 0.0 else 0.0
    return out


def downward_log(tree, t):
    """Leaf log-messages (B, padded m, W) for a log-space tree (same recursion as downward_lin)."""
    top, off = tree.levels[-1], tree.offs[-1]
    O = root_messages(top, off, t, -np.inf)
    for lev in range(len(tree.levels) - 2, -1, -1):
        A = tree.levels[lev]  # parents hold their full ranges (length 2L - 1, offset 0)
        O = _corr_down_log(np.ascontiguousarray(O[:, : A.shape[1] // 2]), A)
    return O
