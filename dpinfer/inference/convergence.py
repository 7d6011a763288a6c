"""Whether a fit has converged: rank-normalised split R-hat, bulk and tail effective sample
size over every parameter and latent count, in one line at the end of ``dp.sample``.

The diagnostics are those of A. Vehtari, A. Gelman, D. Simpson, B. Carpenter and P.-C.
Bürkner, "Rank-normalization, folding, and localization: an improved R-hat for assessing
convergence of MCMC", Bayesian Analysis 16(2), 2021, computed as ArviZ computes them
(``arviz.rhat``, ``arviz.ess(method="bulk")``; equal to 1e-10 in the tests):

* draws are split in half (4 chains of n/2 from 2 of n), ranked over all chains (ties
  averaged), and the ranks r mapped to z = Phi^-1((r - 3/8) / (S + 1/4)) (Blom), S draws;
* R-hat = max(split R-hat of z, split R-hat of the z of |x - median(x)|), with
  R = sqrt(((n - 1)/n W + B/n) / W), W the mean within-chain variance and B/n the variance of
  the chain means;
* bulk ESS = M n / tau of z, tau = -1 + 2 sum_t rho_t with the autocorrelations rho_t
  combined over chains and truncated by Geyer's initial positive and monotone sequences
  (Stan's estimator), tau >= 1/log10(M n);
* tail ESS = the smaller of the ESS (same estimator, split chains, no ranks) of the indicators
  x <= q_0.05 and x <= q_0.95 (:func:`tail_ess`; ``arviz.ess(method="tail", prob=0.05)``:
  ArviZ 1's own default ``prob`` is its credible-interval mass, not the paper's 5%).

They are written here rather than imported from ArviZ because ``dp.sample`` reports them
after every fit and importing ArviZ's statistics costs about a second, more than a small fit;
and because tables of tens of thousands of counts need them vectorised over the counts.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dpinfer._kernel import kernel

RHAT_MAX = 1.01  # the targets of a converged fit (Vehtari et al. 2021, section 4)
ESS_MIN = 400
# the chance that a converged fit's many latents (counts, records) fail their R-hat bound
LATENT_ALPHA = 0.01
_BATCH = 2048  # quantities per FFT batch (memory: 2 x draws x batch doubles)
_PER_THREAD = 64  # fewer quantities than this a core are judged on one thread


class ConvergenceWarning(UserWarning):
    """A fit whose R-hat or bulk ESS misses the targets: not a result yet."""


def latent_rhat_bound(ess, n_latents: int, split_chains: int) -> np.ndarray:
    """The R-hat a latent of a converged fit stays under, all ``n_latents`` of them together with
    probability about 1 - LATENT_ALPHA (or above): never below RHAT_MAX.

    With m split chains of n draws and an effective size ESS / m per chain, the chain means of a
    quantity's normal scores vary by about 1 / (ESS / m) around the within-chain variance W ~ 1,
    so m (n / tau) Var(means) / W ~ chi2_{m-1} and R-hat^2 = 1 + (F tau - 1) / n with F =
    chi2_{m-1} / (m - 1): R-hat - 1 ~ F m / (2 ESS). Over K latents and the two R-hats (bulk and
    folded, each at its own ESS: :func:`latent_diagnostics`) a Bonferroni quantile q = F^{-1}(1
    - alpha / 2K) gives the bound 1 + q m / (2 ESS), with ESS at least ESS_MIN: a latent whose
    chains disagree has a small ESS too, which must not widen its bound (it fails the ESS target
    anyway). The approximation is conservative: on AR(1) chains (phi 0, 0.5, 0.9; normal and
    Poisson-like counts) with K = 1, 0.08-0.38% of quantities exceed it at alpha = 1%
    (tests/test_convergence.py). The maximum of many R-hats is not judged against 1.01 (Vehtari
    et al. 2021) because at 20,000 latents and 1,000 draws it exceeds 1.01 in a converged fit:
    that target is for the parameters.
    """
    from scipy.special import chdtri

    m = int(split_chains)
    q = chdtri(m - 1, LATENT_ALPHA / (2 * max(int(n_latents), 1))) / (m - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(RHAT_MAX, 1.0 + q * m / (2.0 * np.maximum(np.asarray(ess, float), ESS_MIN)))


@dataclass(frozen=True)
class LatentRhat:
    """The latents' R-hat check (:func:`latent_rhat_bound`): the latent nearest its bound
    (largest (R-hat - 1) / (bound - 1)), its R-hat and bound, over ``quantities`` latents."""

    quantities: int
    rhat: float
    bound: float
    worst: str

    @property
    def ok(self) -> bool:
        return not math.isfinite(self.rhat) or self.rhat <= self.bound

    def text(self) -> str:
        if self.ok:
            return (f"the {self.quantities:,} latents' R-hat within their bound for so many (nearest it: "
                    f"{self.worst} {self.rhat:.3f}, bound {self.bound:.3f})")
        return f"{self.worst}'s R-hat {self.rhat:.3f} over its bound {self.bound:.3f} for {self.quantities:,} latents"


@dataclass(frozen=True)
class Convergence:
    """The worst R-hat and bulk ESS of a fit, with the quantities they belong to."""

    max_rhat: float
    worst_rhat: str
    min_ess: float
    worst_ess: str
    quantities: int
    divergences: int
    min_tail_ess: float = math.inf
    worst_tail_ess: str = ""
    rhat_target: float = RHAT_MAX
    ess_target: float = ESS_MIN
    subject: str = "parameters and counts"
    unsettled: str = ""  # why the parameters' empirical-Bayes estimate the draws are given has not settled
    # the latents' R-hat, judged as a family (max_rhat is then the parameters'); None: all judged alike
    latents: LatentRhat | None = None
    modes: str = ""  # where chains over their R-hat target sit in different modes (separate_modes)

    @property
    def rhat_ok(self) -> bool:
        """R-hat meets its target (the latents: their bound), or cannot be computed (one chain)
        and is not judged."""
        params = not math.isfinite(self.max_rhat) or self.max_rhat <= self.rhat_target
        return params and (self.latents is None or self.latents.ok)

    @property
    def ess_ok(self) -> bool:
        """Bulk and tail ESS both meet the target."""
        return self.min_ess >= self.ess_target and self.min_tail_ess >= self.ess_target

    @property
    def converged(self) -> bool:
        """Every target met (R-hat as :attr:`rhat_ok` judges it), and the estimate the draws are
        given (empirical Bayes) settled."""
        return self.rhat_ok and self.ess_ok and self.divergences == 0 and not self.unsettled

    @property
    def rhat_text(self) -> str:
        """"max R-hat 1.004 (theta)", or that it was not computed (one chain); with latents judged
        as a family, the parameters' and the latents' apart."""
        if self.latents is not None and math.isfinite(self.latents.rhat):
            params = (f"the parameters' max R-hat {self.max_rhat:.3f} ({self.worst_rhat})"
                      if math.isfinite(self.max_rhat) else "no parameters")
            return f"{params}, {self.latents.text()}"
        if math.isfinite(self.max_rhat):
            return f"max R-hat {self.max_rhat:.3f} ({self.worst_rhat})"
        return "R-hat not computed (it needs 2 chains or more)"

    def line(self) -> str:
        """One line: converged or not, the worst R-hat and ESS, and what to do."""
        worst = (f"{self.rhat_text}, min bulk ESS {self.min_ess:.0f} ({self.worst_ess}), min tail ESS "
                 f"{self.min_tail_ess:.0f} ({self.worst_tail_ess}) over {self.quantities} {self.subject}"
                 + (f", {self.divergences} divergent transitions" if self.divergences else ""))
        latents = (f", the latents' R-hat under its bound for {self.latents.quantities:,} at alpha "
                   f"{LATENT_ALPHA:g}" if self.latents is not None else "")
        if self.converged:
            return (f"dpinfer: converged: {worst} (targets R-hat <= {self.rhat_target}{latents}, bulk and tail "
                    f"ESS >= {self.ess_target:.0f})")
        if self.unsettled:
            return (f"dpinfer: NOT CONVERGED: {self.unsettled}; the draws given it: {worst}. Not a result yet: "
                    "give the estimate more time (max_minutes) or iterations (empirical_bayes max_iterations)")
        return (f"dpinfer: NOT CONVERGED: {worst}; the targets are R-hat <= {self.rhat_target}{latents} and "
                f"bulk and tail ESS >= {self.ess_target:.0f}"
                + (" and no divergences" if self.divergences else "")
                + (f". Not a result yet: {self.modes}" if self.modes else
                   ". Not a result yet: sample longer (more draws and tune), or reparameterise "
                   "the model (centred where the data are informative)"))

    def as_dict(self) -> dict:
        return {"converged": self.converged, "max_rhat": self.max_rhat, "worst_rhat": self.worst_rhat,
                "min_ess_bulk": self.min_ess, "worst_ess": self.worst_ess,
                "min_ess_tail": self.min_tail_ess, "worst_ess_tail": self.worst_tail_ess,
                "quantities": self.quantities, "subject": self.subject, "divergences": self.divergences,
                "targets": {"rhat": self.rhat_target, "ess_bulk": self.ess_target, "ess_tail": self.ess_target},
                **({"estimate_not_settled": self.unsettled} if self.unsettled else {}),
                **({"chains_in_different_modes": self.modes} if self.modes else {}),
                **({"latent_rhat": {"quantities": self.latents.quantities, "rhat": self.latents.rhat,
                                    "bound": self.latents.bound, "worst": self.latents.worst,
                                    "ok": self.latents.ok, "alpha": LATENT_ALPHA}} if self.latents else {})}


def check(idata, names: list, *, subject: str = "parameters and counts", latents=()) -> Convergence:
    """The worst R-hat, bulk ESS and tail ESS over the posterior variables ``names`` (every
    element); ``subject`` names them in the line. The R-hat of those in ``latents`` (counts,
    records: many nuisance quantities) is judged against :func:`latent_rhat_bound` instead of
    RHAT_MAX, and ``max_rhat`` is then over the others (the parameters)."""
    worst_rhat, worst_ess, worst_tail = (math.nan, ""), (math.inf, ""), (math.inf, "")
    latents = [n for n in names if n in set(latents)]
    n_latents = sum(int(np.prod(idata.posterior[n].shape[2:])) for n in latents)
    nearest = (-math.inf, math.nan, math.nan, "")  # (excess, R-hat, bound, label) of the latents
    worst_draws = [None, None]  # (label, chains x draws) of the parameter and the latent over target
    count = 0
    for name in names:
        values = np.asarray(idata.posterior[name].values)
        if values.dtype.kind not in "iuf":  # integers stay as they are: batches become floats
            values = values.astype(float)  # one at a time (a state's counts are ~1 GB as floats)
        chains, draws = values.shape[:2]
        flat = values.reshape(chains, draws, -1)
        labels = _labels(name, values.shape[2:])
        tails = tail_ess(flat)
        count += flat.shape[2]
        if name in latents:
            _, esses, excess, rhats, bounds = latent_diagnostics(flat, n_latents)
            if np.any(np.isfinite(excess)):
                i = int(np.nanargmax(excess))
                if excess[i] > nearest[0]:
                    nearest = (float(excess[i]), float(rhats[i]), float(bounds[i]), labels[i])
                    if excess[i] > 1.0:
                        worst_draws[1] = (labels[i], flat[:, :, i].astype(float))
        else:
            rhats, esses = diagnostics(flat)
            if np.any(np.isfinite(rhats)):
                i = int(np.nanargmax(rhats))
                if not rhats[i] <= worst_rhat[0]:  # also when worst_rhat is still NaN
                    worst_rhat = (float(rhats[i]), labels[i])
                    if rhats[i] > RHAT_MAX:
                        worst_draws[0] = (labels[i], flat[:, :, i].astype(float))
        worst_ess = _lower(worst_ess, esses, labels)
        worst_tail = _lower(worst_tail, tails, labels)
    stats = idata.get("sample_stats")
    divergences = (int(np.asarray(stats["diverging"].values).sum())
                   if stats is not None and "diverging" in stats else 0)
    modes = "; ".join(m for m in (separate_modes(*w) for w in worst_draws if w is not None) if m)
    return Convergence(worst_rhat[0], worst_rhat[1], worst_ess[0], worst_ess[1], count, divergences,
                       worst_tail[0], worst_tail[1], subject=subject,
                       latents=LatentRhat(n_latents, nearest[1], nearest[2], nearest[3]) if latents else None,
                       modes=modes)


MODE_GAP = 4.0  # chains this many within-chain sds apart, each stable, sit in different modes


def separate_modes(label: str, draws: np.ndarray) -> str:
    """Whether the chains of one quantity (chains x draws) sit in different modes rather than
    being merely short: each chain stable (its two halves' R-hat at most 1.05: not drifting)
    and two chains' means more than MODE_GAP within-chain sds apart. Then more draws will not
    join them; the text says where each chain is and what helps. "" otherwise."""
    chains, draws_per_chain = draws.shape
    if chains < 2 or draws_per_chain < 8:
        return ""
    half = draws_per_chain // 2
    for chain in draws:  # a drifting chain is short, not in another mode
        if _split_rhat(np.stack([chain[:half], chain[half:2 * half]])[None])[0] > 1.05:
            return ""
    means, sds = draws.mean(axis=1), draws.std(axis=1)
    spread = max(float(np.max(sds)), 1e-12)
    if (means.max() - means.min()) / spread <= MODE_GAP:
        return ""
    where = ", ".join(f"chain {c} at {m:.4g}" for c, m in enumerate(means))
    return (f"the chains sit in different modes of {label} ({where}; each chain stable, "
            f"{(means.max() - means.min()) / spread:.0f} within-chain sds apart): more draws will not "
            "join them; start every chain at one point (initvals=, e.g. the release read as the true "
            "values), run more chains to see how many modes there are, or reparameterise")


def _lower(worst: tuple, values: np.ndarray, labels: list) -> tuple:
    """(value, label) of the smallest finite entry of ``values`` if below ``worst``'s, else ``worst``."""
    if not np.any(np.isfinite(values)):
        return worst
    i = int(np.nanargmin(values))
    return (float(values[i]), labels[i]) if values[i] < worst[0] else worst


@functools.lru_cache(maxsize=1)
def seconds_per_value() -> float:
    """What judging one stored value costs on this machine, now: R-hat, bulk and tail ESS
    (:func:`diagnostics`, :func:`tail_ess`) of 2 chains x 256 draws of 512 whole-number
    AR(1) quantities, timed once per process (after a small warm-up call). A fit with a time
    limit keeps back this much per value it will judge (the engines' ``reserve_per_draw``)."""
    rng = np.random.default_rng(0)
    values = np.zeros((2, 256, 512))
    noise = rng.standard_normal(values.shape)
    for t in range(1, values.shape[1]):
        values[:, t] = 0.5 * values[:, t - 1] + noise[:, t]
    values = np.round(3 * values).astype(np.int32)
    diagnostics(values[:, :8, :4]), tail_ess(values[:, :8, :4])
    start = time.perf_counter()
    diagnostics(values), tail_ess(values)
    return (time.perf_counter() - start) / values.size


def draws_to_add(blocks, draws: int, seconds_per_draw: float, seconds_left: float, *, latents=(),
                 n_latents: int = 0) -> int:
    """How many more draws every chain should make to meet the targets (0: met, or no time):
    ``blocks`` yields (chains, draws, k) arrays of the parameters judged, ``latents`` those of
    the ``n_latents`` latents whose R-hat is judged against :func:`latent_rhat_bound` (in
    pieces, so that a state's counts need not be copied whole). The bulk and tail ESS grow
    about linearly with the draws, so short of ESS_MIN by a factor f the chains add
    (1.25 f - 1) x their draws (at least a doubling when an R-hat misses its target, at most a
    fourfold growth), as many as 0.9 x ``seconds_left`` allows at ``seconds_per_draw``; fewer
    than 5% of the draws (and fewer than 10) are not worth a round."""
    rhat_missed, worst_ess = False, math.inf
    for values, family in itertools.chain(((v, False) for v in blocks), ((v, True) for v in latents)):
        tail = tail_ess(values)
        if family:
            _, bulk, excess, _, _ = latent_diagnostics(values, n_latents)
            rhat_missed |= bool(np.any(excess > 1.0))  # NaN: not a miss
        else:
            rhat, bulk = diagnostics(values)
            rhat_missed |= bool(np.any(rhat > RHAT_MAX))
        for ess in (bulk, tail):
            if np.any(np.isfinite(ess)):
                worst_ess = min(worst_ess, float(np.nanmin(ess)))
    if not rhat_missed and worst_ess >= ESS_MIN:
        return 0
    growth = 1.25 * ESS_MIN / max(worst_ess, 1.0) if worst_ess < ESS_MIN else 1.0
    if rhat_missed:
        growth = max(growth, 2.0)
    extra = math.ceil(draws * (min(growth, 4.0) - 1.0))
    extra = min(extra, int(0.9 * seconds_left / max(seconds_per_draw, 1e-9)))
    return extra if extra >= max(10, 0.05 * draws) else 0


def report(convergence: Convergence, *, show: bool) -> None:
    """Print the line (to stderr, when ``show``) and warn when the fit falls short."""
    if show:
        print(convergence.line(), file=sys.stderr, flush=True)
    if not convergence.converged:
        warnings.warn(convergence.line().removeprefix("dpinfer: "), ConvergenceWarning, stacklevel=4)


def _labels(name: str, shape: tuple) -> list:
    if not shape:
        return [name]
    return [f"{name}[{', '.join(map(str, index))}]" for index in np.ndindex(*shape)]


# --- the diagnostics ---------------------------------------------------------------------------
# Arrays are laid out (quantity, chain, draw) here, so that every quantity's draws are
# contiguous for the ranking and the FFT.
def _split(values: np.ndarray) -> np.ndarray:
    """(chains, draws, k) -> (k, 2 chains, draws // 2): first and last halves of each chain."""
    half = values.shape[1] // 2
    split = np.concatenate([values[:, :half], values[:, values.shape[1] - half:]], axis=0)
    return np.ascontiguousarray(split.transpose(2, 0, 1), dtype=float)


def _doubled_ranks(values: np.ndarray) -> np.ndarray:
    """Twice the 1-based rank of each entry of each row of ``values`` (k, S), ties given their
    average rank (so the result is a whole number): 2 (entries below) + (entries equal) + 1. A
    row of whole or half numbers spanning fewer than 4 S halves (counts, and their distances
    from a median) is ranked by counting them, in O(S); the others by numpy's sort (2-3 times
    numba's on rows of 4,000 draws), their ties then averaged."""
    out = np.empty(values.shape, np.int64)
    rest = np.flatnonzero(~_ranks_by_counting(values, out))
    if rest.size:
        _ranks_from_order(values, np.argsort(values[rest], axis=1), rest, out)
    return out


@kernel(nogil=True)
def _ranks_by_counting(values, out):
    """:func:`_doubled_ranks` of the rows of whole or half numbers spanning fewer than 4 S
    halves, by counting, into ``out``; True for each row so ranked."""
    k, n = values.shape
    done = np.zeros(k, np.bool_)
    for j in range(k):
        row = values[j]
        lo, hi, halves = row[0], row[0], True
        for v in row:
            lo, hi = min(lo, v), max(hi, v)
            halves = halves and 2.0 * v == math.floor(2.0 * v)
        if not (halves and 2.0 * (hi - lo) < 4.0 * n):
            continue
        below = np.zeros(int(2.0 * (hi - lo)) + 2, np.int64)
        for v in row:
            below[int(2.0 * (v - lo)) + 1] += 1
        equal = below[1:].copy()
        for b in range(1, below.size):
            below[b] += below[b - 1]
        for i in range(n):
            b = int(2.0 * (row[i] - lo))
            out[j, i] = 2 * below[b] + equal[b] + 1
        done[j] = True
    return done


@kernel(nogil=True)
def _ranks_from_order(values, order, rows, out):
    """:func:`_doubled_ranks` of rows ``rows`` of ``values`` into ``out``, from ``order``
    (row r's sorting permutation in ``order[r]``): a run of equal values shares its average."""
    n = values.shape[1]
    for r in range(rows.shape[0]):
        j = rows[r]
        row = values[j]
        sort = order[r]
        i = 0
        while i < n:
            e = i
            while e + 1 < n and row[sort[e + 1]] == row[sort[i]]:
                e += 1
            for t in range(i, e + 1):
                out[j, sort[t]] = i + e + 2
            i = e + 1


@functools.lru_cache(maxsize=8)
def _normal_scores(size: int) -> np.ndarray:
    """Phi^-1((r - 3/8) / (size + 1/4)) indexed by the doubled rank 2r (2, 3, ..., 2 size;
    tied values share a half rank). statistics.NormalDist's inv_cdf is Wichura's AS241,
    accurate to ~1e-16 relative, and does not load scipy.special."""
    normal = statistics.NormalDist()
    return np.array([np.nan, np.nan] + [normal.inv_cdf((0.5 * r2 - 0.375) / (size + 0.25))
                                         for r2 in range(2, 2 * size + 1)])


def _z_scale(split: np.ndarray) -> np.ndarray:
    """Rank-normalised values (Blom's offset 3/8) of (k, chains, draws), ranked over chains."""
    k, chains, draws = split.shape
    size = chains * draws
    return _normal_scores(size)[_doubled_ranks(split.reshape(k, size))].reshape(k, chains, draws)


def _split_rhat(z: np.ndarray) -> np.ndarray:
    n = z.shape[2]
    within = np.mean(np.var(z, axis=2, ddof=1), axis=1)
    between = n * np.var(np.mean(z, axis=2), axis=1, ddof=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt((between / within + n - 1) / n)


def diagnostics(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank-normalised split R-hat, bulk ESS) of each quantity of ``values`` (chains,
    draws, k). R-hat is NaN with fewer than 2 chains or for a quantity constant over all
    draws; the ESS of a constant quantity is its number of draws; both are NaN with fewer
    than 4 draws."""
    chains, draws, k = values.shape
    if draws < 4:
        return np.full(k, np.nan), np.full(k, np.nan)
    rhat, ess = np.empty(k), np.empty(k)

    def judge(part):
        split = _split(values[:, :, part])
        z = _z_scale(split)
        flat = split.reshape(split.shape[0], -1)
        constant = np.ptp(flat, axis=1) < np.finfo(float).resolution
        ess[part] = np.where(constant, flat.shape[1], _ess(z))
        if chains < 2:
            rhat[part] = np.nan
            return
        folded = np.abs(split - np.median(flat, axis=1)[:, None, None])
        rhat[part] = np.maximum(_split_rhat(z), _split_rhat(_z_scale(folded)))

    _in_batches(k, judge)
    return rhat, ess


def latent_diagnostics(values: np.ndarray, n_latents: int) -> tuple[np.ndarray, ...]:
    """(R-hat, bulk ESS, excess, R-hat judged, bound) of each latent of ``values`` (chains,
    draws, k), from one ranking of the draws and one of their folds: the first two as
    :func:`diagnostics` gives them; then the bulk and the folded R-hat each against
    :func:`latent_rhat_bound` at its own ESS (the folded quantity |x - median| of a NUTS chain
    often mixes far slower than the bulk, so the bulk ESS would make the folded R-hat's bound too
    tight); excess = the larger (R-hat - 1) / (bound - 1), over 1 a miss, and the R-hat and bound
    it comes from. The last three are NaN with one chain or for a constant quantity."""
    chains, draws, k = values.shape
    out = np.full((5, k), np.nan)
    if draws < 4:
        return tuple(out)

    def judge(part):
        split = _split(values[:, :, part])
        flat = split.reshape(split.shape[0], -1)
        constant = np.ptp(flat, axis=1) < np.finfo(float).resolution
        z = _z_scale(split)
        bulk = _ess(z)
        out[1, part] = np.where(constant, flat.shape[1], bulk)
        if chains < 2:
            return
        folded = _z_scale(np.abs(split - np.median(flat, axis=1)[:, None, None]))
        best = None
        for scores, ess in ((z, bulk), (folded, _ess(folded))):
            rhat = _split_rhat(scores)
            out[0, part] = rhat if best is None else np.maximum(out[0, part], rhat)
            bound = latent_rhat_bound(ess, n_latents, split.shape[1])
            with np.errstate(divide="ignore", invalid="ignore"):
                excess = (rhat - 1.0) / (bound - 1.0)
            if best is None:
                best = [excess, rhat, bound]
            else:
                larger = excess > best[0]
                for j, new in enumerate((excess, rhat, bound)):
                    best[j] = np.where(larger, new, best[j])
        for j in range(3):
            out[2 + j, part] = np.where(constant, np.nan, best[j])

    _in_batches(k, judge)
    return tuple(out)


def tail_ess(values: np.ndarray) -> np.ndarray:
    """Tail ESS of each quantity of ``values`` (chains, draws, k): the smaller of the ESS of the
    indicators x <= q_0.05 and x <= q_0.95, q the quantiles over every draw, each by the bulk
    estimator on split chains without rank normalisation (Vehtari et al. 2021, section 4.3;
    ``arviz.ess(method="tail")``). Where an indicator is constant (a count whose 5% quantile
    is its least value in every draw) its ESS is the number of draws. NaN with fewer than 4
    draws."""
    chains, draws, k = values.shape
    if draws < 4:
        return np.full(k, np.nan)
    out = np.empty(k)

    def judge(part):
        batch = values[:, :, part]
        quantiles = np.quantile(batch.reshape(chains * draws, -1), [0.05, 0.95], axis=0)
        esses = []
        for q in quantiles:
            split = _split((batch <= q).astype(float))
            flat = split.reshape(split.shape[0], -1)
            constant = np.ptp(flat, axis=1) < np.finfo(float).resolution
            esses.append(np.where(constant, flat.shape[1], _ess(split)))
        out[part] = np.minimum(*esses)

    _in_batches(k, judge)
    return out


def _in_batches(k: int, judge) -> None:
    """``judge(part)`` for slices ``part`` of the k quantities, at most _BATCH each, spread over
    the cores this process may use (at least _PER_THREAD quantities a core): numpy's sorts,
    quantiles and FFTs and the kernels below release the GIL. Each call writes its own part."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without sched_getaffinity
        cores = os.cpu_count() or 1
    threads = max(1, min(cores, k // _PER_THREAD))
    size = max(1, min(_BATCH, -(-k // threads)))
    parts = [slice(start, min(k, start + size)) for start in range(0, k, size)]
    if threads == 1:
        for part in parts:
            judge(part)
        return
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(judge, parts))  # raises the first error of any part


def mean_se(values: np.ndarray) -> np.ndarray:
    """Monte Carlo standard error of the mean of each column of one stationary sequence
    ``values`` (n, k): its sd over sqrt(ESS), the ESS by Geyer's initial monotone sequence on
    the values themselves (not rank-normalised: the error of the mean, as ``arviz.mcse``);
    0 for a constant column."""
    x = np.asarray(values, dtype=float)
    sd = x.std(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd > 0.0, sd / np.sqrt(_ess(np.ascontiguousarray(x.T)[:, None, :])), 0.0)


DIRECT_LAGS = 64  # autocovariances summed directly up to this lag, by FFT for quantities that need more


def _ess(z: np.ndarray) -> np.ndarray:
    """ESS of each quantity of z (k, chains, draws) by Geyer's initial monotone sequence. The
    autocovariances are summed lag by lag as Geyer's truncation asks for them, which stops
    within a few lags for a quantity that mixes (O(draws) a lag); a quantity that needs more
    than ``DIRECT_LAGS`` has all of them by FFT (O(draws log draws)). Both give the same sums
    up to rounding."""
    k, chains, n = z.shape
    centred = np.ascontiguousarray(z - z.mean(axis=2, keepdims=True))
    between = np.var(z.mean(axis=2), axis=1, ddof=1) if chains > 1 else np.zeros(k)
    out, done = _geyer(centred, np.empty((0, 0)), between, DIRECT_LAGS)
    rest = np.flatnonzero(~done)
    if rest.size:
        out[rest] = _ess_by_fft(centred[rest], between[rest])
    return out


def _ess_by_fft(centred: np.ndarray, between: np.ndarray) -> np.ndarray:
    """:func:`_ess` of centred chains (k, chains, draws) with every autocovariance by FFT;
    ``between``: the variance of the chains' means (0 with one chain)."""
    n = centred.shape[2]
    size = 1 << int(math.ceil(math.log2(2 * n)))
    spectrum = np.fft.rfft(centred, n=size, axis=2)
    acov = np.fft.irfft(spectrum * np.conjugate(spectrum), n=size, axis=2)[:, :, :n] / n
    mean_acov = np.ascontiguousarray(acov.mean(axis=1))  # (k, n)
    return _geyer(centred, mean_acov, between, n)[0]


@kernel(nogil=True, fastmath={"reassoc"})  # the sum reassociated (vectorised): rounding only
def _mean_autocovariance(centred, j, t):
    """Lag-t autocovariance of quantity j's centred chains, averaged over the chains (the
    FFT's sum_i c_i c_(i+t) / draws)."""
    chains, n = centred.shape[1], centred.shape[2]
    total = 0.0
    for c in range(chains):
        row = centred[j, c]
        for i in range(n - t):
            total += row[i] * row[i + t]
    return total / n / chains


@kernel(nogil=True)
def _acov(centred, mean_acov, j, t):
    """Quantity j's lag-t autocovariance averaged over its chains: from ``mean_acov`` (k,
    draws) when given, else summed from ``centred``."""
    if mean_acov.shape[0] > 0:
        return mean_acov[j, t]
    return _mean_autocovariance(centred, j, t)


@kernel(nogil=True, error_model="numpy")  # 0/0 is NaN (constant quantities)
def _geyer(centred, mean_acov, between, max_lag):
    """Stan's (and ArviZ's) truncated autocorrelation sum per quantity of ``centred`` (k,
    chains, draws): (ESS, done). The autocovariances come from ``mean_acov`` (k, draws) when it
    has rows, else each is summed when the truncation asks for it; ``done`` is False where the
    truncation needed a lag beyond ``max_lag`` (the ESS is then NaN, for the caller to compute
    otherwise). ``between``: the variance of the chains' means."""
    k, chains, n = centred.shape
    out = np.full(k, np.nan)
    done = np.zeros(k, np.bool_)
    size = min(n, max_lag + 3)
    acov = np.zeros(size)
    rho = np.zeros(size)
    for j in range(k):
        acov[0] = _acov(centred, mean_acov, j, 0)
        acov[1] = _acov(centred, mean_acov, j, 1) if n > 1 else 0.0
        mean_var = acov[0] * n / (n - 1.0)
        var_plus = mean_var * (n - 1.0) / n + between[j]
        rho[:] = 0.0
        even = 1.0
        rho[0] = even
        odd = 1.0 - (mean_var - acov[1]) / var_plus
        rho[1] = odd
        t = 1
        too_far = False
        while t < n - 3 and even + odd > 0.0:
            if t + 2 > max_lag:
                too_far = True
                break
            acov[t + 1] = _acov(centred, mean_acov, j, t + 1)
            acov[t + 2] = _acov(centred, mean_acov, j, t + 2)
            even = 1.0 - (mean_var - acov[t + 1]) / var_plus
            odd = 1.0 - (mean_var - acov[t + 2]) / var_plus
            if even + odd >= 0:
                rho[t + 1] = even
                rho[t + 2] = odd
            t += 2
        if too_far:
            continue
        max_t = t - 2
        if even > 0:
            rho[max_t + 1] = even
        t = 1
        while t <= max_t - 2:  # the initial monotone sequence
            if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
                rho[t + 1] = 0.5 * (rho[t - 1] + rho[t])
                rho[t + 2] = rho[t + 1]
            t += 2
        tau = -1.0 + 2.0 * np.sum(rho[:max_t + 1]) + np.sum(rho[max_t + 1:max_t + 2])
        tau = max(tau, 1.0 / math.log10(chains * n))
        out[j] = np.nan if np.isnan(rho).any() else chains * n / tau
        done[j] = True
    return out, done
