"""The disk cache of compiled model functions (dpinfer.inference.engines.compiled.cache): a new model
object of a structure compiled before compiles nothing, in this process or a fresh one, and
computes with its own data; a change of structure or of a version is a new key; a corrupt,
unwritable or foreign cache is passed over with a warning and never gives another function."""

import json
import os
import stat
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import stats

from dpinfer.inference import sample
from dpinfer.inference.engines.compiled import cache as model_cache
from dpinfer.mechanisms.geometric import DoubleGeometric

FIT = {"draws": 1000, "tune": 500, "chains": 2, "progressbar": False}


def beta_binomial(a, b, n, epsilon, release, prior="beta"):
    with pm.Model() as model:
        theta = pm.Beta("theta", a, b) if prior == "beta" else pm.Uniform("theta", 0.0, 1.0)
        x = pm.Binomial("x", n, theta)
        DoubleGeometric(epsilon=epsilon).observe("release", x, observed=release)
    return model


def exact_theta_mean(a, b, n, epsilon, release) -> float:
    """E[theta | release] by enumerating x = 0..n: p(x | s) ∝ BetaBinomial(x; n, a, b) f(s - x)."""
    xs = np.arange(n + 1)
    log_w = (stats.betabinom.logpmf(xs, n, a, b)
             + DoubleGeometric(epsilon=epsilon).log_likelihood(np.full(n + 1, release), xs))
    w = np.exp(log_w - log_w.max())
    return float(np.sum(w * (a + xs) / (a + b + n)) / w.sum())


def assert_theta_exact(idata, a, b, n, epsilon, release):
    """The posterior mean of theta within 4 Monte Carlo standard errors of the exact one."""
    draws = idata.posterior["theta"].values.ravel()
    import arviz as az

    se = draws.std() / np.sqrt(float(az.ess(idata, var_names=["theta"])["theta"]))
    assert abs(draws.mean() - exact_theta_mean(a, b, n, epsilon, release)) < 4 * se


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A model cache holding the Beta-binomial structure, compiled once for the module."""
    path = tmp_path_factory.mktemp("model-cache")
    previous = os.environ.get(model_cache.CACHE_ENV)
    os.environ[model_cache.CACHE_ENV] = str(path)
    forget()
    sample(model=beta_binomial(10, 10, 1000, 0.1, 612), random_seed=1, **FIT)
    yield path
    if previous is None:
        del os.environ[model_cache.CACHE_ENV]
    else:
        os.environ[model_cache.CACHE_ENV] = previous
    forget()


def forget():
    """This process forgets what it compiled, loaded and warned (the disk cache is what is
    tested)."""
    from dpinfer.inference.engines.compiled import model

    model._STRUCTURES.clear()
    model_cache._LOADED.clear()
    model_cache._WARNED.clear()
    model_cache.STATS.clear()


def entries(root) -> list:
    return sorted(p for p in (root / "models").glob("??/*") if p.is_dir())


def test_a_new_model_object_of_the_same_structure_compiles_nothing(cache_dir):
    """Other prior, n, epsilon and release (literals of other magnitudes and kinds: 3.5 and 2
    against 10 and 10, 200 against 1000): every function is loaded from disk, and the fit is
    the new model's exact posterior (its data reach the loaded functions)."""
    forget()
    args = (3.5, 2.0, 200, 0.5, 120)
    idata = sample(model=beta_binomial(*args), random_seed=2, **FIT)
    assert model_cache.STATS == {"loaded": 3}
    assert_theta_exact(idata, *args)
    sample(model=beta_binomial(*args), random_seed=3, **FIT)  # this process keeps them
    assert model_cache.STATS == {"loaded": 3}


def test_loaded_functions_compute_the_new_models_own_log_density(cache_dir):
    """The functions loaded for another model of the structure (other literals: Beta(3.5, 2),
    n = 200) give that model's log density and gradient and its counts' prior table, against
    scipy to 1e-12 (their data are the new model's, handed over at run time). The table
    functions are compiled or loaded when first asked for: the flat table (boxes of different
    widths, which this structure's fits never used) is compiled then, and computes the same."""
    from dpinfer.inference.engines.compiled.engine import compiled_model_for
    from dpinfer.inference.engines.compiled.exact_counts import _prior_at, flat_prior_table, log_weight_tables
    from dpinfer.inference.engines.compiled.nuts import log_density_at

    forget()
    a, b, n = 3.5, 2.0, 200
    model = beta_binomial(a, b, n, 0.5, 120)
    compiled = compiled_model_for(model, [model["x"]], [model["release"]])
    assert model_cache.STATS == {"loaded": 1}  # the log density; the tables when asked for
    table = compiled.prior_tables["x"]
    grid = np.arange(-3, n + 4, dtype=np.int64).reshape(1, -1)
    buffers, hoisted = table.prepare(grid)
    assert table.point_address
    assert model_cache.STATS == {"loaded": 3}
    flat_grid = np.array([5, -1, 0, n, n + 1, 37, 38], dtype=np.int64)  # one cell: rows all 0
    flat_rows = np.zeros(flat_grid.size, dtype=np.int64)
    flat_buffers, flat_hoisted = table.prepare_flat(flat_grid, flat_rows)
    assert model_cache.STATS == {"loaded": 3, "compiled": 1}
    for q0 in (-2.0, 0.0, 0.7, 2.5):
        theta = 1.0 / (1.0 + np.exp(-q0))
        for x in (0, 37, n):
            counts = np.array([x], dtype=np.int64)  # kept alive: env holds its address
            env = compiled.environment(counts)
            q, grad = np.array([q0]), np.empty(1)
            lp = log_density_at(compiled.logp_grad_address, q, grad, env)
            # log p in the log-odds space: Beta density, its Jacobian theta (1 - theta), Binomial
            expected = (stats.beta.logpdf(theta, a, b) + np.log(theta * (1 - theta))
                        + stats.binom.logpmf(x, n, theta))
            assert lp == pytest.approx(expected, rel=1e-12)
            # d/dq: (a - 1)(1 - theta) - (b - 1) theta + 1 - 2 theta + x - n theta
            assert grad[0] == pytest.approx((a - 1) * (1 - theta) - (b - 1) * theta + 1 - 2 * theta
                                            + x - n * theta, rel=1e-10, abs=1e-10)
            out = np.empty(grid.shape)
            log_weight_tables(table.full_address, hoisted, q, env, grid, np.zeros(grid.shape), out)
            np.testing.assert_allclose(out, stats.binom.logpmf(grid, n, theta), rtol=1e-12, atol=0)
            flat = np.empty(flat_grid.size)
            flat_prior_table(table.flat_address, flat_hoisted, q, env, flat_grid, flat_rows, flat)
            np.testing.assert_allclose(flat, stats.binom.logpmf(flat_grid, n, theta), rtol=1e-12, atol=0)
            for v in (-1, 0, 7, n, n + 1):
                assert _prior_at(table.point_address, q, env, 0, v) == pytest.approx(
                    stats.binom.logpmf(v, n, theta), rel=1e-12)


def test_the_literal_scalars_travel_packed_in_one_vector_a_dtype(cache_dir):
    """Beta(3.5, 2)'s parameters and Binomial's n = 200 reach the native functions as the
    entries of one float64 and one int64 vector (a native function pays for each input it
    takes), read from the model's own literals; a model with others fills the same vectors."""
    from dpinfer.inference.engines.compiled.engine import compiled_model_for

    forget()
    for a, b, n in ((3.5, 2.0, 200), (10.0, 10.0, 1000)):
        model = beta_binomial(a, b, n, 0.5, 120)
        compiled = compiled_model_for(model, [model["x"]], [model["release"]])
        data = {v.name: value for v, value in zip(compiled.data_inputs, compiled.data.values)}
        assert sorted(data) == ["literals_float64", "literals_int64"]
        assert sorted(data["literals_float64"]) == sorted([a, b])
        np.testing.assert_array_equal(data["literals_int64"], [n])


def test_a_fresh_process_loads_every_function(cache_dir):
    script = textwrap.dedent("""
        import json, numpy as np, pymc as pm
        import dpinfer as dp
        from dpinfer.inference.engines.compiled import cache as model_cache
        with pm.Model() as model:
            theta = pm.Beta("theta", 10, 10)
            x = pm.Binomial("x", 1000, theta)
            dp.DoubleGeometric(epsilon=0.1).observe("release", x, observed=612)
            idata = dp.sample(200, tune=200, progressbar=False, random_seed=5)
        print(json.dumps({"stats": dict(model_cache.STATS),
                          "mean": float(idata.posterior["theta"].mean())}))
    """)
    env = {**os.environ, model_cache.CACHE_ENV: str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["stats"] == {"loaded": 3}
    assert 0.55 < result["mean"] < 0.66  # exact 0.6082 (benchmarks/bench_beta_binomial.py)


def test_every_key_is_the_same_in_a_fresh_process():
    """A model with vector latents and data (an exposure, a shape-(4,) count table: graphs with
    None constants, object arrays whose bytes are pointers) gets the same key for each native
    function (the log density and the prior's point, padded and flat tables) in two fresh
    processes, so a second run loads all of them (keys recorded, nothing compiled)."""
    script = textwrap.dedent("""
        import json, numpy as np, pymc as pm
        import dpinfer as dp
        from dpinfer.inference.engines.compiled import model as compiled_model
        keys = []
        compiled_model.native_function = lambda key, *args: keys.append(key)
        with pm.Model() as model:
            population = pm.Data("population", np.array([1000.0, 5000.0, 20000.0, 800.0]))
            rate = pm.Gamma("rate", 2.0, 200.0)
            x = pm.Poisson("x", rate * population)
            dp.Laplace(epsilon=0.5).observe("release", x, observed=np.array([3, 20, 98, 1]))
        table = compiled_model.compile_model(model, [x], [model["release"]]).prior_tables["x"]
        for kind in ("point", "full", "flat"):  # each built when first asked for
            table._functions.get(kind)
        print(json.dumps(keys))
    """)
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                      check=True, timeout=600).stdout.strip().splitlines()[-1])
            for _ in range(2)]
    assert len(runs[0]) == 4 and None not in runs[0]
    assert runs[0] == runs[1]
    assert model_cache.describe(np.asarray(None)) == ("objects", (), (None,))


def test_a_change_of_structure_or_of_a_version_is_a_new_key(cache_dir, monkeypatch):
    """Another structure (the prior's transform changes every graph) compiles its own
    functions; a new version of dpinfer, PyMC, PyTensor or numba changes every key (function
    and structure), and a fit under a new version compiles afresh."""
    import pytensor.tensor as pt

    forget()
    before = entries(cache_dir)
    sample(model=beta_binomial(1, 1, 1000, 0.1, 612, prior="uniform"), random_seed=1, **FIT)
    assert model_cache.STATS["compiled"] == 3
    x = pt.dvector("x")
    model = beta_binomial(10, 10, 1000, 0.1, 612)
    thawed, _ = model_cache.thaw_literals(model)
    keys = {(model_cache.graph_key([x], [pt.exp(x)]), model_cache.structure_key(thawed, ["x"], []))}
    for i, name in ((1, "dpinfer"), (2, "pymc"), (3, "pytensor"), (4, "numba")):
        versions = list(model_cache.versions())
        versions[i] = versions[i] + "-other"
        monkeypatch.setattr(model_cache, "_VERSIONS", tuple(versions))
        keys.add((model_cache.graph_key([x], [pt.exp(x)]), model_cache.structure_key(thawed, ["x"], [])))
        assert len(keys) == i + 1, name
    forget()
    args = (10, 10, 1000, 0.1, 612)  # under the last of them (numba): compiled afresh
    assert_theta_exact(sample(model=beta_binomial(*args), random_seed=1, **FIT), *args)
    assert model_cache.STATS == {"compiled": 3}
    assert len(entries(cache_dir)) == len(before) + 2 * 3


def test_a_corrupt_entry_is_compiled_afresh_with_a_warning(cache_dir, tmp_path, monkeypatch, capsys):
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(cache_dir, copy)
    monkeypatch.setenv(model_cache.CACHE_ENV, str(copy))
    for data in (copy / "models").glob("??/*/*.nbc"):
        data.write_bytes(data.read_bytes()[:100])  # truncated
    forget()
    args = (10, 10, 1000, 0.1, 612)
    with pytest.warns(model_cache.ModelCacheWarning, match="could not be loaded"):
        idata = sample(model=beta_binomial(*args), random_seed=1, **{**FIT, "progressbar": True})
    assert model_cache.STATS["compiled"] >= 1
    assert_theta_exact(idata, *args)
    # with progress lines on, every compilation is announced (a large model's takes minutes)
    announced = capsys.readouterr().err.count("dpinfer: compiling the model's ")
    assert announced == model_cache.STATS["compiled"]
    forget()
    sample(model=beta_binomial(*args), random_seed=1, **{**FIT, "progressbar": True})  # loaded: no notice
    assert model_cache.STATS == {"loaded": 3} and "compiling the model's" not in capsys.readouterr().err


def test_an_unwritable_cache_warns_and_the_fit_goes_on(tmp_path, monkeypatch):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    monkeypatch.setenv(model_cache.CACHE_ENV, str(not_a_directory))
    forget()
    args = (10, 10, 1000, 0.1, 612)
    with pytest.warns(model_cache.ModelCacheWarning, match="cannot be used"):
        idata = sample(model=beta_binomial(*args), random_seed=1, **FIT)
    assert_theta_exact(idata, *args)


def test_the_cache_is_private_and_another_users_entries_are_never_loaded(cache_dir, monkeypatch):
    root = cache_dir / "models"
    for path in (root, *entries(cache_dir)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    args = (10, 10, 1000, 0.1, 612)
    # an entry that group or others could have written: passed over, compiled again
    forget()
    sample(model=beta_binomial(*args), random_seed=1, **FIT)
    key = next(iter(model_cache._LOADED))
    victim = next((root / key[:2] / key).iterdir())
    victim.chmod(victim.stat().st_mode | stat.S_IWGRP)
    forget()
    with pytest.warns(model_cache.ModelCacheWarning, match="writable by other users"):
        sample(model=beta_binomial(*args), random_seed=1, **FIT)
    assert model_cache.STATS["compiled"] >= 1
    victim.chmod(victim.stat().st_mode & ~stat.S_IWGRP)
    # a cache owned by another user: not used at all
    monkeypatch.setattr(model_cache, "_this_user", lambda: os.getuid() + 1)
    forget()
    with pytest.warns(model_cache.ModelCacheWarning, match="owned by uid"):
        idata = sample(model=beta_binomial(*args), random_seed=1, **FIT)
    assert model_cache.STATS == {"compiled": 3}
    assert_theta_exact(idata, *args)


def test_the_key_describes_ops_by_their_parameters_and_refuses_what_it_cannot():
    import pytensor.tensor as pt

    x = pt.dvector("x")
    assert model_cache.graph_key([x], [pt.exp(x)]) == model_cache.graph_key([x], [pt.exp(x)])
    assert model_cache.graph_key([x], [pt.exp(x)]) != model_cache.graph_key([x], [pt.log(x)])
    assert model_cache.graph_key([x], [x.sum()]) != model_cache.graph_key([x], [x.max()])
    assert model_cache.graph_key([x], [x * 2.0]) != model_cache.graph_key([x], [x * 3.0])
    y = pt.dvector("y")
    with pytest.raises(model_cache.NotCacheableError, match="not data"):
        model_cache.graph_key([x], [x + y])  # y is neither an input nor a constant
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model_cache.describe(lambda v: v + 1) != model_cache.describe(lambda v: v + 2)
    # an Op defined by an inner graph (OpFromGraph; PyTensor's logaddexp, which the
    # normal-Laplace likelihood uses) is described by that graph
    from pytensor.compile.builders import OpFromGraph

    a, b = pt.dscalar("a"), pt.dscalar("b")

    def key_of(inner):
        return model_cache.graph_key([x], [OpFromGraph([a, b], [inner])(x.sum(), x.max())])

    assert key_of(a + b) == key_of(a + b) != key_of(a * b)
    assert model_cache.graph_key([x, y], [pt.logaddexp(x, y)]) != model_cache.graph_key(
        [x, y], [pt.logaddexp(x, -y)])


def test_the_cache_command_shows_and_clears_the_cache(tmp_path, monkeypatch, capsys):
    from dpinfer.cli import main

    entry = tmp_path / "cache" / "models" / "ab" / "abcd"
    entry.mkdir(parents=True)
    (entry / "function.nbi").write_bytes(b"x" * 1000)
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    main(["cache"])
    assert "1 compiled model functions" in capsys.readouterr().out
    main(["cache", "--clear"])
    assert "deleted 1 compiled model functions" in capsys.readouterr().out
    assert not (tmp_path / "cache" / "models").exists()


def test_the_cache_is_bounded_and_the_least_recently_used_go_first(tmp_path, monkeypatch):
    """prune deletes the entries used longest ago until the cache fits its bound, never the
    one just written; a load refreshes an entry's time; compiling prunes to
    $DPINFER_CACHE_MAX_MB; a bad bound is refused naming the variable."""
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    root = tmp_path / "cache" / "models"

    def make(name, last_use):
        entry = root / name[:2] / name
        entry.mkdir(parents=True)
        (entry / "function.nbc").write_bytes(b"x" * 1000)
        os.utime(entry, (last_use, last_use))
        return entry

    old, middle, new = make("aa01", 100), make("bb02", 200), make("cc03", 300)
    assert model_cache.prune(3000) == 0
    assert model_cache.prune(2500) == 1 and not old.exists() and middle.exists()
    model_cache._touch(middle)  # used now: newer than `new`
    assert model_cache.prune(1000) == 1 and not new.exists() and middle.exists()
    assert model_cache.prune(0, keep=middle) == 0 and middle.exists()
    assert model_cache.contents()[1:] == (1, 1000)

    monkeypatch.setenv(model_cache.SIZE_ENV, "0.0025")
    assert model_cache.size_limit() == 2500
    monkeypatch.delenv(model_cache.SIZE_ENV)
    assert model_cache.size_limit() == model_cache.DEFAULT_MAX_MB * 10**6
    for bad in ("-1", "lots", "nan", "inf"):
        monkeypatch.setenv(model_cache.SIZE_ENV, bad)
        with pytest.raises(ValueError, match="DPINFER_CACHE_MAX_MB must be a number of megabytes >= 0"):
            model_cache.size_limit()

    # a fit under a bound of 0: each compilation keeps only its own entry, and the fit is exact
    monkeypatch.setenv(model_cache.SIZE_ENV, "0")
    forget()
    args = (10, 10, 1000, 0.1, 612)
    idata = sample(model=beta_binomial(*args, prior="uniform"), random_seed=1, **FIT)
    assert model_cache.STATS == {"compiled": 3}
    assert model_cache.contents()[1] == 1 and not middle.exists()
    assert_theta_exact(idata, 1, 1, *args[2:])  # Uniform(0, 1) is Beta(1, 1)
    forget()


def test_a_zero_sum_normal_compiles_with_its_own_log_density():
    """pm.ZeroSumNormal (a symbolic distribution whose float32 literal reaches its graph Op
    through an ExpandDims: widening it to float64 broke the rebuild with a TypeError): the
    compiled log density and gradient at random points equal PyMC's own, the release's term
    left out (the count blocks draw it)."""
    from dpinfer.inference.engines.compiled.engine import compiled_model_for
    from dpinfer.inference.engines.compiled.nuts import log_density_at

    with pm.Model() as model:
        mu = pm.Normal("mu", 2.0, 1.0)
        effect = pm.ZeroSumNormal("effect", sigma=0.5, shape=3)
        x = pm.Poisson("x", pm.math.exp(mu + effect))
        DoubleGeometric(epsilon=1.0).observe("release", x, observed=np.array([5, 9, 3]))
    compiled = compiled_model_for(model, [model["x"]], [model["release"]])
    terms = [model["mu"], model["effect"], model["x"]]
    logp = model.compile_logp(vars=terms)
    values = {v.name: v for v in model.value_vars}
    dlogp = model.compile_dlogp(vars=[model.values_to_rvs[values[name]] for name in compiled.names])
    rng = np.random.default_rng(4)
    for _ in range(3):
        counts = rng.integers(0, 15, size=3).astype(np.int64)
        q = rng.normal(size=compiled.n)
        point = {"x": counts}
        for name, sl, shape in zip(compiled.names, compiled.slices, compiled.shapes):
            point[name] = q[sl].reshape(shape)
        grad = np.empty(compiled.n)
        lp = log_density_at(compiled.logp_grad_address, q, grad, compiled.environment(counts))
        assert lp == pytest.approx(logp(point), rel=1e-10)
        np.testing.assert_allclose(grad, dlogp(point), rtol=1e-8, atol=1e-10)
