"""Property-based fuzzing of the public entry points (issue 40, Must show 5), with Hypothesis.

The property: a bad input ends in a ``ValueError`` or ``TypeError`` (dpinfer's own errors
subclass them; a path that does not exist, a ``FileNotFoundError``) whose message names the
argument; never another exception from inside
(``KeyError``, ``IndexError``, ``ZeroDivisionError``, ``AttributeError`` ...), never a
silent acceptance of a value outside what the argument allows (a NaN epsilon, a negative
sigma, a bool for a number, a string for a bound).

The entry points: the mechanisms' constructors, ``release`` and ``observe``, ``dp.Conditioned``
and ``dp.Invariants``, ``dp.NestedMeasurements`` (tree and terms), the options of ``dp.sample``
and ``dp.sample_sharded``, ``dp.compare``, ``dp.summarise_areas``, release manifests (every field
corrupted or deleted), ``dp.read_nmf``'s arguments, and the command lines ``dpinfer fit``,
``compare`` (options and every field of a config file), ``nmf`` (refused before the fit) and
``areas``. Each property runs twice: here with a short derandomised profile
(FAST examples, the same every run: the fast tier), and with LONG random examples in the
validation tier (``make validate``). Every failure the fuzzing found is fixed and kept below as an explicit
example (``@example``), so it stays a regression test.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dpinfer as dp
from dpinfer.utility.equal_privacy import FAMILIES

FAST = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
LONG = settings(max_examples=1000, deadline=None, database=None, suppress_health_check=list(HealthCheck))

#: junk for an argument: wrong types, NaN, infinities, signs, empties, shapes
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-10**9, 10**9),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
    st.lists(st.floats(-5, 5), max_size=3), st.tuples(st.integers(-3, 3), st.integers(-3, 3)),
    st.just(np.array([1.0, 2.0])), st.just(np.float64("nan")), st.just(np.int64(-1)), st.just(1 + 2j),
    st.just({}), st.just(object()),
)


def real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def positive(x) -> bool:
    return real(x) and float(x) > 0


def whole(x) -> bool:
    return real(x) and float(x) == int(x)


def positive_whole(x) -> bool:
    return whole(x) and int(x) >= 1


def open_unit(x) -> bool:
    return real(x) and 0 < float(x) < 1


def unit_or_zero(x) -> bool:
    return real(x) and 0 <= float(x) < 1


def neighbour(x) -> bool:
    return isinstance(x, str) and x in ("add-remove", "substitution")


#: mechanism -> (builder from keyword arguments, {argument: (valid default, is it allowed?)})
TOTAL = dp.Invariants.total(3)
MECHANISMS = {
    "DoubleGeometric": (dp.DoubleGeometric, {"epsilon": (0.5, positive), "sensitivity": (1, positive_whole),
                                             "neighbour": ("add-remove", neighbour)}),
    "Laplace": (dp.Laplace, {"epsilon": (0.5, positive), "sensitivity": (1.0, positive),
                             "neighbour": ("add-remove", neighbour)}),
    "Gaussian": (dp.Gaussian, {"epsilon": (0.5, positive), "delta": (1e-6, open_unit), "sensitivity": (1.0, positive)}),
    "DiscreteGaussian": (dp.DiscreteGaussian, {"sigma": (2.0, positive), "sensitivity": (1, positive_whole),
                                               "delta": (1e-6, open_unit)}),
    "ClampedGeometric": (dp.ClampedGeometric, {"epsilon": (0.5, positive), "lower": (0, whole),
                                               "upper": (10, lambda x: x is None or whole(x))}),
    "TruncatedLaplace": (dp.TruncatedLaplace, {"epsilon": (0.5, positive), "lower": (0.0, real),
                                               "upper": (10.0, real)}),
    "BITLaplace": (dp.BITLaplace, {"epsilon": (0.5, positive), "lower": (0.0, real),
                                   "upper": (10.0, lambda x: x is None or real(x))}),  # None: one-sided
    "Logistic": (dp.Logistic, {"epsilon": (0.5, positive), "delta": (0.0, unit_or_zero)}),
    "Subbotin": (dp.Subbotin, {"r": (1.5, positive), "epsilon": (0.5, positive), "delta": (1e-6, open_unit)}),
    "RandomizedResponse": (dp.RandomizedResponse, {"p": (0.7, lambda x: real(x) and 0 < float(x) <= 1),
                                                   "attributes": (1, positive_whole)}),
    "MultiLevelGeometric": (dp.MultiLevelGeometric, {"sensitivity": (1, positive_whole)}),
    "GeneralizedLaplace": (lambda **k: dp.GeneralizedLaplace(invariants=TOTAL, **k),
                           {"epsilon": (0.5, positive), "norm": ("l1", lambda x: isinstance(x, str) and x in ("l1", "l2"))}),
    "GeneralizedGaussian": (lambda **k: dp.GeneralizedGaussian(invariants=TOTAL, **k),
                            {"sigma": (2.0, positive), "epsilon": (1.0, positive)}),
}
FIXED = {"MultiLevelGeometric": {"epsilons": [0.5, 0.25]}}
CASES = sorted((m, a) for m, (_, args) in MECHANISMS.items() for a in args)


def fuzz(profile, body, strategies: dict, found=()) -> None:
    """Run the property ``body`` under ``profile`` on ``strategies``, every input in ``found``
    (the failures found so far) first."""
    test = given(**strategies)(body)
    for case in found:
        test = example(**case)(test)
    profile(test)()


def _refused_by_name(call, argument: str) -> None:
    """``call()`` raised ValueError/TypeError (FileNotFoundError for a path that does not exist)
    naming ``argument`` (anything else propagates)."""
    with pytest.raises((ValueError, TypeError, FileNotFoundError)) as caught:
        call()
    assert argument in str(caught.value), f"the error does not name {argument!r}: {caught.value}"


def _a_constructor_refuses_junk_by_name(case, junk):
    name, argument = case
    build, arguments = MECHANISMS[name]
    kwargs = {a: default for a, (default, _) in arguments.items()} | FIXED.get(name, {}) | {argument: junk}
    allowed = arguments[argument][1]
    if allowed(junk):
        try:
            build(**kwargs)
        except (ValueError, TypeError):
            pass  # an allowed value may still be refused with the others (e.g. lower > upper)
        return
    _refused_by_name(lambda: build(**kwargs), argument)


CONSTRUCTOR_FOUND = [  # failures the fuzzing found, fixed: each stays an explicit example
    dict(case=("DoubleGeometric", "neighbour"), junk=np.array([1.0, 2.0])),  # numpy's "truth value ... ambiguous"
    dict(case=("GeneralizedLaplace", "norm"), junk=np.array([1.0, 2.0])),  # the same
    dict(case=("GeneralizedGaussian", "sigma"), junk=1.7976931348623157e308),  # OverflowError in the normaliser
    dict(case=("DiscreteGaussian", "sigma"), junk=1e70),  # numpy's "Maximum allowed size exceeded"
    dict(case=("DiscreteGaussian", "sensitivity"), junk=24036432448.0),  # allocated 89.5 GiB (now a valid, if
    # useless, mechanism: epsilon 7.2e19)
    dict(case=("DiscreteGaussian", "sensitivity"), junk=1e300),  # OverflowError in the epsilon search
    dict(case=("DiscreteGaussian", "sigma"), junk=1e-300),  # ZeroDivisionError (sigma^2 underflows)
]


def test_constructors_refuse_junk_by_name():
    fuzz(FAST, _a_constructor_refuses_junk_by_name, dict(case=st.sampled_from(CASES), junk=JUNK), CONSTRUCTOR_FOUND)


@pytest.mark.validation
def test_constructors_refuse_junk_by_name_long():
    fuzz(LONG, _a_constructor_refuses_junk_by_name, dict(case=st.sampled_from(CASES), junk=JUNK), CONSTRUCTOR_FOUND)


#: release values that no mechanism takes, and that a discrete one refuses
BAD_VALUES = st.one_of(
    st.just(np.array([1.0, np.nan, 2.0])), st.just(np.array([np.inf, 1.0, 2.0])), st.just(["a", "b", "c"]),
    st.just(None), st.just(object()), st.just(np.array([1 + 1j, 2, 3])),
)
DISCRETE_BAD = st.one_of(BAD_VALUES, st.just(np.array([0.5, 1.0, 2.0])), st.just(np.array([1e300, 1.0, 2.0])))
OBSERVERS = ["DoubleGeometric", "DiscreteGaussian", "ClampedGeometric", "Laplace", "Gaussian"]


def _mechanism(name):
    build, arguments = MECHANISMS[name]
    return build(**{a: default for a, (default, _) in arguments.items()})


def _release_and_observe_refuse_bad_values(name, values):
    mechanism = _mechanism(name)
    if not mechanism.discrete and isinstance(values, np.ndarray) and np.isrealobj(values) \
            and np.all(np.isfinite(values)):
        return  # whole numbers are not required of a continuous mechanism's values
    _refused_by_name(lambda: mechanism.release(values, rng=np.random.default_rng(0)), "true_values")
    with pm.Model():
        x = pm.Poisson("x", 5.0, shape=3) if mechanism.discrete else pm.Normal("x", 5.0, 1.0, shape=3)
        _refused_by_name(lambda: mechanism.observe("y", x, observed=values), "release")


VALUES_FOUND = [dict(name="DoubleGeometric", values=np.array([1 + 1j, 2, 3]))]  # complex: was silently made real
VALUES = dict(name=st.sampled_from(OBSERVERS), values=DISCRETE_BAD)


def test_release_and_observe_refuse_bad_values():
    fuzz(FAST, _release_and_observe_refuse_bad_values, VALUES, VALUES_FOUND)


@pytest.mark.validation
def test_release_and_observe_refuse_bad_values_long():
    fuzz(LONG, _release_and_observe_refuse_bad_values, VALUES, VALUES_FOUND)


def _small_model():
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 0.5)
        x = pm.Poisson("x", lam, shape=2)
        dp.DoubleGeometric(1.0).observe("y", x, observed=[3, 4])
    return model


SAMPLE_OPTIONS = {"draws": positive_whole, "tune": lambda x: whole(x) and int(x) >= 0, "chains": positive_whole,
                  "tol": open_unit,
                  "random_seed": lambda x: x is None or (isinstance(x, numbers.Integral) and not isinstance(x, bool)
                                                         and x >= 0),
                  "cores": lambda x: x is None or positive_whole(x),
                  "max_minutes": lambda x: x is None or (real(x) and float(x) >= 0),
                  "progressbar": lambda x: isinstance(x, bool), "log_likelihood": lambda x: isinstance(x, bool),
                  "checkpoint_every": positive_whole,
                  # a path is a valid checkpoint (it would be written); None is the default
                  "checkpoint": lambda x: x is None or isinstance(x, str),
                  "resume": lambda x: x is None}


def _sample_refuses_bad_options_by_name(option, junk):
    if SAMPLE_OPTIONS[option](junk):
        return  # a valid value: a fit, not what is fuzzed here
    kwargs = dict(draws=5, tune=5, chains=1, progressbar=False, model=_small_model()) | {option: junk}
    _refused_by_name(lambda: dp.sample(**kwargs), option)


SAMPLE_FOUND = [
    dict(option="chains", junk=None),  # a raw TypeError from int(None)
    dict(option="cores", junk=float("nan")),  # accepted: the fit ran
    dict(option="cores", junk=np.array([1.0, 2.0])),  # numpy's "truth value ... ambiguous"
    dict(option="random_seed", junk=False),  # accepted as seed 0
    dict(option="random_seed", junk=np.array([1.0, 2.0])),  # numpy's "seed must be integer"
    dict(option="progressbar", junk="no"),  # accepted: a progress bar
    dict(option="checkpoint_every", junk=0),  # accepted: checkpoint_every is read only with a checkpoint
    dict(option="checkpoint", junk=3),  # pathlib's "argument should be a str or an os.PathLike"
]
OPTIONS = dict(option=st.sampled_from(sorted(SAMPLE_OPTIONS)), junk=JUNK)


def test_sample_refuses_bad_options_by_name():
    fuzz(FAST, _sample_refuses_bad_options_by_name, OPTIONS, SAMPLE_FOUND)


@pytest.mark.validation
def test_sample_refuses_bad_options_by_name_long():
    fuzz(LONG, _sample_refuses_bad_options_by_name, OPTIONS, SAMPLE_FOUND)


# --- release files ----------------------------------------------------------------------------
TOML_JUNK = st.one_of(
    st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.lists(st.integers(-3, 3), max_size=3), st.just({"a": 1}), st.just([]),
)


def _manifest_fields(document: dict, prefix=()) -> list[tuple]:
    out = []
    for key, value in document.items():
        out.append(prefix + (key,))
        if isinstance(value, dict):
            out += _manifest_fields(value, prefix + (key,))
    return out


def _valid_release(directory):
    """A valid manifest (and its values file) of each of a few mechanisms: (path, its document)."""
    import tomllib

    made = []
    for k, (mechanism, values) in enumerate([
            (dp.DoubleGeometric(0.5), np.array([4, 6, 5])),
            (dp.Conditioned(dp.DoubleGeometric(0.5), TOTAL), np.array([4, 6, 5])),
            (dp.Laplace(1.0), np.array([1.5, 2.5, 3.0]))]):
        path = dp.write_release(directory / f"r{k}.toml", mechanism, values, name="y")
        made.append((path, tomllib.loads(path.read_text())))
    return made


def _a_corrupted_manifest_is_refused_by_field(which, field_index, junk, delete):
    import tempfile
    from pathlib import Path

    from dpinfer.io.release.toml import toml_dumps

    with tempfile.TemporaryDirectory() as tmp:
        path, document = _valid_release(Path(tmp))[which]
        fields = [f for f in _manifest_fields(document) if f != ("format",)]
        field = fields[field_index % len(fields)]
        parent = document
        for key in field[:-1]:
            parent = parent[key]
        if delete:
            del parent[field[-1]]
        else:
            parent[field[-1]] = junk
        path.write_text(toml_dumps(document, ""), encoding="utf-8")
        try:
            release = dp.read_release(path)
        except (ValueError, TypeError) as err:
            text = str(err)
            assert field[-1] in text, f"the error does not name {'.'.join(field)}: {text}"
            return
        # read: what it read must be what the file says (nothing clipped or dropped silently)
        assert release.name == document["release"]["name"]


MANIFEST = dict(which=st.integers(0, 2), field_index=st.integers(0, 40), junk=TOML_JUNK, delete=st.booleans())


def test_a_corrupted_manifest_is_refused_by_field():
    fuzz(FAST, _a_corrupted_manifest_is_refused_by_field, MANIFEST)


@pytest.mark.validation
def test_a_corrupted_manifest_is_refused_by_field_long():
    fuzz(LONG, _a_corrupted_manifest_is_refused_by_field, MANIFEST)


def test_from_privacy_with_a_sigma_beyond_reach_is_refused_by_name():
    """Found by hand beside the fuzzing: a tiny epsilon at a tiny delta asked for ~10^13 pmf
    terms (MemoryError); the search now stops at MAX_SIGMA and says so."""
    with pytest.raises(ValueError, match=r"epsilon=1e-12 at delta=1e-12 .* needs sigma > 1e\+06"):
        dp.DiscreteGaussian.from_privacy(1e-12, 1e-12)


# --- the command line -------------------------------------------------------------------------
#: option -> tokens it must refuse (a valid token would start a fit: not what is fuzzed here)
CLI_BAD = {
    "--draws": ["-1", "0", "abc", "1.5", "", "nan"],
    "--tune": ["-1", "abc", "1.5", "", "inf"],
    "--chains": ["-1", "0", "abc", "", "2.0"],
    "--cores": ["-1", "0", "abc", ""],
    "--max-minutes": ["-1", "nan", "inf", "abc", "", "1e400"],
    "--seed": ["-1", "abc", "1.5", ""],
    "--model": ["", "no-such-template", "auto "],
}
CLI_CASES = sorted((option, token) for option, tokens in CLI_BAD.items() for token in tokens)


@pytest.fixture(scope="module")
def release_file(tmp_path_factory):
    return dp.write_release(tmp_path_factory.mktemp("cli") / "r.toml", dp.DoubleGeometric(0.5), np.array([4, 6, 5]),
                            name="y")


def _cli_refuses_bad_options_by_name(release_file, case, capsys):
    from dpinfer.cli import main

    option, token = case
    with pytest.raises(SystemExit) as caught:
        main(["fit", str(release_file), option, token, "--quiet"])
    message = str(caught.value.code) if not isinstance(caught.value.code, int) else capsys.readouterr().err
    assert caught.value.code != 0
    assert option.lstrip("-").replace("-", "_") in message.replace("-", "_"), message
    assert "Traceback" not in message


def test_dpinfer_fit_refuses_bad_options_by_name(release_file, capsys):
    fuzz(FAST, lambda case: _cli_refuses_bad_options_by_name(release_file, case, capsys),
         dict(case=st.sampled_from(CLI_CASES)))


# --- the noisy measurement files' reader ------------------------------------------------------
@pytest.fixture(scope="module")
def nmf_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("nmf")
    dp.write_synthetic_nmf(root, n_counties=1, tracts_per_county=2, block_groups_per_tract=(2, 2),
                           blocks_per_block_group=(2, 3), aian_tracts=0,
                           levels=NMF_LEVELS)
    return root


def _state_19(x) -> bool:
    items = list(x) if isinstance(x, (list, tuple)) else [x]
    return (len(items) == 1 and isinstance(items[0], (int, str, np.integer)) and not isinstance(items[0], bool)
            and items[0] in (19, "19"))


NMF_LEVELS = ("US", "State", "County", "Tract", "Block_Group")  # the fixture's


def _levels_written(x) -> bool:
    """None, or a level name or a non-empty sequence of them, each among the fixture's: what
    read_nmf must take (its docstring)."""
    if x is None:
        return True
    chosen = [x] if isinstance(x, str) else list(x) if isinstance(x, (list, tuple)) else []
    return bool(chosen) and all(isinstance(v, str) and v in NMF_LEVELS for v in chosen)


NMF_ARGUMENTS = {"states": (19, _state_19), "levels": (None, _levels_written),
                 "product": (None, lambda x: x is None)}


def _read_nmf_refuses_junk_by_name(nmf_root, argument, junk):
    kwargs = {a: default for a, (default, _) in NMF_ARGUMENTS.items()} | {argument: junk}
    if NMF_ARGUMENTS[argument][1](junk):
        return
    try:
        files = dp.read_nmf(nmf_root, kwargs.pop("states"), **kwargs)
    except (ValueError, TypeError, FileNotFoundError) as err:
        assert argument.rstrip("s") in str(err), f"the error does not name {argument!r}: {err}"
        return
    pytest.fail(f"read_nmf accepted {argument}={junk!r}: {files!r}")


NMF_JUNK = st.one_of(JUNK, st.sampled_from([99, "99", "1", 1, -19, "nineteen", ["19", "20"], ("US",), ["Nation"],
                                            ("Block_Group", "Block"), "Tract", "US_Person", "nope"]))


def test_read_nmf_refuses_junk_by_name(nmf_root):
    fuzz(FAST, lambda argument, junk: _read_nmf_refuses_junk_by_name(nmf_root, argument, junk),
         dict(argument=st.sampled_from(sorted(NMF_ARGUMENTS)), junk=NMF_JUNK))


@pytest.mark.validation
def test_read_nmf_refuses_junk_by_name_long(nmf_root):
    fuzz(LONG, lambda argument, junk: _read_nmf_refuses_junk_by_name(nmf_root, argument, junk),
         dict(argument=st.sampled_from(sorted(NMF_ARGUMENTS)), junk=NMF_JUNK))


# --- invariants and conditioned releases ------------------------------------------------------
CONDITIONED = {"base": (dp.DoubleGeometric(0.5), lambda x: isinstance(x, (dp.DoubleGeometric, dp.DiscreteGaussian))),
               "invariants": (TOTAL, lambda x: isinstance(x, dp.Invariants)),
               "nonnegative": (False, lambda x: isinstance(x, (bool, np.bool_))),
               "burn_in_sweeps": (200, positive_whole)}


def _conditioned_refuses_junk_by_name(argument, junk):
    if CONDITIONED[argument][1](junk):
        return
    kwargs = {a: default for a, (default, _) in CONDITIONED.items()} | {argument: junk}
    _refused_by_name(lambda: dp.Conditioned(kwargs.pop("base"), kwargs.pop("invariants"), **kwargs), argument)


def _invariants_refuse_junk_by_name(which, junk):
    shape_ok = (isinstance(junk, tuple) and all(isinstance(i, int) and i >= 1 for i in junk)) or (
        isinstance(junk, numbers.Integral) and not isinstance(junk, bool) and junk >= 1)
    if which == "total" and not positive_whole(junk):
        _refused_by_name(lambda: dp.Invariants.total(junk), "n_cells")
    elif which == "margins shape" and not shape_ok:
        _refused_by_name(lambda: dp.Invariants.margins(junk, [(0,)]), "shape")
    elif which == "margins":
        _refused_by_name(lambda: dp.Invariants.margins((2, 3), junk), "margins")
    elif which == "groups":
        try:
            dp.Invariants.groups(junk)
        except (ValueError, TypeError) as err:
            assert "labels" in str(err), err
    elif which == "from_matrix":
        try:
            dp.Invariants.from_matrix(junk)
        except (ValueError, TypeError) as err:
            assert "A" in str(err) or "matrix" in str(err), err


CONDITIONED_FOUND = [
    dict(argument="burn_in_sweeps", junk=True),  # accepted as 1 sweep
    dict(argument="burn_in_sweeps", junk="abc"),  # int()'s "invalid literal for int() with base 10"
]
CONSTRAINTS = dict(argument=st.sampled_from(sorted(CONDITIONED)), junk=JUNK)
INVARIANTS = dict(which=st.sampled_from(["total", "margins shape", "margins", "groups", "from_matrix"]), junk=JUNK)


def test_conditioned_and_invariants_refuse_junk_by_name():
    fuzz(FAST, _conditioned_refuses_junk_by_name, CONSTRAINTS, CONDITIONED_FOUND)
    fuzz(FAST, _invariants_refuse_junk_by_name, INVARIANTS)


@pytest.mark.validation
def test_conditioned_and_invariants_refuse_junk_by_name_long():
    fuzz(LONG, _conditioned_refuses_junk_by_name, CONSTRAINTS, CONDITIONED_FOUND)
    fuzz(LONG, _invariants_refuse_junk_by_name, INVARIANTS)


# --- nested measurements (the noisy measurement files' release) --------------------------------
NESTED_TREE = {"parent": [-1, 0, 0], "leaves": [1, 2], "n_cells": 2, "area_names": None, "cell_shape": None}
NESTED_TERMS = {"name": "m", "areas": [0, 1, 2], "cells": [[0], [1]], "values": np.ones((3, 2), int),
                "sigma2": 1.0, "summed": 1, "cell_names": None}
#: the argument a refusal must name (an area or leaf index that the tree does not have is named
#: by the argument that lists it)
NESTED_NAMES = {"parent": ("parent", "leaves", "areas")}


def _nested_measurements_refuse_junk_by_name(argument, junk):
    tree, terms = dict(NESTED_TREE), dict(NESTED_TERMS)
    (tree if argument in tree else terms)[argument] = junk
    try:
        nested = dp.NestedMeasurements(tree.pop("parent"), tree.pop("leaves"), tree.pop("n_cells"), **tree)
        nested.measure(terms.pop("name"), terms.pop("areas"), terms.pop("cells"), terms.pop("values"),
                       terms.pop("sigma2"), terms.pop("summed"), **terms)
        nested.log_likelihood(np.ones((nested.leaves.size, nested.n_cells), int))
    except (ValueError, TypeError) as err:
        assert any(n in str(err) for n in NESTED_NAMES.get(argument, (argument,))), \
            f"the error does not name {argument!r}: {err}"


NESTED_FOUND = [  # each was a raw error from inside, or junk silently cast
    dict(argument="parent", junk=[-1, 0, float("nan")]),  # NaN cast to an int64 (RuntimeWarning only)
    dict(argument="parent", junk=[-1, 10**30, 0]),  # OverflowError
    dict(argument="leaves", junk="ab"),  # int()'s "invalid literal"
    dict(argument="leaves", junk=[1, 1]),  # named the internal "leaf_area"
    dict(argument="n_cells", junk=None),  # int()'s TypeError
    dict(argument="n_cells", junk=10**15),  # MemoryError (a mask of 2 x 10^15 cells)
    dict(argument="cell_shape", junk=3),  # "'int' object is not iterable"
    dict(argument="cells", junk=[[0], [5]]),  # IndexError
    dict(argument="cells", junk=7),  # "'int' object is not iterable"
    dict(argument="areas", junk=[0, None, 2]),  # int()'s TypeError
    dict(argument="sigma2", junk=[1.0, 2.0]),  # numpy's "operands could not be broadcast"
    dict(argument="summed", junk=10**30),  # OverflowError
    dict(argument="sigma2", junk=3.3e16),  # a noise table of billions of values: killed for memory
    dict(argument="cell_names", junk=5),  # "object of type 'int' has no len()"
]
NESTED = dict(argument=st.sampled_from(sorted(NESTED_TREE) + sorted(NESTED_TERMS)),
              junk=st.one_of(JUNK, st.lists(st.integers(-2, 4), max_size=5)))


def test_nested_measurements_refuse_junk_by_name():
    fuzz(FAST, _nested_measurements_refuse_junk_by_name, NESTED, NESTED_FOUND)


@pytest.mark.validation
def test_nested_measurements_refuse_junk_by_name_long():
    fuzz(LONG, _nested_measurements_refuse_junk_by_name, NESTED, NESTED_FOUND)


# --- dp.sample_sharded's options --------------------------------------------------------------
def _shard(groups):
    """A shard: a rate per group (around the shared mu0), two counts per group released."""
    local = np.repeat(np.arange(len(groups)), 2)
    with pm.Model() as model:
        mu0 = pm.Data("mu0", 0.0)
        m = pm.Normal("m", mu0, 1.0, shape=len(groups))
        x = pm.Poisson("x", pm.math.exp(m[local]))
        dp.DoubleGeometric(1.0).observe("release", x, observed=np.full(2 * len(groups), 3))
        pm.Deterministic("m_g", m)
    return model


def _shared():
    with pm.Model() as model:
        mu0 = pm.Normal("mu0", 0.0, 1.0)
        m_g = pm.Data("m_g", np.zeros(4))
        pm.Potential("groups", pm.logp(pm.Normal.dist(mu0, 1.0), m_g).sum())
    return model


SHARDED_OPTIONS = {k: SAMPLE_OPTIONS[k] for k in ("draws", "tune", "chains", "random_seed", "tol", "checkpoint_every",
                                                  "progressbar", "checkpoint", "resume")} | {
    "shards": lambda x: x is None or (positive_whole(x) and int(x) <= 4), "weights": lambda x: x is None,
    "groups": lambda x: False, "client": lambda x: x is None}


def _sample_sharded_refuses_bad_options_by_name(option, junk):
    if SHARDED_OPTIONS[option](junk):
        return  # a valid value: a fit, not what is fuzzed here
    kwargs = dict(draws=5, tune=5, chains=1, shards=2, progressbar=False) | {option: junk}
    groups = kwargs.pop("groups", [0, 1, 2, 3])
    _refused_by_name(lambda: dp.sample_sharded(_shard, _shared(), groups, **kwargs), option)


SHARDED_FOUND = [  # each was a raw error from inside or a silent acceptance
    dict(option="draws", junk=None),  # int()'s TypeError
    dict(option="tune", junk=False),  # accepted as 0
    dict(option="shards", junk=True),  # accepted as 1 shard
    dict(option="shards", junk=float("nan")),  # "cannot convert float NaN to integer"
    dict(option="weights", junk="ab"),  # float()'s "could not convert string to float"
    dict(option="random_seed", junk=True),  # accepted as seed 1
    dict(option="random_seed", junk=0.5),  # numpy's "SeedSequence expects int"
    dict(option="progressbar", junk=np.array([1.0, 2.0])),  # numpy's "truth value ... ambiguous"
    dict(option="progressbar", junk=None),  # accepted
    dict(option="checkpoint_every", junk=0),  # accepted (read only with a checkpoint)
    dict(option="checkpoint", junk=3),  # pathlib's "argument should be a str or an os.PathLike"
    dict(option="client", junk=3),  # AttributeError: no scheduler_info
    dict(option="groups", junk=object()),  # "'object' object is not iterable"
]
SHARDED = dict(option=st.sampled_from(sorted(SHARDED_OPTIONS)), junk=JUNK)


def test_sample_sharded_refuses_bad_options_by_name():
    fuzz(FAST, _sample_sharded_refuses_bad_options_by_name, SHARDED, SHARDED_FOUND)


@pytest.mark.validation
def test_sample_sharded_refuses_bad_options_by_name_long():
    fuzz(LONG, _sample_sharded_refuses_bad_options_by_name, SHARDED, SHARDED_FOUND)


# --- dp.compare -------------------------------------------------------------------------------
COMPARE_ARGUMENTS = {
    "families": (["Laplace"], lambda x: x is None or (isinstance(x, str) and x in FAMILIES) or (
        isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(f, str) and f in FAMILIES for f in x))),
    "true_values": ([0, 3], lambda x: (real(x) and not isinstance(x, bool)) or (
        isinstance(x, (list, tuple, np.ndarray)) and len(x) > 0 and np.asarray(x).dtype.kind in "if"
        and np.all(np.isfinite(np.asarray(x, dtype=float))))),
    "levels": ("release", lambda x: isinstance(x, str) and x in ("release",)),
    "tails": ((1.0,), lambda x: (real(x) and float(x) >= 0) or (
        isinstance(x, (list, tuple, np.ndarray)) and len(x) > 0 and np.asarray(x).dtype.kind in "if"
        and np.all(np.asarray(x, dtype=float) >= 0) and np.all(np.isfinite(np.asarray(x, dtype=float))))),
    "prob": (0.9, open_unit),
    "replications": (20, lambda x: whole(x) and int(x) >= 2),
    "consumer_range": (None, lambda x: x is None or (positive_whole(x) and int(x) <= 1000)),
    "consumers": (None, lambda x: x is None or (isinstance(x, dict) and not x)),  # {}: none
    "priors": (None, lambda x: x is None or (isinstance(x, dict) and not x)),
}


def _compare_refuses_junk_by_name(argument, junk):
    if COMPARE_ARGUMENTS[argument][1](junk):
        return
    kwargs = {a: default for a, (default, _) in COMPARE_ARGUMENTS.items()} | {argument: junk}
    target = dp.PrivacyTarget.pure(1.0)
    _refused_by_name(lambda: dp.compare(target=target, rng=np.random.default_rng(0), progress=False, **kwargs),
                     {"consumer_range": "consumer", "consumers": "consumer"}.get(argument, argument))


COMPARE_FOUND = [
    dict(argument="families", junk=0),  # falsy: the default families, silently
    dict(argument="families", junk=True),  # "'bool' object is not iterable"
    dict(argument="families", junk="abc"),  # "left out", then "no family can meet"
    dict(argument="true_values", junk=True),  # accepted as 1.0
    dict(argument="true_values", junk=[]),  # IndexError
    dict(argument="consumer_range", junk=10**6),  # MemoryError (a 10^6 x 10^6 matrix)
    dict(argument="consumers", junk=3),  # AttributeError: no .items()
    dict(argument="tails", junk="ab"),  # float()'s "could not convert string to float"
    dict(argument="tails", junk=False),  # accepted as a distance of 0
]
COMPARE = dict(argument=st.sampled_from(sorted(COMPARE_ARGUMENTS)), junk=JUNK)


def test_compare_refuses_junk_by_name():
    fuzz(FAST, _compare_refuses_junk_by_name, COMPARE, COMPARE_FOUND)


@pytest.mark.validation
def test_compare_refuses_junk_by_name_long():
    fuzz(LONG, _compare_refuses_junk_by_name, COMPARE, COMPARE_FOUND)


# --- dpinfer compare, nmf and areas ------------------------------------------------------------
def _cli_refuses(argv, names, capsys) -> None:
    """``dpinfer ARGV`` exits non-zero with one line naming one of ``names``, no traceback."""
    from dpinfer.cli import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    message = str(caught.value.code) if not isinstance(caught.value.code, int) else capsys.readouterr().err
    assert caught.value.code != 0, argv
    assert "Traceback" not in message
    folded = message.lower().replace("-", "_")
    assert any(n.lower().replace("-", "_") in folded for n in names), f"{argv}: {message}"


COMPARE_CONFIG = {"target": {"kind": "pure", "epsilon": 1.0}, "families": ["Laplace", "DoubleGeometric"],
                  "true_values": [0, 3], "levels": ["release", "consumer"], "consumer_range": 4, "replications": 20,
                  "consumers": {"gov": {"loss": "absolute"}, "drug": {"loss": "squared", "side_information": [2, 3]}}}
#: (field path, junk value; None deletes the field), the names its refusal may give. Found
#: failing: consumers.gov = "absolute" (AttributeError), families = 0 (the default families,
#: silently), true_values = [] (IndexError), consumer_range = 10^6 (MemoryError), and every
#: error of dp.compare itself (a traceback: target.epsilon = -1)
CONFIG_CASES = [
    (("target", "epsilon"), -1.0, ["epsilon"]), (("target", "epsilon"), "abc", ["epsilon"]),
    (("target", "kind"), "laplace", ["target"]), (("target",), 3, ["target"]),
    (("families",), 0, ["families"]), (("families",), True, ["families"]), (("families",), "abc", ["families"]),
    (("families",), [], ["families"]), (("true_values",), True, ["true_values"]),
    (("true_values",), [], ["true_values"]), (("true_values",), "abc", ["true_values"]),
    (("levels",), "nope", ["levels"]), (("levels",), [], ["levels"]), (("tails",), "ab", ["tails"]),
    (("prob",), 1.5, ["prob"]), (("replications",), 1, ["replications"]), (("replications",), "x", ["replications"]),
    (("consumer_range",), 10**6, ["consumer_range"]), (("consumer_range",), 0, ["consumer_range"]),
    (("consumers",), 3, ["consumers"]), (("consumers", "gov"), "absolute", ["consumers"]),
    (("consumers", "gov", "loss"), "nope", ["loss"]), (("consumers", "gov", "weight"), 2, ["consumers.gov"]),
    (("consumers", "drug", "side_information"), True, ["side_information"]),
    (("consumers", "drug", "side_information"), [9], ["side_information"]), (("seed",), -1, ["seed"]),
    (("priors",), 3, ["priors"]), (("colour",), "red", ["unknown keys"]), (("true_values",), None, ["true_values"]),
]


def test_dpinfer_compare_refuses_bad_configs_by_field(tmp_path, capsys):
    import json as _json

    from dpinfer.io.release.toml import toml_dumps

    for path, junk, names in CONFIG_CASES:
        document = _json.loads(_json.dumps(COMPARE_CONFIG))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if junk is None:
            del parent[path[-1]]
        else:
            parent[path[-1]] = junk
        config = tmp_path / "study.toml"
        config.write_text(toml_dumps(document, ""), encoding="utf-8")
        _cli_refuses(["compare", "--config", str(config), "--out", str(tmp_path / "out")], names, capsys)


def test_dpinfer_compare_refuses_bad_options_by_name(tmp_path, capsys):
    out = str(tmp_path / "out")
    for argv in (["--preset", "midwest", "--replications", "0"],  # was silently 100
                 ["--preset", "midwest", "--replications", "-1"],  # was a traceback
                 ["--preset", "seed002", "--replications", "5"],  # was silently ignored (an exact preset)
                 ["--preset", "nope"], ["--config", str(tmp_path / "missing.toml")]):
        _cli_refuses(["compare", *argv, "--out", out], ["replications", "preset", "config"], capsys)


SHIPPED_NMF = Path(__file__).resolve().parents[1] / "models" / "synthetic_state_nmf"
NMF_CLI_BAD = {
    "--state": ["", "abc", "99", "-19", "1.5"], "--max-minutes": ["-1", "nan", "inf", "abc"],
    "--draws": ["0", "-1", "abc"], "--tune": ["-1", "abc"], "--chains": ["0", "abc"], "--seed": ["-1", "abc"],
    "--checkpoint-every": ["-1", "abc"], "--truth": ["missing.parquet"], "--areas": ["missing.csv"],
    "--leaves": ["Nation"], "--cells": ["x"], "--inference": ["bayes"], "--uncertainty": ["x"], "--leaf-sizes": ["x"],
}


def test_dpinfer_nmf_refuses_bad_options_by_name_before_fitting(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for option, tokens in NMF_CLI_BAD.items():
        for token in tokens:
            head = ["nmf", str(SHIPPED_NMF), "--out", "n"] + ([] if option == "--state" else ["--state", "19"])
            names = [option.lstrip("-"), "plan"] if option == "--areas" else [option.lstrip("-")]
            _cli_refuses(head + [option, token, "--max-minutes", "0.05"] if option != "--max-minutes"
                         else head + [option, token], names, capsys)
    (tmp_path / "plan.csv").write_text("GEOID20,district\n")
    for extra, names in ((["--probability", "pop > 3"], ["probabilit"]),  # was silently ignored
                         (["--partial"], ["partial"]),  # was silently ignored
                         (["--truth", str(tmp_path / "plan.csv")], ["truth"])):  # was pyarrow's "magic bytes"
        _cli_refuses(["nmf", str(SHIPPED_NMF), "--state", "19", "--out", "n", *extra], names, capsys)


@pytest.fixture(scope="module")
def stored_fit(tmp_path_factory):
    """A stored fit of the shipped state's 22 block groups (draws made up: Poisson(3)) and a
    plan of its blocks (each block group's blocks in one of 3 districts)."""
    import json as _json

    import arviz as az
    import pandas as pd

    from dpinfer.io.nmf.layout import LEVELS
    from dpinfer.io.nmf.reading import block_geocodes
    from dpinfer.io.nmf.store import geography, write_posterior
    from dpinfer.io.nmf.table import census_table

    root = tmp_path_factory.mktemp("areas")
    table = census_table(dp.read_nmf(SHIPPED_NMF, 19, levels=LEVELS[:5]), "Block_Group", "pl94-28")
    counts = np.random.default_rng(3).poisson(3, size=(2, 20, len(table.leaves), len(table.cells)))
    idata = az.from_dict({"posterior": {"counts": counts}}, dims={"counts": ["geocode", "cell"]}, coords=table.coords)
    idata["posterior"].attrs["dpinfer_convergence"] = _json.dumps(
        {"converged": True, "max_rhat": 1.0, "min_ess_bulk": 500.0, "min_ess_tail": 500.0})
    blocks = block_geocodes(SHIPPED_NMF, 19)
    store = write_posterior(root / "posterior.zarr", idata,
                            geography_group=geography(table.leaves, "Block_Group", table.cells.names, blocks))
    leaves = list(table.leaves)
    leaf_of = np.array([next(i for i, g in enumerate(leaves) if b.startswith(g)) for b in blocks])
    plan = pd.DataFrame({"GEOID20": [b[-16:-5] + b[-4:] for b in blocks], "district": leaf_of % 3})
    plan.to_csv(root / "plan.csv", index=False)
    return store, plan, root / "plan.csv"


SUMMARISE_ARGUMENTS = {"probabilities": lambda x: isinstance(x, (list, tuple)) and len(x) == 0,
                       "interval": open_unit, "partial": lambda x: isinstance(x, bool),
                       "name": lambda x: isinstance(x, str) and x == "counts",
                       "geoid_column": lambda x: x is None or (isinstance(x, str) and x == "GEOID20"),
                       "area_column": lambda x: x is None or (isinstance(x, str) and x == "district"),
                       "draws": lambda x: False, "plan": lambda x: False}
SUMMARISE_FOUND = [
    dict(argument="partial", junk="yes"),  # accepted as True
    dict(argument="probabilities", junk=5),  # "'int' object is not iterable"
    dict(argument="area_column", junk=np.array([1.0, 2.0])),  # numpy's "truth value ... ambiguous"
    dict(argument="draws", junk=5),  # AttributeError: no posterior
    dict(argument="name", junk=None),  # "the fit has no draws None": named no argument
    dict(argument="plan", junk="\x00"),  # "embedded null byte": named no argument
]
SUMMARISE = dict(argument=st.sampled_from(sorted(SUMMARISE_ARGUMENTS)),
                 junk=st.one_of(JUNK, st.sampled_from(["pop > 3", "share_vap_hisp >", "x", ["pop > 3", 5]])))


def _summarise_areas_refuses_junk_by_name(stored_fit, argument, junk):
    if SUMMARISE_ARGUMENTS[argument](junk):
        return
    store, plan, _ = stored_fit
    kwargs = dict(draws=store, plan=plan) | {argument: junk}
    names = {"draws": ("draws", "stored"), "plan": ("plan",),
             "probabilities": ("probabilit",)}.get(argument, (argument,))
    try:
        summary = dp.summarise_areas(kwargs.pop("draws"), kwargs.pop("plan"), **kwargs)
    except (ValueError, TypeError, FileNotFoundError) as err:
        assert any(n in str(err) for n in names), f"the error does not name {argument!r}: {err}"
        return
    events = [junk] if isinstance(junk, str) else junk
    if argument == "probabilities" and isinstance(events, (list, tuple)) and all(isinstance(e, str) for e in events):
        # an event or a list of them is the argument's type (its docstring): taken, each must be reported
        reported = set(summary.probabilities["event"])
        assert all(e in reported for e in events), (events, reported)
        return
    pytest.fail(f"summarise_areas accepted {argument}={junk!r}")


def test_summarise_areas_refuses_junk_by_name(stored_fit):
    fuzz(FAST, lambda argument, junk: _summarise_areas_refuses_junk_by_name(stored_fit, argument, junk),
         SUMMARISE, SUMMARISE_FOUND)


@pytest.mark.validation
def test_summarise_areas_refuses_junk_by_name_long(stored_fit):
    fuzz(LONG, lambda argument, junk: _summarise_areas_refuses_junk_by_name(stored_fit, argument, junk),
         SUMMARISE, SUMMARISE_FOUND)


def test_dpinfer_areas_refuses_bad_input_by_name(stored_fit, tmp_path, capsys):
    store, _, plan = stored_fit
    out = ["--out", str(tmp_path / "a.csv")]
    for argv, names in (
            ([str(store), str(plan), "--interval", "1.5"], ["interval"]),
            ([str(store), str(plan), "--interval", "abc"], ["interval"]),
            ([str(store), str(plan), "--probability", "pop >> 3"], ["probability"]),  # named only "event"
            ([str(store), str(plan), "--probability", "nonsense > 0.5"], ["probability"]),
            ([str(tmp_path / "missing.zarr"), str(plan)], ["stored fit"]),
            ([str(plan), str(plan)], ["stored dpinfer fit"]),  # xarray's "no backend" message
            ([str(store), str(tmp_path / "missing.csv")], ["plan"]),
            ([str(store), str(plan), "--geoid-column", "nope"], ["geoid_column"]),
            ([str(store), str(plan), "--area-column", "nope"], ["area_column"]),
            ([str(store), "--tabulation", "nope"], ["tabulation"]),
            ([str(store)], ["plan"])):
        _cli_refuses(["areas", *argv, *out], names, capsys)


def test_a_variance_too_large_for_its_noise_table_is_refused_by_name():
    """Found by the long fuzz run: sigma2 = 3.3e16 asked for a noise table of billions of values
    and the process was killed for memory; it is refused, naming sigma2 and its largest value."""
    nested = dp.NestedMeasurements([-1, 0, 0], [1, 2], 2)
    with pytest.raises(ValueError, match=r"m: sigma2 = 3\.3e\+16 .* sigma2 must be at most 2\.2439e\+10"):
        nested.measure("m", [0, 1, 2], [[0], [1]], np.ones((3, 2), int), 3.3e16)
    nested.measure("m", [0, 1, 2], [[0], [1]], np.ones((3, 2), int), 2.2e10)  # the largest is taken
