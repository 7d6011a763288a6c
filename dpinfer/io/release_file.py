r"""Release files: a privatised release as a values file plus a TOML manifest.

An analyst meets a release as files: the released values (CSV, or Parquet where pyarrow is
installed) and a manifest that states how they were made, so that the release's exact
likelihood can be rebuilt without retyping anything::

    release = dp.read_release("models/midwest_american_indian/release.toml")
    with pm.Model(coords=release.coords) as model:
        ...
        count = pm.Poisson("count", rate, dims="county")
        release.observe(count)          # p(release | count), invariants included

A curator writes the same files from the mechanism object that made the release (the
manifest can also be written by hand; :func:`write_release` is a convenience)::

    write_release("release.toml", mechanism, noisy, index=counties, name="counts",
                  description="...", units="people", provenance="...")

Manifest (format ``dpinfer-release/1``; JSON Schema ``release-schema.json`` next to this module)
-------------------------------------------------------------------------------------------

.. code-block:: toml

    format = "dpinfer-release/1"

    [release]
    name = "delinquent_children"          # also the default PyMC variable name
    description = "..."                    # optional
    units = "children"                     # optional
    provenance = "..."                     # optional: who released it, how, with which seed
    created = 2026-11-25                   # optional: TOML date/datetime or a string
    values_file = "release.csv"            # relative to the manifest; .csv or .parquet
    value_columns = ["Low", "Medium"]      # one column: values (n,); k columns: (n, k)
    index_columns = ["county"]             # optional: labels of the rows
    dims = ["county", "education"]         # optional: PyMC dims of the values' axes

    [mechanism]
    family = "Conditioned"                 # a dpinfer mechanism class
    nonnegative = false                    # its constructor parameters, by name

    [mechanism.base]                       # Conditioned's base mechanism
    family = "DoubleGeometric"
    epsilon = 0.25
    sensitivity = 1
    neighbour = "add-remove"

    [invariants]                           # Conditioned, GeneralizedLaplace, GeneralizedGaussian
    kind = "margins"                       # total | group_totals | margins | matrix
    shape = [4, 4]
    margins = [[0], [1]]
    values = [20, 55, 25, 35, 50, 35, 30, 20]   # optional: the published A x, checked

    [query]                                # optional: what the released cells are
    kind = "matrix"                        # cells | totals | matrix
    matrix = [[1, 1, 0], [0, 0, 1]]        # released value i = sum_j Q[i, j] x_j

``[mechanism]`` takes ``family``, optionally ``constructor`` (a documented classmethod such as
``Gaussian.from_sigma``; absent = the class itself), the constructor's parameters by name
(``neighbour`` is always stated) and optionally a ``[mechanism.privacy]`` table (epsilon,
delta, sensitivity, neighbour, norm) that is checked against the rebuilt mechanism's
``privacy``. :data:`FAMILIES` lists every family's parameters. Unknown keys anywhere are
errors (typo protection).

Reading checks everything it can before an analysis starts: the manifest against the schema
(field by field; ``jsonschema`` is not a dependency), the mechanism by constructing it, the
values file (columns present, numeric, finite, whole numbers for a discrete mechanism, one
value per cell of the invariants), the mechanism's own ``check_release`` (bounds, table
sizes), declared invariant values against the released ones, and for a conditioned release
that its invariants admit non-negative counts (``Conditioned.check_invariants``). Every
problem raises :class:`ReleaseFileError` (a ``ValueError``) whose message starts with the
manifest's path and the field.

Round trip (:func:`mechanism_to_manifest`, :func:`mechanism_from_manifest`): every mechanism
class of :mod:`dpinfer.mechanisms` is written from its public attributes and rebuilt by its
constructor; the writer rebuilds it at once and refuses (naming what is missing) unless the
rebuilt object has the same public state and the same ``privacy``. Limits, from what the
classes expose: ``Logistic.per_coordinate`` / ``Subbotin.per_coordinate`` and
``Subbotin(..., dimension=d > 1)`` do not keep d publicly (pass ``cells=d``; ``write_release``
passes the number of released values); ``RandomizedResponse`` keeps an exact rational ``p``
privately (a float ``p`` is exposed): a rational p is recovered as the simplest fraction with
denominator <= 10^6 that reproduces the float and the privacy exactly;
``GeneralizedGaussian``'s epsilon is public only through ``privacy`` (refused where its
lattice cannot be enumerated).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import math
import numbers
import re
import tomllib
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from dpinfer.lattice.coupling import MeetingTimes
from dpinfer.lattice.invariants import Invariants
from dpinfer.mechanisms import (
    BITLaplace,
    ClampedGeometric,
    Conditioned,
    DiscreteGaussian,
    DoubleGeometric,
    Gaussian,
    GeneralizedGaussian,
    GeneralizedLaplace,
    Laplace,
    Logistic,
    Mechanism,
    MultiLevelGeometric,
    RandomizedResponse,
    Subbotin,
    TruncatedLaplace,
)
from dpinfer.mechanisms.generalized_gaussian import PrivacyUnverifiedError

__all__ = [
    "FAMILIES",
    "FORMAT",
    "Release",
    "ReleaseFileError",
    "SCHEMA_PATH",
    "mechanism_from_manifest",
    "mechanism_to_manifest",
    "read_release",
    "release_schema",
    "toml_dumps",
    "write_release",
    "write_schema",
]

FORMAT = "dpinfer-release/1"
SCHEMA_PATH = Path(__file__).with_name("release-schema.json")
_RATIONAL_DENOMINATOR = 10**6  # RandomizedResponse: largest denominator tried for a rational p
_PRIVACY_RTOL = 1e-9  # [mechanism.privacy] epsilon and delta are checked to this relative tolerance


class ReleaseFileError(ValueError):
    """A release manifest or values file that cannot be read as stated. The message starts with
    the manifest's path and the field (``release.value_columns``, ``mechanism.base.epsilon``,
    ...); both are also attributes."""

    def __init__(self, where, field: str, message: str):
        self.path = where
        self.field = field
        super().__init__(f"{where}: {field}: {message}")


# ================================================================================ the schema
@dataclasses.dataclass(frozen=True)
class Field:
    """One manifest key: its name, value kind (see :data:`_KINDS`), whether it is required, a
    description (published in the JSON Schema) and, for ``kind="enum"``, the allowed values."""

    name: str
    kind: str
    description: str
    required: bool = True
    enum: tuple = ()


_NEIGHBOURS = ("add-remove", "substitution")


def _neighbour() -> Field:
    return Field("neighbour", "enum", "neighbour relation under which the sensitivity holds",
                 enum=_NEIGHBOURS)


def _sensitivity(integer: bool = False) -> Field:
    what = "whole number >= 1" if integer else "number > 0"
    return Field("sensitivity", "integer" if integer else "number",
                 f"sensitivity of the query ({what}) under the neighbour relation")


_EPSILON = Field("epsilon", "number", "privacy parameter epsilon > 0")
_DELTA = Field("delta", "number", "privacy parameter delta in (0, 1)")
_DELTA_OR_ZERO = Field("delta", "number", "privacy parameter delta in [0, 1) (0: pure DP)")
_EPSILON_OR_ZERO = Field("epsilon", "number", "privacy parameter epsilon >= 0")
_R = Field("r", "number", "Subbotin shape r >= 1 (1: Laplace, 2: Gaussian)")
_DIMENSION = Field("dimension", "integer", "length d of the vector query the guarantee covers")

#: family -> constructor ("__init__" = the class itself) -> its parameters, by constructor name.
FAMILIES: dict[str, dict[str, tuple[Field, ...]]] = {
    "Laplace": {"__init__": (_EPSILON, _sensitivity(), _neighbour())},
    "DoubleGeometric": {"__init__": (_EPSILON, _sensitivity(True), _neighbour())},
    "ClampedGeometric": {"__init__": (
        _EPSILON,
        Field("lower", "integer", "lower clamp bound (whole number)"),
        Field("upper", "integer", "upper clamp bound (whole number); absent: clamped at lower only",
              required=False),
        _sensitivity(True), _neighbour())},
    "Gaussian": {
        "__init__": (_EPSILON, _DELTA, _sensitivity(), _neighbour()),
        "from_sigma": (Field("sigma", "number", "noise standard deviation > 0"), _DELTA,
                       _sensitivity(), _neighbour()),
    },
    "DiscreteGaussian": {
        "__init__": (Field("sigma", "number", "noise scale sigma > 0"), _DELTA, _sensitivity(True),
                     _neighbour()),
        "from_privacy": (_EPSILON, _DELTA, _sensitivity(True), _neighbour()),
    },
    "TruncatedLaplace": {"__init__": (
        _EPSILON,
        Field("lower", "number", "lower bound of the release"),
        Field("upper", "number", "upper bound of the release"),
        _sensitivity(),
        Field("scale", "scale_rule", "Laplace scale: a number > 0, 'paper' or 'conservative'; "
              "absent: the smallest scale that is epsilon-DP", required=False),
        _neighbour())},
    "BITLaplace": {"__init__": (
        _EPSILON,
        Field("lower", "number", "lower clamp bound"),
        Field("upper", "number", "upper clamp bound; absent: clamped at lower only", required=False),
        _sensitivity(), _neighbour())},
    "Logistic": {
        "__init__": (_EPSILON_OR_ZERO, _DELTA_OR_ZERO, _sensitivity(), _neighbour()),
        "from_scale": (Field("scale", "number", "Logistic scale s > 0"), _DELTA_OR_ZERO,
                       _sensitivity(), _neighbour()),
        "per_coordinate": (_EPSILON_OR_ZERO, _DELTA_OR_ZERO, _DIMENSION, _sensitivity(), _neighbour()),
    },
    "Subbotin": {
        "__init__": (_R, _EPSILON_OR_ZERO, _DELTA_OR_ZERO, _sensitivity(), _neighbour(),
                     dataclasses.replace(_DIMENSION, required=False,
                                         description="vector length d; > 1 only for r = 2")),
        "from_scale": (_R, Field("scale", "number", "Subbotin scale s > 0"), _DELTA_OR_ZERO,
                       _sensitivity(), _neighbour()),
        "per_coordinate": (_R, _EPSILON_OR_ZERO, _DELTA_OR_ZERO, _DIMENSION, _sensitivity(),
                           _neighbour()),
    },
    "MultiLevelGeometric": {"__init__": (
        Field("epsilons", "numbers", "strictly decreasing epsilons, level 0 (least private) first"),
        _sensitivity(True),
        Field("lower", "integer", "lower clamp bound; absent: unbounded", required=False),
        Field("upper", "integer", "upper clamp bound (needs lower)", required=False),
        _neighbour())},
    "RandomizedResponse": {
        "__init__": (Field("p", "ratio", "probability of keeping each bit, in (1/2, 1): a number "
                           "or an exact fraction written as a string \"a/b\""),
                     Field("attributes", "integer", "binary attributes per record (tables of "
                           "2**attributes cells)", required=False)),
        "from_epsilon": (Field("epsilon", "number", "per-attribute epsilon > 0"),
                         Field("attributes", "integer", "binary attributes per record",
                               required=False)),
    },
    "Conditioned": {"__init__": (
        Field("base", "base_mechanism", "the discrete additive base mechanism (a table)"),
        Field("nonnegative", "boolean", "also conditioned on a non-negative release (seed 000's "
              "congenial mechanism)"),
        Field("burn_in_sweeps", "integer", "sweeps of the simulation-grade noise chain",
              required=False))},
    "GeneralizedGaussian": {"__init__": (
        Field("sigma", "number", "lattice Gaussian scale sigma > 0"), _EPSILON)},
    "GeneralizedLaplace": {"__init__": (
        _EPSILON,
        Field("norm", "enum", "norm of the noise law exp(-epsilon ||z||)", enum=("l1", "l2")),
        Field("iterations", "integer", "sweeps or steps of the MCMC release chain", required=False),
        Field("proposal_a", "number", "random-walk proposal parameter in (0, 1)", required=False),
        Field("chain", "enum", "MCMC release chain", required=False, enum=("gibbs", "walk")),
        Field("certificate", "certificate", "TV certificate of the MCMC releases (certify())",
              required=False))},
}

_CLASSES = {cls.__name__: cls for cls in (
    Laplace, DoubleGeometric, ClampedGeometric, Gaussian, DiscreteGaussian, TruncatedLaplace,
    BITLaplace, Logistic, Subbotin, MultiLevelGeometric, RandomizedResponse, Conditioned,
    GeneralizedGaussian, GeneralizedLaplace)}
INVARIANT_FAMILIES = ("Conditioned", "GeneralizedGaussian", "GeneralizedLaplace")
BASE_FAMILIES = ("DoubleGeometric", "DiscreteGaussian")  # discrete additive: Conditioned's bases

_PRIVACY_FIELDS = (
    Field("epsilon", "number", "claimed epsilon", required=False),
    Field("delta", "number", "claimed delta", required=False),
    Field("sensitivity", "number", "sensitivity", required=False),
    Field("neighbour", "string", "neighbour relation (add-remove, substitution, equal-invariants)",
          required=False),
    Field("norm", "string", "norm of the sensitivity", required=False),
)
_CERTIFICATE_FIELDS = (
    Field("tv", "number", "certified total-variation distance of the releases from the exact law"),
    Field("level", "number", "confidence level of the upper limit"),
    Field("lag", "integer", "lag L of the coupled chains"),
    Field("max_iterations", "integer", "cap on the meeting times"),
    Field("meeting_times", "integers", "meeting time of each coupled run (-1: not met)"),
)
_RELEASE_FIELDS = (
    Field("name", "string", "name of the release (the default PyMC variable name)"),
    Field("description", "string", "what was released", required=False),
    Field("units", "string", "units of the released values", required=False),
    Field("provenance", "string", "who released it, from which data, how (sampler, seed)",
          required=False),
    Field("created", "date", "when (a TOML date or datetime, or a string)", required=False),
    Field("values_file", "string", "values file, relative to the manifest (.csv or .parquet)"),
    Field("value_columns", "strings", "columns holding the released values: one column gives "
          "values of shape (rows,), k columns (rows, k)"),
    Field("index_columns", "strings", "columns labelling the rows", required=False),
    Field("dims", "strings", "PyMC dims of the values' axes", required=False),
)
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
_TOP_LEVEL = ("format", "release", "mechanism", "invariants", "query")

# JSON Schema of each value kind (the Python checks in _check_kind mirror them)
_KINDS = {
    "number": {"type": "number"},
    "integer": {"type": "integer"},
    "string": {"type": "string"},
    "boolean": {"type": "boolean"},
    "date": {"type": "string", "description": "TOML date/datetime (as an ISO string in JSON)"},
    "numbers": {"type": "array", "minItems": 1, "items": {"type": "number"}},
    "integers": {"type": "array", "minItems": 1, "items": {"type": "integer"}},
    "strings": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    "labels": {"type": "array", "minItems": 1, "items": {"type": ["string", "integer"]}},
    "axes_list": {"type": "array", "minItems": 1,
                  "items": {"type": "array", "items": {"type": "integer"}}},
    "integer_matrix": {"type": "array", "minItems": 1,
                       "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}}},
    "number_matrix": {"type": "array", "minItems": 1,
                      "items": {"type": "array", "minItems": 1, "items": {"type": "number"}}},
    "scale_rule": {"oneOf": [{"type": "number"}, {"enum": ["paper", "conservative"]}]},
    "ratio": {"oneOf": [{"type": "number"},
                        {"type": "string", "pattern": r"^\s*[0-9]+\s*/\s*[0-9]+\s*$"}]},
    "base_mechanism": {"$ref": "#/$defs/base_mechanism"},
    "certificate": {"$ref": "#/$defs/certificate"},
}


def _schema_object(fields, fixed: dict, description: str) -> dict:
    properties = dict(fixed)
    for f in fields:
        prop = {"enum": list(f.enum)} if f.kind == "enum" else dict(_KINDS[f.kind])
        prop["description"] = (prop.get("description", "") + "; " if "description" in prop else "") \
            + f.description
        properties[f.name] = prop
    required = [k for k in fixed if k in ("family", "constructor", "kind")] + \
        [f.name for f in fields if f.required]
    return {"type": "object", "description": description, "properties": properties,
            "required": required, "additionalProperties": False}


def _first_doc_line(cls) -> str:
    return " ".join((cls.__doc__ or cls.__name__).strip().split("\n\n")[0].split())


def release_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a release manifest read as JSON (TOML dates as ISO
    strings), built from :data:`FAMILIES` and the tables above: the published documentation of
    the format, kept in ``release-schema.json`` (:func:`write_schema`)."""
    defs: dict = {}
    variants, bases = [], []
    for family, constructors in FAMILIES.items():
        for constructor, fields in constructors.items():
            key = family if constructor == "__init__" else f"{family}.{constructor}"
            fixed = {"family": {"const": family, "description": "dpinfer mechanism class"}}
            if constructor != "__init__":
                fixed["constructor"] = {"const": constructor,
                                        "description": f"the classmethod {family}.{constructor}"}
            extra = {"privacy": {"$ref": "#/$defs/privacy"}}
            schema = _schema_object(fields, fixed, _first_doc_line(_CLASSES[family]))
            schema["properties"].update(extra)
            defs[f"mechanism.{key}"] = schema
            variants.append({"$ref": f"#/$defs/mechanism.{key}"})
            if family in BASE_FAMILIES:
                bases.append({"$ref": f"#/$defs/mechanism.{key}"})
    defs["mechanism"] = {"description": "the mechanism that made the release", "oneOf": variants}
    defs["base_mechanism"] = {"description": "a discrete additive mechanism (Conditioned's base)",
                              "oneOf": bases}
    defs["privacy"] = _schema_object(_PRIVACY_FIELDS, {}, "the claimed guarantee, checked "
                                     "against the rebuilt mechanism's privacy")
    defs["certificate"] = _schema_object(_CERTIFICATE_FIELDS, {}, "L-lag coupling certificate "
                                         "(GeneralizedLaplace.certify); iterations must follow from it")
    defs["release"] = _schema_object(_RELEASE_FIELDS, {}, "the release and its values file")
    inv = []
    for kind, fields in _INVARIANT_KINDS.items():
        defs[f"invariants.{kind}"] = _schema_object(
            fields + _INVARIANT_COMMON, {"kind": {"const": kind}}, f"invariants: {kind}")
        inv.append({"$ref": f"#/$defs/invariants.{kind}"})
    defs["invariants.group_totals"]["oneOf"] = [{"required": ["groups"]}, {"required": ["group_column"]}]
    defs["invariants"] = {"description": "linear equalities A x = a held exact by the mechanism",
                          "oneOf": inv}
    query = []
    for kind, fields in _QUERY_KINDS.items():
        defs[f"query.{kind}"] = _schema_object(fields + _QUERY_COMMON, {"kind": {"const": kind}},
                                               f"query: {kind}")
        query.append({"$ref": f"#/$defs/query.{kind}"})
    defs["query"] = {"description": "what the released cells are, as a linear query of the "
                     "underlying counts (absent: the counts themselves)", "oneOf": query}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"dpinfer release manifest ({FORMAT})",
        "description": "A privatised release: values file + mechanism + invariants + query. The "
                       "manifest is TOML; this schema applies to it read as JSON.",
        "type": "object",
        "properties": {
            "format": {"const": FORMAT},
            "release": {"$ref": "#/$defs/release"},
            "mechanism": {"$ref": "#/$defs/mechanism"},
            "invariants": {"$ref": "#/$defs/invariants"},
            "query": {"$ref": "#/$defs/query"},
        },
        "required": ["format", "release", "mechanism"],
        "additionalProperties": False,
        "allOf": [{
            "if": {"properties": {"mechanism": {"properties": {
                "family": {"enum": list(INVARIANT_FAMILIES)}}}}},
            "then": {"required": ["invariants"]},
            "else": {"not": {"required": ["invariants"]}},
        }],
        "$defs": defs,
    }


def write_schema(path=SCHEMA_PATH) -> Path:
    """Write :func:`release_schema` as JSON (the published ``release-schema.json``)."""
    path = Path(path)
    path.write_text(json.dumps(release_schema(), indent=2, ensure_ascii=False) + "\n")
    return path


# ========================================================================= field validation
class _Context:
    """Where errors are reported: the manifest's path (or a stand-in)."""

    def __init__(self, where):
        self.where = str(where) if where is not None else "<manifest>"

    def error(self, field: str, message: str) -> ReleaseFileError:
        return ReleaseFileError(self.where, field, message)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_whole(v) -> bool:
    return (isinstance(v, numbers.Integral) and not isinstance(v, bool)) or \
        (isinstance(v, float) and v.is_integer())


def _check_keys(ctx: _Context, table, allowed, where: str, required=()) -> None:
    if not isinstance(table, dict):
        raise ctx.error(where, f"must be a table, got {type(table).__name__} {table!r}")
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ctx.error(f"{where}.{key}" if where else key,
                            f"unknown key{hint} (allowed here: {', '.join(sorted(allowed))})")
    for key in required:
        if key not in table:
            raise ctx.error(f"{where}.{key}" if where else key, "missing (required)")


def _check_kind(ctx: _Context, value, f: Field, where: str):
    """The value of field ``f`` checked against its kind and converted (whole floats to int)."""
    def fail(expected):
        raise ctx.error(where, f"must be {expected}, got {value!r}")

    kind = f.kind
    if kind == "number":
        return value if _is_number(value) else fail("a number")
    if kind == "integer":
        return int(value) if _is_whole(value) else fail("a whole number")
    if kind == "string":
        return value if isinstance(value, str) else fail("a string")
    if kind == "boolean":
        return value if isinstance(value, bool) else fail("true or false")
    if kind == "enum":
        return value if value in f.enum else fail(f"one of {list(f.enum)}")
    if kind == "date":
        if isinstance(value, (str, datetime.date, datetime.datetime, datetime.time)):
            return value
        return fail("a TOML date, datetime or string")
    if kind in ("numbers", "integers", "strings", "labels"):
        if not isinstance(value, list) or not value:
            return fail(f"a non-empty array ({kind})")
        check = {"numbers": _is_number, "integers": _is_whole,
                 "strings": lambda v: isinstance(v, str),
                 "labels": lambda v: isinstance(v, str) or _is_whole(v)}[kind]
        for i, v in enumerate(value):
            if not check(v):
                raise ctx.error(f"{where}[{i}]", f"must be {'a ' + kind[:-1]}, got {v!r}")
        return [int(v) for v in value] if kind == "integers" else value
    if kind in ("integer_matrix", "number_matrix", "axes_list"):
        if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
            return fail("a non-empty array of arrays")
        check = _is_number if kind == "number_matrix" else _is_whole
        for i, row in enumerate(value):
            if kind != "axes_list" and not row:
                raise ctx.error(f"{where}[{i}]", "must be a non-empty array")
            for j, v in enumerate(row):
                if not check(v):
                    raise ctx.error(f"{where}[{i}][{j}]", f"must be a "
                                    f"{'number' if kind == 'number_matrix' else 'whole number'}, got {v!r}")
        if kind != "axes_list" and len({len(r) for r in value}) != 1:
            raise ctx.error(where, f"rows must have equal lengths, got {[len(r) for r in value]}")
        return value
    if kind == "scale_rule":
        if _is_number(value) or value in ("paper", "conservative"):
            return value
        return fail("a number, 'paper' or 'conservative'")
    if kind == "ratio":
        if _is_number(value):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*/\s*[0-9]+\s*", value):
            num, den = (int(v) for v in value.split("/"))
            if den == 0:
                return fail("a fraction with a non-zero denominator")
            return Fraction(num, den)
        return fail('a number or a fraction written as a string "a/b"')
    raise AssertionError(f"unknown field kind {kind!r}")  # pragma: no cover


def _check_fields(ctx: _Context, table: dict, fields, where: str, fixed=()) -> dict:
    """Keys, required fields and kinds of ``table``; returns {name: converted value}."""
    allowed = set(fixed) | {f.name for f in fields}
    _check_keys(ctx, table, allowed, where)
    out = {}
    for f in fields:
        key = f"{where}.{f.name}" if where else f.name
        if f.name not in table:
            if f.required:
                needed = ", ".join(g.name for g in fields if g.required)
                raise ctx.error(key, f"missing (required here: {needed})")
            continue
        if f.kind in ("base_mechanism", "certificate"):
            out[f.name] = table[f.name]  # nested tables: checked by their own readers
        else:
            out[f.name] = _check_kind(ctx, table[f.name], f, key)
    return out


# ================================================================================ invariants
def _decode_invariants(ctx: _Context, table, *, values_table=None, where="invariants"):
    """(Invariants, declared values or None) from an ``[invariants]`` table."""
    if not isinstance(table, dict):
        raise ctx.error(where, f"must be a table, got {type(table).__name__}")
    if "kind" not in table:
        raise ctx.error(f"{where}.kind", f"missing (one of {list(_INVARIANT_KINDS)})")
    kind = table["kind"]
    if kind not in _INVARIANT_KINDS:
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


# ================================================================================ mechanisms
def _decode_mechanism(ctx: _Context, table, invariants, *, where="mechanism", bases_only=False):
    """The mechanism of a ``[mechanism]`` table (``invariants``: the Invariants of the manifest,
    or None)."""
    if not isinstance(table, dict):
        raise ctx.error(where, f"must be a table, got {type(table).__name__}")
    allowed_families = BASE_FAMILIES if bases_only else tuple(FAMILIES)
    family = table.get("family")
    if family is None:
        raise ctx.error(f"{where}.family", f"missing (one of {list(allowed_families)})")
    if family not in allowed_families:
        close = difflib.get_close_matches(str(family), list(allowed_families), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        what = "base mechanism family" if bases_only else "mechanism family"
        why = " (Conditioned needs a discrete additive base)" if bases_only else ""
        raise ctx.error(f"{where}.family", f"unknown {what} {family!r}{hint}; one of "
                        f"{list(allowed_families)}{why}")
    constructors = FAMILIES[family]
    constructor = table.get("constructor", "__init__")
    if constructor not in constructors:
        others = [c for c in constructors if c != "__init__"]
        raise ctx.error(f"{where}.constructor", f"{family} has no constructor {constructor!r}; "
                        f"omit it (the class itself) or use one of {others}")
    fields = constructors[constructor]
    params = _check_fields(ctx, table, fields, where, fixed=("family", "constructor", "privacy"))
    if "base" in params:
        params["base"] = _decode_mechanism(ctx, params["base"], None, where=f"{where}.base",
                                           bases_only=True)
    certificate = params.pop("certificate", None)
    if family in INVARIANT_FAMILIES:
        if invariants is None:
            raise ctx.error("invariants", f"missing: {family} holds invariants, so the manifest "
                            "needs an [invariants] table")
        params["invariants"] = invariants
    elif invariants is not None and where == "mechanism":
        raise ctx.error("invariants", f"declared, but {family} holds no invariants (the release "
                        "would not keep them); use Conditioned(base, invariants) or drop [invariants]")
    cls = _CLASSES[family]
    build = cls if constructor == "__init__" else getattr(cls, constructor)
    try:
        mechanism = build(**params)
    except (ValueError, TypeError) as err:
        name = family if constructor == "__init__" else f"{family}.{constructor}"
        raise ctx.error(where, f"{name} refused its parameters: {err}") from None
    if certificate is not None:
        _apply_certificate(ctx, mechanism, certificate, f"{where}.certificate")
    if "privacy" in table:
        _check_privacy(ctx, mechanism, table["privacy"], f"{where}.privacy")
    return mechanism


def _apply_certificate(ctx: _Context, mech: GeneralizedLaplace, table, where: str) -> None:
    """Set the TV certificate of an MCMC-released GeneralizedLaplace, as ``certify`` does,
    after checking that ``iterations`` is what the meeting times give."""
    c = _check_fields(ctx, table, _CERTIFICATE_FIELDS, where)
    if mech.sampler == "exact":
        raise ctx.error(where, "given, but this mechanism's releases are exact (no MCMC to certify)")
    try:
        times = MeetingTimes(tau=np.array(c["meeting_times"], dtype=np.int64), lag=c["lag"],
                             max_iterations=c["max_iterations"])
        needed = times.iterations_for(c["tv"], level=c["level"])
    except (ValueError, TypeError) as err:
        raise ctx.error(where, f"cannot be evaluated: {err}") from None
    if mech.iterations != needed:
        raise ctx.error(where, f"the meeting times certify tv <= {c['tv']} after {needed} "
                        f"iterations, but the mechanism states iterations = {mech.iterations}")
    mech.certified_tv, mech.certified_level, mech.coupling_result = float(c["tv"]), float(c["level"]), times


def _check_privacy(ctx: _Context, mech, table, where: str) -> None:
    stated = _check_fields(ctx, table, _PRIVACY_FIELDS, where)
    try:
        actual = mech.privacy
    except Exception as err:  # noqa: BLE001 - any failure to state the privacy is reported
        raise ctx.error(where, f"stated, but the mechanism's privacy cannot be computed: {err}") from None
    for key, value in stated.items():
        have = getattr(actual, key)
        if isinstance(value, str):
            same = value == have
        else:
            same = math.isclose(float(value), float(have), rel_tol=_PRIVACY_RTOL, abs_tol=0.0) or \
                value == have
        if not same:
            raise ctx.error(f"{where}.{key}", f"the manifest states {value!r} but the mechanism "
                            f"built from its parameters has {have!r} ({actual})")


_STATE = {
    "Laplace": ("scale", "sensitivity", "neighbour"),
    "DoubleGeometric": ("scale", "sensitivity", "neighbour"),
    "ClampedGeometric": ("lower", "upper", "sensitivity", "neighbour"),
    "Gaussian": ("sigma", "sensitivity", "neighbour"),
    "DiscreteGaussian": ("sigma", "sensitivity", "neighbour"),
    "TruncatedLaplace": ("lower", "upper", "scale", "sensitivity", "asked_epsilon", "scale_rule",
                         "neighbour"),
    "BITLaplace": ("lower", "upper", "scale", "sensitivity", "neighbour"),
    "Logistic": ("scale", "sensitivity", "neighbour"),
    "Subbotin": ("r", "scale", "sensitivity", "neighbour"),
    "MultiLevelGeometric": ("epsilons", "lower", "upper", "sensitivity", "neighbour"),
    "RandomizedResponse": ("p", "attributes"),
    "GeneralizedGaussian": ("sigma",),
    "GeneralizedLaplace": ("norm", "iterations", "proposal_a", "chain", "certified_tv",
                           "certified_level"),
    "Conditioned": ("nonnegative", "burn_in_sweeps"),
}


def _fingerprint(mech) -> tuple:
    """The public state of a mechanism: its class, the attributes that fix its law, its
    ``privacy`` (or the error stating it raises), its invariants and base."""
    name = type(mech).__name__
    out = [name] + [getattr(mech, a) for a in _STATE[name]]
    try:
        out.append(mech.privacy)
    except Exception as err:  # noqa: BLE001
        out.append((type(err).__name__, str(err)))
    if getattr(mech, "invariants", None) is not None:
        out.append(_invariants_fingerprint(mech.invariants))
    if isinstance(mech, Conditioned):
        out.append(_fingerprint(mech.base))
    return tuple(out)


def _plain(value):
    """Python scalars for TOML (numpy scalars converted)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _candidates(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    """[(constructor, params)] that may rebuild ``mech`` from its public attributes, and the
    reason to give if none does."""
    name = type(mech).__name__
    if name in ("Laplace", "DoubleGeometric"):
        return [("__init__", {"epsilon": mech.epsilon, "sensitivity": mech.sensitivity,
                              "neighbour": mech.neighbour})], ""
    if name == "ClampedGeometric":
        return [("__init__", {"epsilon": mech.epsilon, "lower": mech.lower, "upper": mech.upper,
                              "sensitivity": mech.sensitivity, "neighbour": mech.neighbour})], ""
    if name == "Gaussian":
        common = {"delta": mech.delta, "sensitivity": mech.sensitivity, "neighbour": mech.neighbour}
        return [("__init__", {"epsilon": mech.epsilon, **common}),
                ("from_sigma", {"sigma": mech.sigma, **common})], ""
    if name == "DiscreteGaussian":
        return [("__init__", {"sigma": mech.sigma, "delta": mech.delta,
                              "sensitivity": mech.sensitivity, "neighbour": mech.neighbour})], ""
    if name == "TruncatedLaplace":
        scale = {"optimal": None, "given": mech.scale}.get(mech.scale_rule, mech.scale_rule)
        return [("__init__", {"epsilon": mech.asked_epsilon, "lower": mech.lower, "upper": mech.upper,
                              "sensitivity": mech.sensitivity, "scale": scale,
                              "neighbour": mech.neighbour})], ""
    if name == "BITLaplace":
        upper = None if math.isinf(mech.upper) else mech.upper
        return [("__init__", {"epsilon": mech.epsilon, "lower": mech.lower, "upper": upper,
                              "sensitivity": mech.sensitivity, "neighbour": mech.neighbour})], ""
    if name in ("Logistic", "Subbotin"):
        privacy = mech.privacy
        shape = {"r": mech.r} if name == "Subbotin" else {}
        common = {"sensitivity": mech.sensitivity, "neighbour": mech.neighbour}
        if privacy.norm == "linf":
            if cells is None:
                return [], (f"a per-coordinate {name} does not keep its dimension publicly; pass "
                            "cells=<length of the released vector>, or write the manifest by hand "
                            "with constructor = \"per_coordinate\" and dimension = d")
            return [("per_coordinate", {**shape, "epsilon": mech.epsilon, "delta": mech.delta,
                                        "dimension": int(cells), **common})], (
                f"{name}.per_coordinate(..., dimension={cells}) does not give this mechanism "
                "(its dimension is not the number of released values)")
        if privacy.norm == "l2":
            if cells is None or cells < 2:
                return [], ("Subbotin(r=2, ..., dimension=d > 1) does not keep d publicly; pass "
                            "cells=d, or write dimension = d in the manifest by hand")
            return [("__init__", {**shape, "epsilon": mech.epsilon, "delta": mech.delta, **common,
                                  "dimension": int(cells)})], ""
        return [("__init__", {**shape, "epsilon": mech.epsilon, "delta": mech.delta, **common}),
                ("from_scale", {**shape, "scale": mech.scale, "delta": mech.delta, **common})], ""
    if name == "MultiLevelGeometric":
        return [("__init__", {"epsilons": list(mech.epsilons), "sensitivity": mech.sensitivity,
                              "lower": mech.lower, "upper": mech.upper,
                              "neighbour": mech.neighbour})], ""
    if name == "RandomizedResponse":
        exact = Fraction(mech.p).limit_denominator(_RATIONAL_DENOMINATOR)
        return [("__init__", {"p": mech.p, "attributes": mech.attributes}),
                ("__init__", {"p": f"{exact.numerator}/{exact.denominator}",
                              "attributes": mech.attributes})], (
            "RandomizedResponse keeps its exact p privately and exposes only the float p; neither "
            f"p = {mech.p!r} nor a fraction with denominator <= {_RATIONAL_DENOMINATOR} reproduces "
            "its privacy: write p = \"a/b\" in the manifest by hand")
    if name == "GeneralizedGaussian":
        try:
            epsilon = mech.privacy.epsilon
        except PrivacyUnverifiedError as err:
            raise ctx.error(where, f"GeneralizedGaussian exposes its epsilon only through privacy, "
                            f"which is unverified here ({err})") from None
        return [("__init__", {"sigma": mech.sigma, "epsilon": epsilon})], ""
    if name == "GeneralizedLaplace":
        params = {"epsilon": mech.privacy.epsilon, "norm": mech.norm, "iterations": mech.iterations,
                  "proposal_a": mech.proposal_a, "chain": mech.chain}
        if mech.certified_tv is not None:
            times = mech.coupling_result
            if times is None:
                raise ctx.error(where, "certified_tv is set but coupling_result (the meeting times "
                                "behind the certificate) is not")
            params["certificate"] = {
                "tv": mech.certified_tv, "level": mech.certified_level, "lag": int(times.lag),
                "max_iterations": int(times.max_iterations),
                "meeting_times": [int(t) for t in np.asarray(times.tau).ravel()]}
        return [("__init__", params)], ""
    if name == "Conditioned":
        base = _encode_mechanism(ctx, mech.base, None, f"{where}.base")
        return [("__init__", {"base": base, "nonnegative": mech.nonnegative,
                              "burn_in_sweeps": mech.burn_in_sweeps})], ""
    raise AssertionError(name)  # pragma: no cover


def _encode_mechanism(ctx: _Context, mech, cells, where: str) -> dict:
    if not isinstance(mech, Mechanism):
        raise ctx.error(where, f"must be a dpinfer mechanism, got {type(mech).__name__}")
    name = type(mech).__name__
    if name not in _CLASSES or type(mech) is not _CLASSES[name]:
        raise ctx.error(where, f"{name} is not a dpinfer mechanism family; the release format "
                        f"knows {list(_CLASSES)}")
    candidates, reason = _candidates(ctx, mech, cells, where)
    invariants = getattr(mech, "invariants", None)
    target = _fingerprint(mech)
    for constructor, params in candidates:
        table = {"family": name}
        if constructor != "__init__":
            table["constructor"] = constructor
        table.update({k: _plain(v) for k, v in params.items() if v is not None})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. a leaky TruncatedLaplace scale, re-warned on reading
                rebuilt = _decode_mechanism(ctx, table, invariants, where=where,
                                            bases_only=where.endswith(".base"))
        except ReleaseFileError:
            continue
        if _fingerprint(rebuilt) == target:
            return table
    raise ctx.error(where, f"{name} cannot be rebuilt from its public attributes: "
                    f"{reason or 'the rebuilt mechanism differs from it'}")


def _privacy_table(mech) -> dict | None:
    try:
        p = mech.privacy
    except Exception:  # noqa: BLE001 - no stated privacy, nothing to check
        return None
    return {"epsilon": float(p.epsilon), "delta": float(p.delta), "sensitivity": _plain(p.sensitivity),
            "neighbour": p.neighbour, "norm": p.norm}


def mechanism_to_manifest(mechanism, *, cells: int | None = None) -> dict:
    """The manifest fragment of a mechanism: ``{"mechanism": {...}}`` plus ``"invariants"`` for
    a mechanism holding invariants, ready to be written as TOML.

    The table is built from the mechanism's public attributes and checked at once: the
    mechanism is rebuilt from it and must have the same public state and ``privacy`` (else
    :class:`ReleaseFileError` says what is not public). ``cells``, the number of released values,
    supplies a vector length that some classes do not keep (``per_coordinate`` mechanisms,
    ``Subbotin(..., dimension=d)``). A ``privacy`` table is added where the privacy can be
    stated; it is checked again on reading."""
    ctx = _Context("mechanism_to_manifest")
    table = _encode_mechanism(ctx, mechanism, cells, "mechanism")
    privacy = _privacy_table(mechanism)
    if privacy is not None:
        table["privacy"] = privacy
    out = {"mechanism": table}
    if getattr(mechanism, "invariants", None) is not None:
        out["invariants"] = _encode_invariants(ctx, mechanism.invariants)
    return out


def mechanism_from_manifest(manifest: dict, *, invariants=None, path=None):
    """The mechanism a manifest states. ``manifest`` is a whole manifest or the fragment of
    :func:`mechanism_to_manifest` (a dict with ``"mechanism"`` and, where needed,
    ``"invariants"``), or a bare ``[mechanism]`` table; then ``invariants`` (an
    :class:`~dpinfer.lattice.invariants.Invariants` or an ``[invariants]`` table) supplies the
    invariants. ``group_column`` invariants need the values file: use :func:`read_release`."""
    ctx = _Context(path)
    if not isinstance(manifest, dict):
        raise ctx.error("mechanism", f"must be a table (dict), got {type(manifest).__name__}")
    if "mechanism" in manifest:
        table, inv_table = manifest["mechanism"], manifest.get("invariants", invariants)
    else:
        table, inv_table = manifest, invariants
    inv = inv_table
    if isinstance(inv_table, dict):
        inv, _ = _decode_invariants(ctx, inv_table)
    elif inv_table is not None and not isinstance(inv_table, Invariants):
        raise ctx.error("invariants", f"must be an [invariants] table or an Invariants, got "
                        f"{type(inv_table).__name__}")
    return _decode_mechanism(ctx, table, inv)


# ===================================================================================== query
def _decode_query(ctx: _Context, table, discrete: bool):
    """(Q or None, column labels or None) of a ``[query]`` table."""
    if not isinstance(table, dict):
        raise ctx.error("query", f"must be a table, got {type(table).__name__}")
    kind = table.get("kind")
    if kind not in _QUERY_KINDS:
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


# ==================================================================================== values
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
            raise ctx.error("invariants", f"cover {inv.n_cells} cells, but the values file has "
                            f"{values.size} values ({shape_hint})")
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
    directory holding ``release.toml``. Every check of the module docstring is made; a failure
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
        dims=dims)


# ================================================================================ TOML output
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (list, tuple)) for v in value):
            return "[\n" + "".join(f"    {_toml_value(row)},\n" for row in value) + "]"
        items = [_toml_value(v) for v in value]
        inline = "[" + ", ".join(items) + "]"
        if len(inline) <= 96:
            return inline
        lines, line = [], ""
        for item in items:
            if line and len(line) + len(item) > 92:
                lines.append(line)
                line = ""
            line += item + ", "
        lines.append(line)
        return "[\n" + "".join(f"    {ln.rstrip()}\n" for ln in lines) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def toml_dumps(document: dict, header: str = "") -> str:
    """A TOML document of nested dicts, scalars, dates and (nested) lists (no arrays of tables)."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]

    def emit(prefix: str, table: dict):
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
        tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
        if prefix:
            lines.extend(["", f"[{prefix}]"])
        for key, value in scalars:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
        for key, value in tables:
            emit(f"{prefix}.{_toml_key(key)}" if prefix else _toml_key(key), value)

    emit("", document)
    return "\n".join(lines).lstrip("\n") + "\n"


# ================================================================================ curator side
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
                  values_file: str | None = None) -> Path:
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
    header = (f"dpinfer release manifest ({FORMAT}); schema: dpinfer/io/release-schema.json\n"
              f"written by dpinfer.io.release_file.write_release")
    path.write_text(toml_dumps(document, header), encoding="utf-8")
    try:
        read_release(path)
    except Exception:
        path.unlink(missing_ok=True)
        values_path.unlink(missing_ok=True)
        raise
    return path
