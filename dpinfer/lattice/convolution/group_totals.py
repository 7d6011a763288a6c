r"""The public functions of :mod:`dpinfer.lattice.convolution` (which states their maths,
accuracy and edge cases): :func:`log_convolution_at` and :func:`sample_given_sums`.

Inputs are checked, then a plan (cached per grouping) puts groups of similar size into
buckets that share one batched tree, padded with point-mass cells. Per bucket: targets at
either end of a group's reachable range have a single configuration and are handled exactly;
the others are tilted (:mod:`~dpinfer.lattice.convolution.tilting`) and convolved up the
linear-space tree (:mod:`~dpinfer.lattice.convolution.tree`). If the tree's bound on the
relative error of ``V`` from FFT round-off and windows exceeds ``_REL_TOL`` (1e-9) -- which
needs the tilted total to be far from unimodal at ``t``: lattice/parity gaps or strongly
multimodal cell weights, not log-concave weights such as the Poisson x double-geometric
products of the notes -- the group is recomputed with the **log-space direct** tree, or, if
that would cost more than ``_LOG_MAX_COST`` multiply-adds, a ``RuntimeWarning`` reports the
bound and the FFT result is kept. Marginals come from the downward pass
(:mod:`~dpinfer.lattice.convolution.marginals`), draws from backward sampling
(:mod:`~dpinfer.lattice.convolution.backward_sampling`; a draw that FFT round-off led into a
zero-weight branch is redrawn from the log-space tree). BLAS is held to one thread during a
call.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import ThreadpoolController

from dpinfer.lattice.convolution.backward_sampling import descend
from dpinfer.lattice.convolution.marginals import downward_lin, downward_log, leaf_marginals
from dpinfer.lattice.convolution.tilting import log_leaves, solve_tilt
from dpinfer.lattice.convolution.tree import build_lin, build_log, log_cost, subset_tree

__all__ = ["log_convolution_at", "sample_given_sums"]

# Bound on the FFT part of the relative error of V above which a group is recomputed in
# log space (the bound is ~4e-13 at 100 cells, ~6e-11 at 3000 cells, growing ~ d^1.5).
_REL_TOL = 1e-9

# Largest log-space recomputation (multiply-adds, up + down) done automatically.
_LOG_MAX_COST = 4e8

# Testing hook: force every group through the log-space direct path.
_FORCE_LOG = False

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
        lam, c, P, logZc = solve_tilt(lwi, ti)
        use_log = np.ones(inner.size, bool)
        if not _FORCE_LOG:
            shift = logZc.sum(axis=-1) + lam * (c.sum(axis=-1) - ti)
            tree = build_lin(P, kmin[inner], kmax[inner], ti, keep_fft=want_marg, all_levels=want_tree)
            use_log = ~(tree.fft_rel <= _REL_TOL)
            if use_log.any() and log_cost(m, W) * use_log.sum() > _LOG_MAX_COST:
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
                    tree = subset_tree(tree, sel)
                with np.errstate(divide="ignore"):
                    logV[inner[sel]] = shift[sel] + np.log(tree.root)
                if want_marg:
                    O = downward_lin(tree, ti[sel])
                    marg[inner[sel]] = leaf_marginals(P[sel], np.ascontiguousarray(O[:, :m]),
                                                      np.ascontiguousarray(tree.offs[0][:, :m]), tree.root)
                if want_tree:
                    trees.append((tree, inner[sel]))
        sel = np.flatnonzero(use_log)
        if sel.size:
            logp, logZc = log_leaves(lwi[sel], lam[sel], c[sel])
            shift = logZc.sum(axis=-1) + lam[sel] * (c[sel].sum(axis=-1) - ti[sel])
            tree = build_log(logp, ti[sel])
            logV[inner[sel]] = shift + tree.root
            if want_marg:
                O = downward_log(tree, ti[sel])[:, :m]
                with np.errstate(invalid="ignore"):
                    marg[inner[sel]] = np.exp(logp + O - tree.root[:, None, None])
            if want_tree:
                trees.append((tree, inner[sel]))
    zero_idx = np.flatnonzero(~np.isfinite(logV) | np.isnan(logV))
    if want_marg and zero_idx.size:
        marg[zero_idx] = np.nan
    return _BucketResult(logV, marg, trees, fixed_idx, fixed_val.astype(np.int64), zero_idx)


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

    Accuracy: see :mod:`dpinfer.lattice.convolution` (V to ~1e-14 relative in the tails as at
    the mode, ~d eps in the worst case; marginals to ~1e-15 absolute).
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
            draws[sl] = descend(tree, tree_idx[sl], tt[sl], rng)[:, :m]
        bad = np.flatnonzero((draws < 0).any(axis=1))
        if bad.size:  # FFT noise led into a zero-weight branch (probability ~1e-15): redo exactly
            logsel = idx[tree_idx[bad]]
            exact = _solve_bucket_log_tree(lw[logsel], t[logsel])
            draws[bad] = descend(exact, np.arange(bad.size), t[logsel], rng)[:, :m]
        out[:, idx] = draws.reshape(reps, nb, m)
    return out


def _solve_bucket_log_tree(lw, t):
    lam, c, _, _ = solve_tilt(lw, t)
    logp, _ = log_leaves(lw, lam, c)
    return build_log(logp, t)


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
