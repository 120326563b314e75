"""The engine: input processing, the scheduler, a runner and output processing, joined by a thin loop."""

from jaxpaged.engine.builder import EngineBuilder, EngineParts
from jaxpaged.engine.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from jaxpaged.engine.engine import Engine

__all__ = ["DEFAULT_KV_CACHE_BYTES", "Engine", "EngineBuilder", "EngineConfig", "EngineParts"]
