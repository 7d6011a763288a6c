"""The engines of ``dpinfer.sample``: each takes a model and finished plans
(:mod:`dpinfer.inference.planning`) and samples, without planning anything itself.

* :mod:`~dpinfer.inference.engines.compiled`: dpinfer's compiled exact Gibbs engine (exact
  count draws alternating with NUTS, both compiled with numba; model functions kept in a disk
  cache), the default;
* :mod:`~dpinfer.inference.engines.nutpie`: nutpie's NUTS for models without latent counts;
* :mod:`~dpinfer.inference.engines.pymc`: ``pm.sample`` on a rewritten model with dpinfer's
  step methods (windowed Gibbs, fibre moves), which runs every plan;
* :mod:`~dpinfer.inference.engines.closed_form`: latents summed out in closed form and drawn
  back exactly, around either NUTS engine.
"""
