r"""Empirical Bayes for models with latent counts: the continuous parameters at the mode of
their marginal posterior, the counts summed out, then the counts' posterior given them.

Why. The compiled engine's full Bayes alternates exact draws of the counts x given the
parameters q with NUTS moves of q given x (data augmentation). Where most of the information
about a parameter is missing (a Census table's concentration of a weakly measured cell, pinned
by the counts far more than by the release), one such cycle moves it by a fraction of its
posterior sd: for a Gaussian target the lag-1 autocorrelation is rho = 1 - s_cond^2 / s_post^2,
s_cond its sd given the counts, s_post its posterior sd (0.14-0.19 ESS per cycle measured on
state-sized NMF tables, ``benchmarks/README.md``). With thousands of areas informing each
hyperparameter, its posterior is narrow and the counts depend little on where in it the
hyperparameter lies: the counts' posterior given q at the mode approximates the full posterior
(Morris 1983; Carlin & Louis 2000, ch. 5). It is an approximation, named as such in the result
(``posterior.attrs["dpinfer_empirical_bayes"]``), and what it costs the intervals is measured
against full Bayes where both run (``validation/``).

The target. q^ = argmax_q log p(q | y), p(q | y) = sum_x p(q, x | y): the mode of the marginal
posterior in the unconstrained space the sampler uses (PyMC's transforms and their Jacobians;
with flat priors, the maximum marginal likelihood). By Fisher's identity its gradient is an
expectation over the counts' posterior given q (Louis 1982):

    d/dq log p(q | y) = E[ g(q, x) | q, y ],   g(q, x) = d/dq log p(q, x, y),

the gradient NUTS uses (the compiled model's ``logp_grad``).

The algorithm: a stochastic-approximation EM-gradient (Lange 1995's EM gradient, one Newton
step on the complete-data log density per E-step; Delyon, Lavielle & Moulines 1999 and Gu &
Kong 1998 for the stochastic approximation with MCMC draws). The iterates (the steps below, the
averages, the stop) are :class:`StochasticApproximation`, fed each iteration's scores by
:func:`estimate` for the compiled engine's chains and by the sharded state scan
(:mod:`dpinfer.io.nmf.state_scan`, the scores reduced over its shards). Each iteration t, every chain

1. draws the counts once given q_t by the engine's exact moves (the E-step; the chains' own
   random streams, their counts carried over from the last iteration, so each is a Markov
   chain whose kernel changes slowly with q);
2. computes g_c = g(q_t, x_c) and, along a Rademacher probe v (entries +-1), the product of the
   complete-data Hessian with v by a difference of gradients, whose v-weighted entries
   d_c = -(g(q_t + h v, x_c) - g_c) v / h estimate the complete-data information's diagonal D
   (exactly when it is diagonal, as for concentrations per level and cell; Hutchinson's
   estimator otherwise, averaged over iterations);

then q_{t+1} = q_t + clip(g / max(D - V, D / 10), +-1), g the chains' mean gradient, D and V
moving averages (window ``WINDOW``) of the d_c and of V = (g_1 - g_2)^2 / 2, an unbiased
estimate of the variance of a chain's gradient at q_t, i.e. of the missing information (Louis:
the observed information is D - V). Dividing by D alone is the EM gradient, whose rate is the
fraction of missing information V / D (as slow as data augmentation); dividing by D - V is
Newton's step on the marginal posterior, rate near 0 where the diagonal approximation holds.
The correction is clipped at 10x the EM step and used once ``WINDOW`` iterations have filled
the averages (one chain: the EM gradient throughout). Steps are clipped to 1 in unconstrained
units (a trust region for the first iterations).

**The score averaged over each cell redrawn alone (Rao-Blackwell).** Where the counts are
nested sums (:mod:`dpinfer.lattice.nested`), each iteration's score g_j of a parameter that
is a function of one cell's counts x_c alone (a concentration of one cell of a Census table,
say) is replaced by its average over ``copies`` independent exact draws of x_c given every
other count x_-c (one upward pass along the cell, ``copies`` downward passes:
:func:`~dpinfer.lattice.nested.kernel.cells_redrawn_alone`): E[g_j | x_-c], an unbiased
estimate of the same E[g_j | q, y] (Fisher's identity) with less variance, the part of its
variance that x_c given x_-c makes shrunk by ``copies``. Which scores qualify is read once, at
the first iteration, by redrawing each cell alone and seeing which scores move. Louis's
missing information V stays that of the scores at the chains' own counts (the observed
information is D - V whatever estimate of the score the steps use); the average serves the
steps, the iterates' average and its Monte Carlo error. Measured on a county of 1,633 blocks
(``benchmarks/README.md``, "The score averaged over each cell redrawn alone"): the scores of
the concentrations with 90% or more of their information missing keep 0.06 of their variance
with 16 copies (0.26 with 4), at about a quarter more time an iteration.

**Parameters drawn, not estimated.** Per-area quantities (a Census table's leaf sizes, one per
block) are not hyperparameters: thousands of them, each informed by its own area's counts, and
estimating them as if they were costs both speed and accuracy (measured at blocks:
``benchmarks/README.md``, "Blocks as leaves"). The steppers' ``moving`` parameters z are then
summed out with the counts: the target is the mode of p(h | y) = sum_x int p(h, z, x | y) dz over
the others h, whose gradient is again an expectation, d/dh log p(h | y) = E[g_h(h, z, x) | h, y]
(Fisher's identity over (z, x)), and each E-step draws (z, x) given h by one Gibbs cycle of the
chain (the counts given (h, z), then a NUTS transition of z given the counts). That transition's
diagonal metric is 1 / D_z, z's complete-data curvature estimated as D above (its own probe,
the same moving average): z's conditional variances given the counts, the metric NUTS wants for
that target, known from the first iteration (the sampler's usual first guess, 1 / |gradient|,
ran 1,023-step trajectories for a county's 1,632 leaf sizes until its first adaptation window
ended); its step size adapts by dual averaging. Every quantity above (g, D, V, the step, the
averages) is then over h alone, with one change to the step: Newton's correction is made for the
information missing with the counts but not for the share C_h missing with z (the information
about h that flows through z, sum_j H_hj^2 / D_zj, a second probe), i.e. the step divides by
max(D - V + min(C_h, V), D / 10). z moves by one NUTS transition an iteration and lags behind
h; the full correction then overshoots: on a county of 1,633 blocks the leaf sizes' scale
oscillated between two values a whole step (the trust region) apart, where this step settled
(95% of the 141 hyperparameters within tolerance after 100 iterations). For a hyperparameter
whose information is all through z (a scale of z) it is the EM gradient, slower, but its
average's Monte Carlo error after burn-in is Newton's (Polyak averaging). The estimate
reports NaN errors and sds for z, and each chain's
z at the end (:attr:`Estimate.points`) and the metric (:attr:`Estimate.inv_mass`) start the
draws given h^.

After a burn-in (at least ``burn_in`` iterations, then until no coordinate drifts: over the
last ``WINDOW`` iterations every coordinate's mean step is within 3 standard errors of 0), the
iterates scatter around q^ and q^ is estimated by their average (Polyak & Juditsky 1992), the
k-th averaged step scaled by the gain min(1, (WINDOW / k)^0.6) (Robbins-Monro; Delyon, Lavielle
& Moulines's SAEM takes decreasing steps after its burn-in too): with a constant gain the
average is the root of the score averaged over the iterates' scatter, not of the score, and
where most of a parameter's information is missing the iterates scatter over more than its
posterior sd (measured on ``test_a_parameter_whose_information_is_mostly_missing...``: -0.3
posterior sd off the exact mode on average over 8 seeds, against -0.06 with the gain). Its
Monte Carlo standard error is the error of the chains' mean score over the averaged
iterations, less the part explained by where each score was evaluated, divided by the
marginal information I (the asymptotic error of a stochastic approximation's average), the
scores' autocorrelation counted by their effective sample size.

The approximate posterior sd is 1 / sqrt(I). I is Louis's D - V (averaged over the averaging
phase) where that is at least D / 10 and clear of V's Monte Carlo error (three of its
standard errors, V sqrt(2 / n)); else, where most of the information is missing, D - V is
mostly noise, and I is read from the iterates as the slope of the mean score on the point
it was evaluated at, E[score | q] ~ -I (q - q^) (a secant over the iterates' own scatter),
bounded to D / 1000 .. D / 10 (at D / 10, the bound that Louis's value was once clipped at, it
put the sd at 0.08 where the exact marginal's is 0.22 in that test; the secant 0.16-0.22 over
8 seeds: a lagging E-step chain biases it towards D, so its error is on the side of a
smaller sd). The averaging stops once every coordinate's standard error is at most
``tolerance`` times its approximate posterior sd (by default a fifth: the plug-in itself
ignores the whole posterior spread, and a fifth of it shifts the normal law the parameters are
drawn from, with ``uncertainty="normal"``, by little), or at ``max_iterations`` (then the
estimate is reported as not settled). Each iteration's score has variance V against the
information D - V, so a parameter whose fraction of missing information is rho = V / D needs
about rho / (1 - rho) / (chains x tolerance^2) iterations: 112 with two chains at rho = 0.9,
1,237 at rho = 0.99. The approximate posterior sds (diagonal) are reported with the estimate.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from dpinfer.inference.convergence import mean_se

WINDOW = 20  # iterations in the moving averages of D and V, and in the drift test
STEP_LIMIT = 1.0  # trust region: the largest step of a coordinate per iteration (unconstrained units)
NEWTON_LIMIT = 10.0  # the missing-information correction is at most this many EM steps
PROBE = 1e-4  # the probe's step h in the Hessian-vector difference
DRIFT_Z = 3.0  # the drift test's threshold, in standard errors
MIN_AVERAGE = 30  # iterations averaged at least
MAX_ITERATIONS = 300  # iterations at most, by default
GAIN_DECAY = 0.6  # after the burn-in the k-th averaged step is scaled by min(1, (WINDOW / k)^GAIN_DECAY)
COPIES = 16  # each iteration's score averaged over this many copies of the counts, each cell redrawn alone


@dataclass
class Estimate:
    """What :func:`estimate` found (module docstring): ``q`` the estimate (unconstrained, in
    the compiled model's order), ``mc_se`` its Monte Carlo standard error, ``posterior_sd``
    the approximate marginal posterior sd (1 / sqrt(I), module docstring), ``conditional_sd``
    the sd given the counts (1 / sqrt(D)), the iterations of burn-in and in all, ``settled``
    whether every coordinate met the tolerance, and each chain's counts at the end (a start of
    the counts' posterior given q). With parameters ``drawn`` (a mask; module docstring) their
    three errors and sds are NaN and their entries of ``q`` the start's; ``points``
    holds each chain's parameters at the end (the estimate, and its own drawn ones) and
    ``inv_mass`` the drawn ones' NUTS metric (1 / D_z), which start the draws given
    the estimate. ``widened``: the counts of nested latents (name -> (leaf, cell) pairs, in
    the order widened) whose boxes the caller widened while the estimate ran, because its count
    draws neared their edges (:class:`~dpinfer.inference.engines.compiled.engine.BoxWatch`).
    ``copies``: the redrawings each score of one nested cell's counts was averaged over (0:
    none), ``rao_blackwellised`` the parameters it served (a mask; module docstring)."""

    q: np.ndarray
    mc_se: np.ndarray
    posterior_sd: np.ndarray
    conditional_sd: np.ndarray
    burn_in: int
    iterations: int
    settled: bool
    tolerance: float
    seconds: float
    draw_seconds: float = math.nan  # an iteration's count draws (the chains in parallel)
    gradient_seconds: float = math.nan  # one evaluation of the log density and its gradient
    counts: list = field(repr=False, default_factory=list)
    drawn: np.ndarray | None = field(repr=False, default=None)  # parameters drawn, not estimated (mask)
    points: list = field(repr=False, default_factory=list)  # each chain's parameters at the end
    inv_mass: np.ndarray | None = field(repr=False, default=None)  # the drawn ones' NUTS metric
    widened: dict = field(repr=False, default_factory=dict)  # counts whose boxes were widened meanwhile
    copies: int = 0  # the Rao-Blackwell average's copies of the counts (0: none)
    rao_blackwellised: np.ndarray | None = field(repr=False, default=None)  # the estimated parameters it served

    def __post_init__(self):
        if self.drawn is None:
            self.drawn = np.zeros(self.q.size, bool)
        if self.rao_blackwellised is None:
            self.rao_blackwellised = np.zeros(self.q.size, bool)
        if not self.points:
            self.points = [self.q] * max(len(self.counts), 1)

    @property
    def estimated(self) -> np.ndarray:
        """The mask of the parameters estimated (the others drawn with the counts)."""
        return ~self.drawn

    @property
    def missing_information(self) -> np.ndarray:
        """Each parameter's fraction of missing information 1 - s_cond^2 / s_post^2: the lag-1
        autocorrelation of one cycle of data augmentation (counts given the parameters, then
        the parameters given the counts) for a Gaussian target (module docstring); NaN for
        those drawn."""
        return 1.0 - (self.conditional_sd / self.posterior_sd) ** 2

    @property
    def worst(self) -> int:
        """The estimated coordinate whose Monte Carlo error is largest against its posterior sd."""
        return int(np.nanargmax(self.mc_se / self.posterior_sd))


def estimate(steppers: list, q0: np.ndarray, *, rng: np.random.Generator, burn_in: int = 30,
             max_iterations: int = MAX_ITERATIONS, tolerance: float = 0.2, copies: int = COPIES, cores: int = 1,
             progress=None, deadline: float | None = None, iterations: int | None = None) -> Estimate:
    """The mode of the parameters' marginal posterior by the algorithm of the module docstring.

    ``steppers``: one :class:`~dpinfer.inference.engines.compiled.chains.Stepper` per chain
    (their states' counts start the E-steps and are left at the last draws); ``q0`` the start
    (unconstrained); ``rng`` draws the probes; ``cores`` runs the chains' draws in parallel
    threads (the kernels release the GIL); ``progress(iteration, phase, estimate, settled
    share)`` is called after every iteration. ``copies``: the Rao-Blackwell average's copies of
    the nested counts (module docstring; 0: every score read at the chain's own counts).
    ``deadline`` (``time.monotonic()`` seconds): the
    iterations stop then, in whatever phase (a time limit is the user's to set: it is kept);
    the estimate is then reported as not settled if the tolerance is not met, with an infinite
    Monte Carlo error if the burn-in had not ended (the last iterate) or fewer than 4 iterations
    were averaged. ``iterations``: exactly that many (a resumed fit repeating an estimate whose
    stop depended on the time)."""
    if iterations is not None:
        max_iterations = iterations
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
        raise ValueError(f"copies must be a whole number >= 0 (0: no Rao-Blackwell average), got {copies!r}")
    start_time = time.perf_counter()
    estimated, drawn = np.flatnonzero(~steppers[0].moving), np.flatnonzero(steppers[0].moving)
    n, chains = estimated.size, len(steppers)
    q = np.array(q0, dtype=float)
    approximation = StochasticApproximation(q[estimated], chains, burn_in=burn_in, max_iterations=max_iterations,
                                            tolerance=tolerance)
    full = np.empty(q.size)
    grads = np.empty((chains, n))
    probed = np.empty((chains, n))
    coupling = None
    if drawn.size:  # the drawn parameters' NUTS metric from their curvature given the counts, from the start
        for s in steppers:
            s.state.q[estimated] = q[estimated]
        curvature, coupling = _set_metric(steppers, [s.state.q.copy() for s in steppers], drawn, estimated, rng,
                                          None, None)
    averaging = None  # the estimated parameters whose score is a function of one nested cell's counts
    pool = ThreadPoolExecutor(max_workers=max(1, min(cores, chains)))
    drawing = evaluating = 0.0
    try:
        for t in range(max_iterations):
            q[estimated] = approximation.q
            began = time.perf_counter()
            points = list(pool.map(lambda s: np.array(s.e_step(q)), steppers))
            if drawn.size:
                curvature, coupling = _set_metric(steppers, points, drawn, estimated, rng, curvature, coupling)
            drawn_at = time.perf_counter()
            draws_took = drawn_at - began
            v = rng.choice(np.array([-1.0, 1.0]), size=n)
            for c, s in enumerate(steppers):
                _finite(s.log_density(points[c], full), "at the current estimate")
                grads[c] = full[estimated]
            if averaging is None and copies and steppers[0].nested is not None:
                averaging = _one_cell_components(steppers[0], points[0], estimated, copies)
            if averaging is not None and averaging.any():  # (timed apart: not the gradient's cost)
                began_average = time.perf_counter()
                scored = np.array(list(pool.map(lambda c: _averaged_score(steppers[c], points[c], estimated, copies),
                                                range(chains))))
                scored[:, ~averaging] = grads[:, ~averaging]
                drawn_at += time.perf_counter() - began_average
            else:
                scored = grads
            for c, s in enumerate(steppers):
                points[c][estimated] += PROBE * v
                _finite(s.log_density(points[c], full), "beside the current estimate")
                probed[c] = full[estimated]
            if t > 0 or max_iterations == 1:  # the first call may compile the kernels: not a measure
                drawing, evaluating = drawing + draws_took, evaluating + time.perf_counter() - drawn_at
            else:  # ... unless it is the only one (a deadline at once): then an upper bound, not 0
                first = (draws_took, time.perf_counter() - drawn_at)
            d = np.mean(-(probed - grads) / PROBE * v, axis=0)
            approximation.update(grads, d, scored=scored, coupling=coupling if drawn.size else None)
            if progress is not None:
                progress(t + 1, approximation.phase, _full(q, estimated, approximation.current), approximation.share)
            if iterations is None and approximation.finished(deadline):
                break
    finally:
        pool.shutdown()
    if t == 0 and max_iterations > 1:
        drawing, evaluating = first
    result = approximation.result()
    q_hat = _full(q, estimated, result["q"])
    nan = np.full(q.size, np.nan)
    return Estimate(q_hat, _full(nan, estimated, result["mc_se"]), _full(nan, estimated, result["posterior_sd"]),
                    _full(nan, estimated, result["conditional_sd"]), result["burn_in"], result["iterations"],
                    result["settled"], tolerance, time.perf_counter() - start_time, drawing / max(t, 1),
                    evaluating / (2 * chains * max(t, 1)), [s.state.counts.copy() for s in steppers],
                    steppers[0].moving.copy(),
                    [_full(s.state.q, estimated, q_hat[estimated]) for s in steppers] if drawn.size else [q_hat],
                    steppers[0].state.inv_mass.copy() if drawn.size else None,
                    copies=copies if averaging is not None and averaging.any() else 0,
                    rao_blackwellised=_full(np.zeros(q.size, bool), estimated,
                                            averaging if averaging is not None else False).astype(bool))


class StochasticApproximation:
    """The iterates of the module docstring's stochastic approximation, fed each iteration's
    scores by whoever draws the E-steps (:func:`estimate` for the compiled engine's chains;
    the sharded state scan, :mod:`dpinfer.io.nmf.state_scan`): the Newton step on the marginal
    posterior with Louis's missing information, the burn-in's drift test, the Polyak average
    with its decreasing gain, its Monte Carlo error and the approximate posterior sds, and the
    stop once every coordinate meets ``tolerance``.

    ``q0``: the estimated parameters' start (unconstrained); ``chains``: the E-step chains (two
    or more for Louis's V; one: the EM gradient throughout)."""

    def __init__(self, q0: np.ndarray, chains: int, *, burn_in: int, max_iterations: int, tolerance: float):
        if not 1 <= burn_in <= max_iterations:
            raise ValueError(f"burn_in must be between 1 and max_iterations ({max_iterations}), got {burn_in!r}")
        if not (0 < tolerance and math.isfinite(tolerance)):
            raise ValueError(f"tolerance must be a finite number > 0, got {tolerance!r}")
        self.q = np.array(q0, dtype=float)
        self.chains, self.burn_in, self.max_iterations, self.tolerance = chains, burn_in, max_iterations, tolerance
        self.t = 0
        self.D = self.V = None
        self.D_sum = self.V_sum = 0.0  # sums of d and of var over the averaged iterations
        self.steps, self.averaged, self.at, self.scores = [], [], [], []
        self.burned = None
        self.mc_se = None
        self.marginal = None
        self.share = 0.0

    def update(self, grads: np.ndarray, d: np.ndarray, *, scored: np.ndarray | None = None,
               coupling: np.ndarray | None = None) -> None:
        """One iteration: ``grads`` (chains, n) each chain's score at its own E-step's draws
        (Louis's V from their spread), ``d`` (n,) the complete-data curvature (the chains'
        mean), ``scored`` the scores the step uses (default ``grads``; a Rao-Blackwell average),
        ``coupling`` (n,) the information flowing through parameters drawn with the counts
        (C_h of the module docstring; None: none drawn)."""
        grads = np.asarray(grads, dtype=float)
        scored = grads if scored is None else np.asarray(scored, dtype=float)
        var = 0.5 * (grads[0] - grads[1]) ** 2 if self.chains > 1 else np.zeros(self.q.size)
        D, V = self.D, self.V
        D = np.maximum(d, 1e-12) if D is None else np.maximum(D + (d - D) / WINDOW, 1e-12)
        V = var if V is None else V + (var - V) / WINDOW
        self.D, self.V = D, V
        missing = V - np.minimum(coupling, V) if coupling is not None else V  # not the drawn parameters' share
        information = np.maximum(D - missing, D / NEWTON_LIMIT) if self.chains > 1 and self.t >= WINDOW else D
        score = scored.mean(axis=0)
        gain = 1.0 if self.burned is None else min(1.0, (WINDOW / (len(self.averaged) + 1)) ** GAIN_DECAY)
        step = np.clip(gain * score / information, -STEP_LIMIT, STEP_LIMIT)
        if self.burned is not None:
            self.at.append(self.q.copy())
            self.scores.append(score)
            self.D_sum, self.V_sum = self.D_sum + d, self.V_sum + var
        self.q = self.q + step
        self.steps.append(step)
        self.t += 1
        if self.burned is None and self.t >= self.burn_in and _settled_drift(self.steps):
            self.burned = self.t
        elif self.burned is not None:
            self.averaged.append(self.q.copy())
        self.marginal = _marginal_information(D, V, self.D_sum, self.V_sum, self.at, self.scores)
        self.mc_se = _root_se(self.at, self.scores, self.marginal) if len(self.averaged) >= MIN_AVERAGE else None
        sd = 1.0 / np.sqrt(self.marginal)
        self.share = float(np.mean(self.mc_se <= self.tolerance * sd)) if self.mc_se is not None else 0.0

    def saved(self) -> dict:
        """Everything the iterates carry from one iteration to the next, as arrays (a
        checkpoint's; :meth:`restored` continues from it exactly)."""
        n = self.q.size

        def rows(values):
            return np.asarray(values, dtype=float).reshape(-1, n)

        missing = np.full(n, np.nan)
        return {"q": self.q, "t": self.t, "burned": -1 if self.burned is None else self.burned,
                "D": missing if self.D is None else self.D, "V": missing if self.V is None else self.V,
                "D_sum": np.broadcast_to(self.D_sum, (n,)), "V_sum": np.broadcast_to(self.V_sum, (n,)),
                "steps": rows(self.steps), "averaged": rows(self.averaged), "at": rows(self.at),
                "scores": rows(self.scores),
                "mc_se": missing if self.mc_se is None else self.mc_se,
                "marginal": missing if self.marginal is None else self.marginal, "share": self.share,
                "settings": np.array([self.chains, self.burn_in, self.max_iterations, self.tolerance])}

    @classmethod
    def restored(cls, saved: dict) -> "StochasticApproximation":
        """The iterates as :meth:`saved` left them."""
        chains, burn_in, max_iterations, tolerance = np.asarray(saved["settings"]).tolist()
        out = cls(saved["q"], int(chains), burn_in=int(burn_in), max_iterations=int(max_iterations),
                  tolerance=float(tolerance))
        out.t, out.share = int(saved["t"]), float(saved["share"])
        out.burned = None if int(saved["burned"]) < 0 else int(saved["burned"])

        def optional(name):
            value = np.array(saved[name], dtype=float)
            return None if np.all(np.isnan(value)) else value

        out.D, out.V, out.mc_se, out.marginal = (optional(k) for k in ("D", "V", "mc_se", "marginal"))
        out.D_sum, out.V_sum = np.array(saved["D_sum"], dtype=float), np.array(saved["V_sum"], dtype=float)
        for name in ("steps", "averaged", "at", "scores"):
            setattr(out, name, [row.copy() for row in np.asarray(saved[name], dtype=float)])
        return out

    @property
    def phase(self) -> str:
        return "burn-in" if self.burned is None else "averaging"

    @property
    def current(self) -> np.ndarray:
        """The estimate so far: the iterates' average once averaging, else the last iterate."""
        return np.mean(self.averaged, axis=0) if self.averaged else self.q

    def finished(self, deadline: float | None = None) -> bool:
        """Every coordinate meets the tolerance, or ``deadline`` (``time.monotonic()``) passed,
        or max_iterations are done."""
        return (self.t >= self.max_iterations or (self.mc_se is not None and self.share == 1.0)
                or (deadline is not None and time.monotonic() >= deadline))

    def result(self) -> dict:
        """The estimate (``q``), its Monte Carlo error, the approximate posterior sd, the sd
        given the counts, the burn-in's and all iterations, whether settled (module docstring;
        an infinite error if the burn-in had not ended or fewer than 4 iterations were averaged)."""
        settled = bool(self.averaged) and len(self.averaged) >= MIN_AVERAGE and self.share == 1.0
        averaged, mc_se = self.averaged, self.mc_se
        if not averaged:  # max_iterations within the burn-in: the last iterate, its error unknown
            averaged, mc_se = [self.q], np.full(self.q.size, np.inf)
        elif mc_se is None:
            mc_se = (_root_se(self.at, self.scores, self.marginal) if len(averaged) >= 4
                     else np.full(self.q.size, np.inf))
        return {"q": np.mean(averaged, axis=0), "mc_se": mc_se, "posterior_sd": 1.0 / np.sqrt(self.marginal),
                "conditional_sd": 1.0 / np.sqrt(self.D), "burn_in": self.burned or self.max_iterations,
                "iterations": self.t, "settled": settled}


def _set_metric(steppers: list, points: list, drawn: np.ndarray, estimated: np.ndarray, rng: np.random.Generator,
                curvature: np.ndarray | None, coupling: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The drawn parameters' NUTS metric and their coupling to the estimated ones (module
    docstring), at each chain's ``points``, the chains averaged, then averaged over iterations
    (window WINDOW, from ``curvature`` and ``coupling``). Two Rademacher probes u, u' over z:

    * D_z = -(g_z(z + h u) - g_z(z)) u / h, z's complete-data curvature (exact where its Hessian
      is diagonal); every chain's inverse mass is set to 1 / D_z, z's conditional variances
      given the counts (bounded as the first metric of
      :mod:`~dpinfer.inference.engines.compiled.chains`);
    * C_h = ((g_h(z + h w) - g_h(z)) / h)^2 with w = u' / sqrt(D_z), whose expectation is
      sum_j H_hj^2 / D_zj: the information about each estimated parameter h that flows through
      z (the Schur complement's reduction of its curvature when z is summed out given the
      counts).

    Returns (D_z, C_h)."""
    grads = [np.empty(points[0].size) for _ in points]
    probed = np.empty(points[0].size)
    d, c = np.zeros(drawn.size), np.zeros(estimated.size)
    u = rng.choice(np.array([-1.0, 1.0]), size=drawn.size)
    for point, s, grad in zip(points, steppers, grads):
        _finite(s.log_density(point, grad), "at the drawn parameters")
        shifted = point.copy()
        shifted[drawn] += PROBE * u
        _finite(s.log_density(shifted, probed), "beside the drawn parameters")
        d += -(probed[drawn] - grad[drawn]) / PROBE * u / len(steppers)
    curvature = d if curvature is None else curvature + (d - curvature) / WINDOW
    curvature = np.maximum(curvature, 1e-12)
    w = rng.choice(np.array([-1.0, 1.0]), size=drawn.size) / np.sqrt(curvature)
    for point, s, grad in zip(points, steppers, grads):  # the gradients at the points: the first probe's
        shifted = point.copy()
        shifted[drawn] += PROBE * w
        _finite(s.log_density(shifted, probed), "beside the drawn parameters")
        c += ((probed[estimated] - grad[estimated]) / PROBE) ** 2 / len(steppers)
    coupling = c if coupling is None else coupling + (c - coupling) / WINDOW
    for s in steppers:
        s.state.inv_mass[drawn] = np.clip(1.0 / curvature, 1e-4, 1e4)
    return curvature, coupling


def _redrawn(stepper, point: np.ndarray, copies: int) -> np.ndarray:
    """``copies`` copies of the chain's counts, each nested cell redrawn alone given the others
    at ``point`` (:meth:`~dpinfer.inference.engines.compiled.chains.Stepper.cells_redrawn_alone`)."""
    copy = np.empty((copies, stepper.state.counts.size), np.int64)
    if not stepper.cells_redrawn_alone(point, copy):
        raise RuntimeError("empirical Bayes: a nested cell's law has no mass at the current estimate")
    return copy


def _one_cell_components(stepper, point: np.ndarray, estimated: np.ndarray, copies: int) -> np.ndarray:
    """Which estimated parameters' scores are functions of one nested cell's counts (and the
    parameters) alone, the Rao-Blackwell average's domain (module docstring): each cell's
    column of each nested block is replaced, alone, by the copy (of ``copies`` redrawn at
    ``point``) that differs from it most, and the gradient read again; a parameter qualifies
    if exactly one of the cells that moved changed its score. (A cell whose copies all equal
    its counts is not tested; a score that depends on it too is then averaged over its
    copies, which is exact in the measure that its column hardly moves given the others.)"""
    counts = stepper.state.counts
    saved = counts.copy()
    copy = _redrawn(stepper, point, copies)
    grad = np.empty(point.size)
    _finite(stepper.log_density(point, grad), "at the current estimate")
    base = grad[estimated].copy()
    moved_by = np.zeros(estimated.size, np.int64)
    for columns in stepper.nested_columns():
        for column in columns:
            change = np.abs(copy[:, column] - saved[column]).sum(axis=1)
            if not change.any():
                continue
            counts[column] = copy[int(np.argmax(change)), column]
            _finite(stepper.log_density(point, grad), "at redrawn counts")
            moved_by += grad[estimated] != base
            counts[:] = saved
    return moved_by == 1


def _averaged_score(stepper, point: np.ndarray, estimated: np.ndarray, copies: int) -> np.ndarray:
    """The estimated parameters' score averaged over ``copies`` copies of the chain's counts,
    each nested cell redrawn alone given the others at ``point`` (module docstring); the
    chain's counts are left as they were."""
    counts = stepper.state.counts
    saved = counts.copy()
    copy = _redrawn(stepper, point, copies)
    grad = np.empty(point.size)
    total = np.zeros(estimated.size)
    try:
        for m in range(copies):
            counts[:] = copy[m]
            _finite(stepper.log_density(point, grad), "at redrawn counts")
            total += grad[estimated]
    finally:
        counts[:] = saved
    return total / copies


def _full(q: np.ndarray, coordinates: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A copy of ``q`` with ``values`` at ``coordinates``."""
    out = np.array(q, dtype=float)
    out[coordinates] = values
    return out


def _finite(lp: float, where: str) -> None:
    if not math.isfinite(lp):
        raise RuntimeError(f"empirical Bayes: the model's log density is not finite {where} (the "
                           "counts drawn and the parameters disagree with the priors' support); check "
                           "the model's priors")


def _settled_drift(steps: list) -> bool:
    """No coordinate drifts: over the last WINDOW steps, |mean| <= DRIFT_Z standard errors."""
    if len(steps) < WINDOW:
        return False
    recent = np.asarray(steps[-WINDOW:])
    se = recent.std(axis=0, ddof=1) / math.sqrt(WINDOW)
    return bool(np.all(np.abs(recent.mean(axis=0)) <= DRIFT_Z * se + 1e-12))


def _marginal_information(D: np.ndarray, V: np.ndarray, D_sum, V_sum, at: list, scores: list) -> np.ndarray:
    """Each estimated parameter's marginal posterior information (the inverse of its
    approximate posterior variance; module docstring): Louis's D - V, D and V averaged over the
    averaged iterations (their sums ``D_sum``, ``V_sum``), where it is at least D / NEWTON_LIMIT
    and three of V's standard errors (V sqrt(2 / n)); where less, D - V is mostly Monte Carlo
    noise, and the information is read from the averaged iterations (``at``, ``scores``)
    instead, as the slope of the chains' mean score on the point it was evaluated at:
    E[score | q] = d/dq log p(q | y) ~ -I (q - q^) (Fisher's identity), so I = -cov(score, q) /
    var(q), the iterates' own spread around q^ its design (a stochastic approximation's
    secant); bounded to D / 1000 .. D / NEWTON_LIMIT (at most 99.9% of the information missing,
    and never more than the clipped Louis value). With fewer than MIN_AVERAGE averaged
    iterations, Louis's value from the moving averages ``D``, ``V``, clipped at D / NEWTON_LIMIT."""
    if len(at) < MIN_AVERAGE:
        return np.maximum(D - V, D / NEWTON_LIMIT)
    D, V = D_sum / len(at), V_sum / len(at)
    louis = D - V
    clipped = D / NEWTON_LIMIT
    precise = louis >= np.maximum(clipped, 3.0 * V * math.sqrt(2.0 / len(at)))  # 3 of V's standard errors
    q, g = np.asarray(at), np.asarray(scores)
    q, g = q - q.mean(axis=0), g - g.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = -np.sum(q * g, axis=0) / np.sum(q * q, axis=0)
    secant = np.clip(np.nan_to_num(slope, nan=np.inf), D / 1000.0, clipped)
    return np.where(precise, louis, secant)


def _root_se(at: list, scores: list, information: np.ndarray) -> np.ndarray:
    """The Monte Carlo standard error of the averaged iterates as an estimate of the root of
    the marginal score: the error of the scores' mean, less their part explained by where they
    were evaluated (residuals e = score + I (q - mean q)), over the information I, the
    asymptotic error of a stochastic approximation's average (Polyak & Juditsky 1992); the
    residuals' autocorrelation (the E-steps' chain) is counted by their effective sample
    size (:func:`~dpinfer.inference.convergence.mean_se`)."""
    q, g = np.asarray(at), np.asarray(scores)
    residual = g + information * (q - q.mean(axis=0))
    return mean_se(residual) / information
