"""A PyMC model turned into the native functions of dpinfer's Gibbs engine.

The engine alternates two blocks: the latent counts x given the continuous parameters, and
the parameters given the counts. Given x, the releases' terms p(s | x) are constants, so the
parameters' target is the model's log density with the counts fixed,

    log p(theta | x, data) = log p(theta) + log p(x | theta) + log p(data | theta, x) + const,

which is what the confidential-data ("oracle") model would sample. This module builds, from
the model's PyTensor graph and with PyTensor's numba backend:

* ``logp_grad``: that log density and its gradient in the unconstrained space of the
  parameters (one flat vector q, PyMC's transforms and their Jacobians), with the counts of
  every latent concatenated into one int64 vector;
* ``prior_tables[name]``: log p(x_i = v | theta, other counts) for v on a (*shape, W) grid of
  candidate counts (one row of W candidates per cell), or on a flat list of (cell, candidate)
  pairs (each cell its own number of candidates: nested sums, whose boxes differ in width by
  an order of magnitude), the counts' block of the Gibbs sweep (:class:`PriorTable`: the
  terms that depend on the grid alone, such as log v! of a Poisson pmf, are computed once per
  grid; each function is compiled when a count block first asks for it);
* ``expand``: q and the counts of a batch of draws -> every named variable of the model in
  its constrained space (free variables, Deterministics), for the trace;
* ``start``: PyMC's initial point (support points, U(-1, 1) jitter in the unconstrained
  space, propagated to the variables that depend on the jittered ones).

Every graph is built on a copy of the model whose data are inputs
(:func:`~dpinfer.inference.engines.compiled.cache.thaw_literals`: ``pm.Data``, literal
parameters, observed values), handed over at run time (:class:`ModelData`; the native
functions read them through an environment array, :meth:`CompiledModel.environment`). So
everything compiled depends on the model's structure alone and serves every model object of
that structure (:class:`Structure`): in this process it is kept by the structure's key, and
the native functions are kept on disk (:mod:`~dpinfer.inference.engines.compiled.cache`). The
releases' own data are not among them (their terms are left out); ``pm.set_data`` between
fits changes the data handed over.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numba
import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.initial_point import make_initial_point_expression, make_initial_point_fn
from pymc.logprob.abstract import _logprob_helper
from pymc.pytensorf import compile as compile_pymc
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.traversal import io_toposort
from pytensor.tensor.elemwise import Elemwise

from dpinfer._graphs import shape_of
from dpinfer.inference.engines.compiled.cache import (
    NotCacheableError,
    graph_key,
    lift_data,
    native_function,
    structure_key,
    thaw_literals,
)
from dpinfer.distributions.grouped_negative_binomial import group_mixing_of
from dpinfer.inference.engines.compiled.native import (
    GROUP_MIXING,
    LOGP_GRAD,
    PRIOR_FLAT,
    PRIOR_POINT,
    PRIOR_TABLE,
    pointer,
)

_STRUCTURES: dict = {}  # structure key -> Structure, for this process


class NotCompilableError(ValueError):
    """The model has a part the compiled engine cannot run (a discrete parameter that is not
    one of the latent counts, or an Op without a numba implementation)."""


@dataclass
class Structure:
    """What a model's structure compiles to (module docstring): shared by every model object of
    the structure, each with its own :class:`ModelData`."""

    names: list  # continuous free variables (their value variables), in the order of q
    slices: list  # their slices of q
    shapes: list  # their (transformed) shapes
    latents: list  # latent count names, in the order of the counts vector
    latent_slices: dict
    latent_shapes: dict
    logp_grad: object  # numba cfunc, LOGP_GRAD
    prior_tables: dict  # name -> PriorTable
    group_mixing: dict  # name -> native GROUP_MIXING function of a GroupedNegativeBinomial's counts
    expand_fn: object  # PyTensor function (q batch, counts batch, *data) -> named values
    expand_names: list
    start_fn: object  # PyTensor function (*jitters, *data) -> transformed initial point
    data_index: list  # the model's data (thaw_literals order; a tuple: literal scalars packed) handed over
    data_inputs: list = field(repr=False, default_factory=list)
    value_graphs: tuple = field(repr=False, default=())  # (q, counts, the expand_names' values: graphs)
    key: str | None = None  # the model cache's structure key (None: not cacheable)

    @property
    def n(self) -> int:
        """Dimension of the parameters' unconstrained vector q."""
        return self.slices[-1].stop if self.slices else 0

    @property
    def n_counts(self) -> int:
        return sum(int(np.prod(s)) for s in self.latent_shapes.values())


class CompiledModel:
    """A model's :class:`Structure` with the model's own data. Build with :func:`compile_model`."""

    def __init__(self, structure: Structure, data: "ModelData", variables: tuple):
        self.structure, self.data, self.variables = structure, data, variables
        self.prior_tables = {name: table.bound(data) for name, table in structure.prior_tables.items()}

    def __getattr__(self, name):  # the structure's fields: names, slices, latents, n, ...
        if name == "structure":
            raise AttributeError(name)
        return getattr(self.structure, name)

    @property
    def logp_grad_address(self) -> int:
        return self.structure.logp_grad.address

    def initial_q(self, seed, model=None, initvals: dict | None = None) -> np.ndarray:
        """PyMC's initial point of the parameters (support points) with U(-1, 1) jitter in the
        unconstrained space (PyMC's default ``jitter+adapt_diag`` start; the jitter drawn from
        ``seed``), flattened; ``initvals`` (values or strategies by variable name in the
        constrained space, as ``pm.sample`` takes them) override it through PyMC's own
        initial-point function. Start values given for the latent counts are not used (the
        engine starts them on the releases' fibre)."""
        if not self.names:
            return np.zeros(0)
        overrides = {k: v for k, v in (initvals or {}).items() if k not in self.latent_shapes}
        if overrides:
            jitter = {rv for rv in model.free_RVs if model.rvs_to_values[rv].name in self.names
                      and rv.name not in overrides}
            point = make_initial_point_fn(model=model, overrides=overrides, jitter_rvs=jitter,
                                          return_transformed=True)(seed)
            return np.concatenate([np.asarray(point[n], dtype=float).ravel() for n in self.names])
        rng = np.random.default_rng(seed)
        jitters = [rng.uniform(-1.0, 1.0, size=shape) for shape in self.shapes]
        values = self.structure.start_fn(*jitters, *self.data.values)
        return np.concatenate([np.asarray(v, dtype=float).ravel() for v in values])

    def counts_vector(self, values: dict) -> np.ndarray:
        """Concatenate the latents' counts (name -> array) into the engine's int64 vector."""
        out = np.empty(self.n_counts, dtype=np.int64)
        for name in self.latents:
            out[self.latent_slices[name]] = np.asarray(values[name]).ravel()
        return out

    def expand(self, q: np.ndarray, counts: np.ndarray) -> dict:
        """Named values for a batch of draws: q (B, n), counts (B, n_counts) -> {name: (B, ...)}."""
        outputs = self.structure.expand_fn(np.ascontiguousarray(q, dtype=float),
                                           np.ascontiguousarray(counts, dtype=np.int64),
                                           *self.data.values)
        return dict(zip(self.expand_names, outputs))

    def values_function(self, names: list):
        """A function of one state (q, counts) returning the named values (free variables in
        their constrained space, Deterministics) of ``names``, in that order, computed from
        this model's data as it is when called: what :meth:`expand` gives for a batch of
        one, without the other values (compiled by numba, for values asked for at every
        iteration)."""
        q, counts, graphs = self.structure.value_graphs
        chosen = [graphs[self.expand_names.index(name)] for name in names]
        fn = pytensor.function([q, counts, *self.structure.data_inputs], chosen, on_unused_input="ignore",
                               mode="NUMBA")
        fn.trust_input = True
        values = self.data.values
        return lambda q_value, counts_value: fn(q_value, counts_value, *values)

    def matches(self, model) -> bool:
        """True while ``model`` has the variables compiled for and its ``pm.Data`` keep the
        shapes compiled for (their values may change: they are read at every fit,
        :meth:`refresh`)."""
        return tuple(model.named_vars) == self.variables and self.data.matches()

    def refresh(self) -> None:
        """Read the model's ``pm.Data`` values again (before a fit)."""
        self.data.refresh()

    def environment(self, counts: np.ndarray) -> np.ndarray:
        """The int64 array the native functions take beside q: the address of the counts
        buffer ``counts`` (int64, the chain's), then each data array's. Keep ``counts`` and
        this model alive while it is used."""
        return self.data.fill(counts)


def compile_model(model, latents: list, exclude: list) -> CompiledModel:
    """Native functions of ``model`` with the free count variables ``latents`` as data and the
    observed variables ``exclude`` (the releases, whose terms are constant given the counts)
    left out: the structure's, kept in this process by its key, else built (each native
    function loaded from the model cache when one of the same graph was compiled before,
    :mod:`dpinfer.inference.engines.compiled.cache`, else compiled and saved there), with the
    model's own data.

    Raises :class:`NotCompilableError` if a free variable other than the latents is discrete
    or the graph has an Op numba cannot compile."""
    latent_names = [rv.name for rv in latents]
    params = [rv for rv in model.free_RVs if rv.name not in latent_names]
    for rv in params:
        if rv.type.dtype.startswith(("int", "uint", "bool")):
            raise NotCompilableError(
                f"the free variable {rv.name!r} is discrete and is not a latent count behind a "
                "release; dpinfer's compiled engine samples only latent counts and continuous "
                "parameters"
            )
    mixing = {m.counts: m for m in group_mixing_of(model).values() if m.counts in latent_names}
    thawed, sources = thaw_literals(model)
    excluded = sorted(rv.name for rv in exclude)
    try:
        key = structure_key(thawed, latent_names, excluded)
    except NotCacheableError:
        key = None
    structure = _STRUCTURES.get(key) if key is not None else None
    if structure is None:
        structure = _build(thawed, sources, latent_names, excluded, mixing)
        structure.key = key
        if key is not None:
            _STRUCTURES[key] = structure
    data = ModelData.of(structure, sources)
    return CompiledModel(structure, data, tuple(model.named_vars))


def _build(thawed, sources: dict, latent_names: list, excluded: list, mixing: dict) -> Structure:
    """Compile a structure from the model copy ``thawed`` (module docstring); ``mixing``: latent
    name -> its GroupedNegativeBinomial's :class:`~dpinfer.distributions.grouped_negative_binomial.GroupMixing`."""
    latents = [thawed[name] for name in latent_names]
    params = [rv for rv in thawed.free_RVs if rv.name not in latent_names]
    values = [thawed.rvs_to_values[rv] for rv in params]
    names = [v.name for v in values]
    shapes = [shape_of(v) for v in values]
    sizes = [int(np.prod(s)) for s in shapes]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    slices = [slice(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:])]
    latent_shapes = {rv.name: shape_of(rv) for rv in latents}
    counts_offsets = np.concatenate([[0], np.cumsum([int(np.prod(latent_shapes[n])) for n in latent_names])])
    latent_slices = {n: slice(int(a), int(b)) for n, a, b in zip(latent_names, counts_offsets[:-1], counts_offsets[1:])}
    n, m = int(offsets[-1]), int(counts_offsets[-1])

    q = pt.dvector("q")
    counts = pt.lvector("counts")
    replace = {v: q[s].reshape(shape) for v, s, shape in zip(values, slices, shapes)}
    replace.update({thawed.rvs_to_values[rv]: counts[latent_slices[rv.name]].reshape(
        latent_shapes[rv.name]).astype(rv.dtype) for rv in latents})

    terms = [rv for rv in thawed.basic_RVs if rv.name not in excluded] + list(thawed.potentials)
    logp = thawed.logp(vars=terms)
    grads = pt.grad(logp, values) if values else []
    grad = pt.concatenate([g.ravel() for g in grads]) if values else pt.zeros(0)
    logp, grad = clone_replace([logp, grad], replace)

    cell = pt.lvector("cell")  # (1,): numba takes tensors, not scalars
    value = pt.lvector("value")
    flat_grid = pt.lvector("grid")  # candidates of the flat table, and the cell of each
    flat_rows = pt.lvector("rows")
    grids, tables, flat_tables, points = [], [], [], []
    for rv in latents:
        node, shape = rv.owner, latent_shapes[rv.name]
        grid = pt.tensor("grid", dtype="int64", shape=(*shape, None))
        # parameters with a trailing axis broadcast against each cell's row of candidates
        row_params = [pt.shape_padright(pt.as_tensor(p)) for p in node.op.dist_params(node)]
        _, prior = node.op(*row_params, rng=pt.random.rng(), return_next_rng=True)
        table = pt.broadcast_to(_logprob_helper(prior, grid), grid.shape)
        # the flat table: each candidate with its own cell's parameters
        cell_params = [pt.broadcast_to(p, shape).reshape((-1,)) for p in node.op.dist_params(node)]
        entry_params = [p[flat_rows] for p in cell_params]
        _, entry_prior = node.op(*entry_params, rng=pt.random.rng(), return_next_rng=True)
        flat = pt.broadcast_to(_logprob_helper(entry_prior, flat_grid), flat_grid.shape)
        k = len(cell_params)
        [table, *flat_parts] = thawed.replace_rvs_by_values([table, flat, *entry_params, *cell_params])
        flat_parts = clone_replace(flat_parts, replace)  # one call: the parameters stay the graph's own
        grids.append(grid)
        tables.append(clone_replace(table, replace).astype("float64"))
        flat_tables.append(_per_cell_first(flat_parts[0], flat_grid, flat_rows, flat_parts[1:1 + k], flat_parts[1 + k:])
                           .astype("float64"))
        cell_params = [_at_cell(p, cell[0], shape) for p in node.op.dist_params(node)]
        _, one = node.op(*cell_params, rng=pt.random.rng(), return_next_rng=True)
        [prior_point] = thawed.replace_rvs_by_values([_logprob_helper(one, value[0])])
        points.append(clone_replace(prior_point, replace).astype("float64"))

    mixing_names = [name for name in latent_names if name in mixing]
    mixing_vars = {mixing[name].parameters for name in mixing_names}
    mixing_graphs = [clone_replace(thawed.replace_rvs_by_values([thawed[mixing[name].parameters]])[0], replace)
                     .reshape((-1, 3)).astype("float64") for name in mixing_names]

    # the trace's values and the initial point, as functions of q, counts (jitters) and data
    expand_vars = list(params) + [v for v in thawed.deterministics if v.name not in mixing_vars]
    outputs = clone_replace(thawed.replace_rvs_by_values(expand_vars), replace)
    jitters = [pt.tensor(f"{name}_jitter", dtype="float64", shape=shape)
               for name, shape in zip(names, shapes)]
    start = _start_graph(thawed, params, jitters)

    graphs, inputs, index = lift_data(
        [logp, grad, *tables, *flat_tables, *points, *outputs, *mixing_graphs, *start], sources)
    logp, grad = graphs[:2]
    tables = graphs[2:2 + len(latents)]
    flat_tables = graphs[2 + len(latents):2 + 2 * len(latents)]
    points = graphs[2 + 2 * len(latents):2 + 3 * len(latents)]
    at = 2 + 3 * len(latents)
    outputs = graphs[at:at + len(outputs)]
    mixing_graphs = graphs[at + len(outputs):at + len(outputs) + len(mixing_graphs)]
    start = graphs[at + len(outputs) + len(mixing_graphs):]

    logp_grad = _native("logp_grad", [q, counts], [logp, grad], inputs, LOGP_GRAD,
                        _LOGP_GRAD_SOURCE, n=n, m=m)
    prior_tables = {
        name: PriorTable(_OnDemand(_prior_builders(table, flat, point, q, counts, grid, flat_grid, flat_rows, cell,
                                                   value, inputs, n=n, m=m, shape=latent_shapes[name])),
                         latent_shapes[name])
        for name, table, flat, point, grid in zip(latent_names, tables, flat_tables, points, grids)}
    group_mixing = {
        name: _native("group_mixing", [q, counts], [graph], inputs, GROUP_MIXING, _MIXING_SOURCE,
                      n=n, m=m, d=mixing[name].n_groups * int(latent_shapes[name][-1]))
        for name, graph in zip(mixing_names, mixing_graphs)}
    q_batch = pt.dmatrix("q_batch")
    counts_batch = pt.lmatrix("counts_batch")
    unbatched = outputs
    batched = vectorize_graph(outputs, replace={q: q_batch, counts: counts_batch})
    # a value that depends on neither (a constant Deterministic) is repeated over the batch
    outputs = [b if b.ndim > v.ndim else pt.broadcast_to(b, (q_batch.shape[0], *b.shape))
               for v, b in zip(outputs, batched)]
    # the Python backend: compiles at once and runs vectorised numpy over the whole batch
    expand_fn = pytensor.function([q_batch, counts_batch, *inputs], outputs,
                                  on_unused_input="ignore", mode="FAST_COMPILE")
    start_fn = pytensor.function([*jitters, *inputs], start, on_unused_input="ignore",
                                 mode="FAST_COMPILE")
    return Structure(
        names=names, slices=slices, shapes=shapes, latents=latent_names,
        latent_slices=latent_slices, latent_shapes=latent_shapes, logp_grad=logp_grad,
        prior_tables=prior_tables, group_mixing=group_mixing, expand_fn=expand_fn,
        expand_names=[v.name for v in expand_vars],
        start_fn=start_fn, data_index=index, data_inputs=inputs, value_graphs=(q, counts, unbatched),
    )


def _start_graph(model, params: list, jitters: list) -> list:
    """PyMC's initial point of ``params`` (their support points, transformed), with the jitter
    of each as an input (``jitters``: U(-1, 1) draws in the unconstrained space, added where
    PyMC adds its own, so that variables depending on a jittered one start from its jittered
    value)."""
    start = make_initial_point_expression(
        free_rvs=model.free_RVs, rvs_to_transforms=model.rvs_to_transforms,
        initval_strategies={}, jitter_rvs=set(params), return_transformed=True)
    wanted = [model.free_RVs.index(rv) for rv in params]
    start = [start[i] for i in wanted]
    found = {}
    for node in io_toposort([], start):
        for out in node.outputs:
            if out.name and out.name.endswith("_jitter"):
                found[out.name] = out
    replace = {found[f"{rv.name}_jitter"]: j.reshape(found[f"{rv.name}_jitter"].shape)
               for rv, j in zip(params, jitters) if f"{rv.name}_jitter" in found}
    return clone_replace(start, replace)


class ModelData:
    """A model's data for its structure's functions, in the order the structure takes them
    (:attr:`Structure.data_index` into :func:`~dpinfer.inference.engines.compiled.cache.thaw_literals`'
    order), handed over at run time through the environment array
    (:meth:`CompiledModel.environment`). The values of ``pm.Data`` variables are read again
    by :meth:`refresh` (``pm.set_data`` between fits, in place, so the addresses hold);
    literals are fixed with the model."""

    def __init__(self, values: list, sources: list):
        self.values, self._sources = values, sources
        self.addresses = np.array([v.ctypes.data for v in values], dtype=np.int64)

    @classmethod
    def of(cls, structure: Structure, sources: dict) -> "ModelData":
        """The data of a model copy (``sources`` from ``thaw_literals``) for ``structure``."""
        shared = list(sources)
        values, origins = [], []
        for j, i in enumerate(structure.data_index):
            expected = structure.data_inputs[j].type
            if isinstance(i, tuple):  # literal scalars packed in one vector (lift_data)
                value = np.array([shared[k].get_value() for k in i], dtype=expected.dtype)
                origin = None
            else:
                value = np.array(shared[i].get_value(), order="C")
                origin = sources[shared[i]]
            if value.shape != expected.shape or value.dtype != expected.dtype:
                raise AssertionError(f"data {j} of a structure: {value.dtype}{value.shape}, "
                                     f"compiled for {expected}")  # one key, one structure
            values.append(value)
            origins.append(origin)
        return cls(values, origins)

    def refresh(self) -> None:
        """Read the ``pm.Data`` values again (their shapes are fixed: :meth:`matches`)."""
        for j, source in enumerate(self._sources):
            if source is not None:
                self.values[j][...] = source.get_value()

    def positions(self, name: str) -> list[int]:
        """Where the model's ``pm.Data`` variable ``name`` is among :attr:`values` (none if the
        functions do not use it)."""
        return [j for j, source in enumerate(self._sources) if source is not None and source.name == name]

    def matches(self) -> bool:
        """True while every ``pm.Data`` the functions use keeps the shape compiled for."""
        return all(source is None or np.shape(source.get_value()) == self.values[j].shape
                   for j, source in enumerate(self._sources))

    def fill(self, table: np.ndarray) -> np.ndarray:
        """The environment array for the counts buffer ``table``: its address, then the data's."""
        return np.concatenate([[table.ctypes.data], self.addresses]).astype(np.int64)


def _at_cell(param, cell, shape: tuple):
    """``param`` (broadcastable to the latent's ``shape``) at the flat cell index ``cell``, by
    scalar indexing (0 on broadcast axes), so that PyTensor lifts the index into the
    elementwise graph that computes the parameter and one cell costs O(1), not O(cells)."""
    param = pt.as_tensor(param)
    index, stride = [], 1
    for size in reversed(shape):
        index.append((cell // stride) % size)
        stride *= size
    index = index[::-1]
    axes = index[len(index) - param.ndim:] if param.ndim else []
    return param[tuple(0 if b else i for i, b in zip(axes, param.type.broadcastable))] if axes else param


def _jit_function(inputs, outputs):
    """The numba-jitted function of ``inputs`` computing ``outputs``, compiled with PyMC's
    rewrites (``pymc.pytensorf.compile``), which turn the parameter checks of log densities
    (sigma > 0, ...) into -inf: a raised check cannot leave the native functions (numba would
    print it and return an undefined value)."""
    try:
        fn = compile_pymc(inputs, outputs, mode="NUMBA", on_unused_input="ignore")
    except Exception as err:  # pragma: no cover - depends on the model's Ops
        raise NotCompilableError(f"PyTensor's numba backend cannot compile the model: {err}") from err
    if fn.get_shared():
        raise NotCompilableError(f"the model's functions read shared variables that are not data: "
                                 f"{fn.get_shared()}")
    return fn.vm.jit_fn


def _native(name: str, inputs: list, outputs: list, data_inputs: list, signature,
            template: str, **constants):
    """The cfunc ``name`` of ``template`` (formatted with ``constants`` and the unpacking of
    the data from the environment array) around the jitted function of ``inputs`` + the data's
    inputs -> ``outputs``, from the model cache or compiled (and saved)."""
    unpack = "".join(
        f"    d{j} = carray(pointer(env[{j + 1}]), {tuple(v.type.shape)}, dtype=np.{v.type.dtype})\n"
        for j, v in enumerate(data_inputs))
    args = "".join(f", d{j}" for j in range(len(data_inputs)))
    source = template.format(unpack=unpack, data=args, k=len(data_inputs) + 1, **constants)
    try:
        key = graph_key([*inputs, *data_inputs], outputs, source)
    except NotCacheableError:
        key = None

    def namespace():
        return {"carray": numba.carray, "np": np, "pointer": pointer,
                "jit_fn": _jit_function([*inputs, *data_inputs], outputs)}

    return native_function(key, source, name, signature, namespace)


_LOGP_GRAD_SOURCE = """
def logp_grad(q_ptr, grad_ptr, env_ptr):
    q = carray(q_ptr, ({n},), dtype=np.float64)
    grad = carray(grad_ptr, ({n},), dtype=np.float64)
    env = carray(env_ptr, ({k},), dtype=np.int64)
    counts = carray(pointer(env[0]), ({m},), dtype=np.int64)
{unpack}
    lp, g = jit_fn(q, counts{data})
    for i in range({n}):
        grad[i] = g[i]
    return lp[()]
"""


class PriorTable:
    """log p(x_i = v | theta, counts) of one latent's cells, as native functions compiled when
    first asked for (a model compiles only those its count blocks use):

    * ``point``: one cell at one value (off the window: the exact draws' tails);
    * ``full``: a (d, W) grid, one row of W candidates per cell (the windows of independent
      cells and group totals, all of one width);
    * ``flat``: a flat list of candidates with the cell of each (nested sums, whose boxes
      differ in width: at the size of a state the widest box is ~10 times the median, and a
      table padded to it costs ~10 times the work and memory).

    The table functions take every subexpression that depends on the grid alone (and the
    model's data) as an input: :meth:`prepare` and :meth:`prepare_flat` compute those once per
    grid (log v!, support masks, ...), so a sweep costs about 1 ns per candidate instead of 15
    (measured on a Poisson prior). Subexpressions are taken out only where their shape is the
    grid's (else they stay in the graph). A structure's table; :meth:`bound` gives a model's
    (sharing the compiled functions)."""

    def __init__(self, functions: "_OnDemand", shape: tuple, data=None):
        self._functions, self.shape, self._data = functions, tuple(shape), data

    def bound(self, data: "ModelData") -> "PriorTable":
        """This table with a model's data (for :meth:`prepare`), sharing the compiled functions."""
        return PriorTable(self._functions, self.shape, data)

    @property
    def point_address(self) -> int:
        return self._functions.get("point").address

    @property
    def full_address(self) -> int:
        return self._functions.get("full").address

    @property
    def flat_address(self) -> int:
        return self._functions.get("flat").address

    def prepare(self, grid: np.ndarray) -> tuple[list, np.ndarray]:
        """The grid-only terms on ``grid`` (d, W) and the int64 array of their addresses that
        ``full`` takes (keep both alive while it is used)."""
        grid = np.ascontiguousarray(grid, dtype=np.int64).reshape((*self.shape, grid.shape[-1]))
        return self._functions.get("full").hoisted(grid, data=self._data)

    def prepare_flat(self, grid: np.ndarray, rows: np.ndarray) -> tuple[list, np.ndarray]:
        """The grid-only terms on the flat candidates ``grid`` (K,) of the cells ``rows`` (K,)
        and the int64 array of their addresses that ``flat`` takes."""
        return self._functions.get("flat").hoisted(np.ascontiguousarray(grid, dtype=np.int64),
                                              np.ascontiguousarray(rows, dtype=np.int64), data=self._data)


class _OnDemand:
    """Functions compiled when first asked for, each once (under a lock: chains run in threads)."""

    def __init__(self, builders: dict):
        self._builders, self._built, self._lock = builders, {}, threading.Lock()

    def get(self, kind: str):
        with self._lock:
            if kind not in self._built:
                self._built[kind] = self._builders[kind]()
            return self._built[kind]


def _prior_builders(table, flat, point, q, counts, grid, flat_grid, flat_rows, cell, value, data_inputs,
                    *, n: int, m: int, shape: tuple) -> dict:
    """The compilers of a latent's :class:`PriorTable` functions, from its graphs: the point, the
    padded table on ``grid`` and the flat table on (``flat_grid``, ``flat_rows``)."""
    d = int(np.prod(shape))
    return {
        "point": lambda: _native("prior_point", [q, counts, cell, value], [point], data_inputs, PRIOR_POINT,
                                 _POINT_SOURCE, n=n, m=m),
        "full": lambda: _table_function("prior_table", table, [q, counts], [grid], data_inputs, PRIOR_TABLE,
                                        _TABLE_SOURCE, f"({d}, width)", f".reshape({tuple(shape)} + (width,))",
                                        rows=d, n=n, m=m, d=d, shape=tuple(shape)),
        "flat": lambda: _table_function("prior_flat", flat, [q, counts], [flat_grid, flat_rows], data_inputs,
                                        PRIOR_FLAT, _FLAT_SOURCE, "(size,)", "", n=n, m=m),
    }


class _TableFunction:
    """A compiled table function and the function of its grid-only terms (:class:`PriorTable`)."""

    def __init__(self, native, hoist_fn, dtypes):
        self._native, self._hoist_fn, self._dtypes = native, hoist_fn, dtypes

    @property
    def address(self) -> int:
        return self._native.address

    def hoisted(self, *grid_inputs, data) -> tuple[list, np.ndarray]:
        if self._hoist_fn is None:
            return [], np.zeros(1, dtype=np.int64)
        shape = grid_inputs[0].shape
        buffers = [np.ascontiguousarray(np.broadcast_to(v, shape), dtype=dtype)
                   for v, dtype in zip(self._hoist_fn(*grid_inputs, *data.values), self._dtypes)]
        return buffers, np.array([b.ctypes.data for b in buffers], dtype=np.int64)


def _table_function(name, table, dynamic, grid_inputs, data_inputs, signature, template, carray_shape,
                    reshape, rows=None, **constants) -> _TableFunction:
    """The native table function ``name`` of ``template`` computing ``table`` from ``dynamic``
    (q, counts) and ``grid_inputs`` (as ``rows`` rows of candidates if given), its grid-only
    terms taken out as inputs (each passed as a buffer of ``carray_shape``, reshaped by
    ``reshape``) and the function computing them."""
    frontier = _grid_only_terms(table, grid_inputs, dynamic)
    replacements = [pt.tensor(dtype=v.dtype, shape=(None,) * v.ndim) for v in frontier]
    graph = clone_replace(table, dict(zip(frontier, replacements)))
    if rows is not None:
        graph = graph.reshape((rows, grid_inputs[0].shape[-1]))
    dtypes = [v.dtype for v in frontier]
    unpack = "".join(
        f"    h{j} = carray(pointer(hoisted[{j}]), {carray_shape}, dtype=np.{np.dtype(dt).name}){reshape}\n"
        for j, dt in enumerate(dtypes))
    native = _native(name, [*dynamic, *grid_inputs, *replacements], [graph], data_inputs, signature,
                     template.replace("{hoisted_unpack}", unpack), h=max(len(dtypes), 1),
                     hoisted="".join(f", h{j}" for j in range(len(dtypes))), **constants)
    hoist_fn = (pytensor.function([*grid_inputs, *data_inputs], frontier, mode="FAST_COMPILE",
                                  on_unused_input="ignore") if frontier else None)
    return _TableFunction(native, hoist_fn, dtypes)


def _per_cell_first(output, grid, rows, gathered, per_cell):
    """``output`` (a function of the candidates ``grid`` and their cells ``rows``) with every
    elementwise function of the candidates' parameters alone computed once per cell and then
    gathered: f(p[rows]) -> f(p)[rows]. ``gathered`` are p[rows] (one entry per candidate),
    ``per_cell`` the p. (A negative binomial's log(mu alpha), lgamma(alpha), ... are then
    evaluated once per cell, not once per candidate.)"""
    order = io_toposort([grid, rows, *gathered], [output])
    varying = {grid, rows}  # what depends on the candidates or their cells
    for node in order:
        if any(i in varying for i in node.inputs):
            varying.update(node.outputs)
    lifted = set(gathered)
    for node in order:
        if (isinstance(node.op, Elemwise) and any(i in lifted for i in node.inputs)
                and all(i in lifted or (i not in varying and all(i.type.broadcastable)) for i in node.inputs)):
            lifted.update(node.outputs)
    consumed = {i for node in order if not set(node.outputs) <= lifted for i in node.inputs if i in lifted}
    if output in lifted:
        consumed.add(output)
    to_cells = dict(zip(gathered, per_cell))
    return clone_replace(output, {v: clone_replace(v, to_cells)[rows] for v in consumed if v not in to_cells})


def _grid_only_terms(output, grid_inputs, dynamic_inputs) -> list:
    """Variables of ``output``'s graph computed from ``grid_inputs`` (and data or constants) but
    not from ``dynamic_inputs``, that feed a computation that depends on the latter, with the
    grid's number of dimensions and no broadcastable axis (so they can be computed once per
    grid and passed in with the grid's shape)."""
    order = io_toposort([*grid_inputs, *dynamic_inputs], [output])
    static, dynamic = set(grid_inputs), set(dynamic_inputs)
    ndim = grid_inputs[0].ndim
    for node in order:
        if any(i in dynamic for i in node.inputs):
            dynamic.update(node.outputs)
        elif any(i in static for i in node.inputs):
            static.update(node.outputs)
    frontier = []
    for node in order:
        if not any(o in dynamic for o in node.outputs):
            continue
        for v in node.inputs:
            if (v in static and v not in grid_inputs and v not in frontier and v.ndim == ndim
                    and not any(b for b in v.type.broadcastable)):
                frontier.append(v)
    return frontier


_TABLE_SOURCE = """
def prior_table(q_ptr, env_ptr, grid_ptr, out_ptr, width, hoisted_ptr):
    q = carray(q_ptr, ({n},), dtype=np.float64)
    env = carray(env_ptr, ({k},), dtype=np.int64)
    counts = carray(pointer(env[0]), ({m},), dtype=np.int64)
    grid = carray(grid_ptr, ({d}, width), dtype=np.int64).reshape({shape} + (width,))
    out = carray(out_ptr, ({d}, width), dtype=np.float64)
    hoisted = carray(hoisted_ptr, ({h},), dtype=np.int64)
{hoisted_unpack}{unpack}
    (table,) = jit_fn(q, counts, grid{hoisted}{data})
    for i in range({d}):  # a plain copy: out[:] = table would compile numba's shape-error path
        for j in range(width):
            out[i, j] = table[i, j]
"""

_FLAT_SOURCE = """
def prior_flat(q_ptr, env_ptr, grid_ptr, rows_ptr, out_ptr, size, hoisted_ptr):
    q = carray(q_ptr, ({n},), dtype=np.float64)
    env = carray(env_ptr, ({k},), dtype=np.int64)
    counts = carray(pointer(env[0]), ({m},), dtype=np.int64)
    grid = carray(grid_ptr, (size,), dtype=np.int64)
    rows = carray(rows_ptr, (size,), dtype=np.int64)
    out = carray(out_ptr, (size,), dtype=np.float64)
    hoisted = carray(hoisted_ptr, ({h},), dtype=np.int64)
{hoisted_unpack}{unpack}
    (table,) = jit_fn(q, counts, grid, rows{hoisted}{data})
    for i in range(size):
        out[i] = table[i]
"""

_MIXING_SOURCE = """
def group_mixing(q_ptr, env_ptr, out_ptr):
    q = carray(q_ptr, ({n},), dtype=np.float64)
    env = carray(env_ptr, ({k},), dtype=np.int64)
    counts = carray(pointer(env[0]), ({m},), dtype=np.int64)
    out = carray(out_ptr, ({d}, 3), dtype=np.float64)
{unpack}
    (p,) = jit_fn(q, counts{data})
    for i in range({d}):
        for j in range(3):
            out[i, j] = p[i, j]
"""

_POINT_SOURCE = """
def prior_point(q_ptr, env_ptr, cell, value):
    q = carray(q_ptr, ({n},), dtype=np.float64)
    env = carray(env_ptr, ({k},), dtype=np.int64)
    counts = carray(pointer(env[0]), ({m},), dtype=np.int64)
{unpack}
    cells = np.empty(1, dtype=np.int64)
    values = np.empty(1, dtype=np.int64)
    cells[0] = cell
    values[0] = value
    (lp,) = jit_fn(q, counts, cells, values{data})
    return lp[()]
"""
