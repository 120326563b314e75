"""The prefix cache over HTTP: ``POST /reset_prefix_cache`` (409 while blocks are in use) and
``POST /v1/cache/pin`` (keep a prefix's blocks for a TTL)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from jaxpaged.server.errors import error_response
from jaxpaged.server.protocol import PinRequest
from jaxpaged.server.routes.state import ServerState


def router(state: ServerState) -> APIRouter:
    """The cache routes over `state`."""
    routes = APIRouter()

    @routes.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        if not await state.client.reset_prefix_cache():
            return error_response(409, "some cached blocks are in use; nothing was reset", "ConflictError")
        return PlainTextResponse("")

    @routes.post("/v1/cache/pin")
    async def pin_prefix(body: PinRequest):
        prompt = state.prompt_or_messages(body, "pin")
        if isinstance(prompt, list):
            state.limits.check_token_ids(prompt)
        cached = await state.client.pin_prefix(prompt, body.ttl_s, cache_salt=body.cache_salt)
        return {"cached_blocks": cached, "ttl_s": body.ttl_s}

    return routes
