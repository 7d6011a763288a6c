"""dp.sample_sharded: one posterior with its groups sharded over workers.

The reference model is small enough for its exact posterior by quadrature and enumeration:
    mu0 ~ N(0, 1)                                   (shared)
    m_g ~ N(mu0, 1), g = 0..3                        (a group's local parameter)
    x_gj ~ Poisson(exp(m_g)), j = 0, 1
    r_g = x_g + double geometric noise (epsilon 1) conditioned on each group's total
Given the release, x_g0 + x_g1 = T_g, and the likelihood of x_g is proportional to
a^(|r_g0 - x_g0| + |r_g1 - x_g1|), a = e^-1 (the conditioning's normaliser does not depend
on x). The exact means come from a grid over mu0 and m (trapezoid rule) with x_g0 summed
over 0..T_g; the sharded draws must agree within 5 Monte Carlo standard errors (ArviZ's
mcse), on 2 shards in this process and on a 2-worker LocalCluster (the same draws as in
this process for the same seed).
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats
from scipy.special import gammaln

import dpinfer as dp
from dpinfer.inference.checkpoint import CheckpointMismatchError
from dpinfer.inference.sharded import partition_groups

distributed = pytest.importorskip("distributed")

EPSILON = 1.0
RELEASE = np.array([[3, 6], [1, 2], [9, 4], [0, 5]])  # group g's two cells
TOTALS = RELEASE.sum(axis=1)
GROUPS = [0, 1, 2, 3]


def build_shard(groups, release=RELEASE):
    groups = np.asarray(groups)
    release = release[groups].ravel()
    local = np.repeat(np.arange(len(groups)), 2)
    mechanism = dp.Conditioned(dp.DoubleGeometric(epsilon=EPSILON), dp.Invariants.groups(local))
    with pm.Model() as model:
        mu0 = pm.Data("mu0", 0.0)
        m = pm.Normal("m", mu0, 1.0, shape=len(groups))
        x = pm.Poisson("x", pm.math.exp(m[local]))
        mechanism.observe("release", x, observed=release)
        pm.Deterministic("m_less_mu0", m - mu0)  # depends on the shared parameter: each draw's own
        pm.Deterministic("m_g", m)  # (last: the refusal tests below take it out)
    return model


def shared_model(scale=1.0, n_groups=len(GROUPS)):
    """mu0 ~ N(0, 1) given the groups' m_g ~ N(mu0, 1): the shared conditional (scale=1);
    another scale is a wrong one (for the refusal)."""
    with pm.Model() as model:
        mu0 = pm.Normal("mu0", 0.0, 1.0)
        m_g = pm.Data("m_g", np.zeros(n_groups))
        pm.Potential("groups", scale * pm.logp(pm.Normal.dist(mu0, 1.0), m_g).sum())
    return model


def exact_means(groups=GROUPS):
    """E[mu0], E[m_g] and E[x_g0] given the releases of ``groups``, by quadrature over
    (mu0, m) and enumeration of x_g0."""
    mu0 = np.linspace(-5.0, 6.0, 441)
    m = np.linspace(-6.0, 6.0, 961)
    log_a = -EPSILON
    log_f, ex = [], []  # per group: log of sum_x p(x | m) L(x), and E[x_g0 | m, release]
    for (r0, r1), total in zip(RELEASE[groups], TOTALS[groups]):
        x0 = np.arange(total + 1)
        lam = np.exp(m)[:, None]
        terms = (x0 * np.log(lam) - lam - gammaln(x0 + 1) + (total - x0) * np.log(lam) - lam
                 - gammaln(total - x0 + 1) + log_a * (np.abs(r0 - x0) + np.abs(r1 - (total - x0))))
        top = terms.max(axis=1, keepdims=True)
        w = np.exp(terms - top)
        log_f.append(np.log(w.sum(axis=1)) + top[:, 0])
        ex.append((w * x0).sum(axis=1) / w.sum(axis=1))
    # joint weight on the (mu0, m_g) grid for each group, then the mu0 posterior
    kern = stats.norm.logpdf(m[None, :], mu0[:, None], 1.0)  # (mu0, m)
    group_mass, m_post, x_post = [], [], []
    for g in range(len(groups)):
        logw = kern + log_f[g][None, :]
        top = logw.max()
        w = np.exp(logw - top)
        mass = np.trapezoid(w, m, axis=1)
        group_mass.append(np.log(mass) + top)
        m_post.append(np.trapezoid(w * m[None, :], m, axis=1) / mass)
        x_post.append(np.trapezoid(w * ex[g][None, :], m, axis=1) / mass)
    log_post = stats.norm.logpdf(mu0, 0.0, 1.0) + np.sum(group_mass, axis=0)
    p = np.exp(log_post - log_post.max())
    p /= np.trapezoid(p, mu0)
    out = {"mu0": np.trapezoid(p * mu0, mu0)}
    for k, g in enumerate(groups):
        out[f"m[{g}]"] = np.trapezoid(p * m_post[k], mu0)
        out[f"x[{g}]"] = np.trapezoid(p * x_post[k], mu0)
    return out


def assert_matches_exact(idata):
    import arviz as az

    exact = exact_means()
    post = idata.posterior
    checks = [("mu0", post["mu0"])]
    checks += [(f"m[{g}]", post["m"][..., g]) for g in GROUPS]
    checks += [(f"x[{g}]", post["x"][..., 2 * g]) for g in GROUPS]  # each group's first cell
    for name, draws in checks:
        se = float(az.mcse(draws, method="mean"))
        assert abs(float(draws.mean()) - exact[name]) < 5 * se, (name, float(draws.mean()), exact[name], se)
    x = post["x"].values.reshape(-1, len(GROUPS), 2)
    assert np.all(x.sum(axis=2) == TOTALS)  # every draw keeps every group's total


@pytest.mark.parametrize("group", [0, 2])
def test_the_exact_means_are_right(group):
    """The reference itself, given one group's release (where the prior's draws match its
    total often enough), against a Monte Carlo of the law weighted by the likelihood."""
    rng = np.random.default_rng(group)
    n = 1_000_000
    mu0 = rng.standard_normal(n)
    m = mu0 + rng.standard_normal(n)
    x0, x1 = rng.poisson(np.exp(m)), rng.poisson(np.exp(m))
    (r0, r1), total = RELEASE[group], TOTALS[group]
    w = np.where(x0 + x1 == total, np.exp(-EPSILON * (np.abs(r0 - x0) + np.abs(r1 - x1))), 0.0)
    ess = w.sum() ** 2 / (w ** 2).sum()
    assert ess > 1000  # enough for the check to bite: 5 standard errors of a few percent
    exact = exact_means([group])
    for name, values in [("mu0", mu0), (f"m[{group}]", m), (f"x[{group}]", x0)]:
        mean = np.sum(w * values) / w.sum()
        sd = np.sqrt(np.sum(w * (values - mean) ** 2) / w.sum())
        assert abs(mean - exact[name]) < 5 * sd / np.sqrt(ess), (name, mean, exact[name])


def test_sharded_draws_have_the_exact_posterior():
    idata = dp.sample_sharded(build_shard, shared_model(), GROUPS, shards=2, draws=1500, tune=500,
                              chains=2, random_seed=3, progressbar=False)
    assert_matches_exact(idata)
    attrs = idata.sample_stats.attrs
    # per sweep, per chain: mu0 to each of 2 shards (8 bytes each), the 4 m_g back (32)
    assert attrs["bytes_per_sweep"] == 2 * (2 * 8 + 4 * 8)
    assert [s["groups"] for s in json.loads(attrs["shards"])] == [2, 2]
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert report["engine"] == "sharded" and len(report["shards"]) == 2
    assert idata.sample_stats["shard_diverging"].shape == (2, 1500, 2)


def test_on_a_cluster_the_draws_are_those_of_this_process(client, capsys):
    options = dict(draws=150, tune=150, chains=2, random_seed=5)
    here = dp.sample_sharded(build_shard, shared_model(), GROUPS, shards=2, progressbar=False, **options)
    there = dp.sample_sharded(build_shard, shared_model(), GROUPS, client=client, progressbar=True, **options)
    for name in ("mu0", "m", "x"):
        np.testing.assert_array_equal(here.posterior[name].values, there.posterior[name].values)
    for idata in (here, there):  # a Deterministic of the shared parameter: computed at each draw's value
        post = idata.posterior
        np.testing.assert_allclose(post["m_less_mu0"], post["m"] - post["mu0"], atol=1e-12)
    pids = {s["pid"] for s in json.loads(there.sample_stats.attrs["shards"])}
    assert len(pids) == 2  # one shard on each worker process
    err = capsys.readouterr().err
    assert "building 2 shards of 4 groups on 2 workers" in err
    assert re.search(r"sharded sampling: 300/300 iterations, .*2 shards, 2 workers alive", err)
    assert re.fullmatch(r"dpinfer: sharded sampling: 300/300 iterations, .*2 shards, 2 workers alive",
                        there.sample_stats.attrs["progress"])


def test_a_worker_killed_mid_fit_costs_only_the_sweeps_since_the_checkpoint(client, tmp_path, capsys):
    """A worker process of a LocalCluster killed (SIGKILL) once the first checkpoint is
    written: the fit carries on from the checkpoint on the workers alive, and its draws are
    those of the uninterrupted fit (same seed, same shards)."""
    options = dict(draws=300, tune=300, chains=2, random_seed=7)
    reference = dp.sample_sharded(build_shard, shared_model(), GROUPS, shards=2, progressbar=False, **options)
    path = tmp_path / "checkpoint"
    killed = []
    pids = client.run(os.getpid)  # (the cluster's nannies start a new worker in its place)

    def kill_after_the_first_checkpoint():
        deadline = time.monotonic() + 300
        while not (path / "latest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        victim = pids[sorted(pids)[1]]
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)

    killer = threading.Thread(target=kill_after_the_first_checkpoint)
    killer.start()
    with pytest.warns(dp.RecoveryWarning, match=r"lost the workers \['tcp://[^']+'\] at sweep \d+; carrying on "
                                                r"from the checkpoint at sweep [1-9]\d*0 "):  # whatever progressbar is
        idata = dp.sample_sharded(build_shard, shared_model(), GROUPS, client=client, checkpoint=path,
                                  checkpoint_every=50, progressbar=False, **options)
    killer.join()
    assert killed
    assert capsys.readouterr().err == ""
    [lost] = dp.recoveries_of(idata)  # on the record
    assert lost["kind"] == "lost workers" and len(lost["workers"]) == 1
    assert lost["resumed_at_sweep"] % 50 == 0 and 0 < lost["resumed_at_sweep"] <= lost["lost_at_sweep"]
    assert dp.recoveries_of(reference) == []
    for name in ("mu0", "m", "x", "m_less_mu0"):  # (the last computed after the recovery)
        np.testing.assert_array_equal(reference.posterior[name].values, idata.posterior[name].values)
    assert sorted(os.listdir(path)) == ["checkpoint.json", "latest.json", f"sweep-{550:09d}"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    assert sorted(os.listdir(path / f"sweep-{550:09d}")) == ["shard-0", "shard-1", "shared"]


DRIVER_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
import cloudpickle
import distributed
import test_sharded as t
import dpinfer as dp
from dpinfer.inference import sharded

cloudpickle.register_pickle_by_value(t)  # the workers need not import the test module
save = sharded._SweepCheckpoints.save
def slow_save(self, *args):  # a slow file system: the driver is killed mid-fit
    save(self, *args)
    time.sleep(0.5)
sharded._SweepCheckpoints.save = slow_save
if {address!r}:
    client = distributed.Client({address!r})
else:  # the driver's own cluster, in its process: it dies with the driver
    client = distributed.Client(distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=":0"))
dp.sample_sharded(t.build_shard, t.shared_model(), t.GROUPS, client=client, checkpoint={path!r},
                  checkpoint_every=50, progressbar=False, **{options!r})
"""


def killed_driver(tmp_path, options, address=""):
    """Run a sharded fit's driver in another process and SIGKILL it once its first checkpoint
    is whole; returns the checkpoint's directory."""
    path = tmp_path / "checkpoint"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT.format(tests=os.path.dirname(__file__), address=address, path=str(path),
                                           options=options))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not (path / "latest.json").exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        assert child.poll() is None, "the driver ended before it could be killed: " + child.stderr.read().decode()
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
        child.stderr.close()
    assert 0 < json.loads((path / "latest.json").read_text())["sweep"] < options["draws"] + options["tune"]
    return path


@pytest.mark.parametrize("cluster", [pytest.param("the same", marks=pytest.mark.validation), "a new"])
def test_a_killed_driver_resumes_from_the_last_checkpoint(client, tmp_path, cluster):
    """Issue 40: the driver process SIGKILLed after a checkpoint (connected to this module's
    LocalCluster, or with its own cluster, which dies with it); the same call with resume= in
    this process, on this module's cluster, without the seed, gives the uninterrupted draws."""
    options = dict(draws=300, tune=300, chains=2, random_seed=7)
    reference = dp.sample_sharded(build_shard, shared_model(), GROUPS, shards=2, progressbar=False, **options)
    address = client.scheduler.address if cluster == "the same" else ""
    path = killed_driver(tmp_path, options, address)
    sweep = json.loads((path / "latest.json").read_text())["sweep"]
    with pytest.warns(dp.RecoveryWarning, match=f"resumed the sharded fit from the checkpoint .* at sweep {sweep}"):
        resumed = dp.sample_sharded(build_shard, shared_model(), GROUPS, client=client, resume=path,
                                    progressbar=False, **(options | {"random_seed": None}))
    where = f"{dp.recoveries_of(resumed)}; {resumed.sample_stats.attrs['shards']}"  # said by a failure
    for name in ("mu0", "m", "x", "m_less_mu0"):
        np.testing.assert_array_equal(reference.posterior[name].values, resumed.posterior[name].values,
                                      err_msg=f"{name}: {where}")
    [entry] = dp.recoveries_of(resumed)
    assert entry["kind"] == "resumed" and entry["sweep"] == sweep


def test_a_checkpoint_of_another_fit_is_refused_saying_what_differs(tmp_path):
    options = dict(draws=40, tune=40, chains=2, random_seed=7, shards=2, progressbar=False)
    path = tmp_path / "checkpoint"
    dp.sample_sharded(build_shard, shared_model(), GROUPS, checkpoint=path, checkpoint_every=20, **options)
    cases = [
        (dict(options, random_seed=8), "random_seed: its seed's entropy is 7, now 8"),
        (dict(options, draws=50), "draws=40 there, 50 now"),
        (dict(options, shards=4), r"its shards hold the groups \['0', '1'\]; \['2', '3'\], now \['0'\]; \['1'\]"),
        (dict(options, target_accept=0.9), "target_accept=0.8 there, 0.9 now"),
    ]
    for kwargs, message in cases:
        with pytest.raises(CheckpointMismatchError, match=message):
            dp.sample_sharded(build_shard, shared_model(), GROUPS, resume=path, **kwargs)
    with pytest.raises(CheckpointMismatchError, match="its shared model is another"):
        dp.sample_sharded(build_shard, shared_model(scale=2.0), GROUPS, resume=path, **options)
    ident = json.loads((path / "checkpoint.json").read_text())
    ident["versions"]["dpinfer"] = "0.0.1"
    (path / "checkpoint.json").write_text(json.dumps(ident))
    with pytest.raises(CheckpointMismatchError, match="dpinfer 0.0.1 with .*; now dpinfer"):
        dp.sample_sharded(build_shard, shared_model(), GROUPS, resume=path, **options)
    with pytest.raises(FileExistsError, match="not empty; give a new or empty directory, or resume="):
        dp.sample_sharded(build_shard, shared_model(), GROUPS, checkpoint=path, **options)
    with pytest.raises(ValueError, match="give checkpoint= or resume=, not both"):
        dp.sample_sharded(build_shard, shared_model(), GROUPS, checkpoint=tmp_path / "other", resume=path, **options)
    with pytest.raises(FileNotFoundError, match="holds no sharded dpinfer checkpoint"):
        dp.sample_sharded(build_shard, shared_model(), GROUPS, resume=tmp_path / "nothing", **options)


def test_a_resume_with_other_data_in_a_shard_is_refused(tmp_path):
    options = dict(draws=40, tune=40, chains=2, random_seed=7, shards=2, progressbar=False)
    path = tmp_path / "checkpoint"
    dp.sample_sharded(build_shard, shared_model(), GROUPS, checkpoint=path, checkpoint_every=20, **options)

    def other_data(groups):
        return build_shard(groups, release=RELEASE + 1)

    with pytest.raises(CheckpointMismatchError, match="belongs to another model"):
        dp.sample_sharded(other_data, shared_model(), GROUPS, resume=path, **options)


def test_a_shared_model_that_is_not_the_conditional_is_refused():
    with pytest.raises(ValueError, match="shared_model is not the shared parameters' conditional"):
        dp.sample_sharded(build_shard, shared_model(scale=0.5), GROUPS, shards=2, draws=10, tune=10,
                          progressbar=False)


def shard_without_summary(groups):
    model = build_shard(groups)
    del model.named_vars["m_g"]
    model.deterministics.pop()
    return model


def shard_without_shared(groups):
    release = RELEASE[np.asarray(groups)].ravel()
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 1.0, shape=len(groups))
        x = pm.Poisson("x", pm.math.exp(m[np.repeat(np.arange(len(groups)), 2)]))
        dp.DoubleGeometric(epsilon=EPSILON).observe("release", x, observed=release)
        pm.Deterministic("m_g", m)
    return model


def shard_with_pooled_summary(groups):
    model = build_shard(groups)
    with model:
        model.deterministics.pop()
        del model.named_vars["m_g"]
        pm.Deterministic("m_g", pt.stack([model["m"].sum()]))
    return model


@pytest.mark.parametrize("builder, shared, kwargs, error", [
    (shard_without_summary, shared_model(), {}, "has no Deterministic 'm_g'"),
    (shard_without_shared, shared_model(), {}, "does not use the shared parameter 'mu0'"),
    (shard_with_pooled_summary, shared_model(), {}, "first axis must run over the shard's 2 groups"),
    (lambda groups: "not a model", shared_model(), {}, "build_shard must return a pymc.Model"),
    (build_shard, shared_model(), {"shards": 5}, "shards must be between 1 and the number of groups"),
    (build_shard, shared_model(), {"weights": [1, 1, 0, 1]}, "weights must be 4 positive numbers"),
    (build_shard, shared_model(), {"thin": 2}, "sample_sharded got \\['thin'\\]"),
    (build_shard, "model", {}, "shared_model must be a pymc.Model"),
])
def test_bad_input_is_refused_by_name(builder, shared, kwargs, error):
    options = dict(shards=2, draws=10, tune=10, progressbar=False) | kwargs
    with pytest.raises((ValueError, TypeError), match=error):
        dp.sample_sharded(builder, shared, GROUPS, **options)


def test_groups_are_split_in_runs_of_nearly_equal_weight():
    assert partition_groups(list("abcdef"), 3, None) == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert partition_groups(list("abcd"), 2, [10, 1, 1, 1]) == [["a"], ["b", "c", "d"]]
    assert partition_groups(list("abc"), 3, [100, 1, 1]) == [["a"], ["b"], ["c"]]  # every shard a group
    assert partition_groups(list("abcde"), 1, None) == [list("abcde")]


def nested_shard(groups):
    """One group: a copy of tests/test_nested_inference.py's small nested release (2 leaves x
    C cells, its root total exact), the counts' rate LAM e^m with m ~ N(mu0, 1), mu0 shared."""
    from test_nested_inference import small_release
    from test_nested_sums import LAM, C

    assert len(groups) == 1, groups
    with pm.Model() as model:
        mu0 = pm.Data("mu0", 0.0)
        m = pm.Normal("m", mu0, 1.0)
        x = pm.Poisson("x", LAM * pm.math.exp(m), shape=(2, C))
        small_release().observe("nmf", x)
        pm.Deterministic("m_g", m[None])
    return model


def test_a_sharded_fit_widens_alone_the_counts_that_reach_their_boxes(monkeypatch):
    """First boxes of 1 pilot sd on two shards of one nested release each: the first fit's draws
    reach some counts' box edges, so the refit widens those counts alone in each shard that
    missed (as dpinfer.sample does: the record says how many, per shard), and the posterior is
    the enumeration's. The root total is exact, so the counts' posterior does not depend on
    the rates and is each group's enumeration; (mu0, m_g) by quadrature."""
    import dpinfer.inference.planning.nested as planning_nested
    from dpinfer.inference.convergence import diagnostics
    from test_nested_sums import LAM, TOTAL, C, enumerate_posterior

    monkeypatch.setattr(planning_nested, "FIRST_K", 1)
    with pytest.warns(dp.RecoveryWarning, match=r"only its \d+ counts at or near their boxes' edges"):
        idata = dp.sample_sharded(nested_shard, shared_model(n_groups=2), [0, 1], shards=2, draws=3000, tune=300,
                                  chains=2, random_seed=11, progressbar=False)
    widened = [r for r in dp.recoveries_of(idata) if r["kind"] == "windows widened"]
    assert widened
    for record in widened:
        assert record["counts_widened"], record  # counts widened alone, not whole latents
        for shard, counts in record["counts_widened"].items():
            assert 1 <= counts["x"] <= 2 * C, record
    states, logp = enumerate_posterior()
    exact = np.tensordot(np.exp(logp), states, axes=1).reshape(-1)
    draws = idata.posterior["x"].values  # (chain, draw, 4, C): group g's leaves at rows 2g, 2g + 1
    for g in range(2):
        group = draws[:, :, 2 * g:2 * g + 2].reshape(2, -1, 2 * C).astype(float)
        _, ess = diagnostics(group)
        flat = group.reshape(-1, 2 * C)
        assert np.all(flat.sum(1) == TOTAL)
        z = (flat.mean(0) - exact) / (flat.std(0) / np.sqrt(ess))
        assert np.all(np.abs(z) < 5), (g, z)
    # (mu0, m_g) by quadrature: m_g's factor from its counts is e^(m TOTAL - e^m sum(LAM))
    mu0_grid, m_grid = np.linspace(-6.0, 6.0, 601), np.linspace(-6.0, 6.0, 1201)
    kernel = stats.norm.logpdf(m_grid[None, :], mu0_grid[:, None]) + TOTAL * m_grid - np.sum(LAM) * np.exp(m_grid)
    top = kernel.max()
    w = np.exp(kernel - top)
    mass = np.trapezoid(w, m_grid, axis=1)
    m_given_mu0 = np.trapezoid(w * m_grid, m_grid, axis=1) / mass
    post = stats.norm.pdf(mu0_grid) * mass**2
    post /= np.trapezoid(post, mu0_grid)
    import arviz as az

    for name, draws, exact_mean in (("mu0", idata.posterior["mu0"], np.trapezoid(post * mu0_grid, mu0_grid)),
                                    ("m", idata.posterior["m"], np.trapezoid(post * m_given_mu0, mu0_grid))):
        for g in range(2) if name == "m" else [None]:
            d = draws.transpose("chain", "draw", ...).values
            d = d if g is None else d[..., g]  # a scalar of each shard: joined along 'shard'
            assert abs(d.mean() - exact_mean) < 5 * float(az.mcse(d, method="mean")), (name, g, d.mean(), exact_mean)
    report = json.loads(idata.posterior.attrs["dpinfer"])["x"]
    assert all(s["stored_draws_on_box_edges"] == 0 for s in report["shards"])


def test_a_resumed_sharded_fit_replays_the_counts_widened_alone(monkeypatch, tmp_path):
    """The nested fit above, checkpointed: resumed from its last checkpoint, it replays each
    shard's widening of the same counts alone (recorded as replayed, with their number) and
    ends with the draws of the uninterrupted fit."""
    import dpinfer.inference.planning.nested as planning_nested

    monkeypatch.setattr(planning_nested, "FIRST_K", 1)
    options = dict(shards=2, draws=400, tune=200, chains=2, random_seed=11, progressbar=False)
    with pytest.warns(dp.RecoveryWarning):
        first = dp.sample_sharded(nested_shard, shared_model(n_groups=2), [0, 1], checkpoint=tmp_path / "fit",
                                  checkpoint_every=150, **options)
    made = [r for r in dp.recoveries_of(first) if r["kind"] == "windows widened"]
    assert made and all(r["counts_widened"] for r in made)
    resumed = dp.sample_sharded(nested_shard, shared_model(n_groups=2), [0, 1], resume=tmp_path / "fit",
                                checkpoint_every=150, **options)
    replayed = [r for r in dp.recoveries_of(resumed) if r["kind"] == "windows widened"]
    assert [r["counts_widened"] for r in replayed] == [r["counts_widened"] for r in made]
    assert all(r["replayed"] for r in replayed)
    for name in ("mu0", "m", "x"):
        np.testing.assert_array_equal(first.posterior[name].values, resumed.posterior[name].values)
