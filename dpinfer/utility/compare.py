r"""``dp.compare``: what each mechanism costs the analysis, at three levels, as one tidy table.

Mechanisms (objects, or families calibrated to one :class:`~dpinfer.utility.PrivacyTarget`)
are compared on a workload of true values:

**release** (per true value, then averaged over the workload's cells): bias E[r] - x,
variance, MSE, MAE E|r - x|, the tail probability P(|r - x| > t) for each ``tail`` t and
the width of the interval holding the release with probability ``prob``
(``mechanism.release_interval``). *Exact* where the law allows: every discrete mechanism by
summing its pmf over the releases (the window holding all but 1e-13 of the mass, found from
``release_interval``; the omitted mass is reported), continuous additive noise by adaptive
quadrature of its density. Otherwise (continuous mechanisms with atoms or bounds, and
mechanisms conditioned on invariants, whose releases are joint) bias and variance come from
the mechanism's own closed forms where it has them, and the rest by Monte Carlo over
``replications`` releases, reported with its standard error (column ``se``; 0 when exact).

**consumer** (seed 003): for each :class:`~dpinfer.utility.Consumer` on {0..n}, its minimax
risk from the raw release and after its optimal (randomised) remap, and the risk of the
alpha-DP mechanism tailored to it (pure-DP mechanisms only; for the geometric mechanism the
two agree: Theorem 1). A geometric mechanism's matrix on {0..n} is
:func:`~dpinfer.utility.mechanism_matrix` of it clamped to the range
(:func:`~dpinfer.utility.clamped_to_range`, a sufficient statistic); other discrete additive
noise keeps its releases beyond the range (the remap sees them; the raw release is clipped
into {0..n}); continuous mechanisms get no consumer rows. Given ``priors``, each consumer's
loss is also scored as a Bayesian consumer's (Ghosh, Roughgarden & Sundararajan 2009): Bayes
risk raw, after the deterministic Bayes remap, and under the Bayes-optimal alpha-DP mechanism.

**analysis**: an :class:`Analysis` (a PyMC model for the true counts) is fitted with
``dpinfer.sample`` to ``replications`` simulated releases of each mechanism (one compiled model
per mechanism, the release set with ``pm.set_data``), scoring the central ``prob`` posterior
intervals of the counts and of one parameter: mean width and coverage (with binomial standard
errors). Beside it, the naive analysis: the same model with the counts observed as the release
rounded and clipped to the counts' support (what an analyst without the likelihood does), by
nutpie, compiled once (``with_data`` per replication); its count intervals are the release
itself (width 0). When the workload draws the parameter from its prior at every replication
the exact analysis's coverage is the nominal ``prob`` in expectation (the Bayesian calibration
that :mod:`dpinfer.inference.sbc` tests); the naive one's is not.

The result is a :class:`Comparison`: ``.table`` (pandas, one row per mechanism, level, metric
and setting: columns mechanism, level, metric, setting, value, se, method) and
``.figure()`` (matplotlib, one panel per metric).
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpinfer._validation import as_real_array, check_count, check_probability, check_rng, refuse_bools
from dpinfer.mechanisms import ClampedGeometric, Conditioned, DoubleGeometric, Mechanism
from dpinfer.mechanisms.base import AdditiveMechanism
from dpinfer.utility.consumers import Consumer, bayes_risk, minimax_risk
from dpinfer.utility.derivability import clamped_to_range, mechanism_matrix
from dpinfer.utility.equal_privacy import PrivacyTarget, calibrate, family_spec
from dpinfer.utility.remap import bayes_optimal_mechanism, bayes_remap, optimal_mechanism, optimal_remap

__all__ = ["Analysis", "Comparison", "compare"]

LEVELS = ("release", "consumer", "analysis")
_OMITTED_MASS = 1e-13  # discrete release laws are summed over all but this much mass


@dataclass(frozen=True)
class Analysis:
    """An analyst's model for the true counts, fitted to every simulated release.

    build
        Zero-argument callable returning a fresh ``pm.Model`` with a free integer random
        variable named ``latent`` of the workload's shape (the true counts) and a scalar
        random variable ``parameter``; no release in it (``compare`` adds it).
    generate
        ``generate(rng) -> (true_counts, parameter_value)``: one replication's truth. Draw the
        parameter from its prior for calibrated coverage (module docstring); return a fixed
        value to study a fixed truth, or None where the truth is data without a known
        parameter (then only the parameter's interval width is reported).
    """

    build: Callable
    latent: str
    parameter: str
    generate: Callable
    draws: int = 500
    tune: int = 500


@dataclass
class Comparison:
    """The tidy table of :func:`compare` and a figure of it."""

    table: pd.DataFrame
    mechanisms: dict = field(default_factory=dict)

    def figure(self, metrics: Sequence[str] | None = None):
        """A matplotlib figure: one horizontal bar panel per (level, metric, setting), the
        mechanisms on the vertical axis, error bars of two standard errors where Monte Carlo."""
        import matplotlib.pyplot as plt

        table = self.table
        if metrics is not None:
            table = table[table["metric"].isin(metrics)]
        panels = list(table.groupby(["level", "metric", "setting"], sort=False))
        if not panels:
            raise ValueError("no metrics to plot")
        cols = min(3, len(panels))
        rows = math.ceil(len(panels) / cols)
        label = max(len(name) for name in self.mechanisms)  # room for the longest name
        fig, axes = plt.subplots(rows, cols, figsize=((2.6 + 0.075 * label) * cols,
                                                      0.45 * len(self.mechanisms) * rows + 1.6 * rows),
                                 squeeze=False, layout="constrained")
        for ax, ((level, metric, setting), part) in zip(axes.flat, panels):
            part = part.set_index("mechanism").reindex(list(self.mechanisms)).dropna(subset=["value"])
            ax.barh(part.index, part["value"], xerr=2 * part["se"].fillna(0.0), color="#4C72B0")
            ax.invert_yaxis()
            title = f"{level}: {metric}" + (f" ({setting})" if setting else "")
            ax.set_title(title, fontsize=9)
            ax.tick_params(labelsize=8)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        return fig


DEFAULT_FAMILIES = ("Laplace", "DoubleGeometric", "Gaussian", "DiscreteGaussian")
# the consumer level solves linear programs with (n + 1)^2 variables: n = 1000 is a million
MAX_CONSUMER_RANGE = 1000


def _true_values(true_values) -> np.ndarray:
    """One or more real true values (True is not 1)."""
    refuse_bools("true_values", true_values, "real numbers")
    x = as_real_array("true_values", true_values).reshape(-1)
    if x.size == 0:
        raise ValueError("true_values must hold at least one value")
    return x


def _families(families) -> tuple:
    """None (the default families), one family or a non-empty sequence of them: names of
    :data:`~dpinfer.utility.equal_privacy.FAMILIES` or mechanism classes."""
    if families is None:
        return DEFAULT_FAMILIES
    if isinstance(families, (str, type)):
        families = (families,)
    if not isinstance(families, Sequence) or not families or \
            not all(isinstance(f, (str, type)) for f in families):
        raise TypeError("families must be None, a family's name or a non-empty list of names (e.g. "
                        f"['Laplace', 'DoubleGeometric']), got {families!r}")
    for family in families:  # an unknown name is an error, not a family "left out"
        try:
            family_spec(family)
        except ValueError as err:
            raise ValueError(f"families: {err}") from None
    return tuple(families)


def _mechanisms(mechanisms, target, families, sensitivity, unequal_privacy) -> dict:
    """The mechanisms to compare, at one privacy (module docstring of equal_privacy): calibrated
    from ``families`` to ``target``; or given, and then checked against ``target``, or else
    required to state the same guarantee unless ``unequal_privacy``."""
    if target is not None and not isinstance(target, PrivacyTarget):
        raise TypeError(f"target must be a PrivacyTarget, got {type(target).__name__}")
    if mechanisms is None:
        if target is None:
            raise ValueError("give mechanisms={name: Mechanism} or target=PrivacyTarget(...) with families")
        families = _families(families)
        out = {}
        for family in families:
            try:
                out[family if isinstance(family, str) else family.__name__] = calibrate(
                    family, target, sensitivity).mechanism
            except ValueError as err:
                print(f"dp.compare: {family} left out: {err}", file=sys.stderr)
        if not out:
            raise ValueError(f"no family can meet {target}")
        return out
    if families is not None:
        raise ValueError("families are calibrated to a target; with mechanisms given, leave families out")
    if not isinstance(mechanisms, Mapping) or not mechanisms:
        raise TypeError("mechanisms must be a non-empty dict {name: Mechanism}")
    for name, mech in mechanisms.items():
        if not isinstance(mech, Mechanism):
            raise TypeError(f"mechanisms[{name!r}] must be a dpinfer Mechanism, got {type(mech).__name__}")
    if target is not None:
        failing = {name: str(m.privacy) for name, m in mechanisms.items() if not target.met_by(m)}
        if failing:
            raise ValueError(f"mechanisms do not meet the target {target}: {failing}")
    elif not unequal_privacy:
        stated = {name: (m.privacy.epsilon, m.privacy.delta) for name, m in mechanisms.items()}
        if len(set(stated.values())) > 1:
            raise ValueError(
                "mechanisms state different privacy "
                f"{ {name: f'({e:g}, {d:g})' for name, (e, d) in stated.items()} }: give "
                "target=dp.PrivacyTarget... to check them against one target, or "
                "unequal_privacy=True to compare them anyway (the table's privacy column says so)")
    return dict(mechanisms)


# --- release level -----------------------------------------------------------------------------

def _exact_release_metrics(mech, x: float, tails, prob) -> dict | None:
    """Exact metrics of the release law at one true value, or None where not available."""
    lo, hi = mech.release_interval(np.array([x]), prob=prob)
    width = float(hi[0] - lo[0])
    if mech.discrete:
        a, b = mech.release_interval(np.array([x]), prob=1.0 - _OMITTED_MASS)
        r = np.arange(math.floor(a[0]), math.ceil(b[0]) + 1, dtype=float)
        p = np.exp(mech.log_likelihood(r.astype(np.int64), np.full(r.size, x)))
        e = r - x
        out = {"bias": float(p @ e), "mse": float(p @ e**2), "mae": float(p @ np.abs(e)),
               "omitted_mass": max(0.0, 1.0 - float(p.sum()))}
        for t in tails:
            out[f"P(|r - x| > {t:g})"] = float(p[np.abs(e) > t].sum()) + out["omitted_mass"]
    elif isinstance(mech, AdditiveMechanism):
        from scipy import integrate

        def moment(g):
            f = lambda e: g(e) * math.exp(float(mech.noise_logpdf(np.array([e]))[0]))  # noqa: E731
            left, _ = integrate.quad(f, -np.inf, 0.0, epsabs=0.0, epsrel=1e-11, limit=200)
            right, _ = integrate.quad(f, 0.0, np.inf, epsabs=0.0, epsrel=1e-11, limit=200)
            return left + right

        out = {"bias": 0.0, "mse": moment(lambda e: e * e), "mae": moment(abs), "omitted_mass": 0.0}
        for t in tails:
            out[f"P(|r - x| > {t:g})"] = 1.0 - moment(lambda e, t=t: float(abs(e) <= t))
    else:
        return None
    out["variance"] = out["mse"] - out["bias"] ** 2
    out[f"{prob:g} release interval width"] = width
    if abs(out["bias"]) < 1e-12 * max(1.0, out["mae"]):  # float rounding of an exact 0
        out["bias"] = 0.0
    return out


def _monte_carlo_release_metrics(mech, x: np.ndarray, tails, prob, replications, rng,
                                 closed_forms=True) -> tuple[dict, dict]:
    """(means, standard errors) over ``replications`` releases of the whole workload ``x``,
    per-cell quantities averaged over cells; bias and variance from the mechanism's closed forms
    where it has them (standard error 0) if ``closed_forms``."""
    x_in = x.astype(np.int64) if mech.discrete else x
    if isinstance(mech, AdditiveMechanism):  # iid noise per cell: every replication in one call
        draws = mech.release(np.broadcast_to(x_in, (replications, x.size)), rng).astype(float)
    else:
        draws = np.stack([mech.release(x_in, rng) for _ in range(replications)]).astype(float)
    e = draws - x
    per_rep = {"mse": (e**2).mean(axis=1), "mae": np.abs(e).mean(axis=1), "bias": e.mean(axis=1)}
    for t in tails:
        per_rep[f"P(|r - x| > {t:g})"] = (np.abs(e) > t).mean(axis=1)
    means = {k: float(v.mean()) for k, v in per_rep.items()}
    ses = {k: float(v.std(ddof=1) / math.sqrt(replications)) for k, v in per_rep.items()}
    means["variance"] = float(e.var(axis=0, ddof=1).mean())
    ses["variance"] = float(np.nan)
    if closed_forms and not isinstance(mech, Conditioned):
        means["bias"], ses["bias"] = float(np.mean(mech.bias(x))), 0.0
        means["variance"], ses["variance"] = float(np.mean(mech.variance(x))), 0.0
    lo, hi = np.quantile(draws, [0.5 * (1 - prob), 0.5 * (1 + prob)], axis=0)
    means[f"{prob:g} release interval width"] = float(np.mean(hi - lo))
    ses[f"{prob:g} release interval width"] = float(np.nan)
    return means, ses


def _release_rows(name, mech, x, tails, prob, replications, rng, use_exact=True) -> list[dict]:
    rows = []
    exact = None if isinstance(mech, Conditioned) or not use_exact else [
        _exact_release_metrics(mech, float(v), tails, prob) for v in np.unique(x)]
    if exact is not None and all(e is not None for e in exact):
        lookup = dict(zip(np.unique(x), exact))
        cells = [lookup[v] for v in x]
        for metric in cells[0]:
            if metric == "omitted_mass":
                continue
            rows.append(dict(mechanism=name, level="release", metric=metric, setting="",
                             value=float(np.mean([c[metric] for c in cells])), se=0.0,
                             method=f"exact (omitted mass <= {max(c['omitted_mass'] for c in cells):.1e})"))
        return rows
    means, ses = _monte_carlo_release_metrics(mech, x, tails, prob, replications, rng,
                                              closed_forms=use_exact)
    for metric, value in means.items():
        se = ses[metric]
        method = "closed form" if se == 0.0 else f"Monte Carlo ({replications} releases)"
        rows.append(dict(mechanism=name, level="release", metric=metric, setting="", value=value,
                         se=se, method=method))
    return rows


# --- consumer level ----------------------------------------------------------------------------

def _consumer_matrix(mech, n: int) -> np.ndarray:
    """The mechanism's matrix for true counts 0..n. Geometric mechanisms: clamped to {0..n}
    (sufficient, seed 003 §3.11). Other discrete additive noise: releases -K..n+K with K the
    half-width holding all but 1e-12 of the noise, the tails beyond lumped into the end
    columns (post-processing, so no consumer gains from it)."""
    if isinstance(mech, (DoubleGeometric, ClampedGeometric)):
        return mechanism_matrix(clamped_to_range(mech, n), n)
    k = int(mech.noise_interval(1.0 - 1e-12)[1])
    wide = np.arange(-3 * k - 1, n + 3 * k + 2)
    i = np.arange(n + 1)[:, None]
    p = np.exp(mech.noise_logpdf(wide[None, :] - i))
    keep = (wide >= -k) & (wide <= n + k)
    matrix = p[:, keep]
    matrix[:, 0] += p[:, wide < -k].sum(axis=1)
    matrix[:, -1] += p[:, wide > n + k].sum(axis=1)
    return matrix / matrix.sum(axis=1, keepdims=True)


def _consumer_rows(name, mech, consumers, n, priors) -> list[dict]:
    if not mech.discrete or not isinstance(mech, (AdditiveMechanism, ClampedGeometric)):
        return []
    matrix = _consumer_matrix(mech, n)
    raw = _clip_to_actions(matrix, n)
    alpha = math.exp(-mech.epsilon / mech.privacy.sensitivity) if mech.delta == 0 else None
    rows = []
    for label, consumer in consumers.items():
        values = [("minimax risk, raw release", label, minimax_risk(raw, consumer)),
                  ("minimax risk, optimal remap", label, optimal_remap(matrix, consumer).risk)]
        if alpha is not None:  # the alpha-DP mechanism designed for this consumer (Theorem 1)
            values.append(("minimax risk, tailored mechanism", label,
                           optimal_mechanism(n, alpha, consumer).risk))
        loss = consumer.loss_matrix(n)
        for prior_label, prior in priors.items():  # Bayesian consumers: a prior and the loss
            setting = f"{label}, prior {prior_label}"
            values += [("Bayes risk, raw release", setting, bayes_risk(raw, prior, loss)),
                       ("Bayes risk, Bayes remap", setting, bayes_remap(matrix, prior, loss).risk)]
            if alpha is not None:
                values.append(("Bayes risk, tailored mechanism", setting,
                               bayes_optimal_mechanism(n, alpha, prior, loss).risk))
        for metric, setting, value in values:
            rows.append(dict(mechanism=name, level="consumer", metric=metric, setting=setting,
                             value=float(value), se=0.0, method="exact (LP, HiGHS)"))
    return rows


def _clip_to_actions(matrix: np.ndarray, n: int) -> np.ndarray:
    """The raw release used as the report: outputs outside {0..n} clipped into it."""
    if matrix.shape[1] == n + 1:
        return matrix
    k = (matrix.shape[1] - n - 1) // 2
    out = matrix[:, k:k + n + 1].copy()
    out[:, 0] += matrix[:, :k].sum(axis=1)
    out[:, -1] += matrix[:, k + n + 1:].sum(axis=1)
    return out


# --- analysis level ----------------------------------------------------------------------------

def _interval_scores(samples: np.ndarray, truth, prob) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [0.5 * (1 - prob), 0.5 * (1 + prob)], axis=0)
    truth = np.asarray(truth, dtype=float)
    return float(np.mean(hi - lo)), float(np.mean((lo <= truth) & (truth <= hi)))


def _analysis_rows(name, mech, analysis: Analysis, replications, prob, rng, progress) -> list[dict]:
    import pymc as pm
    import nutpie

    from dpinfer.inference import sample
    from dpinfer.inference.convergence import ConvergenceWarning

    truths = [analysis.generate(rng) for _ in range(replications)]
    releases = [mech.release(np.asarray(c, dtype=np.int64), rng) for c, _ in truths]
    model = analysis.build()
    latent = model[analysis.latent]
    with model:
        data = pm.Data("dpinfer_compare_release", releases[0])
        mech.observe("dpinfer_compare_release_obs", latent, observed=data)
    naive_base = analysis.build()
    naive_latent = naive_base[analysis.latent]
    with naive_base:
        naive_data = pm.Data("dpinfer_compare_naive", np.zeros(np.shape(releases[0]), dtype=np.int64))
    naive_model = pm.observe(naive_base, {naive_latent: naive_data.astype(naive_latent.dtype)})
    compiled_naive = nutpie.compile_pymc_model(naive_model)
    scores = {key: [] for key in ("count width", "count coverage", "parameter width",
                                  "parameter coverage", "naive parameter width",
                                  "naive parameter coverage", "naive count coverage",
                                  "fits converged", "fits' min bulk ESS")}
    start = time.perf_counter()
    for k, ((counts, theta), release) in enumerate(zip(truths, releases)):
        with model:
            pm.set_data({"dpinfer_compare_release": release})
        with warnings.catch_warnings():  # counted below, not one warning per replication
            warnings.simplefilter("ignore", ConvergenceWarning)
            idata = sample(analysis.draws, tune=analysis.tune, chains=1, cores=1, model=model,
                           random_seed=int(rng.integers(2**31)), progressbar=False)
        fit = json.loads(idata.posterior.attrs["dpinfer_convergence"])
        scores["fits converged"].append(float(fit["converged"]))
        scores["fits' min bulk ESS"].append(fit["min_ess_bulk"])
        post = idata.posterior
        w, c = _interval_scores(post[analysis.latent].values.reshape(-1, np.size(counts)), counts, prob)
        scores["count width"].append(w)
        scores["count coverage"].append(c)
        w, c = _interval_scores(post[analysis.parameter].values.reshape(-1),
                                np.nan if theta is None else theta, prob)
        scores["parameter width"].append(w)
        scores["parameter coverage"].append(c)
        naive_values = np.clip(np.rint(np.asarray(release, dtype=float)), 0, None).astype(np.int64)
        naive = nutpie.sample(compiled_naive.with_data(dpinfer_compare_naive=naive_values),
                              draws=analysis.draws, tune=analysis.tune, chains=1, cores=1,
                              seed=int(rng.integers(2**31)), progress_bar=False)
        w, c = _interval_scores(naive.posterior[analysis.parameter].values.reshape(-1),
                                np.nan if theta is None else theta, prob)
        scores["naive parameter width"].append(w)
        scores["naive parameter coverage"].append(c)
        scores["naive count coverage"].append(float(np.mean(naive_values == np.asarray(counts))))
        if progress and (k + 1 == replications or (k + 1) % 20 == 0):
            print(f"dp.compare: {name}: {k + 1}/{replications} replications fitted, "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    rows = []
    labels = {"count width": ("count interval width", "dpinfer"),
              "count coverage": ("count interval coverage", "dpinfer"),
              "parameter width": (f"{analysis.parameter} interval width", "dpinfer"),
              "parameter coverage": (f"{analysis.parameter} interval coverage", "dpinfer"),
              "naive parameter width": (f"{analysis.parameter} interval width", "naive"),
              "naive parameter coverage": (f"{analysis.parameter} interval coverage", "naive"),
              "naive count coverage": ("count interval coverage", "naive"),
              "fits converged": ("share of fits meeting the ESS target and with no divergences",
                                 "dpinfer"),
              "fits' min bulk ESS": ("fits' smallest bulk ESS", "dpinfer")}
    for key, values in scores.items():
        if key.endswith("parameter coverage") and truths[0][1] is None:
            continue  # no known parameter value
        metric, who = labels[key]
        values = np.asarray(values)
        rows.append(dict(mechanism=name, level="analysis", metric=metric, setting=who,
                         value=float(values.mean()),
                         se=float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else np.nan,
                         method=f"{replications} simulated releases, {prob:g} central intervals"))
    rows.append(dict(mechanism=name, level="analysis", metric="count interval width", setting="naive",
                     value=0.0, se=0.0, method="the release taken as the truth"))
    return rows


def compare(mechanisms: Mapping[str, Mechanism] | None = None, true_values=None, *,
            target: PrivacyTarget | None = None, families=None, sensitivity=1,
            levels: Sequence[str] = ("release",), tails: Sequence[float] = (1.0, 5.0),
            prob: float = 0.9, consumers: Mapping[str, Consumer] | None = None,
            consumer_range: int | None = None, priors: Mapping[str, Sequence[float]] | None = None,
            analysis: Analysis | None = None,
            replications: int = 200, rng=None, progress: bool = True,
            release_method: str = "exact", unequal_privacy: bool = False) -> Comparison:
    """Compare mechanisms at the chosen ``levels`` (module docstring) on ``true_values``.

    Mechanisms at one privacy: ``target`` with ``families`` (names of
    :data:`dpinfer.utility.equal_privacy.FAMILIES`, calibrated at ``sensitivity``; families
    that cannot meet the target are left out with a message), or ``mechanisms`` ({name:
    Mechanism}) checked against ``target`` (each must meet it) or, without a target, stating
    the same (epsilon, delta) unless ``unequal_privacy=True``. ``consumers`` ({label:
    Consumer}) and ``consumer_range`` n are needed for the consumer level (with ``priors``,
    {label: prior on 0..n}, each consumer's loss also scored as a Bayesian consumer's), and
    ``analysis`` for the analysis level. ``replications`` releases for Monte Carlo metrics and
    the analysis;
    ``release_method="monte carlo"`` estimates every release metric by simulation (to check
    the exact values); ``rng`` a numpy Generator (required: results are reproducible)."""
    if release_method not in ("exact", "monte carlo"):
        raise ValueError(f"release_method must be 'exact' or 'monte carlo', got {release_method!r}")
    mechs = _mechanisms(mechanisms, target, families, sensitivity, unequal_privacy)
    rng = check_rng(rng)
    prob = check_probability(prob)
    replications = check_count("replications", replications, 2)
    levels = (levels,) if isinstance(levels, str) else levels
    if not isinstance(levels, Sequence) or not levels or any(lv not in LEVELS for lv in levels):
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {levels!r}")
    levels = tuple(levels)
    if "release" in levels and true_values is None:
        raise ValueError("true_values are needed for the release level")
    if "consumer" in levels and (not consumers or consumer_range is None):
        raise ValueError("the consumer level needs consumers={label: Consumer} and consumer_range=n")
    if consumers is not None and (not isinstance(consumers, Mapping) or not all(
            isinstance(c, Consumer) for c in consumers.values())):
        raise TypeError(f"consumers must be a dict {{label: dp.Consumer(...)}}, got {consumers!r}")
    if consumer_range is not None:
        consumer_range = check_count("consumer_range", consumer_range, 1)
        if consumer_range > MAX_CONSUMER_RANGE:
            raise ValueError(f"consumer_range must be 1 .. {MAX_CONSUMER_RANGE} (the consumer level's linear "
                             f"programs have (n + 1)^2 variables), got {consumer_range}")
    if priors is not None and not isinstance(priors, Mapping):
        raise TypeError(f"priors must be a dict {{label: prior probabilities on 0..consumer_range}}, got {priors!r}")
    if "analysis" in levels and not isinstance(analysis, Analysis):
        raise ValueError("the analysis level needs analysis=dp.utility.Analysis(...)")
    refuse_bools("tails", tails, "one or more distances >= 0")
    tails = tuple(as_real_array("tails", tails).reshape(-1).tolist())
    if not tails or any(t < 0 for t in tails):
        raise ValueError(f"tails must be one or more distances >= 0, got {tails}")
    x = _true_values(true_values) if true_values is not None else None
    rows = []
    for name, mech in mechs.items():
        if "release" in levels:
            rows += _release_rows(name, mech, x, tails, prob, replications, rng,
                                  use_exact=release_method == "exact")
        if "consumer" in levels:
            rows += _consumer_rows(name, mech, dict(consumers),
                                   consumer_range, dict(priors or {}))
        if "analysis" in levels:
            rows += _analysis_rows(name, mech, analysis, replications, prob, rng, progress)
    table = pd.DataFrame(rows, columns=["mechanism", "level", "metric", "setting", "value", "se", "method"])
    privacy = {name: f"({m.privacy.epsilon:.6g}, {m.privacy.delta:.3g})-DP" for name, m in mechs.items()}
    table.insert(1, "privacy", table["mechanism"].map(privacy))
    return Comparison(table, mechs)
