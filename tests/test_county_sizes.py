"""The census model's leaf sizes split by county (dpinfer.io.nmf.county_sizes): the counties'
shape models and the sizes' model add up to the whole model's log density (iid leaf sizes,
GroupedNegativeBinomial counts, written independently here), so a scan of the counties'
shapes in parallel given their sizes, then the sizes, targets the whole model's posterior."""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import dpinfer as dp
from dpinfer.io.nmf.county_sizes import SUMMARIES, county_leaves, county_shapes_model, county_sizes_model
from dpinfer.io.nmf.model import ROOT_SHAPE

C = 3
ROOT_MEAN = 40.0


def small_state(seed: int = 0):
    """3 counties of 2 tracts of 2 block groups of 2 or 3 blocks, one state, one nation:
    each block's group at each level (finest first), the county level's index, counts and
    the split concentrations (5 levels by C cells)."""
    rng = np.random.default_rng(seed)
    bg_sizes = rng.integers(2, 4, size=12)
    bg = np.repeat(np.arange(12), bg_sizes)
    tract, county = bg // 2, bg // 4
    groupings = [bg, tract, county, np.zeros_like(bg), np.zeros_like(bg)]
    counts = rng.poisson(3.0, size=(bg.size, C))
    log_split = rng.normal(1.0, 0.8, size=(len(groupings), C))
    return groupings, 2, counts, log_split


def _whole_model(groupings, log_split):
    """The whole state: v iid N(0, s^2), s ~ HalfNormal(1), the counts the census model's
    GroupedNegativeBinomial at mu = ROOT_MEAN softmax(v)."""
    with pm.Model() as model:
        s = pm.HalfNormal("sd_leaf", 1.0)
        v = pm.Normal("v", 0.0, s, shape=groupings[0].size)
        mu = ROOT_MEAN * pt.special.softmax(v)[:, None] * pt.ones((1, C))
        dp.GroupedNegativeBinomial("counts", mu, [pt.exp(log_split[k]) for k in range(len(groupings))],
                                   ROOT_SHAPE, groupings)
    return model


def whole_model_logp(groupings, counts, log_split):
    """log p(v, s, x) of :func:`_whole_model`, as a function of (v, s)."""
    f = _whole_model(groupings, log_split).compile_logp(jacobian=False)
    return lambda v, s: float(f({"sd_leaf_log__": np.log(s), "v": v, "counts": counts}))


def split_logp(groupings, county_level, counts, log_split, shards):
    """log p(v, s, x) up to a constant from the split models: every shard's shape model at its
    counties' L and shapes, plus the sizes' model less its normal terms (which are the shards'
    through the summaries); also returns the summaries it passed."""
    county = groupings[county_level]
    shard_models = [county_shapes_model(groupings, county_level, part, counts[county_leaves(county, np.array(part))[0]],
                                        log_split, np.zeros(3), 1.0) for part in shards]
    shard_logps = [m.compile_logp() for m in shard_models]
    summaries_of = {id(m): m.compile_fn([m[name] for name in SUMMARIES] + [m["leaf_effect"]], inputs=[m["leaf_shape"]])
                    for m in shard_models}
    sizes = county_sizes_model(groupings, county_level, log_split,
                               {name: np.ones((3, C) if name == "county_counts" else 3) for name in SUMMARIES})
    f_sizes = sizes.compile_logp(jacobian=False)

    def logp(v, s):
        L = np.array([np.log(np.exp(v[county == q]).sum()) for q in range(3)])
        summaries = {name: np.zeros((3, C) if name == "county_counts" else 3) for name in SUMMARIES}
        total = 0.0
        for part, model, f in zip(shards, shard_models, shard_logps):
            leaves, _ = county_leaves(county, np.array(part))
            z = v[leaves] - np.array([v[county == q].mean() for q in county[leaves]])
            with model:
                pm.set_data({"county_log_size": L, "sd_leaf": s})
            total += float(f({"leaf_shape": z}))
            values = summaries_of[id(model)]({"leaf_shape": z})
            np.testing.assert_allclose(values[-1], v[leaves], atol=1e-12)  # v given back from (L, z)
            for name, value in zip(SUMMARIES, values):
                summaries[name][part] = value
        with sizes:
            pm.set_data(summaries)
        n, lse, squares, _ = (summaries[name] for name in SUMMARIES)
        normal = np.sum(-n * np.log(s) - (n * (L - lse) ** 2 + squares) / (2 * s ** 2))
        total += float(f_sizes({"county_log_size": L, "sd_leaf_log__": np.log(s)})) - normal
        return total, summaries

    return logp


def test_iid_sizes_have_the_zero_sum_normals_law_of_the_shares():
    """The module's premise: v iid N(0, s^2) integrated over its mean (v = u + m 1, u summing to
    0) has the density of census_model's zero-sum v = _zero_sum(z), z iid N(0, s^2) in n - 1
    coordinates, times 1/sqrt(n), at every s: so (s, the shares) have the same law and the
    same posterior. Quadrature over m at random (u, s)."""
    from scipy import integrate, stats

    from dpinfer.io.nmf.model import _zero_sum

    n, rng = 6, np.random.default_rng(3)
    z_var = pt.dvector("z")
    basis = np.stack([_zero_sum(z_var).eval({z_var: e}) for e in np.eye(n - 1)], axis=1)  # orthonormal
    for _ in range(8):
        s, z = float(rng.uniform(0.2, 2.0)), rng.normal(0.0, 1.0, n - 1)
        u = basis @ z
        at_0 = stats.norm.logpdf(u, 0.0, s).sum()  # the integrand's peak (u sums to 0)
        mass, _ = integrate.quad(lambda m: np.exp(stats.norm.logpdf(u + m, 0.0, s).sum() - at_0), -np.inf, np.inf,
                                 epsabs=1e-13, epsrel=1e-12)
        assert at_0 + np.log(mass) == pytest.approx(stats.norm.logpdf(z, 0.0, s).sum() - 0.5 * np.log(n), abs=1e-8)


@pytest.mark.parametrize("shards", [[[0, 1, 2]], [[2, 0], [1]], [[0], [1], [2]]], ids=["one", "two", "three"])
def test_the_split_models_add_up_to_the_whole_models_log_density(shards):
    """At 12 random (v, s), the whole model's log density less the split models' is one
    constant (to 1e-9), whatever the counties' shards; the summaries are n_q, log sum exp of
    the county's zero-sum shape, the sum of its squares and the county's counts."""
    groupings, county_level, counts, log_split = small_state()
    whole = whole_model_logp(groupings, counts, log_split)
    split = split_logp(groupings, county_level, counts, log_split, shards)
    rng = np.random.default_rng(1)
    gaps = []
    county = groupings[county_level]
    for _ in range(12):
        v, s = rng.normal(0.0, 1.2, size=county.size), float(rng.uniform(0.2, 2.0))
        total, summaries = split(v, s)
        gaps.append(whole(v, s) - total)
        for q in range(3):
            z = v[county == q] - v[county == q].mean()
            np.testing.assert_allclose([summaries[name][q] for name in SUMMARIES[:3]],
                                       [z.size, np.log(np.exp(z).sum()), np.sum(z ** 2)], rtol=1e-12)
            np.testing.assert_array_equal(summaries["county_counts"][q], counts[county == q].sum(0))
    assert np.ptp(gaps) < 1e-9, gaps


def test_a_wrong_split_is_caught():
    """The check above fails when the state's split among the counties is left out (the
    sizes' model without its splits): the test can fail."""
    groupings, county_level, counts, log_split = small_state()
    whole = whole_model_logp(groupings, counts, log_split)
    split = split_logp(groupings, county_level, counts, log_split, [[0], [1, 2]])
    state_split = split_logp(groupings[:county_level + 1], county_level, counts, log_split[:county_level + 1],
                             [[0], [1, 2]])
    rng = np.random.default_rng(2)
    gaps = [[], []]
    for _ in range(6):
        v, s = rng.normal(0.0, 1.2, size=counts.shape[0]), float(rng.uniform(0.2, 2.0))
        gaps[0].append(whole(v, s) - split(v, s)[0])
        gaps[1].append(whole(v, s) - state_split(v, s)[0])  # no level above the counties
    assert np.ptp(gaps[0]) < 1e-9 and np.ptp(gaps[1]) > 1e-3


@pytest.mark.parametrize("kwargs, message", [
    (dict(counties=[0, 0]), "counties must be distinct county indices 0 .. 2"),
    (dict(counties=[3]), "counties must be distinct county indices 0 .. 2"),
    (dict(counties="0"), "counties must be distinct county indices"),
    (dict(county_level=5), r"county_level must be the index of the counties' level in groupings \(0 .. 4\)"),
    (dict(county_level="2"), "county_level must be the index"),
    (dict(counts=np.ones((3, C))), "counts must be non-negative integers"),
    (dict(counts=-np.ones((9, C), int)), "counts must be non-negative integers"),
    (dict(groupings="abc"), "groupings must be a list of each leaf's group at each level"),
    (dict(groupings=[np.array([0, 0, 1]), np.array([0, 1, 1])]), "groupings: group.* must be coarser"),
    (dict(log_split=np.ones(C)), r"log_split must be finite numbers, a row per level of groupings \(5\)"),
    (dict(county_log_size=np.zeros(2)), "county_log_size must be 3 finite numbers, one per county"),
    (dict(county_log_size="abc"), "county_log_size must be 3 finite numbers, one per county"),
    (dict(sd_leaf=0.0), "sd_leaf must be a positive number, got 0.0"),
    (dict(sd_leaf="1"), "sd_leaf must be a positive number, got '1'"),
])
def test_bad_input_is_refused_by_name(kwargs, message):
    groupings, county_level, counts, log_split = small_state()
    args = dict(groupings=groupings, county_level=county_level, counties=[0], log_split=log_split,
                county_log_size=np.zeros(3), sd_leaf=1.0)
    args["counts"] = counts[county_leaves(groupings[county_level], np.array([0]))[0]]
    with pytest.raises(ValueError, match=message):
        county_shapes_model(**(args | kwargs))


@pytest.mark.parametrize("kwargs, message", [
    (dict(summaries={}), r"summaries must give \['county_leaves', .*missing"),
    (dict(summaries="county_counts"), r"summaries must give"),
    (dict(county_counts=np.ones(3)), r"summaries\['county_counts'\] must have shape \(3, 3\), got \(3,\)"),
    (dict(log_split=np.ones((4, C))), r"log_split must be finite numbers, a row per level of groupings \(5\)"),
    (dict(county_level=-1), "county_level must be the index"),
])
def test_the_sizes_model_refuses_bad_input_by_name(kwargs, message):
    groupings, county_level, _, log_split = small_state()
    summaries = {name: np.ones((3, C) if name == "county_counts" else 3) for name in SUMMARIES}
    if "county_counts" in kwargs:
        summaries["county_counts"] = kwargs.pop("county_counts")
    args = dict(groupings=groupings, county_level=county_level, log_split=log_split, summaries=summaries)
    with pytest.raises(ValueError, match=message):
        county_sizes_model(**(args | kwargs))


def sharded_fit(groupings, county_level, counts, log_split, **options):
    """dp.sample_sharded of the scan: the 3 counties' shape models as shards, the sizes' model
    as the shared model (2 chains; ``options``: shards, draws, tune, random_seed)."""
    county = groupings[county_level]

    def build(groups):
        leaves, _ = county_leaves(county, np.array(groups))
        return county_shapes_model(groupings, county_level, groups, counts[leaves], log_split, np.zeros(3), 1.0)

    shared = county_sizes_model(groupings, county_level, log_split,
                                {name: np.ones((3, C) if name == "county_counts" else 3) for name in SUMMARIES})
    return dp.sample_sharded(build, shared, [0, 1, 2], chains=2, progressbar=False, **options)


@pytest.mark.validation
def test_the_counties_sharded_give_the_whole_models_posterior():
    """dp.sample_sharded with each county a shard (its shape given the sizes) and the sizes'
    model as the shared model, the counts given: the counties' shares of the state, the
    leaves' shares of their counties and the scale s agree with one-machine NUTS on the whole
    model (iid sizes) within 5 standard errors of their difference (each side's Monte Carlo
    SE). Counts drawn with leaf sizes of log-sd 0.8, so s is well away from 0."""
    import arviz as az

    groupings, county_level, _, log_split = small_state()
    county = groupings[county_level]
    rng = np.random.default_rng(7)
    counts = rng.poisson(4.0 * np.exp(rng.normal(0.0, 0.8, size=county.size))[:, None] * np.ones((1, C)))

    sharded = sharded_fit(groupings, county_level, counts, log_split, shards=3, draws=2000, tune=1000, random_seed=3)
    whole = pm.observe(_whole_model(groupings, log_split), {"counts": counts})
    with whole:
        reference = pm.sample(2000, tune=1000, chains=2, random_seed=4, progressbar=False)

    def shares(v):  # (chains, draws, leaves) -> the counties' shares of the state, the leaves' of their county
        size = np.exp(v - v.max(-1, keepdims=True))
        by_county = np.stack([size[..., county == q].sum(-1) for q in range(3)], -1)
        return by_county / by_county.sum(-1, keepdims=True), size / by_county[..., county]

    for ours, theirs in zip(shares(sharded.posterior["leaf_effect"].values),
                            shares(reference.posterior["v"].values)):
        a, b = az.convert_to_dataset(ours), az.convert_to_dataset(theirs)
        se = np.hypot(az.mcse(a)["x"].values, az.mcse(b)["x"].values)
        z = (ours.mean((0, 1)) - theirs.mean((0, 1))) / se
        assert np.all(np.abs(z) < 5), z
    s = [az.convert_to_dataset(idata.posterior["sd_leaf"].values) for idata in (sharded, reference)]
    gap = float(s[0]["x"].mean() - s[1]["x"].mean()) / float(np.hypot(az.mcse(s[0])["x"], az.mcse(s[1])["x"]))
    assert abs(gap) < 5, gap


def test_on_sample_sharded_each_draws_leaf_sizes_add_up_to_its_county_sizes():
    """The shape models as sample_sharded's shards (models without a release: the counts are
    data) and the sizes' model as the shared model: each stored draw's leaf sizes (a shard's
    Deterministic of the shared sizes) sum to that draw's county sizes."""
    groupings, county_level, counts, log_split = small_state()
    county = groupings[county_level]

    idata = sharded_fit(groupings, county_level, counts, log_split, shards=2, draws=100, tune=100, random_seed=1)
    v = idata.posterior["leaf_effect"].values
    L = np.stack([np.log(np.exp(v[..., county == q]).sum(-1)) for q in range(3)], -1)
    np.testing.assert_allclose(L, idata.posterior["county_log_size"].values, atol=1e-9)
    assert np.ptp(L[..., 0]) > 0.05  # the sizes move
