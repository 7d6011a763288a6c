"""Writing a release (curator side, :func:`write_release`): the values file and the manifest
beside it, from the mechanism that made the release; read back before returning."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from dpinfer.io.release.fields import _Context
from dpinfer.io.release.mechanism import mechanism_to_manifest
from dpinfer.io.release.reading import read_release
from dpinfer.io.release.schema import FORMAT
from dpinfer.io.release.toml import _plain, toml_dumps
from dpinfer.mechanisms import Mechanism, MultiLevelGeometric


def _index_frame(ctx: _Context, index, n_rows: int, default: str) -> pd.DataFrame:
    if index is None:
        return pd.DataFrame(index=range(n_rows))
    if isinstance(index, pd.MultiIndex):
        names = [n if n is not None else f"{default}_{i}" for i, n in enumerate(index.names)]
        frame = pd.DataFrame({name: index.get_level_values(i) for i, name in enumerate(names)})
    else:
        idx = index if isinstance(index, pd.Index) else pd.Index(list(index))
        frame = pd.DataFrame({idx.name if idx.name is not None else default: np.asarray(idx)})
    if len(frame) != n_rows:
        raise ctx.error("index", f"has {len(frame)} labels but the values have {n_rows} rows")
    return frame.reset_index(drop=True)


def write_release(path, mechanism, values, *, name: str, index=None, columns=None,
                  invariants=None, description: str = "", units: str = "", provenance: str = "",
                  created=None, extra_columns=None, query=None, dims=None,
                  values_file: str | None = None, exposure_column: str | None = None) -> Path:
    """Write a release (curator side): the values file and the manifest beside it (their
    directory is created if missing). Returns the
    manifest's path; the files are read back with :func:`read_release` before returning, so
    everything written is readable.

    Parameters
    ----------
    path : the manifest to write (``.toml``).
    mechanism : the dpinfer mechanism that made the release (:func:`mechanism_to_manifest`).
    values : array (rows,) or (rows, k), a pandas Series (its index is used when ``index`` is
        None) or DataFrame (its columns become the value columns).
    name : the release's name. index : row labels (list, Index or MultiIndex; its names become
        the index columns, default "cell"). columns : the value columns' names (default
        "release" for one column, "level_j" for a multi-level release, "value_j" otherwise).
    invariants : the published invariant values A x (e.g. the totals) of a mechanism holding
        invariants; checked against the release and written. Default: A s of the release.
    description, units, provenance, created : documentation (created defaults to today).
    extra_columns : {name: column} written beside the values (covariates, exposure, truth).
    query : an ``[query]`` table (dict) or a query matrix Q (released values = Q x).
    dims : PyMC dims of the values' axes. values_file : default ``<manifest stem>.csv``; a
        ``.parquet`` name writes Parquet (needs pyarrow).
    exposure_column : the name of one of ``extra_columns`` that holds each row's public
        exposure (population, person-years, trials; positive and finite), declared in the
        manifest as ``exposure_column`` (the default exposure of ``dpinfer fit``).
    """
    path = Path(path)
    ctx = _Context(path)
    if path.suffix != ".toml":
        raise ctx.error("path", f"a release manifest is a .toml file, got {path.name!r}")
    if not isinstance(name, str) or not name.strip():
        raise ctx.error("release.name", f"must be a non-empty string, got {name!r}")
    if isinstance(values, pd.DataFrame):
        columns = list(values.columns) if columns is None else columns
        index = values.index if index is None and not isinstance(values.index, pd.RangeIndex) else index
        values = values.to_numpy()
    elif isinstance(values, pd.Series):
        index = values.index if index is None and not isinstance(values.index, pd.RangeIndex) else index
        values = values.to_numpy()
    array = np.asarray(values)
    if array.ndim not in (1, 2) or array.size == 0:
        raise ctx.error("values", f"must be a non-empty array of shape (rows,) or (rows, k), got "
                        f"shape {array.shape}")
    try:
        array = mechanism.check_release(array) if isinstance(mechanism, Mechanism) else array
    except ValueError as err:
        raise ctx.error("values", f"not a release of {mechanism!r}: {err}") from None
    fragment = mechanism_to_manifest(mechanism, cells=int(array.size))
    n_rows = array.shape[0]
    if columns is None:
        if array.ndim == 1:
            columns = ["release"]
        elif isinstance(mechanism, MultiLevelGeometric):
            columns = [f"level_{j}" for j in range(array.shape[1])]
        else:
            columns = [f"value_{j}" for j in range(array.shape[1])]
    columns = [str(c) for c in columns]
    if len(columns) != (1 if array.ndim == 1 else array.shape[1]):
        raise ctx.error("columns", f"names {len(columns)} value columns for values of shape {array.shape}")
    frame = _index_frame(ctx, index, n_rows, "cell")
    index_columns = [str(c) for c in frame.columns]
    frame.columns = index_columns
    data = array.reshape(n_rows, -1)
    for j, col in enumerate(columns):
        if col in frame.columns:
            raise ctx.error("columns", f"value column {col!r} is also an index column")
        frame[col] = data[:, j]
    for key, column in (dict(extra_columns) if extra_columns is not None else {}).items():
        key = str(key)
        if key in frame.columns:
            raise ctx.error("extra_columns", f"column {key!r} is already a value or index column")
        column = np.asarray(column)
        if column.shape != (n_rows,):
            raise ctx.error("extra_columns", f"column {key!r} has shape {column.shape}, not ({n_rows},)")
        frame[key] = column

    inv = getattr(mechanism, "invariants", None)
    if inv is not None:
        actual = inv.values(array.reshape(-1))
        declared = actual if invariants is None else np.asarray(invariants)
        if declared.shape != actual.shape or not np.all(declared == actual):
            raise ctx.error("invariants", f"the release's invariant values are {actual.tolist()}, not "
                            f"the declared {np.asarray(invariants).tolist()}")
        fragment["invariants"]["values"] = [int(v) for v in actual]
        groups = fragment["invariants"].get("groups")
        text = groups is not None and all(isinstance(g, str) for g in groups)
        for column in frame.columns:  # a column holding the group labels names them shorter
            readable = text or column not in index_columns  # index columns are read as text
            if groups is not None and readable and column not in columns \
                    and frame[column].tolist() == groups:
                del fragment["invariants"]["groups"]
                fragment["invariants"] = {"kind": "group_totals", "group_column": column,
                                          **fragment["invariants"]}
                break
    elif invariants is not None:
        raise ctx.error("invariants", f"given, but {type(mechanism).__name__} holds no invariants")

    if exposure_column is not None:
        extra = {str(k) for k in (extra_columns or {})}
        if str(exposure_column) not in extra:
            raise ctx.error("exposure_column", f"{exposure_column!r} must name one of "
                            f"extra_columns (given: {sorted(extra)})")
    values_name = values_file if values_file is not None else path.with_suffix(".csv").name
    release = {"name": name}
    for key, value in (("description", description), ("units", units), ("provenance", provenance)):
        if value:
            release[key] = str(value)
    release["created"] = created if created is not None else datetime.date.today()
    release["values_file"] = values_name
    release["value_columns"] = columns
    if index is not None:
        release["index_columns"] = index_columns
    if dims is not None:
        release["dims"] = [dims] if isinstance(dims, str) else [str(d) for d in dims]
    if exposure_column is not None:
        release["exposure_column"] = str(exposure_column)
    document = {"format": FORMAT, "release": release, **fragment}
    if query is not None:
        if isinstance(query, dict):
            document["query"] = query
        else:
            q = np.asarray(query)
            document["query"] = {"kind": "matrix", "matrix": _plain(q.tolist())}

    values_path = path.parent / values_name
    values_path.parent.mkdir(parents=True, exist_ok=True)  # the manifest's directory too
    if values_path.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ctx.error("values_file", "Parquet needs pyarrow, which is not installed") from None
        frame.to_parquet(values_path, index=False)
    elif values_path.suffix == ".csv":
        frame.to_csv(values_path, index=False)
    else:
        raise ctx.error("values_file", f"must end in .csv or .parquet, got {values_name!r}")
    header = (f"dpinfer release manifest ({FORMAT}); "
              "schema: dpinfer/io/release/release-schema.json\n"
              "written by dpinfer.io.release.writing.write_release")
    path.write_text(toml_dumps(document, header), encoding="utf-8")
    try:
        read_release(path)
    except Exception:
        path.unlink(missing_ok=True)
        values_path.unlink(missing_ok=True)
        raise
    return path
