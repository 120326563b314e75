"""`Authenticate`: an ASGI middleware that lets a request through only with a configured API key.

As vLLM's ``--api-key``: the key comes as ``Authorization: Bearer <key>``; a
missing or wrong one is a 401 in the OpenAI error shape (the official client
raises `openai.AuthenticationError`). ``/health`` and ``/metrics`` stay open,
so probes and scrapers need no key. The request's `Tenant` is put in the ASGI
scope's state (``request.state.tenant``) for the routes.

A tenant's request limits are counted by the engine's loop, across every API
server process (tenant_admission.py), not here.

Its 401s are counted in the `jaxpaged:http_requests` series, whose
middleware (http_metrics.py) wraps this one.
"""

from __future__ import annotations

from jaxpaged.server.errors import error_response
from jaxpaged.server.tenants import TenantKeys

OPEN_PATHS = frozenset({"/health", "/metrics"})


class Authenticate:
    """Wraps an ASGI app: every HTTP request but `OPEN_PATHS` needs one of ``keys``."""

    def __init__(self, app, *, keys: TenantKeys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        tenant = self.keys.tenant_of(_bearer_token(scope["headers"]))
        if tenant is None:
            response = error_response(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                      "AuthenticationError", headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


def _bearer_token(headers) -> bytes:
    """The token of the request's ``Authorization: Bearer`` header, as sent (b'' when there is none)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""
