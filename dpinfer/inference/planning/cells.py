"""Plans for latent counts whose cells are drawn given the parameters: a release of the counts
themselves, one conditioned on group totals, or counts with further children.

A plan is data: the release, the latent's name and support, its window and where its chains
start. The engines (:mod:`dpinfer.inference.engines`) run plans; they read them and never
plan. Kinds:

* :class:`CellsPlan` -- one release of the counts themselves, their only child: the cells
  are independent given the parameters (inference notes §1);
* :class:`TotalsPlan` -- one release conditioned on one total or on disjoint group totals,
  the counts' only child (inference notes §2): the cells are drawn jointly on the totals;
* :class:`ChildrenPlan` -- counts with children besides their first release (further releases
  of the counts, Binomial thinnings, ...), updated cell by cell given the rest;
* fibre plans (:mod:`dpinfer.inference.planning.fibre`) for every other invariant, queries,
  non-negativity and the l2 generalized Laplace.

Windows. The PyMC engine sums over or updates on windows whose neglected likelihood mass is
bounded relative to ``tol`` and checked on every draw (:mod:`dpinfer.inference.window`); the
compiled engine's draws are exact beyond the window for additive noise (geometric tail
envelopes), so its window only sets the cost, and a window without exact tails (clamped or
truncated mechanisms) is checked as on the PyMC engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from pytensor.tensor.random.op import RandomVariable

from dpinfer.inference.latents import NotMarginalisableError, current_value, prior_support
from dpinfer.inference.planning.children import children_of, terms_depending_on
from dpinfer.inference.window import (
    Window,
    has_exact_tails,
    initial_half_width,
    make_window,
    tail_half_width,
    window_centres,
)
from dpinfer.mechanisms.records import ReleaseRecord


@dataclass
class CellsPlan:
    """A release of latent counts that is their only child: independent cells given the
    parameters (module docstring). What the engines read is data: ``mechanism`` (the per-cell
    law of the release), ``exact_tails``, and, once the window is set (:meth:`set_half_width`),
    ``window`` and ``start`` (the counts the chains start from, flattened)."""

    record: ReleaseRecord
    latent_name: str
    release_value: np.ndarray  # the latent's shape
    support: tuple  # (lowest, highest) supported count; None where open
    window: Window | None = None
    start: np.ndarray | None = None
    mechanism: object = field(init=False, repr=False)
    exact_tails: bool = field(init=False)

    kind: ClassVar[str] = "cells"

    def __post_init__(self):
        self.mechanism = self._cell_mechanism()
        self.exact_tails = has_exact_tails(self.mechanism)

    def _cell_mechanism(self):
        """The per-cell likelihood p(s_i | x_i) of the release."""
        return self.record.mechanism

    # --- windows ---------------------------------------------------------------------------
    def first_half_width(self, tol: float, compiled: bool) -> int:
        """The compiled engine's exact-tail window, or the smallest window whose every cell's
        tail bound is tol / (n_cells margin) of the likelihood at its centre (then checked on
        every draw; the prior rarely puts less than 1e-4 of its mass near the release)."""
        if compiled and self.exact_tails:
            return tail_half_width(self.mechanism)
        mech, s = self.mechanism, self.release_value
        log_peak = float(np.min(mech.log_likelihood(s, window_centres(s, self.support))))
        target = np.log(tol) - np.log(np.size(s)) - self._log_margin() + log_peak
        return initial_half_width(mech, s, log_target=target, support=self.support)

    def _log_margin(self) -> float:
        return float(np.log(1e4))

    def set_half_width(self, k: int) -> None:
        """The window of half-width ``k`` and the chains' start in it."""
        self.window = make_window(self.mechanism, self.release_value, self.support, k)
        self.start = self._start()

    def widened_half_width(self, bound: float, tol: float) -> int:
        """A half-width whose bound should come out 10 times below ``tol``: every bound here
        is proportional to the tail bound eta for small values, so shrink eta by
        tol / (10 bound); double it where the bound is infinite (a window without mass)."""
        k = self.window.half_width
        if not np.isfinite(bound):
            return 2 * k
        target = float(np.max(self.window.log_eta)) + np.log(tol / (10.0 * bound))
        return max(k + 1, initial_half_width(self.mechanism, self.release_value,
                                             log_target=target, support=self.support))

    def _start(self) -> np.ndarray:
        """The window centres."""
        return self.window.centres.reshape(-1)


@dataclass
class TotalsPlan(CellsPlan):
    """A release conditioned on one total or on disjoint group totals, the counts' only child
    (module docstring); ``targets``: each group's released (= true) total."""

    group_codes: np.ndarray | None = None  # the group of each cell, flattened
    targets: np.ndarray | None = field(init=False, default=None)

    kind: ClassVar[str] = "totals"

    def __post_init__(self):
        super().__post_init__()
        self.targets = np.rint(np.bincount(self.group_codes, weights=self.release_value.reshape(-1))
                               ).astype(np.int64)

    def _cell_mechanism(self):
        """The per-cell law of the release before conditioning (the base noise)."""
        return self.record.mechanism.base

    def _log_margin(self) -> float:
        # the bound is relative to the convolution V = P(S = t) prod_j L_j under the cells'
        # product law: 1 / P(S = t) ~ sqrt(2 pi n) sd / phi(z) for a group of n cells, z the
        # total's standardised distance, so the margin grows with sqrt(n) (inference notes §2)
        return float(np.log(1e4) + np.log(1e3) + 0.5 * np.log(np.max(np.bincount(self.group_codes))))

    def _start(self) -> np.ndarray:
        """Window centres moved onto the totals (:func:`point_on_totals`)."""
        return point_on_totals(self.window.centres.reshape(-1), self.group_codes, self.targets,
                               self.support, self.latent_name)


@dataclass
class ChildrenPlan(CellsPlan):
    """Counts with children besides their first release: windowed exact Gibbs updates of each
    cell given the rest, next to NUTS (PyMC engine). ``children``: the names of the model's
    variables whose log-probability depends on the counts (all discrete: their pmfs bound the
    neglected mass, :mod:`dpinfer.inference.planning.children`)."""

    children: tuple = ()

    kind: ClassVar[str] = "children"


def point_on_totals(centres, codes, targets, support, name: str) -> np.ndarray:
    """Counts near ``centres`` inside ``support`` whose group sums equal ``targets``: each
    group's surplus (or deficit) spread as evenly as the support allows, so that no cell moves
    by more than about surplus / cells (+1) beyond what its support forces.

    Why evenly: the chains start here, and a cell started far outside its window (it once took
    a whole group's surplus, hundreds of counts, when clipping the releases of many small cells
    at 0 raised the group's sum) drags its rate along and is then held at every sweep, its
    window holding almost none of its conditional law: a chain stuck at the start (seen on the
    30,000-cell benchmark)."""
    lower, upper = support
    lo = -np.inf if lower is None else lower
    hi = np.inf if upper is None else upper
    x = np.clip(np.asarray(centres, dtype=np.int64), lo, hi).astype(np.int64)
    for g, target in enumerate(targets):
        cells = np.flatnonzero(codes == g)
        cells = cells[np.argsort(-x[cells], kind="stable")]
        diff = int(x[cells].sum() - target)
        while diff != 0:
            sign = 1 if diff > 0 else -1
            room = np.minimum(x[cells] - lo if sign > 0 else hi - x[cells], abs(diff)).astype(np.int64)
            movable = cells[room > 0]
            if movable.size == 0:
                raise ValueError(
                    f"the released total {int(target)} of group {g} of {name!r} is outside "
                    f"what its cells can reach in their support {support}"
                )
            share = -(-abs(diff) // movable.size)  # ceil: one pass moves at least ...
            step = np.minimum(room[room > 0], share)
            step = np.diff(np.minimum(np.cumsum(step), abs(diff)), prepend=0)  # ... no more than diff
            x[movable] -= sign * step
            diff -= sign * int(step.sum())
    return x


def cells_plan(model, record: ReleaseRecord) -> CellsPlan:
    """A release of the counts themselves: a CellsPlan if it is their only child, else a
    ChildrenPlan (the further children enter the windowed Gibbs step)."""
    latent = record.latent
    name = getattr(latent, "name", None)
    if latent not in model.free_RVs:
        raise NotMarginalisableError(
            f"the true values of release {record.name!r} must be a free random variable of the "
            f"model (e.g. pm.Poisson('x', ...)); got {latent!r}"
        )
    node = latent.owner
    if not isinstance(node.op, RandomVariable) or node.op.ndim_supp != 0:
        raise NotMarginalisableError(
            f"latent {name!r} must be an elementwise distribution (Poisson, Binomial, "
            f"NegativeBinomial, ...); got {node.op}"
        )
    if not latent.type.dtype.startswith("int"):
        raise NotMarginalisableError(f"latent {name!r} must be integer valued (counts)")
    children, named = terms_depending_on(model, latent, exclude=(record.release_rv,))
    fields = dict(record=record, latent_name=name,
                  release_value=current_value(model.rvs_to_values[record.release_rv]),
                  support=prior_support(node))
    if not children and not named:
        return CellsPlan(**fields)
    return ChildrenPlan(**fields, children=tuple(v.name for v in children_of(model, latent, record.release_rv)))
