"""OpenAI-compatible HTTP serving: a FastAPI app (`api.build_app`, its routes in `routes/`) over an
`EngineClient` — the engine core in its own process (`core/`, the default), an engine loop in a thread
of this process (`AsyncEngine`), or replicas on Ray Serve (`replicas/`).

    python scripts/serve.py --model=tiny --host=127.0.0.1 --port=8000
"""

from jaxpaged.server.async_engine import AsyncEngine, EngineDeadError, QueueFullError

__all__ = ["AsyncEngine", "EngineDeadError", "QueueFullError"]
