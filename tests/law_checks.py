"""Shared checks of sampled laws against enumerated ones (imported by the test modules)."""

from __future__ import annotations

import itertools

import arviz as az
import numpy as np


def kernel_lattice_law(invariants, log_weight, radius: int):
    """The lattice points z = C w, |w_j| <= radius (C the invariants' kernel basis), and their
    probabilities proportional to exp(log_weight(z)) (row-wise)."""
    C = np.asarray(invariants.kernel_basis())
    w = np.array(list(itertools.product(range(-radius, radius + 1), repeat=C.shape[1])))
    z = w @ C.T
    log_p = np.asarray(log_weight(z), dtype=float)
    p = np.exp(log_p - log_p.max())
    return z, p / p.sum()


def empirical_tv(draws, support, p) -> float:
    """Total variation between the empirical law of ``draws`` (rows) and ``p`` on ``support``."""
    index = {tuple(r): i for i, r in enumerate(support)}
    q = np.bincount([index[tuple(r)] for r in draws], minlength=len(p)) / len(draws)
    return float(0.5 * np.abs(q - p).sum())


def iid_tv_quantile(p, n: int, rng, *, n_sims: int = 300, level: float = 0.999) -> float:
    """The ``level`` quantile, by simulation, of the TV of n i.i.d. draws from p to p itself:
    the tolerance of :func:`empirical_tv` for a sampler of p."""
    sims = [0.5 * np.abs(np.bincount(rng.choice(len(p), n, p=p), minlength=len(p)) / n - p).sum()
            for _ in range(n_sims)]
    return float(np.quantile(sims, level))


def posterior_mean_z(idata, name: str, support, p):
    """Per cell, (posterior mean of ``name`` - exact mean under p on ``support``) / MCSE (the
    exact sd over the square root of the bulk ESS), and that MCSE."""
    draws = idata.posterior[name].values.reshape(-1, support.shape[1])
    mean = p @ support
    se = np.sqrt(p @ support ** 2 - mean ** 2) / np.sqrt(az.ess(idata, var_names=[name])[name].values.reshape(-1))
    return (draws.mean(0) - mean) / se, se
