"""Privatised statistics against dapper (Ju, Awan, Gong & Rao's data augmentation, R): ESS per
second of the slowest parameter, warm, with dapper's own figure beside it.

B1, dapper's README example: y_i ~ N(theta, 1), n = 100, theta ~ N(0, 2^2); the mean is
released with Gaussian noise of sd 1/3, s = -2.097902. Exact posterior theta | s ~ N(0.970612 s,
0.117552). dapper 1.1.0 on this kind of machine: 833 ESS in 15.4 s, about 54 ESS/s (issue 13).
dpinfer: ybar ~ N(theta, 1/100) as a continuous latent, the release observed through
``dp.Gaussian.from_sigma(1/3)``, ``dp.sample`` (compiled NUTS), 2 chains x (1000 tune + 2000
draws) in parallel, compiled by an untimed first call; median of ``--repeats`` runs with
different seeds.

B2, dapper's vignette: UC Berkeley admissions, n = 400 records of two binary attributes
released by randomised response keeping each bit with probability 3/4; privatised cells (104,
120, 74, 102); prior Dirichlet(1, 1, 1, 1). Exact posterior means (quadrature, tests/
test_randomized_response.py) (0.28233, 0.33572, 0.10950, 0.27245). dapper: about 2-3 ESS/s
(152 s; issue 13), taken here as 3. dpinfer: the table's law given the cell probabilities is
Multinomial(n, M^T pi) (``dp.RandomizedResponse.report_probabilities``), a PyMC model sampled by
nutpie (compiled once, as ``pm.sample`` would run it), then one exact draw of the true table
per posterior draw (``draw_true_table``), timed with the sampling; min ESS over the 4 cells.
(``dp.sample`` does not take randomised-response releases yet.)

(B3, linear regression, comes with the record-level work.)

Run:  .venv/bin/python benchmarks/bench_dapper.py [--repeats 5] [--draws 2000]
"""

from __future__ import annotations

import argparse
import logging
import time

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm

import dpinfer as dp

B1_RELEASE = -2.097902
B1_EXACT_MEAN = 0.970612 * B1_RELEASE
B1_EXACT_SD = np.sqrt(0.117552)
DAPPER_B1 = {"ess": 833, "seconds": 15.4}
B2_RELEASE = np.array([104, 120, 74, 102])
B2_EXACT_MEANS = np.array([0.28233, 0.33572, 0.10950, 0.27245])
DAPPER_B2_ESS_PER_S = 3.0  # "about 2-3 ESS/s (152 s)": the favourable end for dapper


def b1_model():
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 2.0)
        ybar = pm.Normal("ybar", theta, 0.1)
        dp.Gaussian.from_sigma(1.0 / 3.0).observe("s", ybar, observed=B1_RELEASE)
    return model


def b2_compiled():
    import nutpie

    rr = dp.RandomizedResponse(0.75, attributes=2)
    with pm.Model() as model:
        pi = pm.Dirichlet("pi", np.ones(4))
        pm.Multinomial("s", n=int(B2_RELEASE.sum()), p=rr.report_probabilities(pi), observed=B2_RELEASE)
    return rr, nutpie.compile_pymc_model(model)


def run_b2(rr, compiled, draws, seed):
    import nutpie

    t0 = time.perf_counter()
    idata = nutpie.sample(compiled, draws=draws, tune=1000, chains=2, cores=2, seed=seed,
                          progress_bar=False)
    pi = idata.posterior["pi"].values.reshape(-1, 4)
    rng = np.random.default_rng(seed)
    tables = np.stack([rr.draw_true_table(p, B2_RELEASE, rng) for p in pi])
    seconds = time.perf_counter() - t0
    ess = float(az.ess(idata, var_names=["pi"])["pi"].min())
    return {"seconds": seconds, "ess": ess, "ess_per_s": ess / seconds,
            "max_abs_error_of_means": float(np.abs(pi.mean(axis=0) - B2_EXACT_MEANS).max()),
            "true_table_mean_total": float(tables.sum(axis=1).mean())}


def run(model, draws, seed):
    t0 = time.perf_counter()
    idata = dp.sample(draws, tune=1000, chains=2, cores=2, random_seed=seed, progressbar=False,
                      model=model)
    seconds = time.perf_counter() - t0
    ess = float(az.ess(idata, var_names=["theta"])["theta"])
    draws_theta = idata.posterior["theta"].values
    return {"seconds": seconds, "ess": ess, "ess_per_s": ess / seconds,
            "mean": float(draws_theta.mean()), "sd": float(draws_theta.std())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    model = b1_model()
    run(model, 100, 0)  # compile
    rows = pd.DataFrame([run(model, args.draws, seed) for seed in range(1, args.repeats + 1)])
    med = rows.median()
    dapper_rate = DAPPER_B1["ess"] / DAPPER_B1["seconds"]
    table = pd.DataFrame([
        {"case": "B1 privatised mean", "method": "dpinfer.sample", "seconds": med["seconds"],
         "ESS theta": med["ess"], "ESS/s": med["ess_per_s"], "mean": med["mean"], "sd": med["sd"]},
        {"case": "B1 privatised mean", "method": "dapper 1.1.0 (published in issue 13)",
         "seconds": DAPPER_B1["seconds"], "ESS theta": DAPPER_B1["ess"], "ESS/s": dapper_rate},
        {"case": "B1 privatised mean", "method": "exact", "mean": B1_EXACT_MEAN, "sd": B1_EXACT_SD},
    ]).set_index(["case", "method"])
    with pd.option_context("display.width", 200, "display.max_columns", None,
                           "display.float_format", "{:.4g}".format):
        print(f"median of {args.repeats} runs, 2 chains x (1000 + {args.draws}):")
        print(table)
    print(f"\nB1: dpinfer / dapper ESS per second = {med['ess_per_s'] / dapper_rate:.0f}x (goal >= 100x)")

    rr, compiled = b2_compiled()
    run_b2(rr, compiled, 100, 0)  # warm
    b2 = pd.DataFrame([run_b2(rr, compiled, args.draws, seed) for seed in range(1, args.repeats + 1)])
    med2 = b2.median()
    with pd.option_context("display.width", 200, "display.max_columns", None,
                           "display.float_format", "{:.4g}".format):
        print(f"\nB2 randomised response, median of {args.repeats} runs, 2 chains x (1000 + {args.draws}):")
        print(b2)
    print(f"B2: {med2['ess_per_s']:.0f} ESS/s (min over the 4 cells), largest error of the posterior "
          f"means {med2['max_abs_error_of_means']:.4f}; dpinfer / dapper = "
          f"{med2['ess_per_s'] / DAPPER_B2_ESS_PER_S:.0f}x (goal >= 100x)")


if __name__ == "__main__":
    main()
