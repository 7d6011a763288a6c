"""A manifest key (:class:`Field`) and its value kind: the kind's JSON Schema (:data:`_KINDS`,
published in ``release-schema.json``) and the Python check that mirrors it (:func:`_check_kind`),
with the checks of a whole table (unknown keys are errors, required keys present) and the error
every check raises, :class:`ReleaseFileError`, naming the manifest and the field."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import numbers
import re
from fractions import Fraction


class ReleaseFileError(ValueError):
    """A release manifest or values file that cannot be read as stated. The message starts with
    the manifest's path and the field (``release.value_columns``, ``mechanism.base.epsilon``,
    ...); both are also attributes."""

    def __init__(self, where, field: str, message: str):
        self.path = where
        self.field = field
        super().__init__(f"{where}: {field}: {message}")


@dataclasses.dataclass(frozen=True)
class Field:
    """One manifest key: its name, value kind (see :data:`_KINDS`), whether it is required, a
    description (published in the JSON Schema) and, for ``kind="enum"``, the allowed values."""

    name: str
    kind: str
    description: str
    required: bool = True
    enum: tuple = ()


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
