"""The release format as a JSON Schema (draft 2020-12): :func:`release_schema` builds it from
the field tables of the manifest's parts, :func:`write_schema` publishes it as
``release-schema.json`` beside this module; the top level and the ``[release]`` table's fields
are stated here."""

from __future__ import annotations

import json
from pathlib import Path

from dpinfer.io.release.codecs import (
    _CERTIFICATE_FIELDS,
    _PRIVACY_FIELDS,
    BASE_FAMILIES,
    CODECS,
    FAMILIES,
    INVARIANT_FAMILIES,
)
from dpinfer.io.release.fields import _KINDS, Field
from dpinfer.io.release.invariants import _INVARIANT_COMMON, _INVARIANT_KINDS
from dpinfer.io.release.query import _QUERY_COMMON, _QUERY_KINDS

FORMAT = "dpinfer-release/1"
SCHEMA_PATH = Path(__file__).with_name("release-schema.json")

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
    Field("exposure_column", "string", "a public column of the values file (not a value or "
          "index column) giving each row's exposure: the population, person-years or number of "
          "trials the row's count comes from, every entry positive and finite. Model templates "
          "use it as an offset (count ~ Poisson(exposure x rate)) or as the number of trials "
          "(binomial); `dpinfer fit` uses it by default", required=False),
)
_TOP_LEVEL = ("format", "release", "mechanism", "invariants", "query")


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
    strings), built from :data:`FAMILIES` and the field tables of the other parts: the published
    documentation of the format, kept in ``release-schema.json`` (:func:`write_schema`)."""
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
            schema = _schema_object(fields, fixed, _first_doc_line(CODECS[family].cls))
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
