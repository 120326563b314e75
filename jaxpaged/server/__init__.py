"""OpenAI-compatible HTTP serving: a FastAPI app (`api.build_app`, its routes in `routes/`) over an
`EngineClient` — the engine core in its own process (`core/`, the default), an engine loop in a thread
of this process (`async_engine.AsyncEngine`), or replicas on Ray Serve (`replicas/`).

    jaxpaged serve --model=tiny --host=127.0.0.1 --port=8000

The package imports nothing itself: an API server process imports only what it serves through
(`api`, `core.client`, `request_stream`, ...), never the engine or JAX.
"""
