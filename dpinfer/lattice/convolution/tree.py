r"""The balanced convolution tree and its error bound: steps 2-3 of
:mod:`dpinfer.lattice.convolution`.

2. **Balanced binary tree** of pairwise convolutions of the tilted pmfs (each node is the pmf
   of a partial sum; groups of similar size share one batched tree, padded with point-mass
   cells). Each node keeps only its window (:mod:`dpinfer.lattice.convolution.windows`), so
   every level's array and FFT length is fixed before any convolution. Short children
   (length <= ``_DIRECT_MAX_LEN``) are convolved directly (sums of non-negative
   terms: relative error ~ ``L eps`` per entry, exact zeros stay zero); the pairs of a longer
   level by batched real FFTs: an FFT step transforms all nodes of a level at once, takes
   1-3 levels up by products of sibling spectra (levels inside a step are never inverted)
   and inverts the step's top level, with ``N >=`` every window length in the step (not
   ``2 L - 1``): circular convolutions, whose wrap-around only folds a node's own mass
   outside its window (< 2e-25) into it. Step lengths minimise a cost model of the
   transforms. FFT error is absolute, ~ ``eps log2(N)`` times the children's norms; negative
   round-off is clipped to 0 and entries outside the node's reachable interval are exactly 0.
   The root's value is only needed at ``t`` (a dot product of the two top nodes).
3. **A-posteriori error bound.** A bound on the 2-norm of each node's absolute error (FFT:
   ``C log2(N) eps (|a|_2 |b|_1 + |a|_1 |b|_2)`` per convolution; windows: the mass they
   drop; propagated by Young's inequality) gives at the root a bound on the relative error
   of ``V`` from FFT round-off and windows (~4e-13 for 100 cells, ~6e-11 for 3000; realised
   FFT errors are >= 14x below the per-convolution model, measured). Where it is too large the
   group is recomputed by the **log-space direct** tree (:func:`build_log`: logsumexp
   convolutions over the full ranges, no windows: no cancellation, no underflow; the policy
   is in :mod:`dpinfer.lattice.convolution.group_totals`). (The code also tracks the
   worst-case bound from ordinary rounding, ~``d W eps``; it is inherent to any float64
   product of ``d`` factors and is not a reason to fall back.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpinfer._kernel import kernel
from dpinfer.lattice.convolution.windows import WINDOW_LOG, plan_windows

_EPS = float(np.finfo(np.float64).eps)

# Children of length <= this are convolved directly; longer ones by FFT.
_DIRECT_MAX_LEN = 160

# Most tree levels spanned by one FFT step (the levels inside a step stay spectra), and the
# fixed cost of a step in units of N log2(N) (one transform of length N costs ~N log2(N)).
_FFT_MAX_STEP = 3
_FFT_CALL_COST = 4e4

# Constant in the FFT convolution error model  |err|_inf <= C log2(N) eps (|a|_2 |b|_1 + |a|_1 |b|_2).
_FFT_C = 2.0


@kernel(nogil=True)
def finite_range(a):
    """(lo, hi): the first and last finite entries of the log array a (lo > hi if none)."""
    lo = 0
    n = a.shape[0]
    while lo < n and a[lo] == -np.inf:
        lo += 1
    hi = n - 1
    while hi >= lo and a[hi] == -np.inf:
        hi -= 1
    return lo, hi


@kernel(nogil=True)
def _conv_pairs_lin(A):
    """(B, 2n, L) -> (B, n, 2L-1): out[b, j] = A[b, 2j] * A[b, 2j+1] (direct convolution)."""
    B, n2, L = A.shape
    n = n2 // 2
    out = np.zeros((B, n, 2 * L - 1))
    for b in range(B):
        for j in range(n):
            a = A[b, 2 * j]
            c = A[b, 2 * j + 1]
            o = out[b, j]
            # fixed trip counts: lets LLVM vectorise (trimming zero ends made it 3-5x slower)
            for p in range(L):
                ap = a[p]
                for q in range(L):
                    o[p + q] += ap * c[q]
    return out


@kernel(nogil=True)
def _conv_pairs_log(A):
    """Log-space version of _conv_pairs_lin (logsumexp over each anti-diagonal)."""
    B, n2, L = A.shape
    n = n2 // 2
    out = np.full((B, n, 2 * L - 1), -np.inf)
    for b in range(B):
        for j in range(n):
            a = A[b, 2 * j]
            c = A[b, 2 * j + 1]
            alo, ahi = finite_range(a)
            clo, chi = finite_range(c)
            if alo > ahi or clo > chi:
                continue
            for u in range(alo + clo, ahi + chi + 1):
                p0 = max(alo, u - chi)
                p1 = min(ahi, u - clo)
                mx = -np.inf
                for p in range(p0, p1 + 1):
                    x = a[p] + c[u - p]
                    if x > mx:
                        mx = x
                if mx == -np.inf:
                    continue
                s = 0.0
                for p in range(p0, p1 + 1):
                    s += math.exp(a[p] + c[u - p] - mx)
                out[b, j, u] = mx + math.log(s)
    return out


@dataclass
class Tree:
    log_mode: bool
    levels: list  # per level: node arrays (B, even n, L) (possibly views), or None for a level
    # kept only as spectra inside an FFT step; levels[-1] holds the 2 top nodes
    offs: list  # (B, n) partial sum held by entry 0 of each node's array (its window start)
    steps: list  # (a, b, N): levels a+1..b computed from level a, by direct pairwise
    # convolution (N = 0, b = a + 1) or by products of length-N spectra
    specs: list  # per level a..b-1 of an FFT step: its nodes' spectra (for the downward pass)
    origins: list  # per level a+1..b of an FFT step: partial sum at index 0 of its nodes' circular arrays
    root: np.ndarray  # (B,) value (or log value) of the total at t
    rel_bound: np.ndarray  # (B,) worst-case bound on the relative error of root (all rounding)
    fft_rel: np.ndarray  # (B,) part of rel_bound due to FFT round-off and windows (drives the fallback)


def _level_sizes(m):
    """Node counts of the levels of the tree over m >= 2 leaves, each made even by appending
    an identity node (a point mass at partial sum 0); the last level has the 2 top nodes."""
    sizes = []
    n = m
    while True:
        n += n % 2
        sizes.append(n)
        if n == 2:
            return sizes
        n //= 2


@kernel(nogil=True)
def root_messages(top, off, t, fill):
    """Messages of the two top nodes: O[b, 0, v] = top[b, 1, u - v] and O[b, 1, w] = top[b, 0, u - w]
    with u = t[b] - off[b, 0] - off[b, 1] (fill where u - v is outside the array)."""
    B, _, L = top.shape
    O = np.full((B, 2, L), fill)
    for b in range(B):
        u = t[b] - off[b, 0] - off[b, 1]
        for v in range(max(0, u - L + 1), min(L, u + 1)):
            O[b, 0, v] = top[b, 1, u - v]
            O[b, 1, v] = top[b, 0, u - v]
    return O


@kernel(nogil=True)
def _window_nodes(C, shift, valid, out):
    """Cut node windows out of convolution results.

    out[b, j, q] = max(C[b, j, (shift[b, j] + q) mod NC], 0) for q < valid[b, j], with
    0 <= shift < NC = C.shape[2] and valid <= NC; the rest of out must be zero on entry.
    Rows j >= C.shape[1] of out become identity nodes (1 at q = 0). Returns the rows'
    1-norms and squared 2-norms, (B, out.shape[1]) each."""
    B, n, NC = C.shape
    n_out = out.shape[1]
    S = np.ones((B, n_out))
    Q = np.ones((B, n_out))
    for b in range(B):
        for j in range(n):
            sh = shift[b, j]
            s1 = 0.0
            s2 = 0.0
            for q in range(valid[b, j]):
                p = sh + q
                if p >= NC:
                    p -= NC
                x = C[b, j, p]
                x = x if x > 0.0 else 0.0
                out[b, j, q] = x
                s1 += x
                s2 += x * x
            S[b, j] = s1
            Q[b, j] = s2
        for j in range(n, n_out):
            out[b, j, 0] = 1.0
    return S, Q


@kernel(nogil=True)
def _error_bounds(S, Q, sizes, lens, steps, m, drop, fft_c):
    """The error recursion of :func:`build_lin` up the tree; returns (e2, rho) of the two top
    nodes, (B, 2) each. S, Q (B, sum(sizes)): 1-norms and squared 2-norms of all nodes,
    level after level (read only at the bottom level of each step)."""
    B = S.shape[0]
    eps = np.finfo(np.float64).eps
    start = np.zeros(sizes.size + 1, np.int64)
    for lev in range(sizes.size):
        start[lev + 1] = start[lev] + sizes[lev]
    e2_top = np.empty((B, 2))
    rho_top = np.empty((B, 2))
    for b in range(B):
        e2 = np.zeros(sizes[0])  # per node of the current level (identity nodes: 0)
        rho = np.zeros(sizes[0])
        e2[:m] = drop
        for k in range(steps.shape[0]):
            a, top, N = steps[k, 0], steps[k, 1], steps[k, 2]
            Sa = S[b, start[a] : start[a] + sizes[a]]
            Qa = Q[b, start[a] : start[a] + sizes[a]]
            Sc = Sa.copy()  # 1-norms of the current level (exact: the convolved arrays are >= 0)
            for lev in range(a, top):
                L, n = lens[lev], sizes[lev]
                for j in range(n // 2):  # parent j of children 2j, 2j + 1 (in place: j <= 2j)
                    eL, eR, SL, SR = e2[2 * j], e2[2 * j + 1], Sc[2 * j], Sc[2 * j + 1]
                    e2[j] = eL * SR + SL * eR + eL * eR * math.sqrt(L) + drop
                    rho[j] = rho[2 * j] + rho[2 * j + 1] + 2 * L * eps
                    Sc[j] = SL * SR
                e2[n // 2 : sizes[lev + 1]] = 0.0
                rho[n // 2 : sizes[lev + 1]] = 0.0
                Sc[n // 2 : sizes[lev + 1]] = 1.0
            if N > 0:  # FFT round-off of each product of spectra, and the aliased tail mass
                g = 1 << (top - a)  # descendants at level a of a node of level top
                for j in range(sizes[top - 1] // 2):
                    term = 0.0
                    for i in range(j * g, min((j + 1) * g, sizes[a])):
                        others = 1.0
                        for i2 in range(j * g, min((j + 1) * g, sizes[a])):
                            if i2 != i:
                                others *= Sa[i2]
                        term += math.sqrt(Qa[i]) * others
                    e2[j] += fft_c * math.log2(N) * eps * term + drop
        e2_top[b] = e2[:2]
        rho_top[b] = rho[:2]
    return e2_top, rho_top


def _tree_steps(sizes, lens, all_levels):
    """Steps (a, b, N) of the upward pass over the levels: a direct pairwise level when the
    children are short (L_a <= _DIRECT_MAX_LEN); else an FFT step over 1.._FFT_MAX_STEP
    levels, of length N >= every window length in it, chosen by dynamic programming to
    minimise a cost model: a transform of length N costs N log2(N), a product of two
    spectra ~3 N. For marginals a step a -> b transforms level a's and level b's nodes
    once each way (up and down) and multiplies the spectra of the levels in between (1.5
    products per node); longer steps skip the levels in between but transform level a at a
    larger N. With ``all_levels`` (sampling: upward pass only, every level inverted) a step
    transforms level a forward and levels a+1..b back."""
    import scipy.fft  # imported where used: a large share of dpinfer's import time otherwise


    def step_cost(a, b):
        N = scipy.fft.next_fast_len(max(lens[a : b + 1]), real=True)
        if all_levels:
            transforms = sizes[a] + sum(sizes[a + 1 : b + 1])
            products = 0.5 * sum(sizes[a:b])
        else:
            transforms = 2 * (sizes[a] + sizes[b])
            products = 1.5 * sum(sizes[a:b])
        return N, transforms * N * math.log2(N) + products * 3 * N + _FFT_CALL_COST

    top = len(lens) - 1
    best = [0.0] * (top + 1)  # cheapest cost from level a to the top
    choice = [None] * (top + 1)
    for a in range(top - 1, -1, -1):
        if lens[a] <= _DIRECT_MAX_LEN:
            best[a], choice[a] = best[a + 1], (a, a + 1, 0)
            continue
        for b in range(a + 1, min(a + _FFT_MAX_STEP, top) + 1):
            N, cost = step_cost(a, b)
            if choice[a] is None or cost + best[b] < best[a]:
                best[a], choice[a] = cost + best[b], (a, b, N)
    steps, a = [], 0
    while a < top:
        steps.append(choice[a])
        a = choice[a][1]
    return steps


def build_lin(P, kmin, kmax, t, keep_fft, all_levels):
    """Upward pass in linear space. P (B, m>=2, W) tilted pmfs; kmin/kmax (B, m) finite range.

    A level holds its nodes on their windows, (B, n_l, L_l). Short levels are convolved
    pairwise, directly. Otherwise an FFT step takes a level a to a level b <= a + _FFT_MAX_STEP at
    once: one batched rfft of length N of all of level a's nodes, products of sibling
    spectra level by level (the spectrum of a parent is the product of its children's),
    and one batched irfft of level b's nodes, cut to their windows. Convolutions of length N
    are *circular*: entry p of a node's window receives, besides the value at partial sum
    p, the values at p +- N, ..., which lie outside the window (N >= every window length in
    the step) and so carry at most the node's tail mass (< 2 exp(-WINDOW_LOG)). Levels
    strictly inside a step exist only as spectra (for the downward pass), unless
    ``all_levels`` (the sampler needs every level): then they are inverted and cut too.

    Error model: e2 bounds the 2-norm of each node's absolute error. Errors of the inputs
    propagate by Young's inequality, ``|d(a * b)|_2 <= |da|_2 |b|_1 + |a|_1 |db|_2 +
    |da|_2 |db|_2 sqrt(L)`` (it holds for circular convolutions too), every level adds the
    window's dropped mass (<= 2 exp(-WINDOW_LOG)), and an FFT step adds the aliased tail
    mass and ``C log2(N) eps sum_i |a_i|_2 prod_{j != i} |a_j|_1`` for each node, the a_i
    being its descendants at level a (the forward transforms' errors, carried through
    spectra of modulus <= 1-norms; for a pair, ``|a|_2 |b|_1 + |a|_1 |b|_2``); rho bounds the
    relative error of direct sums of non-negative products. At the root,
    |err(t)| <= e2_L |R|_2 + |L|_2 e2_R + e2_L e2_R."""
    import scipy.fft  # imported where used: a large share of dpinfer's import time otherwise

    B, m, W = P.shape
    sizes = _level_sizes(m)
    top = len(sizes) - 1
    starts, ends = plan_windows(P, kmin, kmax, sizes)
    lens = [int((e - s).max()) + 1 for s, e in zip(starts, ends)]
    steps = _tree_steps(sizes, lens, all_levels)
    fft_width = {a: N for a, _, N in steps}  # step bottoms are zero-padded to their FFT length
    levels, specs, origins = [None] * (top + 1), [None] * (top + 1), [None] * (top + 1)
    nan = np.full((B, max(sizes)), np.nan)
    norms = [(nan[:, :n], nan[:, :n]) for n in sizes]

    def cut(lev, C, shift, n_real):
        """Level lev's windows out of the convolutions C (B, n_real, NC); returns its buffer."""
        buf = np.zeros((B, sizes[lev], max(lens[lev], fft_width.get(lev, 0))))
        valid = ends[lev][:, :n_real] - starts[lev][:, :n_real] + 1
        norms[lev] = _window_nodes(C, np.ascontiguousarray(shift), valid, buf)
        levels[lev] = buf[..., : lens[lev]]
        return buf

    buf = cut(0, P, starts[0][:, :m], m)
    for a, b, N in steps:
        n1 = sizes[a] // 2
        if N == 0:
            # each parent's window start relative to the start of its children's convolution
            shift = starts[b][:, :n1] - starts[a][:, 0::2] - starts[a][:, 1::2]
            buf = cut(b, _conv_pairs_lin(levels[a]), shift, n1)
            continue
        F = scipy.fft.rfft(buf, axis=-1)
        origin = starts[a]
        for lev in range(a, b):
            if keep_fft:
                specs[lev] = F
            n1 = sizes[lev] // 2
            G = np.empty((B, sizes[lev + 1], F.shape[-1]), np.complex128)
            np.multiply(F[:, 0::2], F[:, 1::2], out=G[:, :n1])
            G[:, n1:] = 1.0  # identity node (point mass at 0)
            F = G
            origin = _pad_identity(origin[:, 0::2] + origin[:, 1::2], sizes[lev + 1])
            origins[lev + 1] = origin
            if lev + 1 == b or all_levels:
                C = scipy.fft.irfft(F[:, :n1], n=N, axis=-1, overwrite_x=lev + 1 == b)
                buf = cut(lev + 1, C, (starts[lev + 1][:, :n1] - origin[:, :n1]) % N, n1)
    top_nodes = levels[top]
    root = np.einsum("bk,bk->b", top_nodes[:, 0], root_messages(top_nodes, starts[top], t, 0.0)[:, 0])
    S = np.concatenate([x[0] for x in norms], axis=1)
    Q = np.concatenate([x[1] for x in norms], axis=1)
    e2, rho = _error_bounds(S, Q, np.asarray(sizes), np.asarray(lens), np.asarray(steps, np.int64).reshape(-1, 3),
                            m, 2.0 * math.exp(-WINDOW_LOG), _FFT_C)
    nrm = np.sqrt(norms[top][1])
    abs_err = e2[:, 0] * nrm[:, 1] + nrm[:, 0] * e2[:, 1] + e2[:, 0] * e2[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        fft_rel = np.where(root > 1e-280, abs_err / root, np.inf)
    rel = rho[:, 0] + rho[:, 1] + (2 * lens[top]) * _EPS + fft_rel
    return Tree(False, levels, starts, steps, specs, origins, root, rel, fft_rel)


def _pad_identity(x, n):
    """Append zero columns (identity nodes) to a (B, n') int array up to n columns."""
    return x if x.shape[1] == n else np.concatenate([x, np.zeros((x.shape[0], n - x.shape[1]), x.dtype)], axis=1)


def build_log(logP, t):
    """Upward pass in log space (direct logsumexp convolutions, full ranges, no windows)."""
    B, m, W = logP.shape
    A = logP
    levels, offs = [], []
    for n in _level_sizes(m):
        if A.shape[1] < n:
            ident = np.full((B, n - A.shape[1], A.shape[2]), -np.inf)
            ident[:, :, 0] = 0.0
            A = np.concatenate([A, ident], axis=1)
        levels.append(A)
        offs.append(np.zeros((B, n), dtype=np.int64))
        if n > 2:
            A = _conv_pairs_log(A)
    top = levels[-1]
    terms = top[:, 0, :] + root_messages(top, offs[-1], t, -np.inf)[:, 0]
    mx = terms.max(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        root = mx + np.log(np.exp(terms - np.where(np.isfinite(mx), mx, 0.0)[:, None]).sum(axis=1))
    root = np.where(np.isfinite(mx), root, -np.inf)
    rel = np.full(root.shape, 4.0 * (m + len(levels)) * W * _EPS)
    steps = [(lev, lev + 1, 0) for lev in range(len(levels) - 1)]
    none = [None] * len(levels)
    return Tree(True, levels, offs, steps, none, none, root, rel, np.zeros(root.shape))


def log_cost(m, W):
    """Multiply-adds of a log-space up + down pass for a group of m cells."""
    cost, n, L = 0.0, m, W
    while n > 2:
        n += n % 2
        cost += (n // 2) * L * L
        n //= 2
        L = 2 * L - 1
    return 3.0 * cost


def subset_tree(tree, sel):
    def sub(xs):
        return [None if x is None else x[sel] for x in xs]

    return Tree(tree.log_mode, sub(tree.levels), sub(tree.offs), tree.steps, sub(tree.specs), sub(tree.origins),
                 tree.root[sel], tree.rel_bound[sel], tree.fft_rel[sel])
