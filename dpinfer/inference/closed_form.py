"""Continuous latents summed out of their release in closed form, then drawn exactly.

A latent y ~ Normal(mu, sigma) (mu and sigma may depend on the parameters) whose only child is
its release s = y + noise leaves the release with a closed-form law given the parameters:

* Gaussian noise of sd tau: s ~ Normal(mu, sqrt(sigma^2 + tau^2)), and
  y | s ~ Normal((mu tau^2 + s sigma^2) / (sigma^2 + tau^2), sigma tau / sqrt(sigma^2 + tau^2));
* Laplace noise of scale b: s follows the normal-Laplace law
  (:class:`~dpinfer.distributions.NormalLaplace`; Reed & Jorgensen 2004), and y | s is a
  mixture of two truncated normals (:func:`~dpinfer.distributions.draw_normal_given_laplace_release`).

The model is rewritten with y gone and the release still observed, now with that law (as
:mod:`dpinfer.inference.marginal` does for counts), NUTS runs on the parameters alone, and y is
drawn exactly from its conditional law for every posterior draw: the same posterior as
sampling y by NUTS, with the latent's part of the sampling error removed.

Summed out: a free ``pm.Normal`` latent released whole (not through a query) by ``dp.Gaussian``
or ``dp.Laplace``, with no other variable of the model depending on it; other continuous
latents stay in the model and NUTS samples them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import fgraph_from_model, model_from_fgraph, model_observed_rv
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.random.basic import NormalRV

from dpinfer.distributions import (
    NormalLaplace,
    draw_normal_given_gaussian_release,
    draw_normal_given_laplace_release,
)
from dpinfer.mechanisms.gaussian import Gaussian
from dpinfer.mechanisms.laplace import Laplace
from dpinfer.mechanisms.records import ReleaseRecord

_KEPT = "_dpinfer_closed_form_model"


@dataclass(frozen=True)
class SummedLatent:
    """A Normal latent summed out of its release by a Gaussian or Laplace mechanism."""

    record: ReleaseRecord

    @property
    def latent_name(self) -> str:
        return self.record.latent.name

    @property
    def method(self) -> str:
        noise = ("Gaussian noise: the release ~ Normal(mu, sqrt(sigma^2 + tau^2))"
                 if isinstance(self.record.mechanism, Gaussian) else
                 "Laplace noise: the release follows the normal-Laplace law (Reed & Jorgensen 2004)")
        return (f"summed out in closed form (latent Normal(mu, sigma) with {noise}); NUTS (nutpie) "
                "on the parameters, then the latent drawn exactly given each posterior draw")

    def marginal(self, mu, sigma, size):
        """The release's law given the parameters (PyMC distribution, unregistered)."""
        mechanism = self.record.mechanism
        if isinstance(mechanism, Gaussian):
            return pm.Normal.dist(mu, pt.sqrt(sigma**2 + mechanism.sigma**2), size=size)
        return NormalLaplace.dist(mu, sigma, mechanism.scale, size=size)

    def draw(self, release, mu, sigma, rng: np.random.Generator) -> np.ndarray:
        """Exact draws of the latent given the release, one per row of mu and sigma."""
        mechanism = self.record.mechanism
        if isinstance(mechanism, Gaussian):
            return draw_normal_given_gaussian_release(release, mu, sigma, mechanism.sigma, rng)
        return draw_normal_given_laplace_release(release, mu, sigma, mechanism.scale, rng)


def summable(model, records) -> list[SummedLatent]:
    """The releases whose latent can be summed out (module docstring)."""
    found = []
    for record in records:
        latent = record.latent
        if type(record.mechanism) not in (Gaussian, Laplace) or latent not in model.free_RVs:
            continue
        if not isinstance(latent.owner.op, NormalRV):
            continue
        others = [v for v in model.basic_RVs + model.deterministics + model.potentials
                  if v is not latent and v is not record.release_rv]
        if any(latent in ancestors([v]) for v in others):
            continue
        found.append(SummedLatent(record))
    return found


def summed_out_model(model, summed: list[SummedLatent]):
    """``model`` with each summed latent gone and its release observed with its closed-form
    law; kept on ``model`` (rebuilt when the latents or the model's variables change). Its
    data are copies: pass the model's current data when sampling it."""
    key = (tuple(s.latent_name for s in summed), tuple(v.name for v in model.free_RVs),
           tuple(v.name for v in model.observed_RVs))
    kept = getattr(model, _KEPT, None)
    if kept is not None and kept[0] == key:
        return kept[1]
    fgraph, memo = fgraph_from_model(model)
    for item in summed:
        latent_var = memo[item.record.latent]
        release_var = memo[item.record.release_rv]
        normal = latent_var.owner.inputs[0]
        mu, sigma = normal.owner.op.dist_params(normal.owner)
        _, release_data = release_var.owner.inputs
        op = release_var.owner.op
        marginal = item.marginal(mu, sigma, size=tuple(normal.shape))
        new_release = model_observed_rv(marginal, release_data, op.name, *op.dims)
        fgraph.replace(release_var, new_release, import_missing=True)
        fgraph.remove_output(fgraph.outputs.index(latent_var))
    rewritten = model_from_fgraph(fgraph, mutate_fgraph=True)
    setattr(model, _KEPT, (key, rewritten))
    return rewritten


def draw_latents(model, summed: list[SummedLatent], posterior, rng: np.random.Generator) -> dict:
    """Exact draws of each summed latent for every posterior draw: name -> array (chain,
    draw, *shape). ``posterior`` holds the other free variables (constrained values)."""
    free = [rv for rv in model.free_RVs if rv.name in posterior]
    chains, draws = posterior.sizes["chain"], posterior.sizes["draw"]
    batch = [np.asarray(posterior[rv.name].values).reshape(chains * draws, *posterior[rv.name].shape[2:])
             for rv in free]
    out = {}
    for item in summed:
        latent = item.record.latent
        normal_mu, normal_sigma = latent.owner.op.dist_params(latent.owner)
        release = model.rvs_to_values[item.record.release_rv]
        mu, sigma, _ = pt.broadcast_arrays(normal_mu, normal_sigma, release)
        placeholders = [rv.type() for rv in free]
        params = clone_replace([mu, sigma], dict(zip(free, placeholders)))
        batched = [pt.tensor(dtype=p.type.dtype, shape=(None, *p.type.shape)) for p in placeholders]
        params = vectorize_graph(params, replace=dict(zip(placeholders, batched)))
        mu_draws, sigma_draws = pytensor.function(batched, params, on_unused_input="ignore")(*batch)
        release_value = np.asarray(release.eval())
        shape = (chains * draws, *release_value.shape)  # parameters free of theta lack the batch axis
        mu_draws, sigma_draws = np.broadcast_to(mu_draws, shape), np.broadcast_to(sigma_draws, shape)
        values = item.draw(release_value, mu_draws, sigma_draws, rng)
        out[item.latent_name] = values.reshape(chains, draws, *values.shape[1:])
    return out
