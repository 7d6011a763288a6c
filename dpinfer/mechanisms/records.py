"""The record that ``Mechanism.observe`` leaves on a PyMC model for :func:`dpinfer.sample`.

This is the interface between the two sides: mechanisms write it (``observe``), the inference
engine reads it (``releases_of``). It lives with the mechanisms so that they never import the
inference layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytensor.graph.traversal import ancestors

_ATTRIBUTE = "_dpinfer_releases"


@dataclass(frozen=True)
class ReleaseRecord:
    """One observed release: its model variable, the symbolic true values it privatises, and
    the mechanism that made it."""

    name: str
    release_rv: Any
    latent: Any
    mechanism: Any


def record_release(model, *, name, release_rv, latent, mechanism) -> ReleaseRecord:
    record = ReleaseRecord(name=name, release_rv=release_rv, latent=latent, mechanism=mechanism)
    records = getattr(model, _ATTRIBUTE, None)
    if records is None:
        records = []
        setattr(model, _ATTRIBUTE, records)
    records.append(record)
    return record


def releases_of(model) -> list[ReleaseRecord]:
    """The releases recorded on ``model`` (empty if none)."""
    return list(getattr(model, _ATTRIBUTE, []))


def closest_free_variables(model, true_values) -> list:
    """The free random variables ``true_values`` is computed from, keeping only the closest
    (not through another free variable): [x] for x itself or a query Q @ x, also where x's
    own parameters are free variables (an integer x can also sit behind another, x -> y -> Q y:
    then [y])."""
    if true_values in model.free_RVs:
        return [true_values]
    upstream = set(ancestors([true_values]))
    found = [v for v in model.free_RVs if v in upstream]
    return [v for v in found if not any(v in ancestors([w]) for w in found if w is not v)]


def check_latent_type(model, true_values, mechanism, name: str) -> None:
    """Refuse a discrete mechanism (whole-number releases of counts) on true values computed
    from a continuous latent: its likelihood is a pmf over whole numbers, meaningless for a
    real-valued latent, and the engines would treat the latent as counts."""
    if not getattr(mechanism, "discrete", False) or not hasattr(true_values, "owner"):
        return
    continuous = [v for v in closest_free_variables(model, true_values)
                  if not v.type.dtype.startswith(("int", "uint"))]
    if continuous:
        names = [getattr(v, "name", str(v)) for v in continuous]
        raise ValueError(
            f"release {name!r}: {type(mechanism).__name__} is a discrete mechanism (it releases "
            f"whole numbers of counts), but its true values depend on the continuous latent "
            f"{names}; give the latent an integer distribution (Poisson, Binomial, ...) or use "
            "a continuous mechanism (Laplace, Gaussian) for a real-valued statistic"
        )


def latent_candidates(model, true_values) -> list:
    """The latent counts behind ``true_values``: its closest free variables
    (:func:`closest_free_variables`) that are integer valued; one element for a release of
    latent counts x or of a query Q @ x."""
    return [v for v in closest_free_variables(model, true_values)
            if v.type.dtype.startswith(("int", "uint"))]
