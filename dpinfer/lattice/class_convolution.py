r"""I.i.d. integer noise conditioned on linear invariants, computed class by class.

Cells whose columns of the invariant matrix A are equal form a *class*; A e depends on e only
through the class sums E_c = sum_{i in c} e_i, so with A_cls the (r, c) matrix of distinct
columns,

    A e = 0   <=>   A_cls E = 0   <=>   E = K w,  w in Z^m,

with K an integer basis of the class-level kernel lattice (m = c - rank A). Hence, for noise
e_i independent with pmf g_i (the base pmf f, set to 0 below a lower bound l_i when the release
is conditioned on non-negativity, l_i = -x_i; reference note 000 §2.6),

    P(A e = 0, e >= l) = sum_{w}  prod_c G_c((K w)_c),     G_c = *_{i in c} g_i  (convolution),

and an exact joint draw of e given A e = 0, e >= l is: w from the (finite) law proportional to
prod_c G_c((K w)_c), then the cells of every class given their sum (backward sampling,
:func:`dpinfer.lattice.convolution.sample_given_sums`).

Group totals are the case m = 0 (one class per group, E = 0). Seed 000's 2 x 23 table with a
total, a female total and a voting-age total has 4 classes (sex x voting age) and m = 1. When
the classes are the cells themselves (e.g. two-way margins) the sum runs over the whole noise
lattice and is practical only for small tables.

The pmfs G_c are computed by direct convolution of non-negative arrays with rescaling, so every
entry carries a relative (not absolute) rounding error of about n_c * 1e-16, however far in the
tail; the lattice sum runs over every w whose class sums lie in the tabulated supports (a
bounding box from linear programming, then a filter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer._kernel import kernel
from dpinfer.lattice.convolution import log_convolution_at, sample_given_sums
from dpinfer.lattice.invariants import Invariants, column_classes, kernel_points_in_box

MAX_LATTICE_POINTS = 5_000_000
MAX_DIMENSION = 6  # a box of side >= 13 per coordinate exceeds MAX_LATTICE_POINTS beyond this


def log_sum_pmf(log_rows: np.ndarray, lows: np.ndarray) -> tuple[int, np.ndarray]:
    """(lowest value, log pmf) of the sum of independent integer variables; row j of
    ``log_rows`` holds log P(X_j = lows[j] + t), t = 0..W-1 (-inf allowed). Direct convolution
    with rescaling by the maximum after every step (relative accuracy in every entry), in a
    compiled kernel (:func:`_convolve_rescaled`)."""
    log_rows = np.asarray(log_rows, dtype=float)
    lo = int(np.sum(lows))
    if log_rows.shape[0] == 0:
        return 0, np.zeros(1)
    shift = log_rows.max(axis=1, keepdims=True)
    acc, log_scale = _convolve_rescaled(np.ascontiguousarray(np.exp(log_rows - shift)))
    with np.errstate(divide="ignore"):
        return lo, np.log(acc) + (float(np.sum(shift)) + log_scale)


@kernel()
def _convolve_rescaled(rows):
    """(acc, log c): the convolution of the non-negative rows is c * acc, max(acc) = 1 after
    every step but the first (the first row as given)."""
    n, width = rows.shape
    acc = np.zeros(n * (width - 1) + 1)
    work = np.zeros_like(acc)
    acc[:width] = rows[0]
    length, log_scale = width, 0.0
    for j in range(1, n):
        new_length = length + width - 1
        work[:new_length] = 0.0
        for a in range(length):
            v = acc[a]
            if v != 0.0:
                for b in range(width):
                    work[a + b] += v * rows[j, b]
        top = work[:new_length].max()
        acc[:new_length] = work[:new_length] / top
        log_scale += np.log(top)
        length = new_length
    return acc[:length].copy(), log_scale


@dataclass(frozen=True)
class ClassSums:
    """Per class c: the lowest class sum ``lows[c]`` and log G_c on lows[c] .. lows[c] + len - 1."""

    lows: np.ndarray
    log_pmfs: list

    def highs(self) -> np.ndarray:
        return self.lows + np.array([p.size for p in self.log_pmfs]) - 1

    def replace(self, classes, other: "ClassSums") -> "ClassSums":
        """These sums with the classes ``classes`` taken from ``other``."""
        lows, pmfs = self.lows.copy(), list(self.log_pmfs)
        for c in classes:
            lows[c], pmfs[c] = other.lows[c], other.log_pmfs[c]
        return ClassSums(lows, pmfs)


class ClassLattice:
    """Noise with per-cell log pmf ``log_f`` on -k..k (i.i.d.), optionally bounded below per
    cell, conditioned on ``invariants``: normaliser and exact joint draws (module docstring)."""

    def __init__(self, invariants: Invariants, k: int, log_f: np.ndarray):
        if not isinstance(invariants, Invariants):
            raise TypeError(f"invariants must be a dpinfer.Invariants, got {type(invariants).__name__}")
        self.invariants = invariants
        self.k = int(k)
        self.log_f = np.asarray(log_f, dtype=float)
        if self.log_f.shape != (2 * self.k + 1,):
            raise ValueError(f"log_f must have 2k + 1 = {2 * self.k + 1} entries, got {self.log_f.shape}")
        self.codes, self.class_matrix = column_classes(invariants.constraint_matrix)
        self.n_classes = self.class_matrix.shape[1]
        self.members = [np.flatnonzero(self.codes == c) for c in range(self.n_classes)]
        kernel_inv = Invariants.from_matrix(self.class_matrix)
        self.kernel = (np.zeros((self.n_classes, 0), np.int64) if kernel_inv.rank == self.n_classes
                       else np.asarray(kernel_inv.kernel_basis(), dtype=np.int64))

    @property
    def dimension(self) -> int:
        """m: the dimension of the class-level lattice summed over."""
        return self.kernel.shape[1]

    # --- per-cell tables ---------------------------------------------------------------------
    def cell_log_pmfs(self, lower=None) -> np.ndarray:
        """(d, 2k + 1): log f on -k..k for every cell, -inf below ``lower[i]`` (None: no bound)."""
        d = self.invariants.n_cells
        table = np.broadcast_to(self.log_f, (d, self.log_f.size))
        if lower is None:
            return table
        offsets = np.arange(-self.k, self.k + 1)
        return np.where(offsets[None, :] >= np.asarray(lower)[:, None], table, -np.inf)

    def class_sums(self, lower=None, classes=None) -> ClassSums:
        """G_c for every class (or only ``classes``; the others are left empty)."""
        table = self.cell_log_pmfs(lower)
        lows = np.zeros(self.n_classes, np.int64)
        pmfs = [np.zeros(0)] * self.n_classes
        offsets = np.arange(-self.k, self.k + 1)
        for c in range(self.n_classes) if classes is None else classes:
            rows = table[self.members[c]]
            first = np.argmax(rows > -np.inf, axis=1)  # trim the -inf lower part of each row
            width = rows.shape[1] - first.min()
            trimmed = np.full((rows.shape[0], width), -np.inf)
            for j, f0 in enumerate(first):
                trimmed[j, : rows.shape[1] - f0] = rows[j, f0:]
            lows[c], pmfs[c] = log_sum_pmf(trimmed, offsets[first])
        return ClassSums(lows, pmfs)

    # --- the class-level lattice ----------------------------------------------------------------
    def lattice_points(self, sums: ClassSums) -> np.ndarray:
        """Every w (n, m) with lows <= K w <= highs (:func:`dpinfer.lattice.invariants.kernel_points_in_box`).
        Lattices of dimension above ``MAX_DIMENSION`` are refused without solving the LPs."""
        if self.dimension > MAX_DIMENSION:
            raise ValueError(f"the class-level noise lattice has dimension {self.dimension}: too many "
                             f"to enumerate (at most {MAX_DIMENSION})")
        return kernel_points_in_box(self.kernel, sums.lows, sums.highs(), limit=MAX_LATTICE_POINTS,
                                    what="the class-level noise lattice")

    def lattice_log_weights(self, sums: ClassSums) -> tuple[np.ndarray, np.ndarray]:
        """(E (n, c), log prod_c G_c(E_c)) over the class-level lattice points."""
        w = self.lattice_points(sums)
        E = w @ self.kernel.T if self.dimension else np.zeros((1, self.n_classes), np.int64)
        log_w = np.zeros(E.shape[0])
        for c, pmf in enumerate(sums.log_pmfs):
            idx = E[:, c] - sums.lows[c]
            inside = (idx >= 0) & (idx < pmf.size)
            log_w += np.where(inside, pmf[np.clip(idx, 0, pmf.size - 1)], -np.inf)
        return E, log_w

    def zero_sum_log_masses(self, lower=None) -> np.ndarray:
        """Dimension 0 only (A e = 0 iff every class sum is 0, e.g. group totals): per class,
        log P(E_c = 0, e >= lower), by the tilted FFT convolution of
        :func:`dpinfer.lattice.convolution.log_convolution_at` (cost ~ n log n per class, where
        :meth:`class_sums` costs n^2)."""
        if self.dimension:
            raise ValueError("zero_sum_log_masses needs a class lattice of dimension 0")
        targets = self.k * np.array([c.size for c in self.members])
        log_v, _ = log_convolution_at(self.cell_log_pmfs(lower), self.codes, targets)
        return log_v

    def log_normaliser(self, lower=None) -> float:
        """log P(A e = 0, e >= lower) (``lower`` None: no bound)."""
        if self.dimension == 0:
            return float(np.sum(self.zero_sum_log_masses(lower)))
        return self.log_mass(self.class_sums(lower))

    def log_mass(self, sums: ClassSums) -> float:
        """log P(A e = 0, e >= lower) for the bounds that produced ``sums``."""
        _, log_w = self.lattice_log_weights(sums)
        return float(np.logaddexp.reduce(log_w)) if log_w.size else -np.inf

    def sample(self, rng: np.random.Generator, size: int, lower=None) -> np.ndarray:
        """``size`` exact joint draws (size, d) of e given A e = 0 and e >= lower."""
        table = np.ascontiguousarray(self.cell_log_pmfs(lower))
        counts = np.array([c.size for c in self.members])
        if self.dimension == 0:  # every class sum is 0
            return sample_given_sums(table, self.codes, self.k * counts, rng, size=size) - self.k
        sums = self.class_sums(lower)
        E, log_w = self.lattice_log_weights(sums)
        if not np.any(np.isfinite(log_w)):
            raise ValueError("no noise vector satisfies the invariants and the lower bounds")
        p = np.exp(log_w - np.logaddexp.reduce(log_w))
        picks = rng.choice(E.shape[0], size=size, p=p / p.sum())
        out = np.empty((size, self.invariants.n_cells), np.int64)
        for j in np.unique(picks):
            rows = np.flatnonzero(picks == j)
            targets = E[j] + self.k * counts
            out[rows] = sample_given_sums(table, self.codes, targets, rng, size=rows.size) - self.k
        return out


class NormaliserTracker:
    """log Z(x) = log P(A e = 0, x + e >= 0) along a chain of count vectors x, recomputing only
    the classes whose cells changed (for Metropolis corrections, :mod:`dpinfer.lattice.fibre_gibbs`)."""

    def __init__(self, lattice: ClassLattice, x):
        self.lattice = lattice
        self.x = np.array(x, dtype=np.int64).reshape(-1)
        self.sums = lattice.class_sums(-self.x)
        self.log_z = lattice.log_mass(self.sums)

    def propose(self, x_new) -> tuple[float, ClassSums]:
        """(log Z(x_new), its class sums) without moving the tracker."""
        changed = np.unique(self.lattice.codes[np.flatnonzero(x_new != self.x)])
        if changed.size == 0:
            return self.log_z, self.sums
        sums = self.sums.replace(changed, self.lattice.class_sums(-x_new, classes=changed))
        return self.lattice.log_mass(sums), sums

    def move(self, x_new, log_z: float, sums: ClassSums) -> None:
        self.x = np.array(x_new, dtype=np.int64)
        self.log_z, self.sums = log_z, sums
