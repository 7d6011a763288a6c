r"""Any union of blocks: the areas of a plan summarised from a fit's stored count draws.

A **plan** assigns blocks to areas: a redistricting plan's districts, tabulation block groups
or tracts, places. Redistricting tools exchange plans as block-assignment files, a CSV of the
15-digit block ``GEOID20`` and an area label, one row per block (:func:`read_plan`). An area's
counts in each draw are the sums of its leaves' counts in that draw, so every summary of every
area is a posterior summary of the same joint draws: sums, shares and the probability of any
event about them (``share_vap_hisp > 0.5``, ``vap_hisp > vap_nh_white``) are exact functions
of the draws, without refitting, and their Monte Carlo error is the draws'.

Matching a plan to a fit (:func:`summarise_areas`)
-------------------------------------------------
A fit stored by ``dpinfer nmf`` (:mod:`dpinfer.io.nmf.store`) lists every block of its
states with its leaf. An area is a union of leaves, so each leaf must lie in one area: a leaf
whose blocks the plan puts in two areas (or, with ``partial=True``, partly in an area and
partly nowhere) cannot be split without a model below the leaves, and is an error that names
it (fit with blocks as leaves, ``dpinfer nmf --leaves Block``, to summarise such a plan).
With block-group leaves, plans that follow block groups (tracts, counties, most places'
cores) need no more. A fit without a block list (``dp.sample`` of a user's own model) is
matched by its leaves' own labels: the plan's keys are then the leaves' geocodes.

Nothing is dropped without a word: a block listed twice is an error naming it (even with the
same label); so is a block code that is not 15 digits (a plan read as numbers has lost the
leading zero of states 01-09: it would otherwise look like another state's); a block of the fit's states that the fit does not have is an error naming it; a
block of the fit that the plan does not list is an error naming it unless ``partial=True``
(a plan of some areas, such as places: the rest of the state is then in no area, and the
result says how many blocks that is); blocks of other states (a national plan read for one
state) are set aside and counted per state in the result (``set_aside``).

Quantities (:func:`area_quantities`)
------------------------------------
Every cell, and where the cells keep the PL94 axes (voting age, Hispanic origin, race group):
``pop`` and ``vap`` (the voting-age population, 18 and over), each also ``_hisp`` (Hispanic
or Latino) and ``_nh_<race>`` (not Hispanic or Latino, of one race group alone or two or
more races); and each of those groups' share of its population, ``share_pop_hisp``,
``share_vap_nh_white``, ... A share of an area with no such persons in a draw is undefined
(NaN) in that draw.

Summaries: per (area, quantity) the posterior mean, sd, median, the central ``interval``'s
ends, split R-hat, bulk and tail ESS (:mod:`dpinfer.inference.convergence`); per (area,
event) the posterior probability, the share of draws where the event holds (among those where
both sides are defined), with its Monte Carlo standard error sqrt(p (1 - p) / ESS), ESS the
indicator's bulk ESS. The fit's own convergence verdict is carried into the result
(``fit_verdict``): summaries of a fit that has not converged are not results, and the result
says so first.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse
import xarray as xr

from dpinfer._validation import check_flag

GEOID_COLUMNS = ("GEOID20", "GEOID", "BLOCKID", "GEOID_BLOCK")  # case-insensitive, first found
OPERATORS = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}
SUM_BYTES = 2e8  # float bytes of area sums held at once; more areas are summarised in batches
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_EVENT = re.compile(rf"^\s*(?:P\s*\(\s*)?({_NAME}|{_NUMBER})\s*(>=|<=|>|<)\s*({_NAME}|{_NUMBER})\s*\)?\s*$")


def read_plan(plan, *, geoid_column: str | None = None, area_column: str | None = None) -> pd.Series:
    """A block-assignment plan as a Series: index the blocks' codes (strings), values the area
    labels (strings).

    ``plan``: a CSV file's path (read as text, so leading zeros stay), a DataFrame, or a
    mapping / Series from block code to label. A CSV or DataFrame's block column is
    ``geoid_column``, else the first of GEOID_COLUMNS present (any case), else its first
    column; the label column ``area_column``, else its one other column. Errors name the
    file, the column and the rows: missing columns, empty codes or labels, a code listed twice."""
    for argument, value in (("geoid_column", geoid_column), ("area_column", area_column)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{argument} must be None or a column name, got {value!r}")
    source = "plan"
    if isinstance(plan, (str, os.PathLike)):
        source = os.fspath(plan)
        try:
            plan = pd.read_csv(source, dtype=str, keep_default_na=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"plan {source}: no such file") from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise ValueError(f"plan {source}: not a readable CSV ({err})") from None
        except (ValueError, OSError) as err:  # not a path the system takes (an embedded NUL, a directory, ...)
            raise ValueError(f"plan {source!r}: cannot be read as a CSV file ({err})") from None
    if isinstance(plan, pd.Series) or hasattr(plan, "items") and not isinstance(plan, pd.DataFrame):
        series = pd.Series(plan, dtype=object) if not isinstance(plan, pd.Series) else plan
        frame = pd.DataFrame({"block": series.index.astype(str), "area": series.to_numpy()})
        geoid_column, area_column = "block", "area"
    elif isinstance(plan, pd.DataFrame):
        frame = plan
    else:
        raise TypeError(f"plan must be a CSV path, a DataFrame or a mapping from block to area, got "
                        f"{type(plan).__name__}")
    columns = [str(c) for c in frame.columns]
    frame = frame.set_axis(columns, axis=1)
    if geoid_column is None:
        upper = {c.upper(): c for c in columns}
        geoid_column = next((upper[c] for c in GEOID_COLUMNS if c in upper), columns[0] if columns else None)
    if geoid_column not in columns:
        raise ValueError(f"{source}: no column {geoid_column!r} of block codes (geoid_column); columns: {columns}")
    if area_column is None:
        others = [c for c in columns if c != geoid_column]
        if len(others) != 1:
            raise ValueError(f"{source}: which column holds the areas? columns besides {geoid_column!r}: {others}; "
                             "name it (area_column= / --area-column)")
        area_column = others[0]
    if area_column not in columns:
        raise ValueError(f"{source}: no column {area_column!r} of area labels (area_column); columns: {columns}")
    blocks = frame[geoid_column].astype(str).str.strip()
    labels = frame[area_column].map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v))
                                    else str(v).strip())
    for column, values in ((geoid_column, blocks), (area_column, labels)):
        empty = np.flatnonzero(values.to_numpy() == "")
        if empty.size:
            raise ValueError(f"{source}: column {column!r} is empty in {empty.size} row(s), e.g. data rows "
                             f"{(empty[:5] + 1).tolist()}")
    repeated = blocks[blocks.duplicated(keep=False)]
    if repeated.size:
        rows = repeated.groupby(repeated, sort=True).groups
        named = [f"{code} (data rows {', '.join(str(int(r) + 1) for r in list(index)[:3])})"
                 for code, index in list(rows.items())[:5]]
        raise ValueError(f"{source}: {len(rows)} block(s) listed more than once in column {geoid_column!r}: "
                         f"{'; '.join(named)}")
    return pd.Series(labels.to_numpy(dtype=object), index=pd.Index(blocks.to_numpy(dtype=object), name="block"),
                     name="area")


TABULATION = {"county": 5, "tract": 11, "block-group": 12, "block": 15}  # GEOID20 prefix lengths


def tabulation_plan(draws, level: str) -> pd.Series:
    """The plan of a tabulation geography rebuilt from blocks: each block of the stored fit
    ``draws`` (a path or DataTree with a ``geography`` group) in its county, tract, block group
    (``level`` ``"block-group"``) or itself (``"block"``), named by the GEOID20's first 5, 11,
    12 or 15 digits. With the spine's block-group leaves, tabulation block groups split leaves
    (an error at :func:`summarise_areas`): they need blocks as leaves."""
    from dpinfer.io.nmf.store import open_posterior

    if not isinstance(level, str) or level not in TABULATION:
        raise ValueError(f"level must be one of {list(TABULATION)}, got {level!r}")
    tree = open_posterior(draws) if isinstance(draws, (str, os.PathLike)) else draws
    geo = _geography(tree)
    if geo is None or "block" not in geo.coords:
        raise ValueError("the stored fit lists no blocks (a fit of files without a Block level, or not stored by "
                         "dpinfer nmf): tabulation areas cannot be rebuilt from blocks")
    blocks = pd.Index(np.asarray(geo["block"].values, dtype=str), name="block")
    return pd.Series(blocks.str[:TABULATION[level]].to_numpy(dtype=object), index=blocks, name="area")


def _slug(label: str) -> str:
    text = re.sub(r"\balone\b", "", str(label).lower())
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_")


_VOTING = {"17 and under": "u18", "18 and over": "vap"}
_HISPANIC = {"Hispanic or Latino": "hisp", "Not Hispanic or Latino": "nh"}


def area_quantities(cell_labels, cell_axes) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """(name, numerator cells, denominator cells or None) as 0/1 masks over the cells, in the
    module docstring's order: every cell (named by its axes' levels, ``vap_hisp_white``), the
    population ``pop`` and, with a voting-age axis, ``vap``, their Hispanic and non-Hispanic
    race groups, and each group's share of its population. ``cell_labels`` are the fit's cell
    coordinates ("a x b x c"), ``cell_axes`` the axes' names."""
    axes = list(cell_axes)
    cells = [str(c).split(" x ") if len(axes) > 1 else [str(c)] for c in cell_labels]
    if any(len(c) != len(axes) for c in cells):
        raise ValueError(f"cell labels {list(cell_labels)[:3]} do not have one level per axis {axes}")
    n = len(cells)

    def level(cell, axis):
        return cell[axes.index(axis)] if axis in axes else None

    def name(cell):
        parts = []
        for axis, value in zip(axes, cell):
            parts.append(_VOTING.get(value) if axis == "votingage" else _HISPANIC.get(value) if axis == "hispanic"
                         else _slug(value))
        return "_".join(p or _slug(v) for p, v in zip(parts, cell))

    out = []
    populations = [("pop", np.ones(n, bool))]
    if "votingage" in axes:
        populations.append(("vap", np.array([level(c, "votingage") == "18 and over" for c in cells])))
    groups = []
    if "hispanic" in axes:
        groups.append(("hisp", np.array([level(c, "hispanic") == "Hispanic or Latino" for c in cells])))
        if "cenrace" in axes:
            races = list(dict.fromkeys(level(c, "cenrace") for c in cells))
            for race in races:
                groups.append((f"nh_{_slug(race)}", np.array([level(c, "hispanic") == "Not Hispanic or Latino"
                                                              and level(c, "cenrace") == race for c in cells])))
    for pop, mask in populations:
        out.append((pop, mask, None))
        out += [(f"{pop}_{group}", mask & gmask, None) for group, gmask in groups]
    for pop, mask in populations:
        out += [(f"share_{pop}_{group}", mask & gmask, mask) for group, gmask in groups]
    out += [(name(c), np.eye(n, dtype=bool)[j], None) for j, c in enumerate(cells)]
    kept = {}
    for q in out:  # a group that is one cell (vap_nh_white with 7 race groups) is that cell
        same = kept.get(q[0])
        if same is None:
            kept[q[0]] = q
        elif not (np.array_equal(same[1], q[1]) and (same[2] is None) == (q[2] is None)):
            raise ValueError(f"the cells' labels give two quantities the name {q[0]!r}")
    return list(kept.values())


def parse_event(text: str, names) -> tuple:
    """(left, operator, right) of an event ``"a > b"``, ``"share_vap_hisp > 0.5"`` or
    ``"P(a >= b)"``: each side a quantity name (in ``names``) or a number, the operator one of
    >, >=, <, <=. Anything else is a ValueError saying what is allowed."""
    match = _EVENT.match(str(text))
    if not match:
        raise ValueError(f"probability event {text!r}: expected 'A OP B' with OP one of {list(OPERATORS)} and A, B "
                         "quantity names or numbers, e.g. 'share_vap_hisp > 0.5' or 'vap_hisp > vap_nh_white'")
    left, op, right = match.groups()
    sides = []
    for side in (left, right):
        if re.fullmatch(_NAME, side):
            if side not in names:
                raise ValueError(f"probability event {text!r}: unknown quantity {side!r}; quantities: {list(names)}")
            sides.append(side)
        else:
            sides.append(float(side))
    if not any(isinstance(s, str) for s in sides):
        raise ValueError(f"probability event {text!r} compares two numbers; name at least one quantity")
    return sides[0], op, sides[1]


@dataclass
class AreaSummary:
    """:func:`summarise_areas`' result. ``table``: one row per (area, quantity); ``probabilities``:
    one row per (area, event); ``draws``: every quantity's draws (chain, draw, area), an xarray
    Dataset that ArviZ summarises and plots; ``fit_verdict``: the stored fit's convergence
    verdict (None if it has none); ``set_aside``: blocks of the plan in other states, per state;
    ``unassigned_blocks``: blocks of the fit in no area (``partial=True``)."""

    table: pd.DataFrame
    probabilities: pd.DataFrame
    draws: xr.Dataset
    interval: float
    fit_verdict: dict | None = None
    set_aside: dict = field(default_factory=dict)
    unassigned_blocks: int = 0

    @property
    def fit_converged(self) -> bool | None:
        return None if self.fit_verdict is None else bool(self.fit_verdict.get("converged"))

    def lines(self) -> list[str]:
        """What a reader must know first: the fit's verdict, the areas' own diagnostics, what
        the plan left out."""
        v = self.fit_verdict
        if v is None:
            out = ["the stored fit has no convergence verdict: check its R-hat and ESS (the columns) before use"]
        elif v.get("converged"):
            out = [f"the fit converged (max R-hat {v['max_rhat']:.4f}, min bulk ESS {v['min_ess_bulk']:,.0f})"]
        else:
            why = f"{v['estimate_not_settled']}; " if v.get("estimate_not_settled") else ""
            out = [f"NOT CONVERGED: the fit did not converge ({why}max R-hat {v['max_rhat']:.4f}, min bulk ESS "
                   f"{v['min_ess_bulk']:,.0f}, min tail ESS {v.get('min_ess_tail', float('nan')):,.0f}): "
                   "these summaries are not results yet"]
        t = self.table
        rhat, bulk, tail = t["r_hat"].max(), t["ess_bulk"].min(), t["ess_tail"].min()
        out.append(f"{t['area'].nunique()} areas x {t['quantity'].nunique()} quantities: max R-hat {rhat:.4f}, "
                   f"min bulk ESS {bulk:,.0f}, min tail ESS {tail:,.0f}"
                   + ("" if rhat <= 1.01 and min(bulk, tail) >= 400 else
                      " (below the targets R-hat <= 1.01, ESS >= 400)"))
        if self.set_aside:
            out.append("set aside: blocks of states the fit does not hold: "
                       + ", ".join(f"state {s}: {n:,}" for s, n in sorted(self.set_aside.items())))
        if self.unassigned_blocks:
            out.append(f"partial plan: {self.unassigned_blocks:,} blocks of the fit are in no area")
        return out


def summarise_areas(draws, plan, *, probabilities=(), interval: float = 0.9, partial: bool = False,
                    name: str = "counts", geoid_column: str | None = None,
                    area_column: str | None = None, gls=None) -> AreaSummary:
    """Summaries of every area of ``plan`` from a fit's count draws (module docstring).

    ``draws``: a stored fit (a path: :func:`~dpinfer.io.nmf.store.open_posterior`) or a
    DataTree / InferenceData whose posterior holds ``name`` (chain, draw, leaf, cell);
    ``plan``: a plan (:func:`read_plan`'s input, ``geoid_column`` and ``area_column`` passed
    on); ``probabilities``: events (:func:`parse_event`), a string or a sequence of them;
    ``interval``: the central interval's probability; ``partial``: allow blocks of the fit in
    no area; ``gls``: the GLS fit of the same release
    (:func:`~dpinfer.utility.baselines.nested.gls.nested_gls`), whose estimate and sd of every
    area quantity (a district's sum with the covariance of its leaves, a share by the delta
    method) are added as columns ``gls`` and ``gls_sd`` (``dpinfer nmf --areas`` does)."""
    from dpinfer.io.nmf.store import open_posterior

    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval < 1:
        raise ValueError(f"interval must be a probability strictly between 0 and 1, got {interval!r}")
    if isinstance(probabilities, str):
        probabilities = [probabilities]
    if not isinstance(probabilities, (list, tuple)) or not all(isinstance(e, str) for e in probabilities):
        raise TypeError(f"probabilities must be an event ('share_vap_hisp > 0.5') or a list of them, "
                        f"got {probabilities!r}")
    partial = check_flag("partial", partial)
    if not isinstance(name, str):
        raise TypeError(f"name must be the name of the fit's count draws (a string), got {name!r}")
    tree = open_posterior(draws) if isinstance(draws, (str, os.PathLike)) else draws
    if not (hasattr(tree, "posterior") or "posterior" in getattr(tree, "children", {})):
        raise TypeError(f"draws must be a stored fit's path (posterior.zarr) or a DataTree / InferenceData with "
                        f"a posterior group, got {type(tree).__name__}")
    posterior = tree["posterior"] if "posterior" in getattr(tree, "children", {}) else tree.posterior
    if name not in posterior:
        raise ValueError(f"name={name!r}: the fit has no such draws; it has {list(posterior.data_vars)}")
    counts = posterior[name]
    if counts.ndim != 4:
        raise ValueError(f"{name!r} must be (chain, draw, leaf, cell) draws, got dims {counts.dims}")
    leaf_dim, cell_dim = counts.dims[2], counts.dims[3]
    leaves = np.asarray(counts[leaf_dim].values, dtype=str)
    geo = _geography(tree)
    cell_axes = json.loads(geo.attrs["cell_axes"]) if geo is not None and "cell_axes" in geo.attrs else ["cell"]
    wanted = area_quantities(counts[cell_dim].values, cell_axes)
    names = [q[0] for q in wanted]
    events = [(str(e), parse_event(e, names)) for e in probabilities]
    assignment = read_plan(plan, geoid_column=geoid_column, area_column=area_column)
    leaf_area, areas, set_aside, unassigned = match_plan(assignment, leaves, geo, partial=partial)
    verdict = posterior.attrs.get("dpinfer_convergence")
    values = _area_values(counts, leaf_area, len(areas), wanted)  # (chains, draws, areas, quantities)
    table, probs = _summaries(values, areas, names, events, interval)
    if gls is not None:
        estimates = gls.targets(area_targets(leaf_area, areas, wanted, n_cells=counts.shape[3]), prob=interval)
        table["gls"], table["gls_sd"] = estimates["estimate"].to_numpy(), estimates["sd"].to_numpy()
    data = xr.Dataset({q: (("chain", "draw", "area"), values[..., k]) for k, q in enumerate(names)},
                      coords={"chain": np.arange(values.shape[0]), "draw": np.arange(values.shape[1]),
                              "area": areas})
    return AreaSummary(table, probs, data, float(interval), json.loads(verdict) if verdict else None,
                       set_aside, unassigned)


def _geography(tree):
    try:
        return tree["geography"].to_dataset() if "geography" in tree.children else None
    except AttributeError:  # an InferenceData-like object without DataTree children
        return getattr(tree, "geography", None)


def match_plan(assignment: pd.Series, leaves, geo: xr.Dataset | None, *, partial: bool = False):
    """(each leaf's area index, -1 for none; the areas' labels in order of first block; blocks
    set aside per state; blocks in no area) of the plan ``assignment`` (:func:`read_plan`) on
    a fit's ``leaves`` with its ``geography`` group (:func:`~dpinfer.io.nmf.store.geography`;
    None: matched by the leaves' geocodes), or a ValueError naming what does not match
    (module docstring). ``dpinfer nmf --areas`` calls it before the fit."""
    leaves = np.asarray(leaves, dtype=str)
    if geo is not None and "block" in geo.coords:
        blocks = np.asarray(geo["block"].values, dtype=str)
        block_leaf = np.asarray(geo["block_leaf"].values, dtype=np.int64)
        what = "block"
    else:
        blocks, block_leaf, what = leaves, np.arange(leaves.size), "leaf"
    known = pd.Index(blocks)
    listed = assignment.index.astype(str)
    if what == "block":
        malformed = listed[~((listed.str.len() == 15) & listed.str.isdigit())]
        if malformed.size:
            short = malformed[(malformed.str.len() == 14) & malformed.str.isdigit()]
            hint = (f" ({short.size} of them 14 digits: a leading zero lost, as when the plan is read as numbers; "
                    "read it as text, e.g. pd.read_csv(path, dtype=str))" if short.size else "")
            raise ValueError(f"{malformed.size} block code(s) of the plan are not 15-digit GEOID20s: "
                             f"{list(malformed[:5])}{hint}")
    unknown = listed[~listed.isin(known)]
    set_aside = {}
    if unknown.size and what == "block":
        states = set(pd.Index(blocks).str[:2])
        other = unknown[~unknown.str[:2].isin(states)]
        set_aside = {s: int(n) for s, n in pd.Series(other.str[:2]).value_counts().items()}
        unknown = unknown[unknown.str[:2].isin(states)]
    if unknown.size:
        hint = (" (the fit stored no block list: the plan's keys must be its leaves' geocodes, "
                f"e.g. {list(leaves[:3])})" if what == "leaf" else "")
        raise ValueError(f"the plan lists {unknown.size} {what}(s) the fit does not have: {list(unknown[:10])}{hint}")
    area_of_block = assignment.reindex(blocks).to_numpy(dtype=object)
    missing = np.array([a is None or (isinstance(a, float) and np.isnan(a)) for a in area_of_block])
    if missing.any() and not partial:
        raise ValueError(f"the plan does not list {int(missing.sum())} {what}(s) of the fit: "
                         f"{list(blocks[missing][:10])}; list every {what}, or pass partial=True "
                         "(--partial) to summarise only the areas listed")
    labels = np.where(missing, "", area_of_block).astype(str)
    frame = pd.DataFrame({"leaf": block_leaf, "area": labels})
    per_leaf = frame.groupby("leaf")["area"].agg(lambda a: sorted(set(a)))
    split = per_leaf[per_leaf.map(len) > 1]
    if split.size:
        named = [f"{leaves[leaf]} ({' / '.join(a if a else '(no area)' for a in areas_)})"
                 for leaf, areas_ in list(split.items())[:5]]
        raise ValueError(f"the plan splits {split.size} {'leaf' if split.size == 1 else 'leaves'} of the fit "
                         "between areas, and the fit has no "
                         f"counts below its leaves: {'; '.join(named)}; fit with blocks as leaves "
                         "(dpinfer nmf --leaves Block) to summarise this plan")
    areas = pd.unique(labels[~missing])
    index = {a: k for k, a in enumerate(areas)}
    leaf_area = np.full(leaves.size, -1, np.int64)
    for leaf, areas_ in per_leaf.items():
        leaf_area[leaf] = index.get(areas_[0], -1)
    if not areas.size:
        raise ValueError("the plan assigns no block of the fit to an area")
    return leaf_area, np.asarray(areas, dtype=str), set_aside, int(missing.sum())


def area_targets(leaf_area: np.ndarray, areas: np.ndarray, wanted, *, n_cells: int):
    """Every (area, quantity) of ``wanted`` (:func:`area_quantities`), area by area in the
    summaries' table's order, as the nested baselines' targets
    (:class:`~dpinfer.utility.baselines.nested.targets.NestedTargets`, labels "<area>
    <quantity>"): weights 1 on (leaf, cell) for the area's leaves (``leaf_area`` == its index)
    and the quantity's cells, a share the same for its denominator; no target is one published
    area's (``num_area`` -1)."""
    from dpinfer.utility.baselines.nested.targets import NestedTargets

    n_leaves = leaf_area.size
    K = len(wanted)

    def weights(masks):
        rows, cols = [], []
        for a in range(areas.size):
            leaves = np.flatnonzero(leaf_area == a)
            for k, mask in enumerate(masks):
                if mask is None:
                    continue
                c = (leaves[:, None] * n_cells + np.flatnonzero(mask)[None, :]).reshape(-1)
                rows.append(np.full(c.size, a * K + k))
                cols.append(c)
        r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
        return scipy.sparse.csr_matrix((np.ones(r.size, np.int64), (r, c)), shape=(areas.size * K, n_leaves * n_cells))

    num_cells = np.tile(np.stack([q[1] for q in wanted]), (areas.size, 1))
    den_cells = np.tile(np.stack([q[2] if q[2] is not None else np.zeros_like(q[1]) for q in wanted]),
                        (areas.size, 1))
    labels = np.array([f"{a} {q[0]}" for a in areas for q in wanted], dtype=object)
    return NestedTargets(labels, np.full(labels.size, "area", dtype=object), weights([q[1] for q in wanted]),
                         weights([q[2] for q in wanted]), np.full(labels.size, -1, np.int64), num_cells,
                         np.full(labels.size, -1, np.int64), den_cells)


def _area_values(counts: xr.DataArray, leaf_area: np.ndarray, n_areas: int, wanted) -> np.ndarray:
    """(chains, draws, areas, quantities) float: each area's quantities in each draw, its
    leaves' counts summed; the stored draws read a chunk of leaves at a time (only the leaves
    in some area), areas in batches of SUM_BYTES."""
    chains, draws, _, n_cells = counts.shape
    num = np.stack([q[1] for q in wanted], axis=1).astype(float)
    den = np.stack([q[2] if q[2] is not None else q[1] for q in wanted], axis=1).astype(float)
    ratio = np.array([q[2] is not None for q in wanted])
    out = np.empty((chains, draws, n_areas, len(wanted)))
    chunks = counts.encoding.get("chunks") or counts.encoding.get("preferred_chunks")
    step = int(chunks[2]) if isinstance(chunks, tuple) and len(chunks) == 4 else 256
    per_area = chains * draws * n_cells * 8
    batch = max(1, int(SUM_BYTES // per_area))
    for a0 in range(0, n_areas, batch):
        a1 = min(n_areas, a0 + batch)
        inside = np.flatnonzero((leaf_area >= a0) & (leaf_area < a1))
        sums = np.zeros((a1 - a0, chains * draws * n_cells))
        for l0 in range(0, inside.size, step):
            part = inside[l0:l0 + step]
            lo, hi = int(part[0]), int(part[-1]) + 1  # one contiguous read, the leaves outside skipped
            x = np.asarray(counts[:, :, lo:hi, :].values)[:, :, part - lo, :]
            M = scipy.sparse.csr_matrix((np.ones(part.size), (leaf_area[part] - a0, np.arange(part.size))),
                                        shape=(a1 - a0, part.size))
            sums += M @ np.moveaxis(x, 2, 0).reshape(part.size, -1).astype(float)
        sums = np.moveaxis(sums.reshape(a1 - a0, chains, draws, n_cells), 0, 2)
        n, d = sums @ num, sums @ den
        with np.errstate(divide="ignore", invalid="ignore"):
            out[:, :, a0:a1] = np.where(ratio, n / np.where(d == 0, np.nan, d), n)
    return out


def _summaries(values: np.ndarray, areas: np.ndarray, names: list, events: list, interval: float):
    from dpinfer.inference.convergence import diagnostics, tail_ess

    chains, draws, A, K = values.shape
    flat = values.reshape(chains, draws, A * K)
    finite = np.where(np.isfinite(flat), flat, 0.0)
    rhat, bulk = diagnostics(finite)
    tail = tail_ess(finite)
    pooled = flat.reshape(chains * draws, -1)
    undefined = np.all(np.isnan(pooled), axis=0)
    probs = ((1 - interval) / 2, 0.5, (1 + interval) / 2)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a share never defined: NaN
        lower, median, upper = np.nanquantile(pooled, probs, axis=0)
        mean, sd = np.nanmean(pooled, axis=0), np.nanstd(pooled, axis=0, ddof=1)
    table = pd.DataFrame({"area": np.repeat(areas, K), "quantity": np.tile(names, A), "mean": mean, "sd": sd,
                          "median": median, "lower": lower, "upper": upper, "interval": interval,
                          "r_hat": np.where(undefined, np.nan, rhat), "ess_bulk": np.where(undefined, np.nan, bulk),
                          "ess_tail": np.where(undefined, np.nan, tail)})
    rows = []
    index = {q: k for k, q in enumerate(names)}
    for text, (left, op, right) in events:
        a = values[..., index[left]] if isinstance(left, str) else np.full(values.shape[:3], left)
        b = values[..., index[right]] if isinstance(right, str) else np.full(values.shape[:3], right)
        defined = np.isfinite(a) & np.isfinite(b)
        with np.errstate(invalid="ignore"):
            holds = OPERATORS[op](a, b) & defined
        n_defined = defined.sum(axis=(0, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            p = holds.sum(axis=(0, 1)) / n_defined
        _, ess = diagnostics(holds.astype(float))
        ess = np.where(np.isfinite(ess), ess, n_defined)  # an indicator that never changes: its draws
        with np.errstate(divide="ignore", invalid="ignore"):
            mc_se = np.sqrt(p * (1 - p) / ess)
        rows.append(pd.DataFrame({"area": areas, "event": text, "probability": p, "mc_se": mc_se,
                                  "ess": ess, "draws_defined": n_defined}))
    probabilities = (pd.concat(rows, ignore_index=True) if rows else
                     pd.DataFrame(columns=["area", "event", "probability", "mc_se", "ess", "draws_defined"]))
    return table, probabilities


def plot_areas(summary: AreaSummary, quantities=("share_vap_hisp", "share_vap_nh_white"), path=None):
    """A figure of each area's posterior median and central interval of ``quantities`` (one
    panel each, the areas in the plan's order), the GLS estimate +- z sd beside where the table
    has it, the fit's verdict in the title when it has not converged; saved to ``path`` if
    given. Returns the matplotlib Figure."""
    import scipy.stats
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    quantities = [quantities] if isinstance(quantities, str) else list(quantities)
    t = summary.table
    unknown = [q for q in quantities if q not in set(t["quantity"])]
    if unknown:
        raise ValueError(f"unknown quantities {unknown}; quantities: {list(pd.unique(t['quantity']))}")
    areas = list(pd.unique(t["area"]))
    z = scipy.stats.norm.ppf(0.5 * (1 + summary.interval))
    fig = Figure(figsize=(4.5 * len(quantities), 0.35 * len(areas) + 1.6))
    axes = fig.subplots(1, len(quantities), squeeze=False, sharey=True)
    y = np.arange(len(areas))
    for ax, quantity in zip(axes[0], quantities):
        rows = t[t["quantity"] == quantity].set_index("area").loc[areas]
        ax.errorbar(rows["median"], y, xerr=[rows["median"] - rows["lower"], rows["upper"] - rows["median"]],
                    fmt="o", color="C0", capsize=2, label=f"dpinfer median, {summary.interval:.0%} interval")
        if "gls" in rows:
            ax.errorbar(rows["gls"], y + 0.25, xerr=z * rows["gls_sd"], fmt="s", color="C1", ms=3, capsize=2,
                        label=f"GLS +- {z:.3g} sd")
        ax.set_title(quantity)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(y, areas)
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(loc="best", fontsize=8)
    if summary.fit_converged is False:
        fig.suptitle("NOT CONVERGED: not a result yet", color="#b00020")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def write_summary(summary: AreaSummary, out) -> tuple[Path, Path | None]:
    """Write ``summary``'s table to ``out`` (a CSV path), its probabilities, if any, beside
    it (``<stem>-probabilities.csv``), and the figure of :func:`plot_areas` (``<stem>.png``,
    when the cells give the shares it shows); each CSV's first lines are ``#`` comments with
    :meth:`AreaSummary.lines` (read back with ``pd.read_csv(path, comment="#")``). Returns the
    CSV paths."""
    out = Path(out)
    header = "".join(f"# {line}\n" for line in summary.lines())
    with open(out, "w", newline="") as handle:
        handle.write(header)
        summary.table.to_csv(handle, index=False)
    probs = None
    if len(summary.probabilities):
        probs = out.with_name(f"{out.stem}-probabilities.csv")
        with open(probs, "w", newline="") as handle:
            handle.write(header)
            summary.probabilities.to_csv(handle, index=False)
    shares = [q for q in ("share_vap_hisp", "share_vap_nh_white") if q in set(summary.table["quantity"])]
    if shares:
        plot_areas(summary, shares, path=out.with_suffix(".png"))
    return out, probs
