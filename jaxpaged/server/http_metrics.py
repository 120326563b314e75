"""Request counts and time to the response's start, by path, as a plain ASGI middleware.

Starlette's `@app.middleware("http")` (`BaseHTTPMiddleware`) relays every body
chunk of a streaming response through an in-memory stream and an extra task;
at thousands of SSE chunks a second that relay was the API server's largest
single cost. This one only looks at the `http.response.start` message and
passes every other message straight on.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram


class CountRequests:
    """ASGI middleware: `requests{method, path, status}` +1 and `latency{path}` observed at response start."""

    def __init__(self, app, *, requests: Counter, latency: Histogram) -> None:
        self.app, self.requests, self.latency = app, requests, latency

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        started = False

        async def send_counted(message) -> None:
            nonlocal started
            if not started and message["type"] == "http.response.start":
                started = True
                route = scope.get("route")
                path = route.path if route is not None else "unmatched"
                self.requests.labels(scope["method"], path, str(message["status"])).inc()
                self.latency.labels(path).observe(time.perf_counter() - start)
            await send(message)

        await self.app(scope, receive, send_counted)
