"""Names of a package loaded on first use (PEP 562), so that importing the package costs
little and a script pays only for the modules it uses."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict, subpackages: tuple = ()):
    """(``__all__``, ``__getattr__``, ``__dir__``) for ``package``: each name in
    ``exports`` ({module: names}) is imported from its module on first access, each of
    ``subpackages`` on first access as ``package.name``; both are then kept in the package."""
    where = {name: module for module, names in exports.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name in where:
            value = getattr(importlib.import_module(where[name]), name)
        elif name in subpackages:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list:
        return sorted(set(namespace) | set(where) | set(subpackages))

    return sorted(where), __getattr__, __dir__
