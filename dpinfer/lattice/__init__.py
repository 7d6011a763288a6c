"""Integer-lattice machinery shared by the mechanisms and inference.

Invariants ``A x = a`` on count vectors, their kernel lattice, Markov bases and fibres
(:mod:`~dpinfer.lattice.invariants`); exact Gibbs line updates of counts on a fibre
(:mod:`~dpinfer.lattice.fibre_gibbs`) and of noise on the kernel lattice
(:mod:`~dpinfer.lattice.noise_gibbs`); noise conditioned on invariants, class by class
(:mod:`~dpinfer.lattice.class_convolution`); seed 001's random walk
(:mod:`~dpinfer.lattice.random_walk`) and seed 000's independence sampler
(:mod:`~dpinfer.lattice.independence_sampler`) with their L-lag couplings.

Nothing here imports :mod:`dpinfer.mechanisms` or :mod:`dpinfer.inference`: noise laws come in
as arrays (log pmfs), callables or :class:`~dpinfer.lattice.targets.LatticeTarget` values.
"""
