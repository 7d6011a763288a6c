"""dp.compare: release metrics against closed forms, consumer risks against seed 003's Table 1,
the analysis level's calibrated coverage, Monte Carlo paths within their standard errors."""

import math

import numpy as np
import pymc as pm
import pytest

import dpinfer as dp
from dpinfer.utility import Analysis, Consumer, PrivacyTarget, compare


def _value(table, mechanism, metric, setting=""):
    row = table[(table.mechanism == mechanism) & (table.metric == metric) & (table.setting == setting)]
    assert len(row) == 1, (mechanism, metric, setting)
    return float(row.value.iloc[0]), float(row.se.iloc[0])


def test_release_metrics_are_exact_closed_forms():
    eps = 0.5
    out = compare({"dg": dp.DoubleGeometric(eps), "lap": dp.Laplace(eps)}, [0, 3, 40],
                  tails=(2.0, 5.0), rng=np.random.default_rng(0)).table
    a, b = math.exp(-eps), 1 / eps
    assert _value(out, "dg", "variance")[0] == pytest.approx(2 * a / (1 - a) ** 2, rel=1e-10)
    assert _value(out, "dg", "mae")[0] == pytest.approx(2 * a / (1 - a * a), rel=1e-10)
    assert _value(out, "dg", "bias")[0] == pytest.approx(0.0, abs=1e-12)
    # P(|e| > t) = 2 a^(t + 1) / (1 + a) for whole t (seed 003 §3.11's tail sum)
    assert _value(out, "dg", "P(|r - x| > 5)")[0] == pytest.approx(2 * a**6 / (1 + a), rel=1e-10)
    assert _value(out, "lap", "mse")[0] == pytest.approx(2 * b * b, rel=1e-9)
    assert _value(out, "lap", "mae")[0] == pytest.approx(b, rel=1e-9)
    assert _value(out, "lap", "P(|r - x| > 2)")[0] == pytest.approx(math.exp(-2 / b), rel=1e-9)
    assert _value(out, "lap", "0.9 release interval width")[0] == pytest.approx(2 * b * math.log(10), rel=1e-12)
    assert set(out.se) == {0.0}


def test_clamped_release_enumeration_matches_the_closed_form_bias():
    mech = dp.ClampedGeometric(0.7, lower=0, upper=12)
    x = np.array([0, 1, 5, 12])
    out = compare({"c": mech}, x, rng=np.random.default_rng(0)).table
    assert _value(out, "c", "bias")[0] == pytest.approx(float(np.mean(mech.bias(x))), rel=1e-10)
    assert _value(out, "c", "variance")[0] == pytest.approx(float(np.mean(mech.variance(x))), rel=1e-9)


def test_monte_carlo_metrics_are_within_their_standard_errors():
    # double geometric noise conditioned on a zero total of 3 cells: the exact per-cell MSE by
    # enumeration of the noise vectors (e1, e2, -e1 - e2), P proportional to a^(|e1|+|e2|+|e1+e2|)
    a = math.exp(-0.5)
    e = np.arange(-80, 81)
    e1, e2 = np.meshgrid(e, e)
    w = a ** (np.abs(e1) + np.abs(e2) + np.abs(e1 + e2))
    exact_mse = float((w * e1**2).sum() / w.sum())
    cond = dp.Conditioned(dp.DoubleGeometric(0.5), dp.Invariants.total(3))
    out = compare({"cond": cond}, [0, 1, 2], replications=200, rng=np.random.default_rng(5)).table
    value, se = _value(out, "cond", "mse")
    assert 0 < se and abs(value - exact_mse) <= 4 * se
    assert _value(out, "cond", "bias")[0] == 0.0  # the invariant keeps the cells' total exactly
    # BIT Laplace: bias and variance from its closed forms (seed 002 §3.3), MAE by Monte Carlo
    bit = dp.BITLaplace(epsilon=1.0, lower=0.0, upper=1.0)
    out = compare({"bit": bit}, [0.1, 0.5, 0.9], replications=2000, rng=np.random.default_rng(5)).table
    assert _value(out, "bit", "bias")[1] == 0.0
    assert _value(out, "bit", "mae")[1] > 0.0


def test_consumer_level_reproduces_seed_003_table_1():
    out = compare({"G": dp.DoubleGeometric(math.log(4))}, [1], levels=("consumer",),
                  consumers={"abs": Consumer("absolute")}, consumer_range=3,
                  rng=np.random.default_rng(0)).table
    assert _value(out, "G", "minimax risk, raw release", "abs")[0] == pytest.approx(9 / 20, abs=1e-12)
    assert _value(out, "G", "minimax risk, optimal remap", "abs")[0] == pytest.approx(168 / 415, abs=1e-9)
    assert _value(out, "G", "minimax risk, tailored mechanism", "abs")[0] == pytest.approx(168 / 415, abs=1e-9)


def test_bayesian_consumers_get_the_bayes_optimum_from_the_geometric_mechanism():
    prior = np.array([0.1, 0.4, 0.3, 0.15, 0.05])
    out = compare({"G": dp.DoubleGeometric(0.8)}, [1], levels=("consumer",),
                  consumers={"abs": Consumer("absolute")}, consumer_range=4, priors={"p": prior},
                  rng=np.random.default_rng(0)).table
    remapped = _value(out, "G", "Bayes risk, Bayes remap", "abs, prior p")[0]
    tailored = _value(out, "G", "Bayes risk, tailored mechanism", "abs, prior p")[0]
    raw = _value(out, "G", "Bayes risk, raw release", "abs, prior p")[0]
    assert remapped == pytest.approx(tailored, rel=1e-7)  # Ghosh, Roughgarden & Sundararajan 2009
    assert remapped <= raw
    # the raw Bayes risk by direct summation of the clamped geometric's law
    a = math.exp(-0.8)
    x = np.arange(5)
    G = np.where(np.isin(x, [0, 4])[None, :], a ** np.abs(x[None, :] - x[:, None]) / (1 + a),
                 (1 - a) / (1 + a) * a ** np.abs(x[None, :] - x[:, None]))
    assert raw == pytest.approx(float(prior @ (G * np.abs(x[None, :] - x[:, None])).sum(axis=1)), rel=1e-12)


def test_equal_privacy_families_and_refusals(capsys):
    result = compare(target=PrivacyTarget.pure(1.0), true_values=[5],
                     families=("Laplace", "Gaussian", "DoubleGeometric"), rng=np.random.default_rng(0))
    assert list(result.mechanisms) == ["Laplace", "DoubleGeometric"]
    assert "Gaussian left out" in capsys.readouterr().err
    fig = result.figure(metrics=["mse", "mae"])
    assert len([ax for ax in fig.axes if ax.has_data()]) == 2


def _poisson_analysis(n_cells=4):
    def build():
        with pm.Model() as model:
            lam = pm.Gamma("lam", 4.0, 0.5)
            pm.Poisson("x", lam, shape=n_cells)
        return model

    def generate(rng):  # the parameter from its prior: calibrated coverage
        lam = rng.gamma(4.0, 2.0)
        return rng.poisson(lam, size=n_cells), lam

    return Analysis(build, "x", "lam", generate, draws=300, tune=300)


@pytest.mark.validation
def test_analysis_level_is_calibrated_and_the_naive_analysis_is_not():
    reps = 60
    out = compare({"dg": dp.DoubleGeometric(0.4)}, levels=("analysis",),
                  analysis=_poisson_analysis(), replications=reps, rng=np.random.default_rng(11),
                  progress=False).table
    coverage, se = _value(out, "dg", "lam interval coverage", "dpinfer")
    # parameter drawn from its prior: expected coverage 0.9; binomial sd sqrt(.09 / 60) = 0.039
    assert abs(coverage - 0.9) <= 3.5 * math.sqrt(0.09 / reps)
    counts, _ = _value(out, "dg", "count interval coverage", "dpinfer")
    assert abs(counts - 0.9) <= 3.5 * math.sqrt(0.09 / reps)  # cells correlate: a loose band
    naive_counts, _ = _value(out, "dg", "count interval coverage", "naive")
    assert naive_counts < 0.5  # the release is rarely the truth at epsilon = 0.4
    assert _value(out, "dg", "count interval width", "dpinfer")[0] > 0
    assert _value(out, "dg", "count interval width", "naive")[0] == 0
    share = _value(out, "dg", "share of fits meeting the ESS target and with no divergences", "dpinfer")[0]
    assert 0.0 <= share <= 1.0  # stated beside the coverage it qualifies
    assert _value(out, "dg", "fits' smallest bulk ESS", "dpinfer")[0] > 0


def test_bad_input_is_refused_with_the_argument_named():
    mech = {"dg": dp.DoubleGeometric(1.0)}
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="levels must be"):
        compare(mech, [1], levels=("posterior",), rng=rng)
    with pytest.raises(ValueError, match="consumer level needs"):
        compare(mech, [1], levels=("consumer",), rng=rng)
    with pytest.raises(ValueError, match="analysis level needs"):
        compare(mech, [1], levels=("analysis",), rng=rng)
    with pytest.raises(ValueError, match="true_values are needed"):
        compare(mech, rng=rng)
    with pytest.raises(TypeError, match="Mechanism"):
        compare({"x": 3}, [1], rng=rng)
    with pytest.raises(ValueError, match="do not meet the target"):
        compare(mech, [1], target=PrivacyTarget.pure(0.5), rng=rng)
    with pytest.raises(ValueError, match="state different privacy"):
        compare({"a": dp.DoubleGeometric(1.0), "b": dp.DoubleGeometric(2.0)}, [1], rng=rng)
    with pytest.raises(ValueError, match="release_method"):
        compare(mech, [1], release_method="guess", rng=rng)
    with pytest.raises(ValueError, match="leave families out"):
        compare(mech, [1], families=("Laplace",), rng=rng)
    with pytest.raises(ValueError, match="tails"):
        compare(mech, [1], tails=(-1,), rng=rng)


def test_monte_carlo_reproduces_every_exact_release_metric_within_4_standard_errors():
    target = PrivacyTarget.approximate(0.7, 1e-6)
    mechanisms = {name: dp.calibrate(name, target).mechanism
                  for name in ("Laplace", "DoubleGeometric", "DiscreteGaussian", "Logistic", "Gaussian")}
    kwargs = dict(target=target, tails=(1.0, 4.0), replications=20_000)
    exact = compare(mechanisms, [0, 5], rng=np.random.default_rng(1), **kwargs).table
    simulated = compare(mechanisms, [0, 5], rng=np.random.default_rng(2), release_method="monte carlo",
                        **kwargs).table
    checked = 0
    for _, row in simulated.iterrows():
        if not row.se > 0:  # interval widths and variances carry no standard error
            continue
        reference = _value(exact, row.mechanism, row.metric)[0]
        assert abs(row.value - reference) <= 4 * row.se, (row.mechanism, row.metric, row.value, reference)
        checked += 1
    assert checked == 5 * 5  # bias, MSE, MAE and two tail probabilities per mechanism


@pytest.mark.validation
def test_analysis_coverage_study_dpinfer_nominal_naive_not():
    """Validation tier (about 2 minutes): 400 replications, the parameter drawn from its prior.
    dpinfer's 90% intervals cover at 0.9 within 3.5 binomial standard errors (0.052 at 400); the
    naive analysis's parameter intervals cover visibly less (more than 4 of its standard errors
    below 0.9)."""
    reps = 400
    out = compare({"dg": dp.DoubleGeometric(0.3)}, levels=("analysis",),
                  analysis=_poisson_analysis(n_cells=6), replications=reps,
                  rng=np.random.default_rng(2026)).table
    band = 3.5 * math.sqrt(0.09 / reps)
    assert abs(_value(out, "dg", "lam interval coverage", "dpinfer")[0] - 0.9) <= band
    assert abs(_value(out, "dg", "count interval coverage", "dpinfer")[0] - 0.9) <= band
    naive, se = _value(out, "dg", "lam interval coverage", "naive")
    assert naive < 0.9 - 4 * se
