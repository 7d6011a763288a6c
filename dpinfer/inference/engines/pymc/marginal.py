"""Exact marginalisation of latent true counts over proven windows (inference notes §1).

A model in which a latent count vector x ~ p(x | theta) (an elementwise discrete PyMC
distribution) is privatised into a release s by a mechanism is rewritten into one in which x
is gone and the release keeps being an observed variable whose law is the marginal

    p(s_i | theta) = sum_{x in W_i} p(x | theta) p(s_i | x)      (per cell i),

so NUTS runs on theta alone, ``pm.compute_log_likelihood`` gives per-cell marginal
log-likelihoods and posterior predictive draws of the release work (draw x from its prior,
then release it). Given theta, x is then drawn exactly from the normalised window weights.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.logprob.abstract import _logprob_helper
from pymc.model.fgraph import fgraph_from_model, model_from_fgraph, model_observed_rv
from pytensor.graph.replace import clone_replace, vectorize_graph

from dpinfer.inference.engines.pymc.convolution import ConvolutionLogLikelihood


def symbolic_centres(release, support):
    """c_i = round(s_i) clipped to the counts' support, symbolically (as ``window_centres``)."""
    centres = release if release.dtype.startswith("int") else pt.round(release)
    centres = centres.astype("int64")
    lower, upper = support
    if lower is not None:
        centres = pt.maximum(centres, lower)
    if upper is not None:
        centres = pt.minimum(centres, upper)
    return centres


def _windowed_terms(prior_op, prior_params, mechanism, release, half_width, support):
    """log p(x | theta) + log p(s | x) for x on each cell's window, shape (W, *cells).

    The window of cell i is c_i - k ... c_i + k with c_i = round(s_i) clipped to the support;
    ``release`` is symbolic, so a compiled model serves any release of the same shape.
    """
    centres = symbolic_centres(release, support)
    offsets = pt.arange(-half_width, half_width + 1, dtype="int64")
    grid = centres[None, ...] + offsets.reshape((-1,) + (1,) * release.ndim)
    # The prior's node only dispatches its logp; its rng is never used.
    _, prior = prior_op(*prior_params, rng=pt.random.rng(), return_next_rng=True)
    prior_lp = _logprob_helper(prior, grid)
    lik_lp = pm.logp(mechanism.dist(grid), pt.broadcast_to(release, grid.shape))
    return prior_lp + lik_lp


def marginalise(model, plans: list):
    """A new model in which each plan's latent counts are summed out of its release, the
    release observed with the marginal law of the window terms (:func:`_marginal_log_likelihood`)."""
    fgraph, memo = fgraph_from_model(model)
    for plan in plans:
        record = plan.record
        mechanism = record.mechanism
        latent_var = memo[record.latent]
        release_var = memo[record.release_rv]
        prior_rv = latent_var.owner.inputs[0]
        prior_op = prior_rv.owner.op
        prior_params = prior_op.dist_params(prior_rv.owner)
        _, release_data = release_var.owner.inputs

        def logp(value, *params, prior_op=prior_op, plan=plan):
            k = plan.window.half_width
            terms = _windowed_terms(prior_op, params, plan.mechanism, value, k, plan.support)
            return _marginal_log_likelihood(plan, terms, value)

        def dist(*args, prior_op=prior_op, mechanism=record.mechanism):
            *params, size = args
            rng = pt.random.shared_rng(np.random.default_rng())  # PyMC reseeds it when sampling
            _, counts = prior_op(*params, size=size, rng=rng, return_next_rng=True)
            return mechanism.dist(counts)

        marginal = pm.CustomDist.dist(
            *prior_params,
            dist=dist,
            logp=logp,
            dtype=release_var.type.dtype,
            size=tuple(prior_rv.shape),
            class_name=f"Marginal{type(mechanism).__name__}",
        )
        op = release_var.owner.op
        new_release = model_observed_rv(marginal, release_data, op.name, *op.dims)
        fgraph.replace(release_var, new_release, import_missing=True)
        fgraph.remove_output(fgraph.outputs.index(latent_var))
    return model_from_fgraph(fgraph, mutate_fgraph=True)


def _marginal_log_likelihood(plan, terms, release):
    """log p(s | theta) from the window terms (W, *cells): per cell a log-sum-exp (cells plan),
    or on group totals (totals plan, inference notes §2) the sum over groups of
    log (g_1 * ... * g_n)(t_g) - log P(A e = 0), g_i the cell's window terms and t_g the group
    total of s minus the windows' lower ends, spread evenly over the cells (only the sum is
    meaningful)."""
    if plan.kind != "totals":
        return pt.logsumexp(terms, axis=0)
    codes = plan.group_codes
    d = codes.size
    lower = symbolic_centres(release, plan.support).reshape((-1,)) - plan.window.half_width
    indicator = pt.constant(np.eye(codes.max() + 1, dtype=np.int64)[:, codes])  # (G, d)
    targets = pt.dot(indicator, release.reshape((-1,)).astype("int64") - lower)
    log_g = terms.reshape((terms.shape[0], d)).T
    total = ConvolutionLogLikelihood(tuple(int(c) for c in codes))(log_g, targets)
    total = total - plan.record.mechanism.log_normaliser()
    return pt.broadcast_to(total / d, release.shape)


def compile_window_log_weights(marginal_model, plan):
    """A function of a batch of the marginal model's free variables (constrained values, each
    with a leading batch axis, in the order of ``marginal_model.free_RVs``) returning the log
    weights (batch, W, *cells) of the latent counts: log p(x | theta) + log p(s | x) on the
    window grid."""
    release_rv = marginal_model[plan.record.name]
    node = release_rv.owner
    prior_op = plan.record.latent.owner.op
    params = node.op.dist_params(node)
    release = marginal_model.rvs_to_values[release_rv]
    terms = _windowed_terms(
        prior_op, params, plan.mechanism, release, plan.window.half_width, plan.support
    )
    free = marginal_model.free_RVs
    placeholders = [rv.type() for rv in free]
    terms = clone_replace(terms, dict(zip(free, placeholders)))
    batched = [pt.tensor(dtype=p.type.dtype, shape=(None, *p.type.shape)) for p in placeholders]
    terms = vectorize_graph(terms, replace=dict(zip(placeholders, batched)))
    return pytensor.function(batched, terms, on_unused_input="ignore")
