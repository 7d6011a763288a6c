"""Reading and writing the ``[mechanism]`` table with the family codecs of
:mod:`~dpinfer.io.release.codecs`: a table is decoded by constructing the mechanism, then its
``[mechanism.privacy]`` and certificate are checked; a mechanism is encoded from its public
attributes (:func:`mechanism_to_manifest`) and checked at once by rebuilding it and comparing
:func:`_fingerprint`."""

from __future__ import annotations

import difflib
import math
import warnings

import numpy as np

from dpinfer.io.release.codecs import (
    _CERTIFICATE_FIELDS,
    _PRIVACY_FIELDS,
    BASE_FAMILIES,
    CODECS,
    FAMILIES,
    INVARIANT_FAMILIES,
)
from dpinfer.io.release.fields import ReleaseFileError, _check_fields, _Context
from dpinfer.io.release.invariants import _decode_invariants, _encode_invariants, _invariants_fingerprint
from dpinfer.io.release.toml import _plain
from dpinfer.lattice.coupling import MeetingTimes
from dpinfer.lattice.invariants import Invariants
from dpinfer.mechanisms import Conditioned, GeneralizedLaplace, Mechanism

_PRIVACY_RTOL = 1e-9  # [mechanism.privacy] epsilon and delta are checked to this relative tolerance


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
    cls = CODECS[family].cls
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


def _fingerprint(mech) -> tuple:
    """The public state of a mechanism: its class, the attributes that fix its law, its
    ``privacy`` (or the error stating it raises), its invariants and base."""
    name = type(mech).__name__
    out = [name] + [getattr(mech, a) for a in CODECS[name].state]
    try:
        out.append(mech.privacy)
    except Exception as err:  # noqa: BLE001
        out.append((type(err).__name__, str(err)))
    if getattr(mech, "invariants", None) is not None:
        out.append(_invariants_fingerprint(mech.invariants))
    if isinstance(mech, Conditioned):
        out.append(_fingerprint(mech.base))
    return tuple(out)


def _encode_mechanism(ctx: _Context, mech, cells, where: str) -> dict:
    if not isinstance(mech, Mechanism):
        raise ctx.error(where, f"must be a dpinfer mechanism, got {type(mech).__name__}")
    name = type(mech).__name__
    if name not in CODECS or type(mech) is not CODECS[name].cls:
        raise ctx.error(where, f"{name} is not a dpinfer mechanism family; the release format "
                        f"knows {list(CODECS)}")
    candidates, reason = CODECS[name].rebuild(ctx, mech, cells, where)
    candidates = [(constructor, {k: _encode_mechanism(ctx, v, None, f"{where}.{k}")
                                 if isinstance(v, Mechanism) else v for k, v in params.items()})
                  for constructor, params in candidates]  # Conditioned's base: a nested table
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
