"""The mean and covariance of a record-additive statistic of normal records, in closed form.

A release of T = sum_i t(r_i) over n independent records r_i = (x_i, y_i) has, given the
parameters, E[T] = n E[t(r)] and Cov[T] = n Cov[t(r)]; for large n, T is close to the normal
law with these moments (the central limit theorem), which is the law of the sum Bernstein &
Sheldon use for private exponential families (NeurIPS 2018) and linear regression (NeurIPS
2019). This module computes the two moments exactly, as PyTensor graphs of the parameters
(so NUTS has their gradients), for the records' model

    x ~ Normal(mu_x, diag(sigma_x^2))  (p covariates; p = 0: no covariates),
    y | x ~ Normal(a + x' b, sigma),

and per-record terms that are monomials of degree <= 2 in u = (1, cx_1, ..., cx_p, c), where
c = alpha clamp(y, L, U) + gamma (``dpinfer.clamp``, scaled or not, or y itself) and
cx = alpha_x x + gamma_x (the covariates' clamps must not bind: the planner checks it). That
covers the regression statistic (X'y, y'y, X'X) and the power sums of a clamped response.

**Derivation.** (x, y) is jointly normal: y ~ N(mu_y, s_y^2) with mu_y = a + mu_x' b,
s_y^2 = b' diag(sigma_x^2) b + sigma^2, and, with w = (y - mu_y) / s_y standard normal,
x | y ~ N(mu_x + d w, S - d d') where d = diag(sigma_x^2) b / s_y and S = diag(sigma_x^2).
So v = (1, cx) given w is normal with mean m(w) = mu_v + d_v w (linear in w) and covariance
C_v, and c is a function of w alone. A product of at most four coordinates of v (padded with
v_0 = 1 to exactly four) has, by Isserlis' theorem with a mean,

    E[v_i v_j v_k v_l | w] = m_i m_j m_k m_l + sum over the 6 pairs {i,j}: m_k m_l C_ij
                             + C_ij C_kl + C_ik C_jl + C_il C_jk,

a polynomial in w of degree <= 4 with coefficients P_r; hence E[v_V c^k] = sum_r P_r A[r, k]
with A[r, k] = E[w^r c^k]. On the three pieces of the clamp (w below a_L = (L - mu_y)/s_y,
between, above a_U) c is c_L, e0 + e1 w (e0 = alpha mu_y + gamma, e1 = alpha s_y) and c_U, so

    A[r, k] = c_L^k J_r(-inf, a_L) + c_U^k J_r(a_U, inf)
              + sum_i binom(k, i) e0^(k-i) e1^i J_(r+i)(a_L, a_U),

with the truncated normal moments J_j(a, b) = int_a^b w^j phi(w) dw from the recursion
J_j = (j - 1) J_(j-2) + a^(j-1) phi(a) - b^(j-1) phi(b) (J_0 = Phi(b) - Phi(a),
J_1 = phi(a) - phi(b)). Every moment is exact: no quadrature, no simulation. The terms that are
products of covariates alone (k = 0) take the same formula with x's own law (d = 0, v ~ N(mu_v,
S_v)): the same numbers with no graph through b, so that their block, most of the covariance at
many covariates (66 of 77 terms at p = 10), costs the gradient nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np
import pytensor.tensor as pt

DEGREE = 4  # of the polynomials in w: products of two terms of degree <= 2 in v


@dataclass(frozen=True)
class Clamp:
    """c = alpha clamp(y, lower, upper) + gamma (lower/upper may be infinite: no clamp)."""

    lower: float = -np.inf
    upper: float = np.inf
    scale: bool = False

    @property
    def alpha(self) -> float:
        return 2.0 / (self.upper - self.lower) if self.scale else 1.0

    @property
    def gamma(self) -> float:
        return -(self.lower + self.upper) / (self.upper - self.lower) if self.scale else 0.0

    @property
    def binds(self) -> bool:
        return bool(np.isfinite(self.lower) or np.isfinite(self.upper))

    def apply(self, values: np.ndarray) -> np.ndarray:
        return self.alpha * np.clip(values, self.lower, self.upper) + self.gamma


@dataclass(frozen=True)
class Term:
    """A per-record term v_V c^k: ``covariates`` the indices into v = (1, cx) (0 is the
    constant), ``power`` the power k of the response c."""

    covariates: tuple
    power: int


def regression_terms(p: int) -> list[Term]:
    """The terms of ``dpinfer.regression_statistic`` for p covariates, in its order."""
    k = p + 1
    rows, cols = np.tril_indices(k, k=-1)
    return ([Term((i,), 1) for i in range(k)] + [Term((), 2)]
            + [Term((int(r), int(c)), 0) for r, c in zip(rows, cols)]
            + [Term((i, i), 0) for i in range(1, k)])


def power_sum_terms(degree: int) -> list[Term]:
    """The terms of ``dpinfer.power_sums``: c, c^2, ..., c^degree."""
    return [Term((), k) for k in range(1, degree + 1)]


def _truncated_moments(a, b, top: int):
    """J_0 .. J_top over (a, b) as a vector (a or b None: infinite), int w^j phi(w) dw, by the
    recursion of the module docstring: with E_j = a^j phi(a) - b^j phi(b) (0 at an infinite
    end), J_j = (j - 1) J_(j-2) + E_(j-1), so J_j is a fixed combination of J_0, J_1 and E,
    applied as one matrix product (few graph nodes: fast to compile)."""
    phi = lambda z: pt.exp(-0.5 * z**2) / np.sqrt(2.0 * np.pi)  # noqa: E731
    big_phi = lambda z: 0.5 * pt.erfc(-z / np.sqrt(2.0))  # noqa: E731
    edges = pt.zeros(top + 1)
    mass = pt.as_tensor(1.0)
    if a is not None:
        edges = edges + _powers(a, top) * phi(a)
        mass = mass - big_phi(a)
    if b is not None:
        edges = edges - _powers(b, top) * phi(b)
        mass = mass - big_phi(-b)
    return pt.dot(pt.as_tensor(_RECURSION[: top + 1, : top + 2]), pt.concatenate([[mass], edges]))


def _powers(x, top: int):
    """[1, x, ..., x^top] by products (x ** k has an undefined gradient at x = 0 for k = 0)."""
    out = [pt.ones(())]
    for _ in range(top):
        out.append(out[-1] * x)
    return pt.stack(out)


def _recursion(top: int) -> np.ndarray:
    """Rows j: J_j as coefficients of (J_0, E_0, E_1, ..., E_top) (see _truncated_moments)."""
    rows = np.zeros((top + 1, top + 2))
    rows[0, 0] = 1.0
    if top >= 1:
        rows[1, 1] = 1.0  # J_1 = E_0
    for j in range(2, top + 1):
        rows[j] = (j - 1) * rows[j - 2]
        rows[j, j] += 1.0  # + E_(j-1)
    return rows


_RECURSION = _recursion(4 * DEGREE)


def response_moments(mu_y, s_y, clamp: Clamp, powers: int):
    """A[r, k] = E[w^r c^k] for r <= 4 and k <= ``powers`` (a (5, powers + 1) tensor),
    w = (y - mu_y) / s_y standard normal and c = ``clamp`` of y (module docstring), as
    A = H B + J_below c_L^k + J_above c_U^k with the Hankel matrix H[r, i] = J_(r+i)(a_L, a_U)
    and B[i, k] = binom(k, i) e0^(k-i) e1^i."""
    a_lower = (clamp.lower - mu_y) / s_y if np.isfinite(clamp.lower) else None
    a_upper = (clamp.upper - mu_y) / s_y if np.isfinite(clamp.upper) else None
    middle = _truncated_moments(a_lower, a_upper, DEGREE + powers)
    e0 = clamp.alpha * mu_y + clamp.gamma
    e1 = clamp.alpha * s_y
    r, i = np.arange(DEGREE + 1), np.arange(powers + 1)
    k = i
    binomial = np.array([[comb(int(kk), int(ii)) for kk in k] for ii in i], dtype=np.float64)
    exponent = np.maximum(k[None, :] - i[:, None], 0)
    coefficients = binomial * _powers(e0, powers)[exponent] * _powers(e1, powers)[i][:, None]
    table = pt.dot(middle[np.add.outer(r, i)], coefficients)
    for bound, interval in ((clamp.lower, (None, a_lower)), (clamp.upper, (a_upper, None))):
        if np.isfinite(bound):
            c_bound = clamp.alpha * bound + clamp.gamma
            table = table + pt.outer(_truncated_moments(*interval, DEGREE), pt.as_tensor(c_bound ** k.astype(np.float64)))
    return table


@dataclass(frozen=True)
class NormalRecords:
    """The records' model of the module docstring, its parameters PyTensor graphs (or numbers):
    ``mu_x``, ``sigma_x``, ``b``, ``alpha_x``, ``gamma_x`` of length p (p = 0: empty), ``a`` and
    ``sigma`` scalars, ``clamp`` the response's :class:`Clamp`."""

    mu_x: object
    sigma_x: object
    a: object
    b: object
    sigma: object
    clamp: Clamp
    alpha_x: np.ndarray
    gamma_x: np.ndarray

    def moments(self, terms: list[Term]):
        """(E[t], Cov[t]) of one record's terms t = (v_V c^k for each term): a vector and a
        matrix, exact (module docstring)."""
        p = len(self.alpha_x)
        mu_x, sigma_x, b = (pt.cast(pt.as_tensor(v), "float64").reshape((p,))
                            for v in (self.mu_x, self.sigma_x, self.b))
        a, sigma = (pt.cast(pt.as_tensor(v), "float64") for v in (self.a, self.sigma))
        variance_x = sigma_x**2
        mu_y = a + pt.dot(mu_x, b)
        s_y = pt.sqrt(pt.dot(b**2, variance_x) + sigma**2)
        d = variance_x * b / s_y
        alpha, gamma = pt.as_tensor(self.alpha_x), pt.as_tensor(self.gamma_x)
        mu_v = pt.concatenate([pt.ones((1,)), alpha * mu_x + gamma])
        d_v = pt.concatenate([pt.zeros((1,)), alpha * d])
        cov_x = (pt.eye(p) * variance_x - pt.outer(d, d)) * pt.outer(alpha, alpha)
        cov_v = pt.set_subtensor(pt.zeros((p + 1, p + 1))[1:, 1:], cov_x)
        powers = 2 * max(t.power for t in terms)
        table = response_moments(mu_y, s_y, self.clamp, powers)
        covariates = [t for t in terms if t.power == 0]  # products of covariates alone
        response = [t for t in terms if t.power > 0]
        if not covariates or not response:
            means, second = _term_moments(mu_v, d_v, cov_v, table, terms, terms, p + 1)
            return means, second - pt.outer(means, means)
        # the covariates' products from x's own law (no conditioning on y: the same numbers,
        # but no graph through b, so their 66 x 66 block at p = 10 costs the gradient nothing)
        own = pt.set_subtensor(pt.zeros((p + 1, p + 1))[1:, 1:], pt.eye(p) * variance_x * alpha**2)
        normal = pt.as_tensor(np.array([[1.0], [0.0], [1.0], [0.0], [3.0]]))  # E[w^r], r <= 4
        mean_c, second_c = _term_moments(mu_v, d_v, cov_v, table, response, response + covariates, p + 1)
        mean_x, second_x = _term_moments(mu_v, pt.zeros((p + 1,)), own, normal, covariates, covariates, p + 1)
        cross = second_c[:, len(response):]
        second = pt.concatenate([second_c, pt.concatenate([cross.T, second_x], axis=1)], axis=0)
        means = pt.concatenate([mean_c, mean_x])
        cov = second - pt.outer(means, means)
        # each term's place in that layout, the response's terms first: the regression statistic's
        # own order, so no permutation there (a gather of the covariance, whose gradient is a
        # scatter: the p = 10 log density and gradient 313 against 305 us)
        order = np.argsort(np.argsort([t.power == 0 for t in terms], kind="stable"))
        if np.array_equal(order, np.arange(len(terms))):
            return means, cov
        return means[order], cov[order][:, order]


def _term_moments(mu_v, d_v, cov_v, table, rows: list[Term], cols: list[Term], width: int):
    """(E[t_a] for the ``rows`` terms, E[t_a t_b] for a in ``rows`` and b in ``cols``) of the terms
    t_a = v_i v_j c^k (i, j their covariates padded with v_0 = 1), as dense products with one-hot
    selection matrices instead of a gather per entry (a gather's gradient is a scatter: at p =
    10, 77 terms, the log density and gradient took 4.0 ms with per-entry gathers and 0.55 ms so,
    measured by a NUMBA-mode function of the moments).

    Given w, v ~ N(m, C) with m = mu_v + d_v w, so E[v_i v_j | w] = P_a(w) = m_i m_j + C_ij and,
    by Isserlis' theorem, for a second term b = (k, l),

        E[v_i v_j v_k v_l | w] = P_a P_b + m_i m_k C_jl + m_i m_l C_jk + m_j m_k C_il + m_j m_l C_ik
                                 + C_ik C_jl + C_il C_jk,

    polynomials in w of degree <= 4; with the one-hot matrices I and J picking each term's i and
    j, every one is a rows x cols matrix of outer products and entries of I C I', I C J', J C I',
    J C J'. The coefficient of w^r multiplies A[r, k_a + k_b] (the module docstring's table)."""

    def picks(terms):
        pick_i, pick_j = np.zeros((len(terms), width)), np.zeros((len(terms), width))
        for a, term in enumerate(terms):
            i, j = (tuple(term.covariates) + (0, 0))[:2]
            pick_i[a, i] = pick_j[a, j] = 1.0
        return pick_i, pick_j, np.array([t.power for t in terms], dtype=np.int64)

    def polynomial(pick_i, pick_j):  # (m_i, d_i), (m_j, d_j), P's coefficients of w^0..w^2
        m_i, m_j = (pt.dot(pick, mu_v) for pick in (pick_i, pick_j))
        d_i, d_j = (pt.dot(pick, d_v) for pick in (pick_i, pick_j))
        within = pt.sum(pt.dot(pick_i, cov_v) * pick_j, axis=1)  # C_ij of each term
        return (m_i, d_i), (m_j, d_j), [m_i * m_j + within, m_i * d_j + d_i * m_j, d_i * d_j]

    row_i, row_j, row_power = picks(rows)
    col_i, col_j, col_power = picks(cols)
    mi, mj, p_row = polynomial(row_i, row_j)
    ni, nj, p_col = polynomial(col_i, col_j)
    # A[r, k_a] and A[r, k_a + k_b] as masked sums over the powers k, not gathers (a gather's
    # gradient is a scatter: p = 10's log density and gradient 305 against 289 us)
    powers = np.arange(int(np.max(np.add.outer(row_power, col_power))) + 1)
    row_table = sum(table[:, k][:, None] * (row_power == k) for k in powers)  # (DEGREE + 1) x rows
    mean = sum(p_row[r] * row_table[r] for r in range(3))
    c_i, c_j = pt.dot(row_i, cov_v), pt.dot(row_j, cov_v)
    c_ii, c_ij = pt.dot(c_i, col_i.T), pt.dot(c_i, col_j.T)  # C[i_a, i_b], C[i_a, j_b]
    c_ji, c_jj = pt.dot(c_j, col_i.T), pt.dot(c_j, col_j.T)  # C[j_a, i_b], C[j_a, j_b]

    def outer(x, y):  # coefficients of w^0..w^2 of outer(x0 + x1 w, y0 + y1 w)
        return [pt.outer(x[0], y[0]), pt.outer(x[0], y[1]) + pt.outer(x[1], y[0]), pt.outer(x[1], y[1])]

    coef = [pt.zeros((len(rows), len(cols))) for _ in range(DEGREE + 1)]
    for r in range(3):
        for q in range(3):
            coef[r + q] = coef[r + q] + pt.outer(p_row[r], p_col[q])
    for left, right, between in ((mi, ni, c_jj), (mi, nj, c_ji), (mj, ni, c_ij), (mj, nj, c_ii)):
        for r, part in enumerate(outer(left, right)):
            coef[r] = coef[r] + part * between
    coef[0] = coef[0] + c_ii * c_jj + c_ij * c_ji
    pair = np.add.outer(row_power, col_power)
    second = sum(pt.sum(pt.stack(coef) * table[:, k][:, None, None], axis=0) * (pair == k) for k in powers)
    return mean, second


def simulate_terms(records: dict, terms: list[Term], size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` records' terms (size x len(terms)) drawn from the records' model at numeric
    parameters ``records`` (NormalRecords' fields as numbers): for the measured error of the
    normal law (the sum's skewness) and for tests."""
    p = len(records["alpha_x"])
    x = rng.normal(np.reshape(records["mu_x"], p), np.reshape(records["sigma_x"], p), size=(size, p))
    y = rng.normal(records["a"] + x @ np.reshape(records["b"], p), records["sigma"])
    v = np.concatenate([np.ones((size, 1)), records["alpha_x"] * x + records["gamma_x"]], axis=1)
    c = records["clamp"].apply(y)
    return np.stack([np.prod(v[:, list(t.covariates)], axis=1) * c**t.power for t in terms], axis=1)
