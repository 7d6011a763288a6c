"""Validation tier (``make validate``): dp.sample_sharded on a LocalCluster against the
one-machine engine on the nation's 3,143 counties, and simulation-based calibration.

1. The nation (validation/sharded_nation.py), 2 chains x (1000 + 1000) each way, sharded by
   state over 2 workers: every hyperparameter's and 50 random counts' posterior means agree
   within 4 Monte Carlo standard errors (53 comparisons: a correct sampler exceeds 4 in some
   with probability about 0.3%), and the hyperparameters' two-sample KS p-values on draws
   thinned to their ESS exceed 0.001.
2. SBC (dpinfer.inference.sbc's randomised ranks and checks, alpha 0.01): tests/test_sharded.py's
   model of 4 groups of 2 cells with the group totals invariant, its parameters and counts
   drawn from the prior in each of 100 replications, fitted on 2 shards of a 2-worker
   LocalCluster; ranks of mu0, every m_g and every group's first count among 99 thinned draws.
"""

import sys
from pathlib import Path

import numpy as np
import pymc as pm
import pytest

import dpinfer as dp
from dpinfer.inference import sbc

distributed = pytest.importorskip("distributed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))

pytestmark = pytest.mark.validation


def test_the_nation_sharded_by_state_has_the_one_machine_posterior(client):
    import sharded_nation

    nation = sharded_nation.NationShards(3143)
    one = dp.sample(1000, tune=1000, chains=2, random_seed=1, model=nation.full_model(), progressbar=False)
    sharded = dp.sample_sharded(nation, nation.shared_model(), nation.groups, client=client, draws=1000,
                                tune=1000, chains=2, random_seed=2, weights=nation.cells_per_state,
                                progressbar=False)
    result = sharded_nation.compare(one, sharded, nation.truth)
    print(result)
    assert result["max_abs_z"] < 4.0
    assert result["min_ks_p"] > 1e-3


class Replicate:
    """tests/test_sharded.py's model with another release: the shard builder for Dask."""

    def __init__(self, release):
        self.release = np.asarray(release)

    def __call__(self, groups):
        groups = np.asarray(groups)
        local = np.repeat(np.arange(len(groups)), 2)
        mechanism = dp.Conditioned(dp.DoubleGeometric(epsilon=1.0), dp.Invariants.groups(local))
        with pm.Model() as model:
            mu0 = pm.Data("mu0", 0.0)
            m = pm.Normal("m", mu0, 1.0, shape=len(groups))
            x = pm.Poisson("x", pm.math.exp(m[local]))
            mechanism.observe("release", x, observed=self.release[groups].ravel())
            pm.Deterministic("m_g", m)
        return model


def test_sbc_of_the_sharded_sampler(client):
    from test_sharded import GROUPS, shared_model

    rng = np.random.default_rng(2024)
    reps, n_ranks = 100, 99
    ranks = {}
    mechanism = dp.Conditioned(dp.DoubleGeometric(epsilon=1.0), dp.Invariants.groups(np.repeat(np.arange(4), 2)))
    for _ in range(reps):
        mu0 = rng.standard_normal()
        m = mu0 + rng.standard_normal(4)
        x = rng.poisson(np.exp(np.repeat(m, 2)))
        release = mechanism.release(x, rng).reshape(4, 2)
        idata = dp.sample_sharded(Replicate(release), shared_model(), GROUPS, client=client, draws=500, tune=300,
                                  chains=2, random_seed=int(rng.integers(2**31)), progressbar=False)
        post = idata.posterior
        truth = {"mu0": (post["mu0"], mu0)}
        truth |= {f"m[{g}]": (post["m"][..., g], m[g]) for g in GROUPS}
        truth |= {f"x[{g}]": (post["x"][..., 2 * g], x[2 * g]) for g in GROUPS}
        for name, (draws, value) in truth.items():
            kept = sbc.thin(draws.values.reshape(-1), n_ranks)
            ranks.setdefault(name, []).append(int(sbc.randomised_ranks(kept, np.asarray(value), rng)))
    pit = {name: sbc.randomised_pit(np.array(r), n_ranks, rng) for name, r in ranks.items()}
    table = sbc.sbc_summary(pit, alpha=0.01, method="sharded")
    print(table.to_string())
    assert table["passed"].all(), table[~table["passed"]].to_string()
