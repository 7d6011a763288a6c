"""The ``[query]`` table: what the released cells are, as a linear query ``Q`` of the
underlying counts (cells, group totals or a matrix)."""

from __future__ import annotations

import numpy as np

from dpinfer.io.release.fields import Field, _check_fields, _Context

_QUERY_COMMON = (Field("description", "string", "what the released cells are", required=False),)
_QUERY_KINDS = {
    "cells": (Field("columns", "labels", "labels of the underlying counts", required=False),
              Field("cells", "labels", "the released subset of columns, in release order",
                    required=False)),
    "totals": (Field("groups", "labels", "group of each underlying count; released value i is "
                     "the total of the i-th group (first-appearance order)"),
               Field("columns", "labels", "labels of the underlying counts", required=False)),
    "matrix": (Field("matrix", "number_matrix", "query matrix Q: released value i = "
                     "sum_j Q[i, j] x_j"),
               Field("columns", "labels", "labels of the underlying counts (columns of Q)",
                     required=False)),
}


def _decode_query(ctx: _Context, table, discrete: bool):
    """(Q or None, column labels or None) of a ``[query]`` table."""
    if not isinstance(table, dict):
        raise ctx.error("query", f"must be a table, got {type(table).__name__}")
    kind = table.get("kind")
    if not isinstance(kind, str) or kind not in _QUERY_KINDS:
        raise ctx.error("query.kind", f"must be one of {list(_QUERY_KINDS)}, got {kind!r}")
    p = _check_fields(ctx, table, _QUERY_KINDS[kind] + _QUERY_COMMON, "query", fixed=("kind",))
    columns = p.get("columns")
    if columns is not None and len(set(map(str, columns))) != len(columns):
        raise ctx.error("query.columns", "labels must be distinct")
    if kind == "cells":
        if "cells" not in p:
            return None, columns
        if columns is None:
            raise ctx.error("query.cells", "needs query.columns (the labels the cells are chosen from)")
        q = np.zeros((len(p["cells"]), len(columns)), dtype=np.int64)
        for i, cell in enumerate(p["cells"]):
            if cell not in columns:
                raise ctx.error(f"query.cells[{i}]", f"{cell!r} is not one of query.columns")
            q[i, columns.index(cell)] = 1
        return q, columns
    if kind == "totals":
        labels = p["groups"]
        order = list(dict.fromkeys(labels))
        q = np.zeros((len(order), len(labels)), dtype=np.int64)
        q[[order.index(g) for g in labels], np.arange(len(labels))] = 1
    else:
        q = np.array(p["matrix"], dtype=np.float64)
        if discrete:
            if not np.all(q == np.round(q)):
                raise ctx.error("query.matrix", "must hold whole numbers: a discrete mechanism "
                                "releases integer queries of the counts")
            q = q.astype(np.int64)
    if columns is not None and len(columns) != q.shape[1]:
        raise ctx.error("query.columns", f"has {len(columns)} labels but the query has "
                        f"{q.shape[1]} columns (underlying counts)")
    return q, columns
