"""Integer-lattice machinery shared by the mechanisms and inference.

* :mod:`~dpinfer.lattice.invariants`: invariants ``A x = a`` on count vectors, their kernel
  lattice, Markov bases and fibres;
* :mod:`~dpinfer.lattice.convolution`: convolutions of per-cell weights at group totals
  (values, conditional marginals, exact joint draws);
* :mod:`~dpinfer.lattice.nested`: counts on the leaves of a tree of areas measured at every
  level (exact sum-tree moves along one cell or a pair of cells);
* :mod:`~dpinfer.lattice.class_convolution`: i.i.d. noise conditioned on invariants, class by
  class (normaliser and exact draws);
* :mod:`~dpinfer.lattice.fibre_gibbs`: exact Gibbs line updates of counts on a boxed fibre;
* :mod:`~dpinfer.lattice.infeasible`: equalities and bounds that cannot all hold, an
  irreducible subset of them (the rows an error names);
* :mod:`~dpinfer.lattice.targets`: the laws of lattice noise (generalized Laplace, lattice
  Gaussian);
* :mod:`~dpinfer.lattice.noise_gibbs`, :mod:`~dpinfer.lattice.random_walk` and
  :mod:`~dpinfer.lattice.independence_sampler`: the seeds' samplers of lattice noise, each with
  its L-lag coupling, and :mod:`~dpinfer.lattice.coupling`: the TV bound from their meeting
  times.

Nothing here imports :mod:`dpinfer.mechanisms` or :mod:`dpinfer.inference`: noise laws come in
as arrays (log pmfs), callables or :class:`~dpinfer.lattice.targets.LatticeTarget` values.
"""
