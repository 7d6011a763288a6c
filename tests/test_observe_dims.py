"""``dims=`` on every public ``observe`` means what it means in PyMC: one name is a one-axis
tuple (issue 40: a plain string was once split into letters, adding coords ``c``, ``e``, ``l``)."""

import numpy as np
import pymc as pm
import pytest

import dpinfer as dp

CELLS = ["a", "b", "c"]
TOTAL = dp.Invariants.total(3)

MECHANISMS = {
    "DoubleGeometric": dp.DoubleGeometric(0.5),
    "DiscreteGaussian": dp.DiscreteGaussian(2.0),
    "ClampedGeometric": dp.ClampedGeometric(0.5, 0, 10),
    "Conditioned": dp.Conditioned(dp.DoubleGeometric(0.5), TOTAL, nonnegative=True),
    "GeneralizedLaplace": dp.GeneralizedLaplace(1.0, TOTAL, "l1"),
    "GeneralizedGaussian": dp.GeneralizedGaussian(2.0, TOTAL, epsilon=1.0),
}


@pytest.mark.parametrize("dims", ["cell", ("cell",), ["cell"]])
@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_a_name_or_a_tuple_of_one_name_is_one_axis(name, dims):
    with pm.Model(coords={"cell": CELLS}) as model:
        x = pm.Poisson("x", 5.0, dims="cell")
        MECHANISMS[name].observe("y", x, observed=np.array([4, 6, 5]), dims=dims)
    assert model.named_vars_to_dims["y"] == ("cell",)
    assert set(model.coords) == {"cell"}


def test_multilevel_release_takes_a_name():
    with pm.Model(coords={"cell": ["a", "b"]}) as model:
        x = pm.Poisson("x", 3.0, dims="cell")
        dp.MultiLevelGeometric([1.0, 0.5], lower=0, upper=4).observe("y", x, observed=[[3, 2], [1, 2]], dims="cell")
    assert model.named_vars_to_dims["y"] == ("cell",)
    assert set(model.coords) == {"cell"}


def test_two_axes_take_a_tuple_of_names():
    with pm.Model(coords={"row": ["r0", "r1"], "col": ["c0", "c1", "c2"]}) as model:
        x = pm.Poisson("x", 5.0, dims=("row", "col"))
        dp.DoubleGeometric(0.5).observe("y", x, observed=np.full((2, 3), 5), dims=["row", "col"])
    assert model.named_vars_to_dims["y"] == ("row", "col")


@pytest.mark.parametrize("dims", [3, ("cell", 3), {"cell": 3}])
def test_anything_else_is_refused_naming_dims(dims):
    with pm.Model(coords={"cell": CELLS}):
        x = pm.Poisson("x", 5.0, dims="cell")
        with pytest.raises(TypeError, match="dims must be a dimension name or a tuple of names"):
            dp.DoubleGeometric(0.5).observe("y", x, observed=np.array([4, 6, 5]), dims=dims)


def test_a_release_file_observes_with_a_name(tmp_path):
    path = dp.write_release(tmp_path / "release.toml", dp.DoubleGeometric(0.5), np.array([4, 6, 5]), name="y")
    release = dp.read_release(path)
    with pm.Model(coords={"cell": CELLS}) as model:
        x = pm.Poisson("x", 5.0, dims="cell")
        release.observe(x, dims="cell")
    assert model.named_vars_to_dims["y"] == ("cell",)
    assert set(model.coords) == {"cell"}


def test_grouped_negative_binomial_takes_a_list_of_names():
    with pm.Model(coords={"area": ["u", "v"], "cell": ["a", "b"]}) as model:
        dp.GroupedNegativeBinomial("x", np.full((2, 2), 3.0), 2.0, 1.0, np.array([0, 0]), dims=["area", "cell"])
    assert model.named_vars_to_dims["x"] == ("area", "cell")
    assert set(model.coords) == {"area", "cell"}
