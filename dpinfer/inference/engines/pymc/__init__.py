"""The PyMC engine: ``pm.sample`` on the model with its latent counts summed out over proven
windows (:mod:`.marginal`, with the convolution likelihood of group totals,
:mod:`.convolution`), next to dpinfer's step methods for counts that cannot be summed out
(:mod:`.gibbs`, :mod:`.fibre`); the engine itself is :mod:`.engine`."""
