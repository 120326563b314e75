"""A package's exported names imported on first use (PEP 562), so importing one light submodule does not
import the package's heavy ones (an API server process imports `jaxpaged.engine.output_processor`, not
the engine, its runner or JAX)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """The module-level ``__getattr__`` of ``package``: ``homes`` maps each exported name to the submodule
    (relative to the package) that defines it; the first lookup imports it and keeps the value."""

    def __getattr__(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
