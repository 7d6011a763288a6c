r"""Information consumers of a count on N = {0..n} and the risk a mechanism gives them.

Seed 003 (Gupte & Sundararajan, PODS 2010), §2.3 of the paper, reference note §3.5:

* a mechanism for a count is a row-stochastic matrix X, x_{i,r} = P(release r | true count i),
  rows the true counts i in N, columns the outputs;
* a consumer has a loss l(i, r) for reporting r in N when the truth is i, and side information
  S ⊆ N (it knows the true count lies in S);
* its expected loss at i is sum_r l(i, r) x_{i,r} (:func:`risk_profile`); a minimax consumer
  scores X by L(X) = max_{i in S} sum_r l(i, r) x_{i,r} (paper Eq. 1; :func:`minimax_risk`); a
  Bayesian consumer (Ghosh, Roughgarden & Sundararajan 2009, note §4.3) by
  sum_i p_i sum_r l(i, r) x_{i,r} for a prior p on N (:func:`bayes_risk`).

The paper's Theorem 1 (the geometric mechanism is universally optimal) needs a loss that is
monotone: :func:`is_monotone_loss` reads the paper's "non-decreasing in |i - r|, for every i" as
the note's pitfall P7 reading (b), which admits asymmetric losses.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import numpy as np

from dpinfer._validation import as_integer_array, as_real_array, check_count, check_positive, refuse_bools

__all__ = [
    "BUILT_IN_LOSSES",
    "Consumer",
    "NonMonotoneLossWarning",
    "absolute_loss",
    "as_mechanism_matrix",
    "as_prior",
    "asymmetric_linear_loss",
    "bayes_risk",
    "check_consumer",
    "is_monotone_loss",
    "loss_matrix",
    "minimax_risk",
    "power_loss",
    "risk_profile",
    "squared_loss",
    "threshold_loss",
    "zero_one_loss",
]

# Rows of a mechanism matrix and a prior must sum to 1 within this (float round-off of exact laws).
ROW_SUM_TOLERANCE = 1e-9


class NonMonotoneLossWarning(UserWarning):
    """The loss is not monotone (note pitfall P7 (b)): Theorem 1 of seed 003 does not apply,
    so the geometric mechanism followed by the consumer's optimal remap may be worse for this
    consumer than the alpha-DP mechanism tailored to it (note §9, test 9)."""


# --- built-in losses: functions of n giving the (n+1) x (n+1) matrix l(i, r) ---------------------


def _distance(n) -> np.ndarray:
    """|i - r| for i, r in {0..n} (float64)."""
    values = np.arange(check_count("n", n, 1) + 1, dtype=np.float64)
    return np.abs(np.subtract.outer(values, values))


def absolute_loss(n) -> np.ndarray:
    """l(i, r) = |i - r|: the mean error ("the government", paper §2.3)."""
    return _distance(n)


def squared_loss(n) -> np.ndarray:
    """l(i, r) = (i - r)^2: the variance ("drug company", paper §2.3)."""
    return _distance(n) ** 2


def zero_one_loss(n) -> np.ndarray:
    """l(i, r) = 1[i != r]: the frequency of error (paper §2.3)."""
    return (_distance(n) > 0).astype(np.float64)


def threshold_loss(n, t) -> np.ndarray:
    """l(i, r) = 1[|i - r| > t] for a whole number t >= 0 (t = 0 is the 0-1 loss; note §10.5)."""
    t = check_count("t", t, 0)
    return (_distance(n) > t).astype(np.float64)


def power_loss(n, p) -> np.ndarray:
    """l(i, r) = |i - r|^p for a finite p > 0 (p = 1 absolute, p = 2 squared; note §10.5)."""
    p = check_positive("p", p)
    return _distance(n) ** p


def asymmetric_linear_loss(n, under, over) -> np.ndarray:
    """l(i, r) = under (i - r) for r < i and over (r - i) for r > i, with finite under, over > 0:
    reporting too low and too high cost different amounts per unit. Monotone in the note's
    reading P7 (b), not in reading (a); universality still held numerically (note §9, test 8)."""
    under = check_positive("under", under)
    over = check_positive("over", over)
    values = np.arange(check_count("n", n, 1) + 1, dtype=np.float64)
    diff = np.subtract.outer(values, values)  # i - r
    return np.where(diff > 0, under * diff, -over * diff)


BUILT_IN_LOSSES: dict[str, Callable[[int], np.ndarray]] = {
    "absolute": absolute_loss,
    "squared": squared_loss,
    "zero-one": zero_one_loss,
}


def _check_loss_name(loss: str) -> str:
    if not isinstance(loss, str) or loss not in BUILT_IN_LOSSES:
        raise ValueError(
            f"loss must be one of {sorted(BUILT_IN_LOSSES)}, a function of n or an "
            f"(n+1) x (n+1) matrix, got {loss!r}"
        )
    return loss


def _square_loss(name: str, values) -> np.ndarray:
    """A finite square (n+1) x (n+1) matrix with n >= 1."""
    L = as_real_array(name, values)
    if L.ndim != 2 or L.shape[0] != L.shape[1] or L.shape[0] < 2:
        raise ValueError(f"{name} must be a square (n+1) x (n+1) loss matrix with n >= 1, got shape {L.shape}")
    return L


def loss_matrix(loss, n) -> np.ndarray:
    """The (n+1) x (n+1) loss matrix l(i, r) (rows the true counts, columns the reports).

    ``loss`` is a name in :data:`BUILT_IN_LOSSES` ("absolute", "squared", "zero-one"), a
    function of n returning the matrix (e.g. ``functools.partial(threshold_loss, t=1)``,
    ``functools.partial(power_loss, p=1.5)``), or the matrix itself. Entries must be finite.
    """
    n = check_count("n", n, 1)
    if isinstance(loss, str):
        matrix = BUILT_IN_LOSSES[_check_loss_name(loss)](n)
    elif callable(loss):
        matrix = loss(n)
    else:
        matrix = loss
    matrix = as_real_array("loss", matrix)
    if matrix.shape != (n + 1, n + 1):
        raise ValueError(
            f"loss must be an (n+1) x (n+1) = {n + 1} x {n + 1} matrix l(i, r) for n = {n}, "
            f"got shape {matrix.shape}"
        )
    return matrix


def is_monotone_loss(L, rows=None) -> bool:
    """True if every row i of the loss matrix L is non-decreasing as r moves away from i on
    each side separately: l(i, r+1) >= l(i, r) for r >= i and l(i, r-1) >= l(i, r) for r <= i.

    This is reading (b) of the paper's "monotone non-decreasing in |i - r|, for every i" (note
    pitfall P7): it admits asymmetric losses. ``rows`` restricts the check to those true counts
    (a consumer's side information: other rows never enter its risk). Exact comparisons.
    """
    L = _square_loss("L", L)
    rows = range(L.shape[0]) if rows is None else _side_indices("rows", rows, L.shape[0] - 1)
    return all(
        np.all(np.diff(L[i, i:]) >= 0) and np.all(np.diff(L[i, : i + 1]) <= 0) for i in rows
    )


def _side_indices(name: str, values, n: int | None) -> np.ndarray:
    """Sorted distinct whole numbers in {0..n} (n = None: any count >= 0), at least one."""
    if isinstance(values, (set, frozenset)):
        values = list(values)
    refuse_bools(name, values, "whole counts")
    idx = np.unique(as_integer_array(name, values).ravel())
    allowed = "counts >= 0" if n is None else f"a subset of {{0..{n}}}"
    if idx.size == 0:
        raise ValueError(f"{name} must hold at least one count ({allowed})")
    if idx[0] < 0 or (n is not None and idx[-1] > n):
        raise ValueError(f"{name} must be {allowed}, got {idx.tolist()}")
    return idx


def _loss_label(loss) -> str:
    if isinstance(loss, str):
        return loss
    if isinstance(loss, functools.partial):
        args = ", ".join(f"{k}={v!r}" for k, v in loss.keywords.items())
        return f"{loss.func.__name__}({args})"
    if callable(loss):
        return getattr(loss, "__name__", type(loss).__name__)
    return "loss matrix"


class Consumer:
    r"""A minimax information consumer (seed 003, paper §2.3; note §3.5).

    ``loss``: what :func:`loss_matrix` accepts (a built-in name, a function of n, or an
    (n+1) x (n+1) matrix l(i, r), which then fixes n). ``side_information``: the set S ⊆ N of
    counts the consumer knows the truth lies in (whole numbers; ``None`` means S = N). Its risk
    for a mechanism X is max_{i in S} sum_r l(i, r) x_{i,r} (paper Eq. 1).

    Policy on non-monotone losses (note pitfall P7): accepted, with a
    :class:`NonMonotoneLossWarning` the first time the loss matrix is built for a given n (at
    construction for a matrix loss), because Theorem 1 then does not apply: the optimal remap
    and the optimal mechanism remain correct LP optima, but the geometric mechanism plus remap
    may fall short of the tailored optimum. Only the rows in S are checked.
    """

    def __init__(self, loss, side_information=None, name=None):
        self._fixed_n = None
        if isinstance(loss, str):
            _check_loss_name(loss)
        elif not callable(loss):
            loss = _square_loss("loss", loss)
            self._fixed_n = loss.shape[0] - 1
        self._loss = loss
        if side_information is None:
            self.side_information = None
        else:
            idx = _side_indices("side_information", side_information, self._fixed_n)
            self.side_information = tuple(int(v) for v in idx)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string or None, got {type(name).__name__}")
        if name is None:
            s = "N" if self.side_information is None else "{" + ", ".join(map(str, self.side_information)) + "}"
            name = f"{_loss_label(loss)}, S={s}"
        self.name = name
        self._matrices: dict[int, np.ndarray] = {}
        if self._fixed_n is not None:
            self.loss_matrix(self._fixed_n)

    def __repr__(self) -> str:
        return f"Consumer({self.name!r})"

    def side_set(self, n) -> np.ndarray:
        """S as a sorted int array (all of {0..n} without side information); S must lie in
        {0..n}."""
        n = check_count("n", n, 1)
        if self.side_information is None:
            return np.arange(n + 1)
        return _side_indices("side_information", self.side_information, n)

    def loss_matrix(self, n) -> np.ndarray:
        """The (n+1) x (n+1) loss matrix l(i, r) (read-only); warns once per n if it is not
        monotone on the rows in S (see the class docstring)."""
        n = check_count("n", n, 1)
        if n not in self._matrices:
            if self._fixed_n is not None and n != self._fixed_n:
                raise ValueError(f"this consumer's loss matrix is for n = {self._fixed_n}, got n = {n}")
            matrix = loss_matrix(self._loss, n)
            if not is_monotone_loss(matrix, rows=self.side_set(n)):
                warnings.warn(
                    f"consumer {self.name!r}: the loss is not monotone (non-decreasing moving away "
                    "from the truth on each side) for some i in S, so seed 003's Theorem 1 does not "
                    "apply: the geometric mechanism plus the optimal remap may be worse than the "
                    "tailored optimal mechanism",
                    NonMonotoneLossWarning,
                    stacklevel=2,
                )
            matrix.setflags(write=False)
            self._matrices[n] = matrix
        return self._matrices[n]


# --- mechanisms, priors and risks ---------------------------------------------------------------


def as_mechanism_matrix(name: str, values) -> np.ndarray:
    """A mechanism (or remap) matrix as float64: 2-D with at least two rows, entries >= 0,
    every row summing to 1 within 1e-9 (a probability distribution over the outputs)."""
    X = as_real_array(name, values)
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1:
        raise ValueError(
            f"{name} must be a 2-D matrix with at least 2 rows (true counts 0..n), got shape {X.shape}"
        )
    if np.any(X < 0):
        raise ValueError(f"{name} must have entries >= 0, found {float(X.min())!r}")
    worst = float(np.max(np.abs(X.sum(axis=1) - 1.0)))
    if worst > ROW_SUM_TOLERANCE:
        raise ValueError(
            f"{name} rows must sum to 1 (within {ROW_SUM_TOLERANCE:g}); worst row is off by {worst:.3g}"
        )
    return X


def as_prior(prior, n: int) -> np.ndarray:
    """A prior on {0..n}: n+1 finite entries >= 0 summing to 1 within 1e-9."""
    p = as_real_array("prior", prior)
    if p.shape != (n + 1,):
        raise ValueError(f"prior must have n+1 = {n + 1} entries (counts 0..{n}), got shape {p.shape}")
    if np.any(p < 0):
        raise ValueError(f"prior must have entries >= 0, found {float(p.min())!r}")
    if abs(float(p.sum()) - 1.0) > ROW_SUM_TOLERANCE:
        raise ValueError(f"prior must sum to 1 (within {ROW_SUM_TOLERANCE:g}), got {float(p.sum())!r}")
    return p


def _square_mechanism(name: str, X) -> tuple[np.ndarray, int]:
    X = as_mechanism_matrix(name, X)
    if X.shape[0] != X.shape[1]:
        raise ValueError(
            f"{name} must be (n+1) x (n+1): reports lie in {{0..n}} like the true counts, got shape {X.shape}"
        )
    return X, X.shape[0] - 1


def row_risks(X: np.ndarray, L: np.ndarray) -> np.ndarray:
    """sum_r l(i, r) x_{i,r} for every i (no validation: the LP solvers' own output)."""
    return np.einsum("ir,ir->i", X, L)


def risk_profile(X, loss) -> np.ndarray:
    """Expected loss at every true count: R_i = sum_{r in N} l(i, r) x_{i,r} (paper §2.3).

    ``X``: an (n+1) x (n+1) mechanism; ``loss``: a loss as :func:`loss_matrix` accepts, or a
    :class:`Consumer` (its loss; side information is ignored here). Table 1 of the paper
    (corrected, note §7): G_{3,1/4} with |i - r| gives [21/80, 9/20, 9/20, 21/80].
    """
    X, n = _square_mechanism("X", X)
    L = loss.loss_matrix(n) if isinstance(loss, Consumer) else loss_matrix(loss, n)
    return row_risks(X, L)


def check_consumer(consumer) -> Consumer:
    """A :class:`Consumer` instance (TypeError otherwise)."""
    if not isinstance(consumer, Consumer):
        raise TypeError(f"consumer must be a Consumer, got {type(consumer).__name__}")
    return consumer


def minimax_risk(X, consumer: Consumer) -> float:
    """L(X) = max_{i in S} sum_{r in N} l(i, r) x_{i,r} (paper Eq. 1): the consumer's worst
    expected loss over the counts its side information allows."""
    consumer = check_consumer(consumer)
    X, n = _square_mechanism("X", X)
    return float(np.max(row_risks(X, consumer.loss_matrix(n))[consumer.side_set(n)]))


def bayes_risk(X, prior, loss) -> float:
    """sum_i p_i sum_{r in N} l(i, r) x_{i,r}: the Bayes risk of X for a prior p on {0..n}
    (Ghosh, Roughgarden & Sundararajan 2009; note §4.3). ``loss`` as :func:`loss_matrix`."""
    X, n = _square_mechanism("X", X)
    return float(as_prior(prior, n) @ row_risks(X, loss_matrix(loss, n)))
