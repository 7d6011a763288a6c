"""Releases of record-additive statistics of latent records: exact data augmentation, or the law
of the sum.

A release s = T + noise of T = sum_i t(r_i) over n latent records (``dpinfer.regression_statistic``
or ``dpinfer.power_sums`` of records, clamped with ``dpinfer.clamp`` or not) can be fitted two ways:

* **data augmentation** (exact at any n): NUTS samples the n latent records with the
  parameters, the release's likelihood given them exact (Ju et al. 2022). Each gradient costs
  O(n) and, measured (issue 39), the trajectories lengthen with n: about n^1.7 in all.
* **the law of the sum** (an approximation whose cost does not grow with n): the records are
  replaced by T itself, T ~ MvNormal(n E[t], n Cov[t]) given the parameters, with the two
  moments exact (:mod:`dpinfer.distributions.sum_of_records`); Gaussian noise then leaves
  s ~ MvNormal(n E[t], n Cov[t] + tau^2 I); Laplace noise, a scale mixture of normals
  (e ~ N(0, v), v ~ Exponential with mean 2 b^2), leaves s ~ MvNormal(n E[t], n Cov[t] + diag v)
  given d variances v that NUTS samples with the parameters (d the statistic's length; T is
  summed out, not drawn: :attr:`SummedRecords.noise`), or, where the noise dominates the sum's
  spread on every coordinate, T non-centred with the release Laplace given it (:attr:`SummedRecords.non_centred`);
  any other noise keeps T as a
  latent of d values that NUTS samples with the parameters. NUTS starts around the mode
  (:mod:`dpinfer.inference.engines.compiled.mode_start`), T held at the release where it is a
  latent: at 10^6 records PyMC's default start is thousands of posterior sds away. The only
  error is the
  normal law's: T's skewness, about skew(t) / sqrt(n), which the report measures at the
  posterior mean (:func:`measured_error`). Bernstein & Sheldon (NeurIPS 2018, 2019) fit
  private exponential families and linear regression this way.

The law of the sum applies where the records are those of
:class:`~dpinfer.distributions.sum_of_records.NormalRecords`, written as PyMC variables:
free ``pm.Normal`` covariates x (n x p, mean and sd the same for every record) whose clamps
do not bind (checked on prior draws of their parameters: sqrt(n) P(beyond a bound) < 1e-3, so
that the bias of ignoring them, n P times the overshoot, is below a thousandth of T's sd of
sqrt(n) per unit of overshoot; x ~ N(0, 1) clamped at +-5 passes up to n = 3 10^6), a free
``pm.Normal`` response y (n) with mean affine in its record's covariates with coefficients
shared by every record (checked by substitution) and sd the same for every record, and no
other variable of the model depending on x or y. Anything else is fitted by data
augmentation, and the report says why.

``records="auto"`` takes the law of the sum from ``CROSSOVER_RECORDS`` records, where its
predicted error allows (:attr:`SummedRecords.predicted_error`): measured side by side
(``benchmarks/bench_record_crossover.py``, dp.sample's defaults, a compiled structure), the
law's effective draws per second of the parameters were 1.5-1.8 times data augmentation's on
a regression from 10 to 300 records (0.9 at 100; 5-7 times before the regression statistic of
latent records was built entry by entry) and 24 times at 1,000, but half of it on a clamped
mean and variance up to 100 records (the law's fixed cost of a second or two a fit against
data augmentation's fraction of a second) and 3.3 times at 300; its quantiles agree with data augmentation's within Monte Carlo
error at 100, 300 and 1,000 records wherever data augmentation gave a usable reference
(``validation/results/record_sums_vs_augmentation*.md``). Above
the crossover no latent records are sampled, so data augmentation's mirror trap cannot arise
(a chain with the slope's sign reversed, which its records can leave only all together:
issue 39).
``"law-of-the-sum"`` or ``"data-augmentation"`` force either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.model.fgraph import model_free_rv, model_observed_rv
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors, toposort
from pytensor.tensor.random.basic import NormalRV
from scipy import stats

from dpinfer._graphs import evaluate, shape_of
from dpinfer.distributions.sum_of_records import (
    Clamp,
    NormalRecords,
    power_sum_terms,
    regression_terms,
    simulate_terms,
)
from dpinfer.mechanisms.gaussian import Gaussian
from dpinfer.mechanisms.laplace import Laplace

RECORD_METHODS = ("auto", "law-of-the-sum", "data-augmentation")
CROSSOVER_RECORDS = 300  # records='auto' takes the law of the sum from here (module docstring)
BINDING = 1e-3  # a covariate's clamp binds if sqrt(n) P(beyond a bound) reaches this on a prior draw
PRIOR_DRAWS = 200
GRAPH_FIELDS = ("mu_x", "sigma_x", "a", "b", "sigma")  # NormalRecords' fields that are graphs of the parameters
SIMULATED_RECORDS = 200_000
SPREAD_DRAWS, SPREAD_RECORDS = 100, 2000  # prior draws, and records each, searched for the planning point
POINT_RECORDS = 50_000  # records simulated at the planning point for its moments
CHUNK_RECORDS = 20_000  # records simulated at a time for those moments
EDGEWORTH = (stats.norm.ppf(0.95) ** 2 - 1) / 6  # a 5% or 95% quantile's shift per unit of skewness, in sds
ERROR_TOLERANCE = 0.02  # predicted error of the normal law, in sds of the release, that records='auto' accepts
CHECK_MODE = "FAST_COMPILE"  # the planner's one-off prior draws: no numba compilation


class NotASumError(ValueError):
    """The release is not one the law of the sum can take (the message says why)."""


@dataclass(frozen=True)
class SummedRecords:
    """A release of a record-additive statistic fitted by the law of the sum (module
    docstring). ``parameters``: the records' model (NormalRecords' symbolic fields, as graphs
    of the model's variables); ``removed``: the latent records' variables."""

    record: object
    kind: str
    n: int
    terms: list
    parameters: dict
    removed: tuple
    non_centred: bool = False
    predicted_error: float = 0.0
    draws_latent = False  # n records are not drawn: T (a latent of the rewritten model) stands for them

    @property
    def latent_name(self) -> str:
        """The true statistic T: a free latent of the rewritten model with ``noise ==
        "latent"``, summed out otherwise."""
        return f"{self.record.name}_true_statistic"

    @property
    def variance_name(self) -> str:
        """The standard normal w behind the Laplace noise's variances v (``noise ==
        "laplace-mixture"``)."""
        return f"{self.record.name}_noise_variance_z"

    @property
    def standardised_name(self) -> str:
        """The standard normals z of T = n E[t] + L z (:attr:`non_centred`)."""
        return f"{self.record.name}_true_statistic_z"

    @property
    def noise(self) -> str:
        """How the release's noise is fitted: ``"gaussian"`` (T summed out: the release ~
        MvNormal(n E[t], n Cov[t] + tau^2 I)), ``"laplace-mixture"`` (Laplace noise as a scale
        mixture of normals, e ~ N(0, v), v ~ Exponential(mean 2 b^2) each coordinate (Andrews &
        Mallows 1974; Bernstein & Sheldon 2019 use it for the same sums): T summed out given v,
        the release ~ MvNormal(n E[t], n Cov[t] + diag v), T not drawn; v = -2 b^2 log(1 -
        Phi(w)) with w ~ N(0, 1), the exponential's quantile of a standard normal, so that where
        the release hardly informs v (many records: n Cov[t] >> 2 b^2) NUTS samples standard
        normals) or ``"latent"`` (any other noise: T a free latent sampled by NUTS)."""
        mechanism = self.record.mechanism
        if isinstance(mechanism, Gaussian):
            return "gaussian"
        return "laplace-mixture" if type(mechanism) is Laplace else "latent"

    @property
    def keeps_statistic(self) -> bool:
        """Whether T is a free latent of the rewritten model."""
        return self.noise == "latent"

    @property
    def nuisance_names(self) -> list:
        """The rewritten model's latents standing for the records, judged with the latents by
        the convergence verdict."""
        if self.noise == "laplace-mixture":
            return [self.standardised_name if self.non_centred else self.variance_name]
        return {"gaussian": [], "latent": [self.latent_name]}[self.noise]

    @property
    def method(self) -> str:
        noise = {"gaussian": "Gaussian noise: the release ~ MvNormal(n E[t], n Cov[t] + tau^2 I)",
                 "latent": f"the true statistic {self.latent_name!r} sampled by NUTS with the parameters",
                 "laplace-mixture": ("Laplace noise as a scale mixture of normals, variances v ~ Exponential(mean "
                                     f"2 b^2) (v = -2 b^2 log(1 - Phi(w)), w = {self.variance_name!r} ~ N(0, I)): "
                                     "the release ~ MvNormal(n E[t], n Cov[t] + diag v); the true statistic is "
                                     "summed out, not drawn")}[self.noise]
        if self.noise == "laplace-mixture" and self.non_centred:
            noise = (f"Laplace noise whose variance 2 b^2 exceeds the sum's on every coordinate (at the planning "
                     f"point): T non-centred, T = n E[t] + L z with z = {self.standardised_name!r} ~ N(0, I) (L the "
                     "Cholesky factor of n Cov[t]), the release Laplace given T")
        return (f"law of the sum: the {self.n:,} latent records {list(self.removed)} replaced by their "
                f"{self.kind} T ~ MvNormal(n E[t], n Cov[t]) given the parameters, exact moments in closed form "
                f"(a normal approximation to T's law; {noise}); the records are not drawn")

    def _graphs(self) -> list:
        return [self.parameters[k] for k in GRAPH_FIELDS]

    def records_model(self, replace: dict | None = None) -> NormalRecords:
        fields = dict(self.parameters)
        if replace:
            for key in GRAPH_FIELDS:
                fields[key] = _substituted(fields[key], replace)
        return NormalRecords(**fields)

    def rewrite(self, fgraph, memo) -> None:
        """Replace the records by the law of their sum in ``fgraph`` (a model's, from
        ``fgraph_from_model``; ``memo`` maps the model's variables to it)."""
        graphs = self._graphs()
        upstream = set(ancestors(graphs))
        replace = {var: new for var, new in memo.items() if var in upstream}
        mean, cov = self.records_model(replace).moments(self.terms)
        n = np.float64(self.n)  # a float, so that the compile cache holds one function for every n
        mean, cov = n * mean, n * cov
        # keeps the Cholesky factor defined: 1e-10 of each n E[t_j^2], the scale of the rounding
        # in n (E[t t'] - E[t] E[t]') (a response clamped at one bound has Var[c^2] ~ 0 from ~1e-16 E[c^4])
        cov = cov + pt.eye(len(self.terms)) * (1e-10 * (pt.diagonal(cov) + mean**2 / n))
        # static shapes: without them PyMC infers the law's shape by rewriting the moments' graph
        # (0.3 s a fit at p = 10)
        d = len(self.terms)
        mean, cov = pt.specify_shape(mean, (d,)), pt.specify_shape(cov, (d, d))
        release_var = memo[self.record.release_rv]
        _, release_data = release_var.owner.inputs
        op = release_var.owner.op
        mechanism = self.record.mechanism
        if self.noise == "latent":
            statistic_rv = pm.MvNormal.dist(mean, cov)
            value = statistic_rv.type(name=self.latent_name)
            statistic = model_free_rv(statistic_rv, value, None, self.latent_name)
            new_release = model_observed_rv(mechanism.dist(statistic), release_data, op.name, *op.dims)
            fgraph.add_output(statistic, import_missing=True)
        elif self.noise == "gaussian":
            noise = np.float64(mechanism.sigma) ** 2
            new_release = model_observed_rv(pm.MvNormal.dist(mean, cov + noise * pt.eye(d)),
                                            release_data, op.name, *op.dims)
        elif self.non_centred:  # T = n E[t] + L z, the release Laplace given T
            z = self._free(pm.Normal.dist(0.0, 1.0, shape=(d,)), self.standardised_name)
            statistic = mean + pt.dot(pt.linalg.cholesky(cov), z)
            new_release = model_observed_rv(mechanism.dist(statistic), release_data, op.name, *op.dims)
        else:
            w = self._free(pm.Normal.dist(0.0, 1.0, shape=(d,)), self.variance_name)
            variance = -2.0 * np.float64(mechanism.scale) ** 2 * _log_normal_sf(w)
            new_release = model_observed_rv(pm.MvNormal.dist(mean, cov + pt.diag(variance)), release_data,
                                            op.name, *op.dims)
        fgraph.replace(release_var, new_release, import_missing=True)
        for var in self.removed:
            fgraph.remove_output(fgraph.outputs.index(memo[var]))

    @staticmethod
    def _free(rv, name: str):
        """A free variable ``name`` of law ``rv`` (untransformed) for a model's graph."""
        return model_free_rv(rv, rv.type(name=name), None, name)

    def numeric_parameters(self, posterior) -> dict:
        """The records' model at the posterior mean of the variables it depends on."""
        graphs = self._graphs()
        free = [v for v in ancestors(graphs) if getattr(v, "name", None) in posterior and v.owner is not None]
        replace = {v: pt.constant(np.asarray(posterior[v.name].mean(("chain", "draw")), dtype=v.type.dtype))
                   for v in free}
        values = [evaluate(clone_replace(pt.as_tensor(g, dtype="float64"), replace)) for g in graphs]
        out = dict(zip(GRAPH_FIELDS, values))
        p = len(self.parameters["alpha_x"])
        for key in ("mu_x", "sigma_x", "b"):
            out[key] = np.broadcast_to(out[key], (p,)).astype(float)
        return out | {k: self.parameters[k] for k in ("clamp", "alpha_x", "gamma_x")}

    def measured_error(self, posterior, rng: np.random.Generator) -> dict:
        """The normal law's error at the posterior mean: each coordinate's skewness of T,
        skew(t) / sqrt(n) with skew(t) from ``SIMULATED_RECORDS`` records drawn from the
        records' model, and the error it makes in T's 5% and 95% quantiles by the first
        Edgeworth correction, |skew| (z^2 - 1) / 6 = 0.284 |skew| sd of T; and the same for the
        release T + noise (the noise's variance diluting the skewness: what the parameters
        see, :func:`_at_planning_point`), beside its prediction before the fit."""
        variance, third = _simulated_cumulants(self.numeric_parameters(posterior), self.terms, SIMULATED_RECORDS, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            skew = third / variance**1.5 / np.sqrt(self.n)
        skew = np.where(np.isfinite(skew), skew, 0.0)
        release = _release_error(variance, third, self.n, float(np.max(self.record.mechanism.noise_variance)))
        worst = float(np.max(np.abs(skew)))
        return {"max_abs_skewness_of_sum": worst,
                "quantile_error_sd": worst * EDGEWORTH,
                "release_quantile_error_sd": release,
                "predicted_release_quantile_error_sd": self.predicted_error,
                "simulated_records": SIMULATED_RECORDS,
                "at": "posterior mean"}


def _log_normal_sf(w):
    """log(1 - Phi(w)) = log(erfc(x) / 2), x = w / sqrt(2), in float64 throughout (PyMC's
    ``normal_lccdf`` rounds sqrt(2) to float32: 1e-7 relative errors), through the scaled
    erfcx(x) = e^{x^2} erfc(x) from w = 1 on; each branch evaluated only where it is finite,
    so that the gradient of the branch not taken is not NaN."""
    x = w / np.sqrt(np.float64(2.0))
    split = np.float64(1.0) / np.sqrt(np.float64(2.0))
    near = pt.minimum(x, split)
    far = pt.maximum(x, split)
    return pt.switch(x > split, pt.log(pt.erfcx(far) / 2.0) - far**2, pt.log(pt.erfc(near) / 2.0))


def plan_record_sums(model, records, choice: str) -> tuple[list, dict]:
    """(the releases fitted by the law of the sum, {release name: why not} for the
    record-additive releases left to data augmentation) under ``choice`` (RECORD_METHODS).

    ``"auto"`` takes the law from ``CROSSOVER_RECORDS`` records (measured cost: module
    docstring), and only where its predicted error (:attr:`SummedRecords.predicted_error`) is
    at most ``ERROR_TOLERANCE``."""
    if not isinstance(choice, str) or choice not in RECORD_METHODS:
        raise ValueError(f"records must be one of {RECORD_METHODS}, got {choice!r}")
    summed, kept = [], {}
    for record in records:
        tag = getattr(getattr(record.latent, "tag", None), "dpinfer_record_statistic", None)
        if tag is None or choice == "data-augmentation":
            if tag is not None:
                kept[record.name] = "data augmentation (records='data-augmentation')"
            continue
        n = _record_count(tag)
        if choice == "auto" and n < CROSSOVER_RECORDS:  # decided before any check that compiles a graph
            kept[record.name] = (f"data augmentation: {n:,} records, below the {CROSSOVER_RECORDS:,} from which "
                                 "records='auto' takes the law of the sum")
            continue
        try:
            item = _summed_records(model, record, tag)
        except NotASumError as error:
            if choice == "law-of-the-sum":
                raise NotASumError(f"release {record.name!r}: records='law-of-the-sum' cannot take it: {error}") from None
            kept[record.name] = f"data augmentation: the law of the sum does not apply ({error})"
            continue
        if choice == "auto" and item.predicted_error > ERROR_TOLERANCE:
            kept[record.name] = (f"data augmentation: the normal law of the sum's predicted error "
                                 f"{item.predicted_error:.3f} sd of the release exceeds the {ERROR_TOLERANCE} that "
                                 "records='auto' accepts (few records for their skewness, and noise too small to "
                                 "hide it)")
            continue
        summed.append(item)
    return summed, kept


def _record_count(tag) -> int:
    """The number of records behind a tagged statistic (the response's length)."""
    return shape_of(_unclamped(tag[1] if tag[0] == "power_sums" else tag[2])[0])[0]


def _unclamped(value):
    """(the variable under a ``dpinfer.clamp``, its Clamp) or (value, no clamp)."""
    tag = getattr(value.tag, "dpinfer_clamp", None)
    if tag is None:
        return value, Clamp()
    inner, lower, upper, scale = tag
    return inner, Clamp(float(lower), float(upper), scale)


def _normal_records(model, var, what: str):
    if var not in model.free_RVs or not isinstance(var.owner.op, NormalRV):
        raise NotASumError(f"the {what} must be a free pm.Normal variable of the model (the statistic's "
                           "argument, clamped or not), and is not")
    mu, sigma = var.owner.op.dist_params(var.owner)
    return mu, sigma


def _per_record(param, var, name: str, columns: int | None):
    """``param`` of ``var`` as one value per column (or a scalar), refused if it varies by record."""
    ndim = param.type.ndim
    if ndim == var.type.ndim and not param.type.broadcastable[0]:
        if shape_of(param)[0] != 1:
            raise NotASumError(f"{var.name}'s {name} varies by record (records must be identically distributed)")
    if ndim == var.type.ndim:
        param = param[0]
    if columns is None:
        if param.type.ndim:
            raise NotASumError(f"{var.name}'s {name} must be one value for every record")
        return param
    return pt.broadcast_to(param, (columns,))


def _substituted(output, replace: dict):
    """``output`` with the variables ``replace`` maps replaced, each node on the way rebuilt
    (``make_node``) so that static shapes follow (a few records in place of n) and the
    replacements themselves are kept, not cloned (clone_replace does both otherwise)."""
    memo = dict(replace)
    for node in toposort([output], blockers=list(replace)):
        if any(o in replace for o in node.outputs):
            continue
        inputs = [memo.get(i, i) for i in node.inputs]
        if any(new is not old for new, old in zip(inputs, node.inputs)):
            memo.update(zip(node.outputs, node.op.make_node(*inputs).outputs))
    return memo.get(output, output)


def _affine(model, mean, design, p: int):
    """(a, b) with mean = a + design @ b for every record, checked by substitution at a prior
    draw; refused otherwise."""
    basis = np.vstack([np.zeros((1, p)), np.eye(p)])
    probe = np.random.default_rng(0).normal(size=(p + 3, p))
    try:
        at_basis = _substituted(mean, {design: pt.constant(basis)})
        at_probe = _substituted(mean, {design: pt.constant(probe)})
        a, b = at_basis[0], at_basis[1:] - at_basis[0]
        inputs = [v for v in model.free_RVs if v in set(ancestors([at_basis, at_probe]))]
        values = pm.draw(inputs, random_seed=1, mode=CHECK_MODE) if inputs else []
        replace = {v: pt.constant(val, dtype=v.type.dtype) for v, val in zip(inputs, values)}
        a_v, b_v, probe_v = (evaluate(clone_replace(g, replace)) for g in (a, b, at_probe))
        affine = probe_v.shape == (p + 3,) and np.allclose(probe_v, a_v + probe @ b_v, rtol=1e-9, atol=1e-9)
    except Exception:  # the mean's graph does not take other records: not per record
        affine = False
    if not affine:
        raise NotASumError("the response's mean must be an affine function of its own record's covariates, "
                           "a + x_i @ b with a and b shared by every record")
    return a, b


def _check_clamps_do_not_bind(mu_x, sigma_x, clamp: Clamp, design, n: int) -> None:
    if not clamp.binds:
        return
    mu, sigma = (np.atleast_2d(v) for v in pm.draw([mu_x, sigma_x], draws=PRIOR_DRAWS, random_seed=2, mode=CHECK_MODE))
    beyond = stats.norm.cdf((clamp.lower - mu) / sigma) + stats.norm.sf((clamp.upper - mu) / sigma)
    if np.sqrt(n) * np.max(beyond) >= BINDING:
        raise NotASumError(f"the covariates' clamp [{clamp.lower:g}, {clamp.upper:g}] binds: P(beyond a bound) up "
                           f"to {np.max(beyond):.2g} on prior draws of {design.name}'s mean and sd, and the law of the "
                           f"sum needs sqrt(n) P below {BINDING:g} (n = {n:,}); clamped covariates are fitted by data "
                           "augmentation")


def _only_children(model, record, removed) -> None:
    others = [v for v in model.basic_RVs + model.deterministics + model.potentials
              if v is not record.release_rv and v not in removed]
    for var in others:
        upstream = set(ancestors([var]))
        touched = [r.name for r in removed if r in upstream]
        if touched:
            raise NotASumError(f"{var.name} depends on the records {touched}; the law of the sum replaces them, so "
                               "they may only feed the release")


def _as_graphs(parameters: dict) -> dict:
    return {k: pt.cast(pt.as_tensor(v), "float64") if k in GRAPH_FIELDS else v
            for k, v in parameters.items()}


def _summed_records(model, record, tag) -> SummedRecords:
    kind = tag[0]
    if kind == "power_sums":
        _, values, degree = tag
        response, clamp = _unclamped(values)
        mu, sigma = _normal_records(model, response, "records")
        removed = (response,)
        _only_children(model, record, removed)
        parameters = dict(mu_x=np.zeros(0), sigma_x=np.ones(0), b=np.zeros(0),
                          a=_per_record(mu, response, "mean", None), sigma=_per_record(sigma, response, "sd", None),
                          alpha_x=np.zeros(0), gamma_x=np.zeros(0), clamp=clamp)
        return _at_planning_point(SummedRecords(record, "power sums", shape_of(response)[0], power_sum_terms(degree),
                                          _as_graphs(parameters), removed), _release(model, record))
    _, design_values, response_values = tag
    design, design_clamp = _unclamped(design_values)
    response, clamp = _unclamped(response_values)
    mu_x, sigma_x = _normal_records(model, design, "covariates")
    mu_y, sigma_y = _normal_records(model, response, "response")
    removed = (design, response)
    _only_children(model, record, removed)
    n, p = shape_of(design)
    mu_x, sigma_x = (_per_record(v, design, name, p) for v, name in ((mu_x, "mean"), (sigma_x, "sd")))
    if set(ancestors([mu_x, sigma_x])) & {response}:
        raise NotASumError("the covariates' law depends on the response")
    a, b = _affine(model, mu_y, design, p)
    _check_clamps_do_not_bind(mu_x, sigma_x, design_clamp, design, n)
    parameters = dict(mu_x=mu_x, sigma_x=sigma_x, a=a, b=b, sigma=_per_record(sigma_y, response, "sd", None),
                      alpha_x=np.full(p, design_clamp.alpha), gamma_x=np.full(p, design_clamp.gamma), clamp=clamp)
    return _at_planning_point(SummedRecords(record, "regression statistic", n, regression_terms(p), _as_graphs(parameters),
                                      removed), _release(model, record))


def _simulated_cumulants(records: dict, terms: list, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(variance, third central moment) of each of one record's ``terms`` from ``size`` records
    simulated at ``records`` (:func:`~dpinfer.distributions.sum_of_records.simulate_terms`): the
    sample's own moments (divisor ``size``, as scipy.stats.skew's), from power sums about the
    first chunk's mean (within a few standard errors of the mean: no cancellation), so that
    ``CHUNK_RECORDS`` records at a time are held rather than all of them (at p = 10, 77 terms,
    200,000 records held 123 MB per temporary: the measured error's moments took 0.42-0.54 s,
    0.22-0.28 s in chunks)."""
    shift, sums = None, np.zeros((3, len(terms)))
    for start in range(0, size, CHUNK_RECORDS):
        block = simulate_terms(records, terms, min(CHUNK_RECORDS, size - start), rng)
        if shift is None:
            shift = block.mean(axis=0)
        block -= shift
        squared = block * block
        sums += (block.sum(axis=0), squared.sum(axis=0), (squared * block).sum(axis=0))
    m1, m2, m3 = sums / size
    return m2 - m1 * m1, m3 - 3.0 * m1 * m2 + 2.0 * m1**3


def _release_error(variance: np.ndarray, third: np.ndarray, n: int, noise: float) -> float:
    """The normal law's error in the release's 5% and 95% quantiles, in its sds, from one record's
    terms' ``variance`` and ``third`` central moment (:func:`_simulated_cumulants`) and the noise's
    variance: 0.284 max_j |n k3(t_j)| / (n Var[t_j] + noise)^1.5 (:func:`_at_planning_point`)."""
    skewness = np.abs(n * third) / (n * variance + noise) ** 1.5
    return float(np.max(EDGEWORTH * np.where(np.isfinite(skewness), skewness, 0.0)))


def _release(model, record) -> np.ndarray:
    """The release's values (the observed data), as a flat float array."""
    return np.asarray(evaluate(model.rvs_to_values[record.release_rv]), dtype=np.float64).reshape(-1)


def _at_planning_point(item: SummedRecords, release: np.ndarray) -> SummedRecords:
    """``item`` with what the planner reads at the *planning point*, the one of ``SPREAD_DRAWS``
    prior draws of the records' parameters that best explains the ``release`` (the largest sum
    over j of log N(s_j; n E[t_j], n Var[t_j] + noise variance), the moments from
    ``SPREAD_RECORDS`` records simulated at each draw; the prior alone can mislead: a wide prior
    on the coefficients clamps most responses, and c^2 then hardly varies), its moments from
    ``POINT_RECORDS`` records simulated there:

    * **the predicted error** of the normal law, in sds of the release: the release s_j = T_j +
      e_j has third cumulant n k3(t_j) (symmetric noise adds none), so its skewness is
      n k3(t_j) / (n Var[t_j] + noise variance)^(3/2), and the first Edgeworth term moves its 5%
      and 95% quantiles by 0.284 times that, in sds; the largest over j. As the release's law
      carries all the parameters learn, this bounds their posterior quantiles' shift in
      posterior sds to first order. Noise dilutes the sum's skewness: with 100 records of
      issue 39's regression at epsilon = 1 it is about 0.004; without noise, 0.28 skew(t_j) /
      sqrt(n).
    * **the parameterisation** (Laplace noise): T non-centred (:attr:`SummedRecords.non_centred`)
      where the noise's variance 2 b^2 exceeds n Var[t_j] on every coordinate j, the scale
      mixture of normals otherwise. The choice between centred and non-centred forms
      (Papaspiliopoulos, Roberts & Skold 2007, Statistical Science 22, 59-73): non-centred where
      the likelihood, here the noise, is weaker than the prior, here T's law given the
      parameters. Both give the same posterior. All coordinates one way, and the mixture as soon
      as the sum outweighs the noise on one coordinate, as measured on issue 39's regression
      (ratios n Var[t_j] / 2 b^2): at 100 records (every ratio under 0.3) the mixture's fits
      diverged or did not converge and the non-centred form's converged; at 1,000 (ratios
      0.03-2.2) both converged without a divergence, the mixture in 7 leapfrog steps a draw
      against 19; at 10^6 with p = 10 (ratios 0.13-9) the non-centred form needed 255 steps a
      draw (step size 0.014) against the mixture's 15 (0.24), at the same ESS per draw; at 10^6
      with p = 5 (ratios 1.1-77) the mixture converged in 3 fits of 3, the non-centred form
      with c^2 apart in 1 of 3 (a split with c^2 left to the mixture given the others had 37
      divergences in 4,000 transitions at 1,000 records)."""
    draws = pm.draw(item._graphs(), draws=SPREAD_DRAWS, random_seed=3, mode=CHECK_MODE)
    p = len(item.parameters["alpha_x"])
    rng = np.random.default_rng(3)
    noise = float(np.max(item.record.mechanism.noise_variance))
    best, point = -np.inf, None
    for k in range(SPREAD_DRAWS):
        records = {name: np.broadcast_to(values[k], (p,)) if name in ("mu_x", "sigma_x", "b") else values[k]
                   for name, values in zip(GRAPH_FIELDS, draws)}
        records |= {name: item.parameters[name] for name in ("clamp", "alpha_x", "gamma_x")}
        terms = simulate_terms(records, item.terms, SPREAD_RECORDS, rng)
        variance = item.n * terms.var(axis=0)
        fit = float(np.sum(stats.norm.logpdf(release, item.n * terms.mean(axis=0), np.sqrt(variance + noise))))
        if fit > best or point is None:
            best, point = fit, records
    variance, third = _simulated_cumulants(point, item.terms, POINT_RECORDS, rng)
    error = _release_error(variance, third, item.n, noise)
    variance = item.n * variance
    non_centred = item.noise == "laplace-mixture" and bool(np.all(variance < noise))
    return dataclasses.replace(item, non_centred=non_centred, predicted_error=error)
