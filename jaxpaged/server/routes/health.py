"""Service endpoints: ``GET /health`` (503 once the engine is gone), ``GET /v1/models`` and ``GET /metrics``
(this server's HTTP series, then the engine's when it lives in another process or in replicas)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from jaxpaged.server.errors import error_response
from jaxpaged.server.routes.state import ServerState


def router(state: ServerState) -> APIRouter:
    """The service routes over `state`."""
    routes = APIRouter()

    @routes.get("/health")
    async def health():
        if state.client.is_running:
            return PlainTextResponse("")
        return error_response(503, "the engine loop is not running", "ServiceUnavailableError")

    @routes.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "jaxpaged",
                                            "max_model_len": state.client.model_info.max_model_len}]}

    @routes.get("/metrics")
    async def metrics():
        text = generate_latest(state.registry) + (await state.client.engine_metrics()).encode()
        return PlainTextResponse(text, media_type=CONTENT_TYPE_LATEST)

    return routes
