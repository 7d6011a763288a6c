"""Windowed exact Gibbs updates for latent counts that have children besides their release.

When a latent count vector x has other children (say y_i ~ Binomial(x_i, p)), it cannot be
summed out of its release alone. Each cell is then updated from its full conditional

    p(x_i | rest) ∝ p(x_i | theta) p(s_i | x_i) prod_c p(c | x_i, ...),

enumerated exactly over the window W_i = {c_i - k, ..., c_i + k} (c_i = s_i clipped to the
counts' support), every candidate scored by the model's own log-probability of x, its
release and its children, vectorised over the window. The neglected conditional mass is
bounded as in inference notes §1. Write the blanket as

    B(x) = sum_j [log p(x_j | theta) + log p(s_j | x_j)] + sum_c log p(c | x)

(counts and release are elementwise by construction). All children are discrete, so every
child term is <= 0, and for x_i outside W_i, p(s_i | x_i) <= eta_i; summing p(x_i | theta)
over x_i gives at most 1, hence

    sum_{x_i not in W_i} exp B(x) <= eta_i exp(sum_{j != i} [log p(x_j | theta) + log p(s_j | x_j)]) = eta_i A_i,

a relative error of at most eta_i A_i / Z_i for cell i, Z_i = sum_{x_i in W_i} exp B(x). The
sum over cells of log1p(eta_i A_i / Z_i) is recorded at every step.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pymc.pytensorf import compile
from pymc.step_methods.compound import BlockedStep, Competence
from pymc.util import get_random_generator
from pytensor.graph.replace import vectorize_graph

from dpinfer.inference.window import Window


class WindowedCountGibbs(BlockedStep):
    """Exact Gibbs sweep over the cells of one latent count vector, each cell enumerated over
    its window. Never auto-assigned; :func:`dpinfer.sample` builds it."""

    name = "windowed_count_gibbs"
    stats_dtypes_shapes = {"neglected_mass_bound": (float, [])}

    def __init__(self, vars, *, model, release_rv, children: list, window: Window,
                 support=(None, None), rng=None):
        [latent] = vars
        self.model = model
        self.vars = [model.rvs_to_values[latent]]
        self.latent_name = self.vars[0].name
        self.window = window
        lower, upper = support
        self.support = (-np.inf if lower is None else lower, np.inf if upper is None else upper)
        self.rng = get_random_generator(rng)
        children = [model[name] for name in children]  # the plan's (checked when planned)
        own_terms = model.logp(vars=[latent, release_rv], jacobian=False, sum=False)
        child_terms = model.logp(vars=children, jacobian=False, sum=False) if children else []
        own = pt.add(*own_terms)  # per cell: log p(x_j | theta) + log p(s_j | x_j)
        blanket = pt.sum(own) + pt.sum([pt.sum(t) for t in child_terms])
        value = self.vars[0]
        batch = pt.tensor("candidates", dtype=value.type.dtype, shape=(None, *value.type.shape))
        batched = vectorize_graph([blanket, own], replace={value: batch})
        others = [v for v in model.value_vars if v is not value]
        self._others = [v.name for v in others]
        # pymc's compile turns parameter checks into -inf (a candidate count can be an
        # invalid parameter of a child, e.g. Binomial(n=x) with x < 0).
        self._logp_batch = compile([batch, *others], batched, on_unused_input="ignore")
        # Per-cell scores from the terms shaped like the counts (the counts' own, the
        # release's, elementwise children's), for a start point only.
        aligned = [own, *[t for t in child_terms if t.type.ndim == value.type.ndim]]
        cell_scores = vectorize_graph(pt.add(*aligned), replace={value: batch})
        self._cell_scores = compile([batch, *others], cell_scores, on_unused_input="ignore")

    def _evaluate(self, candidates: np.ndarray, others) -> tuple[np.ndarray, np.ndarray]:
        """Blanket log-probability of each candidate vector and its per-cell own terms. PyMC's
        parameter checks act on a whole batch at once, so a batch that comes out all -inf is
        scored one by one."""
        lw, own = self._logp_batch(candidates, *others)
        if not np.any(np.isfinite(lw)):
            rows = [self._logp_batch(c[None], *others) for c in candidates]
            lw = np.concatenate([r[0] for r in rows])
            own = np.concatenate([r[1] for r in rows])
        return lw, own

    def step(self, point):
        x = np.array(point[self.latent_name], dtype=np.int64)
        flat = x.reshape(-1)
        others = [point[n] for n in self._others]
        centres = self.window.centres.reshape(-1)
        log_eta = self.window.log_eta.reshape(-1)
        bound = 0.0
        for i in range(flat.size):
            values = centres[i] + self.window.offsets
            values = values[(values >= self.support[0]) & (values <= self.support[1])]
            candidates = np.repeat(flat[None, :], values.size, axis=0)
            candidates[:, i] = values
            lw, own = self._evaluate(candidates.reshape((values.size, *x.shape)), others)
            log_z = np.logaddexp.reduce(lw)
            if not np.isfinite(log_z):  # the window holds no conditional mass: keep x_i
                bound = np.inf
                continue
            # log A_i: the other cells' own terms, the same in every row (only x_i varies)
            log_a = np.sum(np.delete(own[int(np.argmax(lw))].reshape(-1), i))
            bound += np.log1p(np.exp(min(log_eta[i] + log_a - log_z, 700.0)))
            cdf = np.cumsum(np.exp(lw - log_z))
            flat[i] = values[min(np.searchsorted(cdf, self.rng.random() * cdf[-1]), values.size - 1)]
        new = dict(point)
        new[self.latent_name] = flat.reshape(x.shape)
        return new, [{"neglected_mass_bound": float(np.expm1(bound))}]

    def initial_value(self, point) -> np.ndarray:
        """A start for the counts where the model's default one (e.g. the prior mean) can be
        impossible (a Binomial child y > x): each cell's best window value by the terms shaped
        like the counts, every cell moved together so that no other cell blocks the score."""
        value_shape = np.shape(point[self.latent_name])
        rows = self.window.centres[None, ...] + self.window.offsets.reshape((-1,) + (1,) * len(value_shape))
        rows = np.clip(rows, self.support[0], self.support[1]).astype(np.int64)
        scores = self._cell_scores(rows, *[point[n] for n in self._others])
        best = np.take_along_axis(rows, np.argmax(scores, axis=0)[None, ...], axis=0)[0]
        return np.broadcast_to(best, value_shape).copy()

    @staticmethod
    def competence(var, has_grad):
        return Competence.INCOMPATIBLE
