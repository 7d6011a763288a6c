r"""The No-U-Turn Sampler compiled with numba, for the continuous parameters of a Gibbs sweep.

dpinfer's engine alternates exact draws of the latent counts with a NUTS transition of the
continuous parameters given the counts. No library offers a NUTS *transition* callable from
compiled code (nutpie and PyMC run whole chains, so a Gibbs step cannot sit between two of
their transitions), so the transition is here: one function, compiled once (numba's cache),
that calls the model's log density through a function pointer (a numba ``cfunc`` made per
model by :mod:`dpinfer.inference.engines.compiled.model`).

Algorithm (multinomial NUTS with diagonal metric):

* M. D. Hoffman, A. Gelman, "The No-U-Turn Sampler", JMLR 15 (2014): trajectories doubled in
  a random direction until a U-turn; dual averaging of the step size (their §3.2, with
  delta = 0.8, gamma = 0.05, t0 = 10, kappa = 0.75) and the initial step size heuristic
  (their Algorithm 4).
* M. Betancourt, "A Conceptual Introduction to Hamiltonian Monte Carlo", arXiv:1701.02434
  (2017), Appendix A: the point is drawn from the whole trajectory with probability
  proportional to exp(-H) (multinomial sampling), uniformly within each new subtree and with
  "biased progressive sampling" between the old trajectory and the new subtree (the new
  subtree's proposal replaces the current one with probability min(1, w_new / w_old)); the
  generalized U-turn criterion with rho = sum of momenta: a trajectory from p_- to p_+ has
  turned when (M^-1 p_-) . rho <= 0 or (M^-1 p_+) . rho <= 0.
* The criterion is also checked across every merge of two adjacent subtrees L, R (rho_L plus
  the first momentum of R, and rho_R plus the last momentum of L), which closes the gap that
  made the plain criterion miss U-turns between subtrees (Stan 2.23 release notes; the same
  checks run in PyMC and nutpie).
* A leapfrog step whose energy error H - H0 exceeds ``max_energy_error`` (1000, as PyMC) or is
  not finite is a divergence: the subtree is discarded and the trajectory stops.
* Diagonal metric adapted in doubling windows with Stan's regularised variance
  n/(n+5) var + 1e-3 * 5/(n+5) (Stan's reference manual, "HMC algorithm parameters"), with a
  shorter initial buffer (:func:`metric_windows`).

The transition leaves the target invariant for any step size and metric; adaptation only
happens during tuning, as usual.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel
from dpinfer._random_stream import standard_normal, uniform
from dpinfer.inference.engines.compiled.native import logp_grad_at, pointer

MAX_ENERGY_ERROR = 1000.0


@kernel(nogil=True)
def log_density(f, q, grad, data):
    """f(q) with its gradient written into ``grad``; -inf where it is not finite."""
    lp = f(pointer(q.ctypes.data), pointer(grad.ctypes.data), pointer(data.ctypes.data))
    if not math.isfinite(lp):
        return -math.inf
    for i in range(grad.shape[0]):
        if not math.isfinite(grad[i]):
            return -math.inf
    return lp


@kernel(nogil=True)
def log_density_at(logp_grad, q, grad, data):
    """:func:`log_density` of the function at address ``logp_grad``."""
    return log_density(logp_grad_at(logp_grad), q, grad, data)


@kernel(nogil=True)
def _leapfrog(f, data, q, p, g, eps, inv_mass):
    """One leapfrog step of size ``eps`` (negative: backwards in time), in place; returns
    the log density at the new position."""
    n = q.shape[0]
    for i in range(n):
        p[i] += 0.5 * eps * g[i]
        q[i] += eps * inv_mass[i] * p[i]
    lp = log_density(f, q, g, data)
    if lp == -math.inf:
        return lp
    for i in range(n):
        p[i] += 0.5 * eps * g[i]
    return lp


@kernel(nogil=True, fastmath={"reassoc"})  # sums vectorised: rounding only
def _kinetic(p, inv_mass):
    k = 0.0
    for i in range(p.shape[0]):
        k += inv_mass[i] * p[i] * p[i]
    return 0.5 * k


@kernel(nogil=True)
def _momentum(inv_mass, rng):
    """A fresh momentum p ~ N(0, M), M = diag(1 / inv_mass); 0 where the inverse mass is 0 (a
    coordinate held: its position never moves, q_i += eps inv_mass_i p_i, and it adds nothing
    to the kinetic energy or the U-turn criterion, so the transition is NUTS on the others)."""
    n = inv_mass.shape[0]
    p = np.empty(n)
    for i in range(n):
        p[i] = standard_normal(rng) / math.sqrt(inv_mass[i]) if inv_mass[i] > 0.0 else 0.0
    return p


@kernel(nogil=True, fastmath={"reassoc"})  # sums vectorised: rounding only
def _turned(ps_minus, ps_plus, rho):
    """The generalized no-U-turn criterion fails (the trajectory has turned)."""
    a = 0.0
    b = 0.0
    for i in range(rho.shape[0]):
        a += ps_minus[i] * rho[i]
        b += ps_plus[i] * rho[i]
    return not (a > 0.0 and b > 0.0)


@kernel(nogil=True, fastmath={"reassoc"})  # sums vectorised: rounding only
def _turned_extended(ps_minus, ps_plus, rho, p_extra):
    """_turned with rho + p_extra (the criterion across a merge of two subtrees)."""
    a = 0.0
    b = 0.0
    for i in range(rho.shape[0]):
        r = rho[i] + p_extra[i]
        a += ps_minus[i] * r
        b += ps_plus[i] * r
    return not (a > 0.0 and b > 0.0)


@kernel(nogil=True)
def _logaddexp(a, b):
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


@kernel(nogil=True)
def _build_subtree(f, data, depth, eps, inv_mass, H0, rng, q, p, g,
                   log_w, rho, pbeg, psbeg, pend, psend, prop_q, prop_g, prop_p, prop_lp, level):
    """2**depth leapfrog steps from (q, p, g) (updated in place to the far end), building the
    balanced binary tree of Betancourt (2017) leaf by leaf: after each leaf the completed
    sibling pairs on the stack are merged (uniform progressive sampling between siblings,
    U-turn checks on the merged node and across the merge).

    Stack slot arrays (first axis: slot) receive the nodes; slot 0 holds the subtree when it
    is valid. Returns (valid, diverging, n_steps, sum of acceptance probabilities)."""
    n_leaves = 1 << depth
    top = -1
    sum_accept = 0.0
    steps = 0
    n = q.shape[0]
    for _ in range(n_leaves):
        lp = _leapfrog(f, data, q, p, g, eps, inv_mass)
        steps += 1
        H = -lp + _kinetic(p, inv_mass)
        if not math.isfinite(H):
            H = math.inf
        err = H - H0
        if not err <= MAX_ENERGY_ERROR:
            return False, True, steps, sum_accept
        sum_accept += min(1.0, math.exp(-err))
        top += 1
        level[top] = 0
        log_w[top] = -err
        prop_lp[top] = lp
        for i in range(n):
            ps = inv_mass[i] * p[i]
            rho[top, i] = p[i]
            pbeg[top, i] = p[i]
            pend[top, i] = p[i]
            psbeg[top, i] = ps
            psend[top, i] = ps
            prop_q[top, i] = q[i]
            prop_g[top, i] = g[i]
            prop_p[top, i] = p[i]
        while top >= 1 and level[top] == level[top - 1]:
            left = top - 1
            right = top
            total = _logaddexp(log_w[left], log_w[right])
            if uniform(rng) < math.exp(log_w[right] - total):
                prop_lp[left] = prop_lp[right]
                for i in range(n):
                    prop_q[left, i] = prop_q[right, i]
                    prop_g[left, i] = prop_g[right, i]
                    prop_p[left, i] = prop_p[right, i]
            turned = _turned_extended(psbeg[left], psbeg[right], rho[left], pbeg[right])
            turned = turned or _turned_extended(psend[left], psend[right], rho[right], pend[left])
            for i in range(n):
                rho[left, i] += rho[right, i]
                pend[left, i] = pend[right, i]
                psend[left, i] = psend[right, i]
            turned = turned or _turned(psbeg[left], psend[left], rho[left])
            log_w[left] = total
            level[left] += 1
            top -= 1
            if turned:
                return False, False, steps, sum_accept
    return True, False, steps, sum_accept


@kernel(nogil=True)
def nuts_transition(logp_grad, data, q, g, lp, eps, inv_mass, max_depth, rng):
    """One NUTS transition from (q, g = grad log p(q), lp = log p(q)) of the log density at
    address ``logp_grad`` (signature :data:`dpinfer.inference.engines.compiled.native.LOGP_GRAD`) given the
    latent ``data``; q and g are replaced by the new point in place; ``rng`` is the chain's
    random state. Returns (lp, tree depth, leapfrog steps, mean acceptance probability over
    the trajectory, diverging, energy H of the new point, its energy error)."""
    f = logp_grad_at(logp_grad)
    n = q.shape[0]
    p0 = _momentum(inv_mass, rng)
    H0 = -lp + _kinetic(p0, inv_mass)
    slots = max_depth + 2
    log_w = np.empty(slots)
    level = np.empty(slots, np.int64)
    prop_lp = np.empty(slots)
    rho = np.empty((slots, n))
    pbeg = np.empty((slots, n))
    psbeg = np.empty((slots, n))
    pend = np.empty((slots, n))
    psend = np.empty((slots, n))
    prop_q = np.empty((slots, n))
    prop_g = np.empty((slots, n))
    prop_p = np.empty((slots, n))
    # the two ends of the trajectory (spatially: minus = earliest time, plus = latest)
    q_minus = q.copy()
    p_minus = p0.copy()
    g_minus = g.copy()
    q_plus = q.copy()
    p_plus = p0.copy()
    g_plus = g.copy()
    ps_minus = inv_mass * p0
    ps_plus = ps_minus.copy()
    rho_tree = p0.copy()
    sample_p = p0.copy()
    sample_lp = lp
    log_w_tree = 0.0
    depth = 0
    steps = 0
    sum_accept = 0.0
    diverging = False
    p_edge = np.empty(n)  # momentum at the end being extended, before the subtree moves it
    while depth < max_depth:
        forward = uniform(rng) < 0.5
        if forward:
            p_edge[:] = p_plus
            valid, div, n_steps, acc = _build_subtree(
                f, data, depth, eps, inv_mass, H0, rng, q_plus, p_plus, g_plus,
                log_w, rho, pbeg, psbeg, pend, psend, prop_q, prop_g, prop_p, prop_lp, level)
        else:
            p_edge[:] = p_minus
            valid, div, n_steps, acc = _build_subtree(
                f, data, depth, -eps, inv_mass, H0, rng, q_minus, p_minus, g_minus,
                log_w, rho, pbeg, psbeg, pend, psend, prop_q, prop_g, prop_p, prop_lp, level)
        steps += n_steps
        sum_accept += acc
        if div:
            diverging = True
        if not valid:
            break
        depth += 1
        # biased progressive sampling between the old trajectory and the new subtree
        if log_w[0] >= log_w_tree or uniform(rng) < math.exp(log_w[0] - log_w_tree):
            sample_lp = prop_lp[0]
            for i in range(n):
                q[i] = prop_q[0, i]
                g[i] = prop_g[0, i]
                sample_p[i] = prop_p[0, i]
        log_w_tree = _logaddexp(log_w_tree, log_w[0])
        # U-turn checks across the merge, in spatial order (left part, right part); the
        # subtree was built from the edge outwards, so its first leaf touches the old edge
        if forward:  # left = old trajectory, right = subtree
            turned = _turned_extended(ps_minus, psbeg[0], rho_tree, pbeg[0])
            turned = turned or _turned_extended(ps_plus, psend[0], rho[0], p_edge)
            for i in range(n):
                ps_plus[i] = psend[0, i]
        else:  # left = subtree (its last leaf is the new left end), right = old trajectory
            turned = _turned_extended(psend[0], ps_minus, rho[0], p_edge)
            turned = turned or _turned_extended(psbeg[0], ps_plus, rho_tree, pbeg[0])
            for i in range(n):
                ps_minus[i] = psend[0, i]
        for i in range(n):
            rho_tree[i] += rho[0, i]
        if turned or _turned(ps_minus, ps_plus, rho_tree):
            break
    H = -sample_lp + _kinetic(sample_p, inv_mass)
    mean_accept = sum_accept / steps if steps > 0 else 0.0
    return sample_lp, depth, steps, mean_accept, diverging, H, H - H0


@kernel(nogil=True)
def reasonable_step_size(logp_grad, data, q, g, lp, eps, inv_mass, rng):
    """Hoffman & Gelman (2014) Algorithm 4: double or halve ``eps`` until the acceptance
    probability of one leapfrog step from (q, fresh momentum) crosses 1/2."""
    f = logp_grad_at(logp_grad)
    p0 = _momentum(inv_mass, rng)
    H0 = -lp + _kinetic(p0, inv_mass)

    def log_ratio(e):
        q1 = q.copy()
        p1 = p0.copy()
        g1 = g.copy()
        lp1 = _leapfrog(f, data, q1, p1, g1, e, inv_mass)
        d = H0 - (-lp1 + _kinetic(p1, inv_mass))
        return d if math.isfinite(d) else -math.inf

    ratio = log_ratio(eps)
    direction = 1.0 if ratio > math.log(0.5) else -1.0
    for _ in range(100):
        if direction * ratio <= -direction * math.log(2.0):
            break
        eps = eps * 2.0 ** direction
        ratio = log_ratio(eps)
    return eps


def metric_windows(n_tune: int) -> list[int]:
    """Iterations (0-based, during tuning) after which the diagonal metric is re-estimated.

    Stan's schedule with a shorter initial buffer: 25 iterations (Stan: 75), then doubling
    windows from 25, a terminal buffer of max(50, n_tune / 10) (Stan: 50); the last window
    stretches to the terminal buffer. With fewer than 100 tuning iterations: 15 % initial
    buffer, 10 % terminal, one window in between; fewer than 20: the step size alone is
    adapted. Measured on the demo's county model (benchmarks/bench_county.py, 5 seeds): the
    earlier first estimate cut the leapfrog steps per draw from 20 to 15 and raised ESS/s by a
    fifth. The longer terminal buffer gives the step size's dual averaging more iterations
    after the last metric update: on B3 (benchmarks/bench_dapper.py's record-level regression,
    24 seeds, 1,000 tuning iterations) the step size rose from 0.135 to 0.142 and the min ESS
    of beta per leapfrog step by a fifth; on the county model (12 seeds) 4 % fewer steps a
    draw, the ESS per step unchanged (benchmarks/README.md)."""
    if n_tune < 20:
        return []
    if n_tune >= 100:
        init, term, base = 25, max(50, n_tune // 10), 25
    else:
        init, term = int(0.15 * n_tune), int(0.1 * n_tune)
        base = n_tune - init - term
    ends = []
    start, size = init, base
    last = n_tune - term
    while start < last:
        end = start + size
        if end + 2 * size > last:  # the next window would not fit: stretch this one
            end = last
        ends.append(end - 1)
        start, size = end, 2 * size
    return ends
