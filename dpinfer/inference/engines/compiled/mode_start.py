"""Chains started around the parameters' mode given a naive estimate of some latents.

With many records the law of the sum's posterior is sharp: the true statistic T lies within
the noise's scale of the release s, the parameters within O(1/sqrt(n)) of their estimate.
From PyMC's default start (the parameters at their support points, T drawn near n E[t] there)
T sits thousands of posterior sds from s, and 500 warm-up iterations of NUTS do not reach the
mode (measured at n = 10^6, issue 39). The start here reads the release as the truth (T = s,
the *naive estimate*, held), finds the mode q* of the log density in the other coordinates
(L-BFGS on the compiled log density and its gradient), takes its Hessian H by central
differences of the gradient, and starts each chain at

    q_c = q* + 2 H^{-1/2} z_c,   z_c ~ N(0, I),

a draw from the normal law at the mode with twice its sds: starts overdispersed with respect
to the posterior, as the between-chain comparison of R-hat assumes (Gelman & Rubin 1992,
Statistical Science 7, 457-472). Where the Hessian is not positive definite the directions
of non-positive curvature are left at the mode.

The chains' first diagonal metric is that normal law's variances, diag(H^{-1}) (NUTS's
inverse mass: the posterior variances it estimates later in warm-up, Stan's windowed
adaptation). Without it the first metric is 1 / |gradient| at the start (nutpie's), which at
2 sds from the mode is about sd / 2 for every coordinate, not sd^2: at 10^6 records the
regression coefficients' sds are 1e-3 of the noise variables', the step size falls to the
smallest scale and the first warm-up window runs at the maximal tree depth (measured: p = 10
covariates, 10^6 records, five of eight minutes spent in the first hundred iterations).
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

from dpinfer.inference.engines.compiled.nuts import log_density_at

MAX_ITERATIONS = 2000
OVERDISPERSION = 2.0  # the starts' sd, in posterior sds of the normal law at the mode
STEP = 1e-5  # central differences' relative step


def held_coordinates(compiled, held: list[str]) -> np.ndarray:
    """The boolean mask of q's coordinates of the variables named ``held``."""
    mask = np.zeros(compiled.n, bool)
    for name in held:
        mask[compiled.slices[compiled.names.index(name)]] = True
    return mask


def mode_starts(compiled, q0: np.ndarray, held: list[str], seeds: list[int]) -> tuple[list, dict, np.ndarray]:
    """(one start per seed, a summary for the report, the first metric): the chains' parameters
    around the mode of the log density with the coordinates of ``held`` kept at their values in
    ``q0`` (module docstring). The summary gives the optimiser's iterations, whether it converged
    and the mode's log density; a failed optimisation (no finite mode) leaves every chain at
    ``q0``. The metric is diag(H^{-1}) on the free coordinates with positive curvature, 0 (no
    estimate) elsewhere."""
    free = np.flatnonzero(~held_coordinates(compiled, held))
    counts = np.zeros(compiled.n_counts, np.int64)
    env = compiled.environment(counts)
    grad = np.empty(compiled.n)
    address = compiled.logp_grad_address

    def gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        q = q0.copy()
        q[free] = theta
        value = log_density_at(address, q, grad, env)
        return value, grad[free].copy()

    def negative(theta: np.ndarray) -> tuple[float, np.ndarray]:
        value, g = gradient(theta)
        return (-value, -g) if np.isfinite(value) else (np.inf, np.zeros_like(theta))

    start_value, _ = gradient(q0[free])
    result = optimize.minimize(negative, q0[free], jac=True, method="L-BFGS-B",
                               options={"maxiter": MAX_ITERATIONS})
    summary = {"iterations": int(result.nit), "converged": bool(result.success),
               "log_density_at_start": float(start_value), "log_density_at_mode": float(-result.fun)}
    metric = np.zeros(compiled.n)
    if not np.isfinite(result.fun) or (np.isfinite(start_value) and -result.fun < start_value):
        summary["used"] = False
        return [q0.copy() for _ in seeds], summary, metric
    mode = result.x
    spread = _inverse_sqrt_curvature(gradient, mode)
    metric[free] = np.sum(spread**2, axis=1)  # diag(H^{-1}) = diag(S S'), S = H^{-1/2}
    starts = []
    for seed in seeds:
        q = q0.copy()
        q[free] = mode + OVERDISPERSION * spread @ np.random.default_rng(seed).standard_normal(len(free))
        starts.append(q)
    summary["used"] = True
    return starts, summary, metric


def _inverse_sqrt_curvature(gradient, mode: np.ndarray) -> np.ndarray:
    """H^{-1/2} at ``mode`` (H the negative Hessian of the log density, by central differences
    of ``gradient``), with the directions of non-positive curvature dropped."""
    d = len(mode)
    hessian = np.empty((d, d))
    for j in range(d):
        h = STEP * max(1.0, abs(mode[j]))
        up, down = mode.copy(), mode.copy()
        up[j] += h
        down[j] -= h
        hessian[:, j] = -(gradient(up)[1] - gradient(down)[1]) / (2.0 * h)
    hessian = 0.5 * (hessian + hessian.T)
    if not np.all(np.isfinite(hessian)):
        return np.zeros((d, d))
    values, vectors = np.linalg.eigh(hessian)
    scale = np.where(values > 0, 1.0 / np.sqrt(np.where(values > 0, values, 1.0)), 0.0)
    return vectors * scale
