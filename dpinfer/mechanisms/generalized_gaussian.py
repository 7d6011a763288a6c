r"""The generalized Gaussian mechanism on an integer subspace (seed 001, Definition 13).

Release ``s = x + z`` with ``z`` the lattice Gaussian on ``Lambda = {z in Z^d : A z = 0}``:

    q(z) = exp(-||z||_2^2 / (2 sigma^2)) / Z,      Z = sum_{z in Lambda} exp(-||z||_2^2 / (2 sigma^2)).

``exp(-||z||^2 / (2 sigma^2)) = prod_i exp(-z_i^2 / (2 sigma^2))``, so the law is i.i.d. discrete
Gaussian noise conditioned on ``A z = 0`` (reference note 001 §5.4): the same likelihood,
normaliser and samplers as ``Conditioned(DiscreteGaussian(sigma), invariants)``.

Privacy. Seed 001 (Theorem 14) states (epsilon, delta) "integer subspace DP" for
sigma^2 = 2 c_A ln(1/delta) / epsilon^2 with an unspecified constant c_A, so its sigma cannot be
used (reference note 001 §6.2, pitfall 25). Here delta is *computed* for the given sigma and
epsilon, under seed 001's Definition 2: for every pair x, x' with A x = A x' (Delta = x - x' in
Lambda, r = ||Delta||_2) and every event E,

    P(M(x) in E) <= e^{epsilon r} P(M(x') in E) + (e^{epsilon r} - 1) / (e^epsilon - 1) * delta.

The smallest such delta is the supremum over Delta of H(Delta) (e^epsilon - 1) / (e^{epsilon r} - 1)
with the hockey-stick divergence H(Delta) = E[(1 - exp(epsilon r - L))_+], L the privacy loss
(2 <z, Delta> + r^2) / (2 sigma^2), z ~ q. :meth:`GeneralizedGaussian.privacy_delta` evaluates it
exactly on the enumerated lattice (every z with |z_i| <= K, K where the discrete Gaussian's tail
is below 1e-20, whose neglected mass is added to delta), scanning Delta by increasing norm until
(e^epsilon - 1) / (e^{epsilon r} - 1) falls below the best value found (H <= 1). Where the
lattice is too large to enumerate the privacy is reported as unverified.
"""

from __future__ import annotations

import math

import numpy as np

from dpinfer._validation import as_integer_array, check_epsilon, check_positive
from dpinfer.lattice.invariants import Invariants, kernel_points_in_box
from dpinfer.mechanisms.base import Mechanism, PrivacyAudit, PrivacyGuarantee
from dpinfer.mechanisms.conditioned import Conditioned, tabulated_noise
from dpinfer.mechanisms.discrete_gaussian import DiscreteGaussian

MAX_LATTICE_POINTS = 2_000_000


class PrivacyUnverifiedError(RuntimeError):
    """The mechanism's privacy cannot be computed exactly here (and the paper gives no constant)."""


class GeneralizedGaussian(Mechanism):
    """Lattice Gaussian noise of scale ``sigma`` on the kernel lattice of ``invariants``, with
    its (epsilon, delta) computed numerically for the given ``epsilon`` (module docstring).

    Releases (:meth:`release`) are curator-grade: rejection from the exact discrete Gaussian
    sampler (``Conditioned``); ``grade="simulation"`` uses the tabulated exact or MCMC samplers.
    """

    discrete = True
    exact_sampler = True

    def __init__(self, sigma, invariants, *, epsilon):
        self.sigma = check_positive("sigma", sigma)
        if not isinstance(invariants, Invariants):
            raise TypeError(f"invariants must be a dpinfer.Invariants, got {type(invariants).__name__}")
        self._epsilon = check_epsilon(epsilon)
        self.invariants = invariants
        self.law = Conditioned(DiscreteGaussian(self.sigma), invariants)
        self._delta = None

    # --- privacy -------------------------------------------------------------------------
    def privacy_delta(self, epsilon=None) -> float:
        """The smallest delta of seed 001's Definition 2 at ``epsilon`` (default: this
        mechanism's), exactly by enumeration of the lattice; raises
        :class:`PrivacyUnverifiedError` when the lattice is too large."""
        eps = self._epsilon if epsilon is None else check_epsilon(epsilon)
        if epsilon is None and self._delta is not None:
            return self._delta
        z, log_p, tail = self._lattice_law()
        p = np.exp(log_p)
        # candidate Delta: the enumerated lattice points by increasing norm, one of each +- pair
        norms = np.sqrt(np.square(z, dtype=float).sum(axis=1))
        order = np.argsort(norms, kind="stable")
        seen, best = set(), 0.0
        for j in order:
            r = norms[j]
            if r == 0:
                continue
            factor = math.expm1(eps) / math.expm1(eps * r)
            if factor <= best:
                break
            key = tuple(-z[j])
            if key in seen:
                continue
            seen.add(tuple(z[j]))
            loss = (2.0 * (z @ z[j]) + r * r) / (2.0 * self.sigma ** 2)
            h = float(np.sum(p * -np.expm1(np.minimum(eps * r - loss, 0.0))))
            best = max(best, h * factor)
        else:
            raise PrivacyUnverifiedError(
                "the enumerated lattice ran out of candidate differences before the bound closed; "
                "the privacy of this generalized Gaussian is unverified"
            )
        delta = best + tail
        if epsilon is None:
            self._delta = delta
        return delta

    def _lattice_law(self):
        """(z (n, d), log q(z) normalised over them, bound on the neglected tail mass)."""
        k, _ = tabulated_noise(DiscreteGaussian(self.sigma))
        C = np.asarray(self.invariants.kernel_basis())
        d = self.invariants.n_cells
        try:
            w = kernel_points_in_box(C, np.full(d, -k), np.full(d, k), limit=MAX_LATTICE_POINTS,
                                     what="the noise lattice")
        except ValueError as err:
            raise PrivacyUnverifiedError(
                f"privacy of GeneralizedGaussian(sigma={self.sigma:g}) on {self.invariants!r} is "
                f"unverified: {err}. Seed 001 gives no usable constant (its c_A is only O(.)); "
                "use fewer cells or a DoubleGeometric-based mechanism with a proven epsilon"
            ) from None
        z = w @ C.T
        log_w = -np.square(z, dtype=float).sum(axis=1) / (2.0 * self.sigma ** 2)
        log_total = np.logaddexp.reduce(log_w)
        # outside the box some |z_i| > k: mass <= d P(|e| > k) / P(A e = 0) <= d 1e-20 / P(A e = 0)
        offsets = np.arange(-k, k + 1)
        log_p_zero = log_total - d * float(np.logaddexp.reduce(-offsets ** 2 / (2.0 * self.sigma ** 2)))
        tail = min(1.0, d * 1e-20 / math.exp(log_p_zero))
        return z, log_w - log_total, tail

    @property
    def privacy(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            self._epsilon, self.privacy_delta(), 1.0, "equal-invariants", "l2",
            note=(f"seed 001 Definition 2 with delta computed exactly on the lattice for sigma = "
                  f"{self.sigma:g} (Theorem 14's constant is not usable)"),
        )

    def audit(self, max_true: int = 3, margin: int | None = None) -> PrivacyAudit:
        """Independent check on this mechanism's invariants (at most 4 cells) or a total over 3
        cells: every pair x != x' in {0..max_true}^d with equal invariants, the hockey-stick
        sum over releases s = x + z (|z_i| <= margin, default 8 sigma) of
        max(0, p(s|x) - e^{epsilon r} p(s|x')), divided by (e^{epsilon r} - 1)/(e^epsilon - 1)."""
        inv = self.invariants if self.invariants.n_cells <= 4 else Invariants.total(3)
        mech = self if inv is self.invariants else GeneralizedGaussian(self.sigma, inv, epsilon=self._epsilon)
        claim = mech.privacy
        d = inv.n_cells
        margin = int(math.ceil(8 * self.sigma)) if margin is None else int(margin)
        grid = np.indices((max_true + 1,) * d).reshape(d, -1).T
        values = inv.values(grid)
        box = np.indices((2 * margin + 1,) * d).reshape(d, -1).T - margin
        lattice = box[np.all(inv.values(box) == 0, axis=1)]
        log_w = -np.square(lattice, dtype=float).sum(axis=1) / (2 * self.sigma ** 2)
        log_z = np.logaddexp.reduce(log_w)
        worst = 0.0
        for i, x in enumerate(grid):
            s = x + lattice
            p_x = np.exp(log_w - log_z)
            for x2 in grid[np.all(values == values[i], axis=1)]:
                r = float(np.linalg.norm(x - x2))
                if r == 0:
                    continue
                p_x2 = np.exp(-np.square(s - x2, dtype=float).sum(axis=1) / (2 * self.sigma ** 2) - log_z)
                h = float(np.sum(np.maximum(0.0, p_x - math.exp(self._epsilon * r) * p_x2)))
                worst = max(worst, h * math.expm1(self._epsilon) / math.expm1(self._epsilon * r))
        return PrivacyAudit(claim.epsilon, claim.delta, claim.epsilon, worst,
                            f"hockey-stick sums over releases, {inv.kind} invariants over {d} cells")

    # --- release and likelihood: the conditioned discrete Gaussian ------------------------------
    def release(self, true_values, rng, *, grade: str = "curator", max_proposals: float = 1e8):
        return self.law.release(true_values, rng, grade=grade, max_proposals=max_proposals)

    def sample_noise(self, rng, size=None) -> np.ndarray:
        return self.law.sample_noise(rng, size)

    def log_likelihood(self, release, true_values) -> float:
        return self.law.log_likelihood(release, true_values)

    def log_likelihood_bound_outside(self, release, k, *, support=(-np.inf, np.inf)) -> np.ndarray:
        return self.law.log_likelihood_bound_outside(release, k, support=support)

    def dist(self, true_values):
        return self.law.dist(true_values)

    def observe(self, name: str, true_values, observed, *, dims=None, model=None):
        """Registered as ``Conditioned(DiscreteGaussian(sigma), invariants)``, the same law, so
        ``dpinfer.sample`` uses its convolution or fibre samplers."""
        return self.law.observe(name, true_values, observed, dims=dims, model=model)

    def check_release(self, release) -> np.ndarray:
        return self.law.check_release(release)

    # --- utility -----------------------------------------------------------------------------
    def bias(self, true_values) -> np.ndarray:
        """0: q(z) = q(-z) (Theorem 15)."""
        return np.zeros(np.shape(as_integer_array("true_values", true_values)))

    def variance(self, true_values) -> np.ndarray:
        return self.law.variance(true_values)

    def release_interval(self, true_values, prob: float = 0.9):
        return self.law.release_interval(true_values, prob)

    def __repr__(self) -> str:
        return (f"GeneralizedGaussian(sigma={self.sigma:g}, epsilon={self._epsilon:g}, "
                f"{self.invariants!r})")
