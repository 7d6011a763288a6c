"""Reading a release (:func:`read_release`): the manifest and its values file, every check made
before an analysis starts, into a :class:`Release` that registers itself in a PyMC model."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

from dpinfer.io.release.fields import _check_fields, _check_keys, _Context
from dpinfer.io.release.invariants import _decode_invariants
from dpinfer.io.release.mechanism import _decode_mechanism
from dpinfer.io.release.query import _decode_query
from dpinfer.io.release.schema import _RELEASE_FIELDS, _TOP_LEVEL, FORMAT
from dpinfer.io.release.values import _read_table, _row_of, _values_of, exposure_problem
from dpinfer.lattice.invariants import Invariants
from dpinfer.mechanisms import Conditioned, Mechanism, MultiLevelGeometric


@dataclasses.dataclass(eq=False)
class Release:
    """A release read from its files (:func:`read_release`).

    Attributes
    ----------
    values : np.ndarray
        The released values: (rows,) for one value column, (rows, k) for k (int64 for a
        discrete mechanism, float64 otherwise).
    index : pandas.Index
        Row labels (a MultiIndex for several index columns; a RangeIndex without any).
    columns : list or None
        The value columns' labels when ``values`` is 2-D.
    mechanism : Mechanism
        The mechanism that made the release (``Conditioned`` with its invariants where declared).
    table : pandas.DataFrame
        The values file as read, every column included (covariates, truth, ...).
    manifest : dict
        The manifest as parsed.
    invariant_values : np.ndarray or None
        A s of the release (equal to the declared values where the manifest gives them).
    query_matrix, query_columns
        The declared query Q (released values = Q x) and the labels of x, or None.
    dims : tuple or None
        The PyMC dims the manifest declares for the values' axes.
    exposure_column : str or None
        The public column of the values file that the manifest declares as each row's exposure
        (``exposure_column`` in ``[release]``: population, person-years, number of trials).
    exposure : np.ndarray or None
        That column as float64, one positive finite value per row (checked on reading).
    """

    path: Path
    manifest: dict
    name: str
    description: str
    units: str
    provenance: str
    mechanism: Mechanism
    values: np.ndarray
    index: pd.Index
    columns: list | None
    table: pd.DataFrame
    invariant_values: np.ndarray | None = None
    query_matrix: np.ndarray | None = None
    query_columns: list | None = None
    dims: tuple | None = None
    exposure_column: str | None = None
    exposure: np.ndarray | None = None

    def exposure_values(self, column: str, *, argument: str = "exposure") -> np.ndarray:
        """The column ``column`` of the values file as exposures (float64, one per row), with the
        checks of a declared ``exposure_column`` (present, numeric, positive and finite); a
        ``ValueError`` naming ``argument`` and the column otherwise."""
        values, problem = exposure_problem(self.table, column)
        if problem is not None:
            raise ValueError(f"{argument}: {problem}")
        return values

    @property
    def invariants(self) -> Invariants | None:
        return getattr(self.mechanism, "invariants", None)

    @property
    def row_labels(self) -> list[str]:
        """One string per row: the index label (several index columns joined by ", ")."""
        if isinstance(self.index, pd.MultiIndex):
            return [", ".join(str(v) for v in row) for row in self.index]
        return [str(v) for v in self.index]

    @property
    def cell_labels(self) -> list[str]:
        """One string per released value, in C order: the row label, and "row/column" when the
        values have several columns."""
        rows = self.row_labels
        if self.values.ndim == 1:
            return rows
        return [f"{r}/{c}" for r in rows for c in self.columns]

    @property
    def true_shape(self) -> tuple:
        """Shape of the true values the release observes: the queried counts' (one per
        ``query_columns`` label) with a declared query, the rows' for a multi-level release
        (its k levels are columns of one row), else the values'."""
        if self.query_matrix is not None:
            return (len(self.query_columns),)
        return np.shape(self.per_true_value()[0])

    def per_true_value(self) -> tuple[np.ndarray, list[str]] | None:
        """(one released value per true value, their labels), or None with a declared query
        (released values are then sums of true values). A multi-level release gives its level
        0: the least private level, of which the others are post-processing (x-free
        transitions, seed 003), so it carries everything the release says about the counts."""
        if self.query_matrix is not None:
            return None
        if isinstance(self.mechanism, MultiLevelGeometric):
            return self.values[..., 0], self.row_labels
        return self.values, self.cell_labels

    @property
    def coords(self) -> dict:
        """PyMC coords for the declared dims: the row labels (strings for several index columns)
        and, for 2-D values, the value columns. Empty without declared dims."""
        if not self.dims:
            return {}
        rows = self.row_labels if isinstance(self.index, pd.MultiIndex) else list(self.index)
        out = {self.dims[0]: rows}
        if len(self.dims) > 1 and self.values.ndim == 2:
            out[self.dims[1]] = list(self.columns)
        return out

    def observe(self, true_values, name: str | None = None, dims=None, *, model=None):
        """Register this release in the current PyMC model as the observation of
        ``true_values`` (``mechanism.observe(name or release name, true_values, observed=values,
        dims=dims)``), invariants included. With a declared ``[query]`` the mechanism observes
        Q x for the given counts x. ``dims`` defaults to the manifest's dims when the model has
        those coords."""
        import pymc as pm
        import pytensor.tensor as pt

        model = pm.modelcontext(model)
        if dims is None and self.dims and all(d in model.coords for d in self.dims):
            dims = self.dims if len(self.dims) > 1 else self.dims[0]
        latent = true_values
        if self.query_matrix is not None:
            shape = self.values.shape[:-1] if isinstance(self.mechanism, MultiLevelGeometric) \
                else self.values.shape
            latent = pt.dot(pt.constant(self.query_matrix), pt.as_tensor_variable(true_values).flatten())
            latent = latent.reshape(shape)
        return self.mechanism.observe(name or self.name, latent, self.values, dims=dims, model=model)

    def __repr__(self) -> str:
        return (f"Release({self.name!r}, {self.values.shape} values from {self.path.name}, "
                f"{self.mechanism!r})")


def _check_release_values(ctx: _Context, mech, values: np.ndarray, declared, shape_hint: str):
    """The mechanism's own checks of the released values, reported against the manifest."""
    inv = getattr(mech, "invariants", None)
    if inv is not None:
        if values.size != inv.n_cells:
            raise ctx.error("invariants", f"cover {inv.n_cells} cells (its n_cells, groups or matrix), but the values "
                            f"file has {values.size} values ({shape_hint})")
        if inv.kind == "margins" and values.ndim == 2 and tuple(values.shape) != tuple(inv.shape):
            raise ctx.error("invariants.shape", f"is {list(inv.shape)}, but the values form a "
                            f"{values.shape[0]} x {values.shape[1]} table")
    try:
        mech.check_release(values)
    except ValueError as err:
        raise ctx.error("release.values_file", f"the values are not a release of {mech!r}: {err}") from None
    if inv is None:
        return None
    flat = values.reshape(-1)
    actual = inv.values(flat)
    if declared is not None:
        try:
            inv.check_release(flat, declared)
        except ValueError as err:
            raise ctx.error("invariants.values", f"the released values break the declared "
                            f"invariants: {err}") from None
    try:
        if isinstance(mech, Conditioned):
            mech.check_invariants(values)
        elif not inv.is_feasible(actual):
            raise ValueError("the release's invariant values A s admit no non-negative integer counts")
    except ValueError as err:
        raise ctx.error("release.values_file", f"the values cannot be a release of {mech!r}: {err}") from None
    return actual


def read_release(path) -> Release:
    """Read a release: its manifest (TOML) and values file; ``path`` is the manifest or a
    directory holding ``release.toml``. Every check of the package docstring is made; a failure
    raises :class:`ReleaseFileError` naming the manifest and the field."""
    path = Path(path)
    if path.is_dir():
        path = path / "release.toml"
    ctx = _Context(path)
    if not path.is_file():
        raise FileNotFoundError(f"no release manifest at {str(path)!r}")
    try:
        manifest = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ctx.error("manifest", f"not valid TOML: {err}") from None
    _check_keys(ctx, manifest, _TOP_LEVEL, "", required=())
    fmt = manifest.get("format")
    if fmt is None:
        raise ctx.error("format", f"missing; a release manifest starts with format = \"{FORMAT}\"")
    if fmt != FORMAT:
        if isinstance(fmt, str) and fmt.startswith("dpinfer-release/"):
            raise ctx.error("format", f"version {fmt!r} is not supported (this dpinfer reads {FORMAT!r})")
        raise ctx.error("format", f"must be {FORMAT!r}, got {fmt!r}")
    for key in ("release", "mechanism"):
        if key not in manifest:
            raise ctx.error(key, "missing (a manifest needs [release] and [mechanism])")
    rel = _check_fields(ctx, manifest["release"], _RELEASE_FIELDS, "release")
    value_columns, index_columns = rel["value_columns"], rel.get("index_columns", [])
    for key, names in (("value_columns", value_columns), ("index_columns", index_columns)):
        if len(set(names)) != len(names):
            raise ctx.error(f"release.{key}", f"lists a column twice: {names}")
    both = set(value_columns) & set(index_columns)
    if both:
        raise ctx.error("release.index_columns", f"{sorted(both)} are also value columns")
    if not rel["name"].strip():
        raise ctx.error("release.name", "must not be empty")

    table = _read_table(ctx, path.parent / rel["values_file"], index_columns)
    for key, names in (("value_columns", value_columns), ("index_columns", index_columns)):
        for name in names:
            if name not in table.columns:
                raise ctx.error(f"release.{key}", f"column {name!r} is not in {rel['values_file']} "
                                f"(its columns: {list(table.columns)})")

    inv, declared = None, None
    if "invariants" in manifest:
        inv, declared = _decode_invariants(ctx, manifest["invariants"], values_table=table)
    mechanism = _decode_mechanism(ctx, manifest["mechanism"], inv)
    values = _values_of(ctx, table, value_columns, bool(mechanism.discrete), type(mechanism).__name__)
    shape_hint = f"{len(table)} rows x {len(value_columns)} value column(s)"
    actual = _check_release_values(ctx, mechanism, values, declared, shape_hint)

    if index_columns:
        for name in index_columns:
            missing = np.asarray(table[name].isna())
            if missing.any():
                raise ctx.error("release.index_columns", f"column {name!r} has an empty label at "
                                f"{_row_of(table, missing)}")
        index = pd.MultiIndex.from_frame(table[index_columns]) if len(index_columns) > 1 \
            else pd.Index(table[index_columns[0]], name=index_columns[0])
        if not index.is_unique:
            dup = index[index.duplicated()][0]
            raise ctx.error("release.index_columns", f"labels must identify the rows; {dup!r} repeats")
    else:
        index = pd.RangeIndex(len(table))
    dims = tuple(rel["dims"]) if "dims" in rel else None
    exposure_column, exposure = rel.get("exposure_column"), None
    if exposure_column is not None:
        if exposure_column in value_columns or exposure_column in index_columns:
            raise ctx.error("release.exposure_column", f"column {exposure_column!r} is a "
                            f"{'value' if exposure_column in value_columns else 'index'} column; "
                            "the exposure is a separate public column of the values file")
        exposure, problem = exposure_problem(table, exposure_column)
        if problem is not None:
            raise ctx.error("release.exposure_column", problem.replace(
                "the values file", rel["values_file"]))
    expected_dims = values.ndim - (1 if isinstance(mechanism, MultiLevelGeometric) else 0)
    if dims is not None and len(dims) != expected_dims:
        raise ctx.error("release.dims", f"names {len(dims)} dim(s), but the values have "
                        f"{expected_dims} axis(es) of true values")

    query, query_columns = None, None
    if "query" in manifest:
        query, query_columns = _decode_query(ctx, manifest["query"], bool(mechanism.discrete))
        n_released = values.size // (values.shape[-1] if isinstance(mechanism, MultiLevelGeometric) else 1)
        if query is not None and query.shape[0] != n_released:
            raise ctx.error("query", f"has {query.shape[0]} rows (released values) but the values "
                            f"file holds {n_released}")
    return Release(
        path=path, manifest=manifest, name=rel["name"], description=rel.get("description", ""),
        units=rel.get("units", ""), provenance=rel.get("provenance", ""), mechanism=mechanism,
        values=values, index=index, columns=list(value_columns) if values.ndim == 2 else None,
        table=table, invariant_values=actual, query_matrix=query, query_columns=query_columns,
        dims=dims, exposure_column=exposure_column, exposure=exposure)
