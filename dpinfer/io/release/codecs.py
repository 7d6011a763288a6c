"""The ``[mechanism]`` table of each mechanism family: its constructors' parameters
(:data:`FAMILIES`), how a table is decoded into the mechanism (constructed, then its
``[mechanism.privacy]`` and certificate checked) and how a mechanism is encoded from its public
attributes (:func:`mechanism_to_manifest`, checked by rebuilding it)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from fractions import Fraction

import numpy as np

from dpinfer.io.release.fields import Field, ReleaseFileError, _check_fields, _Context
from dpinfer.io.release.invariants import _decode_invariants, _encode_invariants, _invariants_fingerprint
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

_RATIONAL_DENOMINATOR = 10**6  # RandomizedResponse: largest denominator tried for a rational p
_PRIVACY_RTOL = 1e-9  # [mechanism.privacy] epsilon and delta are checked to this relative tolerance


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
