r"""Additive noise conditioned on linear equality invariants (seed 000; seed 001 §5.4).

Given a base mechanism with i.i.d. integer noise e_i ~ f and invariants A x = a, the
conditioned mechanism releases s = x + e with e drawn from the base law conditioned on
A e = 0, so that A s = A x holds exactly:

    p(s | x) = prod_i f(s_i - x_i) / P(A e = 0)     on {s : A s = A x},  0 elsewhere.

The normaliser P(A e = 0) does not depend on x, which makes this an ordinary likelihood of the
true counts on their fibre {x : A x = A s, x >= 0} (inference notes §2-§3). With double
geometric f (a = exp(-epsilon)) this is seed 001's generalized l1 Laplace mechanism on the
kernel lattice, and seed 000's congenial mechanism restricted to equality invariants.

With ``nonnegative=True`` the noise is also conditioned on x + e >= 0 (seed 000's congenial
mechanism with non-negativity; reference note 000 §2.6): with S*(x) = {s : A s = A x, s >= 0},

    p(s | x) = prod_i f(s_i - x_i) / P_x,      P_x = P(A e = 0, x + e >= 0),

on S*(x). Unlike the equality-only case the normaliser P_x depends on x, so

    log p(s | x) - log p(s | x') = [sum_i log f(s_i - x_i) - log f(s_i - x'_i)] + log(P_x' / P_x).

Theorem 2.1: for a base that is epsilon-DP, both terms are at most epsilon per unit distance,
so the conditioned mechanism is (1 + gamma) epsilon-DP with

    gamma* = max over neighbours of log(P_x' / P_x) / (epsilon ||x - x'||_1 / Delta)  in [0, 1].

:func:`congenial_privacy_audit` computes, by enumeration on small cases, the exact worst loss
per unit distance and gamma*; :meth:`Conditioned.log_normaliser` gives log P_x exactly.

Privacy: for data sets with equal invariants the log-ratio is
log f(s - x) - log f(s - x') and the normaliser cancels; for a pure-DP base with noise
exp(-epsilon |e| / Delta) the loss is at most epsilon ||x - x'||_1 / Delta (a person moving
between two cells of the same group is ||x - x'||_1 = 2, i.e. 2 epsilon). Conditioning an
approximate-DP base (discrete Gaussian) changes its delta; that accounting is not made here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from dpinfer._validation import as_integer_array, check_count, check_probability, check_rng
from dpinfer.lattice.class_convolution import ClassLattice
from dpinfer.lattice.convolution import log_convolution_at
from dpinfer.lattice.independence_sampler import run_independence_chain, unimodular_block
from dpinfer.lattice.invariants import Invariants
from dpinfer.lattice.noise_gibbs import NoiseGibbs
from dpinfer.lattice.random_walk import double_geometric_draws
from dpinfer.lattice.targets import LatticeTarget
from dpinfer.mechanisms.base import AdditiveMechanism, Mechanism, PrivacyAudit, PrivacyGuarantee
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian
from dpinfer.mechanisms.geometric import DoubleGeometric

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
    """``base`` noise conditioned on ``invariants``: A e = 0, so A release = A truth exactly;
    with ``nonnegative=True`` also on release >= 0 (seed 000's congenial mechanism).

    Parameters
    ----------
    base
        A discrete additive mechanism (``DoubleGeometric``, ``DiscreteGaussian``).
    invariants
        An :class:`~dpinfer.lattice.invariants.Invariants` on the released cells (flattened in C order).
    nonnegative
        Condition on a non-negative release too. The normaliser P(A e = 0, x + e >= 0) then
        depends on the true counts x (reference note 000 §2.6) and the privacy loss grows to
        (1 + gamma) epsilon, gamma <= 1 (Theorem 2.1); see :meth:`congenial` and
        :func:`congenial_privacy_audit`.
    burn_in_sweeps
        Sweeps of the simulation-grade noise chain used when the invariants' class lattice is
        too large to enumerate (see :meth:`sample_noise`).

    Samplers, by grade
    ------------------
    * ``release(x, rng)`` is **curator-grade**: i.i.d. proposals from the base's exact
      integer-arithmetic sampler, accepted when A e = 0 (and x + e >= 0); group by group for
      totals and group totals, the whole vector otherwise. Rejection sampling draws exactly
      from the conditional law; the expected number of proposals, 1 / P(accept), is computed
      first and a release that would need more than ``max_proposals`` is refused.
    * ``release(x, rng, grade="simulation")`` and :meth:`sample_noise` are
      **simulation-grade**: exact joint draws from the noise tabulated to a tail mass of 1e-20
      per cell (:mod:`dpinfer.lattice.class_convolution`) where the class lattice can be enumerated;
      otherwise MCMC (Gibbs along Markov moves from e = 0 for equality invariants, seed 000's
      Algorithm 1 from a data-free start for non-negativity). Use it for studies.
    """

    discrete = True
    exact_sampler = True  # release() is curator-grade (rejection from the exact base sampler)
    keeps_invariants = True

    def __init__(self, base, invariants, *, nonnegative: bool = False, burn_in_sweeps: int = 200):
        if not isinstance(base, AdditiveMechanism) or not base.discrete:
            raise TypeError(
                "base must be a discrete additive mechanism (DoubleGeometric, DiscreteGaussian); "
                f"got {base!r}"
            )
        if not isinstance(invariants, Invariants):
            raise TypeError(f"invariants must be a dpinfer.Invariants, got {type(invariants).__name__}")
        if not isinstance(nonnegative, (bool, np.bool_)):
            raise TypeError(f"nonnegative must be True or False, got {nonnegative!r}")
        self.base = base
        self.invariants = invariants
        self.nonnegative = bool(nonnegative)
        self.burn_in_sweeps = check_count("burn_in_sweeps", burn_in_sweeps, 1)
        self._noise_table = None
        self._log_normaliser = None
        self._lattice = None
        self._range_from_zero = None

    @classmethod
    def congenial(cls, epsilon, invariants, *, sensitivity=1, neighbour: str = "add-remove"):
        """Seed 000's recipe for a target epsilon: ``DoubleGeometric(epsilon / 2)`` conditioned
        on the invariants and non-negativity, which is (1 + gamma) epsilon / 2 <= epsilon-DP
        (Theorem 2.1, gamma <= 1) between data sets with equal invariants."""
        epsilon = float(epsilon)
        if not np.isfinite(epsilon) or epsilon <= 0:
            raise ValueError(f"epsilon must be a positive number, got {epsilon!r}")
        return cls(DoubleGeometric(epsilon / 2, sensitivity=sensitivity, neighbour=neighbour),
                   invariants, nonnegative=True)

    # --- privacy -------------------------------------------------------------------------
    @property
    def privacy(self) -> PrivacyGuarantee:
        base = self.base.privacy
        if base.delta != 0:
            raise ValueError(
                "the privacy of an approximate-DP base conditioned on invariants is not derived "
                "here (conditioning changes delta); use a pure-DP base such as DoubleGeometric"
            )
        if self.nonnegative:
            return PrivacyGuarantee(
                2 * base.epsilon, 0.0, base.sensitivity, "equal-invariants", "l1",
                note=(
                    f"seed 000 Theorem 2.1: loss <= (1 + gamma) {base.epsilon:g} ||x - x'||_1 / "
                    f"{base.sensitivity:g} with gamma <= 1 (the normaliser P(A e = 0, x + e >= 0) "
                    "depends on x); gamma* on small cases: "
                    "dpinfer.mechanisms.conditioned.congenial_privacy_audit"
                ),
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
        invariants, every release s with |s_i - x_i| <= margin on the fibre (and s >= 0 with
        ``nonnegative``, both normalisers included); the measured epsilon is the largest
        log p(s|x)/p(s|x') divided by ||x - x'||_1 / sensitivity."""
        inv = self.invariants if self.invariants.n_cells <= 4 else Invariants.total(3)
        claim = self.privacy
        if self.nonnegative:
            result = congenial_privacy_audit(self.base, inv, max_true=max_true, margin=margin)
            return PrivacyAudit(claim.epsilon, 0.0, result.measured_epsilon, 0.0,
                                f"enumeration on {inv.kind} invariants over {inv.n_cells} cells "
                                f"with non-negativity (gamma* = {result.gamma:.4g})")
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

    def _check_truth(self, true_values) -> np.ndarray:
        x = as_integer_array("true_values", true_values)
        if x.size != self.invariants.n_cells:
            raise ValueError(
                f"true_values has {x.size} cells but the invariants cover {self.invariants.n_cells}"
            )
        if self.nonnegative and np.any(x < 0):
            raise ValueError("true_values must be non-negative counts for a release conditioned "
                             "on non-negativity")
        return x

    def release(self, true_values, rng: np.random.Generator, *, grade: str = "curator",
                max_proposals: float = 1e8) -> np.ndarray:
        """A release x + e. ``grade="curator"`` (default): exact rejection sampling from the
        base's integer-arithmetic sampler (class docstring), refused if the expected number of
        noise draws exceeds ``max_proposals``; ``grade="simulation"``: :meth:`sample_noise`."""
        x = self._check_truth(true_values)
        rng = check_rng(rng)
        if grade == "simulation":
            return x + self.sample_noise(rng, true_values=x).reshape(x.shape)
        if grade != "curator":
            raise ValueError(f"grade must be 'curator' or 'simulation', got {grade!r}")
        return x + self._rejection_noise(x.reshape(-1), rng, float(max_proposals)).reshape(x.shape)

    def _rejection_noise(self, x: np.ndarray, rng, max_proposals: float) -> np.ndarray:
        """Exact draw of e given A e = 0 (and x + e >= 0): i.i.d. exact base draws, the first
        accepted one kept; class by class when A e = 0 means a zero sum in every class (group
        totals), else on the whole vector. P(accept) of each block is its share of the
        normaliser; where that cannot be computed (class lattice too large) it is estimated by
        :meth:`approximate_log_acceptance`, and no refusal is made on cost only when that is
        unavailable too."""
        lattice = self.class_lattice()
        lower = -x if self.nonnegative else None
        how = "exact"
        if lattice.dimension == 0:
            blocks, log_accept = lattice.members, list(lattice.zero_sum_log_masses(lower))
        else:
            blocks = [np.arange(x.size)]
            try:
                log_accept = [lattice.log_normaliser(lower)]
            except ValueError:
                approx = self.approximate_log_acceptance()
                log_accept, how = [0.0 if approx is None else approx], "normal approximation"
        expected = float(np.sum([b.size * np.exp(-la) for b, la in zip(blocks, log_accept)]))
        if not expected <= max_proposals:
            hint = ("; for the same law with a certified MCMC release, use "
                    "GeneralizedLaplace(epsilon, invariants).certify()"
                    if type(self.base).__name__ == "DoubleGeometric" and not self.nonnegative else "")
            raise RuntimeError(
                f"curator-grade rejection sampling would need about {expected:.3g} noise draws "
                f"({how}; max_proposals = {max_proposals:.3g}); raise max_proposals, or use "
                f"grade='simulation' for studies{hint}"
            )
        out = np.empty(x.size, np.int64)
        for cells, la in zip(blocks, log_accept):
            if cells.size == 1 and not self.nonnegative:
                out[cells] = 0
                continue
            batch = int(min(max(64, 2 * np.exp(-la)), max(64, 2_000_000 // cells.size)))
            while True:
                e = self.base.sample_noise((batch, cells.size), rng).astype(np.int64)
                ok = np.all(self.invariants.constraint_matrix[:, cells] @ e.T == 0, axis=0)
                if self.nonnegative:
                    ok &= np.all(e >= -x[cells], axis=1)
                hit = np.flatnonzero(ok)
                if hit.size:
                    out[cells] = e[hit[0]]
                    break
        return out

    def approximate_log_acceptance(self) -> float | None:
        """log P(A e = 0) by the local central limit theorem, for cost estimates where the class
        lattice is too large to compute it: A e is approximately N(0, v A A^T) (v the base's
        noise variance, A of full row rank k) on the lattice A Z^d, which is Z^k when A has a
        unimodular k x k block, so P(A e = 0) ~ (2 pi)^(-k/2) det(v A A^T)^(-1/2). None when no
        unimodular block is found. Non-negativity is ignored (it only lowers the acceptance).
        Exact to 1e-3 for discrete Gaussian noise (sigma >= 3) on small tables; for double
        geometric noise with few cells per constraint it is low by 1-1.7 nats (2 x 2 and 2 x 3
        margins), so the cost estimate errs high."""
        A = self.invariants.matrix
        try:
            unimodular_block(A)
        except ValueError:
            return None
        _, log_det = np.linalg.slogdet(self.base.noise_variance * (A @ A.T).astype(float))
        return float(-0.5 * A.shape[0] * np.log(2.0 * np.pi) - 0.5 * log_det)

    def noise_table(self) -> tuple[int, np.ndarray]:
        """(K, log f(-K..K)): the base noise tabulated by :func:`tabulated_noise`."""
        if self._noise_table is None:
            self._noise_table = tabulated_noise(self.base)
        return self._noise_table

    def class_lattice(self):
        """The :class:`~dpinfer.lattice.class_convolution.ClassLattice` of the invariants and the
        tabulated base noise (cached)."""
        if self._lattice is None:
            k, log_f = self.noise_table()
            # the table's K is rounded up to 16 * 2^j; the class sums need only the 1e-20 tails
            # (their direct convolutions cost K^2)
            tails = np.logaddexp.accumulate(log_f[:k]) + np.log(2.0)  # P(|e| >= K - i), i = 0..K-1
            k_small = k - int(np.sum(tails < np.log(_TAIL_MASS)))
            self._lattice = ClassLattice(self.invariants, k_small, log_f[k - k_small: k + k_small + 1])
        return self._lattice

    def sample_noise(self, rng: np.random.Generator, size=None, *, true_values=None) -> np.ndarray:
        """Simulation-grade noise e with A e = 0 (and x + e >= 0 for ``true_values`` x when
        ``nonnegative``): exact joint draws from the tabulated noise where the class lattice can
        be enumerated (:mod:`dpinfer.lattice.class_convolution`); otherwise MCMC: ``burn_in_sweeps``
        sweeps of exact Gibbs updates along the invariants' Markov moves from e = 0, or, with
        non-negativity, seed 000's Algorithm 1 (:meth:`independence_chain_noise`)."""
        rng = check_rng(rng)
        n = 1 if size is None else int(size)
        lower = None
        if self.nonnegative:
            if true_values is None:
                raise ValueError("true_values is needed: the noise conditioned on x + e >= 0 depends on x")
            lower = -self._check_truth(true_values).reshape(-1)
        try:
            out = self.class_lattice().sample(rng, n, lower=lower)
        except ValueError as err:
            if "too many to enumerate" not in str(err):
                raise
            out = (self.independence_chain_noise(-lower, rng, n, thin=1000) if self.nonnegative
                   else self._gibbs_noise(rng, n))
        return out[0] if size is None else out

    def _gibbs_noise(self, rng, n: int) -> np.ndarray:
        """``n`` independent chains of ``burn_in_sweeps`` exact Gibbs sweeps along the
        invariants' Markov moves from e = 0 (:class:`dpinfer.lattice.noise_gibbs.NoiseGibbs`)."""
        # log f(e) up to a constant: -rate |e| (double geometric) or -e^2 / (2 sigma^2)
        if isinstance(self.base, DoubleGeometric):
            target = LatticeTarget(0, -np.log(self.base.alpha))
        elif isinstance(self.base, DiscreteGaussian):
            target = LatticeTarget(2, 1.0 / (2.0 * self.base.sigma ** 2))
        else:
            raise TypeError(f"no Gibbs sampler for the noise of {self.base!r}")
        z, _ = NoiseGibbs(self.invariants.markov_basis(), target).run(n, self.burn_in_sweeps, rng)
        return z

    def independence_chain_noise(self, true_values, rng, n: int, *, proposal_epsilon=None,
                                 burn_in: int = 20_000, thin: int = 50) -> np.ndarray:
        """``n`` states of seed 000's Algorithm 1 (:mod:`dpinfer.lattice.independence_sampler`) for a
        double geometric base, every ``thin``-th after ``burn_in`` iterations of one chain;
        proposal epsilon~ = ``proposal_epsilon`` (default 1.2 x the base's, the ratio of seed
        000 §3.2). Safe start: ``Invariants.feasible_point(A x)``, a function of the public
        invariants only, so the confidential x enters through the proposals' weights alone. No
        TV bound is computed: simulation-grade."""
        if not isinstance(self.base, DoubleGeometric):
            raise TypeError("Algorithm 1 is implemented for a DoubleGeometric base")
        x = self._check_truth(true_values).reshape(-1)
        A = self.invariants.matrix
        eps = self.base.epsilon * 1.2 if proposal_epsilon is None else float(proposal_epsilon)
        proposal = DoubleGeometric(eps, sensitivity=self.base.sensitivity)
        chain = run_independence_chain(
            x, A, self.base.noise_logpdf, proposal.noise_logpdf,
            lambda shape, g: double_geometric_draws(proposal.alpha, shape, g), unimodular_block(A),
            n_iterations=burn_in + n * thin, burn_in=burn_in + thin - 1, thin=thin, rng=rng,
            nonnegative=True, start=self.invariants.feasible_point(self.invariants.values(x)),
        )
        return chain.draws[:n] - x

    # --- likelihood --------------------------------------------------------------------------
    def log_normaliser(self, true_values=None) -> float:
        """log P(A e = 0) under the base noise, or with ``nonnegative`` log P(A e = 0, x + e >= 0)
        for the true counts x = ``true_values``: a convolution per group for totals and group
        totals, else a sum over the class-level noise lattice (:mod:`dpinfer.lattice.class_convolution`);
        raises ValueError when that lattice is too large to enumerate."""
        if self.nonnegative:
            if true_values is None:
                raise ValueError("true_values is needed: with non-negativity the normaliser "
                                 "P(A e = 0, x + e >= 0) depends on the true counts x")
            return self.class_lattice().log_normaliser(-self._check_truth(true_values).reshape(-1))
        if self._log_normaliser is None:
            try:
                self._log_normaliser = self.class_lattice().log_normaliser(None)
            except ValueError as err:
                self._log_normaliser = err
        if isinstance(self._log_normaliser, ValueError):
            raise ValueError(
                f"log P(A e = 0) is not computed for these {self.invariants.kind!r} invariants "
                f"({self._log_normaliser}); the likelihood is given up to this constant, which "
                "does not depend on the true counts"
            )
        return self._log_normaliser

    def normaliser_is_exact(self) -> bool:
        """Whether :meth:`log_likelihood` includes the normaliser (it is left out, as an
        x-independent constant, only for equality invariants too large to enumerate)."""
        if self.nonnegative:
            return True
        try:
            self.log_normaliser()
        except ValueError:
            return False
        return True

    def _constant(self) -> float:
        """log P(A e = 0) where it is computed, else 0 (equality invariants only)."""
        return self.log_normaliser() if self.normaliser_is_exact() else 0.0

    def log_likelihood(self, release, true_values) -> float:
        """log p(s | x) = sum_i log f(s_i - x_i) - log P(A e = 0) if A s = A x, else -inf;
        with ``nonnegative``, the normaliser is log P(A e = 0, x + e >= 0) and s must be >= 0
        (one number for the whole vector; see :meth:`normaliser_is_exact`)."""
        s = self.check_release(release).reshape(-1)
        x = as_integer_array("true_values", true_values).reshape(-1)
        if x.size != s.size:
            raise ValueError(f"true_values has {x.size} cells but release has {s.size}")
        if np.any(self.invariants.values(s) != self.invariants.values(x)):
            return -np.inf
        if self.nonnegative:
            if np.any(s < 0) or np.any(x < 0):
                return -np.inf
            return float(np.sum(self.base.noise_logpdf(s - x)) - self.log_normaliser(x))
        return float(np.sum(self.base.noise_logpdf(s - x)) - self._constant())

    def normaliser_range(self, lower_counts) -> float:
        """With ``nonnegative``: max - min of log P(A e = 0, x + e >= 0) over all counts
        x >= ``lower_counts`` (elementwise), i.e. log P(A e = 0) - log P(A e = 0, e >= -lower)
        (the normaliser increases in every x_i). 0 without non-negativity. Over
        x >= 0 this bounds how much the x-dependent normaliser can reweight any two count
        vectors; over a window's lower ends it says whether non-negativity can bind there."""
        if not self.nonnegative:
            return 0.0
        lower = np.maximum(as_integer_array("lower_counts", lower_counts).reshape(-1), 0)
        if lower.size != self.invariants.n_cells:
            raise ValueError(f"lower_counts has {lower.size} cells but the invariants cover "
                             f"{self.invariants.n_cells}")
        return max(0.0, self.class_lattice().log_normaliser(None) - self.class_lattice().log_normaliser(-lower))

    def log_likelihood_bound_outside(self, release, k, *, support=(-np.inf, np.inf)) -> np.ndarray:
        """Per cell, the base noise's bound: the likelihood's factor for cell i is
        f(s_i - x_i) <= sup_{|e| > k} f(e) outside the window (the constant normaliser is
        accounted for by the convolution bound, see ``dpinfer.inference.planning.cells.TotalsPlan.draw``). With
        ``nonnegative`` the bound is multiplied by P(A e = 0) / P(A e = 0, e >= 0), the
        largest ratio of the x-dependent normaliser between two count vectors
        (:meth:`normaliser_range` over x >= 0)."""
        s = self.check_release(release)
        bound = self.base.log_likelihood_bound_outside(s, k, support=support)
        if self.nonnegative and self._range_from_zero is None:
            self._range_from_zero = self.normaliser_range(np.zeros(s.size, np.int64))
        return bound + (self._range_from_zero if self.nonnegative else 0.0)

    def check_invariants(self, release) -> np.ndarray:
        """The release, after checking that its invariants are a feasible target for
        non-negative counts (else the release cannot come from this mechanism), and with
        ``nonnegative`` that it is non-negative."""
        release = self.check_release(release)
        if self.nonnegative and np.any(release < 0):
            raise ValueError("the release has negative cells; it cannot come from a mechanism "
                             "conditioned on non-negativity (nonnegative=True)")
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
        """Release given symbolic true values: per cell log f(s_i - x_i) - log Z(x)/d, with
        Z(x) = P(A e = 0) (or P(A e = 0, x + e >= 0) with ``nonnegative``, an Op without
        gradient: the counts are discrete); -inf everywhere when A s != A x (or s < 0 with
        ``nonnegative``). Draws are simulation-grade. Only the sum over cells is meaningful
        (the normaliser is spread evenly)."""
        base, matrix = self.base, self.invariants.constraint_matrix
        d = self.invariants.n_cells
        constant = None if self.nonnegative else self._constant() / d
        normaliser = _LogNormaliserOp(self) if self.nonnegative else None

        def logp(value, mu):
            terms = pm.logp(base.dist(mu), value)
            gap = pt.dot(pt.constant(matrix), (value - mu).reshape((-1,)))
            ok = pt.all(pt.eq(gap, 0))
            if normaliser is None:
                return pt.switch(ok, terms - constant, -np.inf)
            ok = ok & pt.all(pt.ge(value, 0))
            return pt.switch(ok, terms - normaliser(mu.reshape((-1,))) / d, -np.inf)

        def random(mu, rng=None, size=None):
            return self.release(np.asarray(mu, dtype=np.int64), rng, grade="simulation")

        return pm.CustomDist.dist(
            true_values, logp=logp, random=random, dtype="int64",
            class_name=f"Conditioned{type(base).__name__}",
        )

    # --- utility -----------------------------------------------------------------------------
    def bias(self, true_values) -> np.ndarray:
        """E(e_i): 0 for equality invariants (e and -e satisfy A e = 0 together); with
        ``nonnegative``, from the exact marginals (totals and group totals; conditioning on
        x + e >= 0 pushes small cells up)."""
        x = as_integer_array("true_values", true_values)
        if not self.nonnegative:
            return np.zeros(x.shape)
        k, marginals = self.noise_marginals(x)
        return (marginals @ np.arange(-k, k + 1).astype(float)).reshape(x.shape)

    def noise_marginals(self, true_values=None) -> tuple[int, np.ndarray]:
        """(K, P) with P[i, k + K] = P(e_i = k | A e = 0) (and x + e >= 0 for ``true_values``
        x with ``nonnegative``) for k in -K..K, exactly by convolution for a total or group
        totals: for a group of n cells, P(e_i = k | S_n = 0) = g_i(k) P(S_{-i} = -k) / P(S_n = 0)
        with g_i the (truncated) cell pmf (inference notes §2)."""
        if self.invariants.group_codes is None:
            raise ValueError(
                "the conditioned noise marginals are computed for one total or group totals only, "
                f"not for {self.invariants.kind!r} invariants"
            )
        lower = None
        if self.nonnegative:
            if true_values is None:
                raise ValueError("true_values is needed: with non-negativity the noise law depends on x")
            lower = -self._check_truth(true_values).reshape(-1)
        k = self.class_lattice().k  # the class lattice's (trimmed) table
        codes = self.invariants.group_codes
        _, marginals = log_convolution_at(self.class_lattice().cell_log_pmfs(lower), codes,
                                          k * np.bincount(codes))
        return k, marginals

    def variance(self, true_values) -> np.ndarray:
        """Var(e_i | A e = 0 [, x + e >= 0]) from :meth:`noise_marginals` (totals and group
        totals)."""
        x = as_integer_array("true_values", true_values)
        k, marginals = self.noise_marginals(x if self.nonnegative else None)
        offsets = np.arange(-k, k + 1).astype(float)
        mean = marginals @ offsets
        return (marginals @ offsets ** 2 - mean ** 2).reshape(x.shape)

    def release_interval(self, true_values, prob: float = 0.9):
        """Per cell [x_i - q_i, x_i + q_i] with q_i the smallest q such that
        P(|e_i| <= q | A e = 0 [, x + e >= 0]) >= prob, from the exact conditioned marginals
        (totals and group totals, to 1e-12; cells in groups of different sizes get different
        q_i)."""
        x = as_integer_array("true_values", true_values)
        prob = check_probability(prob)
        if x.size != self.invariants.n_cells:
            raise ValueError(f"true_values has {x.size} cells but the invariants cover {self.invariants.n_cells}")
        k, marginals = self.noise_marginals(x if self.nonnegative else None)
        # P(|e_i| <= q) for q = 0..K: the centre plus both sides
        central = np.cumsum(marginals[:, k:], axis=1) + np.concatenate(
            [np.zeros((marginals.shape[0], 1)), np.cumsum(marginals[:, k - 1::-1], axis=1)], axis=1)
        q = np.argmax(central >= prob - 1e-12, axis=1).reshape(x.shape)
        return x - q, x + q

    def __repr__(self) -> str:
        extra = ", nonnegative=True" if self.nonnegative else ""
        return f"Conditioned({self.base!r}, {self.invariants!r}{extra})"


# --- seed 000's Theorem 2.1 --------------------------------------------------------------------
@dataclass(frozen=True)
class CongenialAudit:
    """Exact privacy of the non-negativity-conditioned mechanism on a small case."""

    epsilon: float            # the base's epsilon (per unit of ||x - x'||_1 / Delta)
    measured_epsilon: float   # worst log p(s|x)/p(s|x') per unit distance
    gamma: float              # gamma*: worst log(P_x'/P_x) per unit distance, over epsilon
    worst_pair: tuple         # (x, x', s) attaining measured_epsilon

    @property
    def holds(self) -> bool:
        """Theorem 2.1: measured <= (1 + gamma*) epsilon <= 2 epsilon."""
        return self.measured_epsilon <= (1 + self.gamma) * self.epsilon * (1 + 1e-9) + 1e-12 and \
            self.gamma <= 1 + 1e-9


def congenial_privacy_audit(base, invariants: Invariants, *, max_true: int = 4,
                            margin: int = 12) -> CongenialAudit:
    """Seed 000's Theorem 2.1 checked exactly for ``base`` noise conditioned on ``invariants``
    and non-negativity (module docstring): every pair x != x' in {0..max_true}^d with equal
    invariants, every release s in S*(x) with |s_i - x_i| <= ``margin``: the exact loss (with
    both normalisers) divided by ||x - x'||_1 / Delta, and gamma*. For at most 4 cells."""
    d = invariants.n_cells
    if d > 4:
        raise ValueError(f"the audit enumerates all tables: at most 4 cells, got {d}")
    claim = base.privacy
    if claim.delta != 0:
        raise ValueError("Theorem 2.1 needs a pure-DP base (delta = 0)")
    grid = np.indices((max_true + 1,) * d).reshape(d, -1).T
    values = invariants.values(grid)
    mechanism = Conditioned(base, invariants, nonnegative=True)
    log_p = {tuple(x): mechanism.log_normaliser(x) for x in grid}
    box = np.indices((2 * margin + 1,) * d).reshape(d, -1).T - margin
    lattice = box[np.all(invariants.values(box) == 0, axis=1)]
    worst, gamma, pair = 0.0, 0.0, None
    for i, x in enumerate(grid):
        s = x + lattice
        s = s[np.all(s >= 0, axis=1)]
        for x2 in grid[np.all(values == values[i], axis=1)]:
            dist = np.abs(x - x2).sum() / claim.sensitivity
            if dist == 0:
                continue
            norm_gap = log_p[tuple(x2)] - log_p[tuple(x)]
            gamma = max(gamma, norm_gap / (claim.epsilon * dist))
            loss = (base.noise_logpdf(s - x).sum(axis=1) - base.noise_logpdf(s - x2).sum(axis=1)
                    + norm_gap) / dist
            j = int(np.argmax(loss))
            if loss[j] > worst:
                worst, pair = float(loss[j]), (tuple(x), tuple(x2), tuple(s[j]))
    return CongenialAudit(epsilon=claim.epsilon, measured_epsilon=worst, gamma=gamma, worst_pair=pair)


# the normaliser Op runs Python (convolutions over classes) by design; PyTensor's numba backend
# warns once per compile that it falls back to object mode for it
warnings.filterwarnings("ignore", message="Numba will use object mode to run _LogNormaliserOp")


class _LogNormaliserOp(Op):
    """log P(A e = 0, x + e >= 0) of a non-negativity-conditioned mechanism at integer x
    (no gradient: x is a vector of counts). The last value is kept: NUTS evaluates the model
    many times per transition of the parameters with the counts x unchanged."""

    __props__ = ("mechanism",)

    def __init__(self, mechanism: Conditioned):
        self.mechanism = mechanism
        self._last = (None, None)  # (x, value) of the last evaluation

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [pt.dscalar()])

    def perform(self, node, inputs, output_storage):
        x = np.asarray(inputs[0])
        last_x, value = self._last
        if last_x is None or not np.array_equal(last_x, x):
            value = self.mechanism.log_normaliser(x) if np.all(x >= 0) else np.inf
            self._last = (x.copy(), value)
        output_storage[0][0] = np.asarray(value, dtype=np.float64)
