"""A small TOML writer for manifests (:func:`toml_dumps`): nested tables, scalars, dates and
(nested) arrays; the standard library reads TOML (``tomllib``) but does not write it."""

from __future__ import annotations

import datetime
import json
import math
import numbers
import re

import numpy as np

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


def _plain(value):
    """Python scalars for TOML (numpy scalars converted)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


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
