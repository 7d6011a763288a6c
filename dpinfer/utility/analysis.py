"""Analyst tools on any :func:`dpinfer.sample` result (an ``xarray.DataTree``).

**LOO and model comparison.** ``dp.sample(..., log_likelihood=True)`` already stores, in the
``log_likelihood`` group, each release cell's *marginal* log-likelihood given the parameters,
log p(s_i | theta) = log sum_x p(x | theta) p(s_i | x), with the latent counts summed out over
windows proven to within ``tol`` (the model :func:`dpinfer.marginal_model` builds). So
``az.loo(idata)`` and ``az.compare({"a": idata_a, "b": idata_b})`` work on a dp.sample result
as they stand, with one LOO observation per release cell. :func:`with_log_likelihood` adds the
same group to a fit made without it. Two caveats:

* a release conditioned on totals (``dp.Conditioned``) is not cell-wise independent given the
  parameters: its group holds the whole release's log-likelihood spread evenly over the cells
  (only their sum is meaningful), so LOO by cells means nothing there (it shows as an elpd
  with SE 0); such a release is a single observation;
* in a model with a random effect per cell (the county model's z_i), each release cell is the
  only observation informing its own z_i, and PSIS-LOO's Pareto k are then often above 0.7
  (LOO is unreliable: the usual per-observation-random-effect problem, not a dpinfer one);
  models whose cells share their parameters (fixed effects, covariates) give good k.

**Posterior predictive checks of the releases.** :func:`posterior_predictive_releases`
re-releases, for every posterior draw, the true values through the *same* mechanism's sampler
(``mechanism.release``): by default the true counts of that draw (already in the posterior:
replicated noise on the same population), or with ``replicate="counts"`` fresh counts drawn
from the model given that draw's parameters (a new population: this also checks the count
model, e.g. an outlying cell that a per-cell random effect would otherwise absorb).
:func:`ppc_pvalues` gives per-cell posterior predictive p-values P(rep > obs) + P(rep = obs)/2
(mid-p).

**Derived quantities**, as posterior draws (``chain``, ``draw``, ...) that ``az.summary``
summarises: :func:`shares`, :func:`ratio`, :func:`ranks`, :func:`ranked_first` (whose
posterior mean is the probability that a cell ranks first), :func:`rank_probabilities` and
:func:`exceeds` (the indicator x >= t, whose posterior mean is P(x >= t)).

**Prior sensitivity** of small counts: :func:`prior_sensitivity` refits a model under several
priors and tabulates how the posterior of the counts moves.

Multiple imputation from the posterior draws of the counts (Rubin's rules) is in
:mod:`dpinfer.utility.imputation`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pymc as pm
import xarray as xr
from scipy import stats

from dpinfer._graphs import evaluate
from dpinfer.inference import marginal_model, sample
from dpinfer.inference.engines.closed_form import summed_out_model
from dpinfer.inference.planning import plan_model
from dpinfer.mechanisms.base import AdditiveMechanism
from dpinfer.mechanisms.records import closest_free_variables, releases_of

SAMPLE_DIMS = ("chain", "draw")
REPLICATES = ("release", "counts")


# --- access to a fit ------------------------------------------------------------------------
def posterior_dataset(idata) -> xr.Dataset:
    """The ``posterior`` group of a dp.sample result as an ``xarray.Dataset`` (a Dataset is
    returned as it is)."""
    if isinstance(idata, xr.Dataset):
        return idata
    if isinstance(idata, xr.DataTree):
        if "posterior" not in idata.children:
            raise ValueError(f"the DataTree has no posterior group (it has {sorted(idata.children)})")
        return idata["posterior"].to_dataset()
    raise TypeError(f"expected a dp.sample result (xarray.DataTree) or a Dataset, got {type(idata).__name__}")


def posterior_draws(idata, var_name: str) -> xr.DataArray:
    """The posterior draws (``chain``, ``draw``, ...) of ``var_name``."""
    post = posterior_dataset(idata)
    if var_name not in post:
        raise KeyError(f"the posterior has no variable {var_name!r}; it has {sorted(post.data_vars)}")
    draws = post[var_name]
    if tuple(draws.dims[:2]) != SAMPLE_DIMS:
        raise ValueError(f"{var_name!r} has dims {draws.dims}; expected ('chain', 'draw', ...)")
    return draws


def cell_dims(draws: xr.DataArray) -> list[str]:
    """The dimensions of a variable other than ``chain`` and ``draw``."""
    return [d for d in draws.dims if d not in SAMPLE_DIMS]


def _one_cell_dim(draws: xr.DataArray, dim) -> str:
    dims = cell_dims(draws)
    if dim is None:
        if len(dims) != 1:
            raise ValueError(f"{draws.name!r} has cell dimensions {dims}; pass dim= (one of them)")
        return dims[0]
    if dim not in dims:
        raise ValueError(f"dim must be one of {dims}, got {dim!r}")
    return dim


# --- 1. LOO -------------------------------------------------------------------------------------
def with_log_likelihood(idata, model=None, *, tol: float = 1e-10, progressbar: bool = False):
    """A copy of the dp.sample result ``idata`` of ``model`` with the ``log_likelihood`` group
    that ``dp.sample(..., log_likelihood=True)`` would have stored: per release cell, its
    log-likelihood given each posterior draw of the parameters with the latent counts summed
    out (windows with tail bound ``tol``; in models without latent counts, Normal latents
    and randomised-response tables summed out in closed form, as ``dp.sample`` does). Then ``az.loo`` and ``az.compare`` work on it. An existing group is recomputed.

    Counts that the PyMC engine samples by windowed Gibbs (they have other children) or fibre
    moves are not summed out: their releases' log-likelihoods are then conditional on the
    drawn counts (for fibre latents :func:`dpinfer.marginal_model` refuses)."""
    model = pm.modelcontext(model)
    out = idata.copy()
    if "log_likelihood" in out.children:
        del out["log_likelihood"]
    plan = plan_model(model, releases_of(model))
    if plan.summed and not plan.latents:  # as dp.sample sums them out
        fitted = summed_out_model(model, plan.summed)
    else:
        fitted = marginal_model(model, tol)
    with fitted:
        log_likelihood = pm.compute_log_likelihood(out, progressbar=progressbar, extend_inferencedata=False)
    if isinstance(log_likelihood, xr.DataTree):
        log_likelihood = log_likelihood["log_likelihood"].to_dataset()
    out["log_likelihood"] = log_likelihood
    return out


# --- 2. posterior predictive checks ---------------------------------------------------------
def posterior_predictive_releases(idata, model=None, rng=None, *, var_names=None,
                                  replicate: str = "release", thin: int = 1):
    """Replicated releases, one per posterior draw: a copy of ``idata`` with groups
    ``posterior_predictive`` (the replicated releases, named as the releases) and
    ``observed_data`` (the observed releases).

    Parameters
    ----------
    idata, model
        A dp.sample result and the model it was fitted to (the releases are read off the
        model: :func:`dpinfer.mechanisms.records.releases_of`).
    rng
        A numpy Generator or a seed.
    var_names
        Release names to replicate (default all).
    replicate
        ``"release"``: the true values of each posterior draw (in the posterior already)
        released again through the same mechanism's ``release``: new noise on the same
        population. ``"counts"``: the latent variables drawn afresh from the model given the
        draw's parameters (``pm.sample_posterior_predictive`` with the latents removed from
        the trace), then released: a new population, which also checks the count model. A
        latent's other observed children are ignored when it is redrawn.
    thin
        Use every ``thin``-th draw of each chain (conditioned mechanisms release one draw at a
        time, and their exact samplers are slow).
    """
    if not isinstance(replicate, str) or replicate not in REPLICATES:
        raise ValueError(f"replicate must be one of {REPLICATES}, got {replicate!r}")
    if int(thin) != thin or thin < 1:
        raise ValueError(f"thin must be a whole number >= 1, got {thin!r}")
    model = pm.modelcontext(model)
    rng = np.random.default_rng(rng)
    records = releases_of(model)
    if var_names is not None:
        names = [var_names] if isinstance(var_names, str) else list(var_names)
        unknown = sorted(set(names) - {r.name for r in records})
        if unknown:
            raise ValueError(f"no release named {unknown}; the model's releases are {[r.name for r in records]}")
        records = [r for r in records if r.name in names]
    if not records:
        raise ValueError("the model has no release registered with Mechanism.observe(...)")
    post = posterior_dataset(idata).isel(draw=slice(None, None, int(thin)))
    if replicate == "counts":
        post = _redraw_latents(model, records, post, rng)
    predictive, observed = {}, {}
    for record in records:
        true = _latent_values(model, record, post)
        replicated = _release_each_draw(record.mechanism, true, rng)
        dims, coords = _release_dims(model, record, replicated.ndim - 2)
        predictive[record.name] = xr.DataArray(
            replicated, dims=(*SAMPLE_DIMS, *dims),
            coords={"chain": post["chain"].values, "draw": post["draw"].values, **coords})
        value = evaluate(model.rvs_to_values[record.release_rv])
        observed[record.name] = xr.DataArray(value, dims=dims, coords=coords)
    out = idata.copy() if isinstance(idata, xr.DataTree) else xr.DataTree.from_dict({"posterior": idata})
    out["posterior_predictive"] = xr.Dataset(predictive)
    out["observed_data"] = xr.Dataset(observed)
    return out


def ppc_pvalues(idata, var_names=None, *, two_sided: bool = False) -> xr.Dataset:
    """Per-cell posterior predictive p-values of the observed releases, from the groups
    :func:`posterior_predictive_releases` adds: P(rep > obs) + P(rep = obs) / 2 over the
    posterior draws (mid-p; for continuous releases P(rep >= obs)). Near 0: the release is
    larger than the model predicts; near 1: smaller. ``two_sided``: min(1, 2 min(p, 1 - p)).

    Posterior predictive p-values are conservative (under the model they concentrate around
    1/2 rather than being uniform; Meng 1994: P(p <= a) <= 2a), so an extreme value is strong
    evidence of misfit but a moderate one is weak evidence of fit."""
    for group in ("posterior_predictive", "observed_data"):
        if group not in idata.children:
            raise ValueError(f"idata has no {group} group; use posterior_predictive_releases first")
    predictive = idata["posterior_predictive"].to_dataset()
    observed = idata["observed_data"].to_dataset()
    names = list(predictive.data_vars) if var_names is None else (
        [var_names] if isinstance(var_names, str) else list(var_names))
    out = {}
    for name in names:
        rep, obs = predictive[name], observed[name]
        p = (rep > obs).mean(SAMPLE_DIMS) + 0.5 * (rep == obs).mean(SAMPLE_DIMS)
        out[name] = np.minimum(1.0, 2.0 * np.minimum(p, 1.0 - p)) if two_sided else p
    return xr.Dataset(out)


def _redraw_latents(model, records, post: xr.Dataset, rng) -> xr.Dataset:
    """``post`` with the releases' latent variables replaced by fresh draws from the model
    given the other posterior variables."""
    names = sorted({v.name for r in records for v in _latent_inputs(model, r)})
    if not names:
        return post
    trace = post.drop_vars([n for n in names if n in post])
    fresh = pm.sample_posterior_predictive(
        trace, var_names=names, model=model, random_seed=int(rng.integers(2**31)),
        progressbar=False)["posterior_predictive"].to_dataset()
    return post.assign({n: fresh[n].assign_coords(chain=post["chain"], draw=post["draw"]) for n in names})


def _latent_inputs(model, record) -> list:
    latent = record.latent
    return closest_free_variables(model, latent) if hasattr(latent, "owner") else []


def _latent_values(model, record, post: xr.Dataset) -> np.ndarray:
    """The true values behind a release for every draw: (chain, draw, *shape)."""
    latent = record.latent
    n_chains, n_draws = post.sizes["chain"], post.sizes["draw"]
    if not hasattr(latent, "owner"):  # constant true values
        value = np.asarray(latent)
        return np.broadcast_to(value, (n_chains, n_draws, *value.shape)).copy()
    name = getattr(latent, "name", None)
    if name in post and (latent in model.free_RVs or latent in model.deterministics):
        return np.asarray(post[name].values)
    inputs = _latent_inputs(model, record)
    missing = [v.name for v in inputs if v.name not in post]
    if missing:
        raise ValueError(f"release {record.name!r}: the posterior has no draws of {missing}")
    if not inputs:  # computed from data alone
        value = evaluate(latent)
        return np.broadcast_to(value, (n_chains, n_draws, *value.shape)).copy()
    (vectorised,) = pm.vectorize_over_posterior([latent], post[[v.name for v in inputs]], inputs,
                                                allow_rvs_in_graph=False)
    return evaluate(vectorised)


def _release_each_draw(mechanism, true: np.ndarray, rng) -> np.ndarray:
    """``mechanism.release`` of every draw's true values: one call on the whole stack where the
    mechanism adds i.i.d. noise cell by cell, else one call per draw."""
    n_chains, n_draws = true.shape[:2]
    flat = true.reshape(n_chains * n_draws, *true.shape[2:])
    if isinstance(mechanism, AdditiveMechanism) and type(mechanism).release is AdditiveMechanism.release:
        released = np.asarray(mechanism.release(flat, rng))
    else:
        released = np.stack([np.asarray(mechanism.release(values, rng)) for values in flat])
    return released.reshape(n_chains, n_draws, *released.shape[1:])


def _release_dims(model, record, ndim: int) -> tuple[tuple, dict]:
    dims = model.named_vars_to_dims.get(record.name)
    if not dims or len(dims) != ndim:
        dims = tuple(f"{record.name}_dim_{i}" for i in range(ndim))
    coords = {d: np.asarray(model.coords[d]) for d in dims if model.coords.get(d) is not None}
    return tuple(dims), coords


# --- 4. derived quantities ------------------------------------------------------------------------
def shares(idata, var_name: str, *, dim=None) -> xr.DataArray:
    """Posterior draws of each cell's share x_i / sum x: of the sum over every cell dimension
    (default) or over ``dim`` only (shares within each row of a table, say). NaN in a draw
    where the sum is 0."""
    draws = posterior_draws(idata, var_name)
    over = cell_dims(draws) if dim is None else [_one_cell_dim(draws, dim)]
    total = draws.sum(over)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = draws.astype(float) / total.where(total != 0)
    return share.rename(f"{var_name}_share")


def ratio(idata, var_name: str, numerator, denominator, *, dim=None) -> xr.DataArray:
    """Posterior draws of x[numerator] / x[denominator]; each is one label of ``dim``'s
    coordinate (a position where the dimension has none) or a list of them, summed (the
    ratio of two groups of cells). inf or NaN in a draw where the denominator is 0."""
    draws = posterior_draws(idata, var_name)
    dim = _one_cell_dim(draws, dim)
    num, den = (_pick(draws, dim, labels) for labels in (numerator, denominator))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num.astype(float) / den
    return out.rename(f"{var_name}_ratio")


def _pick(draws: xr.DataArray, dim: str, labels) -> xr.DataArray:
    select = draws.sel if dim in draws.indexes else draws.isel
    if np.ndim(labels) == 0:
        return select({dim: labels}, drop=True)
    return select({dim: list(labels)}).sum(dim)


def ranks(idata, var_name: str, *, dim=None, descending: bool = True, ties: str = "min") -> xr.DataArray:
    """Posterior draws of each cell's rank along ``dim`` (1 = largest with ``descending``).
    Ties (common for counts) by ``scipy.stats.rankdata``'s ``method``: ``"min"`` (default:
    tied cells share the best rank, so several can rank first), ``"average"``, ``"max"``..."""
    draws = posterior_draws(idata, var_name)
    dim = _one_cell_dim(draws, dim)
    values = -draws if descending else draws
    ranked = xr.apply_ufunc(lambda a: stats.rankdata(a, axis=-1, method=ties), values,
                            input_core_dims=[[dim]], output_core_dims=[[dim]])
    if ties != "average":
        ranked = ranked.astype(np.int64)
    return ranked.transpose(*draws.dims).rename(f"{var_name}_rank")


def ranked_first(idata, var_name: str, *, dim=None, descending: bool = True) -> xr.DataArray:
    """Indicator draws (1.0 / 0.0) that a cell ranks first (ties share first place); the
    posterior mean is the probability that the cell is the largest (smallest if not
    ``descending``)."""
    first = ranks(idata, var_name, dim=dim, descending=descending, ties="min") == 1
    return first.astype(float).rename(f"{var_name}_first")


def rank_probabilities(idata, var_name: str, *, dim=None, descending: bool = True) -> xr.DataArray:
    """P(rank of cell i = k) for k = 1..n (a summary, not draws): dims (``dim``, ``rank``);
    ties share the best rank (``ties="min"``), so a column can sum to more than 1."""
    ranked = ranks(idata, var_name, dim=dim, descending=descending, ties="min")
    dim = _one_cell_dim(ranked, dim)
    k = np.arange(1, ranked.sizes[dim] + 1)
    indicator = ranked == xr.DataArray(k, dims="rank", coords={"rank": k})
    return indicator.mean(SAMPLE_DIMS).transpose(dim, "rank").rename(f"{var_name}_rank_probability")


def exceeds(idata, var_name: str, threshold) -> xr.DataArray:
    """Indicator draws (1.0 / 0.0) of x >= ``threshold`` (a number, or an array or DataArray
    broadcasting against the cells); the posterior mean is P(x_i >= t)."""
    draws = posterior_draws(idata, var_name)
    return (draws >= threshold).astype(float).rename(f"{var_name}_exceeds")


# --- 5. prior sensitivity ------------------------------------------------------------------------
@dataclass(frozen=True)
class PriorSensitivity:
    """``table``: one row per (prior, cell) with the posterior mean, sd, median, equal-tailed
    interval, P(x = 0) (integer variables) and the change of the mean from the first prior;
    ``fits``: the dp.sample result under each prior."""

    table: pd.DataFrame
    fits: dict

    def __str__(self) -> str:
        return self.table.to_string(index=False)


def prior_sensitivity(model_builder: Callable, release, priors, *, var_name: str, cells=None,
                      prob: float = 0.9, draws: int = 1000, tune: int = 1000, chains: int = 2,
                      random_seed=None, progressbar: bool = False, **sample_kwargs) -> PriorSensitivity:
    """Refit a model under each prior and tabulate the posterior of ``var_name`` (small
    counts, typically), to see how much of it the release decides and how much the prior.

    ``model_builder(release, prior)`` returns the PyMC model with ``release`` observed through
    its mechanism and the prior given by ``prior`` (any object the builder understands);
    ``priors`` is a mapping label -> prior, or a sequence of priors (labelled by ``str``).
    Every fit uses ``random_seed`` (common random numbers across priors). ``cells``: labels
    of the variable's cell dimension to report (default all)."""
    if isinstance(priors, Mapping):
        labelled = dict(priors)
    else:
        labelled = {str(p): p for p in priors}
    if not labelled:
        raise ValueError("priors is empty")
    lo_q, hi_q = (1 - prob) / 2, (1 + prob) / 2
    rows, fits = [], {}
    for label, prior in labelled.items():
        model = model_builder(release, prior)
        idata = sample(draws, tune=tune, chains=chains, random_seed=random_seed,
                       progressbar=progressbar, model=model, **sample_kwargs)
        fits[label] = idata
        values = posterior_draws(idata, var_name)
        if cells is not None:
            values = _pick_cells(values, cells)
        labels, flat = _flatten_cells(values)
        integer = flat.dtype.kind in "iu"
        for j, cell in enumerate(labels):
            x = flat[:, j]
            row = {"prior": label, "cell": cell, "mean": x.mean(), "sd": x.std(ddof=1),
                   "median": np.median(x), f"lower{prob:.0%}": np.quantile(x, lo_q),
                   f"upper{prob:.0%}": np.quantile(x, hi_q)}
            if integer:
                row["P(=0)"] = np.mean(x == 0)
            rows.append(row)
    table = pd.DataFrame(rows)
    reference = table.groupby("cell", sort=False)["mean"].transform("first")
    table["mean change"] = table["mean"] - reference
    return PriorSensitivity(table=table, fits=fits)


def _pick_cells(values: xr.DataArray, cells) -> xr.DataArray:
    dim = _one_cell_dim(values, None)
    labels = [cells] if np.ndim(cells) == 0 else list(cells)
    return (values.sel if dim in values.indexes else values.isel)({dim: labels})


def _flatten_cells(values: xr.DataArray) -> tuple[list, np.ndarray]:
    dims = cell_dims(values)
    n = values.sizes["chain"] * values.sizes["draw"]
    flat = values.values.reshape(n, -1)
    if not dims:
        return [values.name], flat
    if len(dims) == 1:
        d = dims[0]
        labels = list(values[d].values) if d in values.coords else list(range(values.sizes[d]))
        return labels, flat
    index = pd.MultiIndex.from_product(
        [values[d].values if d in values.coords else range(values.sizes[d]) for d in dims])
    return list(index), flat
