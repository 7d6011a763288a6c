"""Would moving a concentration with its cell's counts summed out cure ``census_model``'s slow
hyperparameters? What the counts pin, what a collapsed move would free, and what it costs.

The compiled engine alternates the counts given the parameters and the parameters given the
counts (data augmentation). Where the counts carry much more information about a parameter
than the release does, that alternation crawls: for a Gaussian target its lag-1
autocorrelation is the fraction of missing information, rho = 1 - (s_cond / s_marg)^2,
s_cond the parameter's sd given every count and s_marg its posterior sd, and the ESS per
iteration is (1 - rho) / (1 + rho).

A collapsed move (Metropolis on the parameter theta with the counts along one direction D of
the nested kernel summed out, then an exact draw along D) targets p(theta | the counts off
D): log p(q, x) + log_mass_ratio(D) (:func:`dpinfer.lattice.nested.kernel.log_mass_ratio`, the
upward pass's normaliser). Its conditional sd s_D in place of s_cond gives its rho.

This script fits a small Iowa-shaped state (``census_model`` with the leaf sizes published,
2 chains x (tune + draws)), takes the slowest concentrations (smallest bulk ESS), and at
``--states`` posterior draws profiles each on a grid: given every count (s_cond), and with
the counts summed out along every direction through its cell (the cell alone, the pairs along
each axis, the squares and cubes of the cross-classification). It prints s_marg, s_cond, each
direction's s_D (mean over the states; the best of each kind), the rho and ESS per iteration
they imply, the measured ESS per draw, and the cost of one collapsed evaluation (a table
refill, a log density, an upward pass) against a count sweep.

Run:  .venv/bin/python benchmarks/bench_collapsed_concentrations.py [--counties 3] [--draws 300]
      [--tune 300] [--states 5] [--params 3]
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time

import numpy as np


# The upward passes here keep every entry within 600 nats of its message's maximum, not the
# sampler's 60: away from the current parameters the rest of the tree can pull a sum far from
# its subtree's own evidence (e.g. the state total, exact, pins a single cell's sum at 0 while
# the shifted prior pulls it elsewhere), and a trim of 60 nats would cut the only feasible sum.
WIDE_TRIM = 600.0


def nested_state(model, idata):
    """The compiled engine's nested count block for ``model`` (its kernel data, the parameter
    vector, the counts and a function refilling the prior's tables from a parameter vector),
    as ``dp.sample`` builds it."""
    from dpinfer.inference import planning
    from dpinfer.inference.engines.compiled import engine
    from dpinfer.inference.engines.compiled.chains import Stepper, fresh_state, nested_tables, stat_columns
    from dpinfer.inference.sample import _engine
    from dpinfer.mechanisms.records import releases_of

    plan = planning.plan_model(model, releases_of(model), method="auto")
    _, fitted, compiled, _ = _engine(model, plan, "auto", {})
    planning.first_windows(plan.latents, 1e-10, exact_tails=True, at_least={})
    blocks = [engine.count_block(p, compiled) for p in plan.latents]
    post = idata.posterior
    q0 = np.concatenate([post[n].values[0, 0].ravel() for n in compiled.names]).astype(float)
    counts0 = compiled.counts_vector({"counts": post["counts"].values[0, 0]})
    names, _ = stat_columns(blocks)
    state = fresh_state(compiled, len(names), draws=1, rng=np.random.default_rng(0), q0=q0, counts0=counts0,
                        target_accept=0.8)
    stepper = Stepper(compiled, blocks, state, tune=0, draws=1)
    b = stepper.nested[0]
    k = dict(zip(("flat", "hoisted", "offset", "grid", "rows", "prior_start", "table", "x", "S", "tsum", "box_lo",
                  "box_hi", "lo_open", "hi_open", "order", "child_ptr", "child_area", "area_leaf", "term_ptr",
                  "term_cells", "term_value", "term_table", "term_area", "meta", "inv2v", "values",
                  "mixing_address", "mixing_at", "mixing_out", "group_area", "leaf_group", "group_parent", "trim",
                  "cell_shape", "stats", "column"), b))

    def set_state(chain, draw):
        state.q[:] = np.concatenate([post[n].values[chain, draw].ravel() for n in compiled.names])
        state.counts[:] = compiled.counts_vector({"counts": post["counts"].values[chain, draw]})

    def refill():
        """The tables at state.q and the counts, as a sweep of the engine fills them."""
        nested_tables(b, state.q, state.counts, stepper.env)

    return k, state, stepper, set_state, refill


def directions(cell: int, shape: tuple) -> dict[str, list]:
    """Every interaction direction of the cross-classification through ``cell``, by kind:
    the cell alone, the pairs along each axis, the squares of two axes, the cubes of three."""
    at = np.unravel_index(cell, shape)
    out = {"cell alone": [([cell], [1])]}
    for size in range(1, len(shape) + 1):
        for axes in itertools.combinations(range(len(shape)), size):
            kind = f"{['pair', 'square', 'cube'][size - 1]} of axes {axes}"
            for other in itertools.product(*[[v for v in range(shape[a]) if v != at[a]] for a in axes]):
                cells, signs = [], []
                for corner in range(1 << size):
                    level, sign = list(at), 1
                    for j, a in enumerate(axes):
                        if corner >> j & 1:
                            level[a], sign = other[j], -sign
                    cells.append(int(np.ravel_multi_index(level, shape)))
                    signs.append(sign)
                out.setdefault(kind, []).append((cells, signs))
    return out


def profile_sd(logf: np.ndarray, grid: np.ndarray) -> float:
    """The sd of the grid under weights exp(logf); nan unless every logf is a number and one
    is finite."""
    if np.isnan(logf).any() or not np.isfinite(logf).any():
        return float("nan")
    w = np.exp(logf - logf.max())
    w /= w.sum()
    mean = (w * grid).sum()
    return float(np.sqrt((w * (grid - mean) ** 2).sum()))


def main(argv=None) -> None:
    import dpinfer as dp
    from dpinfer._random_stream import new_stream
    from dpinfer.inference.convergence import diagnostics
    from dpinfer.io.nmf.model import census_model
    from dpinfer.io.nmf.synthetic import PRESETS
    from dpinfer.io.nmf.table import census_table
    from dpinfer.lattice.nested.directions import sweep_products
    from dpinfer.lattice.nested.kernel import log_mass_ratio, workspace

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, default=3)
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--tune", type=int, default=300)
    parser.add_argument("--states", type=int, default=5, help="posterior draws profiled")
    parser.add_argument("--params", type=int, default=3, help="slowest concentrations profiled")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as root:
        preset = PRESETS["iowa"] | {"n_counties": args.counties}
        dp.write_synthetic_nmf(root, **preset)
        nmf = dp.read_nmf(root, int(preset["state_fips"]), levels=("US", "State", "County", "Tract", "Block_Group"))
        table = census_table(nmf, "Block_Group", "pl94-28")
    model = census_model(table, leaf_sizes="published")
    start = time.perf_counter()
    idata = dp.sample(model=model, draws=args.draws, tune=args.tune, chains=2, random_seed=args.seed,
                      progressbar=True)
    print(f"fit: {args.counties} counties, {table.release.sums.n_leaves * len(table.cells):,} counts, "
          f"2 x ({args.tune} + {args.draws}), {time.perf_counter() - start:.0f} s")
    post = idata.posterior
    ls = post["log_split"].values  # (chains, draws, level, cell)
    chains, draws, n_levels, n_cells = ls.shape
    _, ess = diagnostics(ls.reshape(chains, draws, -1))
    slowest = np.argsort(ess)[:args.params]

    k, state, stepper, set_state, refill = nested_state(model, idata)
    work = workspace(k["order"], k["child_area"], k["term_ptr"], k["term_cells"], k["term_value"], k["term_table"],
                     k["meta"], k["inv2v"], k["values"], k["box_lo"], k["box_hi"])
    shape = tuple(int(s) for s in k["cell_shape"])
    assert list(stepper.model.names) == ["log_split"], "the published-sizes model has the concentrations alone"

    def log_ratio(cells, signs):
        return log_mass_ratio(np.array(cells, np.int64), np.array(signs, np.int64), k["x"], k["tsum"], k["box_lo"],
                              k["box_hi"], k["table"], k["prior_start"], k["order"], k["child_ptr"],
                              k["child_area"], k["area_leaf"], k["term_cells"], k["term_value"], k["term_table"],
                              k["meta"], k["inv2v"], k["values"], WIDE_TRIM, work)

    rng = np.random.default_rng(args.seed)
    picks = [(int(c), int(d)) for c, d in zip(rng.integers(chains, size=args.states),
                                              rng.integers(draws, size=args.states))]
    levels = list(post["spine_level"].values)
    cells = list(post["cell"].values)
    for flat in slowest:
        level, cell = divmod(int(flat), n_cells)
        s_marg = float(ls[:, :, level, cell].std())
        grid = np.linspace(-3.0, 3.0, 41) * s_marg
        dirs = directions(cell, shape)
        s_cond, s_dir = [], {kind: [] for kind in dirs}
        for chain, draw in picks:
            set_state(chain, draw)
            base = state.q.copy()
            lp = np.empty(grid.size)
            lr = {kind: np.empty((len(ds), grid.size)) for kind, ds in dirs.items()}
            for g, delta in enumerate(grid):
                state.q[:] = base
                state.q[flat] += delta
                refill()
                lp[g] = stepper.log_density()
                for kind, ds in dirs.items():
                    for j, (dc, dsg) in enumerate(ds):
                        lr[kind][j, g] = log_ratio(dc, dsg)
            state.q[:] = base
            s_cond.append(profile_sd(lp, grid))
            for kind in dirs:
                s_dir[kind].append([profile_sd(lp + r, grid) for r in lr[kind]])
        s_c = float(np.mean(s_cond))
        per_draw = ess[flat] / (chains * draws)
        print(f"\nlog_split[{levels[level]}, {cells[cell]}]: bulk ESS {ess[flat]:.0f} of {chains * draws} "
              f"({per_draw:.3f} per draw); posterior sd {s_marg:.3f}")

        def row(name, s):
            rho = 1.0 - min(s / s_marg, 1.0) ** 2
            print(f"  {name:<34} sd {s:.3f}  rho {rho:.2f}  ESS per iteration {(1 - rho) / (1 + rho):.2f}")

        row("given every count", s_c)
        for kind, values in s_dir.items():
            means = np.mean(values, axis=0)  # per direction, over the states
            finite = np.flatnonzero(np.isfinite(means))  # nan: a grid point where the law kept no mass
            if finite.size == 0:
                print(f"  {kind}: no direction with a finite profile at every state (widen WIDE_TRIM)")
                continue
            best = finite[np.argmax(means[finite])]
            row(f"{kind} (best of {finite.size}/{len(means)})", float(means[best]))

    # what one collapsed evaluation costs against a count sweep (this process, warm)
    set_state(*picks[0])
    refill()
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        refill()
    t_refill = (time.perf_counter() - t) / reps
    t = time.perf_counter()
    for _ in range(reps):
        stepper.log_density()
    t_lp = (time.perf_counter() - t) / reps
    t = time.perf_counter()
    for _ in range(reps):
        log_ratio([0], [1])
    t_up = (time.perf_counter() - t) / reps
    stream = new_stream(rng)
    sweep_args = (k["x"], k["S"], k["tsum"], k["box_lo"], k["box_hi"], k["lo_open"], k["hi_open"], k["table"],
                  k["prior_start"], k["order"], k["child_ptr"], k["child_area"], k["area_leaf"], k["term_ptr"],
                  k["term_cells"], k["term_value"], k["term_table"], k["meta"], k["inv2v"], k["values"], k["trim"],
                  k["cell_shape"], stream, k["stats"])
    sweep_products(*sweep_args)
    t = time.perf_counter()
    for _ in range(5):
        sweep_products(*sweep_args)
    t_sweep = (time.perf_counter() - t) / 5
    print(f"\ncosts (warm): table refill {1e3 * t_refill:.1f} ms, log density {1e3 * t_lp:.2f} ms, "
          f"one direction's log_mass_ratio {1e3 * t_up:.2f} ms; a count sweep {1e3 * t_sweep:.1f} ms. "
          f"A collapsed proposal of one concentration (two refills, two log densities, two upward "
          f"passes) ~{1e3 * 2 * (t_refill + t_lp + t_up):.0f} ms; for all {n_levels * n_cells} "
          f"concentrations ~{2 * n_levels * n_cells * (t_refill + t_lp + t_up):.1f} s per iteration")


if __name__ == "__main__":
    main()
