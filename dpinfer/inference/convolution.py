r"""Convolutions of per-cell weight vectors evaluated at group totals (inference notes §2).

Cells ``i = 1..d`` are partitioned into groups (``groups[i]`` in ``0..G-1``). Cell ``i`` has
non-negative weights ``g_i(k)``, given as ``log_g[i, k]`` for offsets ``k = 0..W-1``
(``-inf`` marks an impossible offset). For group ``g`` with target total ``t_g``

.. math::

    V_g = \sum_{(k_i)_{i \in g}:\ \sum_i k_i = t_g} \prod_{i \in g} g_i(k_i)
        = (g_{i_1} * g_{i_2} * \cdots)(t_g),

the discrete convolution of the group's vectors evaluated at ``t_g``. With
``g_i(k) = p(x_i = s_i + k | \theta) f(-k)`` this is, up to a constant, the likelihood of a
release whose noise was conditioned on a fixed total (inference notes §2). Further

.. math::

    \frac{\partial \log V_g}{\partial \log g_i(k)} = P(k_i = k \mid \textstyle\sum_{j \in g} k_j = t_g),

the conditional cell marginals under the product law ``\prod_i g_i(k_i)`` (the gradient used
by NUTS), and exact joint draws of ``(k_i)`` given every group's total come from the same tree.

Algorithm (per group)
---------------------
1. **Exponential tilting.** ``g_i(k) -> g_i(k) e^{\lambda (k - c_i)} / Z_i`` with one
   ``\lambda`` per group, solved by safeguarded Newton/bisection so that the tilted mean of the
   group total is ``t_g`` (to within 0.1 tilted sd; any ``\lambda`` is exact, it only decides
   where the bulk sits), ``c_i`` an integer near the tilted mean of cell ``i`` (keeps the
   exponents small) and ``Z_i`` the normaliser. Then ``V = \prod_i Z_i \cdot
   e^{-\lambda (t - \sum_i c_i)} \cdot \hat P(\sum_i k_i = t)`` and ``\hat P(\sum k = t)`` --
   the tilted law's value at its own mean -- is in the bulk, ``O(1/\mathrm{sd})``, however far
   ``t`` is in the untilted tail. The last Newton evaluation yields the tilted pmfs.
2. **Balanced binary tree** of pairwise convolutions of the tilted pmfs (each node is the pmf
   of a partial sum; groups of similar size share one batched tree, padded with point-mass
   cells). Each node keeps only a **window** of partial sums outside which its tilted mass is
   provably below 1e-25 on either side (Chernoff bounds from the cells' exact cumulant
   generating functions, which add up the tree): a node of ``m`` cells spans ``m (W - 1) + 1``
   sums but its bulk only ~``sqrt(m)`` of them, so long nodes stay short. All windows --
   hence every level's array and FFT length -- are fixed before any convolution. Short
   children (length <= ``_DIRECT_MAX_LEN``) are convolved directly (sums of non-negative
   terms: relative error ~ ``L eps`` per entry, exact zeros stay zero); the pairs of a longer
   level by batched real FFTs: an FFT step transforms all nodes of a level at once, takes
   1-3 levels up by products of sibling spectra (levels inside a step are never inverted)
   and inverts the step's top level, with ``N >=`` every window length in the step (not
   ``2 L - 1``): circular convolutions, whose wrap-around only folds a node's own mass
   outside its window (< 2e-25) into it. Step lengths minimise a cost model of the
   transforms. FFT error is absolute, ~ ``eps
   log2(N)`` times the children's norms; negative round-off is clipped to 0 and entries
   outside the node's reachable interval are exactly 0. The root's value is only needed at
   ``t`` (a dot product of the two top nodes).
3. **A-posteriori error bound.** A bound on the 2-norm of each node's absolute error (FFT:
   ``C log2(N) eps (|a|_2 |b|_1 + |a|_1 |b|_2)`` per convolution; windows: the mass they
   drop; propagated by Young's inequality) gives at the root a bound on the relative error
   of ``V`` from FFT round-off and windows (~4e-13 for 100 cells, ~6e-11 for 3000; realised
   FFT errors are >= 14x below the per-convolution model, measured). If it exceeds
   ``_REL_TOL`` (1e-9) -- which needs the tilted total to be far from unimodal at ``t``:
   lattice/parity gaps or strongly multimodal cell weights, not log-concave weights such as
   the Poisson x double-geometric products of the notes -- the group is recomputed with a
   **log-space direct** tree (logsumexp convolutions over the full ranges, no windows: no
   cancellation, no underflow), or, if that would cost more than ``_LOG_MAX_COST``
   multiply-adds, a ``RuntimeWarning`` reports the bound and the FFT result is kept. (The
   code also tracks the worst-case bound from ordinary rounding, ~``d W eps``; it is inherent
   to any float64 product of ``d`` factors and is not a reason to fall back.)
4. **Marginals** by the downward (outside) pass: the message of a child is the correlation
   of its parent's message with its sibling (on FFT levels one batched circular correlation
   per level, with the siblings' spectra kept from the upward pass; a wrapped-around term
   pairs the child with a parent partial sum outside the parent's window, so it enters the
   marginals weighted by that tail mass, < 2e-25, like the window truncation itself); at a
   leaf, ``P(k_i = k | t) = p_i(k) O_i(k) / \hat P(t)``.
5. **Exact draws** (backward sampling): at the root the target is ``t``; at a node with
   target ``u`` the left child's partial sum ``v`` is drawn with probability
   ``\propto Left(v) Right(u - v)`` (inverse CDF), the right child gets ``u - v``; recurse.

Accuracy (measured in ``tests/test_convolution.py``):

* against brute-force enumeration in mpmath (d = 5, W = 5, two groups, ``-inf`` entries),
  every path (direct / FFT / log space): ``|delta log V| <= 1e-15``; marginals to 2e-15
  relative (FFT path: 1e-15 absolute at exact zeros);
* targets 30-46 sd into either tail (V ~ 1e-200 of the mode's value) against 50-digit mpmath
  dynamic programming: ``|delta log V| <= 6e-14``, the float64 resolution of ``log V`` itself
  (``|log V|`` up to 1100), i.e. V to ~1e-14 relative; a plain FFT convolution returns
  round-off (~1e-18, even negative) there;
* 3000 iid Poisson(10) cells, W = 101 (closed form: the total is Poisson(30000), each cell
  given it Binomial(t, 1/3000)), t at the mode and 30 and 45 sd away: ``|delta log V| <=
  4e-13`` -- the rounding of a product of 3000 identical factors, which adds coherently,
  ~``d eps`` -- and marginals to 4e-16 absolute (the test runs 300 cells, W = 61);
* FFT path against the log-space path at 437 cells, W = 61, 5 groups: marginals agree to
  1e-15 absolute (1e-14 relative where they exceed 1e-10); at W = 301 with
  double-geometric noise at eps = 0.192 (wide windows, circular FFT levels), at the mode
  and ~30 sd into either tail: equal ``log V``, marginals to 3e-16 absolute.

Cost (one group of 102 cells, value and marginals, measured on a loaded 2-core machine):
~1.5 ms at W = 61, ~4 ms at W = 455, ~5 ms at W = 901, about a third of it in the batched
FFTs; BLAS is held to one thread during a call.

Marginals are therefore accurate to ~1e-15 in probability units (relative accuracy only for
entries well above that; entries below ~1e-25, outside the windows, are returned as 0).
The sampler draws from the same computed node arrays, so each conditional step carries
errors of that size (and never visits partial sums outside the windows, an event of
probability < 1e-24); exact zeros are respected (a branch reached only through FFT
round-off is redrawn from the log-space tree).

Edge cases: a target outside ``[sum_i min finite offset, sum_i max finite offset]`` (or a
group containing a cell with no finite weight) gives ``log V = -inf``; its marginals are
undefined and returned as ``nan`` by :func:`log_convolution_at` (the Op's gradient uses 0
there), and :func:`sample_given_sums` raises ``ValueError``. A target exactly at either end
of the range has a single configuration, handled exactly. An empty group has ``V = 1`` for
target 0 and ``V = 0`` otherwise.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field

import numba
import numpy as np
import pytensor.tensor as pt
import scipy.fft
from threadpoolctl import ThreadpoolController
from pytensor.gradient import DisconnectedType, disconnected_type, grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

__all__ = ["log_convolution_at", "sample_given_sums", "ConvolutionLogLikelihood"]

_EPS = float(np.finfo(np.float64).eps)
_TINY = float(np.finfo(np.float64).tiny)
# Children of length <= this are convolved directly; longer ones by FFT.
_DIRECT_MAX_LEN = 160
# Bound on the FFT part of the relative error of V above which a group is recomputed in
# log space (the bound is ~4e-13 at 100 cells, ~6e-11 at 3000 cells, growing ~ d^1.5).
_REL_TOL = 1e-9
# Largest log-space recomputation (multiply-adds, up + down) done automatically.
_LOG_MAX_COST = 4e8
# Testing hook: force every group through the log-space direct path.
_FORCE_LOG = False
# Most tree levels spanned by one FFT step (the levels inside a step stay spectra), and the
# fixed cost of a step in units of N log2(N) (one transform of length N costs ~N log2(N)).
_FFT_MAX_STEP = 3
_FFT_CALL_COST = 4e4
# Constant in the FFT convolution error model  |err|_inf <= C log2(N) eps (|a|_2 |b|_1 + |a|_1 |b|_2).
_FFT_C = 2.0
# Budget (float64 entries per tree level) used to chunk batched sampling.
_CHUNK_ENTRIES = 100_000


_BLAS = []


def _single_thread_blas():
    """Context limiting BLAS to one thread. The matrix products here are small: BLAS threads
    only add wake-ups, and under load (e.g. parallel chains) they made the calls 10-50x
    slower."""
    if not _BLAS:
        _BLAS.append(ThreadpoolController())
    return _BLAS[0].limit(limits=1, user_api="blas")


# --------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _fin_range(a):
    lo = 0
    n = a.shape[0]
    while lo < n and a[lo] == -np.inf:
        lo += 1
    hi = n - 1
    while hi >= lo and a[hi] == -np.inf:
        hi -= 1
    return lo, hi


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def _conv_pairs_log(A):
    """Log-space version of _conv_pairs_lin (logsumexp over each anti-diagonal)."""
    B, n2, L = A.shape
    n = n2 // 2
    out = np.full((B, n, 2 * L - 1), -np.inf)
    for b in range(B):
        for j in range(n):
            a = A[b, 2 * j]
            c = A[b, 2 * j + 1]
            alo, ahi = _fin_range(a)
            clo, chi = _fin_range(c)
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


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
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
                slo, shi = _fin_range(sib)
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


@numba.njit(cache=True, nogil=True)
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


# --------------------------------------------------------------------------------------
# validation and group plans
# --------------------------------------------------------------------------------------


def _as_log_g(log_g, allow_batch):
    arr = np.asarray(log_g, dtype=np.float64)
    ok_ndim = (2, 3) if allow_batch else (2,)
    if arr.ndim not in ok_ndim:
        shapes = "(d, W) or (n, d, W)" if allow_batch else "(d, W)"
        raise ValueError(f"log_g must have shape {shapes}; got shape {arr.shape}")
    if arr.shape[-1] < 1 or arr.shape[-2] < 1:
        raise ValueError(f"log_g must have at least one cell and one offset; got shape {arr.shape}")
    mx = arr.max()  # NaN if any entry is NaN
    if np.isnan(mx):
        raise ValueError("log_g contains NaN")
    if mx == np.inf:
        raise ValueError("log_g contains +inf (weights must be finite or -inf for impossible offsets)")
    return arr


def _as_groups(groups, d, G):
    arr = np.asarray(groups)
    if arr.ndim != 1 or arr.shape[0] != d:
        raise ValueError(f"groups must have shape (d,) = ({d},) to match log_g; got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError("groups must be integer codes 0..G-1")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= G):
        raise ValueError(
            f"groups must be integer codes in 0..G-1 with G = len(targets) = {G}; "
            f"got codes in [{arr.min()}, {arr.max()}]"
        )
    return arr


def _as_targets(targets, ndims, what):
    arr = np.asarray(targets)
    if arr.ndim not in ndims:
        raise ValueError(f"targets must have shape {what}; got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError("targets must be integers")
    return arr.astype(np.int64)


@dataclass
class _Plan:
    # list of (M, group ids (ng,), cell indices (ng, M)); -1 marks a padding (identity) cell.
    # Groups whose sizes round up to the same M share one batched tree; M = 0 for empty groups.
    buckets: list = field(default_factory=list)


_PLAN_CACHE: dict = {}


def _padded_size(m):
    """Round m up so that similar group sizes share a tree shape (padding < 1/8 of m)."""
    if m <= 16:
        return m
    step = 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def _get_plan(groups, G):
    key = (groups.tobytes(), G)
    plan = _PLAN_CACHE.get(key)
    if plan is not None:
        return plan
    order = np.argsort(groups, kind="stable")
    counts = np.bincount(groups, minlength=G)
    starts = np.concatenate([[0], np.cumsum(counts)])
    padded = np.array([_padded_size(int(m)) for m in counts], dtype=np.int64)
    plan = _Plan()
    for M in np.unique(padded):
        gids = np.flatnonzero(padded == M)
        cells = np.full((gids.size, M), -1, dtype=np.int64)
        for r, g in enumerate(gids):
            cells[r, : counts[g]] = order[starts[g] : starts[g + 1]]
        plan.buckets.append((int(M), gids, cells))
    if len(_PLAN_CACHE) > 64:
        _PLAN_CACHE.clear()
    _PLAN_CACHE[key] = plan
    return plan


def _gather_cells(log_g, cells):
    """log_g[..., cells, :] with identity rows (0 at offset 0, -inf elsewhere) where cells == -1."""
    out = log_g[..., np.maximum(cells, 0), :]
    pad = cells < 0
    if pad.any():
        ident = np.full(log_g.shape[-1], -np.inf)
        ident[0] = 0.0
        out[..., pad, :] = ident
    return out


# --------------------------------------------------------------------------------------
# tilting
# --------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _tilt_exponents(lw, lam, c, out):
    """out[b, i, k] = lw[b, i, k] + lam[b] (k - c[b, i])."""
    B, m, W = lw.shape
    for b in range(B):
        la = lam[b]
        for i in range(m):
            ci = c[b, i]
            src = lw[b, i]
            row = out[b, i]
            for k in range(W):
                row[k] = src[k] + la * (k - ci)
    return out


# reassociation lets the row sums vectorise (no infinities or NaNs here). No reciprocal:
# a rounded 1/Z would scale a whole row by the same (1 + delta), an error that adds up
# coherently over identical cells (d delta in log V).
@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract"})
def _normalise_rows(p):
    """Divide each row of p (B, m, W) by its sum Z, in place, then set entries below the
    smallest normal float to 0; returns (Z, mean, var) of k = 0..W-1 under the rows."""
    B, m, W = p.shape
    Z = np.empty((B, m))
    mean = np.empty((B, m))
    var = np.empty((B, m))
    tiny = np.finfo(np.float64).tiny
    for b in range(B):
        for i in range(m):
            row = p[b, i]
            z = 0.0
            for k in range(W):
                z += row[k]
            s1 = 0.0
            s2 = 0.0
            for k in range(W):
                x = row[k] / z
                s1 += x * k
                s2 += x * (k * k)
                row[k] = x if x >= tiny else 0.0
            Z[b, i] = z
            mean[b, i] = s1
            var[b, i] = max(s2 - s1 * s1, 0.0)
    return Z, mean, var


def _tilted(lw, lam, c):
    """The cells' weights tilted by lam and centred at the integers c:
    ``g_i(k) e^{lam (k - c_i)} = Zc_i p_i(k)``.

    Returns (p (B, m, W), log Zc (B, m), mean (B, m), var (B, m)): the tilted pmfs, with
    entries below the smallest normal float set to 0 (subnormals are ~100x slower in the
    products; this changes V by < d W 2e-308), and the means and variances of k under them.
    ``k - c_i`` is exact, so the tilt costs one rounding per entry however large ``lam k`` is."""
    p = _tilt_exponents(lw, lam, c, np.empty(lw.shape))
    amax = p.max(axis=-1, keepdims=True)
    p -= amax
    np.exp(p, out=p)
    Z, mean, var = _normalise_rows(p)
    return p, amax[..., 0] + np.log(Z), mean, var


@numba.njit(cache=True, nogil=True)
def _newton_step(f, V, lam, lo, hi):
    """One safeguarded Newton/bisection step for each group, in place on lam and its bracket
    [lo, hi]: f = sum_i E_lam[k_i] - t at lam, V = d f / d lam (the tilted variance).
    Returns which groups are finished (|f| <= 0.1 sqrt(V), or the bracket has collapsed);
    those keep their lam."""
    finished = np.zeros(f.size, np.bool_)
    for i in range(f.size):
        la = lam[i]
        if f[i] < 0.0:
            lo[i] = max(lo[i], la)
        elif f[i] > 0.0:
            hi[i] = min(hi[i], la)
        bracketed = np.isfinite(lo[i]) and np.isfinite(hi[i])
        if abs(f[i]) <= 0.1 * math.sqrt(V[i]) or (bracketed and hi[i] - lo[i] <= 1e-13 * (1.0 + abs(la))):
            finished[i] = True
            continue
        cap = 1.0 + abs(la)
        step = -f[i] / V[i] if V[i] > 0.0 else np.inf
        if not np.isfinite(step):
            step = -cap if f[i] > 0.0 else cap
        new = la + min(max(step, -cap), cap)
        if bracketed and (new <= lo[i] or new >= hi[i]):
            new = 0.5 * (lo[i] + hi[i])
        lam[i] = new
    return finished


def _solve_tilt(lw, t):
    """Exponential tilt of each group, by safeguarded Newton/bisection on lambda.

    lw (B, m, W) with every cell having a finite entry and min-sum < t < max-sum. Returns
    (lam (B,), c (B, m), p (B, m, W), log Zc (B, m)) as in :func:`_tilted`, evaluated at a
    lam with sum_i E_lam[k_i] = t to within 0.1 tilted sd; c is the rounded cell means of
    the previous iterate (any integers near the means do: they only keep the exponents
    small)."""
    B, m, W = lw.shape
    lam = np.zeros(B)
    c = np.zeros((B, m))
    lo = np.full(B, -np.inf)
    hi = np.full(B, np.inf)
    p, logZc, mean, var = _tilted(lw, lam, c)
    active = np.arange(B)
    for _ in range(200):
        la, lo_a, hi_a = lam[active], lo[active], hi[active]
        go = ~_newton_step(mean.sum(axis=-1) - t[active], var.sum(axis=-1), la, lo_a, hi_a)
        lam[active], lo[active], hi[active] = la, lo_a, hi_a
        active, c_go = active[go], np.rint(mean[go])
        if active.size == 0:
            break
        c[active] = c_go
        if active.size == B:
            p, logZc, mean, var = _tilted(lw, lam, c)
        else:
            p[active], logZc[active], mean, var = _tilted(lw[active], lam[active], c_go)
    return lam, c, p, logZc  # (on the iteration limit: the last evaluated lam; any lam is exact)


def _log_leaves(lw, lam, c):
    """Log-space version of :func:`_tilted`: (log p (B, m, W), log Zc (B, m))."""
    W = lw.shape[-1]
    a = lw + lam[:, None, None] * (np.arange(W) - c[..., None])
    amax = a.max(axis=-1, keepdims=True)
    a -= amax
    logZ = np.log(np.exp(a).sum(axis=-1, keepdims=True))
    return a - logZ, (amax + logZ)[..., 0]


# --------------------------------------------------------------------------------------
# trees
# --------------------------------------------------------------------------------------


@dataclass
class _Tree:
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


@numba.njit(cache=True, nogil=True)
def _root_messages(top, off, t, fill):
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


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
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


# Each node of the linear-space tree keeps only a window of partial sums outside which its
# tilted mass is <= exp(-_WINDOW_LOG) on either side (Chernoff bound on exact cumulant
# generating functions). This is what keeps long nodes (many cells) short: a node of m cells
# spans m (W - 1) + 1 sums but its bulk only ~ sqrt(m).
_WINDOW_LOG = 25 * math.log(10.0)


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


@numba.njit(cache=True, nogil=True)
def _plan_kernel(mu, Kp, Kn, s, kmin, kmax, sizes, log_tail):
    """Windows of all nodes, level after level, in flat (B, sum(sizes)) arrays (see _plan_windows)."""
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


def _plan_windows(P, kmin, kmax, sizes):
    """Windows [start, end] (two (B, n) int arrays per level) of every node of the tree.

    A node's window is [floor(mu - a_-) - 1, ceil(mu + a_+) + 1] with the Chernoff distances
    a_+- = min_s (K(+-s) + _WINDOW_LOG) / s, clipped for a leaf to its finite range
    [kmin, kmax] and for an inner node to the sum of its children's windows (where its
    computed values live); identity nodes get [0, 0]. The Chernoff bounds only need the
    cells' CGFs, which add up the tree, so all windows (hence all array and FFT lengths) are
    known before any convolution."""
    mu, Kp, Kn, s = _cgf_grid(P)
    start, end = _plan_kernel(mu, Kp, Kn, s, kmin, kmax, np.asarray(sizes, np.int64), _WINDOW_LOG)
    bounds = np.cumsum([0] + list(sizes))
    starts = [start[:, a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    ends = [end[:, a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return starts, ends


@numba.njit(cache=True, nogil=True)
def _error_bounds(S, Q, sizes, lens, steps, m, drop, fft_c):
    """The error recursion of :func:`_build_lin` up the tree; returns (e2, rho) of the two top
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


def _build_lin(P, kmin, kmax, t, keep_fft, all_levels):
    """Upward pass in linear space. P (B, m>=2, W) tilted pmfs; kmin/kmax (B, m) finite range.

    A level holds its nodes on their windows, (B, n_l, L_l). Short levels are convolved
    pairwise, directly. Otherwise an FFT step takes a level a to a level b <= a + _FFT_MAX_STEP at
    once: one batched rfft of length N of all of level a's nodes, products of sibling
    spectra level by level (the spectrum of a parent is the product of its children's),
    and one batched irfft of level b's nodes, cut to their windows. Convolutions of length N
    are *circular*: entry p of a node's window receives, besides the value at partial sum
    p, the values at p +- N, ..., which lie outside the window (N >= every window length in
    the step) and so carry at most the node's tail mass (< 2 exp(-_WINDOW_LOG)). Levels
    strictly inside a step exist only as spectra (for the downward pass), unless
    ``all_levels`` (the sampler needs every level): then they are inverted and cut too.

    Error model: e2 bounds the 2-norm of each node's absolute error. Errors of the inputs
    propagate by Young's inequality, ``|d(a * b)|_2 <= |da|_2 |b|_1 + |a|_1 |db|_2 +
    |da|_2 |db|_2 sqrt(L)`` (it holds for circular convolutions too), every level adds the
    window's dropped mass (<= 2 exp(-_WINDOW_LOG)), and an FFT step adds the aliased tail
    mass and ``C log2(N) eps sum_i |a_i|_2 prod_{j != i} |a_j|_1`` for each node, the a_i
    being its descendants at level a (the forward transforms' errors, carried through
    spectra of modulus <= 1-norms; for a pair, ``|a|_2 |b|_1 + |a|_1 |b|_2``); rho bounds the
    relative error of direct sums of non-negative products. At the root,
    |err(t)| <= e2_L |R|_2 + |L|_2 e2_R + e2_L e2_R."""
    B, m, W = P.shape
    sizes = _level_sizes(m)
    top = len(sizes) - 1
    starts, ends = _plan_windows(P, kmin, kmax, sizes)
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
        norms[lev] = _window_nodes(C, shift, valid, buf)
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
    root = np.einsum("bk,bk->b", top_nodes[:, 0], _root_messages(top_nodes, starts[top], t, 0.0)[:, 0])
    S = np.concatenate([x[0] for x in norms], axis=1)
    Q = np.concatenate([x[1] for x in norms], axis=1)
    e2, rho = _error_bounds(S, Q, np.asarray(sizes), np.asarray(lens), np.asarray(steps, np.int64).reshape(-1, 3),
                            m, 2.0 * math.exp(-_WINDOW_LOG), _FFT_C)
    nrm = np.sqrt(norms[top][1])
    abs_err = e2[:, 0] * nrm[:, 1] + nrm[:, 0] * e2[:, 1] + e2[:, 0] * e2[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        fft_rel = np.where(root > 1e-280, abs_err / root, np.inf)
    rel = rho[:, 0] + rho[:, 1] + (2 * lens[top]) * _EPS + fft_rel
    return _Tree(False, levels, starts, steps, specs, origins, root, rel, fft_rel)


def _pad_identity(x, n):
    """Append zero columns (identity nodes) to a (B, n') int array up to n columns."""
    return x if x.shape[1] == n else np.concatenate([x, np.zeros((x.shape[0], n - x.shape[1]), x.dtype)], axis=1)


def _downward_lin(tree, t):
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
    top = len(tree.levels) - 1
    O = _root_messages(tree.levels[top], tree.offs[top], t, 0.0)
    for a, b, N in reversed(tree.steps):
        A, off = tree.levels[a], tree.offs[a]
        n = tree.offs[b - 1].shape[1] // 2  # parents with children
        if N == 0:
            # parent message re-based to the children's summed window start (length 2L - 1)
            base = off[:, 0::2] + off[:, 1::2]
            O = _corr_down_lin(_rebase(O[:, :n], base - tree.offs[b][:, :n], 2 * A.shape[2] - 1), A)
            continue
        shift = (tree.offs[b][:, :n] - tree.origins[b][:, :n]) % N
        FO = scipy.fft.rfft(_scatter_circular(O[:, :n], shift, N), axis=-1)
        for lev in range(b - 1, a - 1, -1):
            FO = _times_conj_sibling(FO[:, : tree.offs[lev].shape[1] // 2], tree.specs[lev])
            tree.specs[lev] = None
        O = scipy.fft.irfft(FO, n=N, axis=-1, overwrite_x=True)[..., : A.shape[2]]
    return O  # FFT levels leave round-off negatives: the callers clip at 0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _leaf_marginals(P, O, off, root):
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


def _build_log(logP, t):
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
    terms = top[:, 0, :] + _root_messages(top, offs[-1], t, -np.inf)[:, 0]
    mx = terms.max(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        root = mx + np.log(np.exp(terms - np.where(np.isfinite(mx), mx, 0.0)[:, None]).sum(axis=1))
    root = np.where(np.isfinite(mx), root, -np.inf)
    rel = np.full(root.shape, 4.0 * (m + len(levels)) * W * _EPS)
    steps = [(lev, lev + 1, 0) for lev in range(len(levels) - 1)]
    none = [None] * len(levels)
    return _Tree(True, levels, offs, steps, none, none, root, rel, np.zeros(root.shape))


def _downward_log(tree, t):
    """Leaf log-messages (B, padded m, W) for a log-space tree (same recursion as _downward_lin)."""
    top, off = tree.levels[-1], tree.offs[-1]
    O = _root_messages(top, off, t, -np.inf)
    for lev in range(len(tree.levels) - 2, -1, -1):
        A = tree.levels[lev]  # parents hold their full ranges (length 2L - 1, offset 0)
        O = _corr_down_log(np.ascontiguousarray(O[:, : A.shape[1] // 2]), A)
    return O


def _log_cost(m, W):
    """Multiply-adds of a log-space up + down pass for a group of m cells."""
    cost, n, L = 0.0, m, W
    while n > 2:
        n += n % 2
        cost += (n // 2) * L * L
        n //= 2
        L = 2 * L - 1
    return 3.0 * cost


@dataclass
class _BucketResult:
    logV: np.ndarray  # (B,)
    marg: np.ndarray | None  # (B, m, W)
    # for sampling: list of (tree, indices into B); fixed configurations for boundary targets
    trees: list
    fixed_idx: np.ndarray
    fixed_val: np.ndarray  # (len(fixed_idx), m)
    zero_idx: np.ndarray


def _solve_bucket(lw, t, want_marg, want_tree):
    """Value (and marginals / sampling trees) for B groups of the same size m >= 1.

    lw (B, m, W) log weights, t (B,) targets."""
    B, m, W = lw.shape
    finite = np.isfinite(lw)
    alive = finite.any(axis=-1).all(axis=-1)
    kmin = np.argmax(finite, axis=-1)
    kmax = W - 1 - np.argmax(finite[..., ::-1], axis=-1)
    smin, smax = kmin.sum(axis=-1), kmax.sum(axis=-1)
    logV = np.full(B, -np.inf)
    marg = np.full((B, m, W), np.nan) if want_marg else None
    zero = ~alive | (t < smin) | (t > smax)
    at_lo = ~zero & (t == smin)
    at_hi = ~zero & (t == smax) & ~at_lo
    fixed = at_lo | at_hi
    fixed_val = np.where(at_lo[:, None], kmin, kmax)[fixed]
    fixed_idx = np.flatnonzero(fixed)
    if fixed_idx.size:
        logV[fixed_idx] = np.take_along_axis(lw[fixed_idx], fixed_val[..., None], axis=-1)[..., 0].sum(axis=-1)
        if want_marg:
            marg[fixed_idx] = 0.0
            bi = np.repeat(fixed_idx, m)
            ci = np.tile(np.arange(m), fixed_idx.size)
            marg[bi, ci, fixed_val.ravel()] = 1.0
    inner = np.flatnonzero(~zero & ~fixed)
    trees = []
    if inner.size and m == 1:
        logV[inner] = lw[inner, 0, t[inner]]
        if want_marg:
            marg[inner] = 0.0
            marg[inner, 0, t[inner]] = 1.0
        # a single cell with t in its finite range: the draw is t itself (its weight is > 0
        # unless log V = -inf, in which case sampling raises)
        ok = inner[np.isfinite(logV[inner])]
        fixed_idx = np.concatenate([fixed_idx, ok])
        fixed_val = np.concatenate([fixed_val, t[ok][:, None]])
        inner = inner[:0]
    if inner.size:
        lwi, ti = (lw, t) if inner.size == B else (lw[inner], t[inner])
        lam, c, P, logZc = _solve_tilt(lwi, ti)
        use_log = np.ones(inner.size, bool)
        if not _FORCE_LOG:
            shift = logZc.sum(axis=-1) + lam * (c.sum(axis=-1) - ti)
            tree = _build_lin(P, kmin[inner], kmax[inner], ti, keep_fft=want_marg, all_levels=want_tree)
            use_log = ~(tree.fft_rel <= _REL_TOL)
            if use_log.any() and _log_cost(m, W) * use_log.sum() > _LOG_MAX_COST:
                bad = np.flatnonzero(use_log)
                warnings.warn(
                    f"convolution: FFT relative error bound {tree.fft_rel[bad].max():.3g} exceeds "
                    f"{_REL_TOL:g} for {bad.size} group(s) of {m} cells (target far from the bulk of "
                    "the tilted total, e.g. gaps or multimodal weights); the log-space recomputation "
                    "is too large to do automatically, so the FFT result is used",
                    RuntimeWarning,
                    stacklevel=3,
                )
                use_log[:] = False
            sel = np.flatnonzero(~use_log)
            if sel.size:
                if sel.size < inner.size:
                    tree = _subset_tree(tree, sel)
                with np.errstate(divide="ignore"):
                    logV[inner[sel]] = shift[sel] + np.log(tree.root)
                if want_marg:
                    O = _downward_lin(tree, ti[sel])
                    marg[inner[sel]] = _leaf_marginals(P[sel], O[:, :m], tree.offs[0][:, :m], tree.root)
                if want_tree:
                    trees.append((tree, inner[sel]))
        sel = np.flatnonzero(use_log)
        if sel.size:
            logp, logZc = _log_leaves(lwi[sel], lam[sel], c[sel])
            shift = logZc.sum(axis=-1) + lam[sel] * (c[sel].sum(axis=-1) - ti[sel])
            tree = _build_log(logp, ti[sel])
            logV[inner[sel]] = shift + tree.root
            if want_marg:
                O = _downward_log(tree, ti[sel])[:, :m]
                with np.errstate(invalid="ignore"):
                    marg[inner[sel]] = np.exp(logp + O - tree.root[:, None, None])
            if want_tree:
                trees.append((tree, inner[sel]))
    zero_idx = np.flatnonzero(~np.isfinite(logV) | np.isnan(logV))
    if want_marg and zero_idx.size:
        marg[zero_idx] = np.nan
    return _BucketResult(logV, marg, trees, fixed_idx, fixed_val.astype(np.int64), zero_idx)


def _subset_tree(tree, sel):
    def sub(xs):
        return [None if x is None else x[sel] for x in xs]

    return _Tree(tree.log_mode, sub(tree.levels), sub(tree.offs), tree.steps, sub(tree.specs), sub(tree.origins),
                 tree.root[sel], tree.rel_bound[sel], tree.fft_rel[sel])


def _descend(tree, tree_idx, t, rng):
    """Backward sampling through a tree. tree_idx (S,) tree element of each draw; t (S,)."""
    S = tree_idx.shape[0]
    u = t[:, None].astype(np.int64)
    for lev in range(len(tree.levels) - 1, -1, -1):
        A = tree.levels[lev]
        n = A.shape[1] // 2
        unif = 1.0 - rng.random((S, n))
        u = _descend_level(A, tree.offs[lev], tree.log_mode, tree_idx, np.ascontiguousarray(u[:, :n]), unif)
    return u  # (S, padded m)


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def log_convolution_at(log_g, groups, targets) -> tuple[np.ndarray, np.ndarray]:
    """Log of each group's convolution at its target, and the conditional cell marginals.

    Parameters
    ----------
    log_g : array (d, W)
        Log weights ``log g_i(k)`` of cell ``i`` at offset ``k = 0..W-1``; ``-inf`` allowed.
    groups : array (d,) of int
        Group code ``0..G-1`` of each cell.
    targets : array (G,) of int
        Target total ``t_g`` of each group.

    Returns
    -------
    log_V : array (G,)
        ``log V_g = log sum_{sum_{i in g} k_i = t_g} prod_i g_i(k_i)``; ``-inf`` when the target
        is unreachable (then the group's marginals are ``nan``).
    marginals : array (d, W)
        ``P(k_i = k | sum_{j in g(i)} k_j = t_{g(i)}) = d log V_g / d log g_i(k)``; each row sums
        to 1 (0 at ``-inf`` offsets).

    Accuracy: see the module docstring (V to ~1e-14 relative in the tails as at the mode,
    ~d eps in the worst case; marginals to ~1e-15 absolute).
    """
    log_g = _as_log_g(log_g, allow_batch=False)
    d, W = log_g.shape
    targets = _as_targets(targets, (1,), "(G,)")
    G = targets.shape[0]
    groups = _as_groups(groups, d, G)
    plan = _get_plan(groups, G)
    logV = np.empty(G)
    marg = np.full((d, W), np.nan)
    with _single_thread_blas():
        for m, gids, cells in plan.buckets:
            if m == 0:
                logV[gids] = np.where(targets[gids] == 0, 0.0, -np.inf)
                continue
            res = _solve_bucket(_gather_cells(log_g, cells), targets[gids], want_marg=True, want_tree=False)
            logV[gids] = res.logV
            real = cells >= 0
            marg[cells[real]] = res.marg[real]
    return logV, marg


def _sample_bucket(lw, t, rng, reps):
    """Draws for B groups of equal size: reps draws per element, returned as (reps, B, m)."""
    B, m, W = lw.shape
    res = _solve_bucket(lw, t, want_marg=False, want_tree=True)
    if res.zero_idx.size:
        raise ValueError(
            f"sample_given_sums: target unreachable (V = 0) for {res.zero_idx.size} group(s); "
            "the conditional law is undefined"
        )
    out = np.empty((reps, B, m), dtype=np.int64)
    if res.fixed_idx.size:
        out[:, res.fixed_idx] = res.fixed_val[None]
    for tree, idx in res.trees:
        nb = idx.size
        # draws ordered as (rep, element)
        tree_idx = np.tile(np.arange(nb), reps)
        tt = np.tile(t[idx], reps)
        per = max(1, _CHUNK_ENTRIES // max(1, m))
        draws = np.empty((tree_idx.size, m), dtype=np.int64)
        for s0 in range(0, tree_idx.size, per):
            sl = slice(s0, s0 + per)
            draws[sl] = _descend(tree, tree_idx[sl], tt[sl], rng)[:, :m]
        bad = np.flatnonzero((draws < 0).any(axis=1))
        if bad.size:  # FFT noise led into a zero-weight branch (probability ~1e-15): redo exactly
            logsel = idx[tree_idx[bad]]
            exact = _solve_bucket_log_tree(lw[logsel], t[logsel])
            draws[bad] = _descend(exact, np.arange(bad.size), t[logsel], rng)[:, :m]
        out[:, idx] = draws.reshape(reps, nb, m)
    return out


def _solve_bucket_log_tree(lw, t):
    lam, c, _, _ = _solve_tilt(lw, t)
    logp, _ = _log_leaves(lw, lam, c)
    return _build_log(logp, t)


def sample_given_sums(log_g, groups, targets, rng, size=None) -> np.ndarray:
    """Exact draws of the offsets ``(k_1..k_d)`` from ``prod_i g_i(k_i)`` given every group's sum.

    Parameters
    ----------
    log_g : array (d, W) or (n, d, W)
        Log weights (``-inf`` for impossible offsets). With a leading batch axis, one draw is
        made for each batch element (e.g. one per posterior draw of theta).
    groups : array (d,) of int
        Group code ``0..G-1`` of each cell (shared by all batch elements).
    targets : array (G,) or, with a batch, (n, G) or (G,)
        Target total of each group.
    rng : numpy.random.Generator or seed
        Source of randomness (passed through ``numpy.random.default_rng``).
    size : int, optional
        Number of independent draws for unbatched ``log_g``; must be None for batched input.

    Returns
    -------
    int64 array of shape (d,), (size, d) or, batched, (n, d).

    Raises ValueError if some group's target is unreachable (V = 0).
    """
    rng = np.random.default_rng(rng)
    log_g = _as_log_g(log_g, allow_batch=True)
    batched = log_g.ndim == 3
    if batched:
        if size is not None:
            raise ValueError("size must be None when log_g is batched (n, d, W): one draw per batch element")
        n, d, W = log_g.shape
        targets = _as_targets(targets, (1, 2), f"(n, G) with n = {n}, or (G,)")
        if targets.ndim == 2 and targets.shape[0] != n:
            raise ValueError(f"targets must have shape (n, G) with n = {n} (the batch size of log_g), or (G,); "
                             f"got shape {targets.shape}")
        targets = np.broadcast_to(targets, (n, targets.shape[-1]))
    else:
        d, W = log_g.shape
        n = 1
        targets = _as_targets(targets, (1,), "(G,)")[None, :]
        log_g = log_g[None]
        if size is not None:
            size = int(size)
            if size < 0:
                raise ValueError(f"size must be a non-negative integer; got {size}")
    G = targets.shape[1]
    groups = _as_groups(groups, d, G)
    plan = _get_plan(groups, G)
    reps = 1 if size is None else size
    out = np.empty((reps, n, d), dtype=np.int64)
    with _single_thread_blas():
        _sample_into(out, log_g, targets, plan, W, rng, reps)
    if batched:
        return out[0]
    return out[0, 0] if size is None else out[:, 0]


def _sample_into(out, log_g, targets, plan, W, rng, reps):
    n = log_g.shape[0]
    for m, gids, cells in plan.buckets:
        if m == 0:
            if np.any(targets[:, gids] != 0):
                raise ValueError("sample_given_sums: an empty group has a non-zero target (V = 0)")
            continue
        ng = gids.size
        per = max(1, _CHUNK_ENTRIES // (ng * m * W))
        for j0 in range(0, n, per):
            j1 = min(n, j0 + per)
            lw = _gather_cells(log_g[j0:j1], cells).reshape((j1 - j0) * ng, m, W)
            tt = targets[j0:j1][:, gids].reshape(-1)
            draws = _sample_bucket(lw, tt, rng, reps).reshape(reps, j1 - j0, ng, m)
            real = cells >= 0
            out[:, j0:j1, cells[real]] = draws[:, :, real]


# --------------------------------------------------------------------------------------
# PyTensor Op
# --------------------------------------------------------------------------------------


class ConvolutionLogLikelihood(Op):
    """``sum_g log V_g`` as a PyTensor Op, with gradient ``d/d log_g = marginals``.

    ``ConvolutionLogLikelihood(groups)(log_g, targets)`` takes ``log_g`` a float64 (d, W)
    tensor and ``targets`` an int64 (G,) tensor and returns the scalar ``sum_g log V_g``
    (``-inf`` if any target is unreachable). The gradient with respect to ``log_g`` is
    ``output_grad * marginals`` (0 for the cells of unreachable groups); ``targets`` are
    integers and disconnected from the gradient. A NaN or +inf in ``log_g`` gives a NaN value
    (and zero gradient) instead of the ValueError :func:`log_convolution_at` raises, so that a
    bad proposal during sampling is rejected rather than aborting the run.

    ``groups`` is fixed at construction and stored as a tuple (the Op's only prop, so equal
    groupings give equal, mergeable Ops). Internally the Op has a second output, the (d, W)
    marginals, which the gradient reuses, so value and gradient cost one evaluation; calling
    the Op returns only the scalar (``default_output = 0``). Second derivatives are not
    implemented.

    Use inside PyMC as ``pm.Potential("lik", op(log_g, targets))``, or as the ``logp`` of a
    ``pm.CustomDist`` whose observed value is the released total(s) (tested with a scalar
    total: ``logp=lambda value, *params: op(log_g(*params), value[None])``).
    """

    __props__ = ("groups",)
    default_output = 0

    def __init__(self, groups):
        arr = np.asarray(groups)
        if arr.ndim != 1:
            raise ValueError(f"groups must be a 1-D sequence of integer codes; got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            if not np.all(arr == np.round(arr)):
                raise ValueError("groups must be integer codes 0..G-1")
        if arr.size and arr.min() < 0:
            raise ValueError("groups must be integer codes 0..G-1 (got a negative code)")
        self.groups = tuple(int(x) for x in arr)
        self._groups_arr = np.asarray(self.groups, dtype=np.int64)
        super().__init__()

    def make_node(self, log_g, targets):
        log_g = pt.as_tensor_variable(log_g)
        if log_g.dtype != "float64":
            log_g = pt.cast(log_g, "float64")
        targets = pt.as_tensor_variable(targets)
        if not targets.dtype.startswith(("int", "uint")):
            raise ValueError(f"targets must be an integer tensor; got dtype {targets.dtype}")
        if targets.dtype != "int64":
            targets = pt.cast(targets, "int64")
        if log_g.ndim != 2:
            raise ValueError(f"log_g must be a (d, W) tensor; got ndim {log_g.ndim}")
        if targets.ndim != 1:
            raise ValueError(f"targets must be a (G,) tensor; got ndim {targets.ndim}")
        d = len(self.groups)
        if log_g.type.shape[0] is not None and log_g.type.shape[0] != d:
            raise ValueError(f"log_g has {log_g.type.shape[0]} rows but groups has d = {d} cells")
        outputs = [pt.dscalar(), pt.tensor(dtype="float64", shape=(d, log_g.type.shape[1]))]
        return Apply(self, [log_g, targets], outputs)

    def perform(self, node, inputs, output_storage):
        log_g, targets = inputs
        if log_g.shape[0] != len(self.groups):
            raise ValueError(f"log_g has {log_g.shape[0]} rows but groups has d = {len(self.groups)} cells")
        if np.isnan(log_g).any() or np.isposinf(log_g).any():
            # propagate like an elementwise op would (NUTS then treats the point as divergent)
            output_storage[0][0] = np.asarray(np.nan)
            output_storage[1][0] = np.zeros(log_g.shape)
            return
        logV, marg = log_convolution_at(log_g, self._groups_arr, targets)
        total = logV.sum() if np.all(np.isfinite(logV)) else -np.inf
        output_storage[0][0] = np.asarray(total, dtype=np.float64)
        output_storage[1][0] = np.nan_to_num(marg, nan=0.0)

    def infer_shape(self, node, input_shapes):
        return [(), input_shapes[0]]

    def connection_pattern(self, node):
        return [[True, True], [False, False]]

    def pullback(self, inputs, outputs, cotangents):
        g_val, g_marg = cotangents
        if not isinstance(g_marg.type, DisconnectedType):
            return [grad_not_implemented(self, 0, inputs[0], "second derivatives of log V"), disconnected_type()]
        if isinstance(g_val.type, DisconnectedType):
            return [disconnected_type(), disconnected_type()]
        return [g_val * outputs[1], disconnected_type()]
