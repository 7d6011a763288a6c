"""Warn when plain ``pm.sample`` is about to treat privatised true counts with its defaults.

PyMC picks a step method for each free variable by asking every class in
``pymc.step_methods.STEP_METHODS`` for its competence (PyMC's documented extension point).
``LatentCountGuard`` is never competent; asking it is how dpinfer notices, during plain
``pm.sample``, a latent count that ``Mechanism.observe`` tagged, and points to
``dpinfer.sample``.
"""

from __future__ import annotations

import pymc.step_methods as step_methods
from pymc.step_methods.compound import BlockedStep, Competence

from dpinfer.inference.sampling import warn_if_latent


class LatentCountGuard(BlockedStep):
    @staticmethod
    def competence(var, has_grad):
        warn_if_latent(var)
        return Competence.INCOMPATIBLE


def install() -> None:
    if LatentCountGuard not in step_methods.STEP_METHODS:
        step_methods.STEP_METHODS.append(LatentCountGuard)
