"""The errors dp.sample stops with when a model cannot be fitted (dpinfer/inference/failures.py):
each deliberately misspecified model (a prior far from every release) provokes its message,
which names the release, the counts or terms involved and their numbers; and the nested
report names counts whenever box edges were reached (never an empty list)."""

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pymc as pm
import pytest
import xarray as xr

import dpinfer as dp
from dpinfer.inference import planning
from dpinfer.inference.engines.compiled.engine import _nested_report, box_gaps
from dpinfer.mechanisms.records import releases_of
from test_noisy_measurements import HIST, synthetic_state

SEX = {"sex": ["m", "f"]}


def far_prior_table():
    """2 counties x 2 cells measured once each (variance 400) and a Poisson prior of rate 10^6:
    the posterior sits ~2400 above the measurements, ~340 pilot sds, beyond the widest box."""
    rows = [(g, "detailed", s, v, 400.0) for g, values in (("01001", (10, 12)), ("01003", (9, 30)))
            for s, v in zip(SEX["sex"], values)]
    nmf = dp.read_noisy_measurements(pd.DataFrame(rows, columns=["geocode", "query", "sex", "noisy_count",
                                                                 "variance"]), SEX)
    with pm.Model() as model:
        nmf.observe(pm.Poisson("counts", 1e6, shape=nmf.shape))
    return model


def test_counts_pushed_past_every_box_are_named_with_their_numbers():
    with pytest.raises(RuntimeError) as err:
        dp.sample(100, tune=100, chains=1, model=far_prior_table(), random_seed=2, progressbar=False)
    text = str(err.value)
    print(text)
    assert "stopped after 4 widenings" in text
    assert "the counts 'counts' of the nested release 'nmf' reached the edges of their boxes" in text
    assert "±240 pilot sds" in text and "Counts on an edge in 100 stored draws" in text
    # each count: its box, its draws at the edge, its measurement, the prior's draws near 10^6
    for line in [r"01001, cell 0: box 0\.\.(\d+), stored draws \d+\.\.\1, pilot 10\.0; "
                 r"county/detailed \[01001, sex=m\] = 10 \(sd 20\); the prior at the posterior's "
                 r"parameters 99\d{4}\.\.100\d{4}",
                 r"01003, cell 1: box 0\.\.\d+, .*county/detailed \[01003, sex=f\] = 30 \(sd 20\)"]:
        assert any(re.search(line, row) for row in text.splitlines()), line


def test_moves_without_mass_name_the_equalities():
    """The reported three-level table with a Poisson prior of rate 10^4 per count: the exact
    state total (845) holds the counts far below where the prior puts them, so every move
    has no mass; wider boxes cannot help and the message says which equality, what the
    measurements alone say of it and where the prior puts it."""
    table, invariants, truth, _ = synthetic_state(2, 3, seed=1)
    nmf = dp.read_noisy_measurements(table, HIST, invariants=invariants)
    with pm.Model() as model:
        nmf.observe(pm.Poisson("counts", 1e4, shape=nmf.shape))
    with pytest.raises(RuntimeError) as err:
        dp.sample(50, tune=50, chains=1, model=model, random_seed=2, progressbar=False)
    text = str(err.value)
    print(text)
    assert truth.sum() == 845
    assert "the counts 'counts' of the nested release 'nmf':" in text and "moves after tuning had no mass" in text
    assert "wider boxes do not help" in text and "reached the edges" not in text
    assert ("state/total (=) [01, all cells] = 845 (the measurements alone put this sum at 844.4); the prior "
            "at the posterior's parameters puts this sum at 239") in text


def test_box_edges_reached_between_stored_draws_still_name_counts():
    """The kernel counted box edges, but no stored draw lies on one (an edge reached and left
    between stored draws): the report lists the counts that came nearest an edge, never []."""
    model = far_prior_table()
    plan = planning.plan_model(model, releases_of(model)).latents[0]
    plan.set_half_width(15)
    g = plan.window.gibbs
    draws = np.broadcast_to(plan.start.reshape(g.box_lo.shape), (1, 3, *g.box_lo.shape)).copy()
    draws[0, 1, 1, 1] = g.box_hi[1, 1] - 1  # one draw one step from its upper edge
    stats = {"counts_trimmed_edges_hit": 0, "counts_box_edges_hit": 2, "counts_moves_without_mass": 0}
    idata = SimpleNamespace(
        posterior=xr.Dataset({"counts": (("chain", "draw", "leaf", "cell"), draws)}),
        sample_stats=xr.Dataset({k: (("chain", "draw"), [[0, v, 0]]) for k, v in stats.items()}))
    block = SimpleNamespace(stat_names=tuple(stats))
    entry, bound = _nested_report(plan, idata, block)
    assert bound == np.inf and entry["stored_draws_on_box_edges"] == 0
    assert entry["cells_at_box_edges_index"][0] == [1, 1] and len(entry["cells_at_box_edges"]) == 4
    assert entry["cells_at_box_edges"][0].startswith(f"01003, cell 1: box 0..{g.box_hi[1, 1]}, stored draws ")
    assert entry["counts_near_box_edges"] == [[1, 1]]  # within its pilot sd of the edge: widened alone


def test_a_count_widened_alone_keeps_every_other_box():
    """widen_counts doubles k for the counts named and rebuilds the boxes: theirs grow by k s,
    every other count's box is unchanged, and the boxes record the largest k and how many
    counts are above the rest; counts_near_edges finds a count within its pilot sd of an open
    edge (never one at a support's end), and bad pairs are refused."""
    model = far_prior_table()
    plan = planning.plan_model(model, releases_of(model)).latents[0]
    plan.set_half_width(15)
    lo, hi = plan.window.gibbs.box_lo.copy(), plan.window.gibbs.box_hi.copy()
    start = plan.start.reshape(lo.shape)

    def near(low, high):
        return plan.counts_near_edges(box_gaps(plan.window.gibbs, np.stack([low, high]))[1])

    assert near(start, start).size == 0
    high = start.copy()
    high[0, 1] = hi[0, 1] - int(np.ceil(plan.scale[0, 1]))  # exactly one pilot sd below its edge
    low = start.copy()
    low[1, 0] = lo[1, 0]  # on its lower edge: the support's end (0) or an open edge
    found = near(low, high).tolist()
    assert [0, 1] in found and ([1, 0] in found) == bool(plan.window.gibbs.lo_open[1, 0])
    half = np.ceil(15 * plan.scale[0, 1]) + 2
    high[0, 1] = hi[0, 1] - int(np.floor(0.4 * half))  # 60% of the way from the pilot to its edge
    assert [0, 1] not in near(start, high).tolist()
    share = plan.counts_near_edges(box_gaps(plan.window.gibbs, np.stack([start, high]))[1], share=0.5)
    assert share.tolist() == [[0, 1]]  # more than half-way: within the margin of the end of an estimate
    plan.widen_counts([[0, 1]])
    g = plan.window.gibbs
    changed = (g.box_lo != lo) | (g.box_hi != hi)
    assert changed[0, 1] and changed.sum() == 1
    assert g.box_hi[0, 1] - np.rint(plan.pilot[0, 1]) == np.ceil(30 * plan.scale[0, 1]) + 2
    assert plan.window.half_width == 30 and plan.window.widened_counts == 1
    with pytest.raises(ValueError, match="widen_counts"):
        plan.widen_counts([[2, 0]])


def test_the_edge_watch_stops_at_the_first_draw_the_report_would_fail(monkeypatch):
    """edge_watch (run_chains' stop_when for nested plans) looks at the draws stored since its
    last look: nothing while they stay inside their boxes, a message at the first stored draw
    on an open edge or a move the kernel counted on one, as _nested_report would fail them."""
    import dpinfer.inference.engines.compiled.chains as chains
    from dpinfer.inference.engines.compiled.engine import edge_watch

    model = far_prior_table()
    plan = planning.plan_model(model, releases_of(model)).latents[0]
    plan.set_half_width(15)
    g = plan.window.gibbs
    compiled = SimpleNamespace(latent_slices={"counts": slice(0, g.box_lo.size)})
    names = ("counts_trimmed_edges_hit", "counts_box_edges_hit", "counts_moves_without_mass")
    monkeypatch.setattr(chains, "stat_columns", lambda blocks: (list(names), None))
    block = SimpleNamespace(stat_names=names)
    state = SimpleNamespace(draws_counts=np.tile(plan.start, (6, 1)), draws_stats=np.zeros((6, 3)))
    watch = edge_watch([plan], [block], compiled)
    assert watch([state], 3) is None
    state.draws_stats[2, 1] = 1  # a move on an edge in a draw already looked at: not seen again
    assert watch([state], 3) is None
    state.draws_stats[4, 0] = 1  # a trimmed message's edge: a warning, not a failure
    assert watch([state], 5) is None
    state.draws_counts[5, 3] = g.box_hi.reshape(-1)[3]
    assert "on an edge of its box" in watch([state], 6)
    state.draws_stats[:] = 0
    fresh = edge_watch([plan], [block], compiled)
    state.draws_stats[1, 2] = 1  # a move without mass
    assert "reached an edge of its box (or had no mass)" in fresh([state], 2)


def test_box_gaps_by_chunks_are_the_distances_to_the_open_edges():
    """Stored draws on an open box edge and each count's nearest approach, a few draws at a
    time: the same as the distances of every draw at once (a closed edge, a support's end, and
    a box of one value are never reached)."""
    rng = np.random.default_rng(4)
    lo, hi = rng.integers(0, 5, size=(6, 4)), rng.integers(5, 9, size=(6, 4))
    hi[0, 0] = lo[0, 0]  # a box of one value
    g = SimpleNamespace(box_lo=lo, box_hi=hi, lo_open=rng.random((6, 4)) < 0.7, hi_open=rng.random((6, 4)) < 0.7)
    draws = rng.integers(lo, hi + 1, size=(37, 6, 4))
    room = hi > lo
    gap = np.minimum(np.where(g.lo_open & room, draws - lo, np.inf), np.where(g.hi_open & room, hi - draws, np.inf))
    for chunk_bytes in (8 * 24, 8 * 24 * 5, 1e9):  # one draw, five draws, all at once
        stored, nearest = box_gaps(g, draws, chunk_bytes=chunk_bytes)
        assert stored == np.count_nonzero(np.any(gap == 0, axis=(1, 2))) > 0
        np.testing.assert_array_equal(nearest, gap.min(axis=0))


def pinned_rate_model():
    """Counts of rate exp(N(log 10^8, 0.001)) released as 10, 12 and 9 with sd 1."""
    with pm.Model() as model:
        rate = pm.LogNormal("rate", np.log(1e8), 0.001)
        x = pm.Poisson("x", rate, shape=3)
        dp.DiscreteGaussian(1.0).observe("rel", x, np.array([10, 12, 9]))
    return model


def test_held_cells_are_named_with_their_numbers():
    """Compiled engine: the cells are held at their releases in every draw."""
    with pytest.raises(RuntimeError) as err:
        dp.sample(100, tune=100, chains=2, model=pinned_rate_model(), random_seed=1, progressbar=False)
    text = str(err.value)
    print(text)
    assert "cells of 'x' (release 'rel', compiled engine) were held, not updated, in most draws of a chain" in text
    assert re.search(r"x\[1\]: published 12, window 0\.\.\d+, posterior draws 12\.\.12, the prior "
                                   r"at the posterior's parameters \d{7,}\.\.\d{7,}", text), text


def test_an_empty_windowed_likelihood_is_named_with_its_numbers():
    """PyMC engine: the windowed likelihood underflows to 0 (an infinite bound)."""
    with pytest.raises(RuntimeError) as err:
        dp.sample(100, tune=100, chains=2, model=pinned_rate_model(), random_seed=1, progressbar=False,
                  method="marginal")
    text = str(err.value)
    print(text)
    assert "the counts 'x' (release 'rel', pymc engine): the bound on the likelihood mass neglected" in text
    assert "was infinite: the windowed likelihood was 0 at some posterior draws" in text
    assert re.search(r"x\[0\]: published 10, window 0\.\.\d+, posterior draws \d+\.\.\d+, the prior "
                                   r"at the posterior's parameters \d{7,}\.\.\d{7,}", text), text
