"""`Authenticate`: an ASGI middleware that lets a request through only with a configured API key.

As vLLM's ``--api-key``: the key comes as ``Authorization: Bearer <key>``; a
missing or wrong one is a 401 in the OpenAI error shape (the official client
raises `openai.AuthenticationError`). ``/health`` and ``/metrics`` stay open,
so probes and scrapers need no key. The request's `Tenant` is put in the ASGI
scope's state (``request.state.tenant``) for the routes.

A tenant with ``max_concurrent_requests`` has at most that many requests in
this API server process at once, counted from the request's arrival to its
response's last byte (a stream counts until it ends); one more is a 429 with
``Retry-After`` before its body is read.

Its 401s and 429s are counted in the `jaxpaged:http_requests` series, whose
middleware (http_metrics.py) wraps this one.
"""

from __future__ import annotations

import collections

from jaxpaged.server.errors import error_response
from jaxpaged.server.tenants import TenantKeys

OPEN_PATHS = frozenset({"/health", "/metrics"})
RETRY_AFTER_S = 1


class Authenticate:
    """Wraps an ASGI app: every HTTP request but `OPEN_PATHS` needs one of ``keys``."""

    def __init__(self, app, *, keys: TenantKeys) -> None:
        self.app, self.keys = app, keys
        self.in_flight: collections.Counter[str] = collections.Counter()  # tenant name -> requests in this process

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
        limit = tenant.max_concurrent_requests
        if limit is not None and self.in_flight[tenant.name] >= limit:
            response = error_response(429, f"tenant {tenant.name!r} has {limit} requests in flight, its limit "
                                      "(max_concurrent_requests); retry when one has finished", "RateLimitError",
                                      headers={"Retry-After": str(RETRY_AFTER_S)})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        self.in_flight[tenant.name] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[tenant.name] -= 1
            if not self.in_flight[tenant.name]:
                del self.in_flight[tenant.name]


def _bearer_token(headers) -> bytes:
    """The token of the request's ``Authorization: Bearer`` header, as sent (b'' when there is none)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""
