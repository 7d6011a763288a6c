"""B3 reference sampler: dapper's data-augmentation MCMC for privatised linear regression, in numba.

What it is
----------
An independent reference for the B3 benchmark (Ju, Awan, Gong & Rao's privatised linear
regression example). It implements the data-augmentation MCMC of Ju et al. (2022), the algorithm
of the R package dapper, with the sweep loop compiled by numba. It serves two purposes:

1. an independent check of the posterior that dpinfer obtains by NUTS for B3 (nothing of
   dpinfer is imported here);
2. a same-language (compiled Python) baseline of dapper's algorithm, for ESS per second.

The model (B3)
--------------
N = 100 records (x_i, y_i), x_i in R^2,

    x_i ~ N2(mu_x, I),  mu_x = (0.90014, -1.17335)  (known)
    y_i | x_i, beta ~ N(beta0 + beta1 x_i1 + beta2 x_i2, sigma^2),  sigma^2 = 2  (known)
    beta ~ N(0, 2^2 I_3).

Each of x_i1, x_i2, y_i is clamped to [-10, 10] and divided by 10: c(v) = clip(v, -10, 10) / 10,
design row d_i = (1, c(x_i1), c(x_i2)), response u_i = c(y_i). The released statistic is
record-additive, T = sum_i t(x_i, y_i), with the 9 entries, in this order,

    [XY1, XY2, XY3, YY, XX21, XX31, XX32, XX22, XX33]
    = [sum u, sum d2 u, sum d3 u, sum u^2, sum d2, sum d3, sum d2 d3, sum d2^2, sum d3^2]

(the (1,1) entry of D'D is N and is not released with noise). Each entry gets independent
Laplace noise of scale 13 / epsilon (Ju et al.'s Delta = 13), epsilon = 10 for the published
release ``PUBLISHED_RELEASE``.

The algorithm (Ju et al. 2022, Algorithm 1; dapper)
---------------------------------------------------
State: beta, the N records and the current statistic T. One sweep:

1. beta | records: exact conjugate draw from N(m, V), V = (X'X / sigma^2 + I / 4)^{-1},
   m = V X'y / sigma^2, with X = [1, x1, x2] and y UNCLAMPED (the model's regression).
2. for i = 1..N in turn: propose (x*_i, y*_i) from the model given beta, set
   T* = T - t(x_i, y_i) + t(x*_i, y*_i) and accept with probability
   min(1, exp(-(||s - T*||_1 - ||s - T||_1) / b)), b = 13 / epsilon (the model density cancels
   because the proposal is the model; the ratio is the Laplace mechanism's).

T is updated incrementally within a sweep and recomputed from the records at the start of each
sweep (no floating-point drift). Records are initialised from the prior predictive (beta drawn
from the prior). Random numbers come from numba's own NumPy-compatible generator, seeded inside
the compiled function, so a chain is a deterministic function of its seed.

Sources
-------
N. P. Ju, J. A. Awan, R. Gong and V. A. Rao (2022), "Data Augmentation MCMC for Bayesian
Inference from Privatized Data", NeurIPS 2022 (arXiv:2206.00710); companion repository
github.com/nianqiaoju/dataaugmentation-mcmc-differentialprivacy (linearregression_gibbs.R);
the R package dapper (Awan, Eng, Gong, Ju & Rao).

Run
---
    .venv/bin/python benchmarks/b3_reference.py [--sweeps 200000] [--chains 4] [--seed 1]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

N_RECORDS = 100
MU_X = np.array([0.90014, -1.17335])
SIGMA2 = 2.0
PRIOR_SD = 2.0
CLAMP = 10.0
DELTA = 13.0  # Laplace scale = DELTA / epsilon
EPSILON = 10.0
STAT_NAMES = ("XY1", "XY2", "XY3", "YY", "XX21", "XX31", "XX32", "XX22", "XX33")
PUBLISHED_RELEASE = np.array([-38.24398, -6.67830, 3.19974, 27.19852, 9.88348, -13.85033,
                              -2.28842, 2.18818, 3.40915])
DEFAULT_BURN = 2000


# --------------------------------------------------------------------------- compiled kernels

@numba.njit(cache=True)
def _clamp(v):
    if v > CLAMP:
        v = CLAMP
    elif v < -CLAMP:
        v = -CLAMP
    return v / CLAMP


@numba.njit(cache=True)
def _record_stat(x1, x2, y, out):
    """t(x, y) for one record, written into ``out`` (9 values, order of STAT_NAMES)."""
    d2 = _clamp(x1)
    d3 = _clamp(x2)
    u = _clamp(y)
    out[0] = u
    out[1] = d2 * u
    out[2] = d3 * u
    out[3] = u * u
    out[4] = d2
    out[5] = d3
    out[6] = d2 * d3
    out[7] = d2 * d2
    out[8] = d3 * d3


@numba.njit(cache=True)
def _statistic_into(x, y, out):
    tmp = np.empty(9)
    out[:] = 0.0
    for i in range(y.shape[0]):
        _record_stat(x[i, 0], x[i, 1], y[i], tmp)
        for k in range(9):
            out[k] += tmp[k]


@numba.njit(cache=True)
def _l1_distance(s, t):
    acc = 0.0
    for k in range(s.shape[0]):
        acc += abs(s[k] - t[k])
    return acc


@numba.njit(cache=True)
def log_acceptance_ratio(release, t_current, t_proposed, scale):
    """Log Metropolis-Hastings ratio of a record move: -(|s - T*|_1 - |s - T|_1) / scale."""
    return -(_l1_distance(release, t_proposed) - _l1_distance(release, t_current)) / scale


@numba.njit(cache=True)
def _beta_precision_and_rhs(x, y, sigma2, prior_sd):
    """Posterior precision P = X'X/sigma2 + I/prior_sd^2 and r = X'y/sigma2 (X = [1, x])."""
    prec = np.zeros((3, 3))
    rhs = np.zeros(3)
    row = np.empty(3)
    row[0] = 1.0
    for i in range(y.shape[0]):
        row[1] = x[i, 0]
        row[2] = x[i, 1]
        for a in range(3):
            rhs[a] += row[a] * y[i]
            for b in range(3):
                prec[a, b] += row[a] * row[b]
    for a in range(3):
        rhs[a] /= sigma2
        for b in range(3):
            prec[a, b] /= sigma2
        prec[a, a] += 1.0 / (prior_sd * prior_sd)
    return prec, rhs


@numba.njit(cache=True)
def _cholesky3(a):
    """Lower Cholesky factor of a 3x3 symmetric positive-definite matrix."""
    low = np.zeros((3, 3))
    for j in range(3):
        s = a[j, j]
        for k in range(j):
            s -= low[j, k] * low[j, k]
        low[j, j] = np.sqrt(s)
        for i in range(j + 1, 3):
            s = a[i, j]
            for k in range(j):
                s -= low[i, k] * low[j, k]
            low[i, j] = s / low[j, j]
    return low


@numba.njit(cache=True)
def _draw_beta(x, y, sigma2, prior_sd, beta):
    """Step 1: beta ~ N(P^{-1} r, P^{-1}), written into ``beta``.

    With P = L L': m solves L L' m = r; the draw is m + L'^{-1} z, z ~ N(0, I).
    """
    prec, rhs = _beta_precision_and_rhs(x, y, sigma2, prior_sd)
    low = _cholesky3(prec)
    # forward: L w = r
    w = np.empty(3)
    for i in range(3):
        s = rhs[i]
        for k in range(i):
            s -= low[i, k] * w[k]
        w[i] = s / low[i, i]
    # back: L' v = w + z  gives v = m + L'^{-1} z
    for i in range(3):
        w[i] += np.random.standard_normal()
    for i in range(2, -1, -1):
        s = w[i]
        for k in range(i + 1, 3):
            s -= low[k, i] * beta[k]
        beta[i] = s / low[i, i]


@numba.njit(cache=True)
def _draw_beta_many(x, y, sigma2, prior_sd, n_draws, seed):
    np.random.seed(seed)
    out = np.empty((n_draws, 3))
    beta = np.empty(3)
    for j in range(n_draws):
        _draw_beta(x, y, sigma2, prior_sd, beta)
        out[j, :] = beta
    return out


@numba.njit(cache=True)
def _chain(n_sweeps, burn, seed, release, scale, n_records, mu_x, sigma2, prior_sd):
    np.random.seed(seed)
    sd_y = np.sqrt(sigma2)
    beta = np.empty(3)
    for a in range(3):
        beta[a] = prior_sd * np.random.standard_normal()
    x = np.empty((n_records, 2))
    y = np.empty(n_records)
    for i in range(n_records):
        x[i, 0] = mu_x[0] + np.random.standard_normal()
        x[i, 1] = mu_x[1] + np.random.standard_normal()
        y[i] = (beta[0] + beta[1] * x[i, 0] + beta[2] * x[i, 1]
                + sd_y * np.random.standard_normal())

    draws = np.empty((n_sweeps, 3))
    distance = np.empty(n_sweeps)
    t_cur = np.empty(9)
    t_new = np.empty(9)
    s_old = np.empty(9)
    s_new = np.empty(9)
    accepted = 0
    for it in range(burn + n_sweeps):
        # 1. beta | records (conjugate, unclamped regression)
        _draw_beta(x, y, sigma2, prior_sd, beta)
        # 2. records one at a time, independence proposals from the model
        _statistic_into(x, y, t_cur)
        dist = _l1_distance(release, t_cur)
        for i in range(n_records):
            x1 = mu_x[0] + np.random.standard_normal()
            x2 = mu_x[1] + np.random.standard_normal()
            yy = beta[0] + beta[1] * x1 + beta[2] * x2 + sd_y * np.random.standard_normal()
            _record_stat(x[i, 0], x[i, 1], y[i], s_old)
            _record_stat(x1, x2, yy, s_new)
            dist_new = 0.0
            for k in range(9):
                t_new[k] = t_cur[k] - s_old[k] + s_new[k]
                dist_new += abs(release[k] - t_new[k])
            log_r = -(dist_new - dist) / scale
            if log_r >= 0.0 or np.log(np.random.random()) < log_r:
                x[i, 0] = x1
                x[i, 1] = x2
                y[i] = yy
                t_cur[:] = t_new
                dist = dist_new
                if it >= burn:
                    accepted += 1
        if it >= burn:
            draws[it - burn, :] = beta
            distance[it - burn] = dist
    return draws, distance, accepted


# --------------------------------------------------------------------------- Python API

def clamp(v):
    """c(v) = clip(v, -10, 10) / 10 (NumPy, elementwise)."""
    return np.clip(np.asarray(v, dtype=float), -CLAMP, CLAMP) / CLAMP


def record_statistic(x1: float, x2: float, y: float) -> np.ndarray:
    """t(x, y) of one record (9 values, order of ``STAT_NAMES``)."""
    out = np.empty(9)
    _record_stat(float(x1), float(x2), float(y), out)
    return out


def statistic(x, y) -> np.ndarray:
    """T = sum_i t(x_i, y_i) for records x (N x 2) and y (N,)."""
    x = np.ascontiguousarray(x, dtype=float)
    y = np.ascontiguousarray(y, dtype=float)
    out = np.empty(9)
    _statistic_into(x, y, out)
    return out


def beta_conditional(x, y, *, sigma2=SIGMA2, prior_sd=PRIOR_SD):
    """(m, V) of beta | x, y: V = (X'X/sigma2 + I/prior_sd^2)^{-1}, m = V X'y / sigma2."""
    x = np.ascontiguousarray(x, dtype=float)
    y = np.ascontiguousarray(y, dtype=float)
    prec, rhs = _beta_precision_and_rhs(x, y, float(sigma2), float(prior_sd))
    cov = np.linalg.inv(prec)
    return cov @ rhs, cov


def draw_beta_conditional(x, y, n_draws, seed, *, sigma2=SIGMA2, prior_sd=PRIOR_SD):
    """``n_draws`` independent draws of step 1 (the compiled routine the sweep uses)."""
    x = np.ascontiguousarray(x, dtype=float)
    y = np.ascontiguousarray(y, dtype=float)
    return _draw_beta_many(x, y, float(sigma2), float(prior_sd), int(n_draws), int(seed))


def simulate_records(beta, rng, n_records=N_RECORDS):
    """N records (x, y) from the model given beta."""
    beta = np.asarray(beta, dtype=float)
    x = MU_X + rng.standard_normal((n_records, 2))
    y = beta[0] + x @ beta[1:] + np.sqrt(SIGMA2) * rng.standard_normal(n_records)
    return x, y


def simulate_release(beta, seed, *, epsilon=EPSILON, n_records=N_RECORDS):
    """Draw N records from the model given beta and release T with Laplace(13/epsilon) noise.

    Returns (release, true statistic), both of length 9.
    """
    rng = np.random.default_rng(seed)
    x, y = simulate_records(beta, rng, n_records)
    t_true = statistic(x, y)
    release = t_true + rng.laplace(0.0, DELTA / epsilon, size=9)
    return release, t_true


def run_chain(n_sweeps, seed, *, release=PUBLISHED_RELEASE, epsilon=EPSILON, burn=DEFAULT_BURN,
              n_records=N_RECORDS) -> dict:
    """One chain of ``burn + n_sweeps`` sweeps; keeps the last ``n_sweeps``.

    Returns a dict with ``beta`` (n_sweeps x 3), ``acceptance_rate`` (of record proposals after
    burn-in), ``l1_distance`` (|s - T|_1 after each kept sweep), ``seconds`` (wall time of the
    compiled chain, burn-in included), ``burn`` and ``seed``.
    """
    release = np.ascontiguousarray(release, dtype=float)
    if release.shape != (9,):
        raise ValueError("release must have the 9 entries " + ", ".join(STAT_NAMES))
    scale = DELTA / float(epsilon)
    t0 = time.perf_counter()
    draws, distance, accepted = _chain(int(n_sweeps), int(burn), int(seed), release, scale,
                                       int(n_records), MU_X, SIGMA2, PRIOR_SD)
    seconds = time.perf_counter() - t0
    return {"beta": draws, "acceptance_rate": accepted / (n_sweeps * n_records),
            "l1_distance": distance, "seconds": seconds, "burn": int(burn), "seed": int(seed)}


def warm_up():
    """Compile (or load from numba's cache) the kernels with a tiny run."""
    run_chain(2, 0, burn=1)


def reference_posterior(n_chains=4, n_sweeps=200_000, seed=1, *, release=PUBLISHED_RELEASE,
                        epsilon=EPSILON, burn=DEFAULT_BURN, n_records=N_RECORDS):
    """Run ``n_chains`` chains (seeds seed, seed+1, ...) one after another.

    Returns (idata, summary): ``idata`` an arviz DataTree with posterior ``beta`` (chain, draw,
    coef); ``summary`` a dict with per-coefficient ``mean``, ``sd``, ``mcse_mean``, ``mcse_sd``,
    ``ess_bulk``, ``ess_tail``, ``r_hat`` (arrays of 3), and ``min_ess_bulk``, ``seconds`` (sum of
    the chains' wall times, burn-in included), ``ess_per_second`` (min ESS bulk / seconds) and
    ``acceptance_rate`` (mean over chains).
    """
    import arviz as az

    warm_up()
    chains = [run_chain(n_sweeps, seed + c, release=release, epsilon=epsilon, burn=burn,
                        n_records=n_records) for c in range(n_chains)]
    beta = np.stack([c["beta"] for c in chains])
    idata = az.from_dict({"posterior": {"beta": beta}}, dims={"beta": ["coef"]},
                         coords={"coef": ["beta0", "beta1", "beta2"]})

    def _vals(tree):
        return np.asarray(tree["beta"].values, dtype=float)

    ess_bulk = _vals(az.ess(idata, var_names=["beta"], method="bulk"))
    seconds = float(sum(c["seconds"] for c in chains))
    summary = {
        "mean": beta.reshape(-1, 3).mean(axis=0),
        "sd": beta.reshape(-1, 3).std(axis=0, ddof=1),
        "mcse_mean": _vals(az.mcse(idata, var_names=["beta"], method="mean")),
        "mcse_sd": _vals(az.mcse(idata, var_names=["beta"], method="sd")),
        "ess_bulk": ess_bulk,
        "ess_tail": _vals(az.ess(idata, var_names=["beta"], method="tail")),
        "r_hat": _vals(az.rhat(idata, var_names=["beta"])),
        "min_ess_bulk": float(ess_bulk.min()),
        "seconds": seconds,
        "ess_per_second": float(ess_bulk.min()) / seconds,
        "acceptance_rate": float(np.mean([c["acceptance_rate"] for c in chains])),
        "n_chains": n_chains, "n_sweeps": n_sweeps, "burn": burn,
    }
    return idata, summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=200_000, help="kept sweeps per chain")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--burn", type=int, default=DEFAULT_BURN)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    warm_up()
    compile_s = time.perf_counter() - t0
    _, s = reference_posterior(args.chains, args.sweeps, args.seed, burn=args.burn)
    print(f"B3 reference posterior (data augmentation, numba): release epsilon = {EPSILON}, "
          f"N = {N_RECORDS}")
    print(f"{args.chains} chains x ({args.burn} burn + {args.sweeps} kept sweeps), seeds "
          f"{args.seed}..{args.seed + args.chains - 1}; compile/cache load {compile_s:.1f} s")
    print(f"{'':6s} {'mean':>10s} {'mcse':>8s} {'sd':>9s} {'mcse':>8s} {'ess_bulk':>9s} "
          f"{'ess_tail':>9s} {'r_hat':>7s}")
    for j, name in enumerate(["beta0", "beta1", "beta2"]):
        print(f"{name:6s} {s['mean'][j]:10.5f} {s['mcse_mean'][j]:8.5f} {s['sd'][j]:9.5f} "
              f"{s['mcse_sd'][j]:8.5f} {s['ess_bulk'][j]:9.0f} {s['ess_tail'][j]:9.0f} "
              f"{s['r_hat'][j]:7.4f}")
    print(f"max R-hat {s['r_hat'].max():.4f}; min ESS bulk {s['min_ess_bulk']:.0f}")
    print(f"wall time {s['seconds']:.1f} s (chains run serially, burn-in included); "
          f"ESS/s (min ESS bulk) {s['ess_per_second']:.1f}")
    print(f"record-proposal acceptance rate {s['acceptance_rate']:.4f}")


if __name__ == "__main__":
    main()
