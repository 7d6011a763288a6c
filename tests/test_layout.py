"""The package's layering (DESIGN.md): dependencies point down, cli/io -> utility -> inference
-> mechanisms/distributions -> lattice, with no import cycle, counting imports inside
functions and the package __init__ modules that importing a submodule runs first."""

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dpinfer"
# lower number = lower layer; a module may import only its own layer or lower ones
LAYERS = {"lattice": 0, "distributions": 1, "mechanisms": 1, "inference": 2, "utility": 3, "io": 4}


def _modules() -> dict:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph() -> dict:
    """{module: set of modules it imports}: an edge a -> b for every dpinfer import in a (top
    level or in functions), plus a -> p for every subpackage p above b that does not contain a
    (importing b runs p's __init__ first, unless a is itself inside p; the root package is the
    public API: it imports everything and is imported first, so it is left out)."""
    modules = _modules()

    def resolve(name):
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph = {module: set() for module in modules}
    for module, (path, is_package) in modules.items():
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith("dpinfer.") else None
                while target and "." in target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
                    target = target.rpartition(".")[0]
    return graph


def _layer(module: str):
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_the_import_graph_has_no_cycle():
    graphlib.TopologicalSorter(import_graph()).prepare()  # raises CycleError naming a cycle


def test_imports_point_down_the_layers():
    upward = [(a, b) for a, targets in import_graph().items() for b in targets
              if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)]
    assert not upward, upward


def test_engines_never_call_back_into_planning():
    """dp.sample is one pipeline (DESIGN.md): planning decides, an engine runs finished plans.
    No engine module imports a planning module, and planning imports no engine."""
    graph = import_graph()
    engines = "dpinfer.inference.engines"
    planning = "dpinfer.inference.planning"
    back = [(a, b) for a, targets in graph.items() for b in targets
            if (a.startswith(engines) and b.startswith(planning))
            or (a.startswith(planning) and b.startswith(engines))]
    assert not back, back
