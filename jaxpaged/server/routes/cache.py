"""The prefix cache over HTTP: ``POST /reset_prefix_cache`` (409 while blocks are in use) and
``POST /v1/cache/pin`` (keep a prefix's blocks for a TTL).

With API keys, an admin's reset drops every tenant's cache (409 while blocks are in use); a user's drops
only the free cached blocks of its own namespace, on the device and in the host and disk tiers (never
refused: its blocks in use keep their entries, other tenants' blocks are untouched). A pin is made in the caller's own namespace; an admin may name
another tenant's with ``tenant``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from jaxpaged.server.errors import error_response
from jaxpaged.server.protocol import PinRequest
from jaxpaged.server.routes.state import ServerState


def router(state: ServerState) -> APIRouter:
    """The cache routes over `state`."""
    routes = APIRouter()

    @routes.post("/reset_prefix_cache")
    async def reset_prefix_cache(raw: Request):
        if not await state.client.reset_prefix_cache(state.reset_namespace(raw)):
            return error_response(409, "some cached blocks are in use; nothing was reset", "ConflictError")
        return PlainTextResponse("")

    @routes.post("/v1/cache/pin")
    async def pin_prefix(body: PinRequest, raw: Request):
        cache_salt = state.cache_salt(raw, body.cache_salt, body.tenant)
        prompt = state.prompt_or_messages(body, "pin")
        if isinstance(prompt, list):
            state.limits.check_token_ids(prompt)
        cached = await state.client.pin_prefix(prompt, body.ttl_s, cache_salt=cache_salt,
                                               quota=state.pin_quota(raw))
        return {"cached_blocks": cached, "ttl_s": body.ttl_s}

    return routes
