"""``dpinfer nmf``'s model of the coarse counts of the noisy measurement files.

:func:`census_model` is a Poisson model for the coarse counts x[l, c] on the
leaves whose rates vary between geographies at every level of the spine, with every rate
summed out (:func:`dpinfer.GroupedNegativeBinomial` with nested groupings): for block-group
leaves in tracts in counties in the state (or its parts) in the nation,

    the nation's rate of cell c ~ Gamma(shape 1/2, mean m0),
    each area's rate of cell c split among its children ~ Dirichlet(A_k[c] x their shares w),
        k the area's level (nation, state, county, tract),
    x[l, c] ~ Poisson(the block group's rate),
    w_l = softmax(v)_l summed over the child's leaves,  v ~ ZeroSumNormal(s_v) over the leaves,
    s_v ~ HalfNormal(1),  log A_k[c] ~ Normal(2, 1.5),

m0 = the mean absolute published value / 10 x the number of leaves (an order of magnitude; the
shape 1/2 gives the nation's log rate an sd of 2.2, so m0 hardly matters). The leaf sizes w
are shared by the cells; how far a cell's share strays from them between the counties of a
state, the tracts of a county and the block groups of a tract is learnt per cell and level: a
race group present in a few counties only gets a small A_county[c], a common cell a large one,
without one cell's spread setting another's.

Why summed out: a weakly measured cell (e.g. "two or more races", a sum of 57 published race
codes, noise sd ~90 at block-group level) is pinned by its geography's rate, and a rate per
(geography, cell) as a parameter is pinned by its counts; a sampler that alternates between
the two (data augmentation with nearly all the information missing) crawls. The previous model
(Student-t parent-by-cell effects as parameters and a cell profile, negative binomial counts;
the ``student-t`` variant of ``benchmarks/bench_nmf_models.py``) stuck on the shipped state's
block groups with one NUTS transition and one count draw per draw (R-hat 1.835, ESS 3 after
2 x (1000 + 2000)), and it needed ~28,000 parameters at the size of Iowa, this one ~2,800
(leaf sizes and 4 x 28 concentrations). With the rates summed out the engine's count moves are
exact given the concentrations (:mod:`dpinfer.lattice.nested`), and NUTS sees no parameter
that a single count pins down. (A cell profile as a parameter, the nation's rate of each cell,
was the slowest to mix once the rest was summed out: R-hat 1.017, ESS 321 after 2 x (1000 +
1000) on the shipped state's block groups; summed out, 1.0057 and 680.) A gamma at the parent
level alone with one shape for all cells mixed as well but undercovered (block-group cells
0.927 against 0.969 expected): one shape had to fit both the county-wide race profiles and the
small differences between a county's tracts, settled near 0.04 and put small cells' rates
near zero. The leaf sizes v sum to zero (softmax ignores a common shift, which would otherwise
be a direction only the prior bounds).

The release is every usable measurement and constraint of the files
(:func:`~dpinfer.io.nmf.table.census_table`).
"""

from __future__ import annotations

import numpy as np

from dpinfer.io.nmf.table import CensusTable


ROOT_SHAPE = 0.5  # the nation's rate of a cell: Gamma(0.5, mean m0), log sd 2.2 (module docstring)


LEAF_SIZES = ("estimated", "published")


def census_model(table: CensusTable, *, name: str = "counts", leaf_sizes: str = "estimated"):
    """The PyMC model of the module docstring, with ``table.release`` observed.

    ``leaf_sizes``: "estimated" (the default: the zero-sum leaf sizes v ~ ZeroSumNormal(s_v) of
    the module docstring, parameters of the fit) or "published" (w_l ∝ max(T_l, 1), T_l the
    leaf's most precise published total, :func:`published_leaf_totals`: an empirical-Bayes
    plug-in, no leaf-size parameter; the totals then enter both the prior and the
    likelihood, which should matter little where their noise is small against the leaves'
    size, e.g. sd 1.8 persons at block groups of several hundred, but is not yet checked by
    SBC: a study case of issue 23 (benchmarks/README.md), not the command's model)."""
    import pymc as pm
    import pytensor.tensor as pt

    import dpinfer as dp

    if not isinstance(leaf_sizes, str) or leaf_sizes not in LEAF_SIZES:
        raise ValueError(f"leaf_sizes must be one of {LEAF_SIZES}, got {leaf_sizes!r}")
    groupings = spine_groupings(table)
    n_leaves = len(table.leaves)
    with pm.Model(coords=table.coords | {"spine_level": groupings_levels(table)}) as model:
        share = pt.ones(1)
        if leaf_sizes == "published":
            totals = np.maximum(published_leaf_totals(table), 1.0)
            share = pt.as_tensor(totals / totals.sum())
        elif n_leaves > 1:
            s_v = pm.HalfNormal("sd_leaf", 1.0)
            z = pm.Normal("leaf_effect_z", 0.0, s_v, shape=n_leaves - 1)
            share = pt.special.softmax(pm.Deterministic("leaf_effect", _zero_sum(z), dims="geocode"))
        log_split = pm.Normal("log_split", 2.0, 1.5, dims=("spine_level", "cell"))
        mu = root_mean(table) * share[:, None] * pt.ones((1, len(table.cells)))
        counts = dp.GroupedNegativeBinomial(name, mu, [pm.math.exp(log_split[k]) for k in range(len(groupings))],
                                            ROOT_SHAPE, groupings, dims=("geocode", "cell"))
        table.release.observe("nmf", counts)
    return model


def root_mean(table: CensusTable) -> float:
    """m0 of the module docstring: the mean absolute published value / 10 (at least 1) x the
    number of leaves."""
    return max(float(np.mean(np.abs(table.release.values))) / 10.0, 1.0) * len(table.leaves)


def empirical_bayes_settings(model, leaves: str, uncertainty: str) -> dict:
    """``dp.sample``'s ``empirical_bayes=`` for a :func:`census_model` fitted at ``leaves``: the
    hyperparameters' ``uncertainty``, and at Block leaves with estimated leaf sizes the leaf
    sizes (``leaf_effect_z``, one a block) and their scale (``sd_leaf``) **drawn with the
    counts** rather than estimated (:mod:`dpinfer.inference.empirical_bayes`): thousands of
    per-block quantities, each informed by its block's counts, are not hyperparameters;
    estimated as if they were, the estimate drifted along the leaf sizes' scale and missed full
    Bayes at the blocks; and their scale, whose information all flows through them, is the
    estimate's slowest coordinate when it is estimated while they are drawn one NUTS
    transition an iteration (``benchmarks/README.md``, "Blocks as leaves")."""
    drawn = ["leaf_effect_z", "sd_leaf"] if leaves == "Block" and "leaf_effect_z" in model.named_vars else []
    return {"uncertainty": uncertainty, "drawn": drawn}


def published_leaf_totals(table: CensusTable) -> np.ndarray:
    """Each leaf's published total population (n_leaves,): its exact total where a constraint
    fixes it, else the value of its most precise measurement of all the cells (the smallest
    noise variance, summed noises counted). Raises if a leaf has neither."""
    sums = table.release.sums
    leaf = sums.area_leaf[sums.term_area]
    best = np.full(len(table.leaves), np.inf)
    total = np.full(len(table.leaves), np.nan)
    for r in np.flatnonzero((leaf >= 0) & sums.term_cells.all(axis=1)):
        kind, sigma2, m = sums.tables.params(int(sums.term_table[r]))
        variance = 0.0 if kind == "eq" else sigma2 * m if kind == "dg" else np.inf
        if variance < best[leaf[r]]:
            best[leaf[r]], total[leaf[r]] = variance, float(sums.term_value[r])
    missing = np.flatnonzero(np.isnan(total))
    if missing.size:
        raise ValueError(f"leaf_sizes='published' needs every leaf's total; leaves "
                         f"{list(table.leaves[missing[:5]])} have no measurement or equality of all the cells")
    return total


def _spine_parents(table: CensusTable) -> list[np.ndarray]:
    """Rows (in ``table.areas``) of each leaf's ancestors, level by level from its parent up to
    the root (the leaf itself when it is the root)."""
    parent = table.areas.parent.to_numpy()
    leaves = table.release.sums.leaf_area
    chain = [parent[leaves] if np.all(parent[leaves] >= 0) else leaves]
    while np.all(parent[chain[-1]] >= 0):
        chain.append(parent[chain[-1]])
    return chain


def spine_groupings(table: CensusTable) -> list[np.ndarray]:
    """Each leaf's group at each level of the spine above the leaves up to the root (finest
    first): the groupings of :func:`census_model`'s GroupedNegativeBinomial."""
    return [np.unique(rows, return_inverse=True)[1].astype(np.int64) for rows in _spine_parents(table)]


def groupings_levels(table: CensusTable) -> list[str]:
    """The spine level of each of :func:`spine_groupings` (e.g. ["Tract", "County", "State", "US"])."""
    level = table.areas.level.to_numpy()
    return [str(level[rows[0]]) for rows in _spine_parents(table)]


def _zero_sum(z):
    """The n-vector v summing to 0 whose coordinates in an orthonormal basis of that subspace
    are z (n - 1): PyMC's ZeroSumTransform taken backwards (an isometry), so z ~ N(0, s^2 I)
    gives v ~ N(0, s^2 (I - 11'/n)), PyMC's ZeroSumNormal. Not pm.ZeroSumNormal itself because
    the compiled engine does not take one with dims yet (its value variable's shape is left
    without an input when the dims are frozen); with ``shape=`` it does."""
    from pymc.distributions.transforms import ZeroSumTransform

    return ZeroSumTransform([-1]).backward(z)
