"""Checkpoints of ``dpinfer.sample``'s compiled engine: a fit that is interrupted (Ctrl-C, a
killed process, a lost machine) resumes where its last checkpoint left it, and with the same
seeds gives the draws an uninterrupted fit gives.

What a chain's state is (:class:`ChainState`): everything the compiled sweeps carry from one
iteration to the next (:mod:`dpinfer.inference.engines.compiled.chains`): the parameters q and
the counts, the diagonal metric and its running moments, the step size's dual-averaging state,
the chain's xoshiro256** stream (four words), and the draws stored so far. Everything else a
sweep uses (the count blocks' tables, the prior tables, the group factors) is refilled from q
before it is read, so these arrays alone continue a chain exactly.

The layout of a checkpoint directory (created readable by its owner only, 0o700; files 0o600):

* ``checkpoint.json``: what the checkpoint belongs to (:func:`identity`): the dpinfer, PyMC,
  PyTensor, numba, NumPy and Python versions and dpinfer's kernel source hash; a SHA-256 of
  the model's structure and data (the releases' values included); the sampler's settings
  (draws, tune, chains, NUTS transitions and count draws per draw, target acceptance, tree
  depth); the seed's entropy (so that a fit without ``random_seed`` can resume too); and the
  windows' widenings made before the current fit (to replay them without refitting: each
  one's latents and bounds, and the counts of nested latents widened alone);
* ``chain-<c>.nc``: chain c's state and stored draws, netCDF-4 (HDF5, through xarray and
  h5netcdf), with the number of iterations done; written to a temporary file and renamed, so
  a process killed while writing leaves the previous checkpoint intact.

Data only: JSON and netCDF arrays, no pickle, so reading a checkpoint cannot run code. The
counts in a checkpoint are draws of confidential counts: keep the directory where only their
owner can read it (the permissions above are the default; a shared file system's ACLs are the
analyst's to check). A checkpoint is refused, with what differs, when any part of its identity
differs from the fit asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = 1
_IDENTITY_FILE = "checkpoint.json"


class CheckpointMismatchError(ValueError):
    """A checkpoint belongs to another model, other settings or another dpinfer version."""


@dataclass
class ChainState:
    """One chain of the compiled engine between two iterations (module docstring). ``done``
    iterations (tuning ones first) have run; ``draws_*`` hold the stored draws, the first
    ``max(0, done - tune)`` rows filled."""

    q: np.ndarray
    counts: np.ndarray
    inv_mass: np.ndarray
    adapt: np.ndarray
    metric_count: np.ndarray
    metric_mean: np.ndarray
    metric_m2: np.ndarray
    stream: np.ndarray
    draws_q: np.ndarray
    draws_counts: np.ndarray
    draws_stats: np.ndarray
    done: int = 0
    seconds: float = 0.0


_ARRAYS = {  # name -> dims in the netCDF file
    "q": ("parameter",), "counts": ("count",), "inv_mass": ("parameter",), "adapt": ("adaptation",),
    "metric_count": ("one",), "metric_mean": ("moment", "parameter"), "metric_m2": ("moment", "parameter"),
    "stream": ("stream_word",), "draws_q": ("draw", "parameter"), "draws_counts": ("draw", "count"),
    "draws_stats": ("draw", "statistic"),
}


def versions() -> dict:
    """The software whose change could change the draws (the model cache's key has the same)."""
    from dpinfer import __version__
    from dpinfer.inference.engines.compiled.cache import versions as cache_versions

    return {"dpinfer": __version__, "compiled": repr(cache_versions())}


def identity(*, model_hash: str, settings: dict, entropy, widenings: list) -> dict:
    """What a checkpoint belongs to (module docstring)."""
    return {"format": FORMAT, "versions": versions(), "model": model_hash, "settings": settings,
            "entropy": str(entropy), "widenings": widenings}


def model_hash(structure_key: str | None, data_values, counts0) -> str:
    """SHA-256 of a compiled model's structure key, its data (the releases' values included)
    and the counts' start on the releases' fibre."""
    import hashlib

    from dpinfer.inference.engines.compiled.cache import describe

    if structure_key is None:
        raise ValueError("checkpoint: this model's structure cannot be hashed (a part of it the "
                         "model cache cannot describe), so a checkpoint could not be matched to it "
                         "on resume; fit without checkpoint=")
    return hashlib.sha256(repr((structure_key, describe(tuple(data_values)), describe(counts0))).encode()).hexdigest()


class Checkpoint:
    """A checkpoint directory (module docstring) for one fit, written every ``every``
    iterations of each chain and when the fit is interrupted."""

    def __init__(self, path, ident: dict, every: int):
        self.path, self.identity, self.every = Path(path), ident, int(every)

    @classmethod
    def create(cls, path, ident: dict, every: int) -> "Checkpoint":
        """A new checkpoint at ``path`` (a directory that must not hold another fit's checkpoint)."""
        path = Path(path)
        if (path / _IDENTITY_FILE).exists():
            raise FileExistsError(f"checkpoint={str(path)!r} already holds a checkpoint; resume it with "
                                  f"resume={str(path)!r}, or choose another directory")
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"checkpoint={str(path)!r} is a directory with other files in it; "
                                  "give a new or empty directory")
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        out = cls(path, ident, every)
        out._write_identity()
        return out

    @classmethod
    def open(cls, path, ident: dict, every: int) -> "Checkpoint":
        """The checkpoint at ``path`` to resume, after checking that it belongs to ``ident``
        (:class:`CheckpointMismatchError` naming what differs; the entropy of a fit without
        ``random_seed`` is taken from the checkpoint)."""
        path = Path(path)
        stored = read_identity(path)
        if stored.get("format") != FORMAT:
            raise CheckpointMismatchError(f"resume={str(path)!r}: checkpoint format {stored.get('format')!r}, "
                                          f"this dpinfer reads format {FORMAT}")
        check_same_fit(path, stored, ident, "it belongs to another model or other data (the model's structure, "
                                            "data and releases hash differently)")
        return cls(path, stored, every)

    def _write_identity(self) -> None:
        with replaced_privately(self.path / _IDENTITY_FILE) as tmp:
            tmp.write_text(json.dumps(self.identity, indent=1))

    def record_widening(self, failed: dict, counts: dict | None = None) -> None:
        """Note that the windows of ``failed`` (latent -> bound) were widened, only the counts
        ``counts`` (latent -> (leaf, cell) pairs) of those it names, and the fit restarted (the
        chains' files of the abandoned fit are removed)."""
        self.identity["widenings"].append({k: float(v) for k, v in failed.items()})
        self.identity.setdefault("widened_counts", []).append(
            {k: np.asarray(v, dtype=np.int64).tolist() for k, v in (counts or {}).items()})
        for f in self.path.glob("chain-*.nc"):
            f.unlink()
        self._write_identity()

    def chain_file(self, chain: int) -> Path:
        return self.path / f"chain-{chain}.nc"

    def save(self, chain: int, state: ChainState) -> None:
        """Write chain ``chain``'s state (atomically: a temporary file renamed)."""
        import xarray as xr

        arrays = {name: (dims, getattr(state, name)) for name, dims in _ARRAYS.items()}
        arrays["stream"] = (("stream_word",), state.stream.view(np.int64))  # netCDF-4 has no portable uint64
        ds = xr.Dataset(arrays, attrs={"done": int(state.done), "seconds": float(state.seconds),
                                       "model": self.identity["model"]})
        with replaced_privately(self.chain_file(chain)) as tmp:
            ds.to_netcdf(tmp, engine="h5netcdf")

    def load(self, chain: int) -> ChainState | None:
        """Chain ``chain``'s saved state, or None if it had not saved one."""
        import xarray as xr

        path = self.chain_file(chain)
        if not path.exists():
            return None
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            if ds.attrs.get("model") != self.identity["model"]:
                raise CheckpointMismatchError(f"{path} belongs to another model than {self.path / _IDENTITY_FILE}")
            values = {name: np.array(ds[name].values) for name in _ARRAYS}
            done, seconds = int(ds.attrs["done"]), float(ds.attrs["seconds"])
        values["stream"] = values["stream"].view(np.uint64)
        values["counts"] = values["counts"].astype(np.int64)
        values["draws_counts"] = values["draws_counts"].astype(np.int64)
        return ChainState(**values, done=done, seconds=seconds)


class RoundCheckpoints:
    """A checkpoint directory written round by round by a fit spread over workers (a sharded
    fit's sweeps, :func:`dpinfer.sample_sharded`; a state scan's iterations,
    :mod:`dpinfer.io.nmf.scan_checkpoint`): ``checkpoint.json`` records what the fit is (its
    ``identity``), each checkpoint is a ``<ROUND>-<n>`` directory whose parts the workers write
    where they run, and ``latest.json`` names the last whole one, written once all its files
    are; the older one is then removed, so a fit killed while writing resumes from the one
    before. Owner-only (0o700). Subclasses name ``ROUND`` and ``KIND`` (for messages)."""

    ROUND = "round"
    KIND = "dpinfer"

    def __init__(self, path, every: int, identity: dict):
        if isinstance(every, bool) or int(every) != every or every < 1:
            raise ValueError(f"checkpoint_every must be a whole number >= 1, got {every!r}")
        self.path, self.every, self.identity = Path(path), int(every), identity

    @classmethod
    def create(cls, path, every: int, identity: dict):
        """A new checkpoint directory at ``path`` (absent or empty)."""
        out = cls(path, every, identity)
        if out.path.exists() and any(out.path.iterdir()):
            raise FileExistsError(f"checkpoint={str(path)!r} is not empty; give a new or empty directory, or "
                                  f"resume={str(path)!r} to continue the fit it holds")
        out.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(out.path, 0o700)
        out._write_identity()
        return out

    @classmethod
    def read(cls, path) -> dict:
        """The identity the checkpoint at ``path`` records."""
        file = Path(path) / _IDENTITY_FILE
        if not file.exists():
            raise FileNotFoundError(f"resume={str(path)!r} holds no {cls.KIND} checkpoint ({file} is missing)")
        return json.loads(file.read_text())

    @classmethod
    def stored_entropy(cls, path) -> int:
        return int(cls.read(path)["entropy"])

    def _write_identity(self) -> None:
        with replaced_privately(self.path / _IDENTITY_FILE) as tmp:
            tmp.write_text(json.dumps(self.identity, indent=1))

    def round_dir(self, n: int) -> Path:
        return self.path / f"{self.ROUND}-{n:09d}"

    def latest(self) -> int:
        """The round of the last whole checkpoint (0: none yet)."""
        latest = self.path / "latest.json"
        return json.loads(latest.read_text())[self.ROUND] if latest.exists() else 0

    def commit(self, n: int) -> None:
        """Round ``n``'s checkpoint is whole: name it in ``latest.json``, remove the others."""
        with replaced_privately(self.path / "latest.json") as tmp:
            tmp.write_text(json.dumps({self.ROUND: n}))
        for old in self.path.glob(f"{self.ROUND}-*"):
            if old != self.round_dir(n):
                shutil.rmtree(old)

    def clear(self) -> None:
        """Remove every checkpoint (a fit starting again)."""
        (self.path / "latest.json").unlink(missing_ok=True)
        for old in self.path.glob(f"{self.ROUND}-*"):
            shutil.rmtree(old)


def check_same_fit(path, stored: dict, ident: dict, other_model: str, extra=()) -> None:
    """Raise :class:`CheckpointMismatchError` naming every way the checkpointed fit ``stored``
    differs from this one ``ident`` (software versions, model hash, settings, seed entropy,
    and ``extra`` differences the caller found); ``other_model`` says what a hash mismatch means."""
    differences = []
    if stored["versions"] != ident["versions"]:
        old, new = stored["versions"], ident["versions"]
        differences.append(f"it was written by another dpinfer version or software stack "
                           f"(dpinfer {old.get('dpinfer')} with {old.get('compiled')}; now dpinfer "
                           f"{new['dpinfer']} with {new['compiled']})")
    if stored["model"] != ident["model"]:
        differences.append(other_model)
    differences += list(extra)
    for name, value in ident["settings"].items():
        if stored["settings"].get(name) != value:
            differences.append(f"{name}={stored['settings'].get(name)!r} there, {value!r} now")
    if stored["entropy"] != ident["entropy"]:
        differences.append(f"random_seed: its seed's entropy is {stored['entropy']}, now {ident['entropy']}")
    if differences:
        raise CheckpointMismatchError(f"resume={str(path)!r} cannot continue this fit: " + "; ".join(differences))


def read_identity(path) -> dict:
    """The identity a checkpoint directory records (module docstring)."""
    file = Path(path) / _IDENTITY_FILE
    if not file.exists():
        raise FileNotFoundError(f"resume={str(path)!r} holds no dpinfer checkpoint ({file} is missing)")
    return json.loads(file.read_text())


@contextlib.contextmanager
def replaced_privately(path: Path):
    """A temporary file beside ``path``, readable by its owner only, renamed onto ``path`` when
    the block ends (so ``path`` is always a whole file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    yield tmp
    os.chmod(tmp, 0o600)  # whatever the writer did to it
    os.replace(tmp, path)


class FitCheckpoint:
    """The checkpoint of one ``dpinfer.sample`` call, made (or opened, to resume) when the
    engine calls it with the model's hash; each fit of the call (a fit after widened windows
    too) gets the same one."""

    def __init__(self, path, *, every: int, resume: bool, settings: dict, entropy):
        if int(every) != every or every < 1:
            raise ValueError(f"checkpoint_every must be a whole number >= 1 (iterations), got {every!r}")
        self.path, self.every, self.resume = Path(path), int(every), resume
        self.settings, self.entropy = settings, entropy
        self.checkpoint: Checkpoint | None = None

    def decided(self, name: str, value):
        """A choice the fit made from the time it had (``inference="auto"``'s inference, the
        empirical-Bayes estimate's iterations under ``max_minutes``): ``value`` for a new
        checkpoint (recorded in its identity), the checkpointed fit's when resuming, so that the
        resumed fit makes the same one."""
        if self.resume:
            return read_identity(self.path)["settings"].get(f"decided_{name}", value)
        self.settings[f"decided_{name}"] = value
        return value

    def widenings_to_replay(self) -> tuple[list[dict], list[dict]]:
        """The widenings a resumed fit had made before its checkpointed fit: (latent -> bound
        each, latent -> the (leaf, cell) pairs widened alone each)."""
        if not self.resume:
            return [], []
        ident = read_identity(self.path)
        widenings = ident["widenings"]
        return widenings, ident.get("widened_counts", [{}] * len(widenings))

    def __call__(self, hash_: str) -> Checkpoint:
        if self.checkpoint is None:
            ident = identity(model_hash=hash_, settings=self.settings, entropy=self.entropy, widenings=[])
            opened = Checkpoint.open if self.resume else Checkpoint.create
            self.checkpoint = opened(self.path, ident, self.every)
        return self.checkpoint

    def widened(self, failed: dict, counts: dict | None = None) -> None:
        if self.checkpoint is not None:
            self.checkpoint.record_widening(failed, counts)


def resume_or_start(path, every: int) -> dict:
    """``dpinfer.sample``'s keyword arguments for a fit that checkpoints in ``path`` and, if an
    earlier run of it left a checkpoint there, continues from it: ``resume=path``, else
    ``checkpoint=path, checkpoint_every=every`` (the temporary files of a run killed while
    writing its first file are removed first)."""
    path = Path(path)
    if (path / _IDENTITY_FILE).exists():
        return {"resume": path}
    for f in path.glob("*.tmp"):
        f.unlink()
    return {"checkpoint": path, "checkpoint_every": every}


class Interrupted(KeyboardInterrupt):
    """``dpinfer.sample`` was interrupted; its checkpoint (if any) holds the chains' state."""


def interrupted_message(path, done: int, total: int) -> str:
    where = (f"; the chains' state is saved in {str(path)!r} ({done} of {total} iterations done): "
             f"continue with dp.sample(..., resume={str(path)!r})" if path is not None else
             "; pass checkpoint=<directory> to be able to resume an interrupted fit")
    return f"dpinfer.sample interrupted{where}"
