r"""Baselines for nested measurements: what the tools in use today make of a tree of noisy counts.

The release is a :class:`~dpinfer.mechanisms.nested.NestedMeasurements` (or its
:class:`~dpinfer.lattice.nested.structure.NestedSums`): latent counts x[l, c] on the leaves l of
a tree of areas, area sums S_{v,c} = sum_{l under v} x[l, c], and terms at every area --
measurements y_r = sum_{c in cells_r} S_{v_r, c} + e_r (e_r the sum of ``summed`` discrete
Gaussians, Var e_r = v_r = summed * sigma^2), equalities and bounds. The quantities compared
are **targets**, linear functionals d'x of the counts or ratios d_A'x / d_B'x
(:mod:`~dpinfer.utility.baselines.nested.targets`).

Methods, one module each:

* :mod:`~dpinfer.utility.baselines.nested.gls` -- the **generalised least-squares / best linear
  unbiased estimate** (the Census Bureau's GLS uncertainty evaluation of the 2020 noisy
  measurement files, uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation; the first step of
  BlueDown), its sds and intervals;
* :mod:`~dpinfer.utility.baselines.nested.per_cell` -- the **per-cell posterior** of the tools
  that treat each published cell alone (sbaldasty/noisyvalue and dpvalue);
* :mod:`~dpinfer.lattice.nested.nnls` -- the **non-negative weighted least-squares
  projection** (TopDown-style post-processing); point estimates only;
* :mod:`~dpinfer.utility.baselines.nested.comparison` -- the targets' estimates and intervals of
  dpinfer's posterior draws and of every baseline, scored against the truth by group.

GLS and NNLS solve their least-squares problems exactly on the augmented system of all area sums
(:mod:`~dpinfer.lattice.nested.kkt`); GLS takes every area's covariance from two
passes over the tree (:mod:`~dpinfer.utility.baselines.nested.tree_pass`).
:mod:`~dpinfer.utility.baselines.nested.inputs` checks the arguments they share (the release,
cell sets).

All of them are baselines without a model for the confidential counts: compare them with
dpinfer's posterior, never treat their intervals as calibrated.
"""
