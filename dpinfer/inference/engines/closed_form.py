"""Latents summed out in closed form (:mod:`dpinfer.inference.planning.closed_form`): the
model rewritten without them, and their exact draws given each posterior draw of the rest.

The rewritten model keeps each release as an observed variable, now with the law the summed
plan gives it, so NUTS (on either NUTS engine) samples the parameters alone; every other
variable keeps its name, and the model's data are copies (refits pass the current values)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import fgraph_from_model, model_from_fgraph
from pytensor.graph.replace import clone_replace, vectorize_graph

from dpinfer._graphs import evaluate

_KEPT = "_dpinfer_closed_form_model"


def summed_out_model(model, summed: list):
    """``model`` with each summed latent gone and its release observed with its closed-form
    law; kept on ``model`` (rebuilt when the latents, their parameterisation or the model's
    variables change: a refit on new data may choose another form for a law of the sum), its
    data (copies) set to the model's current values."""
    key = (tuple((s.latent_name, tuple(s.nuisance_names)) for s in summed),
           tuple(v.name for v in model.free_RVs),
           tuple(v.name for v in model.observed_RVs))
    kept = getattr(model, _KEPT, None)
    if kept is not None and kept[0] == key:
        for var in model.data_vars:  # the rewritten model's data are copies: refresh them
            if hasattr(var, "get_value"):
                kept[1][var.name].set_value(var.get_value())
        return kept[1]
    fgraph, memo = fgraph_from_model(model)
    for item in summed:
        item.rewrite(fgraph, memo)
    rewritten = model_from_fgraph(fgraph, mutate_fgraph=True)
    setattr(model, _KEPT, (key, rewritten))
    return rewritten


def draw_latents(model, summed: list, posterior, rng: np.random.Generator) -> dict:
    """Exact draws of each summed latent for every posterior draw: name -> array (chain,
    draw, *shape). ``posterior`` holds the other free variables (constrained values)."""
    free = [rv for rv in model.free_RVs if rv.name in posterior]
    chains, draws = posterior.sizes["chain"], posterior.sizes["draw"]
    batch = [np.asarray(posterior[rv.name].values).reshape(chains * draws, *posterior[rv.name].shape[2:])
             for rv in free]
    out = {}
    for item in (s for s in summed if s.draws_latent):
        latent = item.record.latent
        release = model.rvs_to_values[item.record.release_rv]
        params = item.draw_params(latent.owner.op.dist_params(latent.owner), release)
        placeholders = [rv.type() for rv in free]
        params = clone_replace(params, dict(zip(free, placeholders)))
        batched = [pt.tensor(dtype=p.type.dtype, shape=(None, *p.type.shape)) for p in placeholders]
        params = vectorize_graph(params, replace=dict(zip(placeholders, batched)))
        param_draws = pytensor.function(batched, params, on_unused_input="ignore")(*batch)
        release_value = evaluate(release)
        values = item.draw(release_value, param_draws, chains * draws, rng)
        out[item.latent_name] = values.reshape(chains, draws, *values.shape[1:])
    return out
