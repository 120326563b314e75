"""OpenAI-compatible HTTP serving: an engine loop in its own thread, and a FastAPI app in front.

    jaxpaged serve --model=tiny --host=127.0.0.1 --port=8000
"""

from jaxpaged.server.async_engine import AsyncEngine, EngineDeadError, QueueFullError

__all__ = ["AsyncEngine", "EngineDeadError", "QueueFullError"]
