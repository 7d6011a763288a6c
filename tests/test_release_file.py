"""Release files (dpinfer.io.release; issue 14, part 1): a manifest (TOML) plus a values
file, read and written.

* every mechanism class of dpinfer.mechanisms round-trips through its manifest, as TOML text:
  the rebuilt mechanism has the same class, public state, privacy and log-likelihood;
* values with an index, several index columns, two-way tables, floats and Parquet survive
  write -> read;
* the gallery's four manifests give the mechanism and values that each model's fit.py builds;
* Release.observe registers the release in a PyMC model (also through a declared query);
* bad input fails with a ReleaseFileError naming the manifest and the field;
* the published JSON Schema is the one the code builds, lists the code's families and
  constructor parameters, and accepts exactly the manifests the reader accepts (checked with a
  small validator of the JSON Schema subset it uses; jsonschema is not a dependency).
"""

from __future__ import annotations

import datetime
import importlib.util
import inspect
import json
import re
import tomllib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pymc as pm
import pytest

import dpinfer as dp
import dpinfer.mechanisms as mechanisms
from dpinfer.io.release import (
    FAMILIES,
    FORMAT,
    SCHEMA_PATH,
    ReleaseFileError,
    mechanism_from_manifest,
    mechanism_to_manifest,
    read_release,
    release_schema,
    toml_dumps,
    write_release,
)
from dpinfer.io.release.mechanism import _fingerprint
from dpinfer.lattice.coupling import MeetingTimes
from dpinfer.mechanisms.records import releases_of

ROOT = Path(__file__).resolve().parents[1]
GALLERY = ["delinquent_children_4x4", "midwest_american_indian", "midwest_state_totals",
           "sex_by_age_congenial"]


# ====================================================================== mechanisms and points
def _certified_l2():
    """A GeneralizedLaplace whose MCMC releases carry a TV certificate, built as certify()
    builds it (certify itself runs hundreds of coupled chains)."""
    inv = dp.Invariants.total(3)
    times = MeetingTimes(tau=np.array([12, 15, 20, 14, 18, 25, 13, 16, 22, 11] * 30), lag=10,
                         max_iterations=10**6)
    mech = dp.GeneralizedLaplace(0.5, inv, "l2", iterations=times.iterations_for(0.05))
    mech.certified_tv, mech.certified_level, mech.coupling_result = 0.05, 0.95, times
    return mech


CASES = {
    "Laplace": lambda: dp.Laplace(0.5, 2.0, "substitution"),
    "DoubleGeometric": lambda: dp.DoubleGeometric(0.3, 2),
    "ClampedGeometric": lambda: dp.ClampedGeometric(0.5, 0, 10),
    "ClampedGeometric-one-sided": lambda: dp.ClampedGeometric(0.5, -2),
    "Gaussian": lambda: dp.Gaussian(1.0, 1e-5),
    "Gaussian.from_sigma": lambda: dp.Gaussian.from_sigma(2.0, delta=1e-6),
    "DiscreteGaussian": lambda: dp.DiscreteGaussian(2.0, delta=1e-7),
    "DiscreteGaussian.from_privacy": lambda: dp.DiscreteGaussian.from_privacy(1.0, 1e-6),
    "TruncatedLaplace": lambda: dp.TruncatedLaplace(1.0, 0, 10),
    "TruncatedLaplace-conservative": lambda: dp.TruncatedLaplace(1.0, 0, 10, scale="conservative"),
    "TruncatedLaplace-given-scale": lambda: dp.TruncatedLaplace(1.0, 0, 10, scale=3.0),
    "BITLaplace": lambda: dp.BITLaplace(1.0, 0, 10),
    "BITLaplace-one-sided": lambda: dp.BITLaplace(1.0, 0),
    "Logistic": lambda: dp.Logistic(1.0, 1e-5),
    "Logistic-pure": lambda: dp.Logistic(1.0),
    "Logistic.from_scale": lambda: dp.Logistic.from_scale(2.0, 1e-6),
    "Subbotin": lambda: dp.Subbotin(3, 1.0, 1e-5),
    "Subbotin.from_scale": lambda: dp.Subbotin.from_scale(1.5, 2.0, 1e-6),
    "MultiLevelGeometric": lambda: dp.MultiLevelGeometric([1.0, 0.5, 0.2]),
    "MultiLevelGeometric-clamped": lambda: dp.MultiLevelGeometric([1.0, 0.5], lower=0, upper=20),
    "RandomizedResponse": lambda: dp.RandomizedResponse(0.75, 2),
    "RandomizedResponse-fraction": lambda: dp.RandomizedResponse(Fraction(2, 3)),
    "RandomizedResponse.from_epsilon": lambda: dp.RandomizedResponse.from_epsilon(1.0),
    "Conditioned-total": lambda: dp.Conditioned(dp.DoubleGeometric(0.5), dp.Invariants.total(3)),
    "Conditioned-groups-nonnegative": lambda: dp.Conditioned(
        dp.DoubleGeometric(0.5), dp.Invariants.groups(["a", "b", "a", "b"]), nonnegative=True),
    "Conditioned-margins-DiscreteGaussian": lambda: dp.Conditioned(
        dp.DiscreteGaussian(1.5), dp.Invariants.margins((2, 3), [(0,), (1,)])),
    "Conditioned-matrix": lambda: dp.Conditioned(
        dp.DoubleGeometric(0.5), dp.Invariants.from_matrix([[1, 1, 1], [1, 0, 0]])),
    "GeneralizedGaussian": lambda: dp.GeneralizedGaussian(1.0, dp.Invariants.total(3), epsilon=0.5),
    "GeneralizedLaplace-l1": lambda: dp.GeneralizedLaplace(0.5, dp.Invariants.total(3)),
    "GeneralizedLaplace-l2-walk": lambda: dp.GeneralizedLaplace(
        0.5, dp.Invariants.total(3), "l2", iterations=7, chain="walk"),
    "GeneralizedLaplace-l2-certified": _certified_l2,
}


def points(mech) -> list:
    """(release, true values) pairs at which two equal laws must agree."""
    inv = getattr(mech, "invariants", None)
    if inv is not None:
        x = np.full(inv.n_cells, 5, dtype=np.int64)
        basis = np.asarray(inv.kernel_basis())
        w = np.array([1, -2, 1, 3][: basis.shape[1]])
        return [(x + basis @ w, x), (x, x), (x + basis @ w, x + 1 - 1)]
    if isinstance(mech, dp.MultiLevelGeometric):
        release = np.array([[3, 4, 6], [0, 1, 0], [10, 9, 12]])[:, : mech.n_levels]
        return [(release, np.array([2, 0, 11])), (release, np.array([3, 1, 10]))]
    if isinstance(mech, dp.RandomizedResponse):
        if mech.attributes == 2:
            return [(np.array([3, 1, 2, 4]), np.array([4, 2, 1, 3])),
                    (np.array([0, 5, 5, 0]), np.array([2, 3, 3, 2]))]
        return [(np.array([5, 3]), np.array([4, 4])), (np.array([1, 7]), np.array([6, 2]))]
    return [(np.array([1, 3, 5, 0, 10]), np.array([0, 3, 7, 2, 9])),
            (np.array([0, 2, 9, 4, 10]), np.array([4, 4, 4, 4, 4]))]


def same_privacy(a, b) -> bool:
    def claim(m):
        try:
            return m.privacy
        except Exception as err:  # noqa: BLE001 - e.g. an approximate-DP base conditioned
            return type(err), str(err)
    return claim(a) == claim(b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_mechanism_round_trips_through_its_manifest(case):
    mech = CASES[case]()
    fragment = mechanism_to_manifest(mech)
    text = toml_dumps(fragment)
    rebuilt = mechanism_from_manifest(tomllib.loads(text))
    assert type(rebuilt) is type(mech)
    assert same_privacy(rebuilt, mech)
    assert _fingerprint(rebuilt) == _fingerprint(mech)
    for release, truth in points(mech):
        np.testing.assert_array_equal(rebuilt.log_likelihood(release, truth),
                                      mech.log_likelihood(release, truth))
    if "privacy" in fragment["mechanism"]:
        assert fragment["mechanism"]["privacy"]["epsilon"] == mech.privacy.epsilon


CLASSMETHODS = {  # (family, constructor): (manifest parameters, the direct call)
    ("Gaussian", "from_sigma"): ({"sigma": 2.0, "delta": 1e-6, "sensitivity": 1.0, "neighbour": "add-remove"},
                                 lambda: dp.Gaussian.from_sigma(2.0, delta=1e-6)),
    ("DiscreteGaussian", "from_privacy"): ({"epsilon": 1.0, "delta": 1e-6, "sensitivity": 1,
                                            "neighbour": "add-remove"},
                                           lambda: dp.DiscreteGaussian.from_privacy(1.0, 1e-6)),
    ("Logistic", "from_scale"): ({"scale": 2.0, "delta": 1e-6, "sensitivity": 1.0, "neighbour": "add-remove"},
                                 lambda: dp.Logistic.from_scale(2.0, 1e-6)),
    ("Logistic", "per_coordinate"): ({"epsilon": 1.0, "delta": 1e-5, "dimension": 4, "sensitivity": 1.0,
                                      "neighbour": "add-remove"},
                                     lambda: dp.Logistic.per_coordinate(1.0, 1e-5, 4)),
    ("Subbotin", "from_scale"): ({"r": 1.5, "scale": 2.0, "delta": 1e-6, "sensitivity": 1.0,
                                  "neighbour": "add-remove"},
                                 lambda: dp.Subbotin.from_scale(1.5, 2.0, 1e-6)),
    ("Subbotin", "per_coordinate"): ({"r": 3, "epsilon": 1.0, "delta": 1e-5, "dimension": 4,
                                      "sensitivity": 1.0, "neighbour": "add-remove"},
                                     lambda: dp.Subbotin.per_coordinate(3, 1.0, 1e-5, 4)),
    ("RandomizedResponse", "from_epsilon"): ({"epsilon": 1.0, "attributes": 2},
                                             lambda: dp.RandomizedResponse.from_epsilon(1.0, 2)),
}


@pytest.mark.parametrize("family, constructor", sorted(CLASSMETHODS))
def test_a_manifest_may_name_a_classmethod_constructor(family, constructor):
    params, direct = CLASSMETHODS[family, constructor]
    rebuilt = mechanism_from_manifest({"family": family, "constructor": constructor, **params})
    assert _fingerprint(rebuilt) == _fingerprint(direct())


def test_every_classmethod_constructor_has_a_case():
    assert set(CLASSMETHODS) == {(f, c) for f, cs in FAMILIES.items() for c in cs if c != "__init__"}


def test_every_exported_mechanism_class_has_a_case_and_a_family():
    concrete = {name for name in mechanisms.__all__
                if inspect.isclass(getattr(mechanisms, name))
                and issubclass(getattr(mechanisms, name), mechanisms.Mechanism)
                and not inspect.isabstract(getattr(mechanisms, name))}
    assert concrete == set(FAMILIES)
    assert {type(make()).__name__ for make in CASES.values()} == concrete


def test_the_manifest_names_constructor_parameters():
    for family, constructors in FAMILIES.items():
        cls = getattr(mechanisms, family)
        for constructor, fields in constructors.items():
            signature = inspect.signature(getattr(cls, constructor) if constructor != "__init__" else cls)
            names = {f.name for f in fields} - {"certificate"}  # certify()'s result, set afterwards
            assert names <= set(signature.parameters), (family, constructor)
            required = {p.name for p in signature.parameters.values()
                        if p.default is inspect.Parameter.empty
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"invariants"}
            assert required <= {f.name for f in fields if f.required}, (family, constructor)


def test_what_public_attributes_cannot_give_is_refused_with_a_reason():
    per_coordinate = dp.Logistic.per_coordinate(1.0, 1e-5, 4)
    with pytest.raises(ReleaseFileError, match="does not keep its dimension publicly; pass cells"):
        mechanism_to_manifest(per_coordinate)
    rebuilt = mechanism_from_manifest(mechanism_to_manifest(per_coordinate, cells=4))
    assert _fingerprint(rebuilt) == _fingerprint(per_coordinate)
    with pytest.raises(ReleaseFileError, match=r"dimension=3\) does not give this mechanism"):
        mechanism_to_manifest(per_coordinate, cells=3)
    vector = dp.Subbotin(2, 1.0, 1e-5, dimension=3)
    with pytest.raises(ReleaseFileError, match="does not keep d publicly"):
        mechanism_to_manifest(vector)
    assert _fingerprint(mechanism_from_manifest(mechanism_to_manifest(vector, cells=3))) == \
        _fingerprint(vector)
    odd = dp.RandomizedResponse(Fraction(1234567, 1999999))
    with pytest.raises(ReleaseFileError, match='keeps its exact p privately.*write p = "a/b"'):
        mechanism_to_manifest(odd)
    by_hand = mechanism_from_manifest({"family": "RandomizedResponse", "p": "1234567/1999999"})
    assert same_privacy(by_hand, odd)
    large = dp.GeneralizedGaussian(3.0, dp.Invariants.total(12), epsilon=0.5)
    with pytest.raises(ReleaseFileError, match="epsilon only through privacy, which is unverified"):
        mechanism_to_manifest(large)

    class MyGeometric(dp.DoubleGeometric):
        pass

    with pytest.raises(ReleaseFileError, match="MyGeometric is not a dpinfer mechanism family"):
        mechanism_to_manifest(MyGeometric(0.5))


# ========================================================================== write -> read
def test_write_then_read_values_with_an_index(tmp_path):
    mech = dp.DoubleGeometric(0.5)
    truth = np.array([5, 12, 8, 15])
    values = mech.release(truth, np.random.default_rng(1))
    manifest = write_release(tmp_path / "counts.toml", mech, values, index=["a", "b", "c", "d"],
                             name="counts", description="four counts", units="people",
                             provenance="synthetic, seed 1", extra_columns={"truth": truth},
                             dims="cell", created=datetime.date(2026, 11, 25))
    assert manifest == tmp_path / "counts.toml" and (tmp_path / "counts.csv").is_file()
    release = read_release(manifest)
    np.testing.assert_array_equal(release.values, values)
    assert release.values.dtype == np.int64
    assert list(release.index) == ["a", "b", "c", "d"] and release.index.name == "cell"
    assert release.cell_labels == ["a", "b", "c", "d"]
    assert release.coords == {"cell": ["a", "b", "c", "d"]}
    np.testing.assert_array_equal(release.table["truth"], truth)
    assert (release.name, release.description, release.units) == ("counts", "four counts", "people")
    assert release.manifest["release"]["created"] == datetime.date(2026, 11, 25)
    assert _fingerprint(release.mechanism) == _fingerprint(mech)
    text = manifest.read_text()
    assert text.startswith("# dpinfer release manifest") and 'format = "dpinfer-release/1"' in text
    assert read_release(tmp_path / "counts.toml").name == "counts"


def test_write_then_read_several_index_columns_and_group_totals(tmp_path):
    states = ["IL", "IL", "IN", "IN", "IN"]
    mech = dp.Conditioned(dp.DoubleGeometric(0.5), dp.Invariants.groups(states))
    truth = np.array([10, 3, 7, 0, 12])
    values = mech.release(truth, np.random.default_rng(2))
    index = pd.MultiIndex.from_arrays([["Adams", "Bond", "Adams", "Clay", "Dale"], states],
                                      names=["county", "state"])
    manifest = write_release(tmp_path / "release.toml", mech, values, index=index, name="groups",
                             dims=["county"])
    release = read_release(tmp_path)  # the directory holding release.toml
    np.testing.assert_array_equal(release.values, values)
    assert release.cell_labels[0] == "Adams, IL" and isinstance(release.index, pd.MultiIndex)
    np.testing.assert_array_equal(release.invariant_values, [13, 19])
    assert release.manifest["invariants"] == {"kind": "group_totals", "group_column": "state",
                                              "values": [13, 19]}  # the index column holds the groups
    assert _fingerprint(release.mechanism) == _fingerprint(mech)
    assert manifest.name == "release.toml"


def test_write_then_read_a_two_way_table(tmp_path):
    inv = dp.Invariants.margins((3, 2), [(0,), (1,)])
    mech = dp.Conditioned(dp.DoubleGeometric(0.5), inv)
    truth = np.array([[4, 1], [0, 6], [3, 3]])
    values = pd.DataFrame(mech.release(truth, np.random.default_rng(3)), columns=["yes", "no"],
                          index=pd.Index(["r1", "r2", "r3"], name="region"))
    write_release(tmp_path / "table.toml", mech, values, name="table", dims=["region", "answer"])
    release = read_release(tmp_path / "table.toml")
    assert release.values.shape == (3, 2) and release.columns == ["yes", "no"]
    np.testing.assert_array_equal(release.values, values.to_numpy())
    assert release.cell_labels[:2] == ["r1/yes", "r1/no"]
    assert release.coords == {"region": ["r1", "r2", "r3"], "answer": ["yes", "no"]}


def test_write_then_read_floats_exactly_and_multilevel_columns(tmp_path):
    mech = dp.Gaussian.from_sigma(2.0)
    values = mech.release(np.arange(6.0), np.random.default_rng(4)) * 1e-3
    write_release(tmp_path / "g.toml", mech, values, name="gaussian")
    release = read_release(tmp_path / "g.toml")
    assert release.values.dtype == np.float64
    np.testing.assert_array_equal(release.values, values)  # bit for bit through the CSV
    multi = dp.MultiLevelGeometric([1.0, 0.5, 0.25], lower=0)
    levels = multi.release(np.array([3, 0, 8]), np.random.default_rng(5))
    write_release(tmp_path / "m.toml", multi, levels, name="levels")
    release = read_release(tmp_path / "m.toml")
    assert release.columns == ["level_0", "level_1", "level_2"]
    np.testing.assert_array_equal(release.values, levels)
    per_coordinate = dp.Logistic.per_coordinate(1.0, 1e-5, 6)  # its dimension: the 6 values
    write_release(tmp_path / "l.toml", per_coordinate, values, name="vector")
    assert _fingerprint(read_release(tmp_path / "l.toml").mechanism) == _fingerprint(per_coordinate)


def test_write_then_read_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    mech = dp.DiscreteGaussian(2.0)
    values = mech.release(np.array([10, 20, 30]), np.random.default_rng(6))
    write_release(tmp_path / "p.toml", mech, values, index=pd.Index([101, 102, 103], name="pid"),
                  name="parquet", values_file="values.parquet")
    release = read_release(tmp_path / "p.toml")
    np.testing.assert_array_equal(release.values, values)
    assert list(release.index) == [101, 102, 103]  # Parquet keeps the labels' type


def test_write_release_refuses_what_it_cannot_write(tmp_path):
    mech = dp.Conditioned(dp.DoubleGeometric(0.5), dp.Invariants.total(3))
    with pytest.raises(ReleaseFileError, match=r"invariants: the release's invariant values are \[9\]"):
        write_release(tmp_path / "r.toml", mech, [2, 3, 4], invariants=[10], name="r")
    with pytest.raises(ReleaseFileError, match="invariants: given, but DoubleGeometric holds no invariants"):
        write_release(tmp_path / "r.toml", dp.DoubleGeometric(0.5), [2, 3, 4], invariants=[9], name="r")
    with pytest.raises(ReleaseFileError, match=r"values: not a release of .*must hold whole numbers"):
        write_release(tmp_path / "r.toml", dp.DoubleGeometric(0.5), [2.5, 3, 4], name="r")
    with pytest.raises(ReleaseFileError, match=r"values: not a release of .*must lie in \[0, 10\]"):
        write_release(tmp_path / "r.toml", dp.ClampedGeometric(0.5, 0, 10), [2, 11, 4], name="r")
    with pytest.raises(ReleaseFileError, match="index: has 2 labels but the values have 3 rows"):
        write_release(tmp_path / "r.toml", dp.DoubleGeometric(0.5), [2, 3, 4], index=["a", "b"], name="r")
    assert not (tmp_path / "r.toml").exists()


# ================================================================================== gallery
def load_fit(model: str):
    spec = importlib.util.spec_from_file_location(f"gallery_fit_{model}", ROOT / "models" / model / "fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gallery_reference(model: str):
    """(mechanism, values, row labels) as the model's fit.py builds them."""
    here, fit = ROOT / "models" / model, load_fit(model)
    if model == "midwest_american_indian":
        data = pd.read_csv(here / "release.csv")
        return dp.DoubleGeometric(epsilon=fit.EPSILON), data["release"].to_numpy(), data["county"].tolist()
    if model == "midwest_state_totals":  # fit.py --states all
        data = pd.read_csv(here / "release_population.csv")
        mech = dp.Conditioned(dp.DoubleGeometric(fit.EPSILON), dp.Invariants.groups(data["state"]))
        return mech, data["release"].to_numpy(), (data["county"] + ", " + data["state"]).tolist()
    if model == "delinquent_children_4x4":
        release = pd.read_csv(here / "release.csv", index_col="county")
        s = release.to_numpy()
        mech = dp.Conditioned(dp.DoubleGeometric(fit.EPSILON), dp.Invariants.margins(s.shape, [(0,), (1,)]))
        return mech, s, release.index.tolist()
    data = pd.read_csv(here / "release.csv")
    mech = dp.Conditioned(dp.DoubleGeometric(fit.EPSILON), fit.invariants(data), nonnegative=True)
    return mech, data["release"].to_numpy(), (data["sex"] + ", " + data["age"]).tolist()


@pytest.mark.parametrize("model", GALLERY)
def test_the_gallery_manifest_gives_what_fit_py_uses(model):
    release = read_release(ROOT / "models" / model / "release.toml")
    mech, values, labels = gallery_reference(model)
    assert _fingerprint(release.mechanism) == _fingerprint(mech)
    np.testing.assert_array_equal(release.values, values)
    assert release.row_labels == labels
    truth = release.table["confidential"].to_numpy() if "confidential" in release.table else values
    np.testing.assert_array_equal(release.mechanism.log_likelihood(release.values, truth),
                                  mech.log_likelihood(values, truth))
    if release.invariants is not None:
        np.testing.assert_array_equal(release.invariant_values,
                                      mech.invariants.values(np.asarray(values).reshape(-1)))


# =================================================================================== PyMC
def test_observe_registers_the_release_in_a_model():
    release = read_release(ROOT / "models" / "midwest_american_indian" / "release.toml")
    with pm.Model(coords=release.coords) as model:
        pop = pm.Poisson("pop", 10.0, dims="county")
        rv = release.observe(pop)
    (record,) = releases_of(model)
    assert record.name == "midwest_american_indian" and record.mechanism is release.mechanism
    assert record.latent is pop and model.named_vars_to_dims[rv.name] == ("county",)
    table = read_release(ROOT / "models" / "delinquent_children_4x4" / "release.toml")
    with pm.Model() as model:  # no coords: the declared dims are not forced on the model
        x = pm.Poisson("x", 8.0, shape=(4, 4))
        table.observe(x, name="table")
    assert [r.name for r in releases_of(model)] == ["table"]
    assert isinstance(releases_of(model)[0].mechanism, dp.Conditioned)


def test_observe_applies_a_declared_query(tmp_path):
    mech = dp.DoubleGeometric(0.5)
    groups = ["north", "north", "south", "south", "south"]
    totals = np.array([7, 12])
    query = {"kind": "totals", "groups": groups, "description": "regional totals"}
    write_release(tmp_path / "q.toml", mech, totals, index=["north", "south"], name="totals",
                  query=query)
    release = read_release(tmp_path / "q.toml")
    np.testing.assert_array_equal(release.query_matrix, [[1, 1, 0, 0, 0], [0, 0, 1, 1, 1]])
    with pm.Model() as model:
        x = pm.Poisson("x", 3.0, shape=5)
        rv = release.observe(x)
    (record,) = releases_of(model)
    point = np.array([2, 4, 1, 5, 3])
    logp = model.compile_logp(vars=[rv])({"x": point})
    expected = mech.log_likelihood(totals, release.query_matrix @ point).sum()
    np.testing.assert_allclose(logp, expected, rtol=1e-12)
    assert record.latent is not x  # Q x, with x behind it


# ============================================================================== bad input
GOOD_CSV = "cell,release\na,10\nb,-2\nc,20\nd,12\n"


def base_manifest(family="DoubleGeometric") -> dict:
    manifest = {"format": FORMAT,
                "release": {"name": "bad", "values_file": "values.csv", "value_columns": ["release"],
                            "index_columns": ["cell"]},
                "mechanism": {"family": "DoubleGeometric", "epsilon": 0.5, "sensitivity": 1,
                              "neighbour": "add-remove"}}
    if family == "Conditioned":
        manifest["mechanism"] = {"family": "Conditioned", "nonnegative": False,
                                 "base": manifest["mechanism"]}
        manifest["invariants"] = {"kind": "total", "n_cells": 4, "values": [40]}
    return manifest


def write_files(tmp_path, manifest: dict, csv: str = GOOD_CSV) -> Path:
    (tmp_path / "values.csv").write_text(csv)
    path = tmp_path / "release.toml"
    path.write_text(toml_dumps(manifest))
    return path


def _set(manifest, dotted, value):
    *parents, key = dotted.split(".")
    table = manifest
    for p in parents:
        table = table[p]
    if value is _DELETE:
        del table[key]
    else:
        table[key] = value


_DELETE = object()
BAD = {
    # (family, [(dotted key, value)], csv or None, pattern)
    "unknown family": ("DoubleGeometric", [("mechanism.family", "DoubleGeometrik")], None,
                       r"mechanism\.family: unknown mechanism family 'DoubleGeometrik'; did you mean "
                       r"'DoubleGeometric'\?"),
    "unknown base family": ("Conditioned", [("mechanism.base.family", "Laplace")], None,
                            r"mechanism\.base\.family: unknown base mechanism family 'Laplace'"),
    "unknown constructor": ("DoubleGeometric", [("mechanism.constructor", "from_sigma")], None,
                            r"mechanism\.constructor: DoubleGeometric has no constructor 'from_sigma'"),
    "missing parameter": ("DoubleGeometric", [("mechanism.epsilon", _DELETE)], None,
                          r"mechanism\.epsilon: missing \(required here: epsilon, sensitivity, neighbour\)"),
    "missing neighbour": ("Conditioned", [("mechanism.base.neighbour", _DELETE)], None,
                          r"mechanism\.base\.neighbour: missing"),
    "typo in mechanism": ("DoubleGeometric", [("mechanism.epsilom", 0.5)], None,
                          r"mechanism\.epsilom: unknown key; did you mean 'epsilon'\?"),
    "typo in release": ("DoubleGeometric", [("release.value_column", ["release"])], None,
                        r"release\.value_column: unknown key; did you mean 'value_columns'\?"),
    "typo at top level": ("Conditioned", [("invariant", {"kind": "total", "n_cells": 4})], None,
                          r"invariant: unknown key; did you mean 'invariants'\?"),
    "typo in invariants": ("Conditioned", [("invariants.n_cell", 4)], None,
                           r"invariants\.n_cell: unknown key; did you mean 'n_cells'\?"),
    "wrong type": ("DoubleGeometric", [("mechanism.epsilon", "0.5")], None,
                   r"mechanism\.epsilon: must be a number, got '0\.5'"),
    "refused by the constructor": ("DoubleGeometric", [("mechanism.epsilon", -1.0)], None,
                                   r"mechanism: DoubleGeometric refused its parameters: epsilon must be"),
    "bad neighbour": ("DoubleGeometric", [("mechanism.neighbour", "add/remove")], None,
                      r"mechanism\.neighbour: must be one of \['add-remove', 'substitution'\]"),
    "privacy mismatch": ("DoubleGeometric", [("mechanism.privacy", {"epsilon": 0.3})], None,
                         r"mechanism\.privacy\.epsilon: the manifest states 0\.3 but the mechanism"),
    "broken declared total": ("Conditioned", [("invariants.values", [41])], None,
                              r"invariants\.values: the released values break the declared invariants: "
                              r"release violates the invariants: the total is 40, but a\[0\] = 41"),
    "rows vs invariants": ("Conditioned", [("invariants.n_cells", 5)], None,
                           r"invariants: cover 5 cells \(its n_cells, groups or matrix\), but the values file has 4 "
                           r"values "
                           r"\(4 rows x 1 value column\(s\)\)"),
    "invariant values length": ("Conditioned", [("invariants.values", [40, 1])], None,
                                r"invariants\.values: has 2 entries but the invariants have 1 constraint rows"),
    "invariants on a plain mechanism": ("DoubleGeometric", [("invariants", {"kind": "total", "n_cells": 4})],
                                        None, r"invariants: declared, but DoubleGeometric holds no invariants"),
    "invariants missing": ("Conditioned", [("invariants", _DELETE)], None,
                           r"invariants: missing: Conditioned holds invariants"),
    "unknown invariants kind": ("Conditioned", [("invariants.kind", "totals")], None,
                                r"invariants\.kind: unknown kind 'totals'; did you mean 'total'\?"),
    "missing value column": ("DoubleGeometric", [("release.value_columns", ["relase"])], None,
                             r"release\.value_columns: column 'relase' is not in values\.csv"),
    "missing index column": ("DoubleGeometric", [("release.index_columns", ["county"])], None,
                             r"release\.index_columns: column 'county' is not in values\.csv"),
    "non-numeric value": ("DoubleGeometric", [], "cell,release\na,10\nb,abc\nc,20\nd,12\n",
                          r"release\.value_columns: column 'release' has a non-numeric value 'abc' at "
                          r"data row 2 \(line 3"),
    "NaN value": ("DoubleGeometric", [], "cell,release\na,10\nb,\nc,20\nd,12\n",
                  r"release\.value_columns: column 'release' has a missing value \(NaN\) at data row 2"),
    "non-integer for a discrete mechanism": (
        "DoubleGeometric", [], "cell,release\na,10\nb,2.5\nc,20\nd,12\n",
        r"column 'release' has the non-integer value 2\.5 at data row 2 .*DoubleGeometric releases "
        r"whole numbers"),
    "duplicate index labels": ("DoubleGeometric", [], "cell,release\na,10\nb,2\na,20\nd,12\n",
                               r"release\.index_columns: labels must identify the rows; 'a' repeats"),
    "negative release conditioned on non-negativity": (
        "Conditioned", [("mechanism.nonnegative", True)], None,
        r"release\.values_file: the values cannot be a release of .*negative cells"),
    "release outside the clamp": (
        "DoubleGeometric", [("mechanism.family", "ClampedGeometric"), ("mechanism.lower", 0)], None,
        r"release\.values_file: the values are not a release of ClampedGeometric.*must lie in \[0, inf\]"),
    "missing values file": ("DoubleGeometric", [("release.values_file", "nope.csv")], None,
                            r"release\.values_file: no such file"),
    "values file suffix": ("DoubleGeometric", [("release.values_file", "release.toml")], None,
                           r"release\.values_file: must end in \.csv or \.parquet"),
    "missing format": ("DoubleGeometric", [("format", _DELETE)], None, r"format: missing"),
    "future format": ("DoubleGeometric", [("format", "dpinfer-release/2")], None,
                      r"format: version 'dpinfer-release/2' is not supported"),
    "dims vs axes": ("DoubleGeometric", [("release.dims", ["a", "b"])], None,
                     r"release\.dims: names 2 dim\(s\), but the values have 1 axis"),
    "group column missing": ("Conditioned", [("invariants", {"kind": "group_totals",
                                                             "group_column": "state"})], None,
                             r"invariants\.group_column: column 'state' is not in the values file"),
    "query rows": ("DoubleGeometric", [("query", {"kind": "matrix", "matrix": [[1, 1], [0, 1]]})], None,
                   r"query: has 2 rows \(released values\) but the values file holds 4"),
    "fractional query for counts": ("DoubleGeometric", [("query", {"kind": "matrix",
                                                                   "matrix": [[0.5]] * 4})], None,
                                    r"query\.matrix: must hold whole numbers"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_manifest_and_the_field(case, tmp_path):
    family, edits, csv, pattern = BAD[case]
    manifest = base_manifest(family)
    for key, value in edits:
        _set(manifest, key, value)
    path = write_files(tmp_path, manifest, csv or GOOD_CSV)
    with pytest.raises(ReleaseFileError, match=pattern) as info:
        read_release(path)
    assert str(info.value).startswith(f"{path}: {info.value.field}: ")
    assert isinstance(info.value, ValueError)


def test_more_bad_input(tmp_path):
    path = tmp_path / "release.toml"
    path.write_text("format = 'dpinfer-release/1'\n[release\n")
    with pytest.raises(ReleaseFileError, match=r"release\.toml: manifest: not valid TOML"):
        read_release(path)
    with pytest.raises(FileNotFoundError, match="no release manifest"):
        read_release(tmp_path / "missing.toml")
    certified = mechanism_to_manifest(_certified_l2())
    certified["mechanism"]["iterations"] += 1
    with pytest.raises(ReleaseFileError, match=r"mechanism\.certificate: the meeting times certify "
                                               r"tv <= 0\.05 after \d+ iterations, but the mechanism states"):
        mechanism_from_manifest(certified)
    two_way = base_manifest("Conditioned")
    two_way["release"]["value_columns"] = ["x", "y"]
    two_way["invariants"] = {"kind": "margins", "shape": [2, 2], "margins": [[0], [1]]}
    path = write_files(tmp_path, two_way, "cell,x,y\na,1,2\nb,3,4\n")
    assert read_release(path).values.shape == (2, 2)
    two_way["invariants"]["shape"] = [1, 4]
    path = write_files(tmp_path, two_way, "cell,x,y\na,1,2\nb,3,4\n")
    with pytest.raises(ReleaseFileError, match=r"invariants\.shape: is \[1, 4\], but the values form a 2 x 2"):
        read_release(path)
    with pytest.raises(ReleaseFileError, match="group_column: needs the values file"):
        mechanism_from_manifest({"mechanism": base_manifest("Conditioned")["mechanism"],
                                 "invariants": {"kind": "group_totals", "group_column": "state"}})


def test_a_curator_writes_a_manifest_by_hand(tmp_path):
    (tmp_path / "values.csv").write_text("state,county,noisy\nIL,Adams,97\nIL,Bond,39\nIN,Clay,5\n")
    (tmp_path / "release.toml").write_text(
        'format = "dpinfer-release/1"\n'
        "[release]\n"
        'name = "by_hand"\nvalues_file = "values.csv"\nvalue_columns = ["noisy"]\n'
        'index_columns = ["state", "county"]\ncreated = 2026-11-25T10:00:00Z\n'
        "[mechanism]\n"
        'family = "Conditioned"\nnonnegative = false\n'
        "[mechanism.base]\n"
        'family = "DiscreteGaussian"\nconstructor = "from_privacy"\nepsilon = 1.0\ndelta = 1e-6\n'
        'sensitivity = 1\nneighbour = "add-remove"\n'
        "[invariants]\n"
        'kind = "group_totals"\ngroup_column = "state"\nvalues = [136, 5]\n')
    release = read_release(tmp_path / "release.toml")
    expected = dp.Conditioned(dp.DiscreteGaussian.from_privacy(1.0, 1e-6),
                              dp.Invariants.groups(["IL", "IL", "IN"]))
    assert _fingerprint(release.mechanism) == _fingerprint(expected)
    assert validate(to_json(tomllib.loads((tmp_path / "release.toml").read_text())), SCHEMA) == []
    bare = {"family": "Conditioned", "nonnegative": False,
            "base": {"family": "DoubleGeometric", "epsilon": 0.5, "sensitivity": 1, "neighbour": "add-remove"}}
    for invariants in (dp.Invariants.total(3), {"kind": "total", "n_cells": 3}):
        assert _fingerprint(mechanism_from_manifest(bare, invariants=invariants)) == \
            _fingerprint(dp.Conditioned(dp.DoubleGeometric(0.5), dp.Invariants.total(3)))


# ==================================================================================== schema
SCHEMA = json.loads(SCHEMA_PATH.read_text())


def _is_type(value, name: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"object": isinstance(value, dict), "array": isinstance(value, list),
            "string": isinstance(value, str), "boolean": isinstance(value, bool), "number": number,
            "integer": number and float(value).is_integer(), "null": value is None}[name]


def validate(instance, schema: dict, root: dict | None = None) -> list[str]:
    """Errors of ``instance`` against the JSON Schema subset the release schema uses ($ref,
    type, const, enum, pattern, properties, required, additionalProperties, items, minItems,
    oneOf, allOf, if/then/else, not)."""
    root = schema if root is None else root
    if "$ref" in schema:
        return validate(instance, root["$defs"][schema["$ref"].removeprefix("#/$defs/")], root)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(instance, t) for t in types):
            return [f"{instance!r} is not of type {schema['type']}"]
    errors = []
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{instance!r} != {schema['const']!r}")
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{instance!r} not in {schema['enum']}")
    if "pattern" in schema and isinstance(instance, str) and not re.search(schema["pattern"], instance):
        errors.append(f"{instance!r} does not match {schema['pattern']}")
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        errors += [f"missing {k}" for k in schema.get("required", []) if k not in instance]
        for key, value in instance.items():
            if key in properties:
                errors += [f"{key}: {e}" for e in validate(value, properties[key], root)]
            elif schema.get("additionalProperties", True) is False:
                errors.append(f"unknown key {key}")
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0):
            errors.append(f"fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, value in enumerate(instance):
                errors += [f"[{i}]: {e}" for e in validate(value, schema["items"], root)]
    if "oneOf" in schema:
        matches = sum(not validate(instance, s, root) for s in schema["oneOf"])
        if matches != 1:
            errors.append(f"matches {matches} of oneOf, not 1")
    for sub in schema.get("allOf", []):
        errors += validate(instance, sub, root)
    if "if" in schema:
        branch = "then" if not validate(instance, schema["if"], root) else "else"
        if branch in schema:
            errors += validate(instance, schema[branch], root)
    if "not" in schema and not validate(instance, schema["not"], root):
        errors.append("matches the 'not' schema")
    return errors


def to_json(value):
    """A TOML document as JSON sees it (dates and times as ISO strings)."""
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    return value


def test_the_published_schema_is_the_one_the_code_builds():
    assert SCHEMA == json.loads(json.dumps(release_schema()))
    assert SCHEMA["properties"]["format"]["const"] == FORMAT


def test_the_schema_lists_the_code_families_and_parameters():
    defs = SCHEMA["$defs"]
    variants = [defs[ref["$ref"].removeprefix("#/$defs/")] for ref in defs["mechanism"]["oneOf"]]
    families = {v["properties"]["family"]["const"] for v in variants}
    assert families == set(FAMILIES) == {name for name in mechanisms.__all__
                                         if name in FAMILIES}
    for variant in variants:
        family = variant["properties"]["family"]["const"]
        constructor = variant["properties"].get("constructor", {}).get("const", "__init__")
        fields = FAMILIES[family][constructor]
        assert set(variant["properties"]) - {"family", "constructor", "privacy"} == {f.name for f in fields}
        assert set(variant["required"]) - {"family", "constructor"} == {f.name for f in fields if f.required}
        assert variant["additionalProperties"] is False
    assert len(variants) == sum(len(c) for c in FAMILIES.values())


@pytest.mark.parametrize("model", GALLERY)
def test_the_gallery_manifests_satisfy_the_schema(model):
    manifest = tomllib.loads((ROOT / "models" / model / "release.toml").read_text())
    assert validate(to_json(manifest), SCHEMA) == []


def test_the_schema_agrees_with_the_reader(tmp_path):
    for case in sorted(CASES):
        mech = CASES[case]()
        document = {"format": FORMAT, "release": {"name": case, "values_file": "v.csv",
                                                  "value_columns": ["v"]},
                    **mechanism_to_manifest(mech)}
        assert validate(to_json(tomllib.loads(toml_dumps(document))), SCHEMA) == [], case
    rejected = ["unknown family", "missing parameter", "typo in mechanism", "typo in release",
                "typo at top level", "wrong type", "invariants on a plain mechanism",
                "invariants missing", "unknown invariants kind", "missing format", "future format",
                "bad neighbour", "unknown base family", "unknown constructor"]
    for case in rejected:
        family, edits, _, _ = BAD[case]
        manifest = base_manifest(family)
        for key, value in edits:
            _set(manifest, key, value)
        assert validate(to_json(manifest), SCHEMA) != [], case
