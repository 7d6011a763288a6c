"""A disk cache of the compiled engine's model functions, keyed by the model's graph.

Compiling a model's native functions (:mod:`dpinfer.inference.engines.compiled.model`) takes seconds: numba
types and generates the code of each function's graph. A script that builds the same
``pm.Model`` in every run, or a loop that builds a new model object of the same structure for
every data set, would pay that every time. This module keeps each compiled function on disk
under a key that is a hash of the graph it computes, so a function is compiled once per
structure and machine and then loaded (milliseconds).

**What the key covers.** The graph handed to the compiler, with its data taken out as inputs
(:func:`lift_data`): the model's ``pm.Data`` and the numbers written into it as literals
(distribution parameters such as ``pm.Beta("theta", 10, 10)``'s, observed values, arrays
such as an exposure column) become inputs whose values are passed at run time, so two models
that differ only in those numbers share their compiled functions. What stays in the graph,
and in the key: every operation with its parameters, every static shape and dtype, and the
values of the constants that remain (integers that can set shapes or indices). Beside the
graph the key holds the source of the native wrapper, the versions of dpinfer (a hash of its
source files), PyMC, PyTensor, numba, llvmlite, NumPy and Python, and PyTensor's settings
that change the generated code. numba adds the CPU it compiled for. A change of any of
these is a new key: nothing compiled for another structure or version is ever loaded.

**Safety.** Loading compiled code is running code (numba's cache files are pickles). The
cache lives in the user's own cache directory (``$DPINFER_CACHE_DIR``, else
``$XDG_CACHE_HOME/dpinfer``, else ``~/.cache/dpinfer``), created private (mode 0700); a
directory or file that another user owns or could have written is never loaded (the whole
cache is then passed over with a warning). A cache that cannot be written, or an entry that
cannot be read back (a corrupt or truncated file), means compiling as if there were no
cache, with a :class:`ModelCacheWarning`; it never means another function.

**Size.** Entries of old versions and of structures no longer used are never loaded again,
so the cache is bounded: after each compilation the least recently used entries (a load
refreshes an entry's time) are deleted until the cache holds at most ``$DPINFER_CACHE_MAX_MB``
megabytes (default 1024; the entry just written is always kept).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import platform
import shutil
import stat
import sys
import time
import types as pytypes
import warnings
import weakref
from pathlib import Path

import numpy as np
from numba.core.compiler_lock import global_compiler_lock
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.fg import AbstractFunctionGraph
from pytensor.graph.traversal import io_toposort

CACHE_ENV = "DPINFER_CACHE_DIR"
SIZE_ENV = "DPINFER_CACHE_MAX_MB"
DEFAULT_MAX_MB = 1024
_FORMAT = 1  # the layout of an entry; bumped when it changes


class ModelCacheWarning(UserWarning):
    """The model cache could not be used (the model is compiled as if there were none)."""


class NotCacheableError(ValueError):
    """A graph holds something the key cannot describe exactly (it is compiled uncached)."""


# --- where -------------------------------------------------------------------------------------
def cache_root() -> Path:
    """The cache's directory (module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser() / "models"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "dpinfer" / "models"


def size_limit() -> int:
    """The cache's bound in bytes: ``$DPINFER_CACHE_MAX_MB`` megabytes, else 1024 MB."""
    raw = os.environ.get(SIZE_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_MB * 10**6
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0 or megabytes == float("inf"):
        raise ValueError(f"{SIZE_ENV} must be a number of megabytes >= 0, got {raw!r}")
    return int(megabytes * 10**6)


def _this_user() -> int:
    return os.getuid()


def _untrusted(path: Path) -> str | None:
    """Why ``path`` must not be loaded from (None: it may): a symbolic link, owned by another
    user, or writable by group or others."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    if info.st_uid != _this_user():
        return f"{path} is owned by uid {info.st_uid}, not this user ({_this_user()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.filemode(info.st_mode)})"
    return None


def _private_root() -> Path | None:
    """The cache root and its parent, each created mode 0700 where missing; None (with a
    warning, once) if they cannot be made or are not this user's alone."""
    root = cache_root()
    try:
        for path in (root.parent, root):
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.mkdir(mode=0o700)
                path.chmod(0o700)  # whatever the umask
            reason = _untrusted(path)
            if reason is not None:
                _warn_once(f"the model cache {root} is not used: {reason}; models are compiled "
                           f"afresh (set {CACHE_ENV} to a directory of your own)")
                return None
        return root
    except OSError as err:
        _warn_once(f"the model cache {root} cannot be used ({err}); models are compiled afresh "
                   f"(set {CACHE_ENV} to a writable directory of your own)")
        return None


_WARNED: set = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, ModelCacheWarning, stacklevel=4)


# --- the key -----------------------------------------------------------------------------------
def _versions() -> tuple:
    import llvmlite
    import numba
    import pymc
    import pytensor

    from dpinfer._kernel_cache import source_hash

    config = pytensor.config
    settings = tuple((name, str(getattr(config, name, None))) for name in (
        "floatX", "numba__fastmath", "optimizer", "optimizer_including", "optimizer_excluding",
        "optimizer_requiring", "on_opt_error", "cast_policy"))
    return (_FORMAT, source_hash(), pymc.__version__, pytensor.__version__, numba.__version__,
            llvmlite.__version__, np.__version__, sys.version, platform.machine(), settings)


_VERSIONS: tuple | None = None


def versions() -> tuple:
    """The versions and settings every key includes (module docstring); read once."""
    global _VERSIONS
    if _VERSIONS is None:
        _VERSIONS = _versions()
    return _VERSIONS


_MAX_DEPTH = 12


def describe(obj, depth: int = 0):
    """A value that is equal for two objects exactly when they compute the same thing: numbers,
    strings and arrays by value (object arrays element by element), classes and functions by
    qualified name (closures and lambdas by their code and cells), Ops defined by an inner
    graph (OpFromGraph) by that graph, other objects (Ops, types, transforms) by class and
    attributes.
    Raises :class:`NotCacheableError` for what it cannot describe."""
    if depth > _MAX_DEPTH:
        raise NotCacheableError(f"object nested too deeply to describe: {type(obj).__name__}")
    if obj is None or isinstance(obj, (bool, int, str, bytes)):
        return obj
    if isinstance(obj, float):
        return ("float", float(obj).hex())
    if isinstance(obj, complex):
        return ("complex", obj.real.hex(), obj.imag.hex())
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(describe(o, depth + 1) for o in obj))
    if isinstance(obj, (set, frozenset)):
        return ("set", tuple(sorted(repr(describe(o, depth + 1)) for o in obj)))
    if isinstance(obj, dict):
        return ("dict", tuple(sorted((repr(describe(k, depth + 1)), describe(v, depth + 1))
                                     for k, v in obj.items())))
    if isinstance(obj, slice):
        return ("slice", describe((obj.start, obj.stop, obj.step), depth + 1))
    if obj is Ellipsis:
        return "..."
    if isinstance(obj, np.ndarray) and obj.dtype == object:  # its bytes are pointers: by element
        return ("objects", obj.shape, tuple(describe(o, depth + 1) for o in obj.ravel()))
    if isinstance(obj, np.ndarray):
        data = np.ascontiguousarray(obj)
        return ("array", str(data.dtype), data.shape, hashlib.sha256(data.tobytes()).hexdigest())
    if isinstance(obj, (np.generic, np.dtype)):
        return ("numpy", type(obj).__name__, str(obj), describe(np.asarray(obj).tobytes()
                                                                if isinstance(obj, np.generic) else ""))
    if isinstance(obj, type):
        return ("class", obj.__module__, obj.__qualname__)
    if isinstance(obj, (pytypes.FunctionType, pytypes.BuiltinFunctionType, pytypes.MethodType)):
        return _describe_function(obj, depth)
    if isinstance(obj, Variable):
        raise NotCacheableError(f"a graph variable held by an Op: {obj}")
    inner = getattr(obj, "fgraph", None)
    if isinstance(inner, AbstractFunctionGraph):  # an Op defined by an inner graph (OpFromGraph, LogAddExp)
        return ("inner graph", type(obj).__module__, type(obj).__qualname__,
                _graph_digest(inner.inputs, inner.outputs, depth + 1))
    props = getattr(type(obj), "__props__", None)
    if props is not None:
        fields = {p: getattr(obj, p) for p in props}
    elif hasattr(obj, "__dict__"):
        fields = {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    else:
        raise NotCacheableError(f"cannot describe a {type(obj).__qualname__}")
    return ("object", type(obj).__module__, type(obj).__qualname__,
            tuple((k, describe(v, depth + 1)) for k, v in sorted(fields.items())))


def _describe_function(fn, depth: int):
    if isinstance(fn, pytypes.MethodType):
        return ("method", describe(fn.__self__, depth + 1), _describe_function(fn.__func__, depth + 1))
    name = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn)))
    code = getattr(fn, "__code__", None)
    if code is None or ("<" not in name[1] and code.co_name == name[1].rpartition(".")[2]
                        and not fn.__closure__):
        return ("function", *name)  # a named function of a module: its version is in the key
    cells = tuple(describe(c.cell_contents, depth + 1) for c in fn.__closure__ or ())
    defaults = describe(fn.__defaults__, depth + 1)
    return ("closure", *name, hashlib.sha256(code.co_code).hexdigest(),
            describe(code.co_consts, depth + 1), code.co_names, cells, defaults)


def graph_key(inputs: list, outputs: list, *extra) -> str:
    """The hash of the graph from ``inputs`` to ``outputs`` (structure, types, remaining
    constants' values), of ``extra`` and of :func:`versions`. Every root of the graph must be
    one of ``inputs`` or a constant."""
    digest = hashlib.sha256(repr(versions()).encode())
    digest.update(repr(describe(extra)).encode())
    digest.update(_graph_digest(inputs, outputs).encode())
    return digest.hexdigest()


def _graph_digest(inputs: list, outputs: list, depth: int = 0) -> str:
    """The hash of the graph from ``inputs`` to ``outputs``: each node's Op (:func:`describe`),
    where its inputs come from (an input by position and type, an earlier node's output, a
    constant by type and value) and its outputs' types."""
    ids = {v: ("input", i, str(v.type)) for i, v in enumerate(inputs)}
    digest = hashlib.sha256()
    for k, node in enumerate(io_toposort(inputs, outputs)):
        refs = []
        for v in node.inputs:
            if v not in ids:
                if not isinstance(v, Constant):
                    raise NotCacheableError(f"the graph has an input that is not data: {v} ({v.type})")
                ids[v] = ("constant", str(v.type), describe(np.asarray(v.data), depth + 1))
            refs.append(ids[v])
        for j, out in enumerate(node.outputs):
            ids[out] = ("node", k, j)
        digest.update(repr((describe(node.op, depth + 1), tuple(refs),
                            tuple(str(o.type) for o in node.outputs))).encode())
    digest.update(repr(tuple(ids[o] if o in ids else ("constant", str(o.type)) for o in outputs)).encode())
    return digest.hexdigest()


def structure_key(model, latents: list, excluded: list) -> str:
    """The hash of a model's structure (:func:`graph_key` of the graph PyMC makes of it,
    ``pymc.model.fgraph``: every variable, its distribution, transform, dims and name), of its
    latent counts and left-out releases (``latents``, ``excluded``: names) and of
    :func:`versions`. Roots that are not constants (value variables, random generators, data)
    count by their type only: the data's values are not the structure."""
    from pymc.model.fgraph import fgraph_from_model

    fgraph, _ = fgraph_from_model(model)
    roots = [v for node in io_toposort([], fgraph.outputs) for v in node.inputs
             if v.owner is None and not isinstance(v, Constant)]
    unique = list(dict.fromkeys(roots))
    kinds = tuple((type(v).__name__, np.shape(v.get_value()) if _holds_array(v) else None)
                  for v in unique)  # a data variable's shape is structure (static in the code)
    return graph_key(unique, fgraph.outputs, "structure", tuple(latents), tuple(excluded), kinds)


def _holds_array(variable) -> bool:
    return hasattr(variable, "get_value") and isinstance(variable.get_value(), np.ndarray)


# --- numba's cache, pointed at an entry ---------------------------------------------------------
_ENTRIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # python function -> (dir, key)


def _install_locator() -> None:
    from numba.core.caching import CacheImpl, _CacheLocator

    class EntryLocator(_CacheLocator):
        """Directs numba's cache of a registered function to its entry's directory."""

        def __init__(self, path: Path, key: str):
            self._path, self._key = path, key

        def ensure_cache_path(self):
            self._path.mkdir(mode=0o700, exist_ok=True)

        def get_cache_path(self):
            return str(self._path)

        def get_source_stamp(self):
            return self._key

        def get_disambiguator(self):
            return self._key[:16]

        @classmethod
        def from_function(cls, py_func, py_file):
            entry = _ENTRIES.get(py_func)
            return None if entry is None else cls(*entry)

    if not any(c.__name__ == "EntryLocator" for c in CacheImpl._locator_classes):
        CacheImpl._locator_classes.insert(0, EntryLocator)


_LOADED: dict = {}  # key -> cfunc, for this process
# what native_function did in this process: "reused" (this process had it), "loaded" (from
# disk), "compiled" (and saved where the cache could take it)
STATS: collections.Counter = collections.Counter()
_LOG = logging.getLogger("dpinfer")


_NOTICES = [False]  # whether a compilation is announced on stderr (the innermost notices())


@contextlib.contextmanager
def notices(enabled: bool):
    """Within: each model function compiled (not loaded from the cache) is announced on stderr
    before and, if it took 10 s or more, after (a large model's first compilation can take
    minutes, which a progress line must not leave silent)."""
    _NOTICES.append(bool(enabled))
    try:
        yield
    finally:
        _NOTICES.pop()


def native_function(key: str | None, source: str, name: str, signature, compile_namespace):
    """The numba ``cfunc`` of ``signature`` defined by ``source`` (function ``name``), loaded
    from the cache entry ``key`` when there is one, else compiled with the globals returned by
    ``compile_namespace()`` and saved there. Compiled without the cache when ``key`` is None
    (a graph the key cannot describe) or the cache cannot be used (:class:`ModelCacheWarning`)."""
    if key is not None and key in _LOADED:
        STATS["reused"] += 1
        return _LOADED[key]
    root = None if key is None else _private_root()
    entry = None if root is None else root / key[:2] / key
    cfunc = None
    if entry is not None and entry.is_dir():
        try:
            cfunc = _load(entry, key, source, name, signature)
        except Exception as err:  # noqa: BLE001 - a corrupt entry: compile afresh, say so
            _warn_once(f"the cached model function {entry} could not be loaded "
                       f"({type(err).__name__}: {err}); it is compiled afresh")
            shutil.rmtree(entry, ignore_errors=True)
        if cfunc is not None:
            STATS["loaded"] += 1
            _touch(entry)
    if cfunc is None:
        start = time.perf_counter()
        if _NOTICES[-1]:
            print(f"dpinfer: compiling the model's {name} (the first fit of a model of this structure; kept in "
                  "the model cache, later fits load it)", file=sys.stderr, flush=True)
        cfunc = _compile(entry, key, source, name, signature, compile_namespace())
        STATS["compiled"] += 1
        _LOG.debug("dpinfer: compiled the model's %s in %.2f s", name, time.perf_counter() - start)
        if _NOTICES[-1] and time.perf_counter() - start >= 10:
            print(f"dpinfer: compiled the model's {name} in {time.perf_counter() - start:.0f} s", file=sys.stderr,
                  flush=True)
        if entry is not None and entry.is_dir():
            prune(size_limit(), keep=entry)
    if key is not None:
        _LOADED[key] = cfunc
    return cfunc


def _cfunc(source: str, name: str, signature, namespace: dict, entry=None, key=None):
    """A numba CFunc (not compiled yet) of the function ``name`` of ``source``, its cache
    directed to ``entry`` when given."""
    from numba.core.ccallback import CFunc
    from numba.core.sigutils import normalize_signature

    code = compile(source, f"dpinfer-model-{name}", "exec")
    # numba rebuilds a loaded function's environment from the module its globals name
    scope = {"__name__": __name__, **namespace}
    exec(code, scope)  # noqa: S102 - dpinfer's own generated wrapper source
    cfunc = CFunc(scope[name], normalize_signature(signature), locals={}, options={})
    if entry is not None:
        _ENTRIES[scope[name]] = (entry, key)
        _install_locator()
        cfunc.enable_caching()
    return cfunc


def _adopt(cfunc, compiled) -> None:
    """Give ``cfunc`` the compiled code ``compiled`` (what ``CFunc.compile`` does with it)."""
    cfunc._library = compiled.library
    cfunc._wrapper_name = compiled.fndesc.llvm_cfunc_wrapper_name
    cfunc._wrapper_address = compiled.library.get_pointer_to_function(cfunc._wrapper_name)


@global_compiler_lock  # as CFunc.compile
def _load(entry: Path, key: str, source: str, name: str, signature):
    """The cfunc saved in ``entry``, or None if there is none or it is not this user's alone."""
    for path in (entry.parent, entry, *entry.iterdir()):
        reason = _untrusted(path)
        if reason is not None:
            _warn_once(f"the cached model function in {entry} is not loaded: {reason}")
            return None
    cfunc = _cfunc(source, name, signature, {}, entry, key)
    compiled = cfunc._cache.load_overload(cfunc._sig, cfunc._targetdescr.target_context)
    if compiled is None:
        return None
    _adopt(cfunc, compiled)
    return cfunc


@global_compiler_lock  # as CFunc.compile
def _compile(entry, key, source: str, name: str, signature, namespace: dict):
    """Compile the cfunc and save it in ``entry`` (None: no cache)."""
    import numba

    if entry is not None:
        try:
            entry.parent.mkdir(mode=0o700, exist_ok=True)
            entry.mkdir(mode=0o700, exist_ok=True)
        except OSError as err:
            _warn_once(f"the model cache {entry.parent.parent} cannot be written ({err}); models "
                       "are compiled afresh in every process")
            entry = None
    cfunc = _cfunc(source, name, signature, namespace, entry, key)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", numba.NumbaWarning)  # unusual Ops: code not cacheable
        compiled = cfunc._compile_uncached()
    _adopt(cfunc, compiled)
    if entry is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", numba.NumbaWarning)
                cfunc._cache.save_overload(cfunc._sig, compiled)
        except OSError as err:
            _warn_once(f"the model cache {entry.parent.parent} cannot be written ({err}); models "
                       "are compiled afresh in every process")
    return cfunc


def _touch(entry: Path) -> None:
    """Mark ``entry`` as used now (its time orders :func:`prune`)."""
    try:
        os.utime(entry)
    except OSError:
        pass  # a read-only cache: entries are still loaded, only their order is not kept


def _entries(root: Path) -> list:
    """[(last use, size in bytes, directory)] of the cache's entries, least recently used first."""
    found = []
    for entry in (p for p in root.glob("??/*") if p.is_dir()) if root.is_dir() else ():
        try:
            size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
            found.append((entry.stat().st_mtime, size, entry))
        except OSError:
            continue  # deleted meanwhile by another process
    return sorted(found, key=lambda item: item[0])


def prune(limit: int, keep: Path | None = None) -> int:
    """Delete the least recently used entries until the cache holds at most ``limit`` bytes,
    never ``keep``; returns how many were deleted."""
    entries = _entries(cache_root())
    total = sum(size for _, size, _ in entries)
    deleted = 0
    for _, size, entry in entries:
        if total <= limit:
            break
        if entry == keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        total -= size
        deleted += 1
    return deleted


def contents() -> tuple[Path, int, int]:
    """(the cache's directory, its number of compiled functions, their size in bytes)."""
    root = cache_root()
    entries = _entries(root)
    return root, len(entries), sum(size for _, size, _ in entries)


def clear() -> None:
    """Delete this user's model cache (``dpinfer`` recompiles models on next use)."""
    _LOADED.clear()
    root = cache_root()
    if root.exists():
        shutil.rmtree(root)


# --- data out of the graph ----------------------------------------------------------------------
def thaw_literals(model):
    """(a copy of ``model`` whose literal data are shared variables, their sources).

    Literal data are the numbers written into the model: every floating-point constant, and
    the integer constants that are distribution parameters (``pm.Binomial("x", 1000, p)``'s
    1000) or observed values. Each becomes a shared variable of the constant's static shape
    with its dtype widened to float64 (every parameter of a continuous distribution) or int64
    (so that 10 and 1000, or 10 and 4.5 in ``pm.Beta("theta", 10, 10)``, make the same
    graph). The copy's ``pm.Data`` are copies of the model's; ``sources`` maps every
    shared variable of the copy that holds data to the model's own ``pm.Data`` variable it
    copies (whose value is read again before each use), or to None for a literal. Shared dim
    lengths are frozen (shapes are part of the structure). Built with PyMC's own model <->
    graph round trip (``pymc.model.fgraph``), as ``freeze_dims_and_data`` is."""
    import pytensor
    import pytensor.tensor as pt
    from pymc.model.fgraph import ModelFreeRV, ModelObservedRV, fgraph_from_model, model_from_fgraph
    from pytensor.graph import FunctionGraph
    from pytensor.graph.replace import clone_replace
    from pytensor.tensor.random.op import RandomVariable

    saved = dict(model.rvs_to_initial_values)
    try:
        for rv in model.rvs_to_initial_values:
            model.rvs_to_initial_values[rv] = None
        fg, memo = fgraph_from_model(model)
    finally:
        model.rvs_to_initial_values.update(saved)

    replacements, sources = {}, {}
    for dim_length in model.dim_lengths.values():
        if hasattr(dim_length, "get_value"):
            replacements[memo[dim_length]] = pt.constant(dim_length.get_value())
    for datum in model.data_vars:
        if hasattr(datum, "get_value"):
            sources[memo[datum].owner.inputs[0]] = datum
    for node in fg.toposort():
        parameters, continuous = set(), False
        if isinstance(node.op, RandomVariable):
            parameters = set(node.op.dist_params(node))
            continuous = node.outputs[1].dtype.startswith("float")
        elif isinstance(node.op, ModelObservedRV):
            parameters = {node.inputs[1]}
        for v in node.inputs:
            if (v in replacements or not isinstance(v, Constant)
                    or not isinstance(v.type, pt.TensorType)):
                continue
            value = np.asarray(v.data)
            if value.size == 0 or not (value.dtype.kind == "f"
                                       or (value.dtype.kind in "iu" and v in parameters)):
                continue
            # a continuous law's parameters are real whatever the literal (Beta(10, 10) and
            # Beta(4.5, 10) are one structure); a count law's keep their kind (Binomial's n);
            # an input of a graph Op (PyMC's symbolic distributions), directly or through
            # ExpandDims (ZeroSumNormal's float32 sigma), keeps its exact type
            real = value.dtype.kind == "f" or continuous
            wide = value.dtype if _feeds_graph_op(fg, v) else ("float64" if real else "int64")
            wide = np.array(value, dtype=wide, order="C")
            shared = pytensor.shared(wide, shape=wide.shape)
            replacements[v] = shared
            sources[shared] = None
    if replacements:
        outputs = clone_replace(fg.outputs, replace=replacements, rebuild_strict=False)
        coords, lengths = fg._coords, fg._dim_lengths
        fg = FunctionGraph(outputs=outputs, clone=False)
        fg._coords = coords
        fg._dim_lengths = {dim: replacements.get(n, n) for dim, n in lengths.items()}
        values = {}  # value variables of the rebuilt variables' types (as freeze_dims_and_data)
        for node in fg.apply_nodes:
            if isinstance(node.op, ModelFreeRV):
                rv, old, *_ = node.inputs
                transform = node.op.transform
                new = rv.type() if transform is None else transform.forward(rv, *rv.owner.inputs).type()
                new.name = old.name
                values[old] = new
        fg.replace_all(tuple(values.items()), import_missing=True)
    thawed = model_from_fgraph(fg, mutate_fgraph=True)
    return thawed, sources


def _feeds_graph_op(fg, v) -> bool:
    """True if ``v`` is an input of an OpFromGraph, directly or through dimension shuffles."""
    from pytensor.compile.builders import OpFromGraph
    from pytensor.tensor.elemwise import DimShuffle

    for client, _ in fg.clients[v]:
        if isinstance(client.op, OpFromGraph):
            return True
        if isinstance(client.op, DimShuffle) and _feeds_graph_op(fg, client.outputs[0]):
            return True
    return False


PACKED_DTYPES = ("float64", "int64")  # the literal scalars of these dtypes travel in one vector each


def lift_data(outputs: list, sources: dict) -> tuple:
    """(outputs with their data as inputs, the inputs, their positions in ``sources``): every
    shared variable in ``sources`` that the outputs use becomes an input of its value's shape
    and dtype, in the order the graph first uses it (``sources`` as :func:`thaw_literals`
    returns it), except the literal scalars (``sources[v]`` None, 0-d) of a dtype in
    ``PACKED_DTYPES``: those of one dtype are the entries of one vector input, its position a
    tuple of theirs. A native function pays for each input it takes (B3's log density and
    gradient took 2.7 us with its 13 literal scalars as inputs, 2.4 us with them packed and 2.0
    us with them folded as constants, which would make a model structure per value)."""
    import pytensor.tensor as pt
    from pytensor.graph.replace import clone_replace

    position = {v: i for i, v in enumerate(sources)}
    replacements, inputs, index = {}, [], []
    packed = {}  # dtype -> [its literal scalars]
    for node in io_toposort([], outputs):
        for v in node.inputs:
            if v in replacements or v not in sources:
                continue
            value = np.asarray(v.get_value())
            if sources[v] is None and value.ndim == 0 and value.dtype.name in PACKED_DTYPES:
                packed.setdefault(value.dtype.name, []).append(v)
                replacements[v] = None  # set below, once the vector's length is known
                continue
            new = pt.tensor(dtype=value.dtype, shape=value.shape, name=f"data{len(inputs)}")
            replacements[v] = new
            inputs.append(new)
            index.append(position[v])
    for dtype, scalars in packed.items():
        vector = pt.tensor(dtype=dtype, shape=(len(scalars),), name=f"literals_{dtype}")
        replacements.update({v: vector[i] for i, v in enumerate(scalars)})
        inputs.append(vector)
        index.append(tuple(position[v] for v in scalars))
    if not replacements:
        return list(outputs), [], []
    return clone_replace(list(outputs), replacements), inputs, index
