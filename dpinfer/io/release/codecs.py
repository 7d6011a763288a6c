"""The codec of each mechanism family: what its ``[mechanism]`` table holds and how the mechanism
is rebuilt from its public attributes, one :class:`Codec` per family in :data:`CODECS`.

A codec states the family's class, its constructors' parameters (:data:`FAMILIES`; published
in the JSON Schema), the public attributes that fix its law (compared after a rebuild), and
``rebuild``: the ``[(constructor, params)]`` that may rebuild a given mechanism, tried in order
by :func:`~dpinfer.io.release.mechanism.mechanism_to_manifest`. Adding a family is one entry
here (and its class import); reading, writing and the schema follow from the table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dpinfer.io.release.fields import Field, _Context
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
    MultiLevelGeometric,
    RandomizedResponse,
    Subbotin,
    TruncatedLaplace,
)
from dpinfer.mechanisms.generalized_gaussian import PrivacyUnverifiedError

_RATIONAL_DENOMINATOR = 10**6  # RandomizedResponse: largest denominator tried for a rational p


@dataclasses.dataclass(frozen=True)
class Codec:
    """One mechanism family in a manifest.

    ``constructors``: constructor name (``"__init__"`` = the class itself, else a documented
    classmethod) -> its parameters. ``state``: the public attributes that fix the law.
    ``rebuild(ctx, mechanism, cells, where)`` -> ``([(constructor, params)], reason)``: the
    candidates that may rebuild ``mechanism`` from its public attributes (a mechanism-valued
    parameter is written as a nested table) and the reason to give if none does.
    ``holds_invariants``: the manifest then needs an ``[invariants]`` table. ``base``: discrete
    additive, so it may be ``Conditioned``'s base."""

    cls: type
    constructors: dict[str, tuple[Field, ...]]
    state: tuple[str, ...]
    rebuild: Callable[..., tuple[list, str]]
    holds_invariants: bool = False
    base: bool = False


# ===================================================================== parameters and tables
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


# ======================================================= rebuilding from public attributes
def _epsilon_additive(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    """Laplace, DoubleGeometric."""
    return [("__init__", {"epsilon": mech.epsilon, "sensitivity": mech.sensitivity,
                          "neighbour": mech.neighbour})], ""


def _clamped_geometric(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    return [("__init__", {"epsilon": mech.epsilon, "lower": mech.lower, "upper": mech.upper,
                          "sensitivity": mech.sensitivity, "neighbour": mech.neighbour})], ""


def _gaussian(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    common = {"delta": mech.delta, "sensitivity": mech.sensitivity, "neighbour": mech.neighbour}
    return [("__init__", {"epsilon": mech.epsilon, **common}),
            ("from_sigma", {"sigma": mech.sigma, **common})], ""


def _discrete_gaussian(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    return [("__init__", {"sigma": mech.sigma, "delta": mech.delta,
                          "sensitivity": mech.sensitivity, "neighbour": mech.neighbour})], ""


def _truncated_laplace(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    scale = {"optimal": None, "given": mech.scale}.get(mech.scale_rule, mech.scale_rule)
    return [("__init__", {"epsilon": mech.asked_epsilon, "lower": mech.lower, "upper": mech.upper,
                          "sensitivity": mech.sensitivity, "scale": scale,
                          "neighbour": mech.neighbour})], ""


def _bit_laplace(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    upper = None if math.isinf(mech.upper) else mech.upper
    return [("__init__", {"epsilon": mech.epsilon, "lower": mech.lower, "upper": upper,
                          "sensitivity": mech.sensitivity, "neighbour": mech.neighbour})], ""


def _logistic_or_subbotin(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    name = type(mech).__name__
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


def _multi_level_geometric(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    return [("__init__", {"epsilons": list(mech.epsilons), "sensitivity": mech.sensitivity,
                          "lower": mech.lower, "upper": mech.upper,
                          "neighbour": mech.neighbour})], ""


def _randomized_response(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    exact = Fraction(mech.p).limit_denominator(_RATIONAL_DENOMINATOR)
    return [("__init__", {"p": mech.p, "attributes": mech.attributes}),
            ("__init__", {"p": f"{exact.numerator}/{exact.denominator}",
                          "attributes": mech.attributes})], (
        "RandomizedResponse keeps its exact p privately and exposes only the float p; neither "
        f"p = {mech.p!r} nor a fraction with denominator <= {_RATIONAL_DENOMINATOR} reproduces "
        "its privacy: write p = \"a/b\" in the manifest by hand")


def _generalized_gaussian(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    try:
        epsilon = mech.privacy.epsilon
    except PrivacyUnverifiedError as err:
        raise ctx.error(where, f"GeneralizedGaussian exposes its epsilon only through privacy, "
                        f"which is unverified here ({err})") from None
    return [("__init__", {"sigma": mech.sigma, "epsilon": epsilon})], ""


def _generalized_laplace(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
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


def _conditioned(ctx: _Context, mech, cells, where: str) -> tuple[list, str]:
    return [("__init__", {"base": mech.base, "nonnegative": mech.nonnegative,
                          "burn_in_sweeps": mech.burn_in_sweeps})], ""


# ================================================================================ the table
#: family -> its codec (the order is the JSON Schema's and the error messages').
CODECS: dict[str, Codec] = {
    "Laplace": Codec(
        Laplace, {"__init__": (_EPSILON, _sensitivity(), _neighbour())},
        ("scale", "sensitivity", "neighbour"), _epsilon_additive),
    "DoubleGeometric": Codec(
        DoubleGeometric, {"__init__": (_EPSILON, _sensitivity(True), _neighbour())},
        ("scale", "sensitivity", "neighbour"), _epsilon_additive, base=True),
    "ClampedGeometric": Codec(ClampedGeometric, {"__init__": (
        _EPSILON,
        Field("lower", "integer", "lower clamp bound (whole number)"),
        Field("upper", "integer", "upper clamp bound (whole number); absent: clamped at lower only",
              required=False),
        _sensitivity(True), _neighbour())},
        ("lower", "upper", "sensitivity", "neighbour"), _clamped_geometric),
    "Gaussian": Codec(Gaussian, {
        "__init__": (_EPSILON, _DELTA, _sensitivity(), _neighbour()),
        "from_sigma": (Field("sigma", "number", "noise standard deviation > 0"), _DELTA,
                       _sensitivity(), _neighbour()),
    }, ("sigma", "sensitivity", "neighbour"), _gaussian),
    "DiscreteGaussian": Codec(DiscreteGaussian, {
        "__init__": (Field("sigma", "number", "noise scale sigma > 0"), _DELTA, _sensitivity(True),
                     _neighbour()),
        "from_privacy": (_EPSILON, _DELTA, _sensitivity(True), _neighbour()),
    }, ("sigma", "sensitivity", "neighbour"), _discrete_gaussian, base=True),
    "TruncatedLaplace": Codec(TruncatedLaplace, {"__init__": (
        _EPSILON,
        Field("lower", "number", "lower bound of the release"),
        Field("upper", "number", "upper bound of the release"),
        _sensitivity(),
        Field("scale", "scale_rule", "Laplace scale: a number > 0, 'paper' or 'conservative'; "
              "absent: the smallest scale that is epsilon-DP", required=False),
        _neighbour())},
        ("lower", "upper", "scale", "sensitivity", "asked_epsilon", "scale_rule", "neighbour"),
        _truncated_laplace),
    "BITLaplace": Codec(BITLaplace, {"__init__": (
        _EPSILON,
        Field("lower", "number", "lower clamp bound"),
        Field("upper", "number", "upper clamp bound; absent: clamped at lower only", required=False),
        _sensitivity(), _neighbour())},
        ("lower", "upper", "scale", "sensitivity", "neighbour"), _bit_laplace),
    "Logistic": Codec(Logistic, {
        "__init__": (_EPSILON_OR_ZERO, _DELTA_OR_ZERO, _sensitivity(), _neighbour()),
        "from_scale": (Field("scale", "number", "Logistic scale s > 0"), _DELTA_OR_ZERO,
                       _sensitivity(), _neighbour()),
        "per_coordinate": (_EPSILON_OR_ZERO, _DELTA_OR_ZERO, _DIMENSION, _sensitivity(), _neighbour()),
    }, ("scale", "sensitivity", "neighbour"), _logistic_or_subbotin),
    "Subbotin": Codec(Subbotin, {
        "__init__": (_R, _EPSILON_OR_ZERO, _DELTA_OR_ZERO, _sensitivity(), _neighbour(),
                     dataclasses.replace(_DIMENSION, required=False,
                                         description="vector length d; > 1 only for r = 2")),
        "from_scale": (_R, Field("scale", "number", "Subbotin scale s > 0"), _DELTA_OR_ZERO,
                       _sensitivity(), _neighbour()),
        "per_coordinate": (_R, _EPSILON_OR_ZERO, _DELTA_OR_ZERO, _DIMENSION, _sensitivity(),
                           _neighbour()),
    }, ("r", "scale", "sensitivity", "neighbour"), _logistic_or_subbotin),
    "MultiLevelGeometric": Codec(MultiLevelGeometric, {"__init__": (
        Field("epsilons", "numbers", "strictly decreasing epsilons, level 0 (least private) first"),
        _sensitivity(True),
        Field("lower", "integer", "lower clamp bound; absent: unbounded", required=False),
        Field("upper", "integer", "upper clamp bound (needs lower)", required=False),
        _neighbour())},
        ("epsilons", "lower", "upper", "sensitivity", "neighbour"), _multi_level_geometric),
    "RandomizedResponse": Codec(RandomizedResponse, {
        "__init__": (Field("p", "ratio", "probability of keeping each bit, in (1/2, 1): a number "
                           "or an exact fraction written as a string \"a/b\""),
                     Field("attributes", "integer", "binary attributes per record (tables of "
                           "2**attributes cells)", required=False)),
        "from_epsilon": (Field("epsilon", "number", "per-attribute epsilon > 0"),
                         Field("attributes", "integer", "binary attributes per record",
                               required=False)),
    }, ("p", "attributes"), _randomized_response),
    "Conditioned": Codec(Conditioned, {"__init__": (
        Field("base", "base_mechanism", "the discrete additive base mechanism (a table)"),
        Field("nonnegative", "boolean", "also conditioned on a non-negative release (seed 000's "
              "congenial mechanism)"),
        Field("burn_in_sweeps", "integer", "sweeps of the simulation-grade noise chain",
              required=False))},
        ("nonnegative", "burn_in_sweeps"), _conditioned, holds_invariants=True),
    "GeneralizedGaussian": Codec(GeneralizedGaussian, {"__init__": (
        Field("sigma", "number", "lattice Gaussian scale sigma > 0"), _EPSILON)},
        ("sigma",), _generalized_gaussian, holds_invariants=True),
    "GeneralizedLaplace": Codec(GeneralizedLaplace, {"__init__": (
        _EPSILON,
        Field("norm", "enum", "norm of the noise law exp(-epsilon ||z||)", enum=("l1", "l2")),
        Field("iterations", "integer", "sweeps or steps of the MCMC release chain", required=False),
        Field("proposal_a", "number", "random-walk proposal parameter in (0, 1)", required=False),
        Field("chain", "enum", "MCMC release chain", required=False, enum=("gibbs", "walk")),
        Field("certificate", "certificate", "TV certificate of the MCMC releases (certify())",
              required=False))},
        ("norm", "iterations", "proposal_a", "chain", "certified_tv", "certified_level"),
        _generalized_laplace, holds_invariants=True),
}

#: family -> constructor ("__init__" = the class itself) -> its parameters, by constructor name.
FAMILIES: dict[str, dict[str, tuple[Field, ...]]] = {
    name: codec.constructors for name, codec in CODECS.items()}
INVARIANT_FAMILIES = tuple(name for name, codec in CODECS.items() if codec.holds_invariants)
BASE_FAMILIES = tuple(name for name, codec in CODECS.items() if codec.base)  # Conditioned's bases
