r"""Exponential tilting of a group's cell weights: step 1 of :mod:`dpinfer.lattice.convolution`.

``g_i(k) -> g_i(k) e^{\lambda (k - c_i)} / Z_i`` with one ``\lambda`` per group, solved by
safeguarded Newton/bisection so that the tilted mean of the group total is ``t_g`` (to within
0.1 tilted sd; any ``\lambda`` is exact, it only decides where the bulk sits), ``c_i`` an
integer near the tilted mean of cell ``i`` (keeps the exponents small) and ``Z_i`` the
normaliser. Then ``V = \prod_i Z_i \cdot e^{-\lambda (t - \sum_i c_i)} \cdot \hat P(\sum_i k_i
= t)`` and ``\hat P(\sum k = t)`` -- the tilted law's value at its own mean -- is in the bulk,
``O(1/\mathrm{sd})``, however far ``t`` is in the untilted tail. The last Newton evaluation
yields the tilted pmfs.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel


@kernel(nogil=True)
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
@kernel(nogil=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract"})
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
    p = _tilt_exponents(np.ascontiguousarray(lw), lam, c, np.empty(lw.shape))
    amax = p.max(axis=-1, keepdims=True)
    p -= amax
    np.exp(p, out=p)
    Z, mean, var = _normalise_rows(p)
    return p, amax[..., 0] + np.log(Z), mean, var


@kernel(nogil=True)
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


def solve_tilt(lw, t):
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


def log_leaves(lw, lam, c):
    """Log-space version of :func:`_tilted`: (log p (B, m, W), log Zc (B, m))."""
    W = lw.shape[-1]
    a = lw + lam[:, None, None] * (np.arange(W) - c[..., None])
    amax = a.max(axis=-1, keepdims=True)
    a -= amax
    logZ = np.log(np.exp(a).sum(axis=-1, keepdims=True))
    return a - logZ, (amax + logZ)[..., 0]
