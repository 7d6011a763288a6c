"""Multiple imputation from a dp.sample result, and Rubin's rules.

The posterior draws of the true counts are imputations of the confidential data: an analyst
with a complete-data method (an estimate and its variance from a table of counts) runs it on
M of them and combines the M results by Rubin's rules (:func:`rubin`), as for any multiply
imputed data set. :func:`imputations` picks M posterior draws spread over the chains and far
apart within each chain (nearly independent draws, as the rules assume).

Which complete-data variance? It decides the estimand (``estimand=`` of the analyses here):

* ``"realised"``: the total (or share) of the counts that exist, S = sum x_i. With the
  complete data it is known exactly: complete-data variance 0. Rubin's T = (1 + 1/M) B is
  then the between-imputation (posterior) variance and the interval, with nu = M - 1 degrees
  of freedom, approximates the posterior interval of S.
* ``"expected"``: the expected total Lambda = sum mu_i of a Poisson superpopulation, x_i ~
  Poisson(mu_i) independently with unrestricted cell means (the saturated model): the
  complete-data estimate sum x_i has variance sum mu_i, estimated by sum x_i. For the share
  of a group of cells G, p = X_G / N, conditioning on the total N (multinomial sampling, or
  independent Poissons given their sum) gives X_G ~ Binomial(N, pi_G) with pi_G =
  sum_G mu_i / sum mu_i, so the variance p (1 - p) / N (the delta-method variance of
  X_G / (X_G + X_rest) for independent Poissons). These target Lambda and pi_G; used for the
  realised S or X_G / S they add the Poisson sampling variance of the data themselves, which
  S does not have, and over-cover.

The complete-data analyses are asymptotic (large-sample Poisson/binomial), so their
complete-data degrees of freedom are infinite and Barnard and Rubin's (1999) small-sample
degrees of freedom reduce to Rubin's (1987) nu_old = (M - 1)(1 + 1/r)^2; :func:`rubin` takes a
finite ``complete_df`` for analyses that have one (a t- or regression analysis).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr
from scipy import stats

from dpinfer.utility.analysis import posterior_draws

ESTIMANDS = ("expected", "realised")
DF_METHODS = ("barnard-rubin", "rubin")


def imputations(idata, var_name: str, m: int, rng=None) -> xr.DataArray:
    """M completed data sets: posterior draws of ``var_name`` (the true counts), dims
    (``imputation``, ...), with the ``chain`` and ``draw`` each came from as coordinates.

    The M imputations are shared out among the C chains as evenly as possible (the first
    M mod C chains take one more; chain-major order), so every chain contributes when M >= C;
    within a chain holding k of them they are D / k draws apart (D draws per chain) after a
    random offset in [0, D / k) (``rng``: a numpy Generator or seed). Requires M <= C D."""
    draws = posterior_draws(idata, var_name)
    n_chains, n_draws = draws.sizes["chain"], draws.sizes["draw"]
    if int(m) != m or not 1 <= m <= n_chains * n_draws:
        raise ValueError(f"m must be a whole number in 1..{n_chains * n_draws} (chains x draws), got {m!r}")
    m = int(m)
    rng = np.random.default_rng(rng)
    chain_index, draw_index = [], []
    for chain in range(n_chains):
        k = len(range(chain, m, n_chains))
        if k == 0:
            continue
        spacing = n_draws / k
        picks = np.floor(rng.uniform(0, spacing) + spacing * np.arange(k)).astype(np.int64)
        chain_index += [chain] * k
        draw_index += list(np.minimum(picks, n_draws - 1))
    completed = draws.isel(chain=xr.DataArray(np.asarray(chain_index), dims="imputation"),
                           draw=xr.DataArray(np.asarray(draw_index), dims="imputation"))
    return completed.assign_coords(imputation=np.arange(m))


def total_analysis(completed, *, dim=None, estimand: str = "expected") -> tuple[np.ndarray, np.ndarray]:
    """The complete-data analysis of the total of the counts, on each imputation: (estimates,
    variances), each of shape (M,) (or (M, ...) for the dimensions not summed over). The
    estimate is the sum over ``dim`` (default every cell dimension); the variance is the sum
    itself for ``estimand="expected"`` (Poisson: targets the expected total sum mu_i) and 0
    for ``"realised"`` (targets the realised total); module docstring."""
    counts = _as_completed(completed)
    _check_estimand(estimand)
    over = cell_dims_of(counts) if dim is None else ([dim] if isinstance(dim, str) else list(dim))
    total = counts.sum(over).astype(float).values
    variance = total.copy() if estimand == "expected" else np.zeros_like(total)
    return total, variance


def share_analysis(completed, cells, *, dim=None, estimand: str = "expected") -> tuple[np.ndarray, np.ndarray]:
    """The complete-data analysis of the share p = X_G / N of a group G of cells in the total
    N, on each imputation: (estimates, variances), each of shape (M,). ``cells`` are labels of
    ``dim``'s coordinate (positions where it has none), or a boolean mask along ``dim``.
    Variance p (1 - p) / N (binomial given N: multinomial sampling; the delta method for
    independent Poissons) for ``estimand="expected"``, 0 for ``"realised"``. NaN where N = 0."""
    counts = _as_completed(completed)
    _check_estimand(estimand)
    dims = cell_dims_of(counts)
    if dim is None:
        if len(dims) != 1:
            raise ValueError(f"the counts have cell dimensions {dims}; pass dim=")
        dim = dims[0]
    mask = np.asarray(cells)
    if mask.dtype == bool:
        group = counts.isel({dim: np.flatnonzero(mask)})
    else:
        labels = [cells] if np.ndim(cells) == 0 else list(cells)
        group = (counts.sel if dim in counts.indexes else counts.isel)({dim: labels})
    x_group = group.sum(dim).astype(float).values
    n = counts.sum(dim).astype(float).values
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(n > 0, x_group / np.where(n > 0, n, 1), np.nan)
        variance = share * (1 - share) / n if estimand == "expected" else np.where(n > 0, 0.0, np.nan)
    return share, variance


def cell_dims_of(counts: xr.DataArray) -> list[str]:
    return [d for d in counts.dims if d != "imputation"]


def _as_completed(completed) -> xr.DataArray:
    if isinstance(completed, xr.DataArray):
        if "imputation" not in completed.dims:
            raise ValueError(f"expected an 'imputation' dimension, got dims {completed.dims}")
        return completed
    values = np.asarray(completed)
    if values.ndim < 1:
        raise ValueError("completed data need a first axis of imputations")
    return xr.DataArray(values, dims=("imputation", *[f"cell_dim_{i}" for i in range(values.ndim - 1)]))


def _check_estimand(estimand: str) -> None:
    if not isinstance(estimand, str) or estimand not in ESTIMANDS:
        raise ValueError(f"estimand must be one of {ESTIMANDS}, got {estimand!r}")


@dataclass(frozen=True)
class RubinResult:
    """Rubin's rules for M complete-data analyses of a scalar estimand (elementwise for
    arrays), with the notation of van Buuren (2018), Flexible Imputation of Missing Data,
    §2.3:

    * ``estimate`` Q̄ = mean of the M estimates; ``within`` Ū = mean of their variances;
      ``between`` B = sample variance of the estimates (divisor M - 1);
    * ``total`` T = Ū + (1 + 1/M) B; ``std_error`` = sqrt(T);
    * ``lam`` λ = (1 + 1/M) B / T (proportion of the variance due to the missing data);
      ``riv`` r = (1 + 1/M) B / Ū (relative increase in variance) = λ / (1 - λ);
    * ``df_old`` ν_old = (M - 1) / λ² = (M - 1)(1 + 1/r)² (Rubin 1987);
      ``df_obs`` ν_obs = (ν_com + 1) / (ν_com + 3) ν_com (1 - λ); ``df`` ν = ν_old ν_obs /
      (ν_old + ν_obs) (Barnard & Rubin 1999; ν_old where ν_com is infinite, ν_obs where B =
      0);
    * ``fmi`` γ = (r + 2 / (ν + 3)) / (1 + r) (fraction of missing information).
    """

    m: int
    estimate: float | np.ndarray
    within: float | np.ndarray
    between: float | np.ndarray
    total: float | np.ndarray
    riv: float | np.ndarray
    lam: float | np.ndarray
    df_old: float | np.ndarray
    df_obs: float | np.ndarray
    df: float | np.ndarray
    fmi: float | np.ndarray
    complete_df: float

    @property
    def std_error(self):
        return np.sqrt(self.total)

    def interval(self, prob: float = 0.95, *, df: str = "barnard-rubin"):
        """(lower, upper): Q̄ ± t_ν((1 + prob) / 2) sqrt(T), with ν from ``df``:
        ``"barnard-rubin"`` (default) or ``"rubin"`` (ν_old, Rubin 1987)."""
        if not 0 < prob < 1:
            raise ValueError(f"prob must be in (0, 1), got {prob!r}")
        if not isinstance(df, str) or df not in DF_METHODS:
            raise ValueError(f"df must be one of {DF_METHODS}, got {df!r}")
        nu = self.df if df == "barnard-rubin" else self.df_old
        with np.errstate(invalid="ignore"):
            half = stats.t.ppf((1 + prob) / 2, nu) * self.std_error
        return _scalar(self.estimate - half), _scalar(self.estimate + half)


def rubin(estimates, variances, *, complete_df: float = np.inf) -> RubinResult:
    """Combine M complete-data analyses (``estimates`` and ``variances`` of shape (M,) or
    (M, ...): elementwise) by Rubin's rules (:class:`RubinResult`). ``complete_df``: the
    complete-data degrees of freedom ν_com of the analysis (infinite for large-sample
    analyses, as the total and share analyses here). With complete-data variances 0 (the
    realised estimand) λ = 1, so a finite ν_com gives ν_obs = 0 = ν: keep ν_com infinite
    there (ν = ν_old = M - 1)."""
    q = np.asarray(estimates, dtype=float)
    u = np.asarray(variances, dtype=float)
    if q.shape != u.shape or q.ndim < 1:
        raise ValueError(f"estimates and variances need the same shape (M, ...); got {q.shape} and {u.shape}")
    m = q.shape[0]
    if m < 2:
        raise ValueError(f"Rubin's rules need at least 2 imputations, got {m}")
    if np.any(u < 0):
        raise ValueError("variances must be >= 0")
    if not complete_df > 0:
        raise ValueError(f"complete_df must be > 0, got {complete_df!r}")
    q_bar = q.mean(axis=0)
    u_bar = u.mean(axis=0)
    b = q.var(axis=0, ddof=1)
    extra = (1 + 1 / m) * b
    t = u_bar + extra
    none_missing = b == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        riv = np.where(none_missing, 0.0, extra / u_bar)
        lam = np.where(none_missing, 0.0, extra / t)
        df_old = np.where(none_missing, np.inf, (m - 1) / lam**2)
        if np.isinf(complete_df):
            df_obs = np.where(lam < 1, np.inf, np.nan)
            df = df_old
        else:
            df_obs = (complete_df + 1) / (complete_df + 3) * complete_df * (1 - lam)
            df = np.where(none_missing, df_obs, df_old * df_obs / (df_old + df_obs))
        fmi = np.where(np.isinf(riv), 1.0, (riv + 2 / (df + 3)) / (1 + riv))
    return RubinResult(
        m=m, estimate=_scalar(q_bar), within=_scalar(u_bar), between=_scalar(b), total=_scalar(t),
        riv=_scalar(riv), lam=_scalar(lam), df_old=_scalar(df_old), df_obs=_scalar(df_obs),
        df=_scalar(df), fmi=_scalar(fmi), complete_df=float(complete_df))


def _scalar(value):
    value = np.asarray(value, dtype=float)
    return float(value) if value.ndim == 0 else value
