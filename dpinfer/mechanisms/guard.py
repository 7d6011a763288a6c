"""Warn when plain ``pm.sample`` is about to treat privatised true counts with its defaults.

PyMC picks a step method for each free variable by asking every class in
``pymc.step_methods.STEP_METHODS`` for its competence (PyMC's documented extension point).
``LatentCountGuard`` is never competent; asking it is how dpinfer notices, during plain
``pm.sample``, a latent count that ``Mechanism.observe`` tagged (and installed this guard
for), and points to ``dpinfer.sample``.
"""

from __future__ import annotations

import warnings

import pymc.step_methods as step_methods
from pymc.step_methods.compound import BlockedStep, Competence


def warn_if_latent(var) -> None:
    """Called by PyMC's step assignment (via :class:`LatentCountGuard`) for every variable."""
    name = getattr(var.tag, "dpinfer_release", None)
    if name is not None:
        warnings.warn(
            f"{var.name!r} are true counts behind the privatised release {name!r}: PyMC's default "
            "Metropolis mixes poorly on them. Use dpinfer.sample() instead of pm.sample(), which "
            "draws them exactly.",
            UserWarning,
            stacklevel=2,
        )


class LatentCountGuard(BlockedStep):
    @staticmethod
    def competence(var, has_grad):
        warn_if_latent(var)
        return Competence.INCOMPATIBLE


def install() -> None:
    if LatentCountGuard not in step_methods.STEP_METHODS:
        step_methods.STEP_METHODS.append(LatentCountGuard)
