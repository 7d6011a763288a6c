"""What an analyst pays in the first minutes: fresh processes, new model objects, cold caches.

1. Fresh processes (each figure the median wall time of ``--repeats`` runs of a new Python
   process, timed from outside): ``import pymc`` against ``import dpinfer`` (names load on
   first use) and against importing what a script uses (``dp.sample`` and a mechanism);
   ``dpinfer --help``; the README's Beta-binomial example (read from README.md, "An analyst's
   example") run as a script, with an empty model cache (first run: the model's functions
   compiled and saved) and then again (later runs: loaded), and how much of that is the
   interpreter's shutdown after the script's last line.
2. A warm process that builds a new ``pm.Model`` for every fit, as scripts and loops do
   (every timing includes what the new model object costs: building it, its functions from
   the model cache or compiled, sampling, the convergence report):

   * a held-out Beta-binomial (another prior, n, epsilon and release than the README's and
     benchmarks/bench_beta_binomial.py's; each fit draws its own release): ESS/s of theta of
     ``dp.sample`` against PyMC's default ``pm.sample`` (NUTS on theta, Metropolis on the
     integer x), 2 chains x (1000 tune + 2000 draws) run one after the other (``cores=1``), as
     in bench_beta_binomial.py; posterior means checked against enumeration;
   * dapper's B1 (privatised mean; benchmarks/bench_dapper.py) with a new model per fit and
     another release each time: ESS/s of theta against dapper's 54 ESS/s.

   The first fit of each kind in the process is shown apart (it pays the first compilation
   of the structure in this cache and this process); the figures are medians of the others.

Run:  .venv/bin/python benchmarks/bench_first_minutes.py [--repeats 5] [--fits 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
DPINFER = str(Path(PYTHON).with_name("dpinfer"))
DAPPER_B1_ESS_PER_S = 54.0  # 833 ESS in 15.4 s (issue 13; benchmarks/bench_dapper.py)


def readme_snippet() -> str:
    """The Python block of the README's "An analyst's example", as the README shows it."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python", text.index("## An analyst's example")) + len("```python\n")
    return text[start:text.index("```", start)]


SNIPPET = readme_snippet()


def wall(command: list, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def fresh_processes(repeats: int) -> dict:
    env = dict(os.environ)
    rows = {}
    for label, command in (("import pymc", [PYTHON, "-c", "import pymc"]),
                           ("import dpinfer", [PYTHON, "-c", "import dpinfer"]),
                           ("import dpinfer, use dp.sample + a mechanism",
                            [PYTHON, "-c", "import pymc, dpinfer as dp; dp.sample; dp.DoubleGeometric"]),
                           ("dpinfer --help", [DPINFER, "--help"])):
        wall(command, env)  # the OS's file cache, as after any first run
        rows[label] = statistics.median(wall(command, env) for _ in range(repeats))
    cache = Path(tempfile.mkdtemp(prefix="dpinfer-bench-cache-"))
    script = cache / "snippet.py"
    script.write_text(SNIPPET)
    env["DPINFER_CACHE_DIR"] = str(cache / "cache")
    # the same script, writing the clock when its last line is done: the rest of the wall
    # time is the interpreter's own shutdown (its final garbage collections over every module
    # and object the script loaded), which no library controls
    stamp = cache / "end"
    timed = cache / "snippet_timed.py"
    timed.write_text(SNIPPET + f"import time; open({str(stamp)!r}, 'w').write(repr(time.time()))\n")
    try:
        rows["README snippet, empty model cache"] = wall([PYTHON, str(script)], env)
        rows["README snippet, second run"] = statistics.median(
            wall([PYTHON, str(script)], env) for _ in range(repeats))
        shutdowns = []
        for _ in range(repeats):
            subprocess.run([PYTHON, str(timed)], env=env, check=True, capture_output=True, cwd=ROOT)
            shutdowns.append(time.time() - float(stamp.read_text()))
        rows["  of which Python's shutdown after its last line"] = statistics.median(shutdowns)
    finally:
        shutil.rmtree(cache)
    return rows


def beta_binomial(a, b, n, epsilon, release):
    import numpy as np
    import pymc as pm

    import dpinfer as dp

    with pm.Model() as model:
        theta = pm.Beta("theta", a, b)
        x = pm.Binomial("x", n, theta)
        dp.DoubleGeometric(epsilon=epsilon).observe("s", x, observed=np.int64(release))
    return model


def exact_theta_mean(a, b, n, epsilon, release) -> float:
    import numpy as np
    from scipy import stats

    import dpinfer as dp

    xs = np.arange(n + 1)
    log_w = (stats.betabinom.logpmf(xs, n, a, b)
             + dp.DoubleGeometric(epsilon=epsilon).log_likelihood(np.full(n + 1, release), xs))
    w = np.exp(log_w - log_w.max())
    return float(np.sum(w * (a + xs) / (a + b + n)) / w.sum())


def timed_fit(make, fit) -> tuple[float, object]:
    start = time.perf_counter()
    model = make()
    idata = fit(model)
    return time.perf_counter() - start, idata


def warm_process(fits: int) -> dict:
    import arviz as az
    import numpy as np
    import pymc as pm

    import dpinfer as dp

    rng = np.random.default_rng(20261126)
    a, b, n, epsilon = 2.5, 4.0, 400, 0.5  # held out: the README's is Beta(10, 10), n 1000, eps 0.1

    def dpinfer_fit(model):
        return dp.sample(2000, tune=1000, chains=2, cores=1, model=model, progressbar=False,
                         random_seed=int(rng.integers(2**31)))

    def pymc_fit(model):
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return pm.sample(2000, tune=1000, chains=2, cores=1, progressbar=False,
                             random_seed=int(rng.integers(2**31)))

    results = {}
    for label, fit in (("dp.sample", dpinfer_fit), ("pm.sample (NUTS + Metropolis)", pymc_fit)):
        runs = []
        for _ in range(fits):
            theta = rng.beta(a, b)
            release = int(rng.binomial(n, theta) + dp.DoubleGeometric(epsilon=epsilon).release(
                np.array([0]), rng)[0])
            seconds, idata = timed_fit(lambda: beta_binomial(a, b, n, epsilon, release), fit)
            ess = float(az.ess(idata, var_names=["theta"], method="bulk")["theta"])
            error = float(idata.posterior["theta"].mean()) - exact_theta_mean(a, b, n, epsilon, release)
            runs.append({"seconds": seconds, "ess": ess, "ess/s": ess / seconds, "error": error})
        results[label] = runs
    b1 = []
    for _ in range(fits):
        release = float(rng.normal(-2.0, 0.4))
        with pm.Model():
            start = time.perf_counter()
            theta = pm.Normal("theta", 0.0, 2.0)
            ybar = pm.Normal("ybar", theta, 0.1)
            dp.Gaussian.from_sigma(1.0 / 3.0).observe("s", ybar, observed=release)
            idata = dp.sample(2000, tune=1000, chains=2, progressbar=False,
                              random_seed=int(rng.integers(2**31)))
            seconds = time.perf_counter() - start
        ess = float(az.ess(idata, var_names=["theta"], method="bulk")["theta"])
        exact = 0.970612 * release  # B1's closed form, theta | s ~ N(0.970612 s, 0.117552)
        b1.append({"seconds": seconds, "ess": ess, "ess/s": ess / seconds,
                   "error": float(idata.posterior["theta"].mean()) - exact})
    results["dp.sample B1"] = b1
    return results


def main(argv=None) -> None:
    import logging

    import pymc  # noqa: F401 - configures its logger on import

    logging.getLogger("pymc").setLevel(logging.ERROR)  # pm.sample's progress lines
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per figure")
    parser.add_argument("--fits", type=int, default=6, help="new model objects per kind")
    args = parser.parse_args(argv)

    print("1. Fresh processes (median wall time of new Python processes)")
    rows = fresh_processes(args.repeats)
    for label, seconds in rows.items():
        print(f"   {label:45s} {seconds:6.2f} s")
    extra = rows["import dpinfer, use dp.sample + a mechanism"] - rows["import pymc"]
    print(f"   dpinfer's names a script uses, beyond import pymc {extra:+6.2f} s")

    print("\n2. A warm process, a new model object per fit (first fit apart; medians of the rest)")
    results = warm_process(args.fits)
    header = f"   {'':32s} {'first s':>8s} {'s':>7s} {'ESS':>7s} {'ESS/s':>9s} {'max |error|':>12s}"
    print(header)
    summary = {}
    for label, runs in results.items():
        rest = runs[1:]
        med = {k: statistics.median(r[k] for r in rest) for k in ("seconds", "ess", "ess/s")}
        summary[label] = med
        worst = max(abs(r["error"]) for r in runs)
        print(f"   {label:32s} {runs[0]['seconds']:8.2f} {med['seconds']:7.3f} {med['ess']:7.0f} "
              f"{med['ess/s']:9.0f} {worst:12.4f}")
    ratio = summary["dp.sample"]["ess/s"] / summary["pm.sample (NUTS + Metropolis)"]["ess/s"]
    print(f"\n   Beta-binomial, ESS/s of theta: dp.sample / pm.sample = {ratio:.0f}x")
    print(f"   B1: {summary['dp.sample B1']['ess/s']:.0f} ESS/s against dapper's "
          f"{DAPPER_B1_ESS_PER_S:.0f}: {summary['dp.sample B1']['ess/s'] / DAPPER_B1_ESS_PER_S:.0f}x")
    print("   (error: posterior mean of theta minus the exact one, enumeration / closed form)")


if __name__ == "__main__":
    main()
