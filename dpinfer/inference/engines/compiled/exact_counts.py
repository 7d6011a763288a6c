r"""Exact draws of latent counts given the parameters (the counts' block of the Gibbs sweep).

Cell i of a latent has prior p(x_i | theta) and a release s_i with likelihood p(s_i | x_i).
Given theta its full conditional is

    q_i(v) ∝ p(v | theta) p(s_i | v),   v integer,

independent across cells; a release conditioned on group totals (inference notes §2) adds
the constraint sum_{i in g} x_i = T_g for every group g.

**Inside a window** lo_i <= v < lo_i + W the log weights are a table: the prior's log pmf on
the grid (one compiled call per sweep, :mod:`dpinfer.inference.engines.compiled.model`) plus the release's
log-likelihood (computed once per release). Draws inside are by inversion of the cumulative
sums.

**Outside the window** the draws are exact too, by rejection from a geometric envelope, for
additive noise whose log density is c0 - c1 |e|^p (p = 1, 2: Laplace, double geometric,
Gaussian, discrete Gaussian; ``AdditiveMechanism.noise_shape``). Such a law is log-concave,
so on the right tail (v = hi + 1 + t, t >= 0, e = s - v <= 0 there)

    p(s | v) <= f(e_0) exp(-t rho),   rho = log f(e_0) - log f(e_0 - 1),

and the same on the left; the prior pmf is <= 1. Each cell is then drawn from the mixture of
its table (mass Z_in) and two geometric tails (envelope masses E_L, E_R): a tail proposal v is
accepted with probability p(v | theta) f(s - v) / envelope(v) <= 1, else the draw restarts.
This is ordinary rejection sampling whose envelope equals the target inside the window, so
each draw is exact over all integers, whatever the window; the window only sets how often a
tail proposal (which costs one evaluation of the prior off the table) happens.

**Held cells and capped tries.** Where the parameters put a cell's prior far from its release
(early in tuning, from a random start), the window holds almost none of the conditional mass
and the envelope would accept almost nothing. Two rules keep every sweep cheap and still leave
p(x | theta) invariant:

* a cell whose envelope mass exceeds ``hold_ratio`` times its in-window mass keeps its current
  count for the sweep (``HOLD_RATIO`` after tuning, ``HOLD_RATIO_TUNING`` during it); with totals, the other cells of its group are drawn on the total minus
  the held counts. Which cells are held depends on the parameters and the fixed windows only,
  so this is a Gibbs update of the other cells given the held ones;
* a rejection sampler that has not accepted within its cap (``CELL_TRIES`` tail proposals for
  a cell, ``GROUP_TRIES`` tries for a group) keeps the current counts. Whether it accepts in
  time does not depend on the counts being updated, and given that it accepts its draw is
  exact, so the block is "an exact draw with probability p, else no move";
* a group is not tried at all (kept) when, after tilting, a free cell's envelope is heavy or
  the tilted total's mean stays more than ``GROUP_REACH`` sd from the target (the tilt is
  bounded to keep the envelopes summable): both are functions of the parameters and the held
  counts, so again the move or no-move decision does not look at the counts it would change.

For the same reason the tilt is recomputed from lambda = 0 at every sweep rather than started
from the previous sweep's value, which depends on the chain's past counts.

Both are counted (held cells; groups or cells kept after a cap); after tuning they are rare.
Holding is invariant but not ergodic where the posterior itself puts a cell far outside its
window (a release far from anything the prior allows): the cell would never move. A chain that
holds cells in most of its draws therefore makes ``dpinfer.sample`` widen the windows and fit
again (:func:`dpinfer.inference.engines.compiled.engine.held_too_often`).

Mechanisms without that form (clamped, truncated) keep the tables alone and report the
neglected mass as in inference notes §1: sum_i log1p(eta_i / L_i), eta_i the mechanism's bound
on p(s_i | v) outside the window, L_i the table's mass.

**Group totals** (x | theta, sum_{i in g} x_i = T_g): per group, every cell's law is tilted
by exp(lambda v) (leaves the conditional law on the fibre unchanged; lambda solved by Newton
from 0, so that the tilted mean of the group's total is within half a sd of T_g) and
one cell l (the one with the largest tilted variance) is kept back: the others are drawn
exactly from their tilted laws (tails included), x_l = T_g - sum of the others, and the
draw is accepted with probability q~_l(x_l) / M_l, M_l >= max_v q~_l(v) (the table's maximum
and the envelopes' values at the window's edges). Rejection sampling again: the accepted
vector is an exact draw of x given theta on the fibre. The expected number of tries is about
sd(total) / sd(x_l).
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel
from dpinfer._random_stream import below, uniform, uniform_open
from dpinfer.inference.engines.compiled.native import (
    group_mixing_at,
    pointer,
    prior_flat_at,
    prior_point_at,
    prior_table_at,
)
from dpinfer.lattice.nested.terms import write_group_mixing

HOLD_RATIO = 1000.0  # a cell whose tail envelope outweighs its window this much is held
HOLD_RATIO_TUNING = 10.0  # ... during tuning, whose draws are discarded (cheaper sweeps)
CELL_TRIES = 10_000  # tail proposals of one cell draw before it gives up (keeps the count)
GROUP_TRIES = 1_000  # tries of one block before it gives up (keeps its counts)
GROUP_REACH = 4.0  # a group whose tilted total stays this many sd from its target is kept
BLOCK_CELLS = 32  # larger groups are drawn in random blocks of about this many cells
_NEWTON_STEPS = 30
_FAILED = -(2**62)  # returned by a cell draw that gave up


@kernel(nogil=True)
def noise_log(e, c0, c1, power):
    """log f(e) = c0 - c1 |e|^power."""
    a = abs(e)
    return c0 - c1 * (a if power == 1 else a * a)


@kernel(nogil=True)
def log_weight_tables(prior_address, hoisted, q, env, grid, release_table, out):
    """out[i, j] = log p(x_i = grid[i, j] | theta) + release_table[i, j], all (d, W): the
    prior's table from the full table function at ``prior_address`` (``hoisted``: the
    addresses of its grid-only terms; ``env``: the model's environment, the counts' address
    and the data's, :meth:`dpinfer.inference.engines.compiled.model.CompiledModel.environment`), one
    contiguous row per cell."""
    f = prior_table_at(prior_address)
    f(pointer(q.ctypes.data), pointer(env.ctypes.data), pointer(grid.ctypes.data),
      pointer(out.ctypes.data), grid.shape[1], pointer(hoisted.ctypes.data))
    out += release_table


@kernel(nogil=True)
def flat_prior_table(prior_address, hoisted, q, env, grid, rows, out):
    """out[k] = log p(x_rows[k] = grid[k] | theta), all (K,): the prior's flat table from the
    function at ``prior_address`` (:class:`~dpinfer.inference.engines.compiled.model.PriorTable`),
    ``hoisted`` the addresses of its grid-only terms."""
    f = prior_flat_at(prior_address)
    f(pointer(q.ctypes.data), pointer(env.ctypes.data), pointer(grid.ctypes.data),
      pointer(rows.ctypes.data), pointer(out.ctypes.data), grid.shape[0], pointer(hoisted.ctypes.data))


@kernel(nogil=True)
def group_mixing_tables(address, q, env, out, at, values, group_area, leaf_group, group_parent, S, box_lo,
                        box_hi, prior_start, table):
    """A GroupedNegativeBinomial's group factors from the parameters, tilted towards the
    current counts. The native function at ``address`` writes each group g and cell c's
    (a, A, M) into ``out`` (G * C, 3); :func:`~dpinfer.lattice.nested.terms.write_group_mixing`
    writes the factors' tables in ``values`` (from ``at``) and tilts them and the counts' flat
    prior ``table`` (its docstring: why, and the arguments), with no group above the
    coarsest."""
    f = group_mixing_at(address)
    f(pointer(q.ctypes.data), pointer(env.ctypes.data), pointer(out.ctypes.data))
    write_group_mixing(out, at, values, group_area, leaf_group, group_parent, S, np.zeros(S.shape[1]), box_lo,
                       box_hi, prior_start, table, np.empty(at.size))


@kernel(nogil=True)
def _prior_at(point_address, q, env, i, v):
    """log p(x_i = v | theta) for one cell at one value, off the table."""
    f = prior_point_at(point_address)
    return f(pointer(q.ctypes.data), pointer(env.ctypes.data), i, v)


# exp(x) for x <= 0: x = k ln 2 + r, |r| <= ln(2)/2 (Cody & Waite's two-part ln 2), e^r by its
# degree-13 Taylor polynomial (truncation < 4e-18 relative), 2^k from the exponent bits.
# Within 1 ulp of libm on [-708, 0] (tests/test_exact_counts.py) and about twice as fast in
# numba, because the loop vectorises; below -708 (e^-708 ~ 3e-308) it returns 0.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_EXP_MIN = -708.0


@kernel(nogil=True, fastmath={"nnan"})
def _row_max(x):
    """max_j x[j] (-inf for an all -inf row; a log-weight table holds no NaN)."""
    m = -math.inf
    for j in range(x.shape[0]):
        m = max(m, x[j])
    return m


@kernel(nogil=True, fastmath={"reassoc", "contract"})
def weights_moments(lw, w, bits):
    """One cell's row: w = exp(lw - m), m = max(lw), and the offsets' (mass, mean, variance)
    under w, summed in the pass that finishes w. Returns (m, mass, mean, variance); m = -inf
    and w = 0 for an empty row. ``bits`` is int64 scratch of the row's length. The sums may
    be reassociated (vectorised): they steer the tilt and the hold rule, whose exactness does
    not depend on rounding; w is within 1 ulp of libm's exp (tests/test_exact_counts.py)."""
    m = _row_max(lw)
    if m == -math.inf:
        w[:] = 0.0
        return m, 0.0, 0.0, 0.0
    for j in range(lw.shape[0]):  # exp(v), v = lw[j] - m <= 0, as p 2^k (see above)
        v = lw[j] - m
        keep = v >= _EXP_MIN
        v = max(v, _EXP_MIN)
        k = math.floor(v * _INV_LN2 + 0.5)
        r = (v - k * _LN2_HI) - k * _LN2_LO
        p = 1.0 / 6227020800.0
        p = p * r + 1.0 / 479001600.0
        p = p * r + 1.0 / 39916800.0
        p = p * r + 1.0 / 3628800.0
        p = p * r + 1.0 / 362880.0
        p = p * r + 1.0 / 40320.0
        p = p * r + 1.0 / 5040.0
        p = p * r + 1.0 / 720.0
        p = p * r + 1.0 / 120.0
        p = p * r + 1.0 / 24.0
        p = p * r + 1.0 / 6.0
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        w[j] = p
        bits[j] = ((np.int64(k) + 1023) << 52) if keep else 0  # 2^k's bits (0 reads as 0.0)
    scale = bits.view(np.float64)  # a separate pass: the loop above then vectorises
    total = 0.0
    s1 = 0.0
    s2 = 0.0
    for j in range(lw.shape[0]):
        x = w[j] * scale[j]
        w[j] = x
        total += x
        s1 += x * j
        s2 += x * (j * j)
    mean = s1 / total
    return m, total, mean, max(s2 / total - mean * mean, 0.0)


@kernel(nogil=True)
def _tilt(lam, tilt):
    """tilt[j] = exp(lam j): the tilt's factors over a window's offsets (shared by the cells
    of a block, whose windows have one width), by products of exp(lam): relative error at
    most about j ulp, and one exponential instead of W."""
    r = math.exp(lam)
    t = 1.0
    for j in range(tilt.shape[0]):
        tilt[j] = t
        t *= r


@kernel(nogil=True, fastmath={"reassoc"})
def _moments(w, tilt):
    """(mass, mean, variance) of the offsets j under the weights w_j tilt_j. The sums may be
    reassociated (vectorised): they steer the tilt and the hold rule, whose exactness does
    not depend on rounding."""
    total = 0.0
    s1 = 0.0
    s2 = 0.0
    for j in range(w.shape[0]):
        x = w[j] * tilt[j]
        total += x
        s1 += x * j
        s2 += x * (j * j)
    if not total > 0.0:
        return total, 0.0, 0.0
    mean = s1 / total
    return total, mean, max(s2 / total - mean * mean, 0.0)


@kernel(nogil=True)
def _cumulative(w, tilt, cdf):
    """cdf[j] = sum_{k <= j} w_k tilt_k (the table a cell's draw inverts)."""
    total = 0.0
    for j in range(w.shape[0]):
        total += w[j] * tilt[j]
        cdf[j] = total


@kernel(nogil=True)
def _envelope(i, lam, m, W, tails, out):
    """out = (E_L, E_R, r_L, r_R): masses of the tilted geometric envelopes relative to exp(m)
    and their ratios. ``tails`` rows: left_ok, left_env, left_decay, right_ok, right_env,
    right_decay (per cell); the tilt is exp(lam j), j the offset from the window's start."""
    out[0] = 0.0
    out[1] = 0.0
    out[2] = 0.0
    out[3] = 0.0
    if tails[0, i] > 0.0:
        out[2] = math.exp(-tails[2, i] - lam)
        out[0] = math.exp(tails[1, i] - lam - m) / (1.0 - out[2])
    if tails[3, i] > 0.0:
        out[3] = math.exp(-tails[5, i] + lam)
        out[1] = math.exp(tails[4, i] + lam * W - m) / (1.0 - out[3])


@kernel(nogil=True)
def _held(envelope, z_in, hold_ratio):
    """The tails' envelope outweighs the window ``hold_ratio``-fold (or the window is empty)."""
    return not envelope[0] + envelope[1] <= hold_ratio * z_in


@kernel(nogil=True)
def _search(cdf, row, u):
    """Smallest j with cdf[row, j] > u (the row non-decreasing, u < its last entry): the
    answer stays in [base, base + n), each halving a conditional move rather than a branch."""
    base = 0
    n = cdf.shape[1]
    while n > 1:
        half = n >> 1
        base = base + half if cdf[row, base + half - 1] <= u else base
        n -= half
    return base


@kernel(nogil=True)
def _geometric(r, rng):
    """t >= 0 with P(t) = (1 - r) r^t."""
    return int(math.floor(math.log(uniform_open(rng)) / math.log(r)))


@kernel(nogil=True, inline="always")
def _draw_cell(i, row, cdf, envelope, lo, tails, release, shape, point_address, q, env, rng):
    """One exact draw of cell i from its tilted conditional (module docstring), given its
    cumulative table cdf[row] and its envelopes envelope[:, row] = (E_L, E_R, r_L, r_R) with
    the same tilt and scale. Returns the count, or _FAILED if no tail proposal was accepted
    in CELL_TRIES. The first try lands in the table almost always and is handled here, the
    rest by :func:`_draw_tails` (rows are indexed, not sliced: a view per draw costs more
    than the draw)."""
    W = cdf.shape[1]
    z_in = cdf[row, W - 1]
    u = uniform(rng) * (z_in + envelope[0, row] + envelope[1, row])
    if u < z_in:
        return lo + _search(cdf, row, u)
    return _draw_tails(i, row, u, cdf, envelope, lo, tails, release, shape, point_address, q,
                       env, rng)


@kernel(nogil=True)
def _draw_tails(i, row, u, cdf, envelope, lo, tails, release, shape, point_address, q, env,
                rng):
    """The rejection loop of :func:`_draw_cell` from a first uniform ``u`` (scaled to the
    total mass) that fell in the tails' envelopes."""
    W = cdf.shape[1]
    z_in = cdf[row, W - 1]
    e_left = envelope[0, row]
    total = z_in + e_left + envelope[1, row]
    for _ in range(CELL_TRIES):
        if u < z_in:
            return lo + _search(cdf, row, u)
        if u < z_in + e_left:
            t = _geometric(envelope[2, row], rng)
            v = lo - 1 - t
            log_env = tails[1, i] - t * tails[2, i]
        else:
            t = _geometric(envelope[3, row], rng)
            v = lo + W + t
            log_env = tails[4, i] - t * tails[5, i]
        log_target = _prior_at(point_address, q, env, i, v) + noise_log(
            release - v, shape[0], shape[1], int(shape[2]))
        if math.log(uniform_open(rng)) <= log_target - log_env:
            return v
        u = uniform(rng) * total
    return _FAILED


@kernel(nogil=True)
def draw_independent(prior_address, hoisted, point_address, q, counts, env, offset, grid,
                     release_table, lw, w, cdf, envelope, release, tails, shape, log_eta,
                     hold_ratio, rng):
    """Exact draws of every cell of one latent given theta, written to
    counts[offset:offset + d] (``env``: the model's environment, whose counts are
    ``counts``). ``tails`` (6, d) as in :func:`_envelope` (all zero: no exact
    tails, the neglected mass is bounded with ``log_eta`` instead). ``grid`` (d, W) holds
    each cell's window. Scratch: lw (d, W), w and cdf (W,), envelope (4,). Returns (the neglected-mass bound
    sum_i log1p(eta_i / L_i) of the cells without exact tails, 0 when all have them, or -1 if
    such a window holds no mass; the number of cells held or given up)."""
    log_weight_tables(prior_address, hoisted, q, env, grid, release_table, lw)
    d, W = lw.shape
    bound = 0.0
    kept = 0
    bits = np.empty(W, np.int64)
    ones = np.ones(W)
    cdf_row = cdf.reshape(1, W)  # the cell draw reads row 0 of these
    envelope_row = envelope.reshape(4, 1)
    for i in range(d):
        m, _, _, _ = weights_moments(lw[i], w, bits)
        _cumulative(w, ones, cdf)
        if tails[0, i] > 0.0 or tails[3, i] > 0.0:
            _envelope(i, 0.0, m, W, tails, envelope)
            if _held(envelope, cdf[W - 1], hold_ratio):
                kept += 1
                continue
        else:
            envelope[:] = 0.0
            if not cdf[W - 1] > 0.0:
                return -1.0, kept
            if log_eta[i] > -math.inf:
                bound += math.log1p(math.exp(min(log_eta[i] - m - math.log(cdf[W - 1]), 700.0)))
        v = _draw_cell(i, 0, cdf_row, envelope_row, grid[i, 0], tails, release[i], shape,
                       point_address, q, env, rng)
        if v == _FAILED:
            kept += 1
            continue
        counts[offset + i] = v
    return bound, kept


@kernel(nogil=True)
def _draw_subset(cells, target, lw, w, cdf, envelope, scale, mean, var, tilt, grid, tails,
                 release, shape, point_address, q, counts, env, offset, hold_ratio, rng, stats,
                 proposal):
    """An exact draw of the counts of ``cells`` given theta and their sum ``target`` (the
    rejection scheme of the module docstring), written to ``counts``; their untilted weights,
    envelopes, log scales, means and variances are given (the envelopes and variances are
    overwritten where the tilt moves; the cumulative tables are written here, once the tilt
    is chosen; ``tilt`` is scratch of the window's width). Kept as they are (and counted in
    stats[3]) when the draw is hopeless or the tries run out."""
    W = lw.shape[1]
    c0, c1, power = shape[0], shape[1], int(shape[2])
    if cells.shape[0] == 1:
        counts[offset + cells[0]] = target
        return
    total_mean = 0.0
    total_var = 0.0
    lam_lo = -math.inf  # the tilt keeps the envelopes summable: -decay_L < lam < decay_R
    lam_hi = math.inf
    for i in cells:
        total_mean += grid[i, 0] + mean[i]
        total_var += var[i]
        if tails[0, i] > 0.0:
            lam_lo = max(lam_lo, -0.5 * tails[2, i])
        if tails[3, i] > 0.0:
            lam_hi = min(lam_hi, 0.5 * tails[5, i])
    # Newton on the tilt, from 0: tilted weights are w_j e^(lam j)
    lam = 0.0
    diff = target - total_mean
    for _ in range(_NEWTON_STEPS):
        if abs(diff) <= 0.5 * math.sqrt(total_var) + 0.5 or not total_var > 0.0:
            break
        new = min(max(lam + diff / total_var, lam_lo), lam_hi)
        if new == lam:
            break
        lam = new
        stats[1] += 1.0
        _tilt(lam, tilt)
        total_mean = 0.0
        total_var = 0.0
        for i in cells:
            _, m_i, var[i] = _moments(w[i], tilt)
            total_mean += grid[i, 0] + m_i
            total_var += var[i]
        diff = target - total_mean
    if abs(diff) > GROUP_REACH * math.sqrt(total_var) + 0.5:
        stats[3] += 1.0
        return
    if lam == 0.0:
        _tilt(0.0, tilt)
    for i in cells:
        _cumulative(w[i], tilt, cdf[i])
    hopeless = False
    if lam != 0.0:  # (untilted: the group's first pass computed them)
        for i in cells:
            _envelope(i, lam, scale[i], W, tails, envelope[:, i])
            hopeless = hopeless or _held(envelope[:, i], cdf[i, W - 1], hold_ratio)
    if hopeless:
        stats[3] += 1.0
        return
    # the cell kept back (largest tilted variance) and a bound M on its tilted weights over
    # all integers: the table's maximum and the envelopes at the window's edges
    last = cells[0]
    for i in cells:
        if var[i] > var[last]:
            last = i
    log_m = -math.inf
    for j in range(W):
        log_m = max(log_m, lw[last, j] + lam * j)
    if tails[0, last] > 0.0:
        log_m = max(log_m, tails[1, last] - lam)
    if tails[3, last] > 0.0:
        log_m = max(log_m, tails[4, last] + lam * W)
    lo_last = grid[last, 0]
    for _ in range(GROUP_TRIES):
        stats[0] += 1.0
        rest = 0
        failed = False
        for i in cells:
            if i == last:
                continue
            v = _draw_cell(i, i, cdf, envelope, grid[i, 0], tails, release[i], shape,
                           point_address, q, env, rng)
            if v == _FAILED:
                failed = True
                break
            proposal[i] = v
            rest += v
        if failed:
            continue
        v = target - rest
        j = v - lo_last
        if 0 <= j < W:
            log_q = lw[last, j] + lam * j  # -inf outside the prior's support: rejected
        elif (j < 0 and tails[0, last] > 0.0) or (j >= W and tails[3, last] > 0.0):
            log_q = _prior_at(point_address, q, env, last, v) + noise_log(
                release[last] - v, c0, c1, power) + lam * j
        else:
            continue
        if math.log(uniform_open(rng)) <= log_q - log_m:
            proposal[last] = v
            for i in cells:
                counts[offset + i] = proposal[i]
            return
    stats[3] += 1.0


@kernel(nogil=True)
def draw_given_totals(prior_address, hoisted, point_address, q, counts, env, offset, grid,
                      release_table, lw, w, cdf, envelope, release, tails, shape, group_ptr,
                      group_cells, targets, hold_ratio, rng, stats):
    """Exact draws of one latent's cells given theta and every group's total (module
    docstring), written to counts[offset:offset + d], which must satisfy the totals on entry
    (they do on exit). Groups in CSR form (group_ptr, group_cells); ``grid`` (d, W) holds each
    cell's window. Scratch: lw, w and cdf (d, W), envelope (4, d). ``stats`` receives (tries, Newton steps,
    cells held, blocks kept) summed over groups."""
    log_weight_tables(prior_address, hoisted, q, env, grid, release_table, lw)
    d, W = lw.shape
    scale = np.empty(d)
    mean = np.empty(d)
    var = np.empty(d)
    proposal = np.empty(d, np.int64)
    free = np.empty(d, np.int64)
    bits = np.empty(W, np.int64)
    tilt = np.empty(W)
    stats[:] = 0.0
    for g in range(group_ptr.shape[0] - 1):
        # the untilted laws decide which cells are held (parameters and windows only)
        target = targets[g]
        n_free = 0
        for k in range(group_ptr[g], group_ptr[g + 1]):
            i = group_cells[k]
            scale[i], z_in, mean[i], var[i] = weights_moments(lw[i], w[i], bits)
            _envelope(i, 0.0, scale[i], W, tails, envelope[:, i])
            if _held(envelope[:, i], z_in, hold_ratio):
                target -= counts[offset + i]
                stats[2] += 1.0
            else:
                free[n_free] = i
                n_free += 1
        if n_free == 0:
            continue
        if n_free <= BLOCK_CELLS:
            _draw_subset(free[:n_free], target, lw, w, cdf, envelope, scale, mean, var, tilt, grid,
                         tails, release, shape, point_address, q, counts, env, offset, hold_ratio, rng,
                         stats, proposal)
            continue
        # random blocks: shuffle the free cells (Fisher-Yates), cut into near-equal blocks
        for k in range(n_free - 1, 0, -1):
            j = below(rng, k + 1)
            free[k], free[j] = free[j], free[k]
        n_blocks = (n_free + BLOCK_CELLS - 1) // BLOCK_CELLS
        for b in range(n_blocks):
            cells = free[b * n_free // n_blocks:(b + 1) * n_free // n_blocks]
            block_sum = 0
            for i in cells:
                block_sum += counts[offset + i]
            _draw_subset(cells, block_sum, lw, w, cdf, envelope, scale, mean, var, tilt, grid, tails,
                         release, shape, point_address, q, counts, env, offset, hold_ratio, rng,
                         stats, proposal)
