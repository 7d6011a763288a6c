# Frozen copy of dpinfer/lattice/nested/kernel.py at commit a57c0c5: the baseline of
# benchmarks/bench_nested.py --baseline. Not used by dpinfer; do not edit.
r"""Exact Gibbs moves of nested sums along a direction of cells (numba kernels).

State: counts x (n_leaves, n_cells), their area sums S (n_areas, n_cells) and each term's sum
t_r, all kept consistent. A **direction** is a set of cells D with signs d_c in {+1, -1}; the
move is x[l, c] -> x[l, c] + d_c z_l for c in D, one integer z_l per leaf. Given everything
else, the law of z is

    p(z) ∝ prod_l prod_{c in D} p_{l,c}(x[l, c] + d_c z_l)
           prod_r w_r(y_r - t_r - a_r s_{v_r}),   s_v = sum of z_l over the leaves under v,

a_r = sum_{c in D} d_c 1{c in cells_r}, the term's coefficient (0: the term does not move).
That is a tree-structured law: the leaves' factors are functions of z_l, the terms' of the
subtree sums s_v. It is drawn exactly by the upward/downward pass of a sum tree
(inference notes §2, totals by convolution, here with a factor at every node):

* **up**: a leaf's message is its log factor on its range of z (the box of every moved cell,
  :class:`~dpinfer.lattice.nested.sampler.NestedGibbs`); an area's message is the convolution
  of its children's messages (one child at a time; the partial convolutions P_j are kept)
  times the area's terms;
* **down**: s_root is drawn from the root's message; an area's s_v is split among its
  children from the last, s_{c_j} with weight m_{c_j}(s_{c_j}) P_{j-1}(s_v - s_{c_j}).

Convolutions are direct, in linear space after scaling each message by its maximum (sums of
non-negative terms: relative error ~ length x eps per entry, no cancellation). Every message
and partial convolution is **trimmed** to the entries within ``trim`` nats of its maximum
(default 60: e^-60 ~ 1e-26); a draw is from the law with those entries set to 0. A draw at
the edge of a message that the trim cut (finite weight beyond) is counted (``stats[1]``): it
means the rest of the tree pulled the sum far from its subtree's own evidence, and a chain
that does so often is told to widen (lower ``trim``). Exact zeros (hard bounds, equalities,
the support) are never trimmed "approximately": they are zeros of the law.

Direction moves used per sweep (:func:`sweep`): every cell alone (d = +1), in random order,
then the cells paired at random (c, c') with signs (+1, -1). A pair move keeps every term that
sums both cells or neither, so it moves counts between cells under exact totals (where a
single cell's move is frozen); with the single moves it connects the counts under equalities
whose cell sets at each area are disjoint or nested (the laminar case checked by
:class:`~dpinfer.lattice.nested.structure.NestedSums`), as pair moves connect the lattice
points of a product of simplices.
"""

from __future__ import annotations

import numba
import numpy as np

from dpinfer._random_stream import below, uniform
from dpinfer.lattice.nested.terms import term_log

DEFAULT_TRIM = 60.0


@numba.njit(cache=True, nogil=True)
def _log_sample(w, rng):
    """An index drawn with probability ∝ exp(w[i]); -1 if every weight is zero."""
    m = -np.inf
    for v in w:
        if v > m:
            m = v
    if m == -np.inf:
        return -1
    total = 0.0
    for v in w:
        total += np.exp(v - m)
    u = uniform(rng) * total
    acc = 0.0
    last = -1
    for i in range(w.size):
        p = np.exp(w[i] - m)
        if p > 0.0:
            last = i
            acc += p
            if u < acc:
                return i
    return last


@numba.njit(cache=True, nogil=True)
def _convolve_log(a, b):
    """log of the convolution of exp(a) and exp(b), direct, scaled by the maxima."""
    ma = np.max(a)
    mb = np.max(b)
    ea = np.exp(a - ma)
    eb = np.exp(b - mb)
    la, lb = a.size, b.size
    out = np.zeros(la + lb - 1)
    for i in range(la):
        ai = ea[i]
        if ai == 0.0:
            continue
        for j in range(lb):
            out[i + j] += ai * eb[j]
    res = np.empty(out.size)
    for i in range(out.size):
        res[i] = np.log(out[i]) + ma + mb if out[i] > 0.0 else -np.inf
    return res


@numba.njit(cache=True, nogil=True)
def _kept(a, trim):
    """(start, stop, cut_left, cut_right): the entries within ``trim`` of the maximum, and
    whether finite entries were cut on either side."""
    m = np.max(a)
    if m == -np.inf:
        return 0, 0, False, False
    floor = m - trim
    start = 0
    while a[start] < floor:
        start += 1
    stop = a.size
    while a[stop - 1] < floor:
        stop -= 1
    cut_left = False
    for i in range(start):
        if a[i] > -np.inf:
            cut_left = True
            break
    cut_right = False
    for i in range(stop, a.size):
        if a[i] > -np.inf:
            cut_right = True
            break
    return start, stop, cut_left, cut_right


@numba.njit(cache=True, nogil=True)
def draw_direction(dcells, dsigns, x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior,
                   order, child_ptr, child_area, area_leaf, term_ptr, term_cells, term_value,
                   term_table, meta, inv2v, values, trim, rng, stats):
    """One exact draw of the counts along the direction (dcells, dsigns) given the rest
    (module docstring); x, S and tsum updated in place. ``prior[l * n_cells + c, j]`` is
    log p_{l,c}(box_lo[l, c] + j). stats: [0] draws, [1] trimmed edges hit, [2] counts at an
    open box edge after the draw. Returns False if the law has no mass (no move made)."""
    n_areas = order.size
    n_cells = x.shape[1]
    k = dcells.size
    n_terms = term_value.size
    coef = np.zeros(n_terms, np.int64)
    for r in range(n_terms):
        a = 0
        for j in range(k):
            if term_cells[r, dcells[j]]:
                a += dsigns[j]
        coef[r] = a
    msgs = [np.empty(0) for _ in range(n_areas)]
    mlo = np.zeros(n_areas, np.int64)
    cut = np.zeros((n_areas, 2), np.bool_)
    pref = [np.empty(0) for _ in range(child_area.size)]
    plo = np.zeros(child_area.size, np.int64)
    for v in order:
        leaf = area_leaf[v]
        if leaf >= 0:
            zlo = -(2**62)
            zhi = 2**62
            for j in range(k):
                c = dcells[j]
                xv = x[leaf, c]
                if dsigns[j] > 0:
                    lo = box_lo[leaf, c] - xv
                    hi = box_hi[leaf, c] - xv
                else:
                    lo = xv - box_hi[leaf, c]
                    hi = xv - box_lo[leaf, c]
                zlo = max(zlo, lo)
                zhi = min(zhi, hi)
            n = zhi - zlo + 1
            m = np.zeros(n)
            for i in range(n):
                z = zlo + i
                acc = 0.0
                for j in range(k):
                    c = dcells[j]
                    acc += prior[leaf * n_cells + c, x[leaf, c] + dsigns[j] * z - box_lo[leaf, c]]
                m[i] = acc
            lo_v = zlo
        else:
            first = child_ptr[v]
            cur = msgs[child_area[first]]
            cur_lo = mlo[child_area[first]]
            for p in range(first + 1, child_ptr[v + 1]):
                ch = child_area[p]
                cur = _convolve_log(cur, msgs[ch])
                cur_lo += mlo[ch]
                a, b, _, _ = _kept(cur, trim)
                if b <= a:
                    return False
                cur = cur[a:b].copy()
                cur_lo += a
                pref[p] = cur
                plo[p] = cur_lo
            m = cur.copy()
            lo_v = cur_lo
            n = m.size
        for r in range(term_ptr[v], term_ptr[v + 1]):
            a = coef[r]
            if a == 0:
                continue
            base = term_value[r] - tsum[r]
            t = term_table[r]
            for i in range(n):
                m[i] += term_log(t, base - a * (lo_v + i), meta, inv2v, values)
        a, b, cl, cr = _kept(m, trim)
        if b <= a:
            return False
        msgs[v] = m[a:b].copy()
        mlo[v] = lo_v + a
        cut[v, 0] = cl
        cut[v, 1] = cr
    # down
    s_area = np.zeros(n_areas, np.int64)
    root = order[n_areas - 1]
    i = _log_sample(msgs[root], rng)
    if i < 0:
        return False
    s_area[root] = mlo[root] + i
    for idx in range(n_areas - 1, -1, -1):
        v = order[idx]
        if area_leaf[v] >= 0:
            continue
        s = s_area[v]
        first = child_ptr[v]
        for p in range(child_ptr[v + 1] - 1, first, -1):
            ch = child_area[p]
            mc = msgs[ch]
            clo = mlo[ch]
            if p - 1 > first:
                P = pref[p - 1]
                Plo = plo[p - 1]
            else:
                P = msgs[child_area[first]]
                Plo = mlo[child_area[first]]
            lo = max(clo, s - (Plo + P.size - 1))
            hi = min(clo + mc.size - 1, s - Plo)
            w = np.empty(max(hi - lo + 1, 0))
            for t in range(w.size):
                w[t] = mc[lo + t - clo] + P[s - (lo + t) - Plo]
            j = _log_sample(w, rng)
            if j < 0:
                return False
            s_area[ch] = lo + j
            s -= lo + j
        s_area[child_area[first]] = s
    # statistics, then the update
    stats[0] += 1
    for v in range(n_areas):
        sv = s_area[v]
        if (cut[v, 0] and sv == mlo[v]) or (cut[v, 1] and sv == mlo[v] + msgs[v].size - 1):
            stats[1] += 1
        if sv != 0:
            for j in range(k):
                S[v, dcells[j]] += dsigns[j] * sv
            for r in range(term_ptr[v], term_ptr[v + 1]):
                tsum[r] += coef[r] * sv
    for v in range(n_areas):
        leaf = area_leaf[v]
        if leaf < 0:
            continue
        z = s_area[v]
        for j in range(k):
            c = dcells[j]
            x[leaf, c] += dsigns[j] * z
            xv = x[leaf, c]
            if (lo_open[leaf, c] and xv == box_lo[leaf, c]) or (hi_open[leaf, c] and xv == box_hi[leaf, c]):
                stats[2] += 1
    return True


@numba.njit(cache=True, nogil=True)
def _shuffle(a, rng):
    for i in range(a.size - 1, 0, -1):
        j = below(rng, i + 1)
        a[i], a[j] = a[j], a[i]


@numba.njit(cache=True, nogil=True)
def sweep(x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, order, child_ptr, child_area,
          area_leaf, term_ptr, term_cells, term_value, term_table, meta, inv2v, values, trim,
          rng, stats):
    """Every cell's move in random order, then random pairs (module docstring). Returns the
    number of moves that found no mass (0 normally)."""
    n_cells = x.shape[1]
    perm = np.arange(n_cells)
    _shuffle(perm, rng)
    failed = 0
    one = np.ones(1, np.int64)
    cells = np.zeros(1, np.int64)
    for c in perm:
        cells[0] = c
        if not draw_direction(cells, one, x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, order,
                              child_ptr, child_area, area_leaf, term_ptr, term_cells, term_value,
                              term_table, meta, inv2v, values, trim, rng, stats):
            failed += 1
    _shuffle(perm, rng)
    pair = np.zeros(2, np.int64)
    signs = np.array([1, -1], np.int64)
    for i in range(0, n_cells - 1, 2):
        pair[0] = perm[i]
        pair[1] = perm[i + 1]
        if not draw_direction(pair, signs, x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, order,
                              child_ptr, child_area, area_leaf, term_ptr, term_cells, term_value,
                              term_table, meta, inv2v, values, trim, rng, stats):
            failed += 1
    return failed


@numba.njit(cache=True, nogil=True)
def current_sums(x, S, tsum, order, child_ptr, child_area, area_leaf, term_cells, term_area):
    """Fill S (every area's sums of x) and tsum (every term's sum) from the counts x."""
    n_cells = x.shape[1]
    for v in order:
        leaf = area_leaf[v]
        if leaf >= 0:
            for c in range(n_cells):
                S[v, c] = x[leaf, c]
        else:
            for c in range(n_cells):
                S[v, c] = 0
            for p in range(child_ptr[v], child_ptr[v + 1]):
                ch = child_area[p]
                for c in range(n_cells):
                    S[v, c] += S[ch, c]
    for r in range(tsum.size):
        acc = 0
        v = term_area[r]
        for c in range(n_cells):
            if term_cells[r, c]:
                acc += S[v, c]
        tsum[r] = acc
