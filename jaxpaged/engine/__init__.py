"""The engine: input processing, the scheduler, a runner and output processing, joined by a thin loop."""

from jaxpaged.engine.builder import EngineBuilder
from jaxpaged.engine.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from jaxpaged.engine.engine import Engine
from jaxpaged.engine.parts import EngineParts

__all__ = ["DEFAULT_KV_CACHE_BYTES", "Engine", "EngineBuilder", "EngineConfig", "EngineParts"]
