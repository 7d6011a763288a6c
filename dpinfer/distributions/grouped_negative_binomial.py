r"""Counts of leaves in groups whose group-by-cell rate is gamma-distributed, integrated out.

The law (a Poisson-gamma hierarchy with a Dirichlet split inside each group): leaves l in
groups g(l), cells c, leaf means mu[l, c] > 0, their group means M[g, c] = sum of mu[l, c]
over the group's leaves, pi[l, c] = mu[l, c] / M[g(l), c];

    lambda[g, c] ~ Gamma(shape alpha_g[g, c], mean M[g, c])      (the group's rate),
    rho[., c] | g ~ Dirichlet(A[g, c] pi[l, c] over the group's leaves)   (its split),
    x[l, c] ~ Poisson(lambda[g(l), c] rho[l, c]),

with lambda and rho summed out: each group's sum S[g, c] ~ NegativeBinomial(M, alpha_g) and
its split among the leaves Dirichlet-multinomial(S; A pi). alpha_g sets how far a group's
cell rate strays from its mean (relative sd 1/sqrt(alpha_g)); A how unevenly a group's count
is shared among its leaves beyond their means (a leaf's relative sd about
sqrt((1 - pi) / (pi (A + 1)))).

How it is written for PyMC (and why the compiled engine draws it exactly): by the gamma
additivity, independent x[l, c] ~ NegativeBinomial(mu[l, c], A pi[l, c]) have group sums
NB(M, A) and the same Dirichlet-multinomial split; so

    p(x) = prod_{l,c} NB(x[l, c]; mu, A pi)  x  prod_{g,c} NB(S[g, c]; M, alpha_g) / NB(S[g, c]; M, A),

independent negative binomial counts (the counts' variable) times a factor of each group's
sum (a ``pm.Potential``). When the counts are latent behind nested measurements
(:class:`~dpinfer.mechanisms.nested.NestedMeasurements`, whose tree has each group as an
area), dpinfer's compiled engine puts the factor on the group's area in its sum-tree draws
(:meth:`~dpinfer.lattice.nested.terms.TermTables.add_group_mixing`): the counts move exactly
given the parameters with the group rates lambda integrated out, so no rate per group and
cell waits on its counts (data augmentation) and NUTS has no such parameters. (When alpha_g
= A the factor is 1: independent negative binomial counts.) Forward simulation
(``pm.sample_prior_predictive``) ignores Potentials and so draws alpha_g = A; use
:func:`draw_grouped_negative_binomial`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GroupedNegativeBinomial", "draw_grouped_negative_binomial", "group_mixing_of"]

_REGISTRY = "_dpinfer_group_mixing"


@dataclass(frozen=True)
class GroupMixing:
    """What the engine needs of a :func:`GroupedNegativeBinomial`: the counts' and the
    Potential's names, each leaf's group (n_leaves,), and the name of the Deterministic
    (G, n_cells, 3) holding (alpha_g, A, M) per group and cell."""

    counts: str
    potential: str
    group: np.ndarray
    parameters: str

    @property
    def n_groups(self) -> int:
        return int(self.group.max()) + 1


def GroupedNegativeBinomial(name: str, mu, alpha, group_alpha, group, *, dims=None, model=None):
    """The counts x (n_leaves, n_cells) of the module docstring, as a PyMC variable ``name``
    (negative binomial, leaf shape A pi) and the Potential ``{name}_group_mixing``.

    ``mu``: leaf means (n_leaves, n_cells), positive; ``alpha``: the split's concentration A,
    ``group_alpha``: the group rates' shape alpha_g, each positive and broadcastable to
    (n_groups, n_cells); ``group``: each leaf's group, integers 0 .. n_groups - 1, every one
    used. Returns the counts' variable."""
    import pymc as pm
    import pytensor.tensor as pt

    model = pm.modelcontext(model)
    group = np.asarray(group)
    if group.ndim != 1 or group.size == 0 or not np.issubdtype(group.dtype, np.integer):
        raise ValueError(f"group must be a non-empty 1-d array of integer group indices, got {group!r}")
    n_groups = int(group.max()) + 1
    missing = np.setdiff1d(np.arange(n_groups), group)
    if group.min() < 0 or missing.size:
        raise ValueError(f"group must take every value 0 .. {n_groups - 1} and no other (missing "
                         f"{missing[:5].tolist()}, smallest {int(group.min())})")
    mu = pt.as_tensor(mu)
    if mu.ndim != 2:
        raise ValueError(f"mu must be a (n_leaves, n_cells) matrix of leaf means, got {mu.ndim} dimensions")
    shape = (n_groups, mu.shape[1])
    group_mean = pt.inc_subtensor(pt.zeros(shape)[group], mu)
    leaf_alpha = pt.broadcast_to(pt.as_tensor(alpha, dtype="float64"), shape)
    total_alpha = pt.broadcast_to(pt.as_tensor(group_alpha, dtype="float64"), shape)
    # a Deterministic (a named variable of the model, which survives its copies) that the
    # compiled engine reads and leaves out of the trace
    parameters = pm.Deterministic(f"{name}_group_mixing_parameters",
                                  pt.stack([total_alpha, leaf_alpha, group_mean], axis=-1))
    a, A, M = parameters[..., 0], parameters[..., 1], parameters[..., 2]
    counts = pm.NegativeBinomial(name, mu=mu, alpha=A[group] * mu / M[group], dims=dims)
    S = pt.inc_subtensor(pt.zeros(shape, dtype="int64")[group], counts)
    factor = (pm.logp(pm.NegativeBinomial.dist(mu=M, alpha=a), S)
              - pm.logp(pm.NegativeBinomial.dist(mu=M, alpha=A), S))
    potential = pm.Potential(f"{name}_group_mixing", factor.sum())
    registry = model.__dict__.setdefault(_REGISTRY, {})
    registry[potential.name] = GroupMixing(name, potential.name, group.astype(np.int64), parameters.name)
    return counts


def group_mixing_of(model) -> dict:
    """Potential name -> :class:`GroupMixing` of the model's :func:`GroupedNegativeBinomial`s."""
    return dict(model.__dict__.get(_REGISTRY, {}))


def draw_grouped_negative_binomial(mu, alpha, group_alpha, group, rng: np.random.Generator) -> np.ndarray:
    """One exact draw of the counts (module docstring's hierarchy), for simulation: each
    group's rate from its gamma law, the split from its Dirichlet, the counts Poisson."""
    mu = np.asarray(mu, dtype=float)
    group = np.asarray(group, dtype=np.int64)
    n_groups, n_cells = int(group.max()) + 1, mu.shape[1]
    M = np.zeros((n_groups, n_cells))
    np.add.at(M, group, mu)
    A = np.broadcast_to(np.asarray(alpha, dtype=float), M.shape)
    a = np.broadcast_to(np.asarray(group_alpha, dtype=float), M.shape)
    rate = rng.gamma(a, M / a)
    weights = rng.gamma(A[group] * mu / M[group])  # Dirichlet by normalised gammas
    share = np.zeros_like(M)
    np.add.at(share, group, weights)
    rho = weights / share[group]
    return rng.poisson(rate[group] * rho)
