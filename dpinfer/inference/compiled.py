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
  candidate counts (one row of W candidates per cell), the counts' block of the Gibbs sweep (:class:`PriorTable`: the terms that
  depend on the grid alone, such as log v! of a Poisson pmf, are computed once per grid);
* ``expand``: q and the counts of a batch of draws -> every named variable of the model in
  its constrained space (free variables, Deterministics), for the trace.

``logp_grad`` and the prior tables are numba ``cfunc``s handed to the compiled kernels by
address (:mod:`dpinfer.inference.native`). The model's data (pm.Data, constants) are frozen
into them; :meth:`CompiledModel.matches` tells whether the data they use have changed since.
The releases' own data are not among those (their terms are left out), so a refit after
``pm.set_data`` of new releases alone keeps the compiled model: replication studies compile once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.initial_point import make_initial_point_fn
from pymc.logprob.abstract import _logprob_helper
from pymc.pytensorf import compile as compile_pymc
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.traversal import ancestors, io_toposort

from dpinfer.inference.native import LOGP_GRAD, PRIOR_POINT, PRIOR_TABLE, pointer


class NotCompilableError(ValueError):
    """The model has a part the compiled engine cannot run (a discrete parameter that is not
    one of the latent counts, or an Op without a numba implementation)."""


@dataclass
class CompiledModel:
    """Native functions of one model (module docstring). Build with :func:`compile_model`."""

    names: list  # continuous free variables, in the order of q
    slices: list  # their slices of q
    shapes: list  # their (transformed) shapes
    latents: list  # latent count names, in the order of the counts vector
    latent_slices: dict
    latent_shapes: dict
    logp_grad: object  # numba cfunc, LOGP_GRAD
    prior_tables: dict  # name -> PriorTable
    expand_fn: object  # PyTensor function (q batch, counts batch) -> named values
    expand_names: list
    _initial_point: object
    _data: dict = field(repr=False, default_factory=dict)  # the data the functions use
    _data_names: set = field(repr=False, default_factory=set)  # every data variable's name

    @property
    def n(self) -> int:
        """Dimension of the parameters' unconstrained vector q."""
        return self.slices[-1].stop if self.slices else 0

    @property
    def n_counts(self) -> int:
        return sum(int(np.prod(s)) for s in self.latent_shapes.values())

    @property
    def logp_grad_address(self) -> int:
        return self.logp_grad.address

    def initial_q(self, seed, model=None, initvals: dict | None = None) -> np.ndarray:
        """PyMC's initial point of the parameters with U(-1, 1) jitter in the unconstrained
        space (PyMC's default ``jitter+adapt_diag`` start), flattened; ``initvals`` (values
        or strategies by variable name in the constrained space, as ``pm.sample`` takes them)
        override it through PyMC's own initial-point function. Start values given for the
        latent counts are not used (the engine starts them on the releases' fibre)."""
        overrides = {k: v for k, v in (initvals or {}).items() if k not in self.latent_shapes}
        if overrides:
            jitter = {rv for rv in model.free_RVs if model.rvs_to_values[rv].name in self.names
                      and rv.name not in overrides}
            point = make_initial_point_fn(model=model, overrides=overrides, jitter_rvs=jitter,
                                          return_transformed=True)(seed)
        else:
            point = self._initial_point(seed)
        if not self.names:
            return np.zeros(0)
        return np.concatenate([np.asarray(point[n], dtype=float).ravel() for n in self.names])

    def counts_vector(self, values: dict) -> np.ndarray:
        """Concatenate the latents' counts (name -> array) into the engine's int64 vector."""
        out = np.empty(self.n_counts, dtype=np.int64)
        for name in self.latents:
            out[self.latent_slices[name]] = np.asarray(values[name]).ravel()
        return out

    def expand(self, q: np.ndarray, counts: np.ndarray) -> dict:
        """Named values for a batch of draws: q (B, n), counts (B, n_counts) -> {name: (B, ...)}."""
        outputs = self.expand_fn(np.ascontiguousarray(q, dtype=float),
                                 np.ascontiguousarray(counts, dtype=np.int64))
        return dict(zip(self.expand_names, outputs))

    def matches(self, model) -> bool:
        """True while the model has the same data variables and those the functions use hold
        the values frozen into them (the releases' data may change)."""
        current = _shared_values(model)
        return current.keys() == self._data_names and all(
            np.array_equal(current[k], v) for k, v in self._data.items())


def _shared_values(model) -> dict:
    return {v.name: np.asarray(v.get_value()) for v in model.data_vars if hasattr(v, "get_value")}


def compile_model(model, latents: list, exclude: list) -> CompiledModel:
    """Native functions of ``model`` with the free count variables ``latents`` as data and the
    observed variables ``exclude`` (the releases, whose terms are constant given the counts)
    left out.

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
    point = model.initial_point()
    values = [model.rvs_to_values[rv] for rv in params]
    names = [v.name for v in values]
    shapes = [np.shape(point[n]) for n in names]
    sizes = [int(np.prod(s)) for s in shapes]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    slices = [slice(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:])]

    latent_values = [model.rvs_to_values[rv] for rv in latents]
    latent_shapes = {rv.name: tuple(int(s) for s in rv.shape.eval()) for rv in latents}
    counts_offsets = np.concatenate([[0], np.cumsum([int(np.prod(latent_shapes[n])) for n in latent_names])])
    latent_slices = {n: slice(int(a), int(b)) for n, a, b in zip(latent_names, counts_offsets[:-1], counts_offsets[1:])}

    q = pt.dvector("q")
    counts = pt.lvector("counts")
    to_inputs = {v: q[s].reshape(shape) for v, s, shape in zip(values, slices, shapes)}
    to_inputs.update({v: counts[latent_slices[n]].reshape(latent_shapes[n]).astype(v.dtype)
                      for v, n in zip(latent_values, latent_names)})

    terms = [rv for rv in model.basic_RVs if rv not in exclude] + list(model.potentials)
    logp = model.logp(vars=terms)
    grads = pt.grad(logp, values) if values else []
    grad = pt.concatenate([g.ravel() for g in grads]) if values else pt.zeros(0)
    logp, grad = clone_replace([logp, grad], to_inputs)
    logp_fn = _numba_function([q, counts], [logp, grad])
    logp_grad = _logp_grad_cfunc(logp_fn, int(offsets[-1]), int(counts_offsets[-1]))

    prior_tables = {}
    graphs = [logp, grad, *(rv.shape for rv in latents)]  # every graph frozen below
    n, m = int(offsets[-1]), int(counts_offsets[-1])
    for rv, name in zip(latents, latent_names):
        node = rv.owner
        grid = pt.tensor("grid", dtype="int64", shape=(*latent_shapes[name], None))
        # parameters with a trailing axis broadcast against each cell's row of candidates
        row_params = [pt.shape_padright(pt.as_tensor(p)) for p in node.op.dist_params(node)]
        _, prior = node.op(*row_params, rng=pt.random.rng(), return_next_rng=True)
        table = pt.broadcast_to(_logprob_helper(prior, grid), grid.shape)
        [table] = model.replace_rvs_by_values([table])
        table = clone_replace(table, to_inputs).astype("float64")
        cell = pt.lvector("cell")  # (1,): numba takes tensors, not scalars
        value = pt.lvector("value")
        cell_params = [_at_cell(p, cell[0], latent_shapes[name]) for p in node.op.dist_params(node)]
        _, one = node.op(*cell_params, rng=pt.random.rng(), return_next_rng=True)
        [point] = model.replace_rvs_by_values([_logprob_helper(one, value[0])])
        point = clone_replace(point, to_inputs).astype("float64")
        graphs += [table, point]
        prior_tables[name] = PriorTable.build(table, q, counts, grid, n, m, latent_shapes[name],
                                              point=(point, cell, value))

    expand_vars = [rv for rv in params] + list(model.deterministics)
    expand_names = [v.name for v in expand_vars]
    outputs = clone_replace(model.replace_rvs_by_values(expand_vars), to_inputs)
    q_batch = pt.dmatrix("q_batch")
    counts_batch = pt.lmatrix("counts_batch")
    outputs = vectorize_graph(outputs, replace={q: q_batch, counts: counts_batch})
    # the Python backend: compiles at once and runs vectorised numpy over the whole batch
    expand_fn = pytensor.function([q_batch, counts_batch], outputs, on_unused_input="ignore",
                                  mode="FAST_COMPILE")

    initial_point = make_initial_point_fn(model=model, jitter_rvs=set(params), return_transformed=True)
    data = _shared_values(model)
    # the parameters' graphs carry the data their initial point may use
    used = {v.name for v in ancestors([*graphs, *outputs, *params])} & data.keys()
    return CompiledModel(
        names=names, slices=slices, shapes=shapes, latents=latent_names,
        latent_slices=latent_slices, latent_shapes=latent_shapes, logp_grad=logp_grad,
        prior_tables=prior_tables, expand_fn=expand_fn, expand_names=expand_names,
        _initial_point=initial_point, _data={k: data[k] for k in used}, _data_names=set(data),
    )


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


def _numba_function(inputs, outputs):
    """(numba-jitted function of the inputs and the shared values, the shared values).

    Compiled with PyMC's rewrites (``pymc.pytensorf.compile``), which turn the parameter
    checks of log densities (sigma > 0, ...) into -inf: a raised check cannot leave the
    native functions (numba would print it and return an undefined value)."""
    try:
        fn = compile_pymc(inputs, outputs, mode="NUMBA", on_unused_input="ignore")
    except Exception as err:  # pragma: no cover - depends on the model's Ops
        raise NotCompilableError(f"PyTensor's numba backend cannot compile the model: {err}") from err
    shared = tuple(np.asarray(v.get_value()) for v in fn.get_shared())
    return fn.vm.jit_fn, shared


def _logp_grad_cfunc(fn, n: int, m: int):
    jit_fn, shared = fn

    @numba.cfunc(LOGP_GRAD)
    def logp_grad(q_ptr, grad_ptr, counts_ptr):
        q = numba.carray(q_ptr, (n,), dtype=np.float64)
        grad = numba.carray(grad_ptr, (n,), dtype=np.float64)
        counts = numba.carray(counts_ptr, (m,), dtype=np.int64)
        lp, g = jit_fn(q, counts, *shared)
        for i in range(n):
            grad[i] = g[i]
        return lp[()]

    return logp_grad


class PriorTable:
    """log p(x_i = v | theta, counts) on a grid of candidate counts, as two native functions.

    ``point`` evaluates one cell at one value (off the window: the exact draws' tails).
    ``full`` is the table's graph with every subexpression that depends on the grid alone (and
    the model's constants) taken out as an input: :meth:`prepare` computes those once per grid
    (log v!, support masks, ...), so a sweep costs about 1 ns per candidate instead of 15
    (measured on a Poisson prior). Subexpressions are taken out only where their shape is the
    grid's (else they stay in the graph)."""

    def __init__(self, point, full, hoist_fn, hoisted_types, shape):
        self.point, self.full, self._hoist_fn = point, full, hoist_fn
        self._hoisted_types, self.shape = hoisted_types, shape

    @classmethod
    def build(cls, table, q, counts, grid, n: int, m: int, shape: tuple, *, point) -> "PriorTable":
        point_graph, cell, value = point
        point = _point_cfunc(_numba_function([q, counts, cell, value], [point_graph]), n, m)
        frontier = _grid_only_terms(table, grid, [q, counts])
        replacements = [pt.tensor(dtype=v.dtype, shape=(None,) * v.ndim) for v in frontier]
        full_graph = clone_replace(table, dict(zip(frontier, replacements)))
        full = _table_cfunc(_numba_function([q, counts, grid, *replacements], [full_graph]),
                            n, m, shape, [v.dtype for v in frontier])
        hoist_fn = pytensor.function([grid], frontier, mode="FAST_COMPILE") if frontier else None
        return cls(point, full, hoist_fn, [v.dtype for v in frontier], shape)

    @property
    def point_address(self) -> int:
        return self.point.address

    @property
    def full_address(self) -> int:
        return self.full.address

    def prepare(self, grid: np.ndarray) -> tuple[list, np.ndarray]:
        """The grid-only terms on ``grid`` (d, W) and the int64 array of their addresses that
        ``full`` takes (keep both alive while it is used)."""
        if self._hoist_fn is None:
            return [], np.zeros(1, dtype=np.int64)
        grid = grid.reshape((*self.shape, grid.shape[-1]))
        buffers = [np.ascontiguousarray(np.broadcast_to(v, grid.shape), dtype=dtype)
                   for v, dtype in zip(self._hoist_fn(grid), self._hoisted_types)]
        return buffers, np.array([b.ctypes.data for b in buffers], dtype=np.int64)


def _grid_only_terms(output, grid, dynamic_inputs) -> list:
    """Variables of ``output``'s graph computed from ``grid`` (and constants) but not from
    ``dynamic_inputs``, that feed a computation that depends on the latter, with the grid's
    number of dimensions and no broadcastable axis (so they can be computed once per grid
    and passed in with the grid's shape)."""
    order = io_toposort([grid, *dynamic_inputs], [output])
    static, dynamic = {grid}, set(dynamic_inputs)
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
            if (v in static and v is not grid and v not in frontier and v.ndim == grid.ndim
                    and not any(b for b in v.type.broadcastable)):
                frontier.append(v)
    return frontier


_TABLE_SOURCE = """
def prior_table(q_ptr, counts_ptr, grid_ptr, out_ptr, width, hoisted_ptr):
    q = carray(q_ptr, (n,), dtype=np.float64)
    counts = carray(counts_ptr, (m,), dtype=np.int64)
    grid = carray(grid_ptr, (d, width), dtype=np.int64).reshape(shape + (width,))
    out = carray(out_ptr, (d, width), dtype=np.float64)
    hoisted = carray(hoisted_ptr, (k,), dtype=np.int64)
{unpack}
    (table,) = jit_fn(q, counts, grid{extra}, *shared)
    out[:] = np.ascontiguousarray(table).reshape((d, width))
"""


def _table_cfunc(fn, n: int, m: int, shape: tuple, hoisted_dtypes: list):
    """The PRIOR_TABLE cfunc around a numba function (q, counts, grid, *hoisted, *shared),
    the hoisted buffers read from the address array (generated per number of buffers)."""
    jit_fn, shared = fn
    unpack = "".join(
        f"    h{j} = carray(pointer(hoisted[{j}]), (d, width), dtype=np.{np.dtype(dt).name})"
        f".reshape(shape + (width,))\n" for j, dt in enumerate(hoisted_dtypes))
    extra = "".join(f", h{j}" for j in range(len(hoisted_dtypes)))
    namespace = {"carray": numba.carray, "np": np, "pointer": pointer, "jit_fn": jit_fn,
                 "shared": shared, "n": n, "m": m, "d": int(np.prod(shape)), "shape": tuple(shape),
                 "k": max(len(hoisted_dtypes), 1)}
    exec(_TABLE_SOURCE.format(unpack=unpack, extra=extra), namespace)
    return numba.cfunc(PRIOR_TABLE)(namespace["prior_table"])


def _point_cfunc(fn, n: int, m: int):
    jit_fn, shared = fn

    @numba.cfunc(PRIOR_POINT)
    def prior_point(q_ptr, counts_ptr, cell, value):
        q = numba.carray(q_ptr, (n,), dtype=np.float64)
        counts = numba.carray(counts_ptr, (m,), dtype=np.int64)
        cells = np.empty(1, dtype=np.int64)
        values = np.empty(1, dtype=np.int64)
        cells[0] = cell
        values[0] = value
        (lp,) = jit_fn(q, counts, cells, values, *shared)
        return lp[()]

    return prior_point
