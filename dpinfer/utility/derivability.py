r"""Mechanism matrices on {0..n} and derivability from the range-restricted geometric
mechanism (seed 003: Gupte & Sundararajan, PODS 2010, Theorem 2; reference note §3.11, §5).

G_{n,alpha} is the law of clamp(i + e, 0, n), e double geometric with parameter alpha
(Definition 4; note §3.11, §12):

    G[k, z] = alpha^|z-k| / (1 + alpha)              z in {0, n},
    G[k, z] = (1 - alpha)/(1 + alpha) alpha^|z-k|    0 < z < n.

Theorem 2: a mechanism M on {0..n} is M = G T with T row-stochastic iff T = G^{-1} M >= 0, and
G^{-1} is tridiagonal (note §5, [derived, verified]), so derivability is a three-term condition
on every column x of M: (1 + alpha^2) x_i >= alpha (x_{i-1} + x_{i+1}) inside, x_0 >= alpha x_1
and x_n >= alpha x_{n-1} at the ends.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from dpinfer._validation import check_count
from dpinfer.mechanisms import ClampedGeometric, DoubleGeometric, Mechanism
from dpinfer.utility.consumers import ROW_SUM_TOLERANCE, as_mechanism_matrix

__all__ = [
    "check_alpha",
    "clamped_to_range",
    "derivable_transform",
    "geometric_inverse",
    "geometric_matrix",
    "is_derivable",
    "mechanism_matrix",
]


def check_alpha(alpha, name: str = "alpha") -> float:
    """Seed 003's privacy parameter alpha = exp(-epsilon) for a count: a real number strictly
    inside (0, 1) (alpha = 0 is no privacy and alpha = 1 perfect privacy, where G is the
    identity or singular: note pitfall P12)."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"{name} must be a real number in (0, 1), got {alpha!r}")
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1 (alpha = exp(-epsilon)), got {alpha!r}")
    return alpha


def mechanism_matrix(mechanism, n) -> np.ndarray:
    """The (n+1) x (n+1) matrix X[i, r] = P(release = r | true count i), i, r in {0..n}, of a
    discrete dpinfer mechanism whose releases live on {0..n}, from its own
    ``log_likelihood`` (the mechanism is the single source of truth for its law).

    ``ClampedGeometric(epsilon, lower=0, upper=n)`` gives G_{n,alpha} with
    alpha = exp(-epsilon / sensitivity). A mechanism whose releases can leave {0..n} (rows
    summing to less than 1) is refused; for an unbounded ``DoubleGeometric`` use
    ``mechanism_matrix(clamped_to_range(mechanism, n), n)`` (see :func:`clamped_to_range`).
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"mechanism must be a dpinfer Mechanism, got {type(mechanism).__name__}")
    if not mechanism.discrete:
        raise ValueError(f"mechanism must be discrete (releases on {{0..n}}), got {mechanism!r}")
    n = check_count("n", n, 1)
    values = np.arange(n + 1)
    try:
        log_p = mechanism.log_likelihood(values[None, :], values[:, None])
    except ValueError as err:
        raise ValueError(f"mechanism's releases must live on {{0..{n}}}: {err}") from err
    X = np.exp(log_p)
    missing = float(np.max(np.abs(X.sum(axis=1) - 1.0)))
    if missing > ROW_SUM_TOLERANCE:
        raise ValueError(
            f"mechanism {mechanism!r} releases values outside {{0..{n}}} with probability up to "
            f"{missing:.3g}; a DoubleGeometric (or a geometric clamped at lower <= 0 only) is "
            f"reduced without loss by mechanism_matrix(clamped_to_range(mechanism, {n}), {n})"
        )
    return X


def clamped_to_range(mechanism, n) -> ClampedGeometric:
    r"""The mechanism releasing clamp(r, 0, n) for a geometric release r: ClampedGeometric with
    the same epsilon, sensitivity and neighbour relation and bounds 0..n.

    ``mechanism`` is a DoubleGeometric, or a ClampedGeometric with lower <= 0 and upper None or
    >= n (clamping twice is clamping to the narrower range). For true counts i in {0..n} the
    clamped value is a sufficient statistic (note §3.11 [derived], pitfall P13): a release
    r <= 0 has likelihood (1-a)/(1+a) a^{i-r}, proportional in i to a^i like
    P(clamp = 0 | i) = a^i/(1 + a), and symmetrically at n, so a consumer of the unbounded
    release loses nothing by clamping it with ``np.clip(r, 0, n)`` and then using the matrix
    ``mechanism_matrix(clamped_to_range(mechanism, n), n)`` = G_{n,a}, a = exp(-epsilon/sensitivity).
    """
    n = check_count("n", n, 1)
    if isinstance(mechanism, ClampedGeometric):
        if mechanism.lower > 0 or (mechanism.upper is not None and mechanism.upper < n):
            raise ValueError(
                f"mechanism must clamp no tighter than [0, {n}] (lower <= 0, upper None or >= {n}), "
                f"got lower={mechanism.lower}, upper={mechanism.upper}"
            )
    elif not isinstance(mechanism, DoubleGeometric):
        raise TypeError(
            f"mechanism must be a DoubleGeometric or ClampedGeometric, got {type(mechanism).__name__}"
        )
    return ClampedGeometric(mechanism.epsilon, 0, n, mechanism.sensitivity, mechanism.neighbour)


def geometric_matrix(n, alpha) -> np.ndarray:
    """G_{n,alpha} (module docstring; note §3.11, §12), built from dpinfer's
    ``ClampedGeometric(epsilon=-ln alpha, lower=0, upper=n)`` through :func:`mechanism_matrix`.
    The mechanism recomputes alpha as exp(-epsilon), which agrees with ``alpha`` to a few ulps."""
    n = check_count("n", n, 1)
    alpha = check_alpha(alpha)
    return mechanism_matrix(ClampedGeometric(-math.log(alpha), 0, n), n)


def geometric_inverse(n, alpha) -> np.ndarray:
    """G_{n,alpha}^{-1} in closed form (note §5, [derived, verified]): tridiagonal with

        row 0:          [1/(1-a), -a/(1-a), 0, ...]
        row i (0<i<n):  (-a, 1 + a^2, -a)/(1-a)^2 at columns i-1, i, i+1
        row n:          [..., 0, -a/(1-a), 1/(1-a)]

    Every row sums to 1. Entries grow like 1/(1-a)^2 as a -> 1 (pitfall P12).
    Example (note §5): n = 3, a = 1/4 gives [[4/3, -1/3, 0, 0], [-4/9, 17/9, -4/9, 0], ...].
    """
    n = check_count("n", n, 1)
    a = check_alpha(alpha)
    inv = np.zeros((n + 1, n + 1))
    inside = np.arange(1, n)
    inv[inside, inside] = (1.0 + a * a) / (1.0 - a) ** 2
    inv[inside, inside - 1] = inv[inside, inside + 1] = -a / (1.0 - a) ** 2
    inv[0, 0] = inv[n, n] = 1.0 / (1.0 - a)
    inv[0, 1] = inv[n, n - 1] = -a / (1.0 - a)
    return inv


def derivable_transform(M, alpha) -> np.ndarray:
    """T = G_{n,alpha}^{-1} M, the unique matrix with M = G_{n,alpha} T (G is non-singular:
    Lemma 1). Entries (note §5, Cramer's rule of Theorem 2's proof), column x of M:

        t_0 = (x_0 - a x_1)/(1-a),   t_n = (x_n - a x_{n-1})/(1-a),
        t_i = ((1 + a^2) x_i - a (x_{i-1} + x_{i+1}))/(1-a)^2.

    Its rows sum to 1 because M's do. ``M``: an (n+1) x k mechanism (rows true counts 0..n).
    Appendix B's M (n = 3, a = 1/2) gives -1/3 at (1, 1): not derivable.
    """
    M = as_mechanism_matrix("M", M)
    return geometric_inverse(M.shape[0] - 1, alpha) @ M


def is_derivable(M, alpha, tol: float = 1e-9) -> bool:
    """Theorem 2: M = G_{n,alpha} T for a row-stochastic T iff T = G^{-1} M >= 0; decided as
    min T >= -tol. Round-off in T is about 1e-16 (1 + a)^2/(1 - a)^2 (the size of G^{-1}'s
    entries), so the default tol = 1e-9 suits alpha up to about 0.999; raise it beyond."""
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not 0.0 <= float(tol) < math.inf:
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    return bool(np.min(derivable_transform(M, alpha)) >= -float(tol))
