r"""The generalized Laplace mechanism on an integer subspace (seed 001, Definition 9).

Release ``s = x + z`` with ``z`` on the kernel lattice ``Lambda = {z in Z^d : A z = 0}`` of the
invariants, so ``A s = A x`` exactly, and

    q(z) = exp(-epsilon ||z||) / Z,     Z = sum_{z in Lambda} exp(-epsilon ||z||)       (Eq. 5)

in the l1 or l2 norm. ``Z`` does not depend on ``x``, so ``p(s | x) = q(s - x)`` on
``{x : A x = A s}`` is an ordinary likelihood of the true counts.

Privacy (Theorem 10, "A-induced integer subspace DP"): for data sets with equal invariants
(``A x = A x'``) and every release, ``log q(s - x) - log q(s - x') <= epsilon ||x - x'||`` in
the same norm (triangle inequality; the normalisers are equal because ``x + Lambda = x' +
Lambda``). This holds for the exact law. A release drawn by MCMC whose law is within ``tau`` of
it in total variation, for every input, is (epsilon, (1 + e^epsilon) tau)-DP instead.

l1 norm: ``exp(-epsilon ||z||_1) = prod_i a^|z_i|`` with ``a = e^-epsilon``, so the law is i.i.d.
double geometric noise conditioned on ``A z = 0`` (reference note 001 §5.4), i.e.
``Conditioned(DoubleGeometric(epsilon), invariants)``: the same likelihood and, wherever the
class lattice can be enumerated (totals, group totals, small tables), the exact normaliser and
exact joint draws (noise tabulated to a tail of 1e-20 per cell).
Otherwise releases are drawn by MCMC from z = 0 (a data-free start): by default exact Gibbs
sweeps along the invariants' Markov moves (:mod:`dpinfer.lattice.noise_gibbs`; l1 lines sampled in
closed form), or seed 001's random-walk Metropolis (Algorithm 1, :mod:`dpinfer.lattice.random_walk`,
``chain="walk"``). Either chain's convergence is estimated by L-lag coupling, and
:meth:`GeneralizedLaplace.certify` turns the estimate into the release's (epsilon, delta).
l2 norm: not a product. Its likelihood
exp(-epsilon ||s - x||_2) / Z is used up to the constant Z (a sum over the lattice with no
closed form; it depends on neither x nor the model's parameters): ``dpinfer.sample`` updates
the counts on the fibre with exact line conditionals of the full l2 factor
(:class:`dpinfer.lattice.fibre_gibbs.NormFactor`).
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from scipy.special import gammaincinv

from dpinfer._validation import as_integer_array, check_epsilon, check_rng
from dpinfer.lattice.coupling import MeetingTimes
from dpinfer.lattice.invariants import Invariants
from dpinfer.lattice.noise_gibbs import NoiseGibbs
from dpinfer.lattice.random_walk import LatticeWalk
from dpinfer.lattice.targets import laplace_log_target
from dpinfer.mechanisms.base import Mechanism, PrivacyAudit, PrivacyGuarantee
from dpinfer.mechanisms.conditioned import Conditioned
from dpinfer.mechanisms.geometric import DoubleGeometric

NORMS = ("l1", "l2")
CHAINS = ("gibbs", "walk")
DEFAULT_LAG = {"gibbs": 10, "walk": 1000}  # sweeps, steps
# seed 001's proposal parameters on the 4 x 4 table (reference note 001 §9.2)
DEFAULT_PROPOSAL_A = {"l1": math.exp(-1.0), "l2": math.exp(-2.0)}


class GeneralizedLaplace(Mechanism):
    """Generalized Laplace noise on the integer kernel lattice of ``invariants``.

    Parameters
    ----------
    epsilon
        Privacy loss per unit of ``||x - x'||`` between data sets with equal invariants.
    invariants
        :class:`~dpinfer.lattice.invariants.Invariants` of the released cells (flattened in C order).
    norm
        ``"l1"`` or ``"l2"``: the norm of the target and of the privacy guarantee.
    iterations
        Sweeps (``chain="gibbs"``) or steps (``"walk"``) of the chain per release, for the
        releases drawn by MCMC (l2, or l1 whose class lattice is too large to enumerate). Set it with
        :meth:`certify` (which also states the release's delta) or from :meth:`coupling`.
    proposal_a
        ``chain="walk"``: parameter ``a`` of the double geometric proposal per lattice
        coordinate (default ``e^-1`` for l1 and ``e^-2`` for l2, seed 001's values on the 4 x 4
        table).
    chain
        ``"gibbs"`` (default): exact Gibbs sweeps along the invariants' Markov moves
        (:mod:`dpinfer.lattice.noise_gibbs`); ``"walk"``: seed 001's Algorithm 1.
    """

    discrete = True
    exact_sampler = False  # l1 group draws: noise tabulated to 1e-20; otherwise MCMC
    keeps_invariants = True

    def __init__(self, epsilon, invariants, norm: str = "l1", *, iterations: int | None = None,
                 proposal_a: float | None = None, chain: str = "gibbs"):
        self._epsilon = check_epsilon(epsilon)
        if not isinstance(invariants, Invariants):
            raise TypeError(f"invariants must be a dpinfer.Invariants, got {type(invariants).__name__}")
        if not isinstance(norm, str) or norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        if iterations is not None and (isinstance(iterations, bool) or int(iterations) != iterations
                                       or iterations < 1):
            raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
        if not isinstance(chain, str) or chain not in CHAINS:
            raise ValueError(f"chain must be one of {CHAINS}, got {chain!r}")
        a = DEFAULT_PROPOSAL_A[norm] if proposal_a is None else float(proposal_a)
        if not 0.0 < a < 1.0:
            raise ValueError(f"proposal_a must lie in (0, 1), got {proposal_a!r}")
        self.invariants = invariants
        self.norm = norm
        self.iterations = None if iterations is None else int(iterations)
        self.proposal_a = a
        self.chain = chain
        self.certified_tv: float | None = None  # set by certify(), with its coupling result
        self.coupling_result: MeetingTimes | None = None
        self.certified_level: float | None = None
        self._log_target = laplace_log_target(self._epsilon, norm)
        self._product = Conditioned(DoubleGeometric(self._epsilon), invariants) if norm == "l1" else None
        self._walk = None
        self._gibbs = None

    # --- privacy -------------------------------------------------------------------------
    @property
    def privacy(self) -> PrivacyGuarantee:
        """(epsilon, 0) for the exact law (Theorem 10). Releases drawn by MCMC: (epsilon,
        (1 + e^epsilon) tau) once :meth:`certify` has set tau; until then the note says that
        the releases carry no certificate."""
        note = (f"integer subspace DP (seed 001, Theorem 10): loss <= epsilon ||x - x'||_{self.norm[1]} "
                "between data sets with equal invariants")
        delta = 0.0
        if self.sampler != "exact":
            if self.certified_tv is None:
                note += ("; this holds for the exact law, and releases are drawn by MCMC with no TV "
                         "certificate: call certify(tv) to obtain (epsilon, (1 + e^epsilon) tv)")
            else:
                delta = self.mcmc_delta(self.certified_tv)
                unit = "Gibbs sweeps" if self.chain == "gibbs" else "random-walk steps"
                note += (f"; releases by {self.iterations} {unit} from a data-free start, within TV "
                         f"{self.certified_tv:.3g} of the exact law for every input (upper "
                         f"{self.certified_level:.0%} confidence limit of an L-lag coupling estimate "
                         f"from {self.coupling_result.tau.size} runs)")
        return PrivacyGuarantee(self._epsilon, delta, 1.0, "equal-invariants", self.norm, note=note)

    def mcmc_delta(self, tv: float) -> float:
        """delta = (1 + e^epsilon) tv of a release drawn within total variation ``tv`` of the
        exact law for every input (the chain targets the noise alone from a data-free start,
        so its law does not depend on the data)."""
        if not 0.0 <= tv <= 1.0:
            raise ValueError(f"tv must lie in [0, 1], got {tv!r}")
        return (1.0 + math.exp(self._epsilon)) * tv

    def audit(self, max_true: int = 3, margin: int = 8) -> PrivacyAudit:
        """Exact check of Theorem 10 by enumeration, on this mechanism's invariants when they
        have at most 4 cells, else on a total over 3 cells: every pair x != x' in
        {0..max_true}^d with equal invariants and every release s = x + z, z on the lattice with
        |z_i| <= margin; the measured epsilon is the largest log q(s - x) - log q(s - x')
        divided by ||x - x'|| (the normaliser cancels)."""
        inv = self.invariants if self.invariants.n_cells <= 4 else Invariants.total(3)
        d = inv.n_cells
        grid = np.stack(np.meshgrid(*[np.arange(max_true + 1)] * d, indexing="ij"), -1).reshape(-1, d)
        values = inv.values(grid)
        box = np.stack(np.meshgrid(*[np.arange(-margin, margin + 1)] * d, indexing="ij"), -1).reshape(-1, d)
        lattice = box[np.all(inv.values(box) == 0, axis=-1)]
        order = 1 if self.norm == "l1" else 2
        worst = 0.0
        for i, x in enumerate(grid):
            for x2 in grid[np.all(values == values[i], axis=-1)]:
                dist = float(np.linalg.norm(x - x2, ord=order))
                if dist == 0:
                    continue
                s = x + lattice
                ratio = self._log_target(s - x) - self._log_target(s - x2)
                worst = max(worst, float(np.max(ratio)) / dist)
        return PrivacyAudit(self._epsilon, 0.0, worst, 0.0,
                            f"enumeration of {self.norm} losses on {inv.kind} invariants over {d} cells")

    # --- release ---------------------------------------------------------------------------
    @property
    def sampler(self) -> str:
        """``"exact"`` for l1 where the invariants' class lattice can be enumerated (totals,
        group totals, small tables: joint draws by convolution, :mod:`dpinfer.lattice.class_convolution`),
        else the chain: ``"gibbs"`` or ``"walk"``."""
        if self._product is not None and self._product.normaliser_is_exact():
            return "exact"
        return self.chain

    @property
    def gibbs(self) -> NoiseGibbs:
        """Exact Gibbs sweeps along the invariants' Markov moves for this target."""
        if self._gibbs is None:
            self._gibbs = NoiseGibbs(self.invariants.markov_basis(), self._log_target)
        return self._gibbs

    @property
    def walk(self) -> LatticeWalk:
        """Seed 001's Algorithm 1 for this target on the invariants' kernel basis."""
        if self._walk is None:
            self._walk = LatticeWalk(np.asarray(self.invariants.kernel_basis()), self._log_target,
                                     self.proposal_a)
        return self._walk

    def sample_noise(self, rng, size: int | None = None) -> np.ndarray:
        """Noise vectors on the lattice: exact draws where :attr:`sampler` is "exact", else the
        states of independent chains after :attr:`iterations` sweeps or steps from a data-free
        start (z = 0 for Gibbs, pi_0 for Algorithm 1)."""
        rng = check_rng(rng)
        n = 1 if size is None else int(size)
        if self.sampler == "exact":
            z = self._product.sample_noise(rng, size=n)
        else:
            if self.iterations is None:
                raise ValueError(
                    "releases of this mechanism are drawn by MCMC: set iterations=... or call "
                    "certify(tv) (which chooses it by L-lag coupling)"
                )
            chain = self.gibbs if self.chain == "gibbs" else self.walk
            z, _ = chain.run(n, self.iterations, rng)
        return z[0] if size is None else z

    def release(self, true_values, rng: np.random.Generator) -> np.ndarray:
        x = as_integer_array("true_values", true_values)
        if x.size != self.invariants.n_cells:
            raise ValueError(f"true_values has {x.size} cells but the invariants cover {self.invariants.n_cells}")
        return x + self.sample_noise(rng).reshape(x.shape)

    def coupling(self, n_runs: int = 300, lag: int | None = None, *, rng=None,
                 max_iterations: int = 10**6, progress=None) -> MeetingTimes:
        """Meeting times of ``n_runs`` L-lag coupled pairs of this mechanism's chain (Gibbs:
        common random numbers, :mod:`dpinfer.lattice.noise_gibbs`; walk: seed 001's Algorithms 2-3);
        their ``tv_upper_bound(l)`` bounds the TV distance after l sweeps or steps. ``lag``
        defaults to 10 sweeps or 1000 steps."""
        lag = DEFAULT_LAG[self.chain] if lag is None else lag
        if self.chain == "gibbs":
            return self.gibbs.meeting_times(lag, n_runs, check_rng(rng), max_sweeps=max_iterations)
        return self.walk.meeting_times(lag, n_runs, check_rng(rng), max_iterations=max_iterations,
                                       progress=progress)

    def certify(self, tv: float = 0.01, *, n_runs: int = 300, lag: int | None = None, rng=None,
                level: float = 0.95, max_iterations: int = 10**6) -> "GeneralizedLaplace":
        """A copy of this mechanism whose MCMC releases come with a TV certificate: the
        iterations are the smallest l at which the ``level`` upper confidence limit of the
        coupling bound (:meth:`coupling`) is <= ``tv``, and :attr:`privacy` then reports
        (epsilon, (1 + e^epsilon) tv). The chain starts from a data-free state and targets the
        noise alone, so the bound holds for every input. It is an estimate from ``n_runs``
        coupled runs (at least 299 for a 95% limit of 0.01), not a proof. Mechanisms with an
        exact sampler are returned unchanged."""
        if self.sampler == "exact":
            return self
        if not 0.0 < tv < 1.0:
            raise ValueError(f"tv must lie in (0, 1), got {tv!r}")
        times = self.coupling(n_runs, lag, rng=rng, max_iterations=max_iterations)
        iterations = times.iterations_for(tv, level=level)
        out = GeneralizedLaplace(self._epsilon, self.invariants, self.norm, iterations=iterations,
                                 proposal_a=self.proposal_a, chain=self.chain)
        out.certified_tv, out.certified_level, out.coupling_result = float(tv), float(level), times
        return out

    # --- likelihood --------------------------------------------------------------------------
    def log_likelihood(self, release, true_values) -> float:
        """log q(s - x) if A s = A x, else -inf. l1: with the exact normaliser where the class
        lattice can be enumerated (``Conditioned``); l2: -epsilon ||s - x||_2, i.e. up to the
        constant -log Z, which depends on neither x nor the model's parameters."""
        if self._product is not None:
            return self._product.log_likelihood(release, true_values)
        s = self.check_release(release).reshape(-1)
        x = as_integer_array("true_values", true_values).reshape(-1)
        if x.size != s.size or s.size != self.invariants.n_cells:
            raise ValueError(f"release and true_values must both have {self.invariants.n_cells} cells")
        if np.any(self.invariants.values(s) != self.invariants.values(x)):
            return -np.inf
        return float(self._log_target(s - x))

    def as_conditioned(self) -> Conditioned:
        """l1: the same law as ``Conditioned(DoubleGeometric(epsilon), invariants)`` (its
        normaliser, marginals and exact draws)."""
        return self._l1_only("the product form")

    def _l1_only(self, what: str) -> Conditioned:
        if self._product is None:
            raise NotImplementedError(
                f"{what} is available for the l1 norm (a product law conditioned on the invariants); "
                "the l2 target is not separable across cells"
            )
        return self._product

    def dist(self, true_values):
        """Release given symbolic true values. l1: the PyMC distribution of
        ``Conditioned(DoubleGeometric(epsilon), invariants)``. l2: log-density
        -epsilon ||s - x||_2 spread evenly over the cells (only the sum is meaningful; the
        constant -log Z is omitted), -inf where A s != A x; draws by the chain (needs
        ``iterations``)."""
        if self._product is not None:
            return self._product.dist(true_values)
        matrix, d, eps = self.invariants.constraint_matrix, self.invariants.n_cells, self._epsilon

        def logp(value, mu):
            diff = (value - mu).reshape((-1,))
            ok = pt.all(pt.eq(pt.dot(pt.constant(matrix), diff), 0))
            term = -eps * pt.sqrt(pt.sum(diff ** 2)) / d
            return pt.switch(ok, pt.zeros_like(value, dtype="float64") + term, -np.inf)

        def random(mu, rng=None, size=None):
            return self.release(np.asarray(mu, dtype=np.int64), rng)

        return pm.CustomDist.dist(true_values, logp=logp, random=random, dtype="int64",
                                  class_name="GeneralizedLaplaceL2")

    def observe(self, name: str, true_values, observed, *, dims=None, model=None):
        """l1: registered as ``Conditioned(DoubleGeometric(epsilon), invariants)`` (the same law),
        so ``dpinfer.sample`` uses its convolution or fibre samplers. l2: registered as this
        mechanism; ``dpinfer.sample`` moves the counts on the fibre A x = A s with exact line
        conditionals of exp(-epsilon ||s - x||_2)."""
        if self._product is not None:
            return self._product.observe(name, true_values, observed, dims=dims, model=model)
        s = self.check_release(observed.get_value() if hasattr(observed, "get_value") else observed)
        if s.size != self.invariants.n_cells or not self.invariants.is_feasible(
                self.invariants.values(s.reshape(-1))):
            raise ValueError(
                f"observed must have {self.invariants.n_cells} cells whose invariant values admit "
                "non-negative integer counts; it cannot be a release of this mechanism"
            )
        return super().observe(name, true_values, observed, dims=dims, model=model)

    def log_likelihood_bound_outside(self, release, k, *, support=(-np.inf, np.inf)) -> np.ndarray:
        """l1: the conditioned double geometric's bound. l2: -epsilon (floor(k) + 1) per cell,
        a bound on the factor exp(-epsilon ||s - x||_2) (normaliser omitted, as in
        :meth:`log_likelihood`) when |x_i - s_i| > k, since ||s - x||_2 >= |s_i - x_i|."""
        if self._product is not None:
            return self._product.log_likelihood_bound_outside(release, k, support=support)
        s = self.check_release(release)
        return np.full(s.shape, -self._epsilon * (np.floor(k) + 1.0))

    def typical_noise_norm(self, prob: float = 1 - 1e-6) -> float:
        """An approximate ``prob`` quantile of the noise norm ||z|| (l1 or l2): the norm of
        exp(-epsilon ||z||) on a k-dimensional space is Gamma(k, epsilon) in the continuous
        limit, k the lattice's dimension. Used to size windows, which are then checked
        exactly."""
        k = self.invariants.n_cells - self.invariants.rank
        return float(gammaincinv(max(k, 1), prob)) / self._epsilon  # Gamma(k, 1) quantile

    # --- utility -----------------------------------------------------------------------------
    def bias(self, true_values) -> np.ndarray:
        """0: q(z) = q(-z) on the lattice (Theorem 12)."""
        return np.zeros(np.shape(as_integer_array("true_values", true_values)))

    def variance(self, true_values) -> np.ndarray:
        """l1 with totals or group totals: exact, by convolution."""
        return self._l1_only("the exact variance").variance(true_values)

    def release_interval(self, true_values, prob: float = 0.9):
        """l1 with totals or group totals: exact per-cell intervals, by convolution."""
        return self._l1_only("the exact release interval").release_interval(true_values, prob)

    def __repr__(self) -> str:
        return f"GeneralizedLaplace(epsilon={self._epsilon:g}, norm={self.norm!r}, {self.invariants!r})"
