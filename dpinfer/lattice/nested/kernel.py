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

Messages are **weights in linear space**, each scaled to a maximum of 1: a leaf's log factor
(its prior rows plus its terms' log weights) is exponentiated once, an area's terms multiply
the convolution of its children as exp(their log weights - their maximum). Convolutions are
direct (sums of non-negative products: relative error ~ length x eps per entry, no
cancellation; vectorised, about 0.25-0.3 ns per product on this 2-core VM). No FFT: at the
size of a state (99 counties x ~9 tracts x ~3 block groups, 28 cells) the trimmed messages
are 30-50 entries at the leaves and at most ~500 at the state, and the convolutions are under
a fifth of a move (``benchmarks/bench_nested.py``); an FFT would also lose every entry below
~1e-13 of the peak to round-off. Nor a balanced tree of convolutions in place of the partial
convolutions P_j: trimmed messages widen as the square root of the number of children
summed, so both orders cost about the same. Everything a move writes lives in one buffer
reused by all the moves of a sweep (:func:`workspace`), compacted as it goes.

Every message and partial convolution is **trimmed** to the entries from the first to the
last within ``trim`` nats of its maximum (default 60: e^-60 ~ 1e-26). Zeroing the entries
of m_v outside the kept range K_v is conditioning the law of z on s_v in K_v, so a move draws
from p(z | s_v in K_v for every trimmed v), at total variation at most
sum_v P(s_v not in K_v) from the exact law; each term is at most e^-trim times the number of
entries cut, times e^D_v, D_v the log of the largest ratio of the outside message (the rest
of the tree's evidence on s_v) to its value at the kept maximum. A move at the size of a
state cuts fewer than 10^6 entries, so with every D_v <= 5 nats (a model that fits) the bound
is below 1e-18 per move: 1e-10 over 10^8 moves, far below Monte Carlo error. A draw at the
edge of a message that the trim cut (finite weight beyond) is counted (``stats[1]``): it
means D_v is large (the rest of the tree pulled the sum far from its subtree's own
evidence), and a chain that does so often is told to widen (lower ``trim``). (A smaller
default buys little: 30 nats is ~25% faster at ten counties, as widths shrink as
sqrt(trim), and halves the margin.) Exact zeros (hard bounds, equalities, the support) are
never trimmed "approximately": they are zeros of the law.

**Terms that are quadratics** in their residual (every discrete Gaussian measurement, and the
sums of them whose tables are one to round-off, :func:`~dpinfer.lattice.nested.terms.quadratic_tables`)
enter an area's message all at once: their log weights along the direction add up to
s (2 B - A s) in the area's sum s, A and B from a per-area quadratic form of its cells
(:func:`quadratic_forms`, :func:`_add_terms`), so a move's cost no longer grows with the number of
measurements (at a state's size ~100 terms per block group, ~20 on each cell; reading them one
by one was ~60% of a move; tables of more than DENSE_CELLS cells still read them one by one, where
the form's |D| n_cells flops cost more). The moves keep the sums of the other terms in ``tsum``; the
quadratic terms' are settled from the area sums at the end of a sweep (:func:`settle_term_sums`).

A term may also be a factor of the counts' prior rather than of the release: a
GroupedNegativeBinomial's group factor on one cell's sum at a group's area
(:meth:`~dpinfer.lattice.nested.terms.TermTables.add_group_mixing`, read by formula,
:func:`_add_mixing`), which sums the group's gamma-distributed rate out of the moves.

Which directions a sweep moves along (every cell alone, then interaction directions: pairs,
squares, cubes of the cross-classified cells) is :mod:`dpinfer.lattice.nested.directions`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dpinfer._kernel import kernel
from dpinfer._random_stream import uniform
from dpinfer.lattice.nested.terms import MIXING, quadratic_tables

DEFAULT_TRIM = 60.0

# Tables of at most this many cells sum their quadratic terms as one quadratic form (_add_terms:
# |D| n_cells flops an area per move); wider ones read every term from its table, which costs per
# term, not per cell (benchmarks/bench_quadratic_terms.py: 0.55 of the tables' time at 28 cells,
# 2.0 at the 2,016 of the detailed histogram).
DENSE_CELLS = 64

# Statuses of an upward pass.
_OK, _NO_MASS, _FULL = 0, 1, 2


@kernel(nogil=True)
def area_cell_terms(term_ptr, term_cells, select):
    """(ptr, terms): the terms r of area v that sum cell c and have ``select[r]`` are
    terms[ptr[v n_cells + c] : ptr[v n_cells + c + 1]] (the moves find the terms they move
    here, without scanning every term of every area)."""
    n_areas = term_ptr.size - 1
    n_cells = term_cells.shape[1]
    ptr = np.zeros(n_areas * n_cells + 1, np.int64)
    for v in range(n_areas):
        for r in range(term_ptr[v], term_ptr[v + 1]):
            for c in range(n_cells):
                if term_cells[r, c] and select[r]:
                    ptr[v * n_cells + c + 1] += 1
    for i in range(ptr.size - 1):
        ptr[i + 1] += ptr[i]
    terms = np.empty(ptr[-1], np.int64)
    fill = ptr[:-1].copy()
    for v in range(n_areas):
        for r in range(term_ptr[v], term_ptr[v + 1]):
            for c in range(n_cells):
                if term_cells[r, c] and select[r]:
                    terms[fill[v * n_cells + c]] = r
                    fill[v * n_cells + c] += 1
    return ptr, terms


@kernel(nogil=True)
def _same_quadratic_terms(u, v, term_ptr, term_cells, term_table, quadratic):
    """Whether areas u and v have the same quadratic terms, in order: the same tables on the
    same cells."""
    ru, rv = term_ptr[u], term_ptr[v]
    while True:
        while ru < term_ptr[u + 1] and not quadratic[ru]:
            ru += 1
        while rv < term_ptr[v + 1] and not quadratic[rv]:
            rv += 1
        if ru == term_ptr[u + 1] or rv == term_ptr[v + 1]:
            return ru == term_ptr[u + 1] and rv == term_ptr[v + 1]
        if term_table[ru] != term_table[rv]:
            return False
        for c in range(term_cells.shape[1]):
            if term_cells[ru, c] != term_cells[rv, c]:
                return False
        ru += 1
        rv += 1


@kernel(nogil=True)
def quadratic_forms(term_ptr, term_cells, term_table, term_value, inv2v, quadratic):
    """(H, pattern, Y): the quadratic terms of every area v as one quadratic form of its sums S_v,

        H[pattern[v], c, c'] = sum_r 1{c, c' in cells_r} / (2 v_r),   Y[v, c] = sum_r 1{c in cells_r} y_r / (2 v_r),

    over the terms r of v with ``quadratic[r]`` (log w_r(e) = c_r - e^2 / (2 v_r)), so that
    their residuals weigh G[v, c] = sum_r 1{c in cells_r} e_r / (2 v_r) = Y[v, c] - (H S_v)[c]
    (:func:`_add_terms`). H depends on the terms' tables and cells only: the areas measured
    alike (every block group of a state, say) share one ``pattern`` (found by a hash of their
    terms, then checked term by term), so its memory is the number of patterns times n_cells^2
    (a few times 32 MB for the 2,016 cells of the detailed histogram), not the areas'."""
    n_areas = term_ptr.size - 1
    n_cells = term_cells.shape[1] if quadratic.any() else 0  # none: no forms (nor memory) at all
    pattern = np.full(n_areas, -1, np.int64)
    first = np.empty(n_areas, np.int64)  # a representative area of each pattern
    chain = np.full(n_areas, -1, np.int64)  # the next pattern of the same hash
    buckets = numba.typed.Dict.empty(numba.types.uint64, numba.types.int64)
    n_patterns = 0
    for v in range(n_areas):
        h = np.uint64(14695981039346656037)
        for r in range(term_ptr[v], term_ptr[v + 1]):
            if quadratic[r]:
                h = (h ^ np.uint64(term_table[r] + 1)) * np.uint64(1099511628211)
                for c in range(n_cells):
                    if term_cells[r, c]:
                        h = (h ^ np.uint64(c + 7)) * np.uint64(1099511628211)
        p = buckets[h] if h in buckets else -1
        last = -1
        while p >= 0 and not _same_quadratic_terms(first[p], v, term_ptr, term_cells, term_table, quadratic):
            last, p = p, chain[p]
        if p < 0:
            p = n_patterns
            first[p] = v
            n_patterns += 1
            if last >= 0:
                chain[last] = p
            else:
                buckets[h] = p
        pattern[v] = p
    hq = np.zeros((n_patterns, n_cells, n_cells))
    yq = np.zeros((n_areas, n_cells))
    cells = np.empty(n_cells, np.int64)
    for v in range(n_areas):
        fill = first[pattern[v]] == v
        for r in range(term_ptr[v], term_ptr[v + 1]):
            if not quadratic[r]:
                continue
            w = inv2v[term_table[r]]
            m = 0
            for c in range(n_cells):
                if term_cells[r, c]:
                    cells[m] = c
                    m += 1
            for i in range(m):
                yq[v, cells[i]] += w * term_value[r]
                if fill:
                    for j in range(m):
                        hq[pattern[v], cells[i], cells[j]] += w
    return hq, pattern, yq


@kernel(nogil=True)
def settle_term_sums(tsum, S, term_ptr, term_cells, quadratic):
    """tsum[r] = the sum of term r's cells of its area's sums S, for the terms with
    ``quadratic[r]``: the moves (:func:`move`) keep the sums of the terms read from tables
    and leave the quadratic ones' to this, once at the end of a sweep."""
    n_cells = term_cells.shape[1]
    for v in range(term_ptr.size - 1):
        for r in range(term_ptr[v], term_ptr[v + 1]):
            if quadratic[r]:
                acc = 0
                for c in range(n_cells):
                    if term_cells[r, c]:
                        acc += S[v, c]
                tsum[r] = acc


@kernel(nogil=True, inline="always")
def _coefficient(r, j, dcells, dsigns, term_cells):
    """a_r = sum of the direction's signs over the cells term r sums, if the direction's cell
    j is the first of them that r sums (so that a term found under several cells counts
    once); else 0."""
    if dcells.size == 1:
        return dsigns[0]
    for i in range(j):
        if term_cells[r, dcells[i]]:
            return 0
    a = 0
    for i in range(dcells.size):
        if term_cells[r, dcells[i]]:
            a += dsigns[i]
    return a


@kernel(nogil=True)
def _add_terms(v, buf, start, n, lo, dcells, dsigns, tsum, ac_ptr, ac_terms, S, hq, pattern, yq, term_cells,
               term_value, term_table, meta, inv2v, values):
    """buf[start + i] += the log weights at s = lo + i of the terms r of area v that the
    direction moves (a_r != 0), e_r = y_r - t_r their residuals now:

    * the terms read from their tables (the lists ac, :func:`area_cell_terms`): log w_r(e_r - a_r s)
      (:func:`_add_table`, one pass over the buffer each);
    * the quadratic ones, log w_r(e) = c_r - e^2 / (2 v_r) (:func:`quadratic_forms`), relative to
      s = 0, all at once:

          sum_r [e_r^2 - (e_r - a_r s)^2] / (2 v_r) = s (2 B - A s),
          A = sum_r a_r^2 / (2 v_r) = d' H_v d,   B = sum_r a_r e_r / (2 v_r) = d' (Y_v - H_v S_v),

      d the direction's signs on its cells: |D|^2 + |D| n_cells flops and one pass, however
      many terms (at a state's size ~20 a cell of every area). A is a sum of non-negative
      terms up to round-off; A <= 0 means no quadratic term moves.

    Returns whether a term moved."""
    n_cells = term_cells.shape[1]
    moved = False
    big_a = 0.0
    big_b = 0.0
    for j in range(dcells.size):
        q = v * n_cells + dcells[j]
        for p in range(ac_ptr[q], ac_ptr[q + 1]):
            r = ac_terms[p]
            a = _coefficient(r, j, dcells, dsigns, term_cells)
            if a != 0:
                moved = True
                _add_table(term_table[r], term_value[r] - tsum[r] - a * lo, -a, buf, start, n, meta, inv2v,
                           values)
    if hq.shape[1] == 0:  # no quadratic forms (wide tables, DENSE_CELLS): every term read above
        return moved
    for i in range(dcells.size):
        c = dcells[i]
        hrow = hq[pattern[v], c]
        for j in range(dcells.size):
            big_a += dsigns[i] * dsigns[j] * hrow[dcells[j]]
        g = yq[v, c]
        for k in range(n_cells):
            g -= hrow[k] * S[v, k]
        big_b += dsigns[i] * g
    if big_a > 0.0:
        seg = buf[start:start + n]  # (through a slice: the loop vectorises)
        for i in range(n):
            s = float(lo + i)
            seg[i] += s * (2.0 * big_b - big_a * s)
        moved = True
    return moved


@kernel(nogil=True)
def _add_table(k, e0, step, buf, start, n, meta, inv2v, values):
    """buf[start + i] += log w_k(e0 + step i), i < n (step != 0):
    :func:`~dpinfer.lattice.nested.terms.term_log` with the table's description read once:
    the i inside the table are one loop of reads (through a slice, which vectorises), the
    others take its ends' rules."""
    if meta[k, 3] == MIXING:
        _add_mixing(values, meta[k, 2], -e0, -step, buf, start, n)
        return
    lo, size, offset = meta[k, 0], meta[k, 1], meta[k, 2]
    d = e0 - lo  # table index at i = 0
    if step > 0:  # the i with 0 <= d + step i <= size - 1
        i0, i1 = -(d // step), (size - 1 - d) // step
    else:
        i0, i1 = -((size - 1 - d) // -step), d // -step
    i0, i1 = max(i0, 0), min(i1, n - 1)
    if i0 > i1:  # no i inside the table
        i0, i1 = n, n - 1
    seg = buf[start + i0:start + i1 + 1]
    base = offset + d + step * i0
    for t in range(seg.size):
        seg[t] += values[base + step * t]
    for i in range(i0):
        _add_beyond(k, e0 + step * i, buf, start + i, meta, inv2v, values)
    for i in range(i1 + 1, n):
        _add_beyond(k, e0 + step * i, buf, start + i, meta, inv2v, values)


@kernel(nogil=True)
def _add_mixing(values, at, s0, ds, buf, start, n):
    """buf[start + i] += log w(s0 + ds i), i < n, for the MIXING term whose parameters start at
    values[at] (:func:`~dpinfer.lattice.nested.terms.mixing_log`). Along unit steps the
    lgamma difference is carried by lgamma(s + 1 + a) - lgamma(s + 1 + b) = lgamma(s + a) -
    lgamma(s + b) + log((s + a) / (s + b)): one log per entry instead of two lgammas (relative
    drift ~ n eps over a run)."""
    a, b, kappa, c0 = values[at], values[at + 1], values[at + 2], values[at + 3]
    if kappa == -np.inf:
        for i in range(n):
            buf[start + i] = -np.inf
        return
    have = False
    g = 0.0
    for i in range(n):
        s = s0 + ds * i
        if s < 0:
            buf[start + i] = -np.inf
            have = False
            continue
        if have and ds == 1:
            g += math.log((s - 1 + a) / (s - 1 + b))
        elif have and ds == -1:
            g -= math.log((s + a) / (s + b))
        else:
            g = math.lgamma(s + a) - math.lgamma(s + b)
        have = True
        buf[start + i] += g + kappa * s + c0


@kernel(nogil=True, inline="always")
def _add_beyond(k, e, buf, at, meta, inv2v, values):
    """buf[at] += log w_k(e) for an e beyond table k (its HARD, FLAT or GAUSS end)."""
    lo, size, offset = meta[k, 0], meta[k, 1], meta[k, 2]
    left = e < lo
    mode = meta[k, 3] if left else meta[k, 4]
    if mode == 0:
        buf[at] = -np.inf
        return
    edge = lo if left else lo + size - 1
    w = values[offset + edge - lo]
    if mode == 1:
        buf[at] += w
    else:
        buf[at] += w - (float(e) * float(e) - float(edge) * float(edge)) * inv2v[k]


@kernel(nogil=True)
def _cut(buf, start, n, floor, none, out):
    """out = (a, b - a, whether an entry before a is not ``none``, whether one from b on is),
    a .. b - 1 the entries of buf[start : start + n] from the first to the last >= ``floor``."""
    a = start
    while buf[a] < floor:
        a += 1
    b = start + n
    while buf[b - 1] < floor:
        b -= 1
    out[0] = a
    out[1] = b - a
    out[2] = False
    out[3] = False
    for i in range(start, a):
        if buf[i] != none:
            out[2] = True
    for i in range(b, start + n):
        if buf[i] != none:
            out[3] = True


@kernel(nogil=True)
def _finish_log(buf, start, n, trim, out):
    """buf[start : start + n] holds log weights: keep the entries from the first to the last
    within ``trim`` of the maximum, as exp(log weight - maximum); the ends cut are left as
    they are (never read). out: (first kept, number kept, finite weights cut on the left, on
    the right); 0 kept if every weight is zero. Returns the maximum (the log of the scale
    divided out)."""
    m = -np.inf
    for i in range(start, start + n):
        m = max(m, buf[i])
    if m == -np.inf:
        out[1] = 0
        return m
    _cut(buf, start, n, m - trim, -np.inf, out)
    for i in range(out[0], out[0] + out[1]):
        buf[i] = np.exp(buf[i] - m)
    return m


@kernel(nogil=True)
def _finish_linear(buf, start, n, trim, out):
    """buf[start : start + n] holds weights >= 0: divide them by their maximum and keep the
    entries from the first to the last >= exp(-trim). out: as :func:`_finish_log`'s. Returns
    the maximum (the scale divided out; 0 if every weight is zero)."""
    m = 0.0
    for i in range(start, start + n):
        m = max(m, buf[i])
    if m == 0.0:
        out[1] = 0
        return m
    inv = 1.0 / m
    for i in range(start, start + n):
        buf[i] *= inv
    _cut(buf, start, n, np.exp(-trim), 0.0, out)
    return m


@kernel(nogil=True, fastmath={"contract"})
def _convolve(buf, a, na, b, nb, out):
    """buf[out : out + na + nb - 1] = the convolution of buf[a : a + na] and buf[b : b + nb]
    (direct: sums of non-negative products). The products are added through slices, which
    LLVM vectorises (indexing one array on both sides of ``+=`` stays scalar: 3x slower)."""
    if na > nb:  # the longer one in the inner loop: longer vectorised runs, fewer of them
        a, na, b, nb = b, nb, a, na
    o = buf[out:out + na + nb - 1]
    o[:] = 0.0
    y = buf[b:b + nb]
    for i in range(na):
        ai = buf[a + i]
        if ai == 0.0:
            continue
        row = o[i:i + nb]
        for j in range(nb):
            row[j] += ai * y[j]


@kernel(nogil=True)
def _leaf_message(leaf, v, dcells, dsigns, x, tsum, box_lo, box_hi, prior, prior_start, ac_ptr, ac_terms, S, hq, pattern, yq,
                  term_cells, term_value, term_table, meta, inv2v, values, trim, buf, used, kept):
    """Leaf ``leaf`` (area v): its log factor on the z its boxes allow, written at buf[used:]
    and finished (:func:`_finish_log`). Returns (the z of its first entry, entries used, the
    log of the scale divided out), or (zlo, -1, 0) if ``buf`` is short."""
    n_cells = x.shape[1]
    zlo = -(2**62)
    zhi = 2**62
    for j in range(dcells.size):
        c = dcells[j]
        xv = x[leaf, c]
        if dsigns[j] > 0:
            zlo = max(zlo, box_lo[leaf, c] - xv)
            zhi = min(zhi, box_hi[leaf, c] - xv)
        else:
            zlo = max(zlo, xv - box_hi[leaf, c])
            zhi = min(zhi, xv - box_lo[leaf, c])
    n = zhi - zlo + 1
    if used + n > buf.size:
        return zlo, -1, 0.0
    seg = buf[used:used + n]  # (through a slice: the loops vectorise)
    seg[:] = 0.0
    for j in range(dcells.size):
        c = dcells[j]
        at = prior_start[leaf * n_cells + c]
        row = prior[at:at + box_hi[leaf, c] - box_lo[leaf, c] + 1]
        col = x[leaf, c] + dsigns[j] * zlo - box_lo[leaf, c]
        step = dsigns[j]
        for i in range(n):
            seg[i] += row[col + step * i]
    _add_terms(v, buf, used, n, zlo, dcells, dsigns, tsum, ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value,
               term_table, meta, inv2v, values)
    return zlo, n, _finish_log(buf, used, n, trim, kept)


@kernel(nogil=True)
def _area_terms(v, dcells, dsigns, tsum, ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value, term_table, meta,
                inv2v, values, trim, buf, cs, cn, lo, used, kept):
    """An inner area's message if the direction moves its terms: the convolution of its
    children buf[cs : cs + cn] (first sum lo) times the terms' weights, written at
    buf[used : used + cn] and finished (:func:`_finish_linear`); buf[used + cn : used + 2 cn]
    is scratch (the terms' log weights, scaled by their maximum before exp). Returns (whether
    it moves a term, the log and the linear factor of the scale divided out); (False, 0, 1)
    and nothing written if it moves none."""
    lt = used + cn
    for i in range(cn):
        buf[lt + i] = 0.0
    if not _add_terms(v, buf, lt, cn, lo, dcells, dsigns, tsum, ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value,
                      term_table, meta, inv2v, values):
        return False, 0.0, 1.0
    m = -np.inf
    for i in range(cn):
        if buf[cs + i] > 0.0:
            m = max(m, buf[lt + i])
    if m == -np.inf:
        kept[1] = 0
        return True, m, 1.0
    for i in range(cn):
        w = buf[cs + i]
        buf[used + i] = w * np.exp(buf[lt + i] - m) if w > 0.0 else 0.0
    return True, m, _finish_linear(buf, used, cn, trim, kept)


@kernel(nogil=True)
def _compact(buf, to, kept):
    """Move the kept entries buf[kept[0] : kept[0] + kept[1]] down to buf[to:] (to <=
    kept[0]), so that the buffer holds only what later steps read (it stays in cache);
    kept[0] = to. Returns how many entries the first kept one lay beyond ``to``."""
    shift = kept[0] - to
    for i in range(kept[1]):
        buf[to + i] = buf[kept[0] + i]
    kept[0] = to
    return shift


@kernel(nogil=True)
def _up(dcells, dsigns, x, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area, area_leaf,
        ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value, term_table, meta, inv2v, values, trim, buf, mstart,
        mlen, mlo, cut, pstart, plen, plo, want_scale, injected):
    """The upward pass: every area's message (mstart, mlen, mlo: where it lies in ``buf`` and
    the sum its first entry stands for) and the partial convolutions of every area's first
    children (pstart, plen, plo, by child position), all as weights scaled to a maximum of 1,
    each moved down to the buffer's end of use once trimmed (:func:`_compact`). An area whose
    terms the direction does not move shares its last partial convolution (or its one
    child's message). Returns (status, log scale): the status _OK, _NO_MASS, or _FULL if
    ``buf`` is too small; with ``want_scale`` the log scale is the sum of the logs of every
    scale divided out, so that log sum_z p(z) (the unnormalised law of the module docstring,
    up to the entries the trim cut) = log scale + log of the sum of the root's message (else
    0: a move does not need it). ``injected`` = (weights, start, length, first sum), each
    leaf's message given rather than computed (a shard's root message, :func:`with_injected`;
    no log scale), or empty arrays."""
    inj_w, inj_start, inj_len, inj_lo = injected
    kept = np.zeros(4, np.int64)
    used = 0
    log_scale = 0.0
    for v in order:
        leaf = area_leaf[v]
        if leaf >= 0 and inj_len.size > 0:
            n = inj_len[leaf]
            if used + n > buf.size:
                return _FULL, log_scale
            buf[used:used + n] = inj_w[inj_start[leaf]:inj_start[leaf] + n]
            kept[0], kept[1], kept[2], kept[3] = used, n, False, False  # the shard counts its own cuts
            lo = inj_lo[leaf]
            used += n
        elif leaf >= 0:
            lo, n, scale = _leaf_message(leaf, v, dcells, dsigns, x, tsum, box_lo, box_hi, prior, prior_start,
                                         ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value, term_table, meta, inv2v,
                                         values, trim, buf, used, kept)
            if n < 0:
                return _FULL, log_scale
            if kept[1] == 0:
                return _NO_MASS, log_scale
            if want_scale:
                log_scale += scale
            lo += _compact(buf, used, kept)
            used += kept[1]
        else:
            first = child_ptr[v]
            ch = child_area[first]
            cs, cn, lo = mstart[ch], mlen[ch], mlo[ch]
            kept[0], kept[1], kept[2], kept[3] = cs, cn, cut[ch, 0], cut[ch, 1]
            for p in range(first + 1, child_ptr[v + 1]):
                ch = child_area[p]
                n = cn + mlen[ch] - 1
                if used + n > buf.size:
                    return _FULL, log_scale
                _convolve(buf, cs, cn, mstart[ch], mlen[ch], used)
                scale = _finish_linear(buf, used, n, trim, kept)
                if kept[1] == 0:
                    return _NO_MASS, log_scale
                if want_scale:
                    log_scale += math.log(scale)
                lo += mlo[ch] + _compact(buf, used, kept)
                cs, cn = kept[0], kept[1]
                pstart[p], plen[p], plo[p] = cs, cn, lo
                used += cn
            if used + 2 * cn > buf.size:
                return _FULL, log_scale
            # the area's own message if it moves terms (else its last partial convolution)
            moved, log_factor, scale = _area_terms(v, dcells, dsigns, tsum, ac_ptr, ac_terms, S, hq, pattern, yq, term_cells,
                                                   term_value, term_table, meta, inv2v, values, trim, buf, cs,
                                                   cn, lo, used, kept)
            if moved:
                if kept[1] == 0:
                    return _NO_MASS, log_scale
                if want_scale:
                    log_scale += log_factor + math.log(scale)
                lo += _compact(buf, used, kept)
                used += kept[1]
        mstart[v], mlen[v], mlo[v] = kept[0], kept[1], lo
        cut[v, 0], cut[v, 1] = kept[2], kept[3]
    return _OK, log_scale


@kernel(nogil=True)
def _sample(buf, start, n, rng):
    """An index i in 0 .. n-1 drawn with probability ∝ buf[start + i] (weights >= 0, not all 0)."""
    total = 0.0
    for i in range(start, start + n):
        total += buf[i]
    u = uniform(rng) * total
    acc = 0.0
    last = 0
    for i in range(n):
        w = buf[start + i]
        if w > 0.0:
            last = i
            acc += w
            if u < acc:
                return i
    return last


@kernel(nogil=True)
def _down(buf, order, child_ptr, child_area, area_leaf, mstart, mlen, mlo, pstart, plen, plo,
          s_area, rng, draw_root):
    """The downward pass: s_area[v] for every area, the root's from its message (or, if not
    ``draw_root``, as the caller set it), each area's split among its children from the
    last. Returns False if a split has no mass."""
    n_areas = order.size
    root = order[n_areas - 1]
    if draw_root:
        s_area[root] = mlo[root] + _sample(buf, mstart[root], mlen[root], rng)
    for idx in range(n_areas - 1, -1, -1):
        v = order[idx]
        if area_leaf[v] >= 0:
            continue
        s = s_area[v]
        first = child_ptr[v]
        for p in range(child_ptr[v + 1] - 1, first, -1):
            ch = child_area[p]
            cs, cn, clo = mstart[ch], mlen[ch], mlo[ch]
            if p - 1 > first:
                ps, pn, plo_ = pstart[p - 1], plen[p - 1], plo[p - 1]
            else:
                f = child_area[first]
                ps, pn, plo_ = mstart[f], mlen[f], mlo[f]
            lo = max(clo, s - (plo_ + pn - 1))
            hi = min(clo + cn - 1, s - plo_)
            # w(s_c) = m_c(s_c) P(s - s_c), summed on the fly: no scratch array
            total = 0.0
            for t in range(lo, hi + 1):
                total += buf[cs + t - clo] * buf[ps + s - t - plo_]
            if not total > 0.0:
                return False
            u = uniform(rng) * total
            acc = 0.0
            pick = lo
            for t in range(lo, hi + 1):
                w = buf[cs + t - clo] * buf[ps + s - t - plo_]
                if w > 0.0:
                    pick = t
                    acc += w
                    if u < acc:
                        break
            s_area[ch] = pick
            s -= pick
        s_area[child_area[first]] = s
    return True


@kernel(nogil=True)
def _update(dcells, dsigns, x, S, tsum, lo_open, hi_open, box_lo, box_hi, area_leaf, ac_ptr, ac_terms,
            term_cells, mlo, mlen, cut, s_area, stats):
    """Apply the drawn sums s_area to x, S and tsum; the statistics (:func:`draw_direction`)."""
    n_cells = x.shape[1]
    k = dcells.size
    stats[0] += 1
    for v in range(s_area.size):
        sv = s_area[v]
        if (cut[v, 0] and sv == mlo[v]) or (cut[v, 1] and sv == mlo[v] + mlen[v] - 1):
            stats[1] += 1
        if sv == 0:
            continue
        for j in range(k):
            S[v, dcells[j]] += dsigns[j] * sv
            q = v * n_cells + dcells[j]
            for p in range(ac_ptr[q], ac_ptr[q + 1]):
                r = ac_terms[p]
                tsum[r] += _coefficient(r, j, dcells, dsigns, term_cells) * sv
        leaf = area_leaf[v]
        if leaf < 0:
            continue
        for j in range(k):
            c = dcells[j]
            x[leaf, c] += dsigns[j] * sv
            xv = x[leaf, c]
            if (lo_open[leaf, c] and xv == box_lo[leaf, c]) or (hi_open[leaf, c] and xv == box_hi[leaf, c]):
                stats[2] += 1


@kernel(nogil=True)
def workspace(order, child_area, term_ptr, term_cells, term_value, term_table, meta, inv2v, values, box_lo, box_hi):
    """What the moves of a sweep share (:func:`move`): the terms by area and cell
    (:func:`area_cell_terms`), those read from their tables and the quadratic ones
    (:func:`~dpinfer.lattice.nested.terms.quadratic_tables`) apart, the message buffer (in a
    one-element list: :func:`move` replaces it by one twice as long when it is short; first 4
    entries per area and box width), per area a message's start, length, first sum and cut flags, per child position
    a partial convolution's start, length and first sum, the drawn sums, and the leaves'
    injected messages (none: :func:`_up`; :func:`with_injected` sets them)."""
    n_areas, n_children = order.size, child_area.size
    if term_cells.shape[1] <= DENSE_CELLS:
        quadratic = quadratic_tables(meta, inv2v, values)[term_table]
    else:
        quadratic = np.zeros(term_table.size, np.bool_)
    ac_ptr, ac_terms = area_cell_terms(term_ptr, term_cells, ~quadratic)
    hq, pattern, yq = quadratic_forms(term_ptr, term_cells, term_table, term_value, inv2v, quadratic)
    widest = 1
    for leaf in range(box_lo.shape[0]):
        for c in range(box_lo.shape[1]):
            widest = max(widest, box_hi[leaf, c] - box_lo[leaf, c] + 1)
    buf = [np.empty(max(4 * n_areas * widest, 1024))]
    return (ac_ptr, ac_terms, quadratic, hq, pattern, yq, buf, np.zeros(n_areas, np.int64), np.zeros(n_areas, np.int64),
            np.zeros(n_areas, np.int64), np.zeros((n_areas, 2), np.bool_), np.zeros(n_children, np.int64),
            np.zeros(n_children, np.int64), np.zeros(n_children, np.int64), np.zeros(n_areas, np.int64),
            (np.empty(0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)))


@kernel(nogil=True)
def _up_growing(dcells, dsigns, x, S, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area,
                area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim, work, want_scale):
    """The upward pass (:func:`_up`) in ``work``'s buffer, doubled until it fits. Returns -inf
    if the law has no mass, else log sum_z p(z) with ``want_scale``, else 0."""
    ac_ptr, ac_terms, quadratic, hq, pattern, yq, buf, mstart, mlen, mlo, cut, pstart, plen, plo, s_area, injected = work
    while True:
        status, log_scale = _up(dcells, dsigns, x, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr,
                                child_area, area_leaf, ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value, term_table,
                                meta, inv2v, values, trim, buf[0], mstart, mlen, mlo, cut, pstart, plen, plo,
                                want_scale, injected)
        if status != _FULL:
            break
        buf[0] = np.empty(2 * buf[0].size)
    if status == _NO_MASS:
        return -np.inf
    if not want_scale:
        return 0.0
    root = order[order.size - 1]
    total = 0.0
    for i in range(mstart[root], mstart[root] + mlen[root]):
        total += buf[0][i]
    return log_scale + math.log(total)


@kernel(nogil=True)
def _log_weight_now(dcells, dsigns, x, S, tsum, box_lo, prior, prior_start, order, area_leaf, term_cells,
                    term_value, term_table, meta, inv2v, values, work):
    """log p(0): the direction's law (module docstring) at z = 0, the current counts."""
    ac_ptr, ac_terms, hq, pattern, yq = work[0], work[1], work[3], work[4], work[5]
    n_cells = x.shape[1]
    one = np.zeros(1)
    for v in order:
        leaf = area_leaf[v]
        if leaf >= 0:
            for j in range(dcells.size):
                c = dcells[j]
                one[0] += prior[prior_start[leaf * n_cells + c] + x[leaf, c] - box_lo[leaf, c]]
        _add_terms(v, one, 0, 1, 0, dcells, dsigns, tsum, ac_ptr, ac_terms, S, hq, pattern, yq, term_cells, term_value,
                   term_table, meta, inv2v, values)
    return one[0]


@kernel(nogil=True)
def log_mass_ratio(dcells, dsigns, x, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area,
                   area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim, work):
    """log (sum_z p(z) / p(0)), p the direction's unnormalised law (module docstring) and
    z = 0 the current counts: the log of the factor by which summing the counts out along the
    direction multiplies the joint density at the current counts. With the prior's rows and
    factors the prior's own (normalised) log pmf, log p(parameters, counts) + this ratio is
    the log density of the parameters and the counts with the direction summed out (what a
    collapsed move of the parameters targets). The entries the trim cut are left out (at
    most e^-trim per entry cut, relative to its message's maximum)."""
    S = np.empty((order.size, x.shape[1]), np.int64)
    area_sums(x, S, order, child_ptr, child_area, area_leaf)
    log_total = _up_growing(dcells, dsigns, x, S, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr,
                            child_area, area_leaf, term_cells, term_value, term_table, meta, inv2v, values,
                            trim, work, True)
    return log_total - _log_weight_now(dcells, dsigns, x, S, tsum, box_lo, prior, prior_start, order, area_leaf,
                                       term_cells, term_value, term_table, meta, inv2v, values, work)


@kernel(nogil=True)
def move(dcells, dsigns, x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, prior_start, order, child_ptr,
         child_area, area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim, rng,
         stats, work):
    """:func:`draw_direction` with ``work`` from :func:`workspace` (a sweep makes it once and
    passes it to every move; it holds the terms by area, hence no ``term_ptr`` here), but the
    sums in ``tsum`` of the quadratic terms are left as they were: they are read from S
    (:func:`_add_terms`), and :func:`settle_term_sums` brings them up to date after the last
    move."""
    ac_ptr, ac_terms, quadratic, hq, pattern, yq, buf, mstart, mlen, mlo, cut, pstart, plen, plo, s_area, injected = work
    if _up_growing(dcells, dsigns, x, S, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area,
                   area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim, work,
                   False) == -np.inf:
        return False
    if not _down(buf[0], order, child_ptr, child_area, area_leaf, mstart, mlen, mlo, pstart, plen, plo,
                 s_area, rng, True):
        return False
    _update(dcells, dsigns, x, S, tsum, lo_open, hi_open, box_lo, box_hi, area_leaf, ac_ptr, ac_terms,
            term_cells, mlo, mlen, cut, s_area, stats)
    return True


@kernel(nogil=True)
def root_message(dcells, dsigns, x, S, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area,
                 area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim, work):
    """A shard's first half of a move along (dcells, dsigns) when the tree is split
    (:meth:`~dpinfer.lattice.nested.structure.NestedSums.split`): the upward pass over the
    shard's areas, kept in ``work`` for :func:`move_from_root`. Returns the root's message
    (weights scaled to a maximum of 1; empty if the law has no mass) and the sum its first
    entry stands for. The tree's upper areas (the driver's) take it as one leaf's message
    (:func:`with_injected`), so the root's sum is drawn from the same law as in the whole
    tree's pass: the message is the sum over the shard's z with s_root fixed of the shard's
    factors, whichever areas hold them."""
    if _up_growing(dcells, dsigns, x, S, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area,
                   area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim, work,
                   False) == -np.inf:
        return np.empty(0), 0
    buf, mstart, mlen, mlo = work[6][0], work[7], work[8], work[9]
    root = order[order.size - 1]
    return buf[mstart[root]:mstart[root] + mlen[root]].copy(), mlo[root]


@kernel(nogil=True)
def move_from_root(root_sum, dcells, dsigns, x, S, tsum, box_lo, box_hi, lo_open, hi_open, order, child_ptr,
                   child_area, area_leaf, term_cells, rng, stats, work):
    """A shard's second half of the move :func:`root_message` began: its root's sum along the
    direction given (``root_sum``, drawn by the upper areas), split down the shard's tree from
    the messages ``work`` kept; x, S and tsum updated (quadratic terms: as :func:`move`).
    Returns False if a split has no mass."""
    ac_ptr, ac_terms, quadratic, hq, pattern, yq, buf, mstart, mlen, mlo, cut, pstart, plen, plo, s_area, injected = work
    s_area[order[order.size - 1]] = root_sum
    if not _down(buf[0], order, child_ptr, child_area, area_leaf, mstart, mlen, mlo, pstart, plen, plo,
                 s_area, rng, False):
        return False
    _update(dcells, dsigns, x, S, tsum, lo_open, hi_open, box_lo, box_hi, area_leaf, ac_ptr, ac_terms,
            term_cells, mlo, mlen, cut, s_area, stats)
    return True


def with_injected(work, messages) -> tuple:
    """``work`` (:func:`workspace`) with its leaves' messages given: ``messages``, one
    (weights, first sum) per leaf in leaf order (:func:`root_message`'s), for :func:`move`
    on the upper areas of a split tree, whose leaves are the shards' roots."""
    lengths = np.array([w.size for w, _ in messages], np.int64)
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    weights = np.concatenate([w for w, _ in messages]) if messages else np.empty(0)
    return work[:15] + ((weights, start, lengths, np.array([lo for _, lo in messages], np.int64)),)


@kernel(nogil=True)
def draw_direction(dcells, dsigns, x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior,
                   prior_start, order, child_ptr, child_area, area_leaf, term_ptr, term_cells, term_value,
                   term_table, meta, inv2v, values, trim, rng, stats):
    """One exact draw of the counts along the direction (dcells, dsigns) given the rest
    (module docstring); x, S and tsum updated in place. ``prior[prior_start[l * n_cells + c] + j]``
    is log p_{l,c}(box_lo[l, c] + j), j = 0 .. box_hi[l, c] - box_lo[l, c]. stats: [0] draws, [1] trimmed edges hit, [2] counts at an
    open box edge after the draw. Returns False if the law has no mass (no move made)."""
    work = workspace(order, child_area, term_ptr, term_cells, term_value, term_table, meta, inv2v, values, box_lo, box_hi)
    moved = move(dcells, dsigns, x, S, tsum, box_lo, box_hi, lo_open, hi_open, prior, prior_start, order,
                 child_ptr, child_area, area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim,
                 rng, stats, work)
    settle_term_sums(tsum, S, term_ptr, term_cells, work[2])
    return moved


@kernel(nogil=True)
def cells_redrawn_alone(x, S, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area, area_leaf,
                        term_ptr, term_cells, term_value, term_table, meta, inv2v, values, trim, rng, out):
    """Copies of the counts with every cell redrawn alone given the others, the counts left
    as they are: for each cell c, one upward pass along c (the direction of the cell alone,
    module docstring) and then ``out.shape[0]`` independent downward passes, so that
    out[m, :, c] is an exact draw of the column x[:, c] given every other column (and the
    parameters the prior table ``prior`` was filled for), the copies m independent given x.
    Copy m mixes cells each drawn given the *current* others, so it is not a draw of the
    joint law; a function of one column alone has the same conditional expectation given the
    others on x[:, c] and on out[m, :, c] (the Rao-Blackwell average of
    :mod:`dpinfer.inference.empirical_bayes`). S and tsum must be those of x (as after a sweep
    or :func:`current_sums`). Returns False if a cell's law has no mass."""
    work = workspace(order, child_area, term_ptr, term_cells, term_value, term_table, meta, inv2v, values, box_lo, box_hi)
    ac_ptr, ac_terms, quadratic, hq, pattern, yq, buf, mstart, mlen, mlo, cut, pstart, plen, plo, s_area, injected = work
    cells = np.zeros(1, np.int64)
    signs = np.ones(1, np.int64)
    for c in range(x.shape[1]):
        cells[0] = c
        if _up_growing(cells, signs, x, S, tsum, box_lo, box_hi, prior, prior_start, order, child_ptr, child_area,
                       area_leaf, term_cells, term_value, term_table, meta, inv2v, values, trim, work,
                       False) == -np.inf:
            return False
        for m in range(out.shape[0]):
            if not _down(buf[0], order, child_ptr, child_area, area_leaf, mstart, mlen, mlo, pstart, plen, plo,
                         s_area, rng, True):
                return False
            for v in range(area_leaf.size):
                leaf = area_leaf[v]
                if leaf >= 0:
                    out[m, leaf, c] = x[leaf, c] + s_area[v]
    return True


@kernel(nogil=True)
def current_sums(x, S, tsum, order, child_ptr, child_area, area_leaf, term_cells, term_area):
    """Fill S (every area's sums of x) and tsum (every term's sum) from the counts x."""
    area_sums(x, S, order, child_ptr, child_area, area_leaf)
    n_cells = x.shape[1]
    for r in range(tsum.size):
        acc = 0
        v = term_area[r]
        for c in range(n_cells):
            if term_cells[r, c]:
                acc += S[v, c]
        tsum[r] = acc


@kernel(nogil=True)
def area_sums(x, S, order, child_ptr, child_area, area_leaf):
    """Fill S with every area's sums of the counts x."""
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
