"""The children of latent counts besides their release (further releases, Binomial thinnings,
...): which terms depend on the counts, and whether the windowed Gibbs step can take them
(their pmfs must be <= 1 for its bound on the neglected mass:
:mod:`dpinfer.inference.engines.pymc.gibbs`)."""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.graph.traversal import ancestors


class ContinuousChildError(ValueError):
    """A latent count whose children include a continuous variable or a Potential."""


def terms_depending_on(model, latent, exclude=()) -> tuple[list, list]:
    """(random variables, other named terms) of ``model`` whose log-probability or value
    depends on the value of ``latent``: its children (not grandchildren, which depend on it
    only through a child), Deterministics and Potentials computed from it.

    A variable's log-probability depends on the latent's value exactly when its distribution's
    parameters do once every random variable in them is replaced by its value (a grandchild's
    parameters then hold the child's value, not the latent); one replacement serves all."""
    value = model.rvs_to_values[latent]
    candidates = [v for v in model.basic_RVs if v is not latent and v not in exclude]
    inputs = [[i for i in v.owner.inputs if isinstance(i.type, pt.TensorType)] for v in candidates]
    params = model.replace_rvs_by_values([i for group in inputs for i in group])
    rvs, k = [], 0
    for v, group in zip(candidates, inputs):
        if value in ancestors(params[k:k + len(group)]):
            rvs.append(v)
        k += len(group)
    named = model.deterministics + model.potentials
    others = [v for v, t in zip(named, model.replace_rvs_by_values(named)) if value in ancestors([t])]
    return rvs, others


def children_of(model, latent, release_rv) -> list:
    """Model variables whose log-probability term depends on ``latent`` (besides its
    release). Raises if any is continuous or a Potential: the window bound needs pmfs <= 1."""
    children, others = terms_depending_on(model, latent, exclude=(release_rv,))
    for v in children:
        if not v.type.dtype.startswith(("int", "uint", "bool")):
            raise ContinuousChildError(
                f"latent {latent.name!r} has the continuous child {v.name!r}; the windowed Gibbs "
                "step needs discrete children (pmf values <= 1) to bound the neglected mass"
            )
    for pot in others:
        if pot in model.potentials:
            raise ContinuousChildError(
                f"latent {latent.name!r} enters the Potential {pot.name!r}; its neglected mass "
                "cannot be bounded"
            )
    return children
