"""Checkpoints of the sharded state scan (:mod:`dpinfer.io.nmf.state_scan`): a scan stopped at
any point (Ctrl-C, a killed driver, a lost worker) resumes from its last checkpoint and, with
the same seed, gives the draws and the estimate an uninterrupted scan gives.

The layout of a checkpoint directory (owner-only, 0o700; files 0o600):

* ``checkpoint.json``: what the scan is (:func:`scan_identity`): the software's versions (as
  :func:`dpinfer.inference.checkpoint.versions`), a SHA-256 of the table (its tree, leaves,
  cells and release), the scan's settings (level, shards, the split concentrations given or
  the estimate's settings, the sampler's, draws, tune, chains) and the seed's entropy;
* ``iteration-<n>/``, written every ``every`` iterations of the scan (the estimate's and the
  draws' counted together): ``scan.json`` and ``scan.npz`` (the phase, the estimate's iterates
  or its result, the iterations done), and per chain ``chain-<c>/``: the driver's part
  (``driver/``: the sizes' NUTS chain, :class:`~dpinfer.inference.checkpoint.Checkpoint`'s
  netCDF file; ``driver.npz``: the count stream, the score stream, the statistics, the
  summaries, the seconds) and each shard's (``shard-<k>/``, written by the shard where it runs,
  :meth:`~dpinfer.io.nmf.county_shard.CountyShard.save`; on a cluster the directory must be on a
  file system the workers share);
* ``latest.json``: the last whole ``iteration-<n>``, written once all its files are; the
  older one is then removed, so a scan killed while writing resumes from the one before.

Data only (JSON, NumPy's .npz without pickles, netCDF), so reading a checkpoint cannot run
code. The counts in it are draws of confidential counts: keep it where only their owner can
read it. A checkpoint is refused, naming what differs, when any part of its identity differs
from the scan asked for.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from dpinfer.inference.checkpoint import (
    CheckpointMismatchError,
    RoundCheckpoints,
    check_same_fit,
    replaced_privately,
    versions,
)

FORMAT = 1


def table_hash(table) -> str:
    """SHA-256 of what a census table's scan depends on: its areas' tree, leaves, cells and the
    release's values and structure."""
    sums = table.release.sums
    digest = hashlib.sha256()
    for part in (repr(list(table.leaves)), repr(list(table.cells)), table.areas.to_csv(index=False)):
        digest.update(part.encode())
    for array in (table.release.values, sums.parent, sums.term_area, sums.term_cells, sums.term_value,
                  sums.term_table):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def scan_identity(table, settings: dict, entropy) -> dict:
    """What a scan's checkpoint belongs to (module docstring)."""
    return {"format": FORMAT, "kind": "state scan", "versions": versions(), "model": table_hash(table),
            "settings": settings, "entropy": str(entropy)}


class ScanCheckpoints(RoundCheckpoints):
    """A scan's checkpoint directory (module docstring;
    :class:`~dpinfer.inference.checkpoint.RoundCheckpoints`), written every ``every`` iterations."""

    ROUND, KIND = "iteration", "state scan"

    @classmethod
    def open(cls, path, every: int, identity: dict) -> "ScanCheckpoints":
        """The checkpoint at ``path`` to resume, after checking that it is this scan's
        (:class:`~dpinfer.inference.checkpoint.CheckpointMismatchError` naming every difference)."""
        stored = cls.read(path)
        if stored.get("format") != FORMAT or stored.get("kind") != "state scan":
            raise CheckpointMismatchError(f"resume={str(path)!r} is not a state scan's checkpoint of format {FORMAT}")
        check_same_fit(path, stored, identity, "it belongs to another table (its tree, cells or release hash "
                                               "differently)")
        out = cls(path, every, stored)
        if out.latest() == 0:
            raise FileNotFoundError(f"resume={str(path)!r} holds no whole checkpoint yet (the scan stopped before "
                                    "its first): start it again with checkpoint=")
        return out

    def chain_dir(self, n: int, chain: int) -> Path:
        return self.round_dir(n) / f"chain-{chain}"

    def save(self, n: int, scan: dict, arrays: dict, chains: list) -> None:
        """Iteration ``n``'s checkpoint: every chain's parts (``chain.save(dir)``, each shard
        written where it runs), the scan's own (``scan`` JSON, ``arrays`` .npz), then
        ``latest.json``; the older checkpoint removed."""
        directory = self.round_dir(n)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for c, chain in enumerate(chains):
            chain.save(self.chain_dir(n, c))
        with replaced_privately(directory / "scan.npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
        with replaced_privately(directory / "scan.json") as tmp:
            tmp.write_text(json.dumps(scan))
        self.commit(n)

    def load(self) -> tuple[int, dict, dict]:
        """(the iteration, the scan's JSON, its arrays) of the last whole checkpoint."""
        n = self.latest()
        directory = self.round_dir(n)
        with np.load(directory / "scan.npz", allow_pickle=False) as saved:
            arrays = {name: saved[name] for name in saved.files}
        return n, json.loads((directory / "scan.json").read_text()), arrays
