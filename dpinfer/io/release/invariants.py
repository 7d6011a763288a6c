"""The ``[invariants]`` table: the linear equalities ``A x = a`` a mechanism holds exact, by
kind (total, group totals, margins, matrix), read into an
:class:`~dpinfer.lattice.invariants.Invariants` and written back from one."""

from __future__ import annotations

import difflib

import numpy as np

from dpinfer.io.release.fields import Field, ReleaseFileError, _check_fields, _Context, _is_whole
from dpinfer.lattice.invariants import Invariants

_INVARIANT_COMMON = (
    Field("values", "integers", "the published invariant values A x, one per constraint row; "
          "checked against the release", required=False),
    Field("description", "string", "what the invariants are", required=False),
)
_INVARIANT_KINDS = {
    "total": (Field("n_cells", "integer", "number of cells whose total is invariant"),),
    "group_totals": (
        Field("groups", "labels", "group label of each cell (C order); one total per group, "
              "groups ordered by first appearance", required=False),
        Field("group_column", "string", "a column of the values file holding each row's group "
              "(instead of groups)", required=False)),
    "margins": (Field("shape", "integers", "table shape (cells in C order)"),
                Field("margins", "axes_list", "kept axes of each margin, e.g. [[0], [1]]")),
    "matrix": (Field("matrix", "integer_matrix", "constraint matrix A (rows: constraints, "
                     "columns: cells in C order)"),),
}


def _decode_invariants(ctx: _Context, table, *, values_table=None, where="invariants"):
    """(Invariants, declared values or None) from an ``[invariants]`` table."""
    if not isinstance(table, dict):
        raise ctx.error(where, f"must be a table, got {type(table).__name__}")
    if "kind" not in table:
        raise ctx.error(f"{where}.kind", f"missing (one of {list(_INVARIANT_KINDS)})")
    kind = table["kind"]
    if not isinstance(kind, str) or kind not in _INVARIANT_KINDS:
        close = difflib.get_close_matches(str(kind), list(_INVARIANT_KINDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ctx.error(f"{where}.kind", f"unknown kind {kind!r}{hint} (one of {list(_INVARIANT_KINDS)})")
    fields = _INVARIANT_KINDS[kind] + _INVARIANT_COMMON
    p = _check_fields(ctx, table, fields, where, fixed=("kind",))
    try:
        if kind == "total":
            inv = Invariants.total(p["n_cells"])
        elif kind == "group_totals":
            if ("groups" in p) == ("group_column" in p):
                raise ctx.error(where, "give exactly one of groups (a label per cell) or group_column")
            if "groups" in p:
                labels = p["groups"]
            else:
                column = p["group_column"]
                if values_table is None:
                    raise ctx.error(f"{where}.group_column", "needs the values file (read the whole "
                                    "release with read_release), or list the labels in groups")
                if column not in values_table.columns:
                    raise ctx.error(f"{where}.group_column", f"column {column!r} is not in the values "
                                    f"file (columns: {list(values_table.columns)})")
                labels = values_table[column].tolist()
            inv = Invariants.groups(labels)
        elif kind == "margins":
            inv = Invariants.margins(tuple(p["shape"]), [tuple(m) for m in p["margins"]])
        else:
            inv = Invariants.from_matrix(np.array(p["matrix"], dtype=np.int64))
    except ReleaseFileError:
        raise
    except (ValueError, TypeError) as err:
        raise ctx.error(where, f"Invariants ({kind}) refused: {err}") from None
    declared = None
    if "values" in p:
        declared = np.array(p["values"], dtype=np.int64)
        rows = inv.constraint_matrix.shape[0]
        if declared.size != rows:
            raise ctx.error(f"{where}.values", f"has {declared.size} entries but the invariants have "
                            f"{rows} constraint rows (one value per row)")
    return inv, declared


def _encode_invariants(ctx: _Context, inv: Invariants) -> dict:
    if inv.kind == "total":
        return {"kind": "total", "n_cells": inv.n_cells}
    if inv.kind == "groups":
        labels = []
        for code in inv.group_codes:
            label = inv.group_names[int(code)]
            label = label.item() if isinstance(label, np.generic) else label
            if not (isinstance(label, str) or _is_whole(label)) or isinstance(label, bool):
                raise ctx.error("invariants.groups", f"group label {label!r} is neither a string nor "
                                "an integer, so it cannot be written to TOML")
            labels.append(label)
        return {"kind": "group_totals", "groups": labels}
    if inv.kind == "margins":
        return {"kind": "margins", "shape": [int(s) for s in inv.shape],
                "margins": [[int(a) for a in m] for m in inv.margin_axes]}
    return {"kind": "matrix", "matrix": np.asarray(inv.constraint_matrix).tolist()}


def _invariants_fingerprint(inv: Invariants) -> tuple:
    return (inv.kind, inv.n_cells, np.asarray(inv.constraint_matrix).tobytes(),
            inv.constraint_matrix.shape, inv.group_names, inv.shape,
            None if inv.margin_axes is None else tuple(inv.margin_axes))
