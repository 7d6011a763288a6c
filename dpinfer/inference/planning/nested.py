"""The plan of latent counts behind nested measurements (:mod:`dpinfer.mechanisms.nested`).

The counts x (n_leaves, n_cells) are drawn by exact sum-tree moves
(:mod:`dpinfer.lattice.nested`) inside **boxes**: each count's range lo .. hi, fixed for a fit.
The boxes are centred on a pilot estimate x^ of the counts, the support-bounded weighted least
squares fit of the measurements (each weighted by 1/variance, equalities and bounds as
constraints handled by the start below), with half-width k * s + 2, where
s = min(m, sqrt(x^ + 2 m + 1)), m the smallest sd x (cells summed) of the measurements of the
count's cell at its leaf or an area above it (a total of k cells with sd s bounds one cell's
spread by about k s only): the posterior's spread is at most the data's (m) and about the
square root of a Poisson-like mean, which the data allow up to x^ + 2 m (k sds of either
cover the posterior when the model fits); k = ``FIRST_K`` at first. A draw that lands on a box edge the support does not impose is
counted; a fit where that happens widens the boxes and runs again, as windows are widened
elsewhere in ``dpinfer.sample``: k is doubled for the counts that reached an edge or came
within s of one (:meth:`NestedPlan.counts_near_edges`), each count keeping its own k, so that
one weakly measured cell under an overdispersed prior (a heavy posterior tail the
Poisson-like s does not foresee) does not widen, and slow, the moves of every other count.
An empirical-Bayes estimate watches its own count draws the same way and widens such counts
before the draws given it, and at its end also the counts whose draws went more than half-way
from the pilot to an open edge: the draws given it are several times as many as the estimate's,
and reach further into a heavy tail (:mod:`dpinfer.inference.engines.compiled.engine`). The
draws given it stop as soon as a count reaches its box's edge, to be widened and drawn again.

The chains start from the rounded pilot repaired term by term to meet every equality and
bound within the boxes, or, if that fails, from the integer point nearest x^ (in l1) that
does, found by HiGHS (``scipy.optimize.milp``); an infeasible set of equalities and bounds is
reported with the terms involved.

Counts with a :func:`~dpinfer.distributions.GroupedNegativeBinomial` prior carry its group
factors as terms: each group, at every level of its groupings, must be the leaves under one
area of the release's tree (:func:`group_areas`), where the factor of every cell's sum goes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import scipy.optimize
import scipy.sparse
import scipy.sparse.linalg

from pytensor.tensor.random.op import RandomVariable

from dpinfer.distributions.grouped_negative_binomial import group_mixing_of
from dpinfer.inference.latents import NotMarginalisableError, prior_support
from dpinfer.inference.planning.children import terms_depending_on
from dpinfer.lattice.nested.sampler import NestedGibbs
from dpinfer.mechanisms.records import ReleaseRecord
from dpinfer.lattice.nested.nnls import nested_nnls

FIRST_K = 15  # first box half-width, in pilot standard deviations


@dataclass
class NestedBoxes:
    """The boxes of one fit: the largest k (a half-width in pilot sds), the number of counts
    whose k is above the rest's (widened alone), and the sampler on them."""

    half_width: int
    gibbs: NestedGibbs
    widened_counts: int = 0


@dataclass
class NestedPlan:
    """Latent counts whose only release is a :class:`~dpinfer.mechanisms.nested.NestedMeasurements`
    (module docstring). Engines read ``gibbs`` (the boxes and the tree) and ``start``."""

    kind: ClassVar[str] = "nested"
    record: ReleaseRecord
    latent_name: str
    support: tuple
    pilot: np.ndarray = field(repr=False)  # x^ (n_leaves, n_cells)
    scale: np.ndarray = field(repr=False)  # s (n_leaves, n_cells)
    window: NestedBoxes | None = None
    start: np.ndarray | None = None

    sums: object = field(repr=False, default=None)  # the terms with the observed values
    mixing_areas: np.ndarray | None = field(repr=False, default=None)  # a GroupedNegativeBinomial's groups
    mixing_groups: np.ndarray | None = field(repr=False, default=None)  # each leaf's finest group
    mixing_parents: np.ndarray | None = field(repr=False, default=None)  # each group's parent group (-1: none)
    mixing_tables: np.ndarray | None = field(repr=False, default=None)  # their factors' tables (G, n_cells)
    count_k: np.ndarray | None = field(repr=False, default=None)  # each count's k (n_leaves, n_cells)

    def first_half_width(self, tol: float, compiled: bool) -> int:
        return FIRST_K

    def widened_half_width(self, bound: float, tol: float) -> int:
        return 2 * self.window.half_width

    def set_half_width(self, k: int) -> None:
        """Boxes of half-width k * s + 2 around the pilot for every count (module docstring)."""
        self.count_k = np.full(self.pilot.shape, int(k), dtype=np.int64)
        self._build_boxes()

    def widen_counts(self, index) -> None:
        """Double k for the counts ``index`` (pairs (leaf, cell)) alone and rebuild the boxes."""
        index = np.asarray(index, dtype=np.int64).reshape(-1, 2)
        leaf, cell = index[:, 0], index[:, 1]
        if np.any((leaf < 0) | (leaf >= self.pilot.shape[0]) | (cell < 0) | (cell >= self.pilot.shape[1])):
            raise ValueError(f"widen_counts: (leaf, cell) pairs must lie within {self.pilot.shape}")
        self.count_k[leaf, cell] *= 2
        self._build_boxes()

    def counts_near_edges(self, gap: np.ndarray, share: float = 0.0) -> np.ndarray:
        """(m, 2): the (leaf, cell) of the counts whose smallest distance ``gap`` (n_leaves,
        n_cells) to an edge of their box that the support does not impose (inf where there is
        none: :func:`~dpinfer.inference.engines.compiled.engine.box_gaps`) is within s, their
        pilot sd (at least 1), or 0; with ``share`` > 0, also those within ``share`` of their
        box's half-width k s + 2 (a margin for a run of many more draws than those seen)."""
        half = np.ceil(self.count_k * self.scale) + 2
        return np.argwhere(gap <= np.maximum(np.maximum(np.ceil(self.scale), 1.0), share * half))

    def _build_boxes(self) -> None:
        """Boxes of half-width k * s + 2 around the pilot, each count its own k, and a start in them."""
        lower, upper = self.support
        half = np.ceil(self.count_k * self.scale).astype(np.int64) + 2
        centre = np.rint(self.pilot).astype(np.int64)
        lo = centre - half
        hi = centre + half
        if lower is not None:
            lo = np.maximum(lo, lower)
            hi = np.maximum(hi, lower)
        if upper is not None:
            hi = np.minimum(hi, upper)
            lo = np.minimum(lo, upper)
        zeros = structural_zeros(self.sums)
        hi = np.where(zeros, np.maximum(lo, 0), hi)
        lo = np.where(zeros, np.minimum(lo, 0) if lower is None else max(lower, 0), lo)
        start = feasible_start(self.sums, self.pilot, lo, hi, self.record.name)
        sums = self.sums
        if self.mixing_areas is not None:  # the group factors, at placeholder parameters
            sums, self.mixing_tables = sums.with_group_mixing(self.mixing_areas)
        k = self.count_k
        self.window = NestedBoxes(int(k.max()), NestedGibbs(sums, lo, hi, support=self.support),
                                  int(np.count_nonzero(k > k.min())))
        self.start = start.reshape(-1)


    def describe_count(self, leaf: int, cell: int, draws: np.ndarray) -> str:
        """One count for a message: its area and cell, its box, the range of its ``draws``
        (n, n_leaves, n_cells), the pilot, and the measurements of that cell alone at its leaf
        or the lowest area above that has one (name = published value, sd)."""
        g = self.window.gibbs
        names = self.record.mechanism.area_names
        sums = self.sums
        measured, _, _, _, variance = sums.term_kinds()
        alone = measured & (sums.term_cells.sum(1) == 1) & sums.term_cells[:, cell]
        v, shown = int(sums.leaf_area[leaf]), []
        while v >= 0 and not shown:
            shown = [f"{sums.term_name[r]} = {sums.term_value[r]} (sd {math.sqrt(variance[r]):.3g})"
                     for r in np.flatnonzero(alone & (sums.term_area == v))[:2]]
            v = int(sums.parent[v])
        measured_as = "; ".join(shown) if shown else "no measurement of this cell alone"
        return (f"{names[sums.leaf_area[leaf]]}, cell {cell}: box {g.box_lo[leaf, cell]}..{g.box_hi[leaf, cell]}, "
                f"stored draws {draws[:, leaf, cell].min()}..{draws[:, leaf, cell].max()}, pilot "
                f"{self.pilot[leaf, cell]:.1f}; {measured_as}")

    def exact_terms_evidence(self, limit: int = 8) -> list:
        """The release's equalities and bounds (at most ``limit``) for a message: each term's
        name, its published value, and its sum at the least-squares fit of the measurements
        alone (:func:`pilot_estimate` without the exact terms)."""
        sums = self.sums
        measured = sums.term_kinds()[0]
        exact = np.flatnonzero(~measured)[:limit]
        if exact.size == 0:
            return []
        kinds = {"eq": "=", "le": "<=", "ge": ">="}
        alone = measured_only(sums)
        fit = None if alone is None else leaf_matrix(sums, exact) @ pilot_estimate(alone, self.support).reshape(-1)
        out = []
        for i, r in enumerate(exact):
            kind = kinds.get(sums.tables.params(int(sums.term_table[r]))[0], "?")
            text = f"{sums.term_name[r]} {kind} {sums.term_value[r]}"
            if fit is not None:
                text += f" (the measurements alone put this sum at {fit[i]:.1f})"
            out.append(text)
        return out


def nested_plan(model, record: ReleaseRecord, latent, values) -> NestedPlan:
    """The plan of ``latent`` (the counts) behind the nested release ``record``, whose observed
    ``values`` are the current data (they may have been replaced with ``pm.set_data``)."""
    sums = record.mechanism.sums.with_values(values)
    node = latent.owner
    if not isinstance(node.op, RandomVariable) or node.op.ndim_supp != 0 or not latent.type.dtype.startswith("int"):
        raise NotMarginalisableError(
            f"latent {latent.name!r} must be integer counts with an elementwise distribution (Poisson, "
            f"NegativeBinomial, ...); got {node.op}")
    children, named = terms_depending_on(model, latent, exclude=(record.release_rv,))
    mixings = group_mixing_of(model)
    mixing = [mixings[v.name] for v in named if v.name in mixings and mixings[v.name].counts == latent.name]
    others = [v.name for v in named if v.name not in {m.potential for m in mixing}]
    if children or others or len(mixing) > 1:
        raise NotMarginalisableError(
            f"the counts {latent.name!r} have children besides their nested release "
            f"{record.name!r} ({[v.name for v in children] + others}); the nested sampler needs the "
            "release to be their only child (and at most one GroupedNegativeBinomial factor)")
    support = prior_support(node)
    pilot = pilot_estimate(sums, support)
    sd = measurement_sd(sums)
    scale = np.minimum(sd, np.sqrt(np.maximum(pilot, 0.0) + 2.0 * np.minimum(sd, 1e9) + 1.0))
    plan = NestedPlan(record=record, latent_name=latent.name, support=support, pilot=pilot, scale=scale, sums=sums)
    if mixing:
        names = record.mechanism.area_names
        plan.mixing_areas = np.concatenate([group_areas(sums, g, names) for g in mixing[0].groups])
        plan.mixing_groups, plan.mixing_parents = mixing[0].leaf_group, mixing[0].group_parent
    return plan


def measured_only(sums):
    """The same tree with the measurements only (the equalities and bounds left out), or None
    without measurements."""
    keep = sums.term_kinds()[0]
    if not np.any(keep):
        return None
    return type(sums)(sums.parent, sums.leaf_area, sums.n_cells, sums.term_area[keep], sums.term_cells[keep],
                      sums.term_value[keep], sums.term_table[keep], sums.tables, sums.term_name[keep],
                      sums.cell_shape)


def group_areas(sums, group: np.ndarray, area_names) -> np.ndarray:
    """The area of the tree that each group of leaves is (G,): a group's leaves must be
    exactly the leaves under one area (its sum is then a sum the sum-tree draws carry)."""
    if group.size != sums.n_leaves:
        raise NotMarginalisableError(f"GroupedNegativeBinomial's group has {group.size} entries for the "
                                     f"release's {sums.n_leaves} leaves")
    area_of = {}
    under = sums.leaves_under()
    for v in sums.order:  # children first: the lowest area over a set of leaves
        area_of.setdefault(tuple(under[v].tolist()), int(v))
    areas = np.empty(int(group.max()) + 1, dtype=np.int64)
    for g in range(areas.size):
        leaves = tuple(np.flatnonzero(group == g).tolist())
        if leaves not in area_of:
            names = [str(area_names[sums.leaf_area[l]]) for l in leaves[:4]]
            raise NotMarginalisableError(
                f"GroupedNegativeBinomial's group {g} (leaves {names}{' ...' if len(leaves) > 4 else ''}) is "
                "not the set of leaves under one area of the release's tree; groups must be areas "
                "(e.g. each leaf's parent)")
        areas[g] = area_of[leaves]
    return areas


def leaf_matrix(sums, rows) -> scipy.sparse.csr_matrix:
    """The 0/1 matrix (len(rows), n_leaves * n_cells) of the terms ``rows``' sums of counts."""
    n_leaves, n_cells = sums.n_leaves, sums.n_cells
    under = sums.leaves_under()
    data_r, data_c = [], []
    for i, r in enumerate(rows):
        leaves = under[sums.term_area[r]]
        cells = np.flatnonzero(sums.term_cells[r])
        cols = (leaves[:, None] * n_cells + cells[None, :]).reshape(-1)
        data_r.append(np.full(cols.size, i))
        data_c.append(cols)
    r = np.concatenate(data_r) if data_r else np.zeros(0, np.int64)
    c = np.concatenate(data_c) if data_c else np.zeros(0, np.int64)
    return scipy.sparse.csr_matrix((np.ones(r.size), (r, c)), shape=(len(rows), n_leaves * n_cells))


def pilot_estimate(sums, support, rounds: int = 50) -> np.ndarray:
    """x^: the weighted least-squares fit of the measurements (each weighted by 1/variance)
    under the equalities, within the prior's support (module docstring).

    Where the support is [L, inf) (every count prior but a Binomial's) it is
    :func:`~dpinfer.lattice.nested.nnls.nested_nnls` of the counts shifted by L
    (x - L >= 0; the measurements and equalities shifted by L times their counts): block
    principal pivoting on the augmented KKT system of area sums, each step one sparse
    factorisation, the equalities exact. At one county of 5,063 blocks (141,764 counts) this
    takes 3.4 s where the iterative solver below took ~260 s; at Iowa's 2,706 block groups 7 s
    against ~60 s (the two agree within 0.02 measurement sds, the iterative one holding the
    equalities by weight only).

    Otherwise (a support with an upper end or none below, or where the first fails: equalities
    it cannot meet, which the start then reports term by term, or counts nothing determines)
    an active set over LSMR: the equalities
    as rows of weight 30 times the heaviest measurement's, columns scaled to unit norm; the
    counts not held are fitted with the held ones fixed, counts beyond a bound are held at it,
    held counts whose gradient points into the support are freed, until nothing changes (at
    most ``rounds``).
    """
    lower, upper = support
    if lower is not None and upper is None and np.any(sums.term_kinds()[0]):
        try:
            return lower + nested_nnls(_shifted(sums, lower), bounds=False)
        except RuntimeError:  # a step that did not solve (inconsistent equalities, counts nothing
            pass              # determines) or pivoting that did not end: the fit below
    measured, equal, _, _, variance = sums.term_kinds()
    rows = np.flatnonzero(measured | equal)
    n = sums.n_leaves * sums.n_cells
    if rows.size == 0:
        return np.zeros((sums.n_leaves, sums.n_cells))
    w = np.where(measured[rows], 1.0 / np.sqrt(variance[rows]), 0.0)
    w[~measured[rows]] = 30.0 * (w.max() if np.any(measured) else 1.0)
    A = (scipy.sparse.diags(w) @ leaf_matrix(sums, rows)).tocsc()
    b = w * sums.term_value[rows]
    norm = np.sqrt(np.asarray(A.multiply(A).sum(axis=0)).ravel())
    norm[norm == 0] = 1.0
    A = A @ scipy.sparse.diags(1.0 / norm)  # y = norm * x
    lower, upper = support
    lo = np.full(n, -np.inf if lower is None else float(lower)) * norm
    hi = np.full(n, np.inf if upper is None else float(upper)) * norm
    y = np.clip(np.zeros(n), lo, hi)
    free = np.ones(n, bool)
    for _ in range(rounds):
        if free.any():
            rest = b - A[:, ~free] @ y[~free]
            y[free] = scipy.sparse.linalg.lsmr(A[:, free], rest, atol=1e-10, btol=1e-10, maxiter=10 * n,
                                                x0=y[free])[0]
        beyond = free & ((y < lo) | (y > hi))
        y = np.clip(y, lo, hi)
        gradient = A.T @ (A @ y - b)
        tol = 1e-8 * max(float(np.abs(gradient).max()), 1e-300)
        inward = ~free & (((y <= lo) & (gradient < -tol)) | ((y >= hi) & (gradient > tol)))
        if not beyond.any() and not inward.any():
            break
        free = (free & ~beyond) | inward
    return (y / norm).reshape(sums.n_leaves, sums.n_cells)


def _shifted(sums, lower: int):
    """The same terms of the counts x - ``lower``: each term's value less ``lower`` times the
    number of counts it sums."""
    if lower == 0:
        return sums
    sizes = np.array([u.size for u in sums.leaves_under()])[sums.term_area] * sums.term_cells.sum(1)
    return sums.with_values(sums.term_value - int(lower) * sizes)


def measurement_sd(sums) -> np.ndarray:
    """(n_leaves, n_cells): for each count, the smallest sd * (cells summed) over the
    measurements whose sum holds it (at its leaf or above; a measurement of k cells with sd s
    says about one of them no more than a sd of k s would); inf where none does."""
    measured, _, _, _, variance = sums.term_kinds()
    best_area = np.full((sums.n_areas, sums.n_cells), np.inf)
    width = sums.term_cells.sum(1)
    for r in np.flatnonzero(measured):
        v = sums.term_area[r]
        spread = math.sqrt(variance[r]) * width[r]
        best_area[v] = np.where(sums.term_cells[r], np.minimum(best_area[v], spread), best_area[v])
    best = np.full((sums.n_leaves, sums.n_cells), np.inf)
    for leaf, area in enumerate(sums.leaf_area):
        v = area
        while v >= 0:
            best[leaf] = np.minimum(best[leaf], best_area[v])
            v = sums.parent[v]
    return best


def structural_zeros(sums) -> np.ndarray:
    """(n_leaves, n_cells) bool: counts an equality to 0 over cells at an area forces to 0."""
    eq = sums.term_kinds()[1] & (sums.term_value == 0)
    zero = np.zeros((sums.n_leaves, sums.n_cells), bool)
    under = sums.leaves_under()
    for r in np.flatnonzero(eq):
        zero[np.ix_(under[sums.term_area[r]], np.flatnonzero(sums.term_cells[r]))] = True
    return zero


def feasible_start(sums, pilot, lo, hi, name: str) -> np.ndarray:
    """Integer counts in the boxes that meet every equality and bound, near ``pilot``: the
    rounded pilot repaired term by term (:func:`_repaired`), or, if that fails, the counts
    nearest the pilot in l1 (HiGHS MILP)."""
    measured, equal, at_most, at_least, _ = sums.term_kinds()
    x0 = np.clip(np.rint(pilot), lo, hi).astype(np.int64)
    rows = np.flatnonzero(~measured)
    if rows.size == 0:
        return x0
    A = leaf_matrix(sums, rows)
    y = sums.term_value[rows].astype(float)
    upper_b = np.where((equal | at_most)[rows], y, np.inf)
    lower_b = np.where((equal | at_least)[rows], y, -np.inf)
    repaired = _repaired(A, lower_b, upper_b, x0.reshape(-1), lo.reshape(-1), hi.reshape(-1))
    if repaired is not None:
        return repaired.reshape(pilot.shape)
    n = A.shape[1]
    # variables: x (n, integer) and d (n) >= |x - pilot|; minimise sum d
    p = pilot.reshape(-1)
    eye = scipy.sparse.eye(n, format="csr")
    constraints = [
        scipy.optimize.LinearConstraint(scipy.sparse.hstack([A, scipy.sparse.csr_matrix((rows.size, n))]),
                                        lower_b, upper_b),
        scipy.optimize.LinearConstraint(scipy.sparse.hstack([eye, -eye]), -np.inf, p),
        scipy.optimize.LinearConstraint(scipy.sparse.hstack([eye, eye]), p, np.inf),
    ]
    bounds = scipy.optimize.Bounds(np.concatenate([lo.reshape(-1), np.zeros(n)]),
                                   np.concatenate([hi.reshape(-1), np.full(n, np.inf)]))
    res = scipy.optimize.milp(np.concatenate([np.zeros(n), np.ones(n)]), constraints=constraints,
                              bounds=bounds, integrality=np.concatenate([np.ones(n), np.zeros(n)]))
    if res.status != 0 or res.x is None:
        # name the terms that conflict: an irreducible infeasible subset (dpinfer.lattice.infeasible)
        from dpinfer.lattice.infeasible import conflicting_rows

        lo, hi = lo.reshape(-1), hi.reshape(-1)
        conflict = conflicting_rows(A, lower_b, upper_b, lo, hi)
        if conflict is None:
            why = ("they can all hold for real counts in the boxes but not for whole ones: check the "
                   "equalities and bounds that share counts")
        else:
            sign = np.where(equal, "=", np.where(at_most, "<=", ">="))
            terms = [f"{sums.term_name[rows[i]]} {sign[rows[i]]} {sums.term_value[rows[i]]}" for i in conflict]
            sub = A[conflict]
            anywhere = conflicting_rows(sub, lower_b[conflict], upper_b[conflict], np.where(lo >= 0, 0.0, -np.inf),
                                        np.full(lo.size, np.inf))
            why = ((f"these {len(terms)} terms cannot all hold " if len(terms) > 1 else "this term cannot hold ")
                   + ("for any counts >= 0: the release's equalities and bounds contradict each other"
                      if anywhere is not None else
                      "within the boxes (with counts outside them it is possible): the boxes around the "
                      "pilot are too narrow")
                   + ": " + "; ".join(terms[:12]) + (f"; and {len(terms) - 12} more" if len(terms) > 12 else ""))
        raise ValueError(f"release {name!r}: no counts in the boxes meet every equality and bound "
                         f"({res.message.strip()}); {why}")
    x = np.rint(res.x[:n]).astype(np.int64).reshape(pilot.shape)
    return x


def _repaired(A, lower, upper, x, lo, hi, passes: int = 20):
    """x moved into lower <= A x <= upper (A 0/1 csr) inside lo <= x <= hi, or None: each
    violated row in turn spreads its shortfall (or excess) over its counts in proportion to
    their room in the boxes (largest remainders), ``passes`` times over the rows; enough for
    the census files' equalities (nested totals, zeros) and bounds, which rarely conflict."""
    x = x.copy()
    for _ in range(passes):
        t = A @ x
        bad = np.flatnonzero((t < lower) | (t > upper))
        if bad.size == 0:
            return x
        for r in bad:
            cols = A.indices[A.indptr[r]:A.indptr[r + 1]]
            total = int(x[cols].sum())
            need = (lower[r] - total) if total < lower[r] else (upper[r] - total)
            if not np.isfinite(need) or need == 0:
                continue
            need = int(need)
            room = (hi[cols] - x[cols]) if need > 0 else (x[cols] - lo[cols])
            if room.sum() < abs(need):
                return None
            share = abs(need) * room / room.sum()
            step = np.floor(share).astype(np.int64)
            short = abs(need) - int(step.sum())
            if short:
                step[np.argsort(-(share - step), kind="stable")[:short]] += 1
            x[cols] += np.sign(need) * step
    t = A @ x
    return x if np.all((t >= lower) & (t <= upper)) else None
