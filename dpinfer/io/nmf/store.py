"""A fit's draws stored once, for summaries of any union of its areas afterwards.

:func:`write_posterior` writes a ``dp.sample`` result as a Zarr store (an ArviZ/xarray
DataTree: ``xarray.open_datatree(path, engine="zarr")`` reads it back): the count draws as
integers (int32 where every count fits, as a state's always do), compressed (Zstandard) and
chunked by leaf, so that a union of areas reads only the chunks of its leaves; and, in a group
``geography``, what the summaries of user-defined areas need to know of the fit: the level of
its leaves, the axes of its cells, and every block under each leaf (``block``, the blocks'
15-digit tabulation GEOID20s, and ``block_leaf``, each block's leaf), read from the Block
level's geocodes (:func:`~dpinfer.io.nmf.reading.block_geocodes`). :func:`open_posterior` opens
such a store, or a netCDF file of an earlier version, lazily.

A state's 2 chains x 1,000 draws x 75,768 counts are 606 MB as int32 and a fifth to a tenth of
that on disk (the counts vary little from draw to draw).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

CHUNK_BYTES = 2e7  # uncompressed bytes of count draws per chunk
COMPRESSION_LEVEL = 3  # Zstandard: ~1.5x the size of level 19, written ~20x faster


def tabulation_geoid(geocodes) -> np.ndarray:
    """The 15-digit tabulation GEOID20 (state 2, county 3, tract 6, block 4 digits) of NMF
    Block geocodes: a block geocode ends in its 16-character geocode16, the GEOID20 with the
    block-group digit written twice (the spine's prefix before it; fact sheet
    ``docs/dev/census-nmf-layout.md``). A geocode that does not end so is a ValueError naming it."""
    codes = np.asarray(geocodes, dtype=str)
    tail = np.array([c[-16:] for c in codes], dtype=object)
    bad = [c for c, t in zip(codes, tail) if len(t) != 16 or not t.isdigit() or t[11] != t[12]]
    if bad:
        raise ValueError(f"{len(bad)} Block geocode(s) do not end in a 16-digit geocode16 whose block-group "
                         f"digit starts the block's 4 digits: {bad[:5]}")
    return np.array([t[:11] + t[12:] for t in tail], dtype=str)


def block_leaves(leaves, blocks) -> np.ndarray:
    """Each block's leaf (index into ``leaves``): the leaf whose geocode starts the block's
    (geocodes start with their parent's). A block under no leaf, or under two, is a
    ValueError naming it."""
    leaves = np.asarray(leaves, dtype=str)
    order = np.argsort(leaves)
    sorted_leaves = leaves[order]
    out = np.full(len(blocks), -1, np.int64)
    for width in np.unique([len(g) for g in leaves]):
        prefixes = np.array([b[:width] for b in blocks], dtype=str)
        at = np.searchsorted(sorted_leaves, prefixes)
        hit = (at < leaves.size) & (sorted_leaves[np.minimum(at, leaves.size - 1)] == prefixes)
        twice = hit & (out >= 0)
        if twice.any():
            raise ValueError(f"blocks under two leaves: {list(np.asarray(blocks)[twice][:5])}")
        out[hit] = order[at[hit]]
    if np.any(out < 0):
        raise ValueError(f"{int(np.sum(out < 0))} block(s) lie under no leaf of the fit: "
                         f"{list(np.asarray(blocks)[out < 0][:5])}")
    return out


def geography(leaves, leaf_level: str, cell_axes, blocks=None) -> xr.Dataset:
    """The ``geography`` group: ``block`` (GEOID20) and ``block_leaf`` for ``blocks`` (NMF
    Block geocodes; with ``leaf_level="Block"`` the leaves themselves, None: no blocks known),
    the leaves' level and the cells' axes in attrs."""
    if leaf_level == "Block":
        blocks = np.asarray(leaves, dtype=str)
    attrs = {"leaf_level": leaf_level, "cell_axes": json.dumps(list(cell_axes))}
    if blocks is None:
        return xr.Dataset(attrs=attrs)
    blocks = np.asarray(blocks, dtype=str)
    return xr.Dataset({"block_leaf": ("block", block_leaves(leaves, blocks))},
                      coords={"block": tabulation_geoid(blocks)}, attrs=attrs)


def write_posterior(path, idata, *, name: str = "counts", geography_group: xr.Dataset | None = None) -> Path:
    """Write ``idata`` (a ``dp.sample`` result) to the Zarr store ``path`` (replaced if it
    exists), ``name``'s draws as integers chunked by leaf, ``geography_group``
    (:func:`geography`) as the group ``geography``. Returns the path."""
    import zarr

    path = Path(path)
    counts = idata.posterior[name]
    chains, draws = counts.shape[:2]
    tail = int(np.prod(counts.shape[3:], dtype=np.int64))
    wide = counts.dtype.kind in "iu" and counts.size and (int(counts.max()) > np.iinfo(np.int32).max
                                                           or int(counts.min()) < np.iinfo(np.int32).min)
    dtype = counts.dtype if wide or counts.dtype.kind not in "iu" else np.dtype(np.int32)
    per_leaf = chains * draws * max(tail, 1) * dtype.itemsize
    leaves = int(max(1, min(counts.shape[2], CHUNK_BYTES // max(per_leaf, 1))))
    encoding = {"/posterior": {name: {"dtype": dtype, "chunks": (chains, draws, leaves, *counts.shape[3:]),
                                      "compressors": [zarr.codecs.ZstdCodec(level=COMPRESSION_LEVEL)]}}}
    tree = idata.copy()
    if geography_group is not None:
        tree["geography"] = xr.DataTree(geography_group)
    with warnings.catch_warnings():  # consolidated metadata: not yet in the Zarr 3 specification
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        tree.to_zarr(path, mode="w", encoding=encoding)
    return path


def open_posterior(path) -> xr.DataTree:
    """A stored fit, lazily: a Zarr store (:func:`write_posterior`, a directory) or a netCDF
    file (``posterior.nc`` of dpinfer before the Zarr stores). A missing path is a
    FileNotFoundError naming it."""
    path = Path(os.fspath(path))
    if not path.exists():
        raise FileNotFoundError(f"no stored fit at {path} (expected a posterior.zarr directory or a netCDF file)")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        try:
            return xr.open_datatree(path, engine="zarr") if path.is_dir() else xr.open_datatree(path)
        except (ValueError, OSError, KeyError) as err:  # xarray's "no backend", zarr's missing groups
            raise ValueError(f"{path} is not a stored dpinfer fit (a posterior.zarr directory or netCDF file of "
                             f"dpinfer nmf): {' '.join(str(err).split())[:200]}") from None
