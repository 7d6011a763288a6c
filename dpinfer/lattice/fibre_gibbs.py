"""Exact Gibbs sampling on a boxed fibre: line updates of an integer vector along lattice moves
(numba kernel).

The target on {x integer : A x = a, lo <= x <= hi} is

    pi(x) ∝ prod_i exp(T_i(x_i)) * prod_j exp(R_j((Q x)_j)),

cell terms T_i (a table over the box, e.g. log prior + log likelihood of a release of x_i)
and row terms R_j of linear queries (Q x)_j (e.g. the likelihood of a released total). For a
move z with A z = 0 the line {x + t z} keeps the invariants; its conditional law over the
integers t that keep x inside the box is enumerated exactly and sampled by inversion
(inference notes §3). Moves must form a Markov basis of the fibre for the chain to be
irreducible (all pair moves for totals, all 2x2 moves for two-way margins; see
:class:`dpinfer.lattice.invariants.Invariants`).

Neglected-mass bound. The box cuts values a cell could take outside it. For a move line, the
mass lost is at most sum_{c in supp z} eta_c prod_{c' != c} sup_v g_{c'}(v), where eta_c bounds
the cell term g_c = exp(T_c) summed over values outside the box (prior mass <= 1 times the
likelihood's sup beyond the window) and the row terms are pmf values <= 1. Relative to the
line's mass inside the box this is the error of one update; each sweep sums log1p of it.

A factor exp(-epsilon ||s - x||_2) (the likelihood of a generalized Laplace release in the l2
norm, seed 001) does not factorise either, but along a line it is exact and cheap: with
r = s - x, ||r - t z||^2 = ||r||^2 - 2 t r.z + t^2 ||z||^2 (integers), so it enters the line
conditional directly (:class:`NormFactor`) and the update stays an exact Gibbs step. It is
<= 1 everywhere and <= exp(-epsilon (k + 1)) when any cell is more than k from s, so a
cell's tail bound eta may come from it (the bound above holds with this factor bounded by 1).

A further factor exp(W(x)) that does not factorise over cells (the x-dependent normaliser of a
release conditioned on non-negativity) is handled by :func:`corrected_gibbs_sweep`: blocks of
line updates in palindromic order (moves m_1..m_B, then m_B..m_1) form a proposal kernel that
is reversible with respect to pi, so accepting its result with probability
min(1, exp(W(x') - W(x))) leaves pi(x) exp(W(x)) invariant (Metropolis-Hastings with a
pi-reversible proposal: pi(x) K(x, x') = pi(x') K(x', x), so the Hastings ratio reduces to the
ratio of the extra factors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer._kernel import kernel


@dataclass(frozen=True)
class QueryRows:
    """Row terms R_j(q) of linear queries q = Q x, tabulated over q in [qmin_j, qmin_j + len_j)
    (the range the box allows), with the moves' effect (Q z) in CSR form."""

    matrix: np.ndarray  # (R, d) int64 query matrix
    qmin: np.ndarray  # (R,) int64
    starts: np.ndarray  # (R,) int64 start of row j's table in ``tables``
    lengths: np.ndarray  # (R,) int64
    tables: np.ndarray  # flat float64

    @classmethod
    def empty(cls, n_cells: int) -> "QueryRows":
        z = np.zeros(0, dtype=np.int64)
        return cls(np.zeros((0, n_cells), np.int64), z, z, z, np.zeros(0))

    @classmethod
    def tabulate(cls, matrix, lo, hi, log_term) -> "QueryRows":
        """Tables of ``log_term(j, q)`` (vectorised over q) for every row j over the values
        (Q x)_j takes in the box lo <= x <= hi."""
        matrix = np.asarray(matrix, dtype=np.int64)
        qmin = np.minimum(matrix * lo, matrix * hi).sum(axis=1)
        qmax = np.maximum(matrix * lo, matrix * hi).sum(axis=1)
        lengths = qmax - qmin + 1
        tables = [np.asarray(log_term(j, np.arange(qmin[j], qmax[j] + 1)), dtype=float)
                  for j in range(matrix.shape[0])]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        flat = np.concatenate(tables) if tables else np.zeros(0)
        return cls(matrix, qmin.astype(np.int64), starts, lengths.astype(np.int64), flat)


@dataclass(frozen=True)
class NormFactor:
    """The factor exp(-epsilon ||release - x||_2) of the target (module docstring);
    ``epsilon = 0`` means no such factor."""

    epsilon: float
    release: np.ndarray  # int64, one per cell

    @classmethod
    def absent(cls, n_cells: int) -> "NormFactor":
        return cls(0.0, np.zeros(n_cells, np.int64))


@dataclass(frozen=True)
class MovePlan:
    """Moves in padded sparse form plus their effect on the query rows (CSR)."""

    cells: np.ndarray  # (n, s) int64
    steps: np.ndarray  # (n, s) int64, 0 = padding
    row_ptr: np.ndarray  # (n + 1,)
    rows: np.ndarray
    coefs: np.ndarray

    @classmethod
    def build(cls, cells, steps, query_matrix) -> "MovePlan":
        cells = np.ascontiguousarray(cells, dtype=np.int64)
        steps = np.ascontiguousarray(steps, dtype=np.int64)
        q = np.asarray(query_matrix, dtype=np.int64)
        ptr, rows, coefs = [0], [], []
        for c, s in zip(cells, steps):
            effect = q[:, c] @ s if q.shape[0] else np.zeros(0, np.int64)
            nz = np.flatnonzero(effect)
            rows.append(nz)
            coefs.append(effect[nz])
            ptr.append(ptr[-1] + nz.size)
        cat = (lambda parts: np.concatenate(parts).astype(np.int64)) if rows else (
            lambda parts: np.zeros(0, np.int64))
        return cls(cells, steps, np.asarray(ptr, np.int64), cat(rows), cat(coefs))

    def __len__(self) -> int:
        return self.cells.shape[0]


@kernel()
def _sweep(x, qx, lo, table, log_eta, log_sup, cells, steps, row_ptr, rows, coefs,
           qmin, starts, lengths, tables, order, uniforms, norm_eps, norm_s):
    """Update ``x`` (and ``qx`` = Q x) in place along moves ``order``; returns
    (sum of log1p(line bounds), number of moves that changed x). ``norm_eps`` > 0 adds the
    factor exp(-norm_eps ||norm_s - x||_2)."""
    width = table.shape[1]
    log_bound = 0.0
    changed = 0
    buffer = np.empty(width + 1, dtype=np.float64)
    with_norm = norm_eps > 0.0
    rr = 0  # ||norm_s - x||^2, exact in integers
    if with_norm:
        for c in range(x.shape[0]):
            rr += (norm_s[c] - x[c]) ** 2
    for k in range(order.shape[0]):
        m = order[k]
        rz = 0  # r.z and ||z||^2 of this move, r = norm_s - x
        zz = 0
        if with_norm:
            for s in range(cells.shape[1]):
                st = steps[m, s]
                if st != 0:
                    rz += st * (norm_s[cells[m, s]] - x[cells[m, s]])
                    zz += st * st
        tlo = -(1 << 62)
        thi = 1 << 62
        for s in range(cells.shape[1]):
            st = steps[m, s]
            if st == 0:
                continue
            c = cells[m, s]
            below = lo[c] - x[c]  # st * t >= below
            above = lo[c] + width - 1 - x[c]  # st * t <= above
            if st > 0:
                a = -((-below) // st)
                b = above // st
            else:  # -above <= -st * t <= -below
                a = -(above // (-st))
                b = (-below) // (-st)
            tlo = max(tlo, a)
            thi = min(thi, b)
        n_t = thi - tlo + 1
        if n_t > buffer.shape[0]:
            buffer = np.empty(n_t, dtype=np.float64)
        top = -np.inf
        for i in range(n_t):
            t = tlo + i
            w = 0.0
            for s in range(cells.shape[1]):
                st = steps[m, s]
                if st != 0:
                    c = cells[m, s]
                    w += table[c, x[c] + t * st - lo[c]]
            for r in range(row_ptr[m], row_ptr[m + 1]):
                j = rows[r]
                pos = qx[j] + t * coefs[r] - qmin[j]
                if pos < 0 or pos >= lengths[j]:
                    w = -np.inf
                else:
                    w += tables[starts[j] + pos]
            if with_norm:
                w -= norm_eps * np.sqrt(float(rr - 2 * t * rz + t * t * zz))
            buffer[i] = w
            if w > top:
                top = w
        if top == -np.inf:
            continue
        total = 0.0
        for i in range(n_t):
            buffer[i] = np.exp(buffer[i] - top)
            total += buffer[i]
        u = uniforms[k] * total
        acc = 0.0
        pick = n_t - 1
        for i in range(n_t):
            acc += buffer[i]
            if acc >= u:
                pick = i
                break
        t = tlo + pick
        # line bound: sum_c eta_c prod_{c' != c} sup_{c'} relative to the line mass
        sup_sum = 0.0
        for s in range(cells.shape[1]):
            if steps[m, s] != 0:
                sup_sum += log_sup[cells[m, s]]
        num = -np.inf
        for s in range(cells.shape[1]):
            if steps[m, s] != 0:
                c = cells[m, s]
                v = log_eta[c] + sup_sum - log_sup[c]
                num = max(num, v) + np.log1p(np.exp(-abs(num - v))) if num > -np.inf else v
        log_bound += np.log1p(np.exp(min(num - (top + np.log(total)), 700.0)))
        if t != 0:
            changed += 1
            rr += t * t * zz - 2 * t * rz
            for s in range(cells.shape[1]):
                st = steps[m, s]
                if st != 0:
                    x[cells[m, s]] += t * st
            for r in range(row_ptr[m], row_ptr[m + 1]):
                qx[rows[r]] += t * coefs[r]
    return log_bound, changed


def gibbs_sweeps(x, lo, table, log_eta, moves: MovePlan, queries: QueryRows, *,
                 n_sweeps: int, moves_per_sweep: int, rng: np.random.Generator,
                 norm: NormFactor | None = None):
    """Run ``n_sweeps`` sweeps of ``moves_per_sweep`` exact line updates (a random permutation
    of all moves when there are at most that many, else moves drawn uniformly), starting from
    ``x`` inside the box ``lo <= x < lo + table.shape[1]``.

    Returns (x, largest per-sweep bound on the neglected relative mass, fraction of updates
    that changed x). ``table[i, v - lo[i]]`` is T_i(v); ``log_eta[i]`` bounds log of the cell's
    term summed outside its box; ``norm`` is an optional l2 factor."""
    x = np.array(x, dtype=np.int64)
    norm = NormFactor.absent(x.size) if norm is None else norm
    table = np.ascontiguousarray(table, dtype=np.float64)
    log_eta = np.ascontiguousarray(log_eta, dtype=np.float64)
    log_sup = np.maximum(table.max(axis=1), log_eta)
    qx = queries.matrix @ x
    worst, changed = 0.0, 0
    n_moves = len(moves)
    for _ in range(n_sweeps):
        if n_moves <= moves_per_sweep:
            order = rng.permutation(n_moves)
        else:
            order = rng.integers(n_moves, size=moves_per_sweep)
        uniforms = rng.random(order.size)
        log_bound, n_changed = _sweep(
            x, qx, np.asarray(lo, np.int64), table, log_eta, log_sup, moves.cells, moves.steps,
            moves.row_ptr, moves.rows, moves.coefs, queries.qmin, queries.starts,
            queries.lengths, queries.tables, order.astype(np.int64), uniforms,
            float(norm.epsilon), np.asarray(norm.release, np.int64),
        )
        worst = max(worst, float(np.expm1(min(log_bound, 700.0))))  # e^700: no bound
        changed += n_changed
    total = max(1, n_sweeps * min(n_moves, moves_per_sweep))
    return x, worst, changed / total


def corrected_gibbs_sweep(x, lo, table, log_eta, moves: MovePlan, queries: QueryRows, *,
                          moves_per_sweep: int, block_moves: int, tracker, rng: np.random.Generator,
                          norm: NormFactor | None = None):
    """One sweep of ``moves_per_sweep`` line updates towards pi(x) exp(W(x)) with
    W = -``tracker``.log_z (module docstring): palindromic blocks of ``block_moves`` moves,
    each accepted or rejected as a whole. ``tracker`` (e.g.
    :class:`dpinfer.lattice.class_convolution.NormaliserTracker`) must hold ``x``.

    Returns (x, largest block bound on the neglected relative mass, fraction of updates that
    changed x in accepted blocks, fraction of blocks accepted)."""
    x = np.array(x, dtype=np.int64)
    norm = NormFactor.absent(x.size) if norm is None else norm
    table = np.ascontiguousarray(table, dtype=np.float64)
    log_eta = np.ascontiguousarray(log_eta, dtype=np.float64)
    log_sup = np.maximum(table.max(axis=1), log_eta)
    lo = np.asarray(lo, np.int64)
    qx = queries.matrix @ x
    n_moves = len(moves)
    order = rng.permutation(n_moves) if n_moves <= moves_per_sweep else rng.integers(n_moves, size=moves_per_sweep)
    worst, changed, accepted, n_blocks = 0.0, 0, 0, 0
    for start in range(0, order.size, block_moves):
        chunk = order[start:start + block_moves]
        path = np.concatenate([chunk, chunk[::-1]]).astype(np.int64)
        x_new, qx_new = x.copy(), qx.copy()
        log_bound, n_changed = _sweep(
            x_new, qx_new, lo, table, log_eta, log_sup, moves.cells, moves.steps, moves.row_ptr,
            moves.rows, moves.coefs, queries.qmin, queries.starts, queries.lengths, queries.tables,
            path, rng.random(path.size), float(norm.epsilon), np.asarray(norm.release, np.int64),
        )
        worst = max(worst, float(np.expm1(min(log_bound, 700.0))))  # e^700: no bound
        n_blocks += 1
        log_z, state = tracker.propose(x_new)
        if np.log(rng.random()) <= tracker.log_z - log_z:
            tracker.move(x_new, log_z, state)
            x, qx = x_new, qx_new
            changed += n_changed
            accepted += 1
    return x, worst, changed / max(1, 2 * order.size), accepted / max(1, n_blocks)
