"""A model's releases grouped by the latent counts behind them: the input of every plan."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dpinfer.inference.latents import current_value


@dataclass
class Entry:
    """One release of the latent: its record, its query (None: the counts themselves) and the
    released values (flattened)."""

    record: object
    query: np.ndarray | None
    value: np.ndarray

    @cached_property
    def cells(self) -> np.ndarray | None:
        """The cell (flat index) each released value is of, when the release is of cells --
        the counts themselves, or a part ``x[a]`` (a query whose every row is a unit vector:
        a subset, a reordering, a cell twice) -- else None (a general linear query)."""
        if self.query is None:
            return np.arange(self.value.size)
        q = self.query
        cols = np.argmax(q != 0, axis=1)
        rows = np.arange(q.shape[0])
        if np.all(q[rows, cols] == 1) and np.all(np.count_nonzero(q, axis=1) == 1):
            return cols
        return None


def entries_from(model, records, resolve) -> dict:
    """Group release records by their latent counts: {latent: [Entry, ...]} (insertion order)."""
    groups: dict = {}
    for record in records:
        latent, query = resolve(model, record.latent)
        value = current_value(model.rvs_to_values[record.release_rv]).reshape(-1)
        groups.setdefault(latent, []).append(Entry(record, query, value))
    return groups
