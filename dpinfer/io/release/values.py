"""The values file of a release (CSV, or Parquet where pyarrow is installed): read, and its
value columns checked (present, numeric, finite, whole numbers for a discrete mechanism)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpinfer.io.release.fields import ReleaseFileError, _Context


def _row_of(frame: pd.DataFrame, mask: np.ndarray) -> str:
    i = int(np.flatnonzero(mask)[0])
    return f"data row {i + 1} (line {i + 2} of a CSV file)"


def _read_table(ctx: _Context, path: Path, index_columns) -> pd.DataFrame:
    suffix = path.suffix.lower()
    if not path.is_file():
        raise ctx.error("release.values_file", f"no such file {str(path)!r}")
    try:
        if suffix == ".csv":
            table = pd.read_csv(path, dtype={c: str for c in index_columns})
        elif suffix == ".parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ctx.error("release.values_file", "Parquet values files need pyarrow, which is "
                                "not installed; write the values as CSV") from None
            table = pd.read_parquet(path)
        else:
            raise ctx.error("release.values_file", f"must end in .csv or .parquet, got {path.name!r}")
    except ReleaseFileError:
        raise
    except Exception as err:  # noqa: BLE001 - a parser error of any kind
        raise ctx.error("release.values_file", f"cannot be read: {err}") from None
    if len(table) == 0:
        raise ctx.error("release.values_file", f"{path.name} holds no rows")
    return table


def _values_of(ctx: _Context, table: pd.DataFrame, columns, discrete: bool, family: str) -> np.ndarray:
    out = []
    for name in columns:
        raw = table[name]
        numeric = pd.to_numeric(raw, errors="coerce") if not pd.api.types.is_bool_dtype(raw) else \
            raw.astype(float)
        values = np.asarray(numeric, dtype=np.float64)
        missing = np.asarray(raw.isna())
        if missing.any():
            raise ctx.error("release.value_columns", f"column {name!r} has a missing value (NaN) at "
                            f"{_row_of(table, missing)}")
        bad = np.isnan(values)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ctx.error("release.value_columns", f"column {name!r} has a non-numeric value "
                            f"{raw.iloc[i]!r} at {_row_of(table, bad)}")
        if not np.all(np.isfinite(values)):
            raise ctx.error("release.value_columns", f"column {name!r} has an infinite value at "
                            f"{_row_of(table, ~np.isfinite(values))}")
        if discrete:
            frac = values != np.round(values)
            if frac.any():
                i = int(np.flatnonzero(frac)[0])
                raise ctx.error("release.value_columns", f"column {name!r} has the non-integer value "
                                f"{float(values[i])!r} at {_row_of(table, frac)}, but {family} releases "
                                "whole numbers")
            if np.any(np.abs(values) > 2**53):
                raise ctx.error("release.value_columns", f"column {name!r} has values too large to "
                                "hold exactly (|value| > 2**53)")
            if np.issubdtype(np.asarray(raw).dtype, np.integer):
                values = np.asarray(raw, dtype=np.int64)
            else:
                values = values.astype(np.int64)
        out.append(values)
    stacked = np.stack(out, axis=-1)
    return stacked[:, 0] if len(columns) == 1 else stacked
