r"""The terms of nested sums: log weights of a residual e = value - (sum of counts), as tables.

A term of :mod:`dpinfer.lattice.nested` multiplies the law of the counts by w(e), e = y - t,
t the sum of some cells of one area's counts and y the term's value. Every w here is
log-concave, and one table format holds them all (:class:`TermTables`): the log weights on a
range e_lo .. e_lo + n - 1 and, on either side beyond it, one of

* ``HARD``: w = 0 (log -inf), an end of a bound or an equality;
* ``FLAT``: w = w(edge), the open side of a one-sided bound;
* ``GAUSS``: log w(e) = log w(edge) - (e^2 - edge^2) / (2 v), the discrete Gaussian's own
  quadratic (exact for one discrete Gaussian, v = sigma^2).

One kind of term is not a table of values but a formula whose parameters the table holds
(``MIXING`` at both ends): a group rate mixed by a gamma law, a factor of the counts' prior
(:meth:`TermTables.add_group_mixing`).

Constructors:

* :meth:`TermTables.add_discrete_gaussian` -- the noise of a measurement y = t + e, e the sum
  of ``m`` independent discrete Gaussians N_Z(0, sigma^2) (Canonne, Kamath & Steinke 2020):
  m = 1 is one measured count; m > 1 is a measurement summed over m published cells (a finer
  query summed to coarser cells, :mod:`dpinfer.io.nmf`). For m = 1 the table is
  log f(e) = -e^2/(2 sigma^2) - log Z, Z = sum_k exp(-k^2/(2 sigma^2)) (exact, extended exactly by
  GAUSS). For m > 1 the pmf of the sum is computed by exact convolution (binary powers, linear
  space, sums of non-negative terms: relative error ~ m eps per entry) of the pmf truncated to
  |e| <= B = ceil(14 sqrt(m sigma^2)) + 2 at every step; the truncation drops mass < 1e-40
  relative to the peak, and beyond B the table continues with the quadratic of variance
  m sigma^2 (the sum's tail there is below e^-98 of the peak and is never reached in practice).
* :meth:`TermTables.add_equality` -- t = y exactly (an invariant): w = 1{e = 0};
* :meth:`TermTables.add_at_most` / :meth:`TermTables.add_at_least` -- t <= y / t >= y (a
  published bound): w = 1{e >= 0} / 1{e <= 0};
* :meth:`TermTables.add_group_mixing` -- the prior's factor on a group's sum S = -e of one
  cell (value 0) that turns independent negative binomial counts into a gamma-mixed group
  rate (:func:`dpinfer.distributions.GroupedNegativeBinomial`):
  log w = log NB(S; M, alpha) - log NB(S; M, A) (0 for S < 0).
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._kernel import kernel

HARD, FLAT, GAUSS, MIXING = 0, 1, 2, 3

# A GAUSS-ended table within this many nats of one quadratic c - e^2 / (2 v) at every entry is
# that quadratic (:func:`quadratic_tables`). One discrete Gaussian is one exactly; a sum of m of
# them departs from the quadratic of variance m sigma^2 by terms of order exp(-pi^2 sigma^2)
# that alternate with e's parity (Poisson summation: 1.5e-6 nats at sigma^2 = 1.5, m = 2; below
# 1e-17 from sigma^2 = 4), and its table, computed by convolution, carries ~m eps of rounding
# (1.4e-14 to 2.8e-14 nats on every table of the production queries at state size). A table
# that departs by more stays a table: read entry by entry, exact.
QUADRATIC_TOLERANCE = 1e-12

# Half-width of a summed discrete Gaussian's table in standard deviations (e^-98 at the edge).
_TABLE_SDS = 14.0
# The widest table a noise may have (half-width; 4.2 million values, 34 MB): a variance whose
# table would be wider (sd above about 150,000 persons) is refused, not allocated.
MAX_TABLE_HALF = 2**21


class TermTables:
    """A growing set of term tables; :meth:`arrays` gives the kernels' form.

    Table k occupies ``values[offset_k : offset_k + n_k]`` for e = lo_k .. lo_k + n_k - 1;
    ``meta[k] = (lo_k, n_k, offset_k, left_mode, right_mode)``, ``inv2v[k] = 1/(2 v)`` for GAUSS
    ends. Identical tables are stored once (:meth:`add_discrete_gaussian` is keyed by
    (sigma^2, m))."""

    def __init__(self):
        self._meta: list[tuple] = []
        self._inv2v: list[float] = []
        self._values: list[np.ndarray] = []
        self._offset = 0
        self._keys: dict = {}
        self._params: list[tuple] = []  # (kind, sigma2, m) per table; sigma2, m None but for "dg"

    def copy(self) -> "TermTables":
        """An independent copy (to add tables to without changing this one)."""
        new = TermTables()
        new._meta, new._inv2v, new._values = list(self._meta), list(self._inv2v), list(self._values)
        new._offset, new._keys, new._params = self._offset, dict(self._keys), list(self._params)
        return new

    def __len__(self) -> int:
        return len(self._meta)

    def _add(self, key, lo: int, log_w: np.ndarray, left: int, right: int, inv2v: float = 0.0) -> int:
        if key in self._keys:
            return self._keys[key]
        log_w = np.asarray(log_w, dtype=float)
        self._meta.append((int(lo), log_w.size, self._offset, left, right))
        self._inv2v.append(float(inv2v))
        self._values.append(log_w)
        self._offset += log_w.size
        self._keys[key] = len(self._meta) - 1
        self._params.append((key[0], key[1], key[2]) if key[0] == "dg" else (key[0], None, None))
        return self._keys[key]

    def params(self, k: int) -> tuple:
        """(kind, sigma^2, m) of table k: kind "dg" (a summed discrete Gaussian), "eq", "le",
        "ge" or "mix" (sigma^2 and m None)."""
        return self._params[k]

    def add_discrete_gaussian(self, sigma2: float, m: int = 1) -> int:
        """The table of the sum of ``m`` iid N_Z(0, sigma2) noises (module docstring)."""
        sigma2, m = float(sigma2), int(m)
        if not (math.isfinite(sigma2) and sigma2 > 0):
            raise ValueError(f"sigma2 must be a finite positive variance, got {sigma2!r}")
        if m < 1:
            raise ValueError(f"m (the number of summed noises) must be >= 1, got {m!r}")
        if _TABLE_SDS * math.sqrt(m * sigma2) + 2 > MAX_TABLE_HALF:
            largest = ((MAX_TABLE_HALF - 2) / _TABLE_SDS) ** 2 / m
            raise ValueError(f"sigma2 = {sigma2!r} (summed over {m} counts) is too large a variance: its noise "
                             f"table would hold more than {2 * MAX_TABLE_HALF + 1:,} values; sigma2 must be at "
                             f"most {largest:.6g} here")
        if ("dg", sigma2, m) in self._keys:  # every term of one query and level shares its table
            return self._keys[("dg", sigma2, m)]
        log_w = summed_discrete_gaussian_log_pmf(sigma2, m)
        half = (log_w.size - 1) // 2
        return self._add(("dg", sigma2, m), -half, log_w, GAUSS, GAUSS, 1.0 / (2.0 * m * sigma2))

    def add_equality(self) -> int:
        """w(e) = 1{e = 0}."""
        return self._add(("eq",), 0, np.zeros(1), HARD, HARD)

    def add_at_most(self) -> int:
        """t <= y: w(e) = 1{e >= 0}."""
        return self._add(("le",), 0, np.zeros(1), HARD, FLAT)

    def add_at_least(self) -> int:
        """t >= y: w(e) = 1{e <= 0}."""
        return self._add(("ge",), 0, np.zeros(1), FLAT, HARD)

    def add_group_mixing(self, alpha: float, leaf_alpha: float, mean: float) -> int:
        """A new table (never shared: the engine rewrites its parameters before every sweep) of
        the factor log w(e) = log NB(S; M, alpha) - log NB(S; M, A) of a group's sum S = -e
        of one cell, NB(S; M, k) the negative binomial pmf of mean M and shape k,

            log w = lgamma(S + alpha) - lgamma(S + A) + kappa S + c0,
            kappa = log((A + M) / (alpha + M)),
            c0 = lgamma(A) - lgamma(alpha) + alpha log(alpha / (alpha + M)) - A log(A / (A + M)),

        and w = 0 for S < 0. Stored as (alpha, A, kappa, c0) (:func:`mixing_parameters`)."""
        out = np.empty(4)
        mixing_parameters(float(alpha), float(leaf_alpha), float(mean), out, 0)
        return self._add(("mix", len(self._meta)), 0, out, MIXING, MIXING)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(meta (T, 5) int64, inv2v (T,), values (total,)) for :func:`term_log`."""
        meta = np.array(self._meta, dtype=np.int64).reshape(-1, 5)
        values = np.concatenate(self._values) if self._values else np.zeros(0)
        return meta, np.array(self._inv2v, dtype=float), values

    def log_weight(self, k: int, e) -> np.ndarray:
        """log w_k(e) (vectorised, for tests and reports)."""
        meta, inv2v, values = self.arrays()
        e = np.asarray(e, dtype=np.int64)
        return np.vectorize(lambda v: term_log(k, int(v), meta, inv2v, values))(e)


def summed_discrete_gaussian_log_pmf(sigma2: float, m: int) -> np.ndarray:
    """log pmf of the sum of m iid N_Z(0, sigma2) on e = -B .. B (module docstring)."""
    half = int(math.ceil(_TABLE_SDS * math.sqrt(m * sigma2))) + 2
    k = np.arange(-half, half + 1, dtype=float)
    # one discrete Gaussian: its normaliser over all integers (terms beyond `half` are < e^-98
    # of the peak for m = 1 and are summed exactly from the closed form below for safety)
    far = np.arange(half + 1, half + 1 + int(math.ceil(40 * math.sqrt(sigma2))) + 2, dtype=float)
    log_q = -k * k / (2.0 * sigma2)
    log_z = np.logaddexp.reduce(np.concatenate([log_q, np.log(2.0) - far * far / (2.0 * sigma2)]))
    if m == 1:
        return log_q - log_z
    one = np.exp(log_q - log_z)
    result = None
    power = one
    n = m
    while n:
        if n & 1:
            result = power if result is None else _truncated_convolve(result, power, half)
        n >>= 1
        if n:
            power = _truncated_convolve(power, power, half)
    with np.errstate(divide="ignore"):
        return np.log(result)


def _truncated_convolve(a: np.ndarray, b: np.ndarray, half: int) -> np.ndarray:
    """The convolution of two pmfs on -half .. half, kept on -half .. half (direct: sums of
    non-negative terms)."""
    full = np.convolve(a, b)  # on -2 half .. 2 half
    return full[half: half + 2 * half + 1]


@kernel(nogil=True)
def mixing_parameters(alpha, leaf_alpha, mean, values, at):
    """values[at : at + 4] = (alpha, A, kappa, c0) of :meth:`TermTables.add_group_mixing`'s
    formula, from alpha, A (``leaf_alpha``) and the mean M; a non-positive or non-finite one
    gives the weight -inf everywhere (kappa = -inf)."""
    values[at] = alpha
    values[at + 1] = leaf_alpha
    if not (alpha > 0.0 and leaf_alpha > 0.0 and mean > 0.0 and math.isfinite(alpha + leaf_alpha + mean)):
        values[at + 2] = -np.inf
        values[at + 3] = -np.inf
        return
    values[at + 2] = math.log((leaf_alpha + mean) / (alpha + mean))
    values[at + 3] = (math.lgamma(leaf_alpha) - math.lgamma(alpha) + alpha * math.log(alpha / (alpha + mean))
                      - leaf_alpha * math.log(leaf_alpha / (leaf_alpha + mean)))


@kernel(nogil=True)
def write_group_mixing(parameters, at, values, group_area, leaf_group, group_parent, S, outer_tilt, box_lo, box_hi,
                       prior_start, table, tilt):
    """Write each group's factor from its (a, A, M) and tilt it, and the leaves' flat prior
    table, towards the current counts: the factor of group g and cell c (row g * C + c of
    ``parameters`` (G * C, 3), its table's parameters at values[at[row]]) gets
    :func:`mixing_parameters`'s formula.

    The tilt: what lies below a group (its leaves' independent NB(M pi, A pi), or its
    children's factors times theirs) gives its sum S the law NB(M, A), p = M / (M + A), and
    the same p to each child; multiplying each child's law by exp(-t x) and the group's factor
    by exp(t S) (S the sum of the children: the product, hence every draw's law, is unchanged)
    turns them into NB(T pi, A pi) with t = log(M (T + A) / ((M + A) T)), T the group's current
    sum + 1/2 (``S``, the areas' current sums (n_areas, C); ``group_area`` (G,)). So a leaf's
    prior gets -t of its finest group (``leaf_group`` (n_leaves,)) and a group's factor +t of
    its own and -t of its parent group's (``group_parent`` (G,)). Where the finest group or the
    parent lies outside these areas (-1: above a shard's root, :mod:`dpinfer.lattice.nested.split`)
    its tilt is ``outer_tilt`` (C,) (zeros at the whole tree's root: no group above).
    Without it, where M is far from the data (a small shape leaves M loosely identified) each
    leaf's message leans on its own prior towards M by tens of nats that only the group's
    factor undoes, and the leaves' trimmed messages would cut what the group's law needs.
    ``table``: the counts' flat prior table (leaf * C + c from ``prior_start`` on, values
    ``box_lo`` .. ``box_hi``), tilted in place. ``tilt`` (G * C,): each factor's t, written
    (0 where its parameters are invalid)."""
    n_cells = S.shape[1]
    for i in range(at.size):
        tilt[i] = 0.0
        mixing_parameters(parameters[i, 0], parameters[i, 1], parameters[i, 2], values, at[i])
        A, M = parameters[i, 1], parameters[i, 2]
        T = S[group_area[i // n_cells], i % n_cells] + 0.5
        if values[at[i] + 2] != -np.inf:  # valid parameters (mixing_parameters)
            tilt[i] = math.log(M / (M + A)) - math.log(T / (T + A))
    for i in range(at.size):
        if values[at[i] + 2] != -np.inf:
            parent = group_parent[i // n_cells]
            c = i % n_cells
            values[at[i] + 2] += tilt[i] - (tilt[parent * n_cells + c] if parent >= 0 else outer_tilt[c])
    for leaf in range(leaf_group.size):
        for c in range(n_cells):
            g = leaf_group[leaf]
            t = tilt[g * n_cells + c] if g >= 0 else outer_tilt[c]
            if t != 0.0:
                i = leaf * n_cells + c
                lo = box_lo[leaf, c]
                for j in range(box_hi[leaf, c] - lo + 1):
                    table[prior_start[i] + j] -= t * (lo + j)


@kernel(nogil=True)
def mixing_log(values, at, s):
    """log w at the group sum s of the MIXING table whose parameters start at values[at]."""
    if s < 0 or values[at + 2] == -np.inf:
        return -np.inf
    return (math.lgamma(s + values[at]) - math.lgamma(s + values[at + 1]) + values[at + 2] * s
            + values[at + 3])


@kernel(nogil=True)
def quadratic_tables(meta, inv2v, values):
    """(T,) bool: whether table k is log w(e) = c - e^2 inv2v[k] for every integer e, to within
    QUADRATIC_TOLERANCE nats: GAUSS at both ends (which continue the quadratic exactly), e = 0
    in the table (c = its entry there) and every entry within the tolerance of c - e^2 inv2v.
    The moves add such terms up as one quadratic in the moved sum
    (:func:`dpinfer.lattice.nested.kernel._add_terms`) instead of reading them one by one."""
    out = np.zeros(meta.shape[0], np.bool_)
    for k in range(meta.shape[0]):
        lo, n, off = meta[k, 0], meta[k, 1], meta[k, 2]
        if meta[k, 3] != GAUSS or meta[k, 4] != GAUSS or lo > 0 or lo + n <= 0:
            continue
        c = values[off - lo]
        worst = 0.0
        for j in range(n):
            e = float(lo + j)
            worst = max(worst, abs(values[off + j] - c + e * e * inv2v[k]))
        out[k] = worst <= QUADRATIC_TOLERANCE
    return out


@kernel(nogil=True)
def term_log(k, e, meta, inv2v, values):
    """log w_k(e) for the tables of :meth:`TermTables.arrays`."""
    if meta[k, 3] == MIXING:
        return mixing_log(values, meta[k, 2], -e)
    lo = meta[k, 0]
    n = meta[k, 1]
    j = e - lo
    if 0 <= j < n:
        return values[meta[k, 2] + j]
    if j < 0:
        mode = meta[k, 3]
        edge = lo
        w = values[meta[k, 2]]
    else:
        mode = meta[k, 4]
        edge = lo + n - 1
        w = values[meta[k, 2] + n - 1]
    if mode == 0:
        return -np.inf
    if mode == 1:
        return w
    return w - (float(e) * float(e) - float(edge) * float(edge)) * inv2v[k]
