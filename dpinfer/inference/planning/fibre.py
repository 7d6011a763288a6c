"""Plans for latent counts on a fibre {x integer : A x = a, x >= 0}.

A latent count vector x can carry releases of three kinds (recorded by ``observe``):
- a release of x itself (``mech.observe(name, x, s)``), which pins each cell to a window
  around s_i (inference notes §1);
- a release conditioned on invariants (``Conditioned(base, inv).observe(name, x, s)``): the
  likelihood prod_i f(s_i - x_i) on the fibre A x = A s (inference notes §2);
- a generalized Laplace release in the l2 norm (``GeneralizedLaplace(eps, inv, "l2")``): the
  likelihood exp(-eps ||s - x||_2) on the same fibre, a factor that is not a product over
  cells but is exact along every move line (:class:`dpinfer.lattice.fibre_gibbs.NormFactor`);
- a release of a part of x (``mech.observe(name, x[a], s)``: some cells, a cell twice), with
  any mechanism: per-cell terms as for x itself. The releases of cells are, together, one
  release of the whole (their product likelihood): each cell's window is centred on its first
  release, and its tail bound is the sum over its releases of each one's sup outside it;
- a release of a linear query (``mech.observe(name, Q @ x, s)``), a likelihood term per row.

:func:`plan_fibre` reads them and chooses
- ``"convolution"`` when the only release is conditioned on one total or disjoint group totals
  and the counts have no other child: the counts are summed out exactly by convolution
  (:mod:`dpinfer.lattice.convolution`), NUTS runs on the parameters, the counts are drawn exactly;
- ``"fibre"`` otherwise: the PyMC engine's fibre step
  (:mod:`dpinfer.inference.engines.pymc.fibre`) updates x along the moves of a Markov basis
  of the combined invariants with exact line conditionals (:mod:`dpinfer.lattice.fibre_gibbs`),
  next to NUTS on the parameters, on the plan's box, release tables and moves (its methods
  below). A release conditioned on
  non-negativity (``Conditioned(..., nonnegative=True)``) always takes this path: its
  normaliser Z(x) is not a product over cells, so when it varies by more than ``tol`` over the
  window the line updates come in palindromic blocks accepted by Metropolis-Hastings on
  Z(x) / Z(x') (:func:`dpinfer.lattice.fibre_gibbs.corrected_gibbs_sweep`).

When some cell has no release of its own, every cell ranges over its prior's support (a
Binomial's n); latent counts with unbounded support need a release of each cell, whole or in
parts (a window needs a noise tail).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from dpinfer._graphs import shape_of
from dpinfer.inference.planning.children import terms_depending_on
from dpinfer.inference.latents import NotMarginalisableError, prior_support
from dpinfer.inference.planning.entries import Entry
from dpinfer.inference.window import log_eta, log_eta_off_centre, smallest_half_width
from dpinfer.lattice.invariants import Invariants, MoveSet
from dpinfer.lattice.fibre_gibbs import MovePlan, NormFactor, QueryRows
from dpinfer.mechanisms.conditioned import Conditioned
from dpinfer.mechanisms.subspace import GeneralizedLaplace

MOVES_PER_CELL = 20  # line updates per sweep: all moves, at most this many per cell
# moves per palindromic block when correcting for Z(x): 2 per cell (each block costs one
# evaluation of the normaliser; acceptance ~0.75-0.85 on seed 000's 2 x 23 table)
NORMALISER_BLOCK_MOVES_PER_CELL = 2


def is_l2_release(mechanism) -> bool:
    """A generalized Laplace mechanism in the l2 norm (its likelihood is a joint factor)."""
    return isinstance(mechanism, GeneralizedLaplace) and mechanism.norm == "l2"


def cell_mechanism(mechanism):
    """The per-cell noise likelihood of a release (the base law of a conditioned release);
    None for an l2 release, which has no per-cell factor."""
    if is_l2_release(mechanism):
        return None
    return mechanism.base if isinstance(mechanism, Conditioned) else mechanism


def has_joint_factor(mechanism) -> bool:
    """A release whose likelihood is not a product over cells: in the l2 norm, or
    conditioned on non-negativity (its normaliser Z(x))."""
    return is_l2_release(mechanism) or (isinstance(mechanism, Conditioned) and mechanism.nonnegative)


def tail_mechanism(mechanism):
    """The mechanism whose ``log_likelihood_bound_outside`` bounds a cell's term outside the
    window: the release's own for a release with a joint factor (the bound of a release
    conditioned on non-negativity includes the range of the x-dependent normaliser), else the
    per-cell law."""
    return mechanism if has_joint_factor(mechanism) else cell_mechanism(mechanism)


@dataclass
class FibrePlan:
    """Latent counts on a fibre: exact Gibbs updates along Markov moves (module docstring).

    What the engines read is data, set with the window (:meth:`set_half_width`): the box
    (cell i ranges over ``lo[i] .. lo[i] + width - 1``), each cell's tail bound ``log_eta``,
    the releases' log-likelihood table on the box (``release_table``, (d, width)), the query
    rows and the moves (``query_rows``, ``move_plan``), the normaliser's range over the box
    and whether it is corrected for, and ``start``: a point of the fibre in the box."""

    kind: ClassVar[str] = "fibre"
    moves_per_cell: ClassVar[int] = MOVES_PER_CELL
    normaliser_block_moves_per_cell: ClassVar[int] = NORMALISER_BLOCK_MOVES_PER_CELL
    latent_name: str
    shape: tuple
    support: tuple
    entries: list
    method: str  # "convolution" or "fibre"
    constraint: Invariants | None
    constraint_values: np.ndarray
    half_width: int = 0
    moves: MoveSet | None = field(default=None, repr=False)
    # a release conditioned on non-negativity: its normaliser Z(x) is corrected for by
    # Metropolis-Hastings when it varies by more than tol over the box
    normaliser: Conditioned | None = None
    tol: float = 0.0  # the normaliser is treated as constant when it varies by at most this
    # a generalized Laplace release in the l2 norm: its factor exp(-eps ||s - x||_2)
    norm_factor: NormFactor | None = None
    # set with the window (class docstring)
    lo: np.ndarray | None = field(default=None, repr=False)
    width: int = 0
    log_eta: np.ndarray | None = field(default=None, repr=False)
    release_table: np.ndarray | None = field(default=None, repr=False)
    query_rows: QueryRows | None = field(default=None, repr=False)
    move_plan: MovePlan | None = field(default=None, repr=False)
    normaliser_range: float = 0.0
    normaliser_corrected: bool = False
    start: np.ndarray | None = field(default=None, repr=False)
    n_cells: int = field(init=False)

    def __post_init__(self):
        self.n_cells = int(np.prod(self.shape))
        # each cell's window is set by the first release of it (its "primary" value)
        self._primary = np.full(self.n_cells, -1)  # the release, in cell_releases
        self._primary_at = np.full(self.n_cells, -1)  # the value's position in that release
        for j, e in enumerate(self.cell_releases):
            cells = e.cells
            first = np.unique(cells, return_index=True)[1]  # a cell released twice: its first value
            new = first[self._primary[cells[first]] < 0]
            self._primary[cells[new]], self._primary_at[cells[new]] = j, new

    @property
    def cell_releases(self) -> list:
        """Releases of cells -- the counts themselves or a part ``x[a]`` (:attr:`Entry.cells`)
        -- a release with a joint factor (l2 norm, non-negativity) first: each cell's window
        is centred on the first release of it."""
        return sorted((e for e in self.entries if e.cells is not None),
                      key=lambda e: not has_joint_factor(e.record.mechanism))

    @property
    def queries(self) -> list:
        return [e for e in self.entries if e.cells is None]

    @property
    def covered(self) -> bool:
        """Every cell has a release of its own (possibly in parts): windows around them."""
        return bool(np.all(self._primary >= 0))

    @property
    def record(self):
        return self.entries[0].record

    def released_values(self) -> np.ndarray:
        """Each cell's value in the release that centres its window (NaN where none)."""
        out = np.full(self.n_cells, np.nan)
        for j, e in enumerate(self.cell_releases):
            mine = self._primary == j
            out[mine] = e.value[self._primary_at[mine]]
        return out

    # --- windows -----------------------------------------------------------------------------
    def first_half_width(self, tol: float, compiled: bool = False) -> int:
        """Smallest half-width whose every cell tail bound is tol / (1e8 MOVES_PER_CELL
        n_cells) of the likelihood at the window centre (then checked on every step); it also
        sets the tolerance of the normaliser correction. Fibres run on the PyMC engine only."""
        self.tol = tol
        if not self.covered:
            return 0
        target = np.log(tol) - np.log(self.n_cells) - np.log(1e8 * MOVES_PER_CELL) + self._log_peak()
        return smallest_half_width(self._log_eta_at, log_target=target, what=self._what())

    def set_half_width(self, k: int) -> None:
        """The window of half-width ``k`` and everything the fibre step reads on it (class
        docstring)."""
        self.half_width = int(k)
        self.lo, self.width = self._box()
        self.log_eta = self._log_eta_at(self.half_width) if self.covered else np.full(self.n_cells, -np.inf)
        self.release_table = self._release_table()
        self.query_rows = self._query_rows()
        self.move_plan = MovePlan.build(self.moves.cells, self.moves.steps, self.query_rows.matrix)
        if self.normaliser is not None:  # how much Z(x) can vary over the box
            self.normaliser_range = self.normaliser.normaliser_range(self.lo)
        self.normaliser_corrected = self.normaliser is not None and self.normaliser_range > self.tol
        self.start = self._start()

    def widened_half_width(self, bound: float, tol: float) -> int:
        """A half-width whose tail bounds are tol / (10 bound) of the current ones (every bound
        here is proportional to them when small); double it where the bound is infinite."""
        if not np.isfinite(bound):
            return 2 * self.half_width
        target = float(np.max(self.log_eta)) + np.log(tol / (10.0 * bound))
        k = smallest_half_width(self._log_eta_at, log_target=target, what=self._what())
        return max(self.half_width + 1, k)

    def centres(self) -> np.ndarray:
        """Window centres: each cell's first release, clipped to the support; cells without
        one start at the support's lower end."""
        lower, upper = self.support
        values = self.released_values()
        c = np.where(np.isnan(values), lower if lower is not None else 0, np.rint(np.nan_to_num(values)))
        c = c.astype(np.int64)
        if lower is not None:
            c = np.maximum(c, lower)
        if upper is not None:
            c = np.minimum(c, upper)
        return c

    def _what(self) -> str:
        return " and ".join(sorted({type(e.record.mechanism).__name__ for e in self.cell_releases}))

    def _log_peak(self) -> float:
        """The smallest over cells of the window-setting release's log-likelihood at the
        window centre (an l2 release: its factor at a typical count vector,
        exp(-eps ||s - x||_2))."""
        centres, peaks = self.centres(), []
        for j, e in enumerate(self.cell_releases):
            mine = np.flatnonzero(self._primary == j)
            if mine.size == 0:
                continue
            mech = cell_mechanism(e.record.mechanism)
            if mech is None:
                peaks.append(-e.record.mechanism.epsilon * e.record.mechanism.typical_noise_norm())
            else:
                peaks.append(float(np.min(mech.log_likelihood(e.value[self._primary_at[mine]], centres[mine]))))
        return min(peaks)

    def _box(self) -> tuple[np.ndarray, int]:
        """(lo, width): cell i ranges over lo_i .. lo_i + width - 1: the windows when every
        cell has a release, else the whole (bounded) support."""
        if self.covered:
            return self.centres() - self.half_width, 2 * self.half_width + 1
        lower, upper = self.support
        return np.full(self.n_cells, lower, np.int64), int(upper - lower + 1)

    def _log_eta_at(self, k: int) -> np.ndarray:
        """Per cell, log of a bound on its releases' joint likelihood outside its window of
        half-width k: the sum over its releases of each one's sup there (the window-setting
        release's tail bound, :func:`log_eta`; further releases of the cell bounded off their
        own centre, :func:`log_eta_off_centre`). Prior mass <= 1."""
        centres, out = self.centres(), np.zeros(self.n_cells)
        for j, e in enumerate(self.cell_releases):
            cells = e.cells
            primary = (self._primary[cells] == j) & (self._primary_at[cells] == np.arange(cells.size))
            mech = tail_mechanism(e.record.mechanism)
            bound = np.empty(cells.size)
            bound[primary] = log_eta(mech, e.value[primary], k, self.support)
            if not np.all(primary):
                bound[~primary] = log_eta_off_centre(mech, e.value[~primary], centres[cells[~primary]], k,
                                                     self.support)
            np.add.at(out, cells, bound)
        return out

    def _release_table(self) -> np.ndarray:
        """sum over releases of cells of log p(s_j | v), v on the box of s_j's cell, (d, W)."""
        grid = self.lo[:, None] + np.arange(self.width)[None, :]
        total = np.zeros(grid.shape)
        for e in self.cell_releases:
            mech = cell_mechanism(e.record.mechanism)
            if mech is None:  # the l2 factor enters the line updates instead
                continue
            cells = grid[e.cells]
            np.add.at(total, e.cells, mech.log_likelihood(np.broadcast_to(e.value[:, None], cells.shape), cells))
        return total

    def _query_rows(self) -> QueryRows:
        if not self.queries:
            return QueryRows.empty(self.n_cells)
        lo, width = self.lo, self.width
        matrix = np.vstack([e.query for e in self.queries])
        owners = [(e, j) for e in self.queries for j in range(e.query.shape[0])]

        def log_term(row, q):
            e, j = owners[row]
            mech = e.record.mechanism
            if isinstance(mech, Conditioned):
                return mech.base.noise_logpdf(e.value[j] - q)
            return mech.log_likelihood(np.full(q.shape, e.value[j]), q)

        return QueryRows.tabulate(matrix, lo, lo + width - 1, log_term)

    def _start(self) -> np.ndarray:
        """A point of the fibre inside the box, closest in l1 to the window centres (a mixed
        integer program; raises if the box holds no point of the fibre)."""
        from scipy.optimize import Bounds, LinearConstraint, milp

        lo, width = self.lo, self.width
        lower, upper = self.support
        lb = lo if lower is None else np.maximum(lo, lower)
        ub = lo + width - 1 if upper is None else np.minimum(lo + width - 1, upper)
        c = self.centres()
        if self.constraint is None:
            return np.clip(c, lb, ub)
        a_mat = self.constraint.constraint_matrix
        d = self.n_cells
        # variables (x, u): minimise sum u with u >= |x - c|
        cost = np.concatenate([np.zeros(d), np.ones(d)])
        eye = np.eye(d)
        cons = [
            LinearConstraint(np.hstack([a_mat, np.zeros_like(a_mat)]), self.constraint_values, self.constraint_values),
            LinearConstraint(np.hstack([eye, -eye]), -np.inf, c),
            LinearConstraint(np.hstack([-eye, -eye]), -np.inf, -c),
        ]
        res = milp(cost, constraints=cons, integrality=np.r_[np.ones(d), np.zeros(d)],
                   bounds=Bounds(np.r_[lb, np.zeros(d)], np.r_[ub, np.full(d, np.inf)]))
        if res.x is None:
            raise ValueError(
                f"no counts for {self.latent_name!r} satisfy the release's invariants inside the "
                f"window of half-width {self.half_width}: the invariants are inconsistent with "
                "the counts' support"
            )
        return np.rint(res.x[:d]).astype(np.int64)


def plan_fibre(model, latent, entries: list[Entry], *, allow_convolution: bool = True) -> FibrePlan:
    """Check the latent and its releases and choose the method (see the module docstring);
    ``allow_convolution=False`` uses fibre moves even where convolution applies."""
    name = latent.name
    node = latent.owner
    if latent not in model.free_RVs or getattr(node.op, "ndim_supp", 1) != 0:
        raise NotMarginalisableError(
            f"latent {name!r} must be an elementwise discrete free variable (Poisson, Binomial, ...)"
        )
    shape = shape_of(latent)
    d = int(np.prod(shape))
    rows, values, structured = [], [], []
    for e in entries:
        if e.cells is None and not e.record.mechanism.discrete:
            raise NotMarginalisableError(
                f"release {e.record.name!r} of a query of {name!r} has continuous noise; the "
                "fibre step bounds query likelihoods by 1, which needs a discrete mechanism"
            )
        mech = e.record.mechanism
        if mech.keeps_invariants:
            a_mat = mech.invariants.constraint_matrix
            n_values = d if e.query is None else e.query.shape[0]
            if a_mat.shape[1] != n_values:
                raise ValueError(
                    f"release {e.record.name!r}: the invariants cover {a_mat.shape[1]} cells but "
                    f"the released values have {n_values}"
                )
            rows.append(a_mat if e.query is None else a_mat @ e.query)  # (no d x d identity)
            values.append(a_mat @ e.value)
            if e.query is None:
                structured.append(mech.invariants)
    if rows:
        constraint = structured[0] if len(rows) == 1 and structured else Invariants.from_matrix(np.vstack(rows))
        constraint_values = np.concatenate(values)
    else:
        constraint, constraint_values = None, np.zeros(0, np.int64)
    others = [e.record.release_rv for e in entries]
    children, named = terms_depending_on(model, latent, exclude=tuple(others))
    if children or named:
        raise NotMarginalisableError(
            f"latent {name!r} has releases with invariants or queries and further children "
            f"{[v.name for v in children + named]}; this combination is not supported"
        )
    nonnegative = [e for e in entries
                   if isinstance(e.record.mechanism, Conditioned) and e.record.mechanism.nonnegative]
    if any(e.query is not None for e in nonnegative) or len(nonnegative) > 1:
        raise NotMarginalisableError(
            f"latent {name!r}: a release conditioned on non-negativity must be a release of the "
            "counts themselves, and only one such release per latent is supported"
        )
    l2 = [e for e in entries if is_l2_release(e.record.mechanism)]
    if any(e.query is not None for e in l2) or len(l2) > 1:
        raise NotMarginalisableError(
            f"latent {name!r}: a generalized Laplace release in the l2 norm must be a release of "
            "the counts themselves, and only one such release per latent is supported"
        )
    if nonnegative and l2:
        raise NotMarginalisableError(
            f"latent {name!r} has a release conditioned on non-negativity and a generalized "
            "Laplace release in the l2 norm; at most one release with a joint factor per latent "
            "is supported")
    single = entries[0]
    convolution = allow_convolution and not nonnegative and (
        len(entries) == 1 and single.query is None and isinstance(single.record.mechanism, Conditioned)
        and single.record.mechanism.invariants.group_codes is not None
    )
    support = prior_support(node)
    plan = FibrePlan(name, shape, support, entries, "convolution" if convolution else "fibre",
                     constraint, constraint_values,
                     normaliser=nonnegative[0].record.mechanism if nonnegative else None,
                     norm_factor=NormFactor(l2[0].record.mechanism.epsilon, l2[0].value) if l2 else None)
    if not plan.covered and (support[0] is None or support[1] is None):
        bare = np.flatnonzero(np.isnan(plan.released_values()))
        cells = ", ".join(str(tuple(int(i) for i in np.unravel_index(c, shape))) for c in bare[:5])
        raise NotMarginalisableError(
            f"latent {name!r} has {bare.size} of its {d} cells without a release of their own "
            f"(cells {cells}{', ...' if bare.size > 5 else ''}; released in parts, the parts must "
            "together cover every cell) and an unbounded prior support: dpinfer cannot bound the "
            "counts it neglects. Release those cells too, or give the counts a bounded prior "
            "(Binomial with fixed n)"
        )
    if plan.method == "fibre":
        plan.moves = constraint.markov_basis() if constraint is not None else MoveSet.unit(d)
    return plan
