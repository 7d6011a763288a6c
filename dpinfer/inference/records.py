"""The record that ``Mechanism.observe`` leaves on a PyMC model for :func:`dpinfer.sample`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
