r"""Adapters: an OpenDP measurement or a diffprivlib mechanism turned into the dpinfer
mechanism with the same release law, so that an analyst who ran a library's mechanism gets
the likelihood p(release | true values) without re-typing its parameters.

    import opendp.prelude as odp
    odp.enable_features("contrib")
    meas = odp.m.make_laplace(odp.atom_domain(T=int), odp.absolute_distance(T=int), scale=2.0)
    mech = from_opendp(meas, d_in=1)     # DoubleGeometric, scale 2, epsilon = 1/2
    mech.observe("release", x, observed=meas(true_count))

Every adapter maps by the **scale of the noise law** as the library's sampler uses it, never by
re-deriving a scale from epsilon under dpinfer's own calibration (the libraries calibrate
differently: diffprivlib's Laplace with delta > 0, its bounded-domain Laplace and its Gaussians
all use their own scales). The privacy the adapted mechanism reports is dpinfer's exact
accounting of that law, which can be *tighter* than the library's claim (e.g. diffprivlib's
classical Gaussian) and is checked against it in ``tests/test_adapters.py``.

Supported (library -> dpinfer, with b the Laplace scale and sigma the Gaussian scale)
-------------------------------------------------------------------------------------

OpenDP (0.16; read from the measurement's constructor record ``__opendp_dict__`` and checked
against its privacy map ``measurement.map(d_in)``):

* ``make_laplace`` / ``make_noise(MaxDivergence)`` on floats -> :class:`Laplace`, b = ``scale``.
* ``make_laplace`` / ``make_geometric`` (no ``bounds``) / ``make_noise(MaxDivergence)`` on
  signed integers -> :class:`DoubleGeometric`, b = ``scale`` (pmf proportional to e^{-|e|/b}).
* the same on unsigned integers (u32, u64, usize) -> :class:`ClampedGeometric` with
  ``lower=0``: OpenDP saturates at the type's bounds, so the release is max(0, x + e).
* ``make_gaussian`` / ``make_noise(ZeroConcentratedDivergence)`` on floats ->
  :meth:`Gaussian.from_sigma`, sigma = ``scale``.
* the same on signed integers -> :class:`DiscreteGaussian`, sigma = ``scale``.
* scalar (``atom_domain``) and vector (``vector_domain``) inputs alike: a vector release is
  i.i.d. noise per coordinate, and dpinfer's mechanisms are elementwise.
* wrapped in the accounting combinators ``make_approximate``, ``make_pureDP_to_zCDP``,
  ``make_zCDP_to_approxDP`` and ``make_fix_delta``, which change the privacy statement but
  not the function (so not the law); ``make_fix_delta``'s delta is used for the Gaussian.

diffprivlib (0.6.6; attributes as its ``randomise`` uses them):

* ``Laplace(epsilon, delta, sensitivity)`` -> :class:`Laplace`, b = sensitivity /
  (epsilon - log(1 - delta)) (diffprivlib's scale; with delta > 0 the law is a plain Laplace,
  which is pure (epsilon - log(1 - delta))-DP, and that is what dpinfer reports).
* ``LaplaceTruncated`` -> :class:`BITLaplace` (it *clamps* x + Laplace(b) to [lower, upper]:
  point masses at the bounds), same b.
* ``LaplaceBoundedDomain`` -> :class:`TruncatedLaplace` (x clamped to [lower, upper], then
  Laplace noise resampled until inside: the renormalised truncation), with diffprivlib's own
  larger scale b' from its ``_find_scale`` (1.6116 for epsilon = 1, Delta = 1, [0, 10]).
* ``Geometric(epsilon, sensitivity)`` -> :class:`DoubleGeometric`, a = exp(-epsilon/sensitivity).
* ``GeometricTruncated`` -> :class:`ClampedGeometric` (a clamp, as for the Laplace).
* ``Gaussian`` (classical sigma = sqrt(2 log(1.25/delta)) Delta/epsilon) and
  ``GaussianAnalytic`` (Balle-Wang sigma) -> :meth:`Gaussian.from_sigma` with diffprivlib's sigma.
* ``GaussianDiscrete`` -> :class:`DiscreteGaussian` with diffprivlib's sigma.

Refused (:class:`UnsupportedMechanismError`, a ``NotImplementedError`` and a ``ValueError``),
because no dpinfer mechanism has the exact law: OpenDP chains with transformations or
post-processors, randomized response, noisy max, thresholds, quantiles, canonical noise,
``make_geometric(bounds=...)`` (OpenDP clamps the *input* to the bounds before adding noise),
float noise on a coarse lattice (explicit ``k`` with 2^k > 2^-40 scale: the release is
lattice-valued), the Gaussian on unsigned integers (censored at 0); diffprivlib's folded
mechanisms, ``LaplaceBoundedNoise`` (noise truncated to [-A, A]), Staircase, Snapping,
Exponential family, Binary, Uniform, Bingham, Vector. Objects that are not a library
mechanism raise ``TypeError``.

Floating-point samplers: what the libraries draw and what dpinfer models
-----------------------------------------------------------------------

dpinfer's likelihood is the **textbook law** (continuous Laplace / Gaussian densities, exact
discrete pmfs). How close each library's sampler is to it:

* **OpenDP** samples exactly: integer noise with the Canonne-Kamath-Steinke samplers in exact
  arithmetic; float noise as the discrete Laplace / discrete Gaussian on the lattice 2^k Z
  (default k = -1074 for f64, -149 for f32), the input rounded to that lattice, the result
  rounded to the nearest float. With the default k the law is the textbook continuous law up to
  the rounding of the output to a float, which dpinfer's density ignores (the privacy map
  accounts for the rounding; Mironov's attack does not apply). An explicit coarse k gives a
  lattice-valued release, which is refused. Integer types saturate at their bounds: modelled
  for unsigned types (the clamp at 0); for signed types the mass beyond +-2^31 (i32) is
  e^{-(2^31 - |x|)/b}, zero in float64 for every |x| below 2^31 - 745 b, and ignored.
  The geometric sampler rounds its success probability down by at most one ulp (OpenDP's
  conservative rounding), a relative change of the law below 1e-15.
* **diffprivlib** samples in floating point: Laplace by the Holohan-Braghin four-uniform
  transform log(1 - u1) cos(pi u2) + log(1 - u3) cos(pi u4), the Gaussian as
  (N1 + N2)/sqrt(2) of two float normals, the geometric by a float inverse CDF
  (floor(log u / log a)), the discrete Gaussian by CKS's algorithm with float Bernoulli
  trials, the bounded-domain Laplace by rejection (whose running time depends on the true
  value). These are meant to blunt Mironov's (2012) attack on the low-order bits of
  floating-point Laplace samples, but none is an exact or proven implementation: the float
  outputs only approximate the textbook law, and the privacy of the float outputs is not
  established. dpinfer conditions on the textbook law, which the tests find indistinguishable
  from the library's samples at 10^5 draws; it does not (and cannot) model the low-order-bit
  structure of float releases.
* The adapted mechanism's own ``release`` uses dpinfer's samplers, not the library's:
  exact integer-arithmetic samplers for :class:`DoubleGeometric`, :class:`ClampedGeometric`
  and :class:`DiscreteGaussian` (:mod:`dpinfer.mechanisms.exact_sampling`, CKS 2020 Algorithms
  1-3), simulation-grade numpy floats for the continuous ones (``exact_sampler = False``).

OpenDP and diffprivlib are imported only inside these functions; dpinfer imports without them.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from dpinfer.mechanisms import (
    BITLaplace,
    ClampedGeometric,
    DiscreteGaussian,
    DoubleGeometric,
    Gaussian,
    Laplace,
    Mechanism,
    TruncatedLaplace,
)

__all__ = ["UnsupportedMechanismError", "from_diffprivlib", "from_opendp"]


class UnsupportedMechanismError(NotImplementedError, ValueError):
    """The library object is a mechanism, but no dpinfer mechanism has exactly its release
    law (or the adapter cannot read it). Both a ``NotImplementedError`` and a ``ValueError``."""


# An explicit OpenDP float granularity 2^k is accepted only when the lattice is this much finer
# than the noise scale: the lattice law and the continuous density then differ by a relative
# 2^k / scale <= 2^-40 (about 1e-12), below any statistical or numerical relevance.
_MAX_LATTICE_TO_SCALE = 2.0**-40
# Default OpenDP float granularity exponents (the smallest subnormal), by float type.
_DEFAULT_K = {"f64": -1074, "f32": -149}
_SIGNED_INTS = {"i8", "i16", "i32", "i64", "i128", "isize"}
_UNSIGNED_INTS = {"u8", "u16", "u32", "u64", "u128", "usize"}
# Relative tolerance of the cross-check between a constructor's scale and its privacy map.
_MAP_RTOL = 1e-9
# Accounting combinators: they change the privacy measure, not the function (the release law).
_ACCOUNTING_COMBINATORS = (
    "make_approximate",
    "make_pureDP_to_zCDP",
    "make_zCDP_to_approxDP",
    "make_fix_delta",
)
_OPENDP_SUPPORTED = "make_laplace, make_gaussian, make_geometric (without bounds) and make_noise"


def _epsilon_for_scale(sensitivity, scale: float) -> float:
    """A float epsilon with ``sensitivity / epsilon == scale`` exactly where one exists (the
    dpinfer Laplace-type mechanisms compute their scale so), else sensitivity / scale, whose
    scale is then within one rounding of ``scale``."""
    epsilon = sensitivity / scale
    for candidate in (epsilon, math.nextafter(epsilon, 0.0), math.nextafter(epsilon, math.inf)):
        if candidate > 0 and sensitivity / candidate == scale:
            return candidate
    return epsilon


def _positive_finite(what: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise UnsupportedMechanismError(
            f"dpinfer cannot model {what} = {value!r}: it needs a finite value > 0 "
            "(a zero noise scale releases the true value; an infinite one releases nothing)"
        )
    return value


# --- OpenDP --------------------------------------------------------------------------------------


def _import_opendp():
    try:
        import opendp.mod as opendp_mod
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "from_opendp needs the opendp package (pip install 'dpinfer[adapters]')"
        ) from err
    return opendp_mod


def _record(measurement) -> dict:
    """The constructor record OpenDP keeps on every measurement it builds in Python."""
    info = getattr(measurement, "__opendp_dict__", None)
    if not isinstance(info, dict) or "__function__" not in info:
        raise UnsupportedMechanismError(
            f"dpinfer cannot model this OpenDP measurement ({measurement!r}): it carries no "
            "constructor record (__opendp_dict__), e.g. a make_user_measurement, so its noise law "
            "cannot be read"
        )
    return info


def _carrier(domain) -> tuple[str, bool]:
    """(atom type such as 'f64' or 'i32', whether the domain is a vector domain)."""
    carrier = str(domain.carrier_type)
    if carrier.startswith("Vec<") and carrier.endswith(">"):
        return carrier[4:-1], True
    return carrier, False


def _as_d_in(metric, d_in):
    """d_in in the metric's distance type (int for integer metrics, float otherwise)."""
    distance_type = str(metric.distance_type)
    if isinstance(d_in, bool) or not isinstance(d_in, numbers.Real):
        raise TypeError(f"d_in must be a number (the query's sensitivity in {metric}), got {d_in!r}")
    if not (math.isfinite(float(d_in)) and d_in > 0):
        raise ValueError(f"d_in must be finite and > 0, got {d_in!r}")
    if distance_type in _SIGNED_INTS | _UNSIGNED_INTS:
        if not float(d_in).is_integer():
            raise ValueError(f"d_in must be a whole number for the integer metric {metric}, got {d_in!r}")
        return int(d_in)
    return float(d_in)


def _check_map(measurement, d_in, expected_low: float, expected_high: float, what: str) -> float:
    """measurement.map(d_in), checked to lie in [expected_low, expected_high] (relative
    tolerance _MAP_RTOL): the scale read from the constructor record is the one the privacy
    map accounts for."""
    try:
        claimed = float(measurement.map(d_in))
    except Exception as err:  # OpenDPException or a conversion error
        raise ValueError(f"OpenDP could not evaluate the privacy map at d_in = {d_in!r}: {err}") from err
    if not expected_low * (1 - _MAP_RTOL) <= claimed <= expected_high * (1 + _MAP_RTOL):
        raise UnsupportedMechanismError(
            f"dpinfer cannot model this OpenDP measurement: its privacy map gives {claimed!r} at "
            f"d_in = {d_in!r}, but {what} predicts [{expected_low!r}, {expected_high!r}]; the "
            "constructor's scale does not mean what this adapter assumes (OpenDP version?)"
        )
    return claimed


def from_opendp(measurement, *, d_in=1, delta=None, neighbour: str = "add-remove") -> Mechanism:
    """The dpinfer mechanism with the release law of an OpenDP measurement.

    Parameters
    ----------
    measurement : opendp.mod.Measurement
        Made by ``make_laplace``, ``make_gaussian``, ``make_geometric`` (without ``bounds``) or
        ``make_noise`` (directly or as ``space >> then_...``), optionally wrapped in the
        accounting combinators ``make_approximate``, ``make_pureDP_to_zCDP``,
        ``make_zCDP_to_approxDP``, ``make_fix_delta``. Scalar or vector input domains.
    d_in : number
        The query's sensitivity in the measurement's input metric (absolute distance, l1 for a
        vector Laplace, l2 for a vector Gaussian): dpinfer's ``sensitivity``. Whole numbers for
        integer-valued noise.
    delta : float in (0, 1), optional
        Gaussian mechanisms only: the delta at which dpinfer states (epsilon, delta)-DP. Default:
        the delta of an enclosing ``make_fix_delta``, else 1e-6. OpenDP's own Gaussian guarantee
        is rho-zCDP; dpinfer's ``zcdp_rho`` equals ``measurement.map(d_in)``. For a vector
        discrete Gaussian only rho is comparable: dpinfer's (epsilon, delta) is CKS Theorem 7's
        profile for a shift of d_in in one coordinate.
    neighbour : {"add-remove", "substitution"}
        The neighbour relation under which ``d_in`` holds (OpenDP leaves it to the metric).

    Returns
    -------
    Mechanism
        :class:`Laplace` (float Laplace), :class:`DoubleGeometric` (signed-integer Laplace),
        :class:`ClampedGeometric` with lower 0 (unsigned-integer Laplace),
        :meth:`Gaussian.from_sigma` (float Gaussian) or :class:`DiscreteGaussian` (signed-integer
        Gaussian), each with the measurement's scale.

    Raises
    ------
    TypeError
        ``measurement`` is not an OpenDP Measurement.
    UnsupportedMechanismError
        dpinfer has no mechanism with the measurement's law (the message names what).
    """
    opendp_mod = _import_opendp()
    if not isinstance(measurement, opendp_mod.Measurement):
        raise TypeError(
            f"from_opendp needs an opendp Measurement, got {type(measurement).__name__}"
            + (" (a Transformation is deterministic: chain it with a noise measurement)"
               if isinstance(measurement, opendp_mod.Transformation) else "")
        )
    info = _record(measurement)
    fixed_delta = None
    while info["__function__"] in _ACCOUNTING_COMBINATORS:
        kwargs = info["__kwargs__"]
        if info["__function__"] == "make_fix_delta" and fixed_delta is None:
            fixed_delta = float(kwargs["delta"])
        measurement = kwargs["measurement"]
        info = _record(measurement)
    name, kwargs = info["__function__"], info["__kwargs__"]

    if name.startswith("make_chain"):
        parts = ", ".join(f"{k}: {type(v).__name__}" for k, v in kwargs.items())
        raise UnsupportedMechanismError(
            f"dpinfer cannot model OpenDP's {name} ({parts}): a chain composes the noise with a "
            "transformation or post-processor whose effect on the release law dpinfer does not "
            "read. Adapt the noise measurement alone (the chain's 'measurement1' / "
            "'measurement0') and condition on the transformation's output as the true values"
        )
    if name == "make_noise":
        measure = str(kwargs["output_measure"])
        family = {"MaxDivergence": "laplace", "ZeroConcentratedDivergence": "gaussian"}.get(measure)
        if family is None:
            raise UnsupportedMechanismError(f"dpinfer cannot model make_noise with output measure {measure}")
    elif name in ("make_laplace", "make_geometric"):
        family = "laplace"
    elif name == "make_gaussian":
        family = "gaussian"
    else:
        raise UnsupportedMechanismError(
            f"dpinfer cannot model OpenDP's {name}: supported are {_OPENDP_SUPPORTED} "
            "(and the accounting combinators around them)"
        )
    if name == "make_geometric" and kwargs.get("bounds") is not None:
        raise UnsupportedMechanismError(
            f"dpinfer cannot model make_geometric with bounds={kwargs['bounds']}: OpenDP clamps the "
            "true value to the bounds before adding noise (and clamps the output), whereas "
            "dpinfer's ClampedGeometric adds the noise to the unclamped true value, so the laws "
            "differ for true values outside the bounds. Use make_geometric without bounds"
        )

    scale = _positive_finite("the OpenDP noise scale", kwargs["scale"])
    atom, _ = _carrier(kwargs["input_domain"])  # vector releases: i.i.d. noise per coordinate
    d_in = _as_d_in(measurement.input_metric, d_in)
    k = kwargs.get("k")
    if atom in _DEFAULT_K:
        k_eff = _DEFAULT_K[atom] if k is None else int(k)
        if 2.0**k_eff > _MAX_LATTICE_TO_SCALE * scale:
            raise UnsupportedMechanismError(
                f"dpinfer cannot model float noise on the coarse lattice 2^{k_eff} (scale {scale}): "
                "OpenDP then rounds the input to that lattice and releases lattice values, a "
                "discrete law, not the continuous density; use the default k"
            )
        grain = 2.0**k_eff
    elif atom in _SIGNED_INTS | _UNSIGNED_INTS:
        grain = 0.0
    else:
        raise UnsupportedMechanismError(f"dpinfer cannot model noise on OpenDP's {atom} domain")

    if family == "laplace":
        if delta is not None:
            raise ValueError("delta applies to Gaussian mechanisms only; the Laplace family is pure DP")
        _check_map(measurement, d_in, d_in / scale, (d_in + grain) / scale, f"epsilon = d_in / scale = {d_in}/{scale}")
        epsilon = _epsilon_for_scale(d_in, scale)
        if grain:
            return Laplace(epsilon, d_in, neighbour)
        if atom in _UNSIGNED_INTS:  # saturating addition: the release is max(0, x + e)
            return ClampedGeometric(epsilon, 0, None, d_in, neighbour)
        return DoubleGeometric(epsilon, d_in, neighbour)

    # Gaussian family: rho-zCDP with rho = d_in^2 / (2 sigma^2)
    if delta is None:
        delta = 1e-6 if fixed_delta is None else fixed_delta
    elif fixed_delta is not None and float(delta) != fixed_delta:
        raise ValueError(f"delta={delta!r} contradicts the enclosing make_fix_delta's delta={fixed_delta!r}")
    _check_map(
        measurement, d_in, d_in**2 / (2 * scale**2), (d_in + grain) ** 2 / (2 * scale**2),
        f"rho = d_in^2 / (2 scale^2) with d_in = {d_in}, scale = {scale}",
    )
    if grain:
        return Gaussian.from_sigma(scale, d_in, delta, neighbour)
    if atom in _UNSIGNED_INTS:
        raise UnsupportedMechanismError(
            f"dpinfer cannot model the discrete Gaussian on unsigned {atom}: OpenDP saturates at 0, "
            "so the release is a censored discrete Gaussian, which dpinfer does not provide; use a "
            "signed integer domain"
        )
    return DiscreteGaussian(scale, d_in, delta, neighbour)


# --- diffprivlib ---------------------------------------------------------------------------------


def _import_diffprivlib():
    try:
        import diffprivlib.mechanisms as dpl_mechanisms
        from diffprivlib.mechanisms.base import DPMechanism
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "from_diffprivlib needs diffprivlib (pip install 'dpinfer[adapters]'; diffprivlib 0.6.6 "
            "needs scikit-learn < 1.7)"
        ) from err
    return dpl_mechanisms, DPMechanism


_DIFFPRIVLIB_REFUSED = {
    "LaplaceFolded": "its release is x + Laplace noise reflected into [lower, upper] (folded), a law no "
    "dpinfer mechanism has",
    "LaplaceBoundedNoise": "its noise is a Laplace truncated to [-A, A] around the true value (Geng et "
    "al.); dpinfer's TruncatedLaplace truncates the release to fixed bounds instead",
    "GeometricFolded": "its release is folded (reflected) into [lower, upper], a law no dpinfer "
    "mechanism has",
    "Staircase": "no dpinfer mechanism has the staircase law",
    "Snapping": "Mironov's snapping mechanism (clamp, Laplace, round to a power-of-2 grid) is not a "
    "dpinfer mechanism",
    "Binary": "binary randomised response on labels is not adapted (dpinfer's RandomizedResponse "
    "models tables of records)",
}


def _bounds(mechanism) -> tuple[float, float]:
    lower, upper = float(mechanism.lower), float(mechanism.upper)
    if not lower < upper:
        raise UnsupportedMechanismError(
            f"dpinfer cannot model {type(mechanism).__name__} with lower = upper = {lower}: the "
            "release is that constant"
        )
    return lower, upper


def _laplace_scale(mechanism) -> float:
    """diffprivlib's Laplace scale, as in ``Laplace.randomise``: sensitivity / (epsilon - log(1 - delta))."""
    sensitivity = _positive_finite("sensitivity", mechanism.sensitivity)
    with np.errstate(divide="ignore"):
        rate = mechanism.epsilon - np.log(1 - mechanism.delta)
    return _positive_finite("the Laplace scale", sensitivity / rate)


def _dpl_laplace(mechanism, neighbour):
    """Laplace(x, b), b = sensitivity / (epsilon - log(1 - delta)) -> dpinfer Laplace(b)."""
    b = _laplace_scale(mechanism)
    return Laplace(_epsilon_for_scale(float(mechanism.sensitivity), b), float(mechanism.sensitivity), neighbour)


def _dpl_laplace_truncated(mechanism, neighbour):
    """clamp(x + Laplace(b), lower, upper), b as for Laplace -> dpinfer BITLaplace(b)."""
    b = _laplace_scale(mechanism)
    sensitivity = float(mechanism.sensitivity)
    epsilon = _epsilon_for_scale(sensitivity, b)
    lower, upper = _bounds(mechanism)
    if math.isinf(lower) and math.isinf(upper):
        return Laplace(epsilon, sensitivity, neighbour)
    if math.isinf(lower):
        raise UnsupportedMechanismError(
            "dpinfer cannot model LaplaceTruncated clamped above only (lower = -inf): BITLaplace "
            "clamps at lower, or at both bounds"
        )
    return BITLaplace(epsilon, lower, None if math.isinf(upper) else upper, sensitivity, neighbour)


def _dpl_laplace_bounded_domain(mechanism, neighbour):
    """Laplace(clamp(x), b') conditioned on [lower, upper], b' diffprivlib's ``_find_scale``
    -> dpinfer TruncatedLaplace(scale=b')."""
    lower, upper = _bounds(mechanism)
    if math.isinf(lower) or math.isinf(upper):
        raise UnsupportedMechanismError("dpinfer cannot model LaplaceBoundedDomain with infinite bounds")
    sensitivity = _positive_finite("sensitivity", mechanism.sensitivity)
    # randomise() uses the cached _scale once set, else _find_scale(); do the same
    cached = getattr(mechanism, "_scale", None)
    b = _positive_finite("the bounded-domain Laplace scale", cached if cached is not None else mechanism._find_scale())
    if mechanism.delta == 0:
        asked = _positive_finite("epsilon", mechanism.epsilon)
        # TruncatedLaplace warns if its exact epsilon at b exceeds diffprivlib's epsilon
        return TruncatedLaplace(asked, lower, upper, sensitivity, scale=b, neighbour=neighbour)
    # delta > 0: diffprivlib claims (epsilon, delta); dpinfer states the law's exact pure epsilon
    asked = TruncatedLaplace.epsilon_effective(b, lower, upper, sensitivity)
    return TruncatedLaplace(asked, lower, upper, sensitivity, scale=b, neighbour=neighbour)


def _dpl_geometric(mechanism, neighbour):
    """x + e, P(e) = (1 - a)/(1 + a) a^|e|, a = exp(-epsilon / sensitivity) -> DoubleGeometric."""
    epsilon = _positive_finite("epsilon", mechanism.epsilon)
    _positive_finite("sensitivity", mechanism.sensitivity)
    return DoubleGeometric(epsilon, mechanism.sensitivity, neighbour)


def _dpl_geometric_truncated(mechanism, neighbour):
    """clamp(x + e, lower, upper), e as for Geometric -> ClampedGeometric."""
    epsilon = _positive_finite("epsilon", mechanism.epsilon)
    _positive_finite("sensitivity", mechanism.sensitivity)
    lower, upper = _bounds(mechanism)
    if math.isinf(lower) and math.isinf(upper):
        return DoubleGeometric(epsilon, mechanism.sensitivity, neighbour)
    if math.isinf(lower):
        raise UnsupportedMechanismError(
            "dpinfer cannot model GeometricTruncated clamped above only (lower = -inf): "
            "ClampedGeometric clamps at lower, or at both bounds"
        )
    return ClampedGeometric(
        epsilon, int(lower), None if math.isinf(upper) else int(upper), mechanism.sensitivity, neighbour
    )


def _dpl_gaussian(mechanism, neighbour):
    """x + N(0, sigma^2), sigma the one ``randomise`` uses (classical or Balle-Wang analytic)
    -> Gaussian.from_sigma(sigma, sensitivity, delta)."""
    sigma = _positive_finite("sigma", mechanism._scale)
    sensitivity = _positive_finite("sensitivity", mechanism.sensitivity)
    return Gaussian.from_sigma(sigma, sensitivity, float(mechanism.delta), neighbour)


def _dpl_gaussian_discrete(mechanism, neighbour):
    """x + N_Z(0, sigma^2), sigma diffprivlib's (CKS Thm 7 calibration) -> DiscreteGaussian."""
    sigma = _positive_finite("sigma", mechanism._scale)
    _positive_finite("sensitivity", mechanism.sensitivity)
    return DiscreteGaussian(sigma, mechanism.sensitivity, float(mechanism.delta), neighbour)


_DIFFPRIVLIB_ADAPTERS = {
    "Laplace": _dpl_laplace,
    "LaplaceTruncated": _dpl_laplace_truncated,
    "LaplaceBoundedDomain": _dpl_laplace_bounded_domain,
    "Geometric": _dpl_geometric,
    "GeometricTruncated": _dpl_geometric_truncated,
    "Gaussian": _dpl_gaussian,
    "GaussianAnalytic": _dpl_gaussian,
    "GaussianDiscrete": _dpl_gaussian_discrete,
}


def from_diffprivlib(mechanism, *, neighbour: str = "add-remove") -> Mechanism:
    """The dpinfer mechanism with the release law of a diffprivlib mechanism.

    Supported (exact classes; module docstring for the laws): ``Laplace``, ``LaplaceTruncated``,
    ``LaplaceBoundedDomain``, ``Geometric``, ``GeometricTruncated``, ``Gaussian``,
    ``GaussianAnalytic``, ``GaussianDiscrete``. The parameters are read as ``randomise`` uses
    them (diffprivlib's Gaussians and bounded-domain Laplace keep their scale in the private
    ``_scale``, which is read).

    ``neighbour`` is the relation under which the mechanism's ``sensitivity`` holds.

    Raises
    ------
    TypeError
        ``mechanism`` is not a diffprivlib mechanism.
    UnsupportedMechanismError
        A diffprivlib mechanism whose law no dpinfer mechanism has (folded, bounded-noise,
        staircase, snapping, exponential, ...), a user subclass (which may change the sampler),
        or parameters that give no noise (sensitivity 0, infinite epsilon).
    """
    dpl_mechanisms, DPMechanism = _import_diffprivlib()
    cls = type(mechanism)
    if not isinstance(mechanism, DPMechanism):
        raise TypeError(f"from_diffprivlib needs a diffprivlib mechanism, got {cls.__module__}.{cls.__name__}")
    name = cls.__name__
    if getattr(dpl_mechanisms, name, None) is not cls:
        raise UnsupportedMechanismError(
            f"dpinfer cannot model {cls.__module__}.{name}: not one of diffprivlib's own mechanisms "
            "(a subclass may change the sampler); supported are " + ", ".join(_DIFFPRIVLIB_ADAPTERS)
        )
    if name in _DIFFPRIVLIB_REFUSED:
        raise UnsupportedMechanismError(f"dpinfer cannot model diffprivlib's {name}: {_DIFFPRIVLIB_REFUSED[name]}")
    adapter = _DIFFPRIVLIB_ADAPTERS.get(name)
    if adapter is None:
        raise UnsupportedMechanismError(
            f"dpinfer cannot model diffprivlib's {name}: no dpinfer mechanism has its release law; "
            "supported are " + ", ".join(_DIFFPRIVLIB_ADAPTERS)
        )
    return adapter(mechanism, neighbour)
