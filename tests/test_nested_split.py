"""Nested sums split into shards and the upper areas that join them (dpinfer.lattice.nested.split):
the split sweeps against the exhaustive enumeration of test_nested_sums's multi-level table
(root 0, mid 1, leaves 2 and 3; measurements at every level, an equality at the root), for
each way of cutting that tree, with Poisson counts and with the census model's prior
(GroupedNegativeBinomial: a group-mixing factor at the mid, in a shard or in the upper areas)."""

import numpy as np
import pytest
from scipy import stats
from test_nested_sums import (ALPHA, LEAF_ALPHA, MU, C, LAM, TOTAL, _chi2_pvalue, check_chain_means,
                              enumerate_posterior, grouped_prior, small_table)

from dpinfer._random_stream import new_stream
from dpinfer.lattice.nested.split import SplitGibbs

PARTS = {"each leaf a shard": [[2], [3]], "both leaves one shard": [[2, 3]], "the mid's subtree": [[1]]}
FAR = 20.0 * MU  # leaf means far above the counts the root's equality allows: large tilts
ROOT_SPLIT = 2.0  # the root's split concentration (a group above the mid's)


@pytest.fixture(scope="module")
def posterior():
    states, logp = enumerate_posterior()
    return states, np.exp(logp), logp


@pytest.fixture(scope="module")
def grouped_posterior():
    states, logp = enumerate_posterior(grouped_prior)
    return states, np.exp(logp), logp


@pytest.fixture(scope="module")
def far_posterior():
    states, logp = enumerate_posterior(lambda x: grouped_prior(x, FAR))
    return states, np.exp(logp), logp


def tilted_split_gibbs(parts):
    """The split sampler of ``parts`` with the census prior's factors at two levels, the mid
    (area 1, split concentration LEAF_ALPHA) and the root (area 0: shape ALPHA, split
    ROOT_SPLIT), written with their tilts before each sweep; leaf means FAR. The root has one
    child, so the law is grouped_prior's with FAR: the mid's factor NB(S; M, a) / NB(S; M, A)
    with a = ROOT_SPLIT M / M = ROOT_SPLIT, times the root's NB(S; M, ALPHA) / NB(S; M, ROOT_SPLIT).
    Returns (the sampler, each shard's untilted prior table, the groups' (a, A, M))."""
    sums, _ = small_table()
    hi = TOTAL + 1 + np.arange(LAM.size).reshape(LAM.shape) % 3
    M = FAR.sum(0)
    mixed, tables = sums.with_group_mixing([1, 0])
    parameters = np.stack([np.stack([np.full(C, ROOT_SPLIT), np.full(C, LEAF_ALPHA), M], -1),
                           np.stack([np.full(C, ALPHA), np.full(C, ROOT_SPLIT), M], -1)])
    g = SplitGibbs(mixed.split(parts), 0, hi, mixing=([1, 0], tables, [0, 0], [1, -1]))
    shape = LEAF_ALPHA * FAR / M
    p = shape / (shape + FAR)
    priors = [stats.nbinom.logpmf(grid, shape[leaves].reshape(-1)[rows], p[leaves].reshape(-1)[rows])
              for (grid, rows), leaves in zip(g.shard_grids(), g.split.shard_leaves)]
    return g, priors, parameters


def split_gibbs(parts, grouped: bool = False):
    """The split sampler of ``parts`` and each shard's flat prior table: Poisson(LAM) counts,
    or (``grouped``) test_nested_sums.grouped_table's prior, independent NB(MU, A pi) leaves
    with the group-mixing factor of every cell at the mid area (area 1)."""
    sums, _ = small_table()
    hi = TOTAL + 1 + np.arange(LAM.size).reshape(LAM.shape) % 3  # as test_nested_sums.gibbs
    if grouped:
        sums, _ = sums.with_group_mixing([1], ALPHA, LEAF_ALPHA, MU.sum(0)[None, :])
    g = SplitGibbs(sums.split(parts), 0, hi)
    shape = LEAF_ALPHA * MU / MU.sum(0)
    priors = [stats.nbinom.logpmf(grid, shape[leaves].reshape(-1)[rows],
                                  (shape / (shape + MU))[leaves].reshape(-1)[rows]) if grouped else
              stats.poisson.logpmf(grid, LAM[leaves].reshape(-1)[rows])
              for (grid, rows), leaves in zip(g.shard_grids(), g.split.shard_leaves)]
    return sums, g, priors


@pytest.mark.parametrize("parts", PARTS.values(), ids=PARTS.keys())
def test_the_pieces_hold_every_term_and_give_back_the_counts(posterior, parts):
    sums, _ = small_table()
    split = sums.split(parts)
    states = posterior[0]
    assert split.top.term_value.size + sum(s.term_value.size for s in split.shards) == sums.term_value.size
    for x in states[[0, 17, 300]]:
        x_top, xs = split.pieces(x)
        np.testing.assert_array_equal(split.whole(xs, 2), x)
        # every term's sum, read on the piece that holds it, is the whole tree's
        whole = sorted(zip(sums.term_name, sums.term_sums(x)))
        pieces = sorted(list(zip(split.top.term_name, split.top.term_sums(x_top)))
                        + [t for s, xk in zip(split.shards, xs) for t in zip(s.term_name, s.term_sums(xk))])
        assert pieces == whole
        assert split.top.log_weight(x_top) + sum(s.log_weight(xk) for s, xk in zip(split.shards, xs)) \
            == pytest.approx(sums.log_weight(x))


@pytest.mark.parametrize("parts", PARTS.values(), ids=PARTS.keys())
def test_a_split_sweep_keeps_the_posterior(posterior, parts):
    """4,000 chains started at exact posterior draws, one split sweep each: again the posterior
    (chi-square on every count's marginal and on the first leaf's total, Bonferroni at 1e-3);
    the pieces' sums stay their counts'."""
    assert min(one_split_sweep_pvalues(posterior, parts, 4000)) > 1e-3 / 9


@pytest.mark.parametrize("parts", PARTS.values(), ids=PARTS.keys())
def test_a_split_sweep_with_the_census_prior_keeps_the_posterior(grouped_posterior, parts):
    """As above with the census model's prior: the group-mixing factor of the mid area is in
    the upper areas (the leaves as shards, or both in one shard, whose root is a new area
    below the mid) or in a shard (the mid's subtree)."""
    split = split_gibbs(parts, grouped=True)[1].split
    in_top = any(name.startswith("group mixing") for name in split.top.term_name)
    assert in_top == (parts != PARTS["the mid's subtree"])
    assert min(one_split_sweep_pvalues(grouped_posterior, parts, 4000, grouped=True)) > 1e-3 / 9


@pytest.mark.parametrize("parts", PARTS.values(), ids=PARTS.keys())
def test_a_split_sweep_with_tilted_factors_in_every_piece_keeps_the_posterior(far_posterior, parts):
    """The census prior's factors at the mid and the root, each tilted towards the current
    sums before the sweep, with leaf means 20 times what the counts can reach (tilts of
    about a nat a person): each shard's leaves or its county-like group take the tilt of the
    group above them in the upper areas from the driver. Again the posterior."""
    g, _, parameters = tilted_split_gibbs(parts)
    outer = [m.outer for m in g.mixing_shards]
    assert outer == ([0, 0] if len(parts) == 2 else [0] if parts == [[2, 3]] else [1])  # the group above
    x_top = g.split.pieces(far_posterior[0][np.argmax(far_posterior[1])])[0]
    state = (x_top, g.split.top.area_sums(x_top))
    assert max(np.abs(t).max() for t in g.refill_top(state, parameters[g.mixing_top.groups])) > 0.5
    assert min(one_split_sweep_pvalues(far_posterior, parts, 4000, tilted=True)) > 1e-3 / 9


def test_a_tilt_that_is_not_undone_is_caught(far_posterior, monkeypatch):
    """Without the tilt of the group above a shard (its leaves' priors left untilted while the
    upper areas' factor is tilted), the law changes and the check fails."""
    def no_outer_tilt(self, state, parameters):
        return [np.zeros_like(t) for t in real(self, state, parameters)]

    real = SplitGibbs.refill_top
    monkeypatch.setattr(SplitGibbs, "refill_top", no_outer_tilt)
    assert min(one_split_sweep_pvalues(far_posterior, PARTS["each leaf a shard"], 4000, tilted=True)) < 1e-6


def one_split_sweep_pvalues(posterior, parts, n_starts, grouped: bool = False, tilted: bool = False) -> list:
    """p-values of chi-squares of every count's marginal and the first leaf's total, after one
    split sweep from each of ``n_starts`` exact posterior draws, against the enumeration
    (``tilted``: :func:`tilted_split_gibbs`'s sampler, refilled before each sweep)."""
    if tilted:
        g, priors, parameters = tilted_split_gibbs(parts)
    else:
        g, priors = split_gibbs(parts, grouped)[1:]
    states, p, _ = posterior
    rng = np.random.default_rng(2)
    starts = rng.choice(len(states), size=n_starts, p=p)
    out = np.empty((starts.size, 2, C), np.int64)
    split, top = g.split, g.split.top
    shards = g.start(states[starts[0]], priors, rng)
    work, stream, stat = g.top_workspace(), new_stream(rng), np.zeros(3, np.int64)
    for i, s in enumerate(starts):
        x_top, xs = split.pieces(states[s])
        for shard, xk in zip(shards, xs):
            shard.set_counts(xk)
        state = (x_top, top.area_sums(x_top), top.term_sums(x_top))
        if tilted:
            g.refill(shards, state, parameters, priors)
        assert g.sweep(shards, state, work, stream, stat) == 0
        if i < 50:  # the sums the sweep keeps
            np.testing.assert_array_equal(state[1], top.area_sums(x_top))
            np.testing.assert_array_equal(state[2], top.term_sums(x_top))
            for shard in shards:
                np.testing.assert_array_equal(shard.S, shard.gibbs.sums.area_sums(shard.x))
                np.testing.assert_array_equal(shard.t, shard.gibbs.sums.term_sums(shard.x))
            np.testing.assert_array_equal(x_top, split.pieces(split.whole([sh.x for sh in shards], 2))[0])
        out[i] = split.whole([sh.x for sh in shards], 2)
    pvalues = [_chi2_pvalue(np.bincount(out[:, leaf, c], minlength=TOTAL + 1).astype(float),
                            np.bincount(states[:, leaf, c], weights=p, minlength=TOTAL + 1))
               for leaf in range(2) for c in range(C)]
    pvalues.append(_chi2_pvalue(np.bincount(out.sum(2)[:, 0], minlength=TOTAL + 1).astype(float),
                                np.bincount(states.sum(2)[:, 0], weights=p, minlength=TOTAL + 1)))
    return pvalues


@pytest.mark.validation
@pytest.mark.parametrize("parts", PARTS.values(), ids=PARTS.keys())
def test_a_long_split_chain_reaches_the_posterior_from_a_bad_start(posterior, parts):
    """20,000 split sweeps from a start in the tail: every count's mean within 5 batch-means
    standard errors of the enumeration; every draw keeps the equality and the bound."""
    _, g, priors = split_gibbs(parts)
    states, p, _ = posterior
    draws = check_chain_means(g, np.array([[6, 0, 0, 0], [0, 0, 0, 4]]), priors, states, p, 3)
    assert np.all(draws.sum((1, 2)) == TOTAL)
    assert np.all(draws[:, :, :2].sum((1, 2)) <= 6)


def test_a_split_move_that_breaks_the_law_is_caught(posterior, monkeypatch):
    """The checks fail when the upper areas ignore the shards' messages (each root's sum drawn
    from the upper terms alone): the tests above can fail."""
    import dpinfer.lattice.nested.split as split_module

    flat = split_module.with_injected

    def ignore_messages(work, messages):
        return flat(work, [(np.ones_like(w), lo) for w, lo in messages])

    monkeypatch.setattr(split_module, "with_injected", ignore_messages)
    assert min(one_split_sweep_pvalues(posterior, PARTS["each leaf a shard"], 1000)) < 1e-6


@pytest.mark.parametrize("parts,message", [
    ([[2], [1]], "under another part"),
    ([[2]], "cover every leaf"),
    ([[0]], "children of one area"),
    ([[1, 2]], "children of one area"),
    ([[2], [2, 3]], "in two parts"),
    ([], "non-empty"),
    ([[7]], "out of range"),
])
def test_bad_parts_are_refused(parts, message):
    sums, _ = small_table()
    with pytest.raises(ValueError, match=message):
        sums.split(parts)


def test_shards_on_dask_workers_draw_what_they_draw_in_this_process(posterior, client):
    """Each shard a Dask actor on a 2-worker LocalCluster: the same draws as the shards in this
    process from the same seed (each shard and the driver draw from their own streams)."""
    _, g, priors = split_gibbs(PARTS["each leaf a shard"])
    x0 = posterior[0][np.argmax(posterior[1])]
    here, info_here = g.run(x0, priors, 30, np.random.default_rng(5))
    there, info_there = g.run(x0, priors, 30, np.random.default_rng(5), client=client)
    np.testing.assert_array_equal(here, there)
    assert info_here == info_there and info_here["moves"] > 0
    assert np.any(here != x0)


def test_tilted_shards_on_dask_workers_draw_what_they_draw_in_this_process(far_posterior, client):
    """The same with the factors refilled and tilted before each sweep (the driver's tilts sent
    to the actors)."""
    g, priors, parameters = tilted_split_gibbs(PARTS["the mid's subtree"])
    x0 = far_posterior[0][np.argmax(far_posterior[1])]
    here, info_here = g.run(x0, priors, 30, np.random.default_rng(5), parameters=parameters)
    there, info_there = g.run(x0, priors, 30, np.random.default_rng(5), client=client, parameters=parameters)
    np.testing.assert_array_equal(here, there)
    assert info_here == info_there and np.any(here != x0)


@pytest.mark.parametrize("parts", ["23", [["2"], ["3"]], [[2.0], [3.0]]])
def test_parts_that_are_not_area_indices_are_refused(parts):
    sums, _ = small_table()
    with pytest.raises(TypeError, match="parts must be a list of lists of area indices"):
        sums.split(parts)


def test_bad_sampler_inputs_are_refused(posterior):
    sums, g, priors = split_gibbs(PARTS["each leaf a shard"])
    x0 = posterior[0][np.argmax(posterior[1])]
    with pytest.raises(TypeError, match="split must be a SplitSums"):
        SplitGibbs(sums, 0, 12)
    with pytest.raises(ValueError, match="one flat table per shard"):
        g.run(x0, priors[:1], 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="prior must be the shard's flat table"):
        g.run(x0, [priors[0], priors[1][:-1]], 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_sweeps must be a whole number >= 1"):
        g.run(x0, priors, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="breaks"):  # a start off the root's equality
        g.run(x0 + 1, priors, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="parameters must be given exactly when"):
        g.run(x0, priors, 1, np.random.default_rng(0), parameters=np.ones((1, C, 3)))
    tilted, tilted_priors, parameters = tilted_split_gibbs(PARTS["each leaf a shard"])
    with pytest.raises(ValueError, match="parameters must be given exactly when"):
        tilted.run(x0, tilted_priors, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"parameters must be the upper areas' groups' \(a, A, M\) by cell"):
        tilted.run(x0, tilted_priors, 1, np.random.default_rng(0), parameters=parameters[:, :2])
    mixed, tables = small_table()[0].with_group_mixing([1, 0])
    for mixing in (([1, 0], tables[:1], [0, 0], [1, -1]), ([1, 9], tables, [0, 0], [1, -1]),
                   ([1, 0], tables, [0, 2], [1, -1]), ([1, 0], tables, [0], [1, -1]), ([1, 0], tables, [0, 0], [1, 2])):
        with pytest.raises(ValueError, match="tables must be one table index|areas must be areas|leaf_group must be"
                                             "|group_parent must be"):
            SplitGibbs(mixed.split(PARTS["each leaf a shard"]), 0, 12, mixing=mixing)
    with pytest.raises(ValueError, match="2 groups above them outside the shard"):  # each leaf its own group
        SplitGibbs(mixed.split(PARTS["the mid's subtree"]), 0, 12, mixing=([0, 0], tables, [0, 1], [-1, -1]))
