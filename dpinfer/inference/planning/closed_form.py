"""Continuous latents summed out of their release in closed form, then drawn exactly.

A latent y ~ Normal(mu, sigma) (mu and sigma may depend on the parameters) whose only child is
its release s = y + noise leaves the release with a closed-form law given the parameters:

* Gaussian noise of sd tau: s ~ Normal(mu, sqrt(sigma^2 + tau^2)), and
  y | s ~ Normal((mu tau^2 + s sigma^2) / (sigma^2 + tau^2), sigma tau / sqrt(sigma^2 + tau^2));
* Laplace noise of scale b: s follows the normal-Laplace law
  (:class:`~dpinfer.distributions.NormalLaplace`; Reed & Jorgensen 2004), and y | s is a
  mixture of two truncated normals (:func:`~dpinfer.distributions.draw_normal_given_laplace_release`).

A true table t ~ Multinomial(n, p) of n records' cells whose only child is its
randomised-response release S (each bit kept with probability q) leaves S ~ Multinomial(n, M^T p)
given p, and t | S, p = sum_o Multinomial(S_o, w(. | o)) with w(c | o) = p_c M[c, o] / (M^T p)_o
(:class:`~dpinfer.mechanisms.RandomizedResponse`, whose module docstring derives both).

The engines rewrite the model with the latent gone and the release still observed, now with
that law (:mod:`dpinfer.inference.engines.closed_form`), NUTS runs on the parameters alone,
and y is drawn exactly from its conditional law for every posterior draw: the same posterior
as sampling y by NUTS, with the latent's part of the sampling error removed.

Summed out: a free ``pm.Normal`` latent released whole (not through a query) by ``dp.Gaussian``
or ``dp.Laplace``, and a free ``pm.Multinomial`` table released by ``dp.RandomizedResponse``,
with no other variable of the model depending on it; other continuous latents stay in the
model and NUTS samples them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.model.fgraph import model_observed_rv
from pytensor.graph.traversal import ancestors
from pytensor.tensor.random.basic import MultinomialRV, NormalRV

from dpinfer._graphs import evaluate
from dpinfer.distributions import (
    NormalLaplace,
    draw_normal_given_gaussian_release,
    draw_normal_given_laplace_release,
)
from dpinfer.inference.latents import NotMarginalisableError, current_value
from dpinfer.mechanisms.gaussian import Gaussian
from dpinfer.mechanisms.laplace import Laplace
from dpinfer.mechanisms.randomized_response import RandomizedResponse
from dpinfer.mechanisms.records import ReleaseRecord

@dataclass(frozen=True)
class _SummedOut:
    """A latent summed out of its release (``record``); subclasses give the release's law
    given the latent's parameters (``marginal``) and the latent's exact draws (``draw``)."""

    record: ReleaseRecord
    draws_latent = True  # drawn exactly given each posterior draw
    nuisance_names = ()  # free variables the rewrite adds to the model: none

    @property
    def latent_name(self) -> str:
        return self.record.latent.name

    def rewrite(self, fgraph, memo) -> None:
        """Remove the latent from ``fgraph`` (a model's, from ``fgraph_from_model``; ``memo``
        maps the model's variables to it) and observe the release with its law given the
        latent's parameters (:meth:`marginal`)."""
        latent_var = memo[self.record.latent]
        release_var = memo[self.record.release_rv]
        latent_rv = latent_var.owner.inputs[0]
        _, release_data = release_var.owner.inputs
        op = release_var.owner.op
        marginal = self.marginal(latent_rv.owner.op.dist_params(latent_rv.owner), shape=tuple(latent_rv.shape))
        fgraph.replace(release_var, model_observed_rv(marginal, release_data, op.name, *op.dims), import_missing=True)
        fgraph.remove_output(fgraph.outputs.index(latent_var))


class SummedLatent(_SummedOut):
    """A Normal latent summed out of its release by a Gaussian or Laplace mechanism."""

    @property
    def method(self) -> str:
        noise = ("Gaussian noise: the release ~ Normal(mu, sqrt(sigma^2 + tau^2))"
                 if isinstance(self.record.mechanism, Gaussian) else
                 "Laplace noise: the release follows the normal-Laplace law (Reed & Jorgensen 2004)")
        return (f"summed out in closed form (latent Normal(mu, sigma) with {noise}); NUTS "
                "on the parameters, then the latent drawn exactly given each posterior draw")

    def marginal(self, params, shape):
        """The release's law given the latent's parameters (PyMC distribution, unregistered)."""
        mu, sigma = params
        mechanism = self.record.mechanism
        if isinstance(mechanism, Gaussian):
            return pm.Normal.dist(mu, pt.sqrt(sigma**2 + mechanism.sigma**2), size=shape)
        return NormalLaplace.dist(mu, sigma, mechanism.scale, size=shape)

    def draw_params(self, params, release):
        """The parameters :meth:`draw` takes, as graphs of the latent's parameters."""
        mu, sigma, _ = pt.broadcast_arrays(*params, release)
        return [mu, sigma]

    def draw(self, release, params, n_draws: int, rng: np.random.Generator) -> np.ndarray:
        """Exact draws of the latent given the release, one per posterior draw (parameters
        free of the model's free variables come without the draws' axis)."""
        shape = (n_draws, *release.shape)
        mu, sigma = (np.broadcast_to(v, shape) for v in params)
        mechanism = self.record.mechanism
        if isinstance(mechanism, Gaussian):
            return draw_normal_given_gaussian_release(release, mu, sigma, mechanism.sigma, rng)
        return draw_normal_given_laplace_release(release, mu, sigma, mechanism.scale, rng)


class SummedTable(_SummedOut):
    """A Multinomial true table summed out of its randomised-response release."""

    @property
    def method(self) -> str:
        return ("summed out in closed form (true table Multinomial(n, p) under randomised "
                "response: the release ~ Multinomial(n, M^T p)); NUTS on the parameters, "
                "then the true table drawn exactly given each posterior draw")

    def marginal(self, params, shape):
        """Multinomial(n, M^T p): one table (``shape`` is the table's, fixed by p)."""
        n, p = params
        return pm.Multinomial.dist(n=n, p=self.record.mechanism.report_probabilities(p))

    def draw_params(self, params, release):
        return list(params)

    def draw(self, release, params, n_draws: int, rng: np.random.Generator) -> np.ndarray:
        """Exact draws of the table given the release, one per posterior draw of p (n equals
        the number of reports: :func:`check_tables`)."""
        p = np.broadcast_to(params[1], (n_draws, release.shape[-1]))
        mechanism = self.record.mechanism
        return np.stack([mechanism.draw_true_table(p[i] / p[i].sum(), release, rng)
                         for i in range(n_draws)])


def _only_child(model, record) -> bool:
    latent = record.latent
    others = [v for v in model.basic_RVs + model.deterministics + model.potentials
              if v is not latent and v is not record.release_rv]
    return not any(latent in ancestors([v]) for v in others)


def summable(model, records) -> list:
    """The releases whose latent can be summed out (module docstring)."""
    found = []
    for record in records:
        latent = record.latent
        if latent not in model.free_RVs or not _only_child(model, record):
            continue
        if type(record.mechanism) in (Gaussian, Laplace) and isinstance(latent.owner.op, NormalRV):
            found.append(SummedLatent(record))
        elif (isinstance(record.mechanism, RandomizedResponse)
              and isinstance(latent.owner.op, MultinomialRV)):
            found.append(SummedTable(record))
    return found


def check_tables(model, records) -> list[SummedTable]:
    """The randomised-response releases' tables, all summable, or a NotMarginalisableError:
    no other engine draws a Multinomial table (its cells move together)."""
    tables = [r for r in records if isinstance(r.mechanism, RandomizedResponse)]
    summed = [s for s in summable(model, tables) if isinstance(s, SummedTable)]
    refused = sorted(r.name for r in tables if r.name not in {s.record.name for s in summed})
    if refused:
        raise NotMarginalisableError(
            f"randomised-response releases {refused}: dpinfer.sample needs the true table to be a "
            "free pm.Multinomial(n, p) (p the cell probabilities, n the number of records) whose "
            "only child is the release; it is then summed out (the release ~ Multinomial(n, M^T p)) "
            "and drawn exactly given p. Model the table that way, or write the marginal form with "
            "mechanism.dist_given_probabilities(p, n) and use pm.sample")
    for item in summed:
        n = item.record.latent.owner.op.dist_params(item.record.latent.owner)[0]
        reports = int(np.sum(current_value(model.rvs_to_values[item.record.release_rv])))
        if not (set(ancestors([n])) & set(model.free_RVs)) and np.any(evaluate(n) != reports):
            raise ValueError(
                f"release {item.record.name!r}: the true table's n = {evaluate(n)} is not the number "
                f"of reports {reports} (randomised response keeps the number of records)")
    return summed
