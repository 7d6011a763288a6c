"""nutpie's compiled NUTS, for models without latent counts (``dp.sample(method="nutpie")``).

A model whose releases are all of continuous latents by continuous mechanisms (a privatised
mean, sum or regression statistic, with or without its records), once Normal latents and
randomised-response tables are summed out in closed form, has nothing for dpinfer's Gibbs
steps to do. The compiled engine runs such models by default, with its model cache (a new
model object compiles nothing); nutpie is the alternative whose mass-matrix adaptation from
draws and gradients (Seyboldt et al.) can mix better per draw on strongly coupled posteriors,
at the price of compiling every new model object (about a second).

The compiled nutpie model is kept on the PyMC model and reused: a refit after ``pm.set_data``
hands the new values to it (``with_data``) without compiling again; it is rebuilt only when
the model's variables change.
"""

from __future__ import annotations

import numpy as np

_KEPT = "_dpinfer_nutpie_model"
OPTIONS = ("target_accept", "max_treedepth")
METHOD = ("NUTS (nutpie) on the continuous latent and the parameters, with the release observed "
          "(its exact likelihood; nothing to marginalise)")


def refusal(model, plan) -> str | None:
    """Why nutpie cannot fit this model (None: it can): latent counts, or discrete free
    variables other than the tables summed out in closed form (which nutpie never sees)."""
    if plan.latents:
        return "the model has latent counts (dpinfer's compiled Gibbs engine draws them)"
    summed = {s.latent_name for s in plan.summed}
    discrete = [rv.name for rv in model.free_RVs if rv.type.dtype.startswith(("int", "uint", "bool"))
                and rv.name not in summed]
    if discrete:
        return f"the discrete free variables {discrete} need PyMC's step methods"
    return None


def compiled_for(model):
    """The nutpie model kept on ``model`` (built on first use, or when the model's variables
    changed), with the current values of the model's data. Raises what nutpie raises when an
    Op has no numba implementation."""
    import nutpie

    key = (tuple(v.name for v in model.free_RVs), tuple(v.name for v in model.observed_RVs),
           tuple(v.name for v in model.deterministics))
    kept = getattr(model, _KEPT, None)
    if kept is None or kept[0] != key:
        kept = (key, nutpie.compile_pymc_model(model))
        setattr(model, _KEPT, kept)
    data = {v.name: v.get_value() for v in model.data_vars if hasattr(v, "get_value")}
    return kept[1].with_data(**data) if data else kept[1]


def run(model, compiled, *, draws: int, tune: int, chains: int, cores: int, seed: int,
        progressbar: bool, target_accept: float = 0.8, max_treedepth: int = 10):
    """One nutpie fit: an ``xarray.DataTree`` with ``posterior`` (free variables and
    Deterministics, with the model's dims) and ``sample_stats`` (nutpie's statistics, with
    PyMC's names added for ``tree_depth`` and ``reached_max_treedepth``)."""
    import nutpie

    idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=cores,
                          seed=seed, progress_bar=progressbar, save_warmup=False,
                          target_accept=target_accept, maxdepth=max_treedepth)
    stats = idata["sample_stats"].to_dataset()
    stats["tree_depth"] = stats["depth"].astype(np.int64)
    stats["reached_max_treedepth"] = stats["maxdepth_reached"]
    stats.attrs["tuning_steps"] = tune
    idata["sample_stats"] = stats
    return idata
