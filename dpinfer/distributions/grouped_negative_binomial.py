r"""Counts of leaves in nested groups whose group-by-cell rates are gamma-distributed and
Dirichlet-split down the levels, all integrated out.

The law (a Poisson-gamma hierarchy with Dirichlet splits, one level per grouping): leaves l,
cells c, leaf means mu[l, c] > 0; groupings g_1 (finest) .. g_K (coarsest), each group of level
k + 1 a union of groups of level k (level 0: the leaves); M_k[h, c] = the sum of mu[l, c] over
the leaves of group h of level k (M_0 = mu);

    lambda_K[h, c] ~ Gamma(shape alpha_top[h, c], mean M_K[h, c])     (a coarsest group's rate),
    lambda_{k-1}[., c] | lambda_k[h, c] = lambda_k[h, c] x Dirichlet(A_k[h, c] M_{k-1}[j, c] / M_k[h, c]
                                             over the children j of h)   (k = K .. 1, its split),
    x[l, c] ~ Poisson(lambda_0[l, c]),

with every lambda summed out: each coarsest group's sum S_K ~ NegativeBinomial(M_K, alpha_top)
and each group's split among its children Dirichlet-multinomial(S_k; A_k M_{k-1} / M_k). A_k
sets how unevenly a level-k group's count is shared among its children beyond their means (a
child with share pi of the mean has relative sd about sqrt((1 - pi) / (pi (A_k + 1))) of the
group's rate); alpha_top how far a coarsest group's rate strays from its mean (relative sd
1/sqrt(alpha_top)). With one grouping (K = 1) this is a gamma rate per group and cell (shape
alpha_top = ``group_alpha``) split among its leaves (concentration A_1 = ``alpha``).

How it is written for PyMC (and why the compiled engine draws it exactly): by the gamma
additivity, independent x[l, c] ~ NegativeBinomial(mu, A_1 mu / M_1) have level-1 sums
NB(M_1, A_1) and the same Dirichlet-multinomial split; the law of a level-k group's sum given
its children's is changed from NB(M_k, A_k) (what the level below implies) to what the level
above needs, NB(M_k, A_{k+1} M_k / M_{k+1}) (NB(M_K, alpha_top) at the top), by a factor of
that sum alone:

    p(x) = prod_{l,c} NB(x[l, c]; mu, A_1 mu / M_1)
           x  prod_{k=1..K} prod_{h,c} NB(S_k[h, c]; M_k, a_k) / NB(S_k[h, c]; M_k, A_k),
    a_k = A_{k+1} M_k / M_{k+1}[parent] (k < K),  a_K = alpha_top,

independent negative binomial counts (the counts' variable) times a factor of each group's
sum (one ``pm.Potential``). Each factor, times everything below it, is the group sum's law
given its parent's rate, so the product is the hierarchy's law (tested against enumeration of
the generative law). When the counts are latent behind nested measurements
(:class:`~dpinfer.mechanisms.nested.NestedMeasurements`, whose tree has each group as an
area), dpinfer's compiled engine puts each factor on its group's area in its sum-tree draws
(:meth:`~dpinfer.lattice.nested.terms.TermTables.add_group_mixing`): the counts move exactly
given the parameters with every rate integrated out, so no rate per group and cell waits on
its counts (data augmentation) and NUTS has no such parameters. Forward simulation
(``pm.sample_prior_predictive``) ignores Potentials; use :func:`draw_grouped_negative_binomial`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GroupedNegativeBinomial", "draw_grouped_negative_binomial", "group_mixing_of"]

_REGISTRY = "_dpinfer_group_mixing"


@dataclass(frozen=True)
class GroupMixing:
    """What the engine needs of a :func:`GroupedNegativeBinomial`: the counts' and the
    Potential's names, each leaf's group at each level (``groups``, finest first, each
    (n_leaves,)), and the name of the Deterministic (n_groups, n_cells, 3) holding each
    group's factor's (a_k, A_k, M_k) per cell, the levels' groups one after another."""

    counts: str
    potential: str
    groups: tuple
    parameters: str

    @property
    def level_sizes(self) -> list[int]:
        return [int(g.max()) + 1 for g in self.groups]

    @property
    def n_groups(self) -> int:
        return sum(self.level_sizes)

    @property
    def leaf_group(self) -> np.ndarray:
        """Each leaf's finest group (n_leaves,)."""
        return self.groups[0]

    @property
    def group_parent(self) -> np.ndarray:
        """Each group's parent group in the flat numbering of ``parameters`` (n_groups,), -1 at
        the coarsest level."""
        return _flat_parents(self.groups)


def _offsets(groups) -> np.ndarray:
    """Where each level's groups start in the flat numbering (one entry per level, then the total)."""
    return np.cumsum([0] + [int(g.max()) + 1 for g in groups])


def _flat_parents(groups) -> np.ndarray:
    offsets = _offsets(groups)
    parent = np.full(offsets[-1], -1, dtype=np.int64)
    for k in range(len(groups) - 1):
        parent[offsets[k]:offsets[k + 1]] = offsets[k + 1] + _level_parents(groups[k], groups[k + 1])
    return parent


def _checked_groups(group) -> tuple:
    """The groupings as a tuple of int64 arrays (finest first), each taking every value
    0 .. n - 1, each level's groups inside one group of the next."""
    levels = [group] if np.ndim(group) == 1 and not isinstance(group, (list, tuple)) else list(group)
    if levels and np.ndim(levels[0]) == 0:
        levels = [np.asarray(levels)]
    out = []
    for k, g in enumerate(levels):
        g = np.asarray(g)
        what = "group" if len(levels) == 1 else f"group[{k}]"
        if g.ndim != 1 or g.size == 0 or not np.issubdtype(g.dtype, np.integer):
            raise ValueError(f"{what} must be a non-empty 1-d array of integer group indices, got {g!r}")
        n = int(g.max()) + 1
        missing = np.setdiff1d(np.arange(n), g)
        if g.min() < 0 or missing.size:
            raise ValueError(f"{what} must take every value 0 .. {n - 1} and no other (missing "
                             f"{missing[:5].tolist()}, smallest {int(g.min())})")
        if out and g.size != out[0].size:
            raise ValueError(f"{what} has {g.size} entries, group[0] {out[0].size}: one per leaf at every level")
        if out:
            parents = np.full(int(out[-1].max()) + 1, -1)
            parents[out[-1]] = g
            split = np.flatnonzero(parents[out[-1]] != g)
            if split.size:
                raise ValueError(f"{what} must be coarser than group[{k - 1}]: group {int(out[-1][split[0]])} of "
                                 f"group[{k - 1}] has leaves in different groups of {what}")
        out.append(g.astype(np.int64))
    if not out:
        raise ValueError("group must be a grouping of the leaves (or a list of nested ones), got an empty list")
    return tuple(out)


def GroupedNegativeBinomial(name: str, mu, alpha, group_alpha, group, *, dims=None, model=None):
    """The counts x (n_leaves, n_cells) of the module docstring, as a PyMC variable ``name``
    (negative binomial, leaf shape A_1 mu / M_1) and the Potential ``{name}_group_mixing``.

    ``mu``: leaf means (n_leaves, n_cells), positive. ``group``: each leaf's group, integers
    0 .. n_groups - 1, every one used; or a list of K such groupings, finest first, each
    level's groups inside the next's (e.g. [tract of each block group, county of each block
    group]). ``alpha``: the split concentrations A_1 .. A_K, one per grouping (a single value
    with one grouping), A_k broadcastable to (groups of level k, n_cells); ``group_alpha``: the
    coarsest groups' rate shape alpha_top, broadcastable to (coarsest groups, n_cells). All
    positive. Returns the counts' variable."""
    import pymc as pm
    import pytensor.tensor as pt

    model = pm.modelcontext(model)
    groups = _checked_groups(group)
    K = len(groups)
    splits = list(alpha) if K > 1 else [alpha]
    if len(splits) != K:
        raise ValueError(f"alpha must give one split concentration per grouping ({K}), got {len(splits)}")
    mu = pt.as_tensor(mu)
    if mu.ndim != 2:
        raise ValueError(f"mu must be a (n_leaves, n_cells) matrix of leaf means, got {mu.ndim} dimensions")
    n_cells = mu.shape[1]
    means = [pt.inc_subtensor(pt.zeros((int(g.max()) + 1, n_cells))[g], mu) for g in groups]
    split = [pt.broadcast_to(pt.as_tensor(a, dtype="float64"), M.shape) for a, M in zip(splits, means)]
    top = pt.broadcast_to(pt.as_tensor(group_alpha, dtype="float64"), means[-1].shape)
    parent = [None] + [_level_parents(groups[k - 1], groups[k]) for k in range(1, K)]
    rows = []
    for k in range(K):  # level k + 1 of the docstring: its factor's new shape, old shape, mean
        new = top if k == K - 1 else split[k + 1][parent[k + 1]] * means[k] / means[k + 1][parent[k + 1]]
        rows.append(pt.stack([new, split[k], means[k]], axis=-1))
    # a Deterministic (a named variable of the model, which survives its copies) that the
    # compiled engine reads and leaves out of the trace
    parameters = pm.Deterministic(f"{name}_group_mixing_parameters", pt.concatenate(rows, axis=0))
    a, A, M = parameters[..., 0], parameters[..., 1], parameters[..., 2]
    g0 = groups[0]
    counts = pm.NegativeBinomial(name, mu=mu, alpha=split[0][g0] * mu / means[0][g0], dims=dims)
    flat = np.concatenate([g + o for g, o in zip(groups, _offsets(groups))])
    S = pt.inc_subtensor(pt.zeros(a.shape, dtype="int64")[flat],
                         pt.concatenate([counts] * K, axis=0))
    factor = (pm.logp(pm.NegativeBinomial.dist(mu=M, alpha=a), S)
              - pm.logp(pm.NegativeBinomial.dist(mu=M, alpha=A), S))
    potential = pm.Potential(f"{name}_group_mixing", factor.sum())
    registry = model.__dict__.setdefault(_REGISTRY, {})
    registry[potential.name] = GroupMixing(name, potential.name, groups, parameters.name)
    return counts


def _level_parents(finer: np.ndarray, coarser: np.ndarray) -> np.ndarray:
    """Each group of ``finer``'s group in ``coarser`` (both per leaf)."""
    parent = np.empty(int(finer.max()) + 1, dtype=np.int64)
    parent[finer] = coarser
    return parent


def group_mixing_of(model) -> dict:
    """Potential name -> :class:`GroupMixing` of the model's :func:`GroupedNegativeBinomial`s."""
    return dict(model.__dict__.get(_REGISTRY, {}))


def draw_grouped_negative_binomial(mu, alpha, group_alpha, group, rng: np.random.Generator) -> np.ndarray:
    """One exact draw of the counts (module docstring's hierarchy), for simulation: the
    coarsest groups' rates from their gamma law, each split down the levels by its Dirichlet
    (normalised gammas), the counts Poisson. Arguments as :func:`GroupedNegativeBinomial`'s."""
    mu = np.asarray(mu, dtype=float)
    groups = _checked_groups(group)
    K, n_cells = len(groups), mu.shape[1]
    splits = list(alpha) if K > 1 else [alpha]
    means = []
    for g in groups:
        M = np.zeros((int(g.max()) + 1, n_cells))
        np.add.at(M, g, mu)
        means.append(M)
    rate = rng.gamma(np.broadcast_to(np.asarray(group_alpha, dtype=float), means[-1].shape),
                     means[-1] / np.asarray(group_alpha, dtype=float))
    for k in range(K - 1, -1, -1):  # split level k + 1's rates among its children
        child = groups[k - 1] if k else np.arange(mu.shape[0])
        child_mean = means[k - 1] if k else mu
        up = _level_parents(child, groups[k]) if k else groups[0]
        A = np.broadcast_to(np.asarray(splits[k], dtype=float), means[k].shape)
        weights = rng.gamma(A[up] * child_mean / means[k][up])
        share = np.zeros_like(means[k])
        np.add.at(share, up, weights)
        rate = rate[up] * weights / share[up]
    return rng.poisson(rate)
