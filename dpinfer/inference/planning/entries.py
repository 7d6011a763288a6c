"""A model's releases grouped by the latent counts behind them: the input of every plan."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer.inference.latents import current_value


@dataclass
class Entry:
    """One release of the latent: its record, its query (None: the counts themselves) and the
    released values (flattened)."""

    record: object
    query: np.ndarray | None
    value: np.ndarray


def entries_from(model, records, resolve) -> dict:
    """Group release records by their latent counts: {latent: [Entry, ...]} (insertion order)."""
    groups: dict = {}
    for record in records:
        latent, query = resolve(model, record.latent)
        value = current_value(model.rvs_to_values[record.release_rv]).reshape(-1)
        groups.setdefault(latent, []).append(Entry(record, query, value))
    return groups
