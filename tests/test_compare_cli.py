"""``dpinfer compare``: config files and the seeds' presets (their published numbers)."""

import math

import numpy as np
import pandas as pd
import pytest

from dpinfer.cli import main
from dpinfer.utility import presets

CONFIG = """
target = {kind = "approximate", epsilon = 1.0, delta = 1e-5}
families = ["Laplace", "DoubleGeometric", "Gaussian"]
true_values = [0, 3, 10]
levels = ["release", "consumer"]
consumer_range = 4
[consumers.government]
loss = "absolute"
[priors]
flat = [0.2, 0.2, 0.2, 0.2, 0.2]
"""


def test_config_file_gives_a_table_and_a_png(tmp_path, capsys):
    config = tmp_path / "study.toml"
    config.write_text(CONFIG)
    main(["compare", "--config", str(config), "--out", str(tmp_path / "out")])
    table = pd.read_csv(tmp_path / "out" / "compare.csv")
    assert (tmp_path / "out" / "compare.png").stat().st_size > 10_000
    b = 1 / (1 - 2 * math.log1p(-1e-5))  # seed 004 Theorem 3 at equal (1, 1e-5)
    mse = table[(table.mechanism == "Laplace") & (table.metric == "mse")].value.item()
    assert mse == pytest.approx(2 * b * b, rel=1e-9)
    remap = table[(table.mechanism == "DoubleGeometric") & (table.metric == "minimax risk, optimal remap")]
    tailored = table[(table.mechanism == "DoubleGeometric") & (table.metric == "minimax risk, tailored mechanism")]
    assert remap.value.item() == pytest.approx(tailored.value.item(), rel=1e-7)  # Theorem 1
    bayes = table[(table.mechanism == "DoubleGeometric") & (table.setting == "government, prior flat")]
    assert set(bayes.metric) == {"Bayes risk, raw release", "Bayes risk, Bayes remap",
                                 "Bayes risk, tailored mechanism"}
    assert "figure:" in capsys.readouterr().out


@pytest.mark.parametrize("text, message", [
    ("target = {kind = 'pure', epsilon = 1.0}\ntrue_values = [1]\ncolour = 'red'", "unknown keys"),
    ("true_values = [1]", "'target' and 'true_values' are required"),
    ("target = {kind = 'renyi', alpha = 2}\ntrue_values = [1]", "target must be"),
    ("target = {kind = 'approximate', epsilon = 1.0}\ntrue_values = [1]", "needs 'delta'"),
])
def test_bad_config_names_the_problem(tmp_path, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(SystemExit, match=message):
        main(["compare", "--config", str(config), "--out", str(tmp_path)])


def test_seed002_preset_shows_proposition_1_and_consistency():
    table = presets.seed002(ns=(50, 500, 5000), epsilons=(0.5,), proportions=(0.05, 0.25, 0.5))
    wide = table.pivot_table(index=["n", "p"], columns="mechanism", values="bias")
    # Proposition 1: same sign (towards the midpoint), BIT no more biased than truncated
    assert np.all(np.abs(wide["BIT Laplace"]) <= np.abs(wide["truncated Laplace"]) + 1e-15)
    assert np.all(np.sign(wide["BIT Laplace"]) == np.sign(wide["truncated Laplace"]))
    # MSE <= 2 b^2 (note §3.3) with b = O(1/n): MSE falls with n and n^2 MSE stays bounded by
    # 2 (n b)^2 (Proposition 2: MSE-consistency at rate n^-2; it tends to Laplace's 2 / eps^2)
    assert np.all(table["mse"] <= 2 * table["scale"] ** 2 * (1 + 1e-12))
    bound = 2 * (table["n"] * table["scale"]).max() ** 2
    for (mech, p), rows in table.groupby(["mechanism", "p"]):
        assert np.all(np.diff(rows["mse"]) < 0), (mech, p)
        assert np.all(rows["n2_mse"] <= bound * (1 + 1e-12)), (mech, p)


def test_seed004_preset_reproduces_the_valid_comparisons():
    out = presets.seed004(epsilons=(1.0,), deltas=(1e-5,), monte_carlo=100_000)
    row = out["sd"].iloc[0]
    # reference note 004 §3.6 / T10 at (1, 1e-5): 1.629, 0.144, 0.234
    assert (row["Var Log / Var Lap"], row["Var Lap / Var Gauss"], row["Var Log / Var Gauss"]) == \
        pytest.approx((1.629, 0.144, 0.234), abs=5.01e-4)
    assert list(out["separators"].iloc[:, 1]) == pytest.approx([1.563574, 0.3651300, 0.004692828], rel=1e-6)
    withdrawn = out["withdrawn"]
    assert np.all(withdrawn["true delta (Monte Carlo)"] - 5 * withdrawn["standard error"] > 1e-4)
