"""Keep numba's on-disk cache of dpinfer's kernels consistent with the source.

numba caches a compiled function (``cache=True``) keyed on its own file's timestamp only: a
cached kernel that calls a kernel of another module keeps the old callee after that module
changes. On import dpinfer compares a hash of all its source files with the one recorded
beside the cache and, when they differ, deletes its cached kernels so that they are compiled
afresh. (A fresh install has no cache; this matters when the source is edited in place.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
STAMP = _PACKAGE / "__pycache__" / "dpinfer-kernels.sha256"


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def clear_if_stale() -> bool:
    """Delete dpinfer's cached kernels if the source changed since they were compiled.
    Returns True if it cleared them. Never fails the import (a read-only install keeps its
    cache as it is)."""
    try:
        current = source_hash()
        if STAMP.exists() and STAMP.read_text() == current:
            return False
        for pattern in ("*.nbi", "*.nbc"):
            for path in _PACKAGE.rglob(pattern):
                path.unlink(missing_ok=True)
        STAMP.parent.mkdir(exist_ok=True)
        STAMP.write_text(current)
        return True
    except OSError:
        return False
