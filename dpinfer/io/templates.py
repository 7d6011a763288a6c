"""Model templates for ``dpinfer fit``: a PyMC model of the true counts behind a release file.

Each template is ``build(release, exposure=None) -> (model, latent_name)``: a model whose
latent counts carry the release (``release.observe``, invariants included). The counts have
the release's true shape (:attr:`~dpinfer.io.release.Release.true_shape`: one per row of
a multi-level release), and templates centre their priors on the release, per true value.
``exposure`` is one positive value per row of the values file (a row's exposure applies to
every cell of a two-way table's row); ``dpinfer fit`` passes the manifest's declared
``exposure_column`` unless told otherwise (:mod:`dpinfer.io.fit`).

* ``poisson-hierarchical``: for any release of counts (one value per cell, any shape),
  x_i ~ Poisson(e_i exp(eta_i)), eta_i ~ N(mu, sigma) (the model's ``log_rate``),
  mu ~ N(log(m / e), 2) centred on the release's mean m per unit of mean exposure e,
  sigma ~ HalfNormal(max(1, 2 sigma_hat)); e_i = 1 or the exposure (e.g. population). The
  demo's county model (README "The demo").
* ``binomial-hierarchical``: counts out of a known number of trials N_i,
  x_i ~ Binomial(N_i, logistic(eta_i)), eta_i ~ N(mu, sigma) (``logit_p``),
  mu ~ N(logit(m / N), 2), sigma ~ HalfNormal(max(1, 2 sigma_hat)); N_i the exposure or, by
  default, the mechanism's public upper bound (TruncatedLaplace, BITLaplace,
  ClampedGeometric). A TruncatedLaplace likelihood is flat for true values beyond its bounds
  (they are clipped first, seed 002), so only a prior bounded by them makes the windows of the
  counts finite: this is its template.
* ``loglinear``: for a two-way table, x_ij ~ Poisson(e_i exp(eta_ij)),
  eta_ij ~ N(a + r_i + c_j, tau) (``log_rate``), a ~ N(log(m / e), 1), r_i, c_j ~ N(0, 1),
  tau ~ HalfNormal(max(1, 2 tau_hat)) (the gallery's delinquent-children model,
  models/delinquent_children_4x4).
* ``dirichlet-multinomial``: for a randomised-response table of n records' reports,
  p ~ Dirichlet(1, ..., 1), t ~ Multinomial(n, p) the true table (``dp.sample`` sums t out and
  draws it exactly given p; dapper's vignette model, B2).
* ``auto`` (the default): ``dirichlet-multinomial`` for randomised response,
  ``binomial-hierarchical`` for TruncatedLaplace, else ``poisson-hierarchical``.

Centred where the counts are informative, non-centred where they are not
------------------------------------------------------------------------
A hierarchical effect eta_i ~ N(loc_i, sigma) can be written centred (eta_i a free
variable with that prior) or non-centred (eta_i = loc_i + sigma z_i, z_i ~ N(0, 1) free).
In the normal model y_i | eta_i ~ N(eta_i, 1/I_i) with sigma known, the Gibbs sampler of
(loc, eta) converges at the rate 1 / (1 + I_i sigma^2) centred and
I_i sigma^2 / (1 + I_i sigma^2) non-centred (Papaspiliopoulos, Roberts and Sköld 2007, "A
general framework for the parametrization of hierarchical models", Statistical Science 22(1),
§2): centred is the faster form exactly when the data's precision about eta_i exceeds the
prior's, I_i sigma^2 > 1.

sigma is not known, and NUTS moves it together with the cells' variables under one step size:
what breaks NUTS is a free variable whose conditional scale changes a lot as sigma moves over
the range [sigma_low, sigma_high] the posterior visits (a funnel: divergent transitions where
it narrows, sticking chains). Given sigma (and the normal approximation above), the
conditional sd of a centred cell is (I_i + sigma^-2)^(-1/2), which shrinks as sigma falls, by
the factor

    r_c^2 = (I_i + sigma_low^-2) / (I_i + sigma_high^-2)

over the range; that of a non-centred z_i is (1 + I_i sigma^2)^(-1/2), which shrinks as sigma
rises, by r_n^2 = (1 + I_i sigma_high^2) / (1 + I_i sigma_low^2). Since
r_c^2 / r_n^2 = [(1 + I sigma_low^2) sigma_high / ((1 + I sigma_high^2) sigma_low)]^2, the
centred variable's scale varies less exactly when sigma_high - sigma_low <
I sigma_low sigma_high (sigma_high - sigma_low), so each template chooses **per cell**
(:func:`poisson_parameterisation`, :func:`binomial_parameterisation`):

    centred_i  <=>  I_i sigma_low sigma_high > 1,

Papaspiliopoulos et al.'s rule at the geometric middle of the range (and exactly theirs when
the range is a point).

* **which information.** That of the likelihood NUTS evaluates. ``dp.sample`` fits these
  templates by drawing the counts given the parameters (the compiled engine's exact
  conditional draws; fibre moves where the invariants need them) and running NUTS on the
  parameters given the counts, so NUTS sees x_i ~ Poisson(e_i exp(eta_i)), whose information
  about eta_i is its variance V_i = lambda_i (binomial with logit link: V_i = N_i p_i (1 - p_i)),
  whatever the noise: the noise acts between the counts and the release, in the alternation
  of count draws and parameter moves, which no parameterisation of eta changes. Where the
  counts are summed out instead, NUTS sees the release's marginal likelihood, whose
  information is less when the noise sd is comparable to sqrt(V_i): the release s_i has mean
  mu_i(eta_i) and variance V_i + v_i (v_i the noise variance, :func:`noise_variance`), and
  for these canonical links d mu_i / d eta_i = V_i, so the information of the normal law with
  that mean and variance, the variance held fixed, is V_i^2 / (V_i + v_i)
  (:func:`cell_information`); ``information="release"`` chooses by it.
* **where V_i is evaluated.** At the release: lambda_i = max(s_i, 0), p_i =
  min(max(s_i, 0) / N_i, 1). A cell released at 0 or below (by noise) is taken to say nothing
  and is non-centred.
* **the range of sigma.** Before any fit, from the release: y_i = log(max(s_i, 1/2) / e_i)
  (logit for the binomial) estimates eta_i with variance w_i = (V_i + v_i) / V_i^2 (the delta
  method at max(s_i, 1/2), the noise included: the release's own scatter); y_i ~
  N(X beta, sigma^2 + w_i) with X the template's fixed effects (a mean; for ``loglinear`` the
  row and column effects) gives the restricted maximum-likelihood estimate sigma_hat and its
  95% profile-likelihood interval, the range, over a grid of 400 values from 10^-3 to 10^1.5
  (:func:`release_spread`). After a fit that falls short, ``dpinfer fit`` takes the range the
  posterior visited, the 1% and 99% quantiles of the fitted sigma, and rebuilds the model
  where that changes the choice (``spread=`` of :func:`build`; :mod:`dpinfer.io.fit`).

What the rule leaves out: it weighs the cells' own variables, not sigma's. Non-centred cells
the data pin down also make sigma's direction stiff where sigma is large (each moves every
eta_i = mu + sigma z_i at once, through exp), and a release whose sigma ranges over more than
a factor of ten leaves no choice that is good at both ends. The shipped sex-by-age table with
its bin widths as the exposure (not declared, see its manifest) is one: its outlying cell
(released 23 from a true 11) can be noise or a high rate, so the fitted sigma runs from 0.07
to 1; the release's range (0.41 to 0.83) centres 40 of 46 cells, which make a funnel at the
low end, and the fitted range centres 1, whose 45 non-centred cells gave hundreds of divergent
transitions at the high end, also at target_accept 0.95. Without that exposure its range
(0.13 to 0.51) centres one cell, the fitted range none, and ``dpinfer fit`` converges.

County populations (thousands to millions) are all centred; small counts with no spread
beyond the noise (the delinquent-children table) are all non-centred; a release spanning
both gets a mix, in one vector: ``log_rate_centred`` (the centred cells, N(loc, sigma)
directly) and ``z`` (the others) combined into the Deterministic ``log_rate`` (``logit_p``)
with one entry per cell. Where every cell is centred the free variable itself is
``log_rate``. The choice is recorded on the model (:func:`template_report`) and shown in the
fit's report.

The prior of sigma, HalfNormal(max(1, 2 sigma_hat)), is weakly informative at the scale the
release shows: it does not squash a spread larger than one unit of log rate (county
populations spread over 3 orders of magnitude, sigma_hat 1.11).

A user's model file (``dpinfer fit RELEASE --model my_model.py``) defines
``build_model(release) -> (model, latent_name)`` the same way.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from dpinfer.mechanisms import (
    BITLaplace,
    ClampedGeometric,
    MultiLevelGeometric,
    RandomizedResponse,
    TruncatedLaplace,
)

TEMPLATES = {
    "auto": "dirichlet-multinomial for randomised response, binomial-hierarchical for "
            "TruncatedLaplace, else poisson-hierarchical",
    "poisson-hierarchical": "hierarchical Poisson counts (any shape), optional exposure column",
    "binomial-hierarchical": "hierarchical binomial counts out of N trials (an exposure column, "
                             "or the mechanism's upper bound)",
    "loglinear": "two-way table: row, column and cell effects on the log rate, optional row exposure",
    "dirichlet-multinomial": "randomised-response table: Dirichlet cell probabilities, "
                             "multinomial true table",
}
SPREAD_GRID = np.logspace(-3.0, 1.5, 400)  # candidate sigma_hat (release_spread)
PROFILE_DROP = 1.92  # chi2(1) 0.95 quantile / 2: the profile likelihood's 95% interval
NOISE_DRAWS = 64  # releases drawn where a mechanism's variance has no closed form
_TEMPLATE_ATTR = "_dpinfer_template"


# --- what the release says about each cell ---------------------------------------------------
def _released(release) -> np.ndarray:
    """One released value per true value (level 0 of a multi-level release), float64."""
    per_value = release.per_true_value()
    values = release.values if per_value is None else per_value[0]
    return np.asarray(values, dtype=np.float64)


def noise_variance(release) -> np.ndarray:
    """Var(release_i | x_i) per true value, at x = max(release, 0) (rounded for a discrete
    mechanism): ``mechanism.variance``, level 0 of a multi-level release, and for a mechanism
    conditioned on invariants its base mechanism's variance (conditioning on A e = 0 lowers the
    variance by about one part in the group's size, and computing it exactly costs a
    convolution per cell: the base variance overstates the noise a little and so errs towards
    the non-centred form). A mechanism whose ``variance`` has no closed form (the l2
    generalized Laplace) gets the sample variance of ``NOISE_DRAWS`` releases of its exact
    sampler at that x (a fixed seed: the choice is reproducible)."""
    mechanism = release.mechanism
    values = _released(release)
    plug = np.maximum(values, 0.0)
    if mechanism.discrete:
        plug = np.rint(plug).astype(np.int64)
    if isinstance(mechanism, MultiLevelGeometric):
        variance = np.asarray(mechanism.variance(plug), dtype=np.float64)[..., 0]
    elif getattr(mechanism, "base", None) is not None:
        variance = mechanism.base.variance(plug)
    else:
        try:
            variance = mechanism.variance(plug)
        except (ValueError, NotImplementedError):  # no closed form: the exact sampler's spread
            rng = np.random.default_rng(0)
            draws = np.stack([mechanism.release(plug, rng) for _ in range(NOISE_DRAWS)])
            variance = np.var(draws.astype(np.float64), axis=0, ddof=1)
    return np.broadcast_to(np.asarray(variance, dtype=np.float64), values.shape).copy()


def cell_information(count_variance, noise_var) -> np.ndarray:
    """Fisher information I = V^2 / (V + v) of a release about a cell's linear predictor, for a
    canonical link (d mean / d eta = V, the count's variance) and noise variance v (module
    docstring): V when the noise is negligible, V^2 / v when it dominates; 0 where V = 0."""
    count_variance = np.asarray(count_variance, dtype=np.float64)
    total = count_variance + np.asarray(noise_var, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count_variance > 0, count_variance**2 / np.where(total > 0, total, 1.0), 0.0)


@dataclasses.dataclass(frozen=True)
class Spread:
    """The release's spread of the linear predictors (:func:`release_spread`): the estimate
    sigma_hat and its 95% profile-likelihood interval."""

    estimate: float
    low: float
    high: float


def release_spread(y, w, design=None, grid=SPREAD_GRID) -> Spread:
    """The spread of linear predictors estimated by y_i with known variances w_i,
    y ~ N(X beta, diag(sigma^2 + w)), by restricted maximum likelihood over ``grid``:

        l_R(sigma) = -1/2 [sum_i log(sigma^2 + w_i) + log det(X' W X) + r' W r],

    W = diag(1 / (sigma^2 + w_i)), r = y - X beta_hat(sigma) the generalised least-squares
    residuals (X = a column of ones by default). The interval holds the grid values with
    l_R >= max l_R - 1.92 (half the 0.95 quantile of chi-square with 1 degree of freedom).
    With no spread beyond what the w_i explain, the estimate is the grid's smallest value
    (10^-3)."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    design = np.ones((y.size, 1)) if design is None else np.asarray(design, dtype=np.float64)
    values = np.full(len(grid), -np.inf)
    for k, sigma in enumerate(grid):
        weight = 1.0 / (sigma**2 + w)
        gram = design.T @ (weight[:, None] * design)
        sign, logdet = np.linalg.slogdet(gram)
        if sign <= 0:
            continue
        resid = y - design @ np.linalg.solve(gram, design.T @ (weight * y))
        values[k] = -0.5 * (np.sum(np.log(sigma**2 + w)) + logdet + np.sum(weight * resid**2))
    if not np.isfinite(values).any():
        raise ValueError(f"the release's {y.size} cells cannot estimate the {design.shape[1]} "
                         "fixed effects of the template")
    if y.size <= design.shape[1]:  # nothing left to estimate a spread from
        return Spread(float(grid[0]), float(grid[0]), float(grid[-1]))
    best = int(np.argmax(values))
    inside = np.flatnonzero(values >= values[best] - PROFILE_DROP)
    return Spread(float(grid[best]), float(grid[inside[0]]), float(grid[inside[-1]]))


@dataclasses.dataclass(frozen=True)
class Parameterisation:
    """Per cell (flattened, C order): the information I_i about its linear predictor
    (``basis``: of the count, or of the release) and whether the cell is centred,
    I_i sigma_low sigma_high > 1 (module docstring); the range (sigma_low, sigma_high) of the
    spread, where it comes from (``source``), and the release's :class:`Spread` (which also sets
    the prior's scale)."""

    information: np.ndarray
    range: tuple
    source: str
    fit: Spread
    basis: str
    centred: np.ndarray

    def as_dict(self) -> dict:
        low, high = self.range
        ratio = self.information * low * high
        return {"rule": "centred where I_i sigma_low sigma_high > 1 (I_i the information of the "
                        f"{self.basis} about cell i's linear predictor)",
                "sigma_range": [float(f"{low:.4g}"), float(f"{high:.4g}")],
                "sigma_range_from": self.source,
                "sigma_hat": float(f"{self.fit.estimate:.4g}"),
                "sigma_hat_95": [float(f"{self.fit.low:.4g}"), float(f"{self.fit.high:.4g}")],
                "cells": int(self.centred.size), "centred": int(self.centred.sum()),
                "non-centred": int(self.centred.size - self.centred.sum()),
                "I sigma_low sigma_high range": [float(f"{ratio.min():.3g}"),
                                                 float(f"{ratio.max():.3g}")]}

    def describe(self) -> str:
        n, c = self.centred.size, int(self.centred.sum())
        low, high = self.range
        return (f"{c} of {n} cells centred, {n - c} non-centred (centred where the {self.basis}'s "
                f"information about the cell times sigma_low sigma_high exceeds 1, sigma from "
                f"{low:.3g} to {high:.3g}: {self.source})")


BASES = ("counts", "release")
RELEASE_RANGE = "the release's 95% interval for the spread"


def _check_range(spread) -> tuple[float, float, str]:
    """(sigma_low, sigma_high, where from) of a ``spread`` argument: a pair, or a pair and a
    sentence saying where it comes from."""
    items = list(spread) if isinstance(spread, (tuple, list)) else None
    source = "given"
    if items is not None and len(items) == 3 and isinstance(items[2], str):
        source = items.pop()
    try:
        low, high = (float(v) for v in items)
    except (TypeError, ValueError):
        raise ValueError("spread must be a pair (sigma_low, sigma_high), optionally with a third "
                         f"item saying where it comes from; got {spread!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
        raise ValueError(f"spread must be a pair 0 < sigma_low <= sigma_high, finite; got {spread!r}")
    return low, high, source


def _choose(count_variance, y, w, design, spread, basis: str, noise) -> Parameterisation:
    """The shared steps of :func:`poisson_parameterisation` and
    :func:`binomial_parameterisation`: the release's spread, the range (its 95% interval unless
    ``spread`` is given) and I_i = V_i (``basis="counts"``, counts drawn) or V_i^2 / (V_i + v_i)
    (``"release"``, counts summed out)."""
    if not isinstance(basis, str) or basis not in BASES:
        raise ValueError(f"information must be one of {BASES}, got {basis!r}")
    fit = release_spread(y, w, design)
    if spread is None:
        low, high, source = fit.low, fit.high, RELEASE_RANGE
    else:
        low, high, source = _check_range(spread)
    information = count_variance if basis == "counts" else cell_information(count_variance, noise)
    return Parameterisation(information, (low, high), source, fit,
                            "count" if basis == "counts" else "release",
                            information * low * high > 1.0)


def poisson_parameterisation(release, exposure=None, design=None, spread=None,
                             information: str = "counts") -> Parameterisation:
    """The per-cell choice (module docstring) for Poisson counts with rates e_i exp(eta_i):
    V_i = lambda_i = max(s_i, 0); y_i = log(max(s_i, 1/2) / e_i) with variance
    w_i = (V_i + v_i) / V_i^2 at V_i = max(s_i, 1/2)."""
    values = _released(release).reshape(-1)
    noise = noise_variance(release).reshape(-1)
    e = np.ones_like(values) if exposure is None else np.asarray(exposure, dtype=np.float64).reshape(-1)
    floored = np.maximum(values, 0.5)
    return _choose(np.maximum(values, 0.0), np.log(floored / e),
                   1.0 / cell_information(floored, noise), design, spread, information, noise)


def binomial_parameterisation(release, trials, spread=None,
                              information: str = "counts") -> Parameterisation:
    """The per-cell choice (module docstring) for binomial counts out of N_i with logit link:
    V_i = N_i p_i (1 - p_i) at p_i = min(max(s_i, 0) / N_i, 1); y_i = logit(q_i),
    q_i = min(max(s_i, 1/2), N_i - 1/2) / N_i, with variance w_i = (V + v_i) / V^2 at
    V = N_i q_i (1 - q_i)."""
    values = _released(release).reshape(-1)
    noise = noise_variance(release).reshape(-1)
    n = np.asarray(trials, dtype=np.float64).reshape(-1)
    p = np.minimum(np.maximum(values, 0.0) / n, 1.0)
    q = np.clip(np.minimum(np.maximum(values, 0.5), np.maximum(n - 0.5, 0.5)) / n, 1e-9, 1 - 1e-9)
    return _choose(n * p * (1.0 - p), np.log(q / (1.0 - q)),
                   1.0 / cell_information(n * q * (1.0 - q), noise), None, spread, information,
                   noise)


def hierarchical_effect(name: str, loc, scale, parameterisation: Parameterisation, shape):
    """eta ~ N(loc, scale) per cell, centred where ``parameterisation.centred`` and
    loc + scale z (z ~ N(0, 1), the free variable ``z``) elsewhere, as one tensor of ``shape``
    named ``name``: the free variable itself where every cell is centred, else a Deterministic
    combining ``<name>_centred`` (the centred cells, in cell order) and the non-centred cells.
    ``loc`` is a scalar or has one entry per cell."""
    centred = parameterisation.centred
    n = centred.size
    loc_flat = pt.as_tensor_variable(loc)
    per_cell = loc_flat.ndim > 0
    if per_cell:
        loc_flat = loc_flat.flatten()
    inside, outside = np.flatnonzero(centred), np.flatnonzero(~centred)
    if inside.size == n:
        return pm.Normal(name, loc_flat.reshape(shape) if per_cell else loc_flat, scale, shape=shape)
    parts = []
    if inside.size:
        parts.append(pm.Normal(f"{name}_centred", loc_flat[inside] if per_cell else loc_flat,
                               scale, shape=inside.size))
    z = pm.Normal("z", 0.0, 1.0, shape=outside.size)
    parts.append((loc_flat[outside] if per_cell else loc_flat) + scale * z)
    if inside.size:
        order = np.concatenate([inside, outside])
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        combined = pt.concatenate(parts)[inverse]
    else:
        combined = parts[0]
    return pm.Deterministic(name, combined.reshape(shape))


def template_report(model) -> dict | None:
    """What a template recorded on its model: its name, the exposure it used and the
    parameterisation it chose (None for a user's model)."""
    return getattr(model, _TEMPLATE_ATTR, None)


def _record(model, name: str, exposure, parameterisation: Parameterisation | None,
            scale: str | None = None) -> None:
    setattr(model, _TEMPLATE_ATTR, {
        "template": name, "exposure": exposure is not None,
        **({"parameterisation": parameterisation.as_dict(),
            "parameterisation_text": parameterisation.describe(),
            "scale_variable": scale, "range": list(parameterisation.range),
            "centred_cells": np.flatnonzero(parameterisation.centred).tolist(),
            "centred": int(parameterisation.centred.sum())} if parameterisation else {})})


# --- the templates -----------------------------------------------------------------------------
def _exposure_for(release, exposure, shape, template: str):
    """The exposure (one value per row of the values file) broadcast to the true counts' shape
    (a two-way table's row exposure applies to each cell of the row), or None."""
    if exposure is None:
        return None
    e = np.asarray(exposure, dtype=np.float64)
    if e.shape == tuple(shape):
        out = e
    elif len(shape) == 2 and e.shape == (shape[0],):
        out = np.broadcast_to(e[:, None], shape)
    else:
        raise ValueError(f"model {template!r}: the exposure has {e.size} values (one per row of "
                         f"the values file), but the true counts have shape {tuple(shape)}")
    if not np.all(np.isfinite(out)) or np.any(out <= 0):
        raise ValueError(f"model {template!r}: every exposure must be positive and finite")
    return np.ascontiguousarray(out)


def _centre(release, exposure) -> float:
    """log of the release's mean per unit of mean exposure, the mean floored at 0.5 count per cell."""
    mean = max(float(np.mean(_released(release))), 0.5)
    return float(np.log(mean / (np.mean(exposure) if exposure is not None else 1.0)))


def _spread_prior(parameterisation: Parameterisation) -> float:
    return max(1.0, 2.0 * parameterisation.fit.estimate)


def _not_a_table(release, name: str) -> None:
    if isinstance(release.mechanism, RandomizedResponse):
        raise ValueError(f"model {name!r} is for noisy counts; a randomised-response release is a "
                         "table of reports: use --model dirichlet-multinomial")


def poisson_hierarchical(release, exposure=None, *, spread=None, information="counts"):
    """x_i ~ Poisson(e_i exp(log_rate_i)), log_rate_i ~ N(mu, sigma), centred per cell where the
    release is informative (module docstring)."""
    _not_a_table(release, "poisson-hierarchical")
    shape = release.true_shape
    e = _exposure_for(release, exposure, shape, "poisson-hierarchical")
    choice = poisson_parameterisation(release, e, spread=spread, information=information)
    with pm.Model() as model:
        mu = pm.Normal("mu", _centre(release, e), 2.0)
        sigma = pm.HalfNormal("sigma", _spread_prior(choice))
        log_rate = hierarchical_effect("log_rate", mu, sigma, choice, shape)
        rate = pm.math.exp(log_rate) if e is None else e * pm.math.exp(log_rate)
        counts = pm.Poisson("counts", rate, shape=shape)
        release.observe(counts)
    _record(model, "poisson-hierarchical", e, choice, "sigma")
    return model, "counts"


def binomial_hierarchical(release, exposure=None, *, spread=None, information="counts"):
    """x_i ~ Binomial(N_i, logistic(logit_p_i)), logit_p_i ~ N(mu, sigma), centred per cell
    where the release is informative (module docstring)."""
    _not_a_table(release, "binomial-hierarchical")
    shape = release.true_shape
    if exposure is None:
        mechanism = release.mechanism
        if not isinstance(mechanism, (TruncatedLaplace, BITLaplace, ClampedGeometric)) or mechanism.upper is None:
            raise ValueError("model 'binomial-hierarchical' needs the number of trials: an "
                             "--exposure column, or a mechanism with a public upper bound "
                             "(TruncatedLaplace, BITLaplace, ClampedGeometric)")
        trials = np.full(shape, float(mechanism.upper))
        if np.any(trials <= 0):
            raise ValueError("model 'binomial-hierarchical': the mechanism's upper bound must be "
                             f"a positive number of trials, got {mechanism.upper!r}")
    else:
        trials = _exposure_for(release, exposure, shape, "binomial-hierarchical")
    if np.any(trials != np.rint(trials)):
        raise ValueError("model 'binomial-hierarchical': the numbers of trials must be whole "
                         "numbers > 0")
    choice = binomial_parameterisation(release, trials, spread, information)
    share = np.clip(float(np.mean(_released(release))) / max(float(np.mean(trials)), 1.0), 0.01, 0.99)
    with pm.Model() as model:
        mu = pm.Normal("mu", float(np.log(share / (1 - share))), 2.0)
        sigma = pm.HalfNormal("sigma", _spread_prior(choice))
        logit_p = hierarchical_effect("logit_p", mu, sigma, choice, shape)
        counts = pm.Binomial("counts", trials.astype(np.int64), pm.math.sigmoid(logit_p), shape=shape)
        release.observe(counts)
    _record(model, "binomial-hierarchical", exposure, choice, "sigma")
    return model, "counts"


def loglinear(release, exposure=None, *, spread=None, information="counts"):
    """x_ij ~ Poisson(e_i exp(log_rate_ij)), log_rate_ij ~ N(a + r_i + c_j, tau), centred per
    cell where the release is informative about the cell's interaction (module docstring; the
    spread tau_hat is estimated around the row and column effects)."""
    _not_a_table(release, "loglinear")
    shape = release.true_shape
    if len(shape) != 2:
        raise ValueError(f"model 'loglinear' needs a two-way table; the release has shape {shape}")
    e = _exposure_for(release, exposure, shape, "loglinear")
    rows, cols = shape
    design = np.concatenate([np.ones((rows * cols, 1)),
                             np.kron(np.eye(rows), np.ones((cols, 1)))[:, 1:],
                             np.kron(np.ones((rows, 1)), np.eye(cols))[:, 1:]], axis=1)
    choice = poisson_parameterisation(release, e, design, spread, information)
    with pm.Model() as model:
        a = pm.Normal("a", _centre(release, e), 1.0)
        r = pm.Normal("r", 0.0, 1.0, shape=rows)
        c = pm.Normal("c", 0.0, 1.0, shape=cols)
        tau = pm.HalfNormal("tau", _spread_prior(choice))
        loc = a + r[:, None] + c[None, :]
        log_rate = hierarchical_effect("log_rate", loc, tau, choice, shape)
        rate = pm.math.exp(log_rate) if e is None else e * pm.math.exp(log_rate)
        counts = pm.Poisson("counts", rate, shape=shape)
        release.observe(counts)
    _record(model, "loglinear", e, choice, "tau")
    return model, "counts"


def dirichlet_multinomial(release, exposure=None, *, spread=None, information="counts"):
    """p ~ Dirichlet(1, ..., 1), the true table ~ Multinomial(n, p) (no hierarchy to
    parameterise; ``dp.sample`` sums the table out)."""
    if not isinstance(release.mechanism, RandomizedResponse):
        raise ValueError("model 'dirichlet-multinomial' is for randomised-response releases; "
                         f"this release is from {type(release.mechanism).__name__}")
    if exposure is not None:
        raise ValueError("model 'dirichlet-multinomial' takes no exposure (use --exposure none)")
    values = np.asarray(release.values)
    with pm.Model() as model:
        p = pm.Dirichlet("p", np.ones(values.size))
        table = pm.Multinomial("counts", n=int(values.sum()), p=p)
        release.observe(table)
    _record(model, "dirichlet-multinomial", None, None)
    return model, "counts"


def auto(release, exposure=None, *, spread=None, information="counts"):
    if isinstance(release.mechanism, RandomizedResponse):
        return dirichlet_multinomial(release, exposure)
    if isinstance(release.mechanism, TruncatedLaplace):
        return binomial_hierarchical(release, exposure, spread=spread, information=information)
    return poisson_hierarchical(release, exposure, spread=spread, information=information)


_BUILDERS = {"auto": auto, "poisson-hierarchical": poisson_hierarchical,
             "binomial-hierarchical": binomial_hierarchical, "loglinear": loglinear,
             "dirichlet-multinomial": dirichlet_multinomial}


def build(model: str, release, exposure=None, *, spread=None, information="counts"):
    """(model, latent name) from a template name or a user's model file (module docstring).
    ``spread`` (the sigma of a hierarchical template's rule; default the release's estimate)
    and ``information`` (``"counts"``: the counts' information, right when ``dp.sample`` draws
    the counts; ``"release"``: the release's, right when it sums them out) set the per-cell
    choice of centred cells; a user's model file takes neither."""
    if model in _BUILDERS:
        return _BUILDERS[model](release, exposure, spread=spread, information=information)
    path = Path(model)
    if path.suffix != ".py":
        raise ValueError(f"--model must be one of {sorted(TEMPLATES)} or a Python file defining "
                         f"build_model(release); got {model!r}")
    if not path.is_file():
        raise FileNotFoundError(f"--model: no such file {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"dpinfer_user_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    builder = getattr(module, "build_model", None)
    if builder is None:
        raise ValueError(f"--model {str(path)!r} defines no build_model(release) function")
    result = builder(release)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], pm.Model)
            and isinstance(result[1], str)):
        raise TypeError(f"{str(path)!r}: build_model(release) must return (pm.Model, latent name)")
    if result[1] not in result[0].named_vars:
        raise ValueError(f"{str(path)!r}: the model has no variable {result[1]!r}")
    return result
