"""The census model's leaf sizes split by county, for a state's blocks on workers.

:func:`~dpinfer.io.nmf.model.census_model` gives the leaves sizes w = softmax(v) with v a
zero-sum normal of scale s. The same shares (and so the same law of every count) come from
iid v_l ~ N(0, s^2): the projection of an iid normal vector on the zero-sum subspace is the
zero-sum normal, and softmax ignores the mean, which is independent of that projection.
Written iid, the leaves of county q enter the rest of the model through two things only:

* the shape of the sizes inside the county, z_q = v_q - mean(v_q) (its own splits among its
  tracts, block groups and blocks depend on ratios of its own sizes), and
* its size, L_q = log sum_{l in q} exp(v_l) (the state's split among its counties depends on
  the counties' sizes, and the levels above on their sums).

In the coordinates (L_q, z_q) the map back, v_q = (L_q - log sum exp z_q) 1 + z_q, has unit
Jacobian (z_q is v_q's zero-sum part and mean(v_q) = L_q - log sum exp z_q, a triangular map
with unit diagonal), so the density of (L, z) is the iid normal density at v(L, z). Hence a
Gibbs scan whose steps may run on all counties at once:

* **each county's shape given every L** (a worker per run of counties,
  :func:`county_shapes_model`): the normal terms of its leaves and its own splits, nothing of
  any other county; the counties' shapes are independent given the L's, so moving them in
  parallel is a valid scan. (Moving each county's v given the other counties' current sizes
  is not: every county's conditional depends on the sum of all the sizes, and parallel moves
  each given the others' old sizes do not leave the posterior invariant.)
* **the sizes L and the scale s given the shapes** (the driver, :func:`county_sizes_model`):
  the normal terms through three numbers per county (its number of leaves n_q, log sum exp
  z_q and sum z_q^2: sum_l v_l^2 = n_q (L_q - log sum exp z_q)^2 + sum z_q^2, as sum z_q = 0),
  and the splits of the state (and any level above the counties) among the county sizes,
  through each county's counts summed over its leaves. These four summaries are the shape
  models' Deterministics (:data:`SUMMARIES`), so the two models are a ``shard`` and the
  ``shared_model`` of :func:`dpinfer.sample_sharded`.

Both are PyMC models with the counts as data (to be moved by the split sweep,
:mod:`dpinfer.lattice.nested.split`) and the split concentrations theta = ``log_split`` given
(an empirical-Bayes estimate: data of the shape models, a constant of the sizes' model). A
county's shape is a free vector zeta_q of its n_q leaves with z_q = zeta_q - mean(zeta_q);
zeta_q's mean, which nothing else sees, is given its own standard normal along the unit
direction (the term -n_q mean(zeta_q)^2 / 2), so the law of z_q is unchanged and NUTS sees no
flat direction.

The splits are the Dirichlet-multinomial laws of :class:`~dpinfer.GroupedNegativeBinomial`
with its rates summed out: an area h of level k with sum S_h[c] splits among its children j
(sums S_j[c], size shares w_j = W_j / W_h, W the summed exp(v) of an area's leaves) with

    log p = sum_c [lgamma(A_k[c]) - lgamma(A_k[c] + S_h[c])
                   + sum_j (lgamma(A_k[c] w_j + S_j[c]) - lgamma(A_k[c] w_j))] + (a term of x alone),

A_k = exp(log_split[k]) (module docstring of :mod:`dpinfer.io.nmf.model`). The nation's rate
(the root's negative binomial) has the mean of all the leaves, which no size changes.
"""

from __future__ import annotations

import numpy as np

SUMMARIES = ("county_leaves", "county_log_sum_exp", "county_sum_squares", "county_counts")


def county_shapes_model(groupings: list, county_level: int, counties, counts, log_split, county_log_size,
                        sd_leaf: float):
    """The PyMC model of the shapes of ``counties`` (indices of level ``county_level`` of
    ``groupings``) given every county's size: free ``leaf_shape`` (the counties' leaves in
    :func:`county_leaves` order), data ``counts`` (those leaves' counts), ``log_split`` (every
    level's, (n_levels, n_cells)), ``county_log_size`` (every county's L) and ``sd_leaf``; the
    Deterministics of :data:`SUMMARIES` (one entry per county of ``counties``, in their order)
    and ``leaf_effect`` (the leaves' v). ``groupings``: each leaf's group at each level above
    the leaves, finest first (:func:`~dpinfer.io.nmf.model.spine_groupings`)."""
    import pymc as pm
    import pytensor.tensor as pt

    groupings, county_level = _checked_levels(groupings, county_level)
    log_split = _checked_log_split(log_split, len(groupings))
    counties = _checked_counties(counties, groupings[county_level])
    leaves, county = county_leaves(groupings[county_level], counties)
    n = np.bincount(county, minlength=counties.size).astype(float)
    x = _checked_counts("counts", counts, (leaves.size, np.shape(log_split)[1]), "each leaf of the counties")
    n_counties = int(groupings[county_level].max()) + 1
    sizes = np.asarray(county_log_size)
    if sizes.shape != (n_counties,) or sizes.dtype.kind not in "iuf" or not np.all(np.isfinite(sizes)):
        raise ValueError(f"county_log_size must be {n_counties} finite numbers, one per county; "
                         f"got shape {sizes.shape}")
    if (isinstance(sd_leaf, bool) or not isinstance(sd_leaf, (int, float, np.integer, np.floating))
            or not np.isfinite(sd_leaf) or sd_leaf <= 0):
        raise ValueError(f"sd_leaf must be a positive number, got {sd_leaf!r}")
    levels = [np.unique(g[leaves], return_inverse=True)[1] for g in groupings[:county_level + 1]]
    with pm.Model() as model:
        x_data = pm.Data("counts", x)
        theta = pm.Data("log_split", log_split)
        L = pm.Data("county_log_size", sizes.astype(float))[counties]
        s = pm.Data("sd_leaf", float(sd_leaf))
        zeta = pm.Flat("leaf_shape", shape=leaves.size)
        mean = _by_group(zeta, county, counties.size) / n
        z = zeta - mean[county]
        z_max = pt.max(z)
        lse = pt.log(_by_group(pt.exp(z - z_max), county, counties.size)) + z_max
        v = pm.Deterministic("leaf_effect", L[county] - lse[county] + z)
        pm.Potential("leaf_sizes", _normal_terms(v, s) - pt.sum(n * mean ** 2) / 2)
        size = pt.exp(z - z_max)  # proportional to exp(v) within each county: the splits' ratios
        pm.Potential("splits", sum(_split_log_density(size, x_data, levels, k, pt.exp(theta[k]))
                                   for k in range(county_level + 1)))
        pm.Deterministic("county_leaves", pt.as_tensor(n))
        pm.Deterministic("county_log_sum_exp", lse)
        pm.Deterministic("county_sum_squares", _by_group(z ** 2, county, counties.size))
        pm.Deterministic("county_counts", _by_group(x_data.astype("float64"), county, counties.size))
    return model


def county_sizes_model(groupings: list, county_level: int, log_split, summaries: dict, *,
                       log_split_data: bool = False):
    """The PyMC model of every county's size L (free ``county_log_size``) and the leaves' scale
    (free ``sd_leaf`` ~ HalfNormal(1)) given the counties' shapes and counts through
    ``summaries`` (data named as :data:`SUMMARIES`, a row per county; ``county_counts``
    (n_counties, n_cells) whole numbers) and ``log_split`` (a constant, or with
    ``log_split_data`` a ``pm.Data`` of that name, for a caller that changes it between steps:
    the state scan's empirical-Bayes estimate): the normal terms of every leaf and the splits
    of the levels above the counties."""
    import pymc as pm
    import pytensor.tensor as pt

    groupings, county_level = _checked_levels(groupings, county_level)
    log_split = _checked_log_split(log_split, len(groupings))
    n_counties = int(groupings[county_level].max()) + 1
    first = np.unique(groupings[county_level], return_index=True)[1]  # a leaf of each county
    levels = [g[first] for g in groupings[county_level + 1:]]
    missing = sorted(set(SUMMARIES) - set(summaries))
    if missing:
        raise ValueError(f"summaries must give {list(SUMMARIES)}, a row per county; missing {missing}")
    shapes = {name: (n_counties, np.shape(log_split)[1]) if name == "county_counts" else (n_counties,)
              for name in SUMMARIES}
    for name, shape in shapes.items():
        if np.shape(summaries[name]) != shape:
            raise ValueError(f"summaries[{name!r}] must have shape {shape}, got {np.shape(summaries[name])}")
    with pm.Model() as model:
        data = {name: pm.Data(name, np.asarray(summaries[name], dtype=float)) for name in SUMMARIES}
        theta = pm.Data("log_split", log_split) if log_split_data else pt.as_tensor(log_split)
        L = pm.Flat("county_log_size", shape=n_counties)
        s = pm.HalfNormal("sd_leaf", 1.0)
        n, lse, squares, X = (data[name] for name in SUMMARIES)
        pm.Potential("leaf_sizes", pt.sum(-n * pt.log(s) - (n * (L - lse) ** 2 + squares) / (2 * s ** 2)))
        if levels:
            size = pt.exp(L - pt.max(L))
            pm.Potential("splits", sum(
                _split_log_density(size, X, levels, k, pt.exp(theta[county_level + 1 + k]))
                for k in range(len(levels))))
    return model


def county_leaves(county_of_leaf: np.ndarray, counties: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the leaves of ``counties`` in increasing order, each one's position in ``counties``)."""
    leaves = np.flatnonzero(np.isin(county_of_leaf, counties))
    position = np.empty(int(county_of_leaf.max()) + 1, dtype=np.int64)
    position[counties] = np.arange(counties.size)
    return leaves, position[county_of_leaf[leaves]]


def _normal_terms(v, s):
    """sum_l log N(v_l; 0, s^2) without the constant -log(2 pi) / 2 per leaf."""
    import pytensor.tensor as pt

    return pt.sum(-pt.log(s) - v ** 2 / (2 * s ** 2))


def _by_group(values, group: np.ndarray, n_groups: int):
    """The sums of ``values`` (first axis) over each group of ``group``."""
    import pytensor.tensor as pt

    values = pt.as_tensor(values)
    return pt.inc_subtensor(pt.zeros((n_groups, *[values.shape[i] for i in range(1, values.ndim)]),
                                     dtype=values.dtype)[group], values)


def _split_log_density(size, x, levels: list, k: int, A):
    """The Dirichlet-multinomial splits (module docstring) of the groups of ``levels[k]`` among
    their children (the units when k = 0, else the groups of ``levels[k - 1]``): ``size`` and
    ``x`` (units, n_cells) the units' sizes (up to a factor common to each group) and counts,
    ``levels`` each unit's group at each level, ``A`` (n_cells,) the concentration."""
    import pytensor.tensor as pt

    if k == 0:
        W, S, parent = size, pt.as_tensor(x).astype("float64"), levels[0]
    else:
        child = levels[k - 1]
        n_children = int(child.max()) + 1
        W = _by_group(size, child, n_children)
        S = _by_group(pt.as_tensor(x).astype("float64"), child, n_children)
        parent = np.empty(n_children, dtype=np.int64)
        parent[child] = levels[k]
    n_parents = int(parent.max()) + 1
    share = W / _by_group(W, parent, n_parents)[parent]
    a = A[None, :] * share[:, None]
    S_parent = _by_group(S, parent, n_parents)
    return (pt.sum(pt.gammaln(A)[None, :] - pt.gammaln(A[None, :] + S_parent))
            + pt.sum(pt.gammaln(a + S) - pt.gammaln(a)))


def _checked_levels(groupings, county_level) -> tuple[list, int]:
    """The groupings as int64 arrays, checked as :func:`dpinfer.GroupedNegativeBinomial`'s
    (every level's groups numbered 0 .. n - 1, each inside one group of the next level)."""
    from dpinfer.distributions.grouped_negative_binomial import _checked_groups

    if isinstance(groupings, (str, bytes, np.ndarray)) or not isinstance(groupings, (list, tuple)):
        raise ValueError("groupings must be a list of each leaf's group at each level above the leaves, "
                         f"finest first (spine_groupings), got {type(groupings).__name__}")
    try:
        groupings = list(_checked_groups(list(groupings)))
    except ValueError as err:
        raise ValueError(f"groupings: {err}") from None
    if isinstance(county_level, bool) or not isinstance(county_level, (int, np.integer)) or not (
            0 <= county_level < len(groupings)):
        raise ValueError(f"county_level must be the index of the counties' level in groupings "
                         f"(0 .. {len(groupings) - 1}), got {county_level!r}")
    return groupings, int(county_level)


def _checked_log_split(log_split, n_levels: int) -> np.ndarray:
    theta = np.asarray(log_split, dtype=float)
    if theta.ndim != 2 or theta.shape[0] != n_levels or not np.all(np.isfinite(theta)):
        raise ValueError(f"log_split must be finite numbers, a row per level of groupings ({n_levels}) and a "
                         f"column per cell; got shape {theta.shape}")
    return theta


def _checked_counties(counties, county_of_leaf: np.ndarray) -> np.ndarray:
    out = np.asarray(counties).reshape(-1)
    n = int(county_of_leaf.max()) + 1
    if (out.size == 0 or out.dtype.kind not in "iu" or len(set(out.tolist())) != out.size
            or np.any((out < 0) | (out >= n))):
        raise ValueError(f"counties must be distinct county indices 0 .. {n - 1}, got {np.asarray(counties).tolist()}")
    return out.astype(np.int64)


def _checked_counts(name: str, counts, shape: tuple, rows: str) -> np.ndarray:
    x = np.asarray(counts)
    if x.shape != shape or x.dtype.kind not in "iu" or np.any(x < 0):
        raise ValueError(f"{name} must be non-negative integers, a row for {rows} and a column per cell, "
                         f"shape {shape}; got shape {x.shape} of {x.dtype}")
    return x.astype(np.int64)
