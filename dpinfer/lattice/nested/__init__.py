r"""Latent counts on the leaves of a tree of areas, measured at every level of the tree.

The 2020 Census noisy measurement files measure the same person histogram at the nation, the
states, counties, tracts, block groups and blocks: an area's measurement is a query of the sum
of its leaves' counts. With counts x[l, c] (leaf l, cell c of a histogram), area sums
S_{v,c} = sum_{l under v} x[l, c], and terms

    w_r(y_r - sum_{c in cells_r} S_{v_r, c})

(noise of a measurement, an exact equality, a bound), the law of the counts given parameters
theta is

    p(x | theta, y) ∝ prod_{l,c} p(x[l, c] | theta) prod_r w_r(y_r - t_r(x)).

Exact conditional draws of every count in one cell (or moving between two cells) given the
rest are tree-structured (:mod:`~dpinfer.lattice.nested.kernel`: sum-tree messages up, splits
down), so measurements at any number of levels cost one pass over the tree per move, and the
counts never leave the equalities and bounds.

* :mod:`~dpinfer.lattice.nested.terms`: the terms' weights as tables (summed discrete
  Gaussians, equalities, bounds);
* :mod:`~dpinfer.lattice.nested.structure`: the tree, the leaves and the terms as arrays;
* :mod:`~dpinfer.lattice.nested.kernel`: the exact moves and the sweep;
* :mod:`~dpinfer.lattice.nested.sampler`: sweeps given the prior's table (tests, and the unit
  the compiled engine runs);
* :mod:`~dpinfer.lattice.nested.split`: the same sweeps with the tree cut into shards (a state's
  counties) joined by the upper areas, the shards in this process or on Dask workers.
"""
