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


def exposure_problem(table: pd.DataFrame, name: str) -> tuple[np.ndarray | None, str | None]:
    """(the column ``name`` of the values file as float64 exposures, None), or (None, what is
    wrong with it): an exposure (population, person-years, number of trials) is a public
    quantity each row's count comes from, so every entry must be a finite number > 0 (a row
    with exposure 0 or below has no count to model; NaN or inf is a broken file)."""
    if name not in table.columns:
        return None, f"column {name!r} is not in the values file (its columns: {list(table.columns)})"
    raw = table[name]
    if pd.api.types.is_bool_dtype(raw):
        return None, f"column {name!r} holds true/false values, not exposures"
    missing = np.asarray(raw.isna())
    if missing.any():
        return None, f"column {name!r} has a missing value at {_row_of(table, missing)}"
    values = np.asarray(pd.to_numeric(raw, errors="coerce"), dtype=np.float64)
    bad = np.isnan(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return None, (f"column {name!r} has the non-numeric value {raw.iloc[i]!r} at "
                      f"{_row_of(table, bad)}")
    bad = ~np.isfinite(values) | (values <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return None, (f"column {name!r} must be positive and finite (an exposure), but has "
                      f"{float(values[i])!r} at {_row_of(table, bad)}")
    return values, None
