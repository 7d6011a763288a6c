"""The fibre step of the PyMC engine: exact Gibbs sweeps along Markov moves of the fibre for
every fibre latent of a model (:class:`~dpinfer.inference.planning.fibre.FibrePlan`; the
method is in :mod:`dpinfer.inference.planning.fibre`'s docstring and
:mod:`dpinfer.lattice.fibre_gibbs`). Per sweep, the prior's log-pmf table over every cell's
window is one compiled call; the releases' tables are computed once per release. A release
conditioned on non-negativity whose normaliser varies by more than ``tol`` over the window
is corrected by Metropolis-Hastings on palindromic blocks of line updates."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pymc.logprob.abstract import _logprob_helper
from pymc.pytensorf import compile
from pymc.step_methods.compound import BlockedStep, Competence
from pymc.util import get_random_generator

from dpinfer.lattice.class_convolution import NormaliserTracker
from dpinfer.lattice.fibre_gibbs import corrected_gibbs_sweep, gibbs_sweeps


class FibreGibbs(BlockedStep):
    """Exact Gibbs sweeps along Markov moves for every fibre latent of a model. Never
    auto-assigned; :func:`dpinfer.sample` builds it."""

    name = "fibre_gibbs"
    stats_dtypes_shapes = {
        "fibre_neglected_mass_bound": (float, []),
        "fibre_moves_changed": (float, []),
        "fibre_block_acceptance": (float, []),
    }

    def __init__(self, vars, *, model, plans: list, rng=None):
        self.model = model
        self.vars = [model.rvs_to_values[model[p.latent_name]] for p in plans]
        names = {v.name for v in self.vars}
        others = [v for v in model.value_vars if v.name not in names]
        self._others = [v.name for v in others]
        self.rng = get_random_generator(rng)
        # log p(x_i = v | theta) on a grid of candidate counts given as an input, so the
        # compiled function serves any release (the box moves with it)
        self._prior_tables = []
        for plan in plans:
            node = model[plan.latent_name].owner
            grid = pt.tensor("grid", dtype="int64", shape=(None, *plan.shape))
            _, prior = node.op(*node.op.dist_params(node), rng=pt.random.rng(), return_next_rng=True)
            table = pt.broadcast_to(_logprob_helper(prior, grid), grid.shape)
            [table] = model.replace_rvs_by_values([table])
            table = table.reshape((grid.shape[0], -1)).T
            self._prior_tables.append(compile([grid, *others], table, on_unused_input="ignore"))
        self.update(plans)

    def update(self, plans: list) -> None:
        """Take the plans' current releases (their boxes, release and query tables and moves);
        the compiled prior tables are kept."""
        self.plans = plans
        self._grids = [(plan.lo[None, :] + np.arange(plan.width)[:, None]).reshape((plan.width, *plan.shape))
                       for plan in plans]
        self._trackers = [None] * len(plans)

    def step(self, point):
        new = dict(point)
        others = [point[n] for n in self._others]
        worst, changed, accepted = 0.0, [], []
        parts = zip(self.plans, self._prior_tables, self._grids)
        for j, (plan, prior_table, grid) in enumerate(parts):
            lo, log_eta_cells, moves, queries = plan.lo, plan.log_eta, plan.move_plan, plan.query_rows
            table = prior_table(grid, *others) + plan.release_table
            x = np.asarray(point[plan.latent_name], dtype=np.int64).reshape(-1)
            n_moves = min(len(moves), plan.moves_per_cell * plan.n_cells)
            if plan.normaliser_corrected:
                x, bound, frac, acc = corrected_gibbs_sweep(
                    x, lo, table, log_eta_cells, moves, queries, moves_per_sweep=n_moves,
                    block_moves=max(10, plan.normaliser_block_moves_per_cell * plan.n_cells),
                    tracker=self._tracker(j, x), rng=self.rng, norm=plan.norm_factor,
                )
                accepted.append(acc)
            else:
                x, bound, frac = gibbs_sweeps(
                    x, lo, table, log_eta_cells, moves, queries, n_sweeps=1,
                    moves_per_sweep=n_moves, rng=self.rng, norm=plan.norm_factor,
                )
            new[plan.latent_name] = x.reshape(plan.shape)
            worst = max(worst, bound)
            changed.append(frac)
        return new, [{"fibre_neglected_mass_bound": worst, "fibre_moves_changed": float(np.mean(changed)),
                      "fibre_block_acceptance": float(np.mean(accepted)) if accepted else 1.0}]

    def _tracker(self, j: int, x: np.ndarray) -> NormaliserTracker:
        """The normaliser tracker of plan j, rebuilt when the chain's state is not its own (a
        new chain in this process)."""
        tracker = self._trackers[j]
        if tracker is None or not np.array_equal(tracker.x, x):
            tracker = NormaliserTracker(self.plans[j].normaliser.class_lattice(), x)
            self._trackers[j] = tracker
        return tracker

    @staticmethod
    def competence(var, has_grad):
        return Competence.INCOMPATIBLE
