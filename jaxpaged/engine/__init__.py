"""The engine: input processing, the scheduler, a runner and output processing, joined by a thin loop.

`from jaxpaged.engine import Engine` imports the name's module on first use (`jaxpaged.lazy_exports`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxpaged.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from jaxpaged.engine.builder import EngineBuilder
    from jaxpaged.engine.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
    from jaxpaged.engine.engine import Engine
    from jaxpaged.engine.parts import EngineParts

_HOMES = {"DEFAULT_KV_CACHE_BYTES": "config", "Engine": "engine", "EngineBuilder": "builder",
          "EngineConfig": "config", "EngineParts": "parts"}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
