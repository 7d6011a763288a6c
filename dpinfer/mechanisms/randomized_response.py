r"""Randomised response (Warner 1965) on records of k binary attributes, as local DP.

Warner, S. L. (1965), "Randomized response: a survey technique for eliminating evasive answer
bias", JASA 60(309), 63-69; the local-DP reading and the k-attribute product form as in
Kasiviswanathan, Lee, Nissim, Raskhodnikova & Smith (2011), "What can we learn privately?",
and Wang, Blocki, Li & Jha (2017), "Locally differentially private protocols for frequency
estimation" (USENIX Security).

Each record holds k = ``attributes`` bits; its true value is the cell c in {0, ..., 2^k - 1}
with bit j of c the value of attribute j. The mechanism keeps each bit with probability p and
flips it with probability 1 - p, independently across bits and records, so

    M[c, o] = P(report o | true c) = prod_j (p if c_j = o_j else 1 - p)
            = p^(k - h(c, o)) (1 - p)^h(c, o),          h = Hamming distance,

i.e. M = A^{(x) k}, the k-th Kronecker power of A = [[p, 1 - p], [1 - p, p]]. M is symmetric,
and M^{-1} = (A^{-1})^{(x) k} with A^{-1} = [[p, -(1 - p)], [-(1 - p), p]] / (2p - 1).

Tables. With t the table of true cell counts (n = sum t) and S the table of reports,
S = sum_c Multinomial(t_c, M[c, .]) (independent terms), so E[S | t] = M^T t and
Cov(S | t) = sum_c t_c (diag(M[c]) - M[c] M[c]^T); M^{-T} S is unbiased for t.

Marginal (inference) form. If the true cells are i.i.d. categorical(pi), the pairs (true cell,
report) are i.i.d. with joint law pi_c M[c, o], so the reports are i.i.d. categorical(M^T pi)
and S ~ Multinomial(n, M^T pi). Given pi and S = s, the records' true cells are conditionally
independent, a record reported as o having true cell c with probability
w(c | o) = pi_c M[c, o] / (M^T pi)_o (Bayes' rule per record; the report table is a
permutation-invariant function of the reports), hence T | s, pi = sum_o Multinomial(s_o, w(. | o)).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.compile.ops import wrap_py
from pytensor.graph.basic import Variable

from dpinfer._validation import as_integer_array, as_real_array, check_epsilon, check_rng, check_within
from dpinfer.mechanisms.base import Mechanism, PrivacyAudit, PrivacyGuarantee
from dpinfer.mechanisms.exact_sampling import sample_bernoulli

__all__ = ["RandomizedResponse"]

# Records have at most this many binary attributes (tables of 2**16 cells).
_MAX_ATTRIBUTES = 16
# transition_matrix() is built for at most 2**10 x 2**10 cells (8 MB); other methods use the
# Kronecker structure and work for every allowed k.
_MAX_MATRIX_ATTRIBUTES = 10
# audit() enumerates (2**k)**3 triples (a, b, o).
_MAX_AUDIT_ATTRIBUTES = 8
# Exact log_likelihood: largest dynamic-programme state space, and largest
# records x states x cells work.
_MAX_DP_STATES = 10**7
_MAX_DP_WORK = 10**9
# Tolerance of |sum(pi) - 1| for cell probabilities.
_SIMPLEX_TOL = 1e-9


def _check_p(p) -> Fraction:
    """p as an exact rational (a float at its exact binary value) strictly inside (1/2, 1)."""
    allowed = "p must be a real number in the open interval (1/2, 1)"
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise ValueError(f"{allowed}, got {p!r} ({type(p).__name__})")
    if isinstance(p, numbers.Rational):
        exact = Fraction(int(p.numerator), int(p.denominator))
    else:
        value = float(p)
        if not math.isfinite(value):
            raise ValueError(f"{allowed}, got {p!r}")
        exact = Fraction(value)
    if not Fraction(1, 2) < exact < 1:
        raise ValueError(f"{allowed}, got {p!r}")
    if not 0.5 < float(exact) < 1.0:
        raise ValueError(f"{allowed} and distinct from 1/2 and 1 as a float, got {p!r}")
    return exact


def _check_attributes(value) -> int:
    allowed = f"attributes must be a whole number in [1, {_MAX_ATTRIBUTES}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{allowed}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(float(value)) or not float(value).is_integer():
        raise ValueError(f"{allowed}, got {value!r}")
    if not 1 <= int(value) <= _MAX_ATTRIBUTES:
        raise ValueError(f"{allowed} (tables have 2**attributes cells), got {value!r}")
    return int(value)


class RandomizedResponse(Mechanism):
    r"""Warner randomised response on records of ``attributes`` = k binary attributes.

    Each bit of a record's cell c in {0, ..., 2^k - 1} (bit j = attribute j) is kept with
    probability p and flipped with probability 1 - p, independently across bits and records
    (Warner 1965). Transition matrix M[c, o] = p^(k - h(c, o)) (1 - p)^h(c, o), h the Hamming
    distance: the Kronecker power A^{(x) k}, A = [[p, 1 - p], [1 - p, p]].

    Privacy: local DP per record under substitution of the record's value. For true cells a, b
    and report o, P(o | a)/P(o | b) = (p/(1 - p))^(h(b, o) - h(a, o)) <= (p/(1 - p))^k, with
    equality at b = complement of a and o = a, so epsilon = k log(p/(1 - p)), delta = 0, tight;
    each attribute alone is log(p/(1 - p))-DP. A table of reports is post-processing of the
    records' reports, so it has the same guarantee for every record; it reveals n exactly
    (add-remove neighbours are not covered).

    Releases are exact (curator-grade): each bit is kept by an integer comparison
    ``rng.integers(0, d) < m`` for p = m/d (:func:`~dpinfer.mechanisms.exact_sampling.sample_bernoulli`),
    p a float taken at its exact binary value or a :class:`fractions.Fraction` exactly.
    ``p`` (attribute) is its float value, used by every likelihood.

    Likelihoods: :meth:`log_likelihood` is the exact log P(S = s | T = t) of the report table
    given the true table (a dynamic programme, small tables only); the inference form is
    S ~ Multinomial(n, M^T pi) given cell probabilities pi (:meth:`report_probabilities`,
    :meth:`dist_given_probabilities`), with the exact conditional draw of the true table
    :meth:`draw_true_table`. See the module docstring for the maths.

    Parameters
    ----------
    p : float or Fraction
        Probability of keeping each bit, strictly inside (1/2, 1).
    attributes : int, default 1
        Number k of binary attributes per record, 1 <= k <= 16; tables have 2^k cells.
    """

    discrete = True
    exact_sampler = True

    def __init__(self, p, attributes=1):
        self._p_exact = _check_p(p)
        self.attributes = _check_attributes(attributes)
        self.n_cells = 2**self.attributes
        self.p = float(self._p_exact)
        self._q = float(1 - self._p_exact)  # 1 - p, exact for a float p in (1/2, 1)
        self._log_p = math.log(self.p)
        self._log_q = math.log(self._q)
        self._epsilon_attr = math.log(float(self._p_exact / (1 - self._p_exact)))

    @classmethod
    def from_epsilon(cls, epsilon, attributes=1) -> "RandomizedResponse":
        """The mechanism whose *per-attribute* epsilon is ``epsilon``: p = e^eps/(1 + e^eps).

        The record-level guarantee is then attributes * epsilon. p is a float, so for large
        epsilon (1 - p tiny) the round trip ``epsilon_per_attribute`` is only as accurate as
        1 - p (relative error about 1e-16 / (1 - p)); epsilon must keep p < 1 in float
        (epsilon < about 36.7).
        """
        epsilon = check_epsilon(epsilon)
        p = 1.0 / (1.0 + math.exp(-epsilon))
        if not p < 1.0:
            raise ValueError(
                f"epsilon must be small enough that p = e^eps/(1 + e^eps) < 1 in float "
                f"(about epsilon < 36.7), got {epsilon!r}"
            )
        return cls(p, attributes)

    def __repr__(self) -> str:
        return f"RandomizedResponse(p={self.p!r}, attributes={self.attributes}) [{self.privacy}]"

    # --- privacy ------------------------------------------------------------------------------
    @property
    def epsilon_per_attribute(self) -> float:
        """log(p/(1 - p)): the local-DP epsilon of one attribute (one bit)."""
        return self._epsilon_attr

    @property
    def privacy(self) -> PrivacyGuarantee:
        """(k log(p/(1 - p)), 0)-DP for one record under substitution neighbours: its k bits
        (Hamming sensitivity k) may all change."""
        k = self.attributes
        return PrivacyGuarantee(
            k * self._epsilon_attr, 0.0, float(k), "substitution", "hamming",
            note=(
                f"local DP for one record's {k} bit(s) (randomised response, p = {self.p:.6g}; "
                f"epsilon per attribute log(p/(1-p)) = {self._epsilon_attr:.6g})"
            ),
        )

    def audit(self) -> PrivacyAudit:
        """Exact enumeration over all true cells a, b and reports o of the transition matrix:
        measured epsilon = max log M[a, o] - log M[b, o] (equals k log(p/(1 - p))), measured
        delta = max over (a, b) of sum_o max(0, M[a, o] - e^eps M[b, o]) at the claimed eps.
        Needs attributes <= 8 ((2^k)^3 triples)."""
        k = self.attributes
        if k > _MAX_AUDIT_ATTRIBUTES:
            raise ValueError(
                f"audit enumerates (2**attributes)**3 triples; attributes must be <= "
                f"{_MAX_AUDIT_ATTRIBUTES}, got {k} (the guarantee is k times the per-attribute one "
                f"by independence of the bits: audit RandomizedResponse(p, 1))"
            )
        eps = self.epsilon
        matrix = self.transition_matrix()
        log_m = np.log(matrix)
        worst, delta = 0.0, 0.0
        for a in range(self.n_cells):
            loss = log_m[a][None, :] - log_m  # [b, o]: log M[a, o] - log M[b, o]
            worst = max(worst, float(loss.max()))
            gap = -np.expm1(np.minimum(eps - loss, 0.0))  # 1 - e^eps M[b, o]/M[a, o] when > 0
            delta = max(delta, float((matrix[a][None, :] * gap).sum(axis=1).max()))
        method = (
            f"enumeration: all {self.n_cells}^2 pairs of true cells (substitution of one record) "
            f"x {self.n_cells} reports of the {self.n_cells} x {self.n_cells} transition matrix"
        )
        return PrivacyAudit(eps, 0.0, worst, delta, method)

    # --- the transition matrix -------------------------------------------------------------------
    def transition_matrix(self) -> np.ndarray:
        """M[c, o] = P(report o | true cell c) = prod_j (p if bits agree else 1 - p): the
        Kronecker power of [[p, 1 - p], [1 - p, p]], 2^k x 2^k (attributes <= 10)."""
        if self.attributes > _MAX_MATRIX_ATTRIBUTES:
            raise ValueError(
                f"transition_matrix is built for attributes <= {_MAX_MATRIX_ATTRIBUTES} "
                f"(2**k x 2**k floats), got attributes={self.attributes}; use "
                "report_probabilities / unbiased_table, which use the Kronecker structure"
            )
        base = np.array([[self.p, self._q], [self._q, self.p]])
        matrix = base
        for _ in range(self.attributes - 1):
            matrix = np.kron(matrix, base)
        return matrix

    def _log_row(self, c: int) -> np.ndarray:
        """log M[c, .] = (k - h) log p + h log(1 - p), h = popcount(c XOR o) (= log M[., c])."""
        h = np.bitwise_count(np.arange(self.n_cells) ^ int(c)).astype(float)
        return (self.attributes - h) * self._log_p + h * self._log_q

    def _apply_kron(self, x, keep: float, flip: float):
        """(B^{(x) k} applied along the last axis) for B = [[keep, flip], [flip, keep]]: for each
        bit j, x[c] <- keep x[c] + flip x[c XOR 2^j]. The same code works on numpy arrays and
        PyTensor tensors (fixed integer indexing); O(k 2^k) per vector."""
        cells = np.arange(self.n_cells)
        for j in range(self.attributes):
            x = keep * x + flip * x[..., cells ^ (1 << j)]
        return x

    # --- argument checks -------------------------------------------------------------------------
    def _check_table(self, name: str, table) -> np.ndarray:
        table = as_integer_array(name, table)
        if table.shape != (self.n_cells,):
            raise ValueError(
                f"{name} must be a table of 2**attributes = {self.n_cells} counts (one per cell), "
                f"got shape {table.shape}"
            )
        if np.any(table < 0):
            raise ValueError(f"{name} must hold non-negative counts; found {table[table < 0][:3].tolist()}")
        return table

    def check_release(self, release) -> np.ndarray:
        """A release is a table of 2^k non-negative whole counts."""
        return self._check_table("release_table", release)

    def _check_pi(self, pi) -> np.ndarray:
        pi = as_real_array("pi", pi)
        if pi.ndim == 0 or pi.shape[-1] != self.n_cells:
            raise ValueError(
                f"pi must hold {self.n_cells} cell probabilities along its last axis, got shape {pi.shape}"
            )
        if np.any(pi < 0) or np.any(np.abs(pi.sum(axis=-1) - 1.0) > _SIMPLEX_TOL):
            raise ValueError(
                f"pi must lie on the probability simplex (entries >= 0 summing to 1 within "
                f"{_SIMPLEX_TOL:g}); got sums {np.ravel(pi.sum(axis=-1))[:3].tolist()}, "
                f"min entry {float(pi.min())}"
            )
        return pi

    # --- releases (curator side) ------------------------------------------------------------------
    def release_records(self, cells, rng: np.random.Generator) -> np.ndarray:
        """Privatised cells of records with true ``cells`` (whole numbers in [0, 2^k - 1], any
        shape): each of the k bits kept by an exact Bernoulli(p) draw, flipped otherwise."""
        cells = as_integer_array("cells", cells)
        check_within("cells", cells, 0, self.n_cells - 1)
        rng = check_rng(rng)
        keep = sample_bernoulli(self._p_exact, cells.shape + (self.attributes,), rng)
        flips = (~keep).astype(np.int64) << np.arange(self.attributes)
        return cells ^ flips.sum(axis=-1)

    def release(self, true_table, rng: np.random.Generator) -> np.ndarray:
        """The table of counts of privatised reports, given the table of true cell counts
        (length 2^k): every record privatised by :meth:`release_records` (law
        sum_c Multinomial(t_c, M[c, .])). Memory O(n k) for n = sum(true_table) records."""
        true_table = self._check_table("true_table", true_table)
        rng = check_rng(rng)
        cells = np.repeat(np.arange(self.n_cells), true_table)
        reports = self.release_records(cells, rng)
        return np.bincount(reports, minlength=self.n_cells).astype(np.int64)

    # --- likelihood ---------------------------------------------------------------------------------
    def log_likelihood(self, release_table, true_table) -> float:
        """Exact log P(S = s | T = t), S = sum_c Multinomial(t_c, M[c, .]).

        Dynamic programme over records: the state is the partial report table (cells other
        than the one with the largest s_o, whose count is implied by the number of records
        processed); each record of true cell c moves it by one report o with probability
        M[c, o]. Log-space (logaddexp), so nothing underflows. -inf when sum s != sum t.
        Feasible when prod_{o != argmax s} (s_o + 1) <= 10^7 and n x states x 2^k <= 10^9;
        otherwise a ValueError points to the marginal form S ~ Multinomial(n, M^T pi).
        """
        s = self._check_table("release_table", release_table)
        t = self._check_table("true_table", true_table)
        if s.sum() != t.sum():
            return -math.inf
        n = int(t.sum())
        if n == 0:
            return 0.0
        implied = int(np.argmax(s))
        others = [o for o in range(self.n_cells) if o != implied]
        dims = [int(s[o]) + 1 for o in others]
        states = math.prod(dims)
        if states > _MAX_DP_STATES or n * states * self.n_cells > _MAX_DP_WORK:
            raise ValueError(
                f"log_likelihood: the exact dynamic programme needs {states} states (the product of "
                f"release_table[o] + 1 over all cells but the largest) and {n} record steps, more than "
                f"the limits ({_MAX_DP_STATES:.0e} states, {_MAX_DP_WORK:.0e} state updates); use the "
                "marginal form instead: given cell probabilities pi, release_table ~ Multinomial(n, "
                "M^T pi) (report_probabilities, dist_given_probabilities)"
            )
        table = np.full(dims, -np.inf)
        table[(0,) * len(dims)] = 0.0
        for c in np.flatnonzero(t):
            row = self._log_row(c)
            for _ in range(int(t[c])):
                table = self._dp_step(table, row, others, implied)
        return float(table[tuple(int(s[o]) for o in others)])

    @staticmethod
    def _dp_step(table: np.ndarray, row: np.ndarray, others: list[int], implied: int) -> np.ndarray:
        """One record: new[v] = logsumexp(table[v] + row[implied], table[v - e_o] + row[o])."""
        new = table + row[implied]
        for axis, o in enumerate(others):
            if table.shape[axis] == 1:
                continue
            dst = [slice(None)] * table.ndim
            src = [slice(None)] * table.ndim
            dst[axis], src[axis] = slice(1, None), slice(None, -1)
            new[tuple(dst)] = np.logaddexp(new[tuple(dst)], table[tuple(src)] + row[o])
        return new

    def report_probabilities(self, pi):
        """M^T pi: the law of one report when true cells are i.i.d. categorical(pi).

        ``pi`` is a numpy array with 2^k probabilities on its last axis (checked to lie on the
        simplex; leading axes are batches) or a PyTensor tensor (then the same code builds the
        graph; only a static last-axis length is checked). Computed through the Kronecker
        structure, O(k 2^k): for each bit j, x[c] <- p x[c] + (1 - p) x[c XOR 2^j]."""
        if isinstance(pi, Variable):
            length = pi.type.shape[-1] if pi.type.ndim else None
            if pi.type.ndim == 0 or (length is not None and length != self.n_cells):
                raise ValueError(
                    f"pi must hold {self.n_cells} cell probabilities along its last axis, got "
                    f"static shape {pi.type.shape}"
                )
        else:
            pi = self._check_pi(pi)
        return self._apply_kron(pi, self.p, self._q)

    def dist_given_probabilities(self, pi, n):
        """``pm.Multinomial.dist(n=n, p=M^T pi)``: the law of the report table when the n true
        cells are i.i.d. categorical(pi) (reports then i.i.d. categorical(M^T pi)). ``pi`` and
        ``n`` may be symbolic; a numeric n must be a whole number >= 0."""
        if not isinstance(n, Variable):
            n_arr = as_integer_array("n", n)
            if np.any(n_arr < 0):
                raise ValueError(f"n must be a whole number >= 0 (the number of records), got {n!r}")
            n = n_arr
        return pm.Multinomial.dist(n=n, p=self.report_probabilities(pi))

    def draw_true_table(self, pi, release_table, rng: np.random.Generator) -> np.ndarray:
        """One draw of the true table given cell probabilities ``pi`` and the release:
        T = sum_o Multinomial(s_o, w(. | o)), w(c | o) = pi_c M[c, o] / (M^T pi)_o.

        This is the exact conditional law (Bayes' rule per record: given pi the records'
        (true cell, report) pairs are i.i.d. with law pi_c M[c, o]); the draw itself uses
        numpy's float multinomial sampler (analysis side, not a release)."""
        pi = self._check_pi(pi)
        if pi.ndim != 1:
            raise ValueError(f"pi must be one vector of {self.n_cells} probabilities, got shape {pi.shape}")
        s = self._check_table("release_table", release_table)
        rng = check_rng(rng)
        out = np.zeros(self.n_cells, dtype=np.int64)
        for o in np.flatnonzero(s):
            w = pi * np.exp(self._log_row(o))  # M symmetric: row o = column o
            out += rng.multinomial(int(s[o]), w / w.sum())
        return out

    def dist(self, true_values):
        """PyMC distribution of the report table given the symbolic true table (length 2^k):
        log-p is the exact :meth:`log_likelihood` (numpy, evaluated outside the gradient: the
        true table is discrete), draws are :meth:`release`. With ``observe``, this is how a
        model states that the release privatises a latent table; :func:`dpinfer.sample` then
        sums a ``pm.Multinomial(n, p)`` table out (release ~ Multinomial(n, M^T p)) and draws
        it exactly given p (module docstring)."""
        mechanism = self

        @wrap_py(itypes=[pt.lvector, pt.lvector], otypes=[pt.dscalar])
        def table_log_likelihood(release_table, true_table):
            return np.float64(mechanism.log_likelihood(release_table, true_table))

        def logp(value, true_table):
            return table_log_likelihood(pt.cast(value, "int64"), pt.cast(true_table, "int64"))

        def random(true_table, rng=None, size=None):
            if size not in (None, ()) and np.prod(size) != 1:
                raise NotImplementedError("RandomizedResponse draws one report table per call")
            return mechanism.release(np.asarray(true_table), check_rng(rng))

        return pm.CustomDist.dist(true_values, logp=logp, random=random,
                                  signature="(k)->(k)", dtype="int64",
                                  class_name="RandomizedResponse")

    def log_likelihood_bound_outside(self, release, k: int, *, support=(-np.inf, np.inf)) -> np.ndarray:
        raise NotImplementedError(
            "log_likelihood_bound_outside bounds additive noise on counts for window "
            "marginalisation; randomised response releases a table whose true tables have finite "
            "support (same total), so no window is needed: use log_likelihood (exact) or the "
            "marginal form dist_given_probabilities"
        )

    # --- utility ------------------------------------------------------------------------------------
    def _true_float(self, true_table) -> np.ndarray:
        return self._check_table("true_table", true_table).astype(float)

    def bias(self, true_table) -> np.ndarray:
        """E[S | t] - t = M^T t - t, per cell: the report table is a biased estimator of t."""
        t = self._true_float(true_table)
        return self._apply_kron(t, self.p, self._q) - t

    def variance(self, true_table) -> np.ndarray:
        """Var[S_o | t] = sum_c t_c M[c, o] (1 - M[c, o]), per cell o."""
        t = self._check_table("true_table", true_table)
        out = np.zeros(self.n_cells)
        for c in np.flatnonzero(t):
            m = np.exp(self._log_row(c))
            out += t[c] * m * (1.0 - m)
        return out

    def covariance(self, true_table) -> np.ndarray:
        """Cov(S | t) = sum_c t_c (diag(M[c]) - M[c] M[c]^T), 2^k x 2^k (attributes <= 10)."""
        t = self._true_float(true_table)
        matrix = self.transition_matrix()
        return np.diag(t @ matrix) - (matrix.T * t) @ matrix

    def unbiased_table(self, release_table) -> np.ndarray:
        """M^{-T} s = M^{-1} s (M symmetric), unbiased for t: E[M^{-1} S | t] = t. Entries may
        be negative or non-integer. M^{-1} = (A^{-1})^{(x) k}, A^{-1} = [[p, -(1-p)], [-(1-p), p]]
        / (2p - 1) (Warner's estimator for k = 1)."""
        s = self._check_table("release_table", release_table).astype(float)
        scale = 2.0 * self.p - 1.0
        return self._apply_kron(s, self.p / scale, -self._q / scale)

    def release_interval(self, true_values, prob: float = 0.9):
        raise NotImplementedError(
            "release_interval (an interval symmetric about the truth) does not fit randomised "
            "response: the report table is biased, E[S | t] = M^T t; use bias, variance / "
            "covariance, or unbiased_table"
        )
