"""Windows of true counts around a release, with a proven bound on the neglected mass.

For one cell with release s, prior p(x | theta) and likelihood p(s | x) (inference notes §1):

    L(theta) = sum_x p(x | theta) p(s | x)
    L_W(theta) <= L(theta) <= L_W(theta) + eta,    eta = sup_{x outside W} p(s | x),

because the prior mass outside the window W is at most 1. With W = {c - k, ..., c + k} and
c = s clipped to the counts' support every supported x outside W has |x - s| > k, so
eta <= sup_{|x - s| > k} p(s | x), which each mechanism bounds
(``Mechanism.log_likelihood_bound_outside``). Summed over cells the relative error of the
windowed likelihood is at most

    sum_i log1p(eta_i / L_{W,i}(theta)),

which :func:`neglected_log_mass` evaluates on every posterior draw.

Mechanisms with additive noise of the form log f(e) = c0 - c1 |e|^p have exact tails: the
compiled engine draws counts exactly beyond their windows (geometric envelopes), so their
window only sets the cost (:func:`tail_half_width`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpinfer.mechanisms.base import AdditiveMechanism

MAX_HALF_WIDTH = 1_000_000

# The window holds all but this share of the noise law's mass beyond its half-width, relative
# to the noise pmf at one standard deviation: a cell's draw leaves the window (one prior
# evaluation off the table) about this often. Draws are exact whatever the window.
TAIL_SHARE = 1e-3


def has_exact_tails(mechanism) -> bool:
    """Additive noise of the form log f(e) = c0 - c1 |e|^p: draws are exact beyond the window.
    ``noise_shape`` is None for additive laws without that form (Logistic, Subbotin r not in
    {1, 2}): their windows are bounded by ``log_likelihood_bound_outside`` instead."""
    return isinstance(mechanism, AdditiveMechanism) and mechanism.noise_shape is not None


def _log_noise_tail(c0: float, c1: float, power: int, k: int) -> float:
    """log sum over integers |e| > k of exp(c0 - c1 |e|^power)."""
    if power == 1:
        return float(np.log(2.0) + c0 - c1 * (k + 1) - np.log(-np.expm1(-c1)))
    # terms fall by more than exp(-60) within n of the first when c1 ((k+1+n)^2 - (k+1)^2) >= 60
    n = int(np.ceil(np.sqrt((k + 1) ** 2 + 60.0 / c1) - (k + 1))) + 2
    e = np.arange(k + 1, k + 1 + n, dtype=float)
    return float(np.log(2.0) + np.logaddexp.reduce(c0 - c1 * e**power))


def tail_half_width(mechanism) -> int:
    """Smallest k with P(|e| > k) <= TAIL_SHARE f(sd) for the mechanism's noise e (the
    integer-lattice sum of its density for continuous noise)."""
    c0, c1, power = mechanism.noise_shape
    sd = float(np.sqrt(mechanism.noise_variance))
    log_target = np.log(TAIL_SHARE) + c0 - c1 * sd**power
    hi = 1
    while _log_noise_tail(c0, c1, power, hi) > log_target:
        hi *= 2
        if hi > MAX_HALF_WIDTH:
            raise ValueError("the mechanism's noise is too wide for windowed count draws")
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _log_noise_tail(c0, c1, power, mid) <= log_target else (mid, hi)
    return hi




@dataclass(frozen=True)
class Window:
    """Cells' windows: counts ``centres[i] - half_width ... centres[i] + half_width``."""

    centres: np.ndarray  # int64, one per cell
    half_width: int
    log_eta: np.ndarray  # log bound on p(s_i | x) for supported x outside the window

    @property
    def offsets(self) -> np.ndarray:
        return np.arange(-self.half_width, self.half_width + 1, dtype=np.int64)

    def grid(self) -> np.ndarray:
        """Candidate counts, shape (2 * half_width + 1, *cells)."""
        return self.centres[None, ...] + self.offsets.reshape((-1,) + (1,) * self.centres.ndim)


def window_centres(release: np.ndarray, support: tuple) -> np.ndarray:
    """c_i = round(s_i) clipped to the counts' support (lower, upper; None where open)."""
    lower, upper = support
    centres = np.rint(np.asarray(release, dtype=float)).astype(np.int64)
    if lower is not None:
        centres = np.maximum(centres, lower)
    if upper is not None:
        centres = np.minimum(centres, upper)
    return centres


def log_eta(mechanism, release: np.ndarray, half_width: int, support=(None, None)) -> np.ndarray:
    """log sup{p(s | x): supported x outside the window}. A continuous release s is
    centred at round(s), so |x - s| > half_width - 1/2 there: bound at half_width - 1."""
    k = half_width if mechanism.discrete else half_width - 1
    lower, upper = support
    limits = (-np.inf if lower is None else lower, np.inf if upper is None else upper)
    bound = mechanism.log_likelihood_bound_outside(release, max(k, 0), support=limits)
    return np.asarray(bound, dtype=float)


def make_window(mechanism, release, support, half_width: int) -> Window:
    release = np.asarray(release)
    return Window(
        centres=window_centres(release, support),
        half_width=int(half_width),
        log_eta=log_eta(mechanism, release, half_width, support),
    )


def log_eta_off_centre(mechanism, release, centres, half_width: int, support=(None, None)) -> np.ndarray:
    """log sup{p(s | x): supported x outside c - k .. c + k}, for a window centred at ``c``,
    not at s (a cell's window set by another release of it). Outside the window
    |x - s| >= k + 1 - |c - s| =: m, so the sup is the mechanism's bound beyond ceil(m) - 1;
    where m <= 0 the window need not exclude s at all and the bound is the likelihood's sup
    over every x: the larger of the bound beyond 0 and the value at x = round(s)."""
    release = np.asarray(release, dtype=float)
    lower, upper = support
    limits = (-np.inf if lower is None else lower, np.inf if upper is None else upper)
    beyond = np.ceil(half_width + 1 - np.abs(np.asarray(centres) - release)).astype(np.int64) - 1
    out = np.empty(release.shape)
    for k in np.unique(beyond):
        at = beyond == k
        bound = mechanism.log_likelihood_bound_outside(release[at], max(int(k), 0), support=limits)
        if k < 0:
            bound = np.maximum(bound, mechanism.log_likelihood(release[at], np.rint(release[at])))
        out[at] = bound
    return out


def smallest_half_width(log_eta_at, *, log_target: float, what: str) -> int:
    """Smallest k with every cell's tail bound ``log_eta_at(k)`` <= log_target (doubling, then
    bisection; eta is non-increasing in k). ``what`` names the likelihood in errors."""

    def ok(k: int) -> bool:
        return bool(np.all(log_eta_at(k) <= log_target))

    hi = 1
    while not ok(hi):
        hi *= 2
        if hi > MAX_HALF_WIDTH:
            if np.any(log_eta_at(hi) >= log_eta_at(hi // 4)):
                raise ValueError(
                    f"{what}'s likelihood does not decay away from the release "
                    "(a TruncatedLaplace is flat for true values beyond its bounds, which are "
                    "clipped before the noise), so no window of counts is exact: give the counts a "
                    "prior bounded by the mechanism's bounds, e.g. pm.Binomial(upper, p)")
            raise ValueError(
                "the mechanism's noise is too wide for exact windowed marginalisation "
                f"(a window of more than {MAX_HALF_WIDTH} counts per cell would be needed)"
            )
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def initial_half_width(mechanism, release, *, log_target: float, support=(None, None)) -> int:
    """Smallest k with every cell's tail bound log eta_i(k) <= log_target
    (:func:`smallest_half_width`)."""
    release = np.asarray(release)
    return smallest_half_width(lambda k: log_eta(mechanism, release, k, support),
                               log_target=log_target, what=type(mechanism).__name__)


def neglected_log_mass(log_eta_cells: np.ndarray, log_lik_window: np.ndarray) -> np.ndarray:
    """sum_i log1p(eta_i / L_{W,i}) for each draw.

    ``log_lik_window`` has shape (..., *cells): the windowed marginal log-likelihood of each
    cell at each posterior draw. Returns shape (...) — the bound on the relative error of the
    windowed likelihood at each draw.
    """
    ratio = np.exp(np.minimum(log_eta_cells - log_lik_window, 700.0))
    cell_axes = tuple(range(log_lik_window.ndim - log_eta_cells.ndim, log_lik_window.ndim))
    return np.sum(np.log1p(ratio), axis=cell_axes)
