r"""Equal privacy: mechanisms of different kinds calibrated to one privacy target.

**The rule.** A comparison fixes the query (one count or statistic of sensitivity Δ under one
neighbour relation) and one target, then gives every mechanism family the *smallest* noise
scale whose exact guarantee meets it:

* ``PrivacyTarget.pure(epsilon)``: epsilon-DP, the privacy loss never exceeds epsilon, i.e. the
  tight delta(epsilon) is 0;
* ``PrivacyTarget.approximate(epsilon, delta)``: (epsilon, delta)-DP with the tight profile,
  delta(epsilon) = sup over neighbours of the hockey-stick divergence
  (``mechanism.delta_for_epsilon``: Balle & Wang 2018 for the Gaussian, Canonne, Kamath &
  Steinke 2020 Thm 7 for the discrete Gaussian, seed 004 Lemma 1 / Theorems 3-4 for the
  Laplace, Logistic and Subbotin laws, an exact sum for the double geometric);
* ``PrivacyTarget.zcdp(rho)``: rho-zCDP, sup_alpha D_alpha / alpha <= rho with the exact
  Rényi divergences (``mechanism.zcdp_rho``; Bun & Steinke 2016).

Never a loose bound: not sigma = Δ sqrt(2 ln(1.25/delta)) / epsilon (not even private for
epsilon > 1, seed 004 P8), not "epsilon-DP implies epsilon^2/2-zCDP" (Laplace noise meets a
rho target with a smaller scale than that implication gives). So a pure-DP family entered in
an (epsilon, delta) comparison gets a scale *below* Δ/epsilon (Laplace: Δ/(epsilon -
2 ln(1 - delta)), seed 004 Theorem 3): at equal (epsilon, delta) it is not handicapped.

A family that meets the target at no scale is refused with the reason: Gaussian, discrete
Gaussian and Subbotin (r > 1) noise is never pure epsilon-DP (its privacy loss is unbounded,
seed 004 Theorem 6); Subbotin noise with r > 2 is never rho-zCDP (D_alpha / alpha grows
without bound in alpha).

Calibration is a doubling bracket and Brent's root on the log scale, then the smallest float
on the private side (:func:`dpinfer.privacy.smallest_scale_by_root`); each profile is
monotone in the scale for these symmetric log-concave laws (seed 004 Lemma 18(b)).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpinfer._validation import check_delta, check_epsilon, check_positive
from dpinfer.mechanisms import DiscreteGaussian, DoubleGeometric, Gaussian, Laplace, Logistic, Subbotin
from dpinfer.mechanisms.base import AdditiveMechanism
from dpinfer.privacy import smallest_scale_by_root

__all__ = ["PrivacyTarget", "Calibration", "calibrate", "equal_privacy_table", "FAMILIES"]

# Searches aim a hair inside the target so that float rounding in a profile cannot put the
# returned scale on the wrong side of it.
_MARGIN = 1e-9


@dataclass(frozen=True)
class PrivacyTarget:
    """One privacy target of a comparison (module docstring): build it with :meth:`pure`,
    :meth:`approximate` or :meth:`zcdp`."""

    kind: str
    epsilon: float | None = None
    delta: float = 0.0
    rho: float | None = None

    @classmethod
    def pure(cls, epsilon) -> PrivacyTarget:
        """epsilon-DP."""
        return cls("pure", epsilon=check_epsilon(epsilon))

    @classmethod
    def approximate(cls, epsilon, delta) -> PrivacyTarget:
        """(epsilon, delta)-DP, delta in (0, 1)."""
        return cls("approximate", epsilon=check_epsilon(epsilon), delta=check_delta(delta))

    @classmethod
    def zcdp(cls, rho) -> PrivacyTarget:
        """rho-zero-concentrated DP (Bun & Steinke 2016)."""
        return cls("zcdp", rho=check_positive("rho", rho))

    def achieved(self, mechanism) -> float:
        """The quantity this target bounds, for ``mechanism``, exactly: its tight delta at the
        target's epsilon (pure and approximate targets) or its rho (zCDP)."""
        if self.kind == "zcdp":
            return float(mechanism.zcdp_rho)
        return float(mechanism.delta_for_epsilon(self.epsilon))

    def bound(self) -> float:
        """The target's bound on :meth:`achieved`: 0 (pure), delta, or rho."""
        return {"pure": 0.0, "approximate": self.delta, "zcdp": self.rho}[self.kind]

    def met_by(self, mechanism) -> bool:
        """Whether ``mechanism`` meets the target (no slack beyond float rounding): by its
        exact profile where it has one (additive mechanisms), else by its stated guarantee
        (epsilon', delta'), which implies the target when epsilon' <= epsilon and
        delta' <= delta, or, for rho-zCDP, when delta' = 0 and epsilon'^2 / 2 <= rho (Bun &
        Steinke 2016, Prop. 1.4; a bound, so a mechanism can meet the target and fail this)."""
        if isinstance(mechanism, AdditiveMechanism):
            return self.achieved(mechanism) <= self.bound() * (1.0 + 1e-12)
        eps, delta = mechanism.privacy.epsilon, mechanism.privacy.delta
        slack = 1.0 + 1e-12
        if self.kind == "pure":
            return delta == 0.0 and eps <= self.epsilon * slack
        if self.kind == "approximate":
            return eps <= self.epsilon * slack and delta <= self.delta * slack
        return delta == 0.0 and eps * eps / 2.0 <= self.rho * slack

    def __str__(self) -> str:
        if self.kind == "pure":
            return f"{self.epsilon:g}-DP"
        if self.kind == "approximate":
            return f"({self.epsilon:g}, {self.delta:.3g})-DP"
        return f"{self.rho:g}-zCDP"


@dataclass(frozen=True)
class _Family:
    """How one mechanism family is built from its noise scale, and where it cannot go."""

    name: str
    scale_name: str
    build: object  # (scale, sensitivity, target) -> mechanism
    integer: bool  # needs a whole-number sensitivity
    unbounded_loss: bool  # never pure DP
    zcdp: bool = True  # some scale is rho-zCDP

    def refusal(self, target: PrivacyTarget) -> str | None:
        if target.kind == "pure" and self.unbounded_loss:
            return (f"{self.name} noise is never pure epsilon-DP (its privacy loss is unbounded); "
                    "compare at (epsilon, delta) or rho-zCDP instead")
        if target.kind == "zcdp" and not self.zcdp:
            return (f"{self.name} noise is never rho-zCDP (D_alpha / alpha grows without bound in "
                    "alpha: the privacy loss grows faster than linearly); compare at (epsilon, "
                    "delta) instead")
        return None


def _gaussian(sigma, sensitivity, target):
    delta = target.delta if target.kind == "approximate" else 1e-6
    return Gaussian.from_sigma(sigma, sensitivity, delta=delta)


def _discrete_gaussian(sigma, sensitivity, target):
    delta = target.delta if target.kind == "approximate" else 1e-6
    return DiscreteGaussian(sigma, sensitivity, delta=delta)


def _logistic(scale, sensitivity, target):
    delta = target.delta if target.kind == "approximate" else 0.0
    return Logistic.from_scale(scale, delta=delta, sensitivity=sensitivity)


def _subbotin_family(r: float) -> _Family:
    """Subbotin(r) noise (seed 004), r >= 1: pure DP only at r = 1, zCDP only for r <= 2."""
    def build(scale, sensitivity, target):
        delta = target.delta if target.kind == "approximate" else (0.0 if r == 1 else 1e-6)
        return Subbotin.from_scale(r, scale, delta, sensitivity=sensitivity)
    return _Family(f"Subbotin({r:g})", "s", build, integer=False, unbounded_loss=r > 1,
                   zcdp=r <= 2)


FAMILIES = {
    "Laplace": _Family("Laplace", "b", lambda b, s, t: Laplace(epsilon=s / b, sensitivity=s),
                       integer=False, unbounded_loss=False),
    "DoubleGeometric": _Family("DoubleGeometric", "b",
                               lambda b, s, t: DoubleGeometric(epsilon=s / b, sensitivity=s),
                               integer=True, unbounded_loss=False),
    "Gaussian": _Family("Gaussian", "sigma", _gaussian, integer=False, unbounded_loss=True),
    "DiscreteGaussian": _Family("DiscreteGaussian", "sigma", _discrete_gaussian, integer=True,
                                unbounded_loss=True),
    "Logistic": _Family("Logistic", "s", _logistic, integer=False, unbounded_loss=False),
}
_SUBBOTIN = re.compile(r"Subbotin\(([0-9.eE+-]+)\)")


@dataclass(frozen=True)
class Calibration:
    """A mechanism calibrated to a target: its scale, noise sd, and the exact value of the
    target's quantity at that scale (``achieved`` <= the target's bound)."""

    family: str
    mechanism: object
    target: PrivacyTarget
    scale_name: str
    scale: float
    noise_sd: float
    achieved: float


def family_spec(family) -> _Family:
    if isinstance(family, str) and family in FAMILIES:
        return FAMILIES[family]
    if isinstance(family, type) and family.__name__ in FAMILIES:
        return FAMILIES[family.__name__]
    match = _SUBBOTIN.fullmatch(family) if isinstance(family, str) else None
    if match:
        r = float(match.group(1))
        if not r >= 1:
            raise ValueError(f"Subbotin(r) needs r >= 1 (log-concave noise), got r = {r:g}")
        return _subbotin_family(r)
    raise ValueError(f"family must be one of {sorted(FAMILIES)} or 'Subbotin(r)' with r >= 1 "
                     f"(a name or the class), got {family!r}")


def calibrate(family, target: PrivacyTarget, sensitivity=1) -> Calibration:
    """The ``family`` mechanism (a name in :data:`FAMILIES` or the class) with the smallest
    noise scale meeting ``target`` for a query of sensitivity ``sensitivity`` (module
    docstring). Raises ValueError naming the reason where no scale meets the target."""
    spec = family_spec(family)
    if not isinstance(target, PrivacyTarget):
        raise TypeError(f"target must be a PrivacyTarget, got {type(target).__name__}")
    sensitivity = check_positive("sensitivity", sensitivity)
    if spec.integer:
        if sensitivity != int(sensitivity):
            raise ValueError(f"{spec.name} needs a whole-number sensitivity, got {sensitivity}")
        sensitivity = int(sensitivity)
    reason = spec.refusal(target)
    if reason:
        raise ValueError(reason)
    aim = target.bound() * (1.0 - _MARGIN)

    def excess(scale):
        return target.achieved(spec.build(scale, sensitivity, target)) - aim

    start = sensitivity / (math.sqrt(2.0 * target.rho) if target.kind == "zcdp" else target.epsilon)
    scale = smallest_scale_by_root(excess, start)
    mechanism = spec.build(scale, sensitivity, target)
    return Calibration(spec.name, mechanism, target, spec.scale_name, scale,
                       math.sqrt(mechanism.noise_variance), target.achieved(mechanism))


def equal_privacy_table(target: PrivacyTarget, families=None, sensitivity=1) -> pd.DataFrame:
    """One row per family calibrated to ``target`` (all of :data:`FAMILIES` by default): its
    scale, noise sd, the exact achieved quantity, and for families that cannot meet the
    target the reason instead (refusals are rows, not silent omissions)."""
    rows = []
    for family in families if families is not None else FAMILIES:
        spec = family_spec(family)
        try:
            cal = calibrate(spec.name, target, sensitivity)
        except ValueError as err:
            rows.append({"family": spec.name, "target": str(target), "scale": np.nan,
                         "noise_sd": np.nan, "achieved": np.nan, "note": str(err)})
            continue
        rows.append({"family": spec.name, "target": str(target),
                     "scale": cal.scale, "scale_name": cal.scale_name,
                     "noise_sd": cal.noise_sd, "achieved": cal.achieved,
                     "note": str(cal.mechanism.privacy)})
    return pd.DataFrame(rows).set_index("family")
