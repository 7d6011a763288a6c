"""dpinfer's compiled Gibbs engine: fit a model whose latent counts have exact conditional
draws, with NUTS on everything continuous.

A sweep draws every latent's counts given the parameters (:mod:`dpinfer.inference.count_blocks`),
then makes one NUTS transition of the parameters given the counts
(:mod:`dpinfer.inference.chains`). The compiled model is kept on the PyMC model and reused by
later fits (new releases through ``pm.set_data`` only change the blocks' tables); it is
rebuilt when the model's other data change.

The result is an ``xarray.DataTree`` like ``pm.sample``'s: ``posterior`` (free variables in
their constrained space, Deterministics, latent counts, with the model's dims and coords) and
``sample_stats`` (NUTS statistics under PyMC's names, and each block's), checked with PyMC's
own convergence checks (divergences, R-hat, ESS), which log the same warnings as
``pm.sample``.
"""

from __future__ import annotations

import time

import numpy as np
import xarray as xr
from pymc.stats.convergence import log_warnings, run_convergence_checks

from dpinfer.inference.chains import MAX_TREE_DEPTH, run_chains
from dpinfer.inference.compiled import compile_model

_COMPILED = "_dpinfer_compiled_model"


def compiled_model_for(model, latents: list, releases: list):
    """The compiled model kept on ``model`` if it was built for the same latents and the
    model's data have not changed since; otherwise a new one (kept)."""
    key = (tuple(rv.name for rv in latents), tuple(rv.name for rv in releases))
    cached = getattr(model, _COMPILED, None)
    if cached is not None and cached[0] == key and cached[1].matches(model):
        return cached[1]
    compiled = compile_model(model, latents, releases)
    setattr(model, _COMPILED, (key, compiled))
    return compiled


def fit(model, compiled, blocks, initial_counts: dict, *, draws: int, tune: int, chains: int,
        cores: int, rng: np.random.Generator, progressbar: bool,
        max_tree_depth: int = MAX_TREE_DEPTH, target_accept: float = 0.8,
        initvals: dict | None = None):
    """Run the chains and return (DataTree, seconds). ``initial_counts`` maps each latent to
    a start on its fibre; the parameters start at PyMC's jittered initial point (``initvals``
    overrides it where given, in the unconstrained space)."""
    counts0 = compiled.counts_vector(initial_counts)
    starts = []
    for _ in range(chains):
        q0 = compiled.initial_q(int(rng.integers(2**31)))
        for name, value in (initvals or {}).items():
            if name in compiled.names:
                q0[compiled.slices[compiled.names.index(name)]] = np.ravel(value)
        starts.append((q0, counts0))
    start = time.perf_counter()
    results = run_chains(compiled, blocks, chains=chains, cores=cores, tune=tune, draws=draws,
                         rng=rng, starts=starts, progressbar=progressbar,
                         max_tree_depth=max_tree_depth, target_accept=target_accept)
    seconds = time.perf_counter() - start
    idata = _datatree(model, compiled, results, tune=tune, seconds=seconds,
                      max_tree_depth=max_tree_depth)
    if progressbar:
        log_warnings(run_convergence_checks(idata, model))
    return idata, seconds


def _datatree(model, compiled, results, *, tune: int, seconds: float,
              max_tree_depth: int) -> xr.DataTree:
    chains, draws = len(results), results[0].q.shape[0]
    q = np.stack([r.q for r in results]).reshape(chains * draws, compiled.n)
    counts = np.stack([r.counts for r in results]).reshape(chains * draws, -1)
    values = compiled.expand(q, counts)
    for name in compiled.latents:
        values[name] = counts[:, compiled.latent_slices[name]].reshape(
            (chains * draws, *compiled.latent_shapes[name]))
    coords = {"chain": np.arange(chains), "draw": np.arange(draws)}
    posterior = {}
    for name, value in values.items():
        value = np.asarray(value).reshape((chains, draws, *np.shape(value)[1:]))
        dims = list(model.named_vars_to_dims.get(name) or
                    [f"{name}_dim_{i}" for i in range(value.ndim - 2)])
        for dim in dims:
            if model.coords.get(dim) is not None:
                coords[dim] = np.asarray(model.coords[dim])
        posterior[name] = (("chain", "draw", *dims), value)
    stats = {}
    for name in results[0].stats:
        value = np.stack([r.stats[name] for r in results])
        if name in ("diverging",):
            value = value.astype(bool)
        elif name in ("tree_depth", "n_steps"):
            value = value.astype(np.int64)
        stats[name] = (("chain", "draw"), value)
    if "tree_depth" in stats:
        stats["reached_max_treedepth"] = (("chain", "draw"), stats["tree_depth"][1] >= max_tree_depth)
    attrs = {"sampling_time": seconds, "tuning_steps": tune, "inference_library": "dpinfer"}
    return xr.DataTree.from_dict({
        "posterior": xr.Dataset(posterior, coords=coords, attrs=attrs),
        "sample_stats": xr.Dataset(stats, coords={"chain": coords["chain"], "draw": coords["draw"]},
                                   attrs=attrs),
    })
