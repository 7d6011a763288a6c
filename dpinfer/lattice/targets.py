r"""Laws on the kernel lattice ``Lambda = {z in Z^d : A z = 0}`` of the invariants, as
unnormalised log pmfs evaluated row-wise:

    log q(z) = -epsilon ||z||_1          (generalized Laplace, l1; seed 001 Eq. 5),
    log q(z) = -epsilon ||z||_2          (generalized Laplace, l2),
    log q(z) = -||z||_2^2 / (2 sigma^2)  (lattice Gaussian; seed 001 Eq. 8).

A :class:`LatticeTarget` names one of them by a ``kind`` code and a scale, which the compiled
samplers (:mod:`dpinfer.lattice.random_walk`, :mod:`dpinfer.lattice.noise_gibbs`) read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatticeTarget:
    """An unnormalised log pmf on the lattice, row-wise: ``kind`` 0 is ``-scale ||z||_1``,
    1 is ``-scale ||z||_2``, 2 is ``-||z||_2^2 * scale`` (scale = 1 / (2 sigma^2)). Known kinds
    let :meth:`~dpinfer.lattice.random_walk.LatticeWalk.run` use its compiled kernel (the walk
    takes any other callable too) and are what :class:`~dpinfer.lattice.noise_gibbs.NoiseGibbs`
    samples."""

    kind: int
    scale: float

    def __call__(self, z: np.ndarray) -> np.ndarray:
        if self.kind == 0:
            return -self.scale * np.abs(z).sum(axis=-1)
        if self.kind == 1:
            return -self.scale * np.sqrt(np.square(z, dtype=float).sum(axis=-1))
        return -self.scale * np.square(z, dtype=float).sum(axis=-1)


def laplace_log_target(epsilon: float, norm_name: str) -> LatticeTarget:
    """``log q(z) = -epsilon ||z||`` in the l1 or l2 norm (seed 001, Eq. 5), row-wise."""
    epsilon = _positive("epsilon", epsilon)
    if norm_name not in ("l1", "l2"):
        raise ValueError(f"norm must be 'l1' or 'l2', got {norm_name!r}")
    return LatticeTarget(0 if norm_name == "l1" else 1, epsilon)


def gaussian_log_target(sigma: float) -> LatticeTarget:
    """``log q(z) = -||z||_2^2 / (2 sigma^2)``: the lattice Gaussian centred at 0 (seed 001, Eq. 8)."""
    sigma = _positive("sigma", sigma)
    return LatticeTarget(2, 1.0 / (2.0 * sigma * sigma))


def _positive(name: str, value) -> float:
    value = float(value)
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


