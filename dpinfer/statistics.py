"""Record-additive statistics of confidential records, for the curator and the analyst alike.

A release of record-level data privatises a statistic T(x) = sum_i t(x_i) of n records, often
of clamped values (clamping bounds each record's contribution, hence the sensitivity). The
same function computes T on the curator's numpy arrays (the true statistic, before
``mechanism.release``) and on the analyst's PyTensor tensors of latent records (the true values
behind ``mechanism.observe``), so clamping is part of the model exactly as the curator applied
it. Each function takes numpy arrays or PyTensor tensors and returns the same kind.

Source of the regression statistic: Ju, Awan, Gong & Rao (NeurIPS 2022), "Data augmentation
MCMC for Bayesian inference from privatized data", §5.2 (and their companion repository
``nianqiaoju/dataaugmentation-mcmc-differentialprivacy``).

On PyTensor tensors each function also tags its output with what it computed
(``tag.dpinfer_clamp``, ``tag.dpinfer_record_statistic``), so that ``dpinfer.sample`` can
recognise a record-additive statistic of latent records and fit it by the law of the sum
(:mod:`dpinfer.inference.planning.record_sums`).
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable

from dpinfer._validation import check_bounds

__all__ = ["clamp", "power_sums", "power_sums_labels", "regression_statistic", "regression_statistic_labels"]


def _is_symbolic(*values) -> bool:
    return any(isinstance(v, Variable) for v in values)


def clamp(values, lower, upper, *, scale: bool = False):
    """min(max(v, lower), upper) elementwise; with ``scale=True`` then mapped affinely onto
    [-1, 1]: (2 v - lower - upper) / (upper - lower).

    ``lower < upper`` are public, data-independent numbers (checked: reversed or equal bounds
    are an error naming them). Works on numpy arrays (the curator's records) and PyTensor
    tensors (the analyst's latent records; the gradient is 0 where a record is clamped, and
    the density stays continuous).
    """
    lower, upper = check_bounds(lower, upper)
    symbolic = _is_symbolic(values)
    clamped = (pt.clip(values, lower, upper) if symbolic
               else np.clip(np.asarray(values, dtype=np.float64), lower, upper))
    # multiplied by the reciprocal of the width, not divided by it: in a model's log density
    # the bounds are data and the division would be paid per record per gradient
    out = 2.0 / (upper - lower) * clamped - (lower + upper) / (upper - lower) if scale else clamped
    if symbolic:
        out.tag.dpinfer_clamp = (values, lower, upper, bool(scale))
    return out


def power_sums(values, degree: int = 2):
    """[sum_i v_i, sum_i v_i^2, ..., sum_i v_i^degree] of n records ``values`` (usually
    clamped, :func:`clamp`): the record-additive statistic behind a released mean (degree 1)
    or mean and variance (degree 2: mean = S1 / n, variance = (S2 - S1^2 / n) / (n - 1)).
    ``values`` is a vector of n records (numpy array or PyTensor tensor)."""
    degree = _check_degree(degree)
    symbolic = _is_symbolic(values)
    if not symbolic:
        values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"values must be a vector of n records, got {values.ndim} dimensions")
    lib = pt if symbolic else np
    out = lib.stack([(values**k).sum() for k in range(1, degree + 1)])
    if symbolic:
        out.tag.dpinfer_record_statistic = ("power_sums", values, degree)
    return out


def power_sums_labels(degree: int = 2) -> list[str]:
    """Names of :func:`power_sums`'s entries: S1, ..., S<degree>."""
    return [f"S{k}" for k in range(1, _check_degree(degree) + 1)]


def _check_degree(degree) -> int:
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 1:
        raise ValueError(f"degree must be a whole number >= 1, got {degree!r}")
    return int(degree)


# Up to this many covariates a symbolic regression statistic is built entry by entry, each a sum
# of products of columns: the log density's gradient then fuses into a few loops, 2.2-3.3 times
# faster than the matrix products and fancy indexing of the Gram matrix at p = 2 (n = 100 and
# 10^4), about even at p = 5 and 1.4 times slower at p = 10 (numba, logp and gradient of a
# clamped regression with Laplace noise; measured 2026-12-03).
ELEMENTWISE_COLUMNS = 5


def _regression_entries_by_columns(design, response, columns: int):
    """:func:`regression_statistic`'s entries, in its order, as sums of products of columns
    (the intercept's column is 1, so its products are plain sums)."""
    full = [None] + [design[:, j] for j in range(columns)]  # None: the intercept

    def total(a, b):
        if a is None:
            return b.sum()
        return (a * b).sum()

    k = columns + 1
    rows, cols = np.tril_indices(k, k=-1)
    parts = ([total(full[j], response) for j in range(k)] + [total(response, response)]
             + [total(full[c], full[r]) for r, c in zip(rows, cols)]
             + [total(full[i], full[i]) for i in range(1, k)])
    return pt.stack(parts)


def regression_statistic(design, response):
    """The sufficient statistics of a linear regression with an intercept, as released by Ju
    et al. (2022):

        [X'y (p + 1 values), y'y, the entries of X'X below the diagonal (row by row:
         (2,1), (3,1), (3,2), ...), the diagonal of X'X without its (1,1) entry n],

    with X = [1, design] (n x (p + 1)) and y = ``response`` (n), both usually clamped and
    scaled (:func:`clamp`). Every entry is a sum over records, so the statistic is
    record-additive; X'X's (1,1) entry is n and is not part of it (it carries no noise).

    ``design`` is n x p, ``response`` has n values (numpy arrays or PyTensor tensors).
    """
    symbolic = _is_symbolic(design, response)
    lib = pt if symbolic else np
    if not symbolic:
        design = np.asarray(design, dtype=np.float64)
        response = np.asarray(response, dtype=np.float64)
    if design.ndim != 2:
        raise ValueError(f"design must be an n x p matrix of records, got {design.ndim} dimensions")
    if response.ndim != 1:
        raise ValueError(f"response must be a vector of n records, got {response.ndim} dimensions")
    if not symbolic and design.shape[0] != response.shape[0]:
        raise ValueError(f"design has {design.shape[0]} records but response has {response.shape[0]}")
    columns = design.type.shape[1] if symbolic else design.shape[1]
    if columns is None:
        raise ValueError("design must have a known number of columns (give the latent records a shape)")
    k = columns + 1
    if symbolic and columns <= ELEMENTWISE_COLUMNS:
        out = _regression_entries_by_columns(design, response, columns)
    else:
        full = lib.concatenate([lib.ones((design.shape[0], 1)), design], axis=1)
        gram = full.T @ full
        rows, cols = np.tril_indices(k, k=-1)
        diagonal = np.arange(1, k)
        parts = [full.T @ response, lib.stack([response @ response]), gram[rows, cols],
                 gram[diagonal, diagonal]]
        out = lib.concatenate(parts)
    if symbolic:
        out.tag.dpinfer_record_statistic = ("regression", design, response)
    return out


def regression_statistic_labels(p: int) -> list[str]:
    """Names of :func:`regression_statistic`'s entries for p covariates (1-based indices of
    X = [1, design])."""
    if int(p) != p or p < 1:
        raise ValueError(f"p must be a whole number >= 1, got {p!r}")
    k = p + 1
    rows, cols = np.tril_indices(k, k=-1)
    return ([f"XY[{i + 1}]" for i in range(k)] + ["YY"]
            + [f"XX[{r + 1},{c + 1}]" for r, c in zip(rows, cols)]
            + [f"XX[{i + 1},{i + 1}]" for i in range(1, k)])
