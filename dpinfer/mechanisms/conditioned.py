r"""Additive noise conditioned on linear equality invariants (seed 000; seed 001 §5.4).

Given a base mechanism with i.i.d. integer noise e_i ~ f and invariants A x = a, the
conditioned mechanism releases s = x + e with e drawn from the base law conditioned on
A e = 0, so that A s = A x holds exactly:

    p(s | x) = prod_i f(s_i - x_i) / P(A e = 0)     on {s : A s = A x},  0 elsewhere.

The normaliser P(A e = 0) does not depend on x, which makes this an ordinary likelihood of the
true counts on their fibre {x : A x = A s, x >= 0} (inference notes §2-§3). With double
geometric f (a = exp(-epsilon)) this is seed 001's generalized l1 Laplace mechanism on the
kernel lattice, and seed 000's congenial mechanism restricted to equality invariants.

Privacy: for data sets with equal invariants the log-ratio is
log f(s - x) - log f(s - x') and the normaliser cancels; for a pure-DP base with noise
exp(-epsilon |e| / Delta) the loss is at most epsilon ||x - x'||_1 / Delta (a person moving
between two cells of the same group is ||x - x'||_1 = 2, i.e. 2 epsilon). Conditioning an
approximate-DP base (discrete Gaussian) changes its delta; that accounting is not made here.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from dpinfer._validation import as_integer_array, check_probability, check_rng
from dpinfer.invariants import Invariants
from dpinfer.lattice_gibbs import MovePlan, QueryRows, gibbs_sweeps
from dpinfer.mechanisms.base import AdditiveMechanism, Mechanism, PrivacyAudit, PrivacyGuarantee

# The noise is tabulated on [-K, K] with per-cell tail mass below this: the truncated law is
# within d * P(|e| > K) / P(A e = 0) of the exact one in total variation.
_TAIL_MASS = 1e-20
_MAX_NOISE_HALF_WIDTH = 1_000_000


def tabulated_noise(base) -> tuple[int, np.ndarray]:
    """(K, log f(-K..K)): a discrete additive mechanism's noise on the smallest window (K a power
    of 2 times 16) whose two-sided tail mass is below 1e-20."""
    k = 16
    while True:
        values = base.noise_logpdf(np.arange(-4 * k, 4 * k + 1))
        tail = np.logaddexp.reduce(values[: 3 * k]) + np.log(2.0)  # |e| > k, with margin
        if tail < np.log(_TAIL_MASS) or k > _MAX_NOISE_HALF_WIDTH:
            return k, base.noise_logpdf(np.arange(-k, k + 1))
        k *= 2


class Conditioned(Mechanism):
    """``base`` noise conditioned on ``invariants``: A e = 0, so A release = A truth exactly.

    Parameters
    ----------
    base
        A discrete additive mechanism (``DoubleGeometric``, ``DiscreteGaussian``).
    invariants
        An :class:`~dpinfer.invariants.Invariants` on the released cells (flattened in C order).
    burn_in_sweeps
        Sweeps of the noise chain used by :meth:`release` when the invariants are not one
        total or disjoint group totals (see :meth:`sample_noise`).
    """

    discrete = True
    exact_sampler = False  # noise tabulated on [-K, K]; general invariants use MCMC (issue 4)

    def __init__(self, base, invariants, *, burn_in_sweeps: int = 200):
        if not isinstance(base, AdditiveMechanism) or not base.discrete:
            raise TypeError(
                "base must be a discrete additive mechanism (DoubleGeometric, DiscreteGaussian); "
                f"got {base!r}"
            )
        if not isinstance(invariants, Invariants):
            raise TypeError(f"invariants must be a dpinfer.Invariants, got {type(invariants).__name__}")
        if int(burn_in_sweeps) != burn_in_sweeps or burn_in_sweeps < 1:
            raise ValueError(f"burn_in_sweeps must be a positive integer, got {burn_in_sweeps!r}")
        self.base = base
        self.invariants = invariants
        self.burn_in_sweeps = int(burn_in_sweeps)
        self._noise_table = None
        self._log_normaliser = None

    # --- privacy -------------------------------------------------------------------------
    @property
    def privacy(self) -> PrivacyGuarantee:
        base = self.base.privacy
        if base.delta != 0:
            raise ValueError(
                "the privacy of an approximate-DP base conditioned on invariants is not derived "
                "here (conditioning changes delta); use a pure-DP base such as DoubleGeometric"
            )
        return PrivacyGuarantee(
            base.epsilon, 0.0, base.sensitivity, "equal-invariants", "l1",
            note=(
                f"loss <= epsilon * ||x - x'||_1 / {base.sensitivity:g} between data sets with "
                "equal invariants (the normaliser P(A e = 0) cancels)"
            ),
        )

    def audit(self, max_true: int = 3, margin: int = 12) -> PrivacyAudit:
        """Exact check on this mechanism's invariants when they have at most 4 cells, else on
        a total over 3 cells: every pair of true vectors x, x' in {0..max_true}^d with equal
        invariants, every release s with |s_i - x_i| <= margin on the fibre; the measured
        epsilon is the largest log p(s|x)/p(s|x') divided by ||x - x'||_1 / sensitivity."""
        inv = self.invariants if self.invariants.n_cells <= 4 else Invariants.total(3)
        claim = self.privacy
        d = inv.n_cells
        grid = np.stack(np.meshgrid(*[np.arange(max_true + 1)] * d, indexing="ij"), -1).reshape(-1, d)
        values = inv.values(grid)
        noise = np.stack(np.meshgrid(*[np.arange(-margin, margin + 1)] * d, indexing="ij"), -1).reshape(-1, d)
        noise = noise[np.all(inv.values(noise) == 0, axis=-1)]
        worst = 0.0
        for i, x in enumerate(grid):
            same = np.all(values == values[i], axis=-1)
            for x2 in grid[same]:
                dist = np.abs(x - x2).sum() / claim.sensitivity
                if dist == 0:
                    continue
                s = x + noise  # releases reachable from x; p(s | x') uses s - x'
                ratio = (self.base.noise_logpdf(s - x).sum(-1) - self.base.noise_logpdf(s - x2).sum(-1))
                worst = max(worst, float(np.max(ratio)) / dist)
        return PrivacyAudit(claim.epsilon, 0.0, worst, 0.0,
                            f"enumeration on {inv.kind} invariants over {d} cells")

    # --- release ---------------------------------------------------------------------------
    def check_release(self, release) -> np.ndarray:
        release = as_integer_array("release", release)
        if release.size != self.invariants.n_cells:
            raise ValueError(
                f"release has {release.size} cells but the invariants cover "
                f"{self.invariants.n_cells}"
            )
        return release

    def release(self, true_values, rng: np.random.Generator) -> np.ndarray:
        x = as_integer_array("true_values", true_values)
        if x.size != self.invariants.n_cells:
            raise ValueError(
                f"true_values has {x.size} cells but the invariants cover {self.invariants.n_cells}"
            )
        return x + self.sample_noise(rng).reshape(x.shape)

    def noise_table(self) -> tuple[int, np.ndarray]:
        """(K, log f(-K..K)): the base noise tabulated by :func:`tabulated_noise`."""
        if self._noise_table is None:
            self._noise_table = tabulated_noise(self.base)
        return self._noise_table

    def sample_noise(self, rng: np.random.Generator, size=None) -> np.ndarray:
        """Noise e with A e = 0: exact joint draws by convolution for a total or group totals
        (inference notes §2, backward sampling); otherwise ``burn_in_sweeps`` sweeps of exact
        Gibbs updates along the invariants' Markov moves, started at e = 0 (a start that
        depends on no data), which is MCMC and simulation-grade."""
        from dpinfer.inference.convolution import sample_given_sums

        rng = check_rng(rng)
        k, log_f = self.noise_table()
        d = self.invariants.n_cells
        log_g = np.broadcast_to(log_f, (d, log_f.size))
        if self.invariants.group_codes is not None:
            codes = self.invariants.group_codes
            targets = k * np.bincount(codes)
            return sample_given_sums(log_g, codes, targets, rng, size=size) - k
        n = 1 if size is None else int(size)
        moves = self.invariants.markov_basis()
        plan = MovePlan.build(moves.cells, moves.steps, np.zeros((0, d), np.int64))
        out = np.empty((n, d), dtype=np.int64)
        for r in range(n):
            e, _, _ = gibbs_sweeps(
                np.zeros(d, np.int64), np.full(d, -k), log_g, np.full(d, -np.inf), plan,
                QueryRows.empty(d), n_sweeps=self.burn_in_sweeps, moves_per_sweep=len(plan), rng=rng,
            )
            out[r] = e
        return out[0] if size is None else out

    # --- likelihood --------------------------------------------------------------------------
    def log_normaliser(self) -> float:
        """log P(A e = 0) under the base noise: a convolution per group (inference notes §2)
        for a total or group totals; not computed for other invariants."""
        from dpinfer.inference.convolution import log_convolution_at

        if self.invariants.group_codes is None:
            raise ValueError(
                "log P(A e = 0) is computed for one total or group totals only; for "
                f"{self.invariants.kind!r} invariants the likelihood is given up to this "
                "constant (it does not depend on the true counts)"
            )
        if self._log_normaliser is None:
            k, log_f = self.noise_table()
            codes = self.invariants.group_codes
            log_g = np.broadcast_to(log_f, (codes.size, log_f.size))
            log_v, _ = log_convolution_at(log_g, codes, k * np.bincount(codes))
            self._log_normaliser = float(np.sum(log_v))
        return self._log_normaliser

    def _constant(self) -> float:
        """log P(A e = 0) where it is computed, else 0 (the likelihood is then given up to
        an x-independent constant)."""
        return self.log_normaliser() if self.invariants.group_codes is not None else 0.0

    def log_likelihood(self, release, true_values) -> float:
        """log p(s | x) = sum_i log f(s_i - x_i) - log P(A e = 0) if A s = A x, else -inf
        (one number for the whole vector; the constant is omitted for invariants other than
        totals, see :meth:`log_normaliser`)."""
        s = self.check_release(release).reshape(-1)
        x = as_integer_array("true_values", true_values).reshape(-1)
        if x.size != s.size:
            raise ValueError(f"true_values has {x.size} cells but release has {s.size}")
        if np.any(self.invariants.values(s) != self.invariants.values(x)):
            return -np.inf
        return float(np.sum(self.base.noise_logpdf(s - x)) - self._constant())

    def log_likelihood_bound_outside(self, release, k, *, support=(-np.inf, np.inf)) -> np.ndarray:
        """Per cell, the base noise's bound: the likelihood's factor for cell i is
        f(s_i - x_i) <= sup_{|e| > k} f(e) outside the window (the constant normaliser is
        accounted for by the convolution bound, see ``dpinfer.inference.sampling``)."""
        return self.base.log_likelihood_bound_outside(self.check_release(release), k, support=support)

    def check_invariants(self, release) -> np.ndarray:
        """The release, after checking that its invariants are a feasible target for
        non-negative counts (else the release cannot come from this mechanism)."""
        release = self.check_release(release)
        a = self.invariants.values(release.reshape(-1))
        if not self.invariants.is_feasible(a):
            raise ValueError(
                "the release's invariant values A s admit no non-negative integer counts; "
                "it cannot be a release of this mechanism"
            )
        return release

    def observe(self, name: str, true_values, observed, *, dims=None, model=None):
        """As :meth:`Mechanism.observe`, after checking that the release's invariants admit
        non-negative counts."""
        self.check_invariants(observed.get_value() if hasattr(observed, "get_value") else observed)
        return super().observe(name, true_values, observed, dims=dims, model=model)

    def dist(self, true_values):
        """Release given symbolic true values: per cell log f(s_i - x_i) - log P(A e = 0)/d,
        -inf everywhere when A s != A x; draws use :meth:`release`. Only the sum over cells is
        meaningful (the normaliser is spread evenly)."""
        base, matrix = self.base, self.invariants.constraint_matrix
        constant = self._constant() / self.invariants.n_cells

        def logp(value, mu):
            terms = pm.logp(base.dist(mu), value)
            gap = pt.dot(pt.constant(matrix), (value - mu).reshape((-1,)))
            return pt.switch(pt.all(pt.eq(gap, 0)), terms - constant, -np.inf)

        def random(mu, rng=None, size=None):
            return self.release(np.asarray(mu, dtype=np.int64), rng)

        return pm.CustomDist.dist(
            true_values, logp=logp, random=random, dtype="int64",
            class_name=f"Conditioned{type(base).__name__}",
        )

    # --- utility -----------------------------------------------------------------------------
    def bias(self, true_values) -> np.ndarray:
        """0: the conditioned noise law is symmetric (e and -e satisfy A e = 0 together)."""
        return np.zeros(np.shape(as_integer_array("true_values", true_values)))

    def noise_marginals(self) -> tuple[int, np.ndarray]:
        """(K, P) with P[i, k + K] = P(e_i = k | A e = 0) for k in -K..K, exactly by convolution
        for a total or group totals: for a group of n cells,
        P(e_i = k | S_n = 0) = f(k) P(S_{n-1} = -k) / P(S_n = 0) (inference notes §2)."""
        from dpinfer.inference.convolution import log_convolution_at

        if self.invariants.group_codes is None:
            raise ValueError(
                "the conditioned noise marginals are computed for one total or group totals only, "
                f"not for {self.invariants.kind!r} invariants"
            )
        k, log_f = self.noise_table()
        codes = self.invariants.group_codes
        log_g = np.broadcast_to(log_f, (codes.size, log_f.size))
        _, marginals = log_convolution_at(log_g, codes, k * np.bincount(codes))
        return k, marginals

    def variance(self, true_values) -> np.ndarray:
        """Var(e_i | A e = 0) from :meth:`noise_marginals` (totals and group totals)."""
        x = as_integer_array("true_values", true_values)
        k, marginals = self.noise_marginals()
        offsets = np.arange(-k, k + 1)
        return (marginals @ offsets.astype(float) ** 2).reshape(x.shape)

    def release_interval(self, true_values, prob: float = 0.9):
        """Per cell [x_i - q_i, x_i + q_i] with q_i the smallest q such that
        P(|e_i| <= q | A e = 0) >= prob, from the exact conditioned marginals (totals and group
        totals, to 1e-12; cells in groups of different sizes get different q_i)."""
        x = as_integer_array("true_values", true_values)
        prob = check_probability(prob)
        if x.size != self.invariants.n_cells:
            raise ValueError(f"true_values has {x.size} cells but the invariants cover {self.invariants.n_cells}")
        k, marginals = self.noise_marginals()
        # P(|e_i| <= q) for q = 0..K: the centre plus both sides
        central = np.cumsum(marginals[:, k:], axis=1) + np.concatenate(
            [np.zeros((marginals.shape[0], 1)), np.cumsum(marginals[:, k - 1::-1], axis=1)], axis=1)
        q = np.argmax(central >= prob - 1e-12, axis=1).reshape(x.shape)
        return x - q, x + q

    def __repr__(self) -> str:
        return f"Conditioned({self.base!r}, {self.invariants!r})"
