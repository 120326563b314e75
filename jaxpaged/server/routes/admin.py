"""``/debug/*``, mounted only with ``enable_debug_endpoints`` (tests and benchmarks): make the engine loop
die, or sleep between two steps, as an unexpected error or a long compile would."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from jaxpaged.server.routes.state import ServerState

MAX_STALL_S = 60


def router(state: ServerState) -> APIRouter:
    """The debug routes over `state`."""
    routes = APIRouter()

    @routes.post("/debug/crash_engine_loop")
    async def crash():
        """For tests: make the engine loop die, as an unexpected engine error would."""
        state.client.crash_for_test()
        return PlainTextResponse("")

    @routes.post("/debug/stall_engine_loop")
    async def stall(request: Request):
        """For tests: make the engine loop sleep between two steps, as a long compile would."""
        body = await request.json()
        seconds = body.get("seconds") if isinstance(body, dict) else None
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds <= MAX_STALL_S:
            raise ValueError(f"seconds must be a number in [0, {MAX_STALL_S}], got {seconds!r}")
        await state.client.stall_for_test(float(seconds))
        return PlainTextResponse("")

    return routes
