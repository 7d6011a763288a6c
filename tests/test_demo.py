"""The shipped census extract and the command line (the demo itself runs in `make demo`)."""

import pytest

from dpinfer.cli import main
from dpinfer.demo import load_midwest


def test_shipped_midwest_extract_matches_the_source():
    data = load_midwest()
    assert len(data) == 437
    assert data.groupby("state").size().to_dict() == {"IL": 102, "IN": 92, "MI": 83, "OH": 88, "WI": 72}
    adams = data[(data["county"] == "ADAMS") & (data["state"] == "IL")].iloc[0]
    assert (adams["population"], adams["american_indian"]) == (66090, 98)
    assert (data["american_indian"] >= 0).all() and (data["american_indian"] <= data["population"]).all()


def test_cli_lists_commands_and_rejects_unknown_ones(capsys):
    main(["--help"])
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown command 'nope'"):
        main(["nope"])


def test_demo_rejects_an_unknown_state():
    from dpinfer.demo import run

    with pytest.raises(ValueError, match="state must be one of"):
        run(state="XX")


def test_demo_plot_is_a_png_with_a_row_per_county(tmp_path):
    import numpy as np
    import pandas as pd
    from matplotlib.image import imread

    from dpinfer.demo import plot_intervals

    n = 7
    table = pd.DataFrame({"county": [f"c{i}" for i in range(n)], "true": np.arange(n) * 10,
                          "release": np.arange(n) * 10 - 3, "dpinfer median": np.arange(n) * 10})
    lo, hi = np.arange(n) * 10 - 5, np.arange(n) * 10 + 5
    path = plot_intervals(tmp_path / "demo.png", table, lo, hi, lo - 2, hi + 2, "XX")
    image = imread(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[0] > 100 and image.shape[1] > 100
