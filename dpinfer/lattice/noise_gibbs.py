r"""Exact Gibbs sampling of lattice noise along Markov moves, and its L-lag coupling.

The target is a law on the kernel lattice ``Lambda = {z in Z^d : A z = 0}`` of the invariants,

    q(z) ∝ exp(-scale ||z||_1)       (generalized Laplace, l1; seed 001 Eq. 5),
    q(z) ∝ exp(-scale ||z||_2)       (generalized Laplace, l2),
    q(z) ∝ exp(-scale ||z||_2^2)     (lattice Gaussian, scale = 1 / (2 sigma^2); seed 001 Eq. 8),

given as a :class:`dpinfer.lattice.targets.LatticeTarget`. A sweep updates z along moves m of a
Markov basis of the invariants (every move keeps A z = 0, and the moves connect every fibre;
:meth:`dpinfer.Invariants.markov_basis`): z <- z + t m with t drawn from the exact conditional
q(z + t m) / sum_t' q(z + t' m) (a Gibbs update, so q is invariant; inference notes §3). Along
a line, t -> log q(z + t m) is concave (each norm is convex), and
||z + t m||_2^2 = ||z||^2 + 2 t z.m + t^2 ||m||^2 in integers, so each update costs one pass
over the line.

**l1: exact, in closed form.** Along a line, -scale sum_c |z_c + t m_c| is linear in t outside
the kinks t = -z_c / m_c, so the line splits into the integers between the outermost kinks
(enumerated) and two geometric tails (summed and sampled by inversion in closed form).

**l2 and Gaussian: truncation, with a bound.** The line is unbounded; its weights are enumerated outward from
t = 0 until they fall ``CUT`` = 50 nats below the largest seen and are decreasing. By concavity
every weight beyond the last one enumerated, w(t_r), obeys w(t_r + j) <= w(t_r) - j delta,
delta = (top - w(t_r)) / (t_r - t_top) > 0, so the neglected mass on that side is at most
e^{w(t_r)} / (e^delta - 1), about e^-50 of the line. The chain with truncated updates differs
from the exact one, in total variation, by at most the sum of these relative bounds over its
updates (reported; ~1e-19 for thousands of updates).

**Start and sweeps.** Chains start at z = 0, which does not depend on any data: the noise law
is the same for every input, so a release x + z is within the chain's TV distance tau of the
exact law for every x, i.e. (epsilon, (1 + e^epsilon) tau)-DP when the exact law is
epsilon-DP. A sweep makes min(n_moves, 20 d) updates: all moves in random order, or that many
moves drawn uniformly when the basis is larger.

**Coupling** (:meth:`NoiseGibbs.meeting_times`). Two chains X (leading by ``lag`` sweeps) and Y
make the same updates with common random numbers: the same move order and one uniform per
update, used by both for inversion of their line conditionals, enumerated in increasing order
along the line. Each chain's own kernel is unchanged, and chains that are equal stay equal, so
the meeting time gives the bound of Biswas, Jacob & Vanetti (2019), Theorem 2.5 (as for seed
001's Algorithm 3, :class:`dpinfer.lattice.coupling.MeetingTimes`), in sweeps. For the l1 norm and
the lattice Gaussian (products over cells), two chains whose move cells differ by a multiple of
m see the same weights on the same points, so that update makes them agree on those cells.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel
from dpinfer._validation import check_count, check_rng
from dpinfer.lattice.coupling import MeetingTimes
from dpinfer.lattice.invariants import MoveSet
from dpinfer.lattice.targets import LatticeTarget

CUT = 50.0  # log-weight drop at which a line's enumeration stops
MOVES_PER_CELL = 20  # updates per sweep: all moves, at most this many per cell


@kernel()
def _line_weight(z, cells, steps, m, t, kind, scale, zz_state, zm, mm):
    """log q(z + t m) up to terms that do not change along the line."""
    if kind == 1:
        return -scale * math.sqrt(float(zz_state + 2 * t * zm + t * t * mm))
    total = 0.0
    for s in range(cells.shape[1]):
        st = steps[m, s]
        if st != 0:
            v = float(z[cells[m, s]] + t * st)
            total += abs(v) if kind == 0 else v * v
    return -scale * total


@kernel()
def _walk_out(z, cells, steps, m, kind, scale, zz_state, zm, mm, w0, direction, buf):
    """Weights at t = direction, 2 direction, ... into ``buf`` (grown as needed) until they are
    CUT below the largest seen on this side (including t = 0) and decreasing. Returns (buf, n,
    log bound on the neglected mass beyond)."""
    top, t_top = w0, 0
    prev = w0
    n = 0
    while True:
        t = direction * (n + 1)
        w = _line_weight(z, cells, steps, m, t, kind, scale, zz_state, zm, mm)
        if n == buf.shape[0]:
            bigger = np.empty(2 * buf.shape[0], dtype=np.float64)
            bigger[:n] = buf[:n]
            buf = bigger
        buf[n] = w
        n += 1
        if w > top:
            top, t_top = w, n
        if w < top - CUT and w <= prev:
            delta = (top - w) / (n - t_top)
            return buf, n, w - math.log(math.expm1(delta))
        prev = w


@kernel()
def _l1_line_draw(z, cells, steps, m, scale, u, buf):
    """t ~ exp(-scale sum_c |z_c + t m_c|) over all integers, by inversion of u in increasing
    t: left tail t <= a - 1, enumerated a..b, right tail t >= b + 1, where a = floor(min kink)
    + 1 and b = floor(max kink) (module docstring). Returns (t, buf)."""
    kmin = np.inf
    kmax = -np.inf
    slope = 0.0  # |d w / d t| in both tails: scale sum_c |m_c|
    for s in range(cells.shape[1]):
        st = steps[m, s]
        if st != 0:
            k = -z[cells[m, s]] / st
            kmin = min(kmin, k)
            kmax = max(kmax, k)
            slope += scale * abs(st)
    a = int(math.floor(kmin)) + 1
    b = int(math.floor(kmax))
    n = max(b - a + 1, 0)
    if n > buf.shape[0]:
        buf = np.empty(2 * n, dtype=np.float64)
    for i in range(n):
        buf[i] = _line_weight(z, cells, steps, m, a + i, 0, scale, 0, 0, 0)
    w_left = _line_weight(z, cells, steps, m, a - 1, 0, scale, 0, 0, 0)
    w_right = _line_weight(z, cells, steps, m, b + 1, 0, scale, 0, 0, 0)
    top = max(w_left, w_right)
    for i in range(n):
        top = max(top, buf[i])
    tail = -math.log(-math.expm1(-slope))  # log of 1 / (1 - e^-slope)
    mass_left = math.exp(w_left - top + tail)
    mass_right = math.exp(w_right - top + tail)
    total = mass_left + mass_right
    for i in range(n):
        total += math.exp(buf[i] - top)
    target = u * total
    if target < mass_left:  # P(t <= a - 1 - i | left tail) = e^(-slope i)
        v = max(target / mass_left, 1e-300)
        return a - 1 - int(math.floor(math.log(v) / -slope)), buf
    acc = mass_left
    for i in range(n):
        acc += math.exp(buf[i] - top)
        if acc >= target:
            return a + i, buf
    # right tail: P(t <= b + 1 + i | tail) = 1 - e^(-slope (i + 1))
    v = min((target - acc) / mass_right, 1.0 - 1e-16)
    i = max(0, int(math.ceil(math.log1p(-v) / -slope)) - 1)
    return b + 1 + i, buf


@kernel()
def _enumerated_line_draw(z, cells, steps, m, kind, scale, zz_state, zm, mm, u, right, left):
    """t by inversion of u over the weights enumerated outward from t = 0 (l2 and Gaussian;
    module docstring). Returns (t, relative neglected mass, right, left)."""
    w0 = _line_weight(z, cells, steps, m, 0, kind, scale, zz_state, zm, mm)
    right, n_r, bound_r = _walk_out(z, cells, steps, m, kind, scale, zz_state, zm, mm, w0, 1, right)
    left, n_l, bound_l = _walk_out(z, cells, steps, m, kind, scale, zz_state, zm, mm, w0, -1, left)
    top = w0
    for i in range(n_r):
        top = max(top, right[i])
    for i in range(n_l):
        top = max(top, left[i])
    total = math.exp(w0 - top)
    for i in range(n_r):
        total += math.exp(right[i] - top)
    for i in range(n_l):
        total += math.exp(left[i] - top)
    neglected = (math.exp(bound_r - top) + math.exp(bound_l - top)) / total
    target = u * total
    acc = 0.0
    for i in range(n_l - 1, -1, -1):  # t = -n_l .. -1
        acc += math.exp(left[i] - top)
        if acc >= target:
            return -(i + 1), neglected, right, left
    acc += math.exp(w0 - top)
    if acc >= target:
        return 0, neglected, right, left
    for i in range(n_r):
        acc += math.exp(right[i] - top)
        if acc >= target:
            return i + 1, neglected, right, left
    return n_r, neglected, right, left  # u * total at the top end (round-off)


@kernel()
def _update(z, cells, steps, m, kind, scale, zz_state, u, right, left):
    """One exact line update of z along move m with uniform u (inversion in increasing t).
    Returns (new ||z||^2, relative neglected mass, right, left)."""
    zm = 0
    mm = 0
    for s in range(cells.shape[1]):
        st = steps[m, s]
        if st != 0:
            zm += st * z[cells[m, s]]
            mm += st * st
    if kind == 0:
        t, right = _l1_line_draw(z, cells, steps, m, scale, u, right)
        neglected = 0.0
    else:
        t, neglected, right, left = _enumerated_line_draw(z, cells, steps, m, kind, scale, zz_state,
                                                          zm, mm, u, right, left)
    if t != 0:
        for s in range(cells.shape[1]):
            st = steps[m, s]
            if st != 0:
                z[cells[m, s]] += t * st
        zz_state += 2 * t * zm + t * t * mm
    return zz_state, neglected, right, left


@kernel()
def _squared_norm(z):
    total = 0
    for i in range(z.shape[0]):
        total += z[i] * z[i]
    return total


@kernel()
def _sweep_order(n_moves, per_sweep):
    if n_moves <= per_sweep:
        return np.random.permutation(n_moves)
    return np.random.randint(0, n_moves, per_sweep)


@kernel()
def _sweep(z, zz_state, cells, steps, kind, scale, per_sweep, right, left):
    """One sweep of one chain (z in place). Returns (||z||^2, sum of relative neglected
    masses, right, left)."""
    order = _sweep_order(cells.shape[0], per_sweep)
    lost = 0.0
    for k in range(order.shape[0]):
        zz_state, rel, right, left = _update(z, cells, steps, order[k], kind, scale, zz_state,
                                             np.random.random(), right, left)
        lost += rel
    return zz_state, lost, right, left


@kernel()
def _run_kernel(z, cells, steps, kind, scale, n_sweeps, per_sweep, seed):
    """``n_sweeps`` sweeps of every chain (rows of z, in place), each with its own move order
    and uniforms. Returns the largest per-chain sum of relative neglected masses."""
    np.random.seed(seed)
    right = np.empty(256, dtype=np.float64)
    left = np.empty(256, dtype=np.float64)
    worst = 0.0
    for c in range(z.shape[0]):
        zz_state = _squared_norm(z[c])
        lost = 0.0
        for _ in range(n_sweeps):
            zz_state, rel, right, left = _sweep(z[c], zz_state, cells, steps, kind, scale,
                                                per_sweep, right, left)
            lost += rel
        worst = max(worst, lost)
    return worst


@kernel()
def _meeting_kernel(n_runs, d, cells, steps, kind, scale, lag, max_sweeps, per_sweep, seed):
    """Meeting times (in sweeps of the leading chain; -1: not met by ``max_sweeps``) of
    ``n_runs`` L-lag coupled pairs from z = 0 (module docstring)."""
    np.random.seed(seed)
    right = np.empty(256, dtype=np.float64)
    left = np.empty(256, dtype=np.float64)
    n_moves = cells.shape[0]
    tau = np.full(n_runs, -1, dtype=np.int64)
    for r in range(n_runs):
        x = np.zeros(d, dtype=np.int64)
        y = np.zeros(d, dtype=np.int64)
        xx = 0
        yy = 0
        for _ in range(lag):
            xx, _, right, left = _sweep(x, xx, cells, steps, kind, scale, per_sweep, right, left)
        for sweep in range(lag + 1, max_sweeps + 1):
            order = _sweep_order(n_moves, per_sweep)
            for k in range(order.shape[0]):
                u = np.random.random()
                xx, _, right, left = _update(x, cells, steps, order[k], kind, scale, xx, u, right, left)
                yy, _, right, left = _update(y, cells, steps, order[k], kind, scale, yy, u, right, left)
            same = True
            for i in range(d):
                if x[i] != y[i]:
                    same = False
                    break
            if same:
                tau[r] = sweep
                break
    return tau


class NoiseGibbs:
    """Exact Gibbs sweeps along the moves of ``moves`` (a Markov basis of the invariants) for a
    :class:`~dpinfer.lattice.targets.LatticeTarget` (module docstring)."""

    def __init__(self, moves: MoveSet, target: LatticeTarget):
        if not isinstance(target, LatticeTarget):
            raise TypeError(f"target must be a dpinfer.lattice.targets.LatticeTarget, got {type(target).__name__}")
        if not isinstance(moves, MoveSet) or len(moves) == 0:
            raise ValueError("moves must be a non-empty dpinfer MoveSet (a Markov basis of the invariants)")
        self.moves = moves
        self.target = target
        # writable copies of the read-only moves: the kernels' one specialisation, whoever calls them
        self.cells = np.array(moves.cells, dtype=np.int64)
        self.steps = np.array(moves.steps, dtype=np.int64)
        self.n_cells = moves.n_cells
        self.updates_per_sweep = min(len(moves), MOVES_PER_CELL * self.n_cells)

    def run(self, n_chains: int, n_sweeps: int, rng) -> tuple[np.ndarray, float]:
        """``n_chains`` independent chains from z = 0, ``n_sweeps`` sweeps each. Returns
        (z (n_chains, d), the largest per-chain bound on the TV distance added by truncating
        the lines)."""
        rng = check_rng(rng)
        n_chains, n_sweeps = check_count("n_chains", n_chains, 1), check_count("n_sweeps", n_sweeps, 0)
        z = np.zeros((n_chains, self.n_cells), dtype=np.int64)
        lost = _run_kernel(z, self.cells, self.steps, self.target.kind, float(self.target.scale),
                           n_sweeps, self.updates_per_sweep, int(rng.integers(2**62)))
        return z, float(lost)

    def meeting_times(self, lag: int, n_runs: int, rng, *, max_sweeps: int = 10**5) -> MeetingTimes:
        """Meeting times, in sweeps, of ``n_runs`` independent L-lag coupled pairs (module
        docstring); their ``tv_upper_bound(l)`` bounds the TV distance after l sweeps."""
        rng = check_rng(rng)
        lag = check_count("lag", lag, 1)
        n_runs = check_count("n_runs", n_runs, 1)
        max_sweeps = check_count("max_sweeps", max_sweeps, lag + 1)
        tau = _meeting_kernel(n_runs, self.n_cells, self.cells, self.steps, self.target.kind,
                              float(self.target.scale), lag, max_sweeps, self.updates_per_sweep,
                              int(rng.integers(2**62)))
        return MeetingTimes(tau=tau, lag=lag, max_iterations=max_sweeps)
