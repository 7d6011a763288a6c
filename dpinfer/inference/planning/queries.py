"""Releases of linear queries of latent counts: ``mech.observe(name, Q @ x, release)``.

The true values a release privatises may be any integer-linear function q = Q vec(x) of one
latent count vector x (vec in C order): cell counts, margins of a table, totals over groups.
``resolve_query`` finds x in the symbolic expression and recovers Q exactly by evaluating it
at 0 and at the unit vectors, then checks linearity on random integer vectors.
"""

from __future__ import annotations

import numpy as np
import pytensor
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors

from dpinfer._graphs import shape_of
from dpinfer.inference.latents import NotMarginalisableError
from dpinfer.mechanisms.records import latent_candidates

_LINEARITY_CHECKS = 3


def latent_of(model, true_values):
    """The free integer random variable whose values ``true_values`` is computed from."""
    found = latent_candidates(model, true_values)
    if len(found) != 1:
        names = [v.name for v in found]
        raise NotMarginalisableError(
            "the true values of a release must be latent counts x or a linear query Q @ x of "
            f"one latent count vector; found latent counts {names}"
        )
    return found[0]


def resolve_query(model, true_values):
    """(latent, Q) with true_values = Q @ vec(latent) exactly; Q is None when the release is
    of the latent counts themselves."""
    latent = latent_of(model, true_values)
    if true_values is latent:
        return latent, None
    placeholder = latent.type()
    expr = clone_replace(true_values, {latent: placeholder}).reshape((-1,))
    upstream = set(ancestors([true_values], blockers=[latent]))
    others = [v for v in model.basic_RVs if v is not latent and v in upstream]
    if others:
        raise NotMarginalisableError(
            f"a release of a query of {latent.name!r} must be a fixed integer-linear function "
            f"of it; it also depends on {[getattr(v, 'name', v) for v in others]}"
        )
    shape = shape_of(latent)
    d = int(np.prod(shape))
    f = pytensor.function([placeholder], expr)
    dtype = latent.type.dtype
    at_zero = np.asarray(f(np.zeros(shape, dtype=dtype)))
    basis = np.eye(d, dtype=dtype).reshape((d, *shape))
    columns = np.stack([np.asarray(f(b)) for b in basis], axis=1) - at_zero[:, None]
    rng = np.random.default_rng(0)
    linear = np.allclose(at_zero, 0) and np.allclose(columns, np.round(columns))
    for _ in range(_LINEARITY_CHECKS):
        if not linear:
            break
        v = rng.integers(0, 50, size=d)
        linear = np.allclose(f(v.reshape(shape).astype(dtype)), columns @ v)
    if not linear:
        raise NotMarginalisableError(
            f"the true values of the release are not an integer-linear function of {latent.name!r} "
            "(expected Q @ x with an integer matrix Q and no offset)"
        )
    q = np.round(columns).astype(np.int64)
    if q.shape[0] == d and np.array_equal(q, np.eye(d, dtype=np.int64)):
        return latent, None
    return latent, q

