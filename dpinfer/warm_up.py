"""``dpinfer compile``: compile dpinfer's numba kernels ahead of the first fit.

numba compiles each kernel on its first call and keeps it in its on-disk cache beside the
source (:mod:`dpinfer._kernel_cache` keeps that cache consistent with the source). Without
this step a machine's first fits pay for it: about 30 s before the first NMF fit's draws,
about 100 s over a whole test run (benchmarks/README.md, "Kernel compile"). ``dpinfer
compile`` runs a few small fits that reach every engine's kernels (:data:`WORKLOADS`: counts
on an invariant total, independent counts on each engine, nested measurements with
group-mixed counts by full and empirical Bayes, releases under invariants and on integer
subspaces) and records that the cache is warm for this source (:func:`is_warm`), so that a
second call returns at once. ``tools/ensure-venv`` runs it once per install and after every
change of the source, so ``make demo`` and ``make test`` start with compiled kernels.

Nothing it computes is kept: the fits' draws are thrown away; only numba's cache (and the
model cache of the fits' PyMC functions) is left behind.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
import warnings

import numpy as np

from dpinfer._kernel_cache import STAMP, source_hash

WARM = STAMP.with_name("dpinfer-kernels.warm")  # the source hash the cache was warmed for
QUIET = {"progressbar": False}


def is_warm() -> bool:
    """Whether :func:`warm_up` has run since the source last changed."""
    try:
        return WARM.read_text() == source_hash()
    except OSError:
        return False


def _counts_on_a_total(rng) -> None:
    """Counts drawn exactly on an invariant total with NUTS on their rates (the demo's model):
    the compiled engine's sweeps, joint count draws given totals, NUTS."""
    import dpinfer as dp
    from dpinfer.demo import county_model

    truth = rng.poisson(20, size=6)
    mechanism = dp.Conditioned(dp.DoubleGeometric(epsilon=0.5), dp.Invariants.total(truth.size))
    model, count = county_model(np.full(truth.size, 5000.0), [f"c{i}" for i in range(truth.size)])
    with model:
        mechanism.observe("release", count, observed=mechanism.release(truth, rng), dims="county")
    dp.sample(draws=20, tune=20, chains=1, model=model, random_seed=1, **QUIET)


def _independent_counts(rng) -> None:
    """Counts each released once (discrete Gaussian, Laplace) on the compiled engine and on
    the PyMC engine's windowed convolution; a table released on its margins by fibre moves."""
    import pymc as pm

    import dpinfer as dp

    def fit(mechanism, truth, method):
        with pm.Model() as model:
            rate = pm.Gamma("rate", 2.0, 0.1)
            count = pm.Poisson("count", rate, shape=truth.size)
            mechanism.observe("release", count, observed=mechanism.release(truth, rng))
        dp.sample(draws=20, tune=20, chains=1, model=model, random_seed=1, method=method, **QUIET)

    truth = rng.poisson(15, size=6)
    for mechanism in (dp.DiscreteGaussian(sigma=2.0), dp.Laplace(epsilon=1.0)):
        for method in ("auto", "marginal"):
            fit(mechanism, truth, method)
    fit(dp.Conditioned(dp.DoubleGeometric(epsilon=1.0), dp.Invariants.total(truth.size)), truth, "marginal")
    fit(dp.Conditioned(dp.DoubleGeometric(epsilon=1.0), dp.Invariants.margins((2, 3), [(0,), (1,)])),
        truth, "fibre")


def _nested_measurements(rng) -> None:
    """A small state's noisy measurement files read down to blocks, the census model's
    group-mixed counts by exact sum-tree moves: full Bayes and empirical Bayes with the leaf
    sizes drawn with the counts."""
    import dpinfer as dp
    from dpinfer.io.nmf.fit import LEVELS
    from dpinfer.io.nmf.model import census_model, empirical_bayes_settings
    from dpinfer.io.nmf.table import census_table

    with tempfile.TemporaryDirectory(prefix="dpinfer-warm-up-") as root:
        dp.write_synthetic_nmf(root, n_counties=1, tracts_per_county=2, block_groups_per_tract=1,
                               blocks_per_block_group=(3, 3), aian_tracts=0, seed=1)
        nmf = dp.read_nmf(root, "19", levels=LEVELS)
        table = census_table(nmf, "Block")
        model = census_model(table, leaf_sizes="estimated")
        dp.sample(draws=10, tune=10, chains=1, model=model, random_seed=1, inference="full-bayes", **QUIET)
        settings = empirical_bayes_settings(model, "Block", "normal") | {"max_iterations": 20, "burn_in": 10}
        dp.sample(draws=10, tune=10, chains=1, model=model, random_seed=1, inference="empirical-bayes",
                  empirical_bayes=settings, **QUIET)


def _releases_under_invariants(rng) -> None:
    """Releases drawn by the samplers of noise conditioned on a table's margins (enumerated
    classes; exact Gibbs sweeps and the independence chain where the classes are too many) and
    of the generalized Laplace on an integer subspace (Gibbs sweeps, seed 001's walk)."""
    import dpinfer as dp

    small, large = rng.poisson(10, size=6), rng.poisson(10, size=36)
    for table, shape in ((small, (2, 3)), (large, (6, 6))):
        margins = dp.Invariants.margins(shape, [(0,), (1,)])
        for base in (dp.DoubleGeometric(epsilon=1.0), dp.DiscreteGaussian(sigma=1.5)):
            dp.Conditioned(base, margins).release(table, rng, grade="simulation")
        dp.Conditioned(dp.DoubleGeometric(epsilon=1.0), margins, nonnegative=True).release(
            table, rng, grade="simulation")
    margins = dp.Invariants.margins((2, 3), [(0,), (1,)])
    dp.GeneralizedLaplace(1.0, margins).release(small, rng)
    for chain in ("gibbs", "walk"):
        dp.GeneralizedLaplace(1.0, margins, norm="l2", chain=chain, iterations=5).release(small, rng)
    dp.GeneralizedGaussian(1.5, margins, epsilon=1.0).release(small, rng)


WORKLOADS = (("counts on an invariant total", _counts_on_a_total),
             ("counts released one by one, on each engine", _independent_counts),
             ("nested measurements (NMF) at blocks, full and empirical Bayes", _nested_measurements),
             ("releases under invariants", _releases_under_invariants))


def warm_up(log=None, force: bool = False) -> float:
    """Compile dpinfer's kernels (module docstring) unless :func:`is_warm` (or ``force``);
    announces each workload on ``log`` (default stderr). Returns the seconds taken."""
    log = sys.stderr if log is None else log
    if is_warm() and not force:
        print("dpinfer compile: the kernels are compiled for this source already", file=log, flush=True)
        return 0.0
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    pymc_log = logging.getLogger("pymc")
    level = pymc_log.level
    for k, (what, workload) in enumerate(WORKLOADS, 1):
        began = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fits are too short to converge, on purpose
            pymc_log.setLevel(logging.ERROR)  # nor PyMC's sampling banners
            try:
                workload(rng)
            finally:
                pymc_log.setLevel(level)
        print(f"dpinfer compile: [{k}/{len(WORKLOADS)}] {what} ({time.perf_counter() - began:.0f} s)",
              file=log, flush=True)
    seconds = time.perf_counter() - start
    try:
        WARM.parent.mkdir(exist_ok=True)
        WARM.write_text(source_hash())
        kept = "; the kernels are in numba's cache beside the source"
    except OSError as err:  # a read-only install: numba could not keep them either
        kept = f"; could not record it ({err}): a read-only install compiles its kernels in each process"
    print(f"dpinfer compile: done in {seconds:.0f} s{kept}", file=log, flush=True)
    return seconds
