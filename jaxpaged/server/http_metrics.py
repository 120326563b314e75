"""Request counts and time to the response's start, by path, as a plain ASGI middleware.

Starlette's `@app.middleware("http")` (`BaseHTTPMiddleware`) relays every body
chunk of a streaming response through an in-memory stream and an extra task;
at thousands of SSE chunks a second that relay was the API server's largest
single cost. This one only looks at the `http.response.start` message and
passes every other message straight on.

It is the outermost middleware, so the refusals of the ones inside it (401
from `Authenticate`, 413 from `BodyLimit`) are counted too. Such
a refusal never reaches the router, so it is labelled with the request's path
when that is one of the app's routes, else ``unmatched`` (a client cannot
grow the label set).
"""

from __future__ import annotations

import time
from collections.abc import Collection

from prometheus_client import Counter, Histogram


class CountRequests:
    """ASGI middleware: `requests{method, path, status}` +1 and `latency{path}` observed at response start."""

    def __init__(self, app, *, requests: Counter, latency: Histogram,
                 route_paths: Collection[str] = frozenset()) -> None:
        """``route_paths``: the app's route paths, the labels a request refused before routing may get."""
        self.app, self.requests, self.latency = app, requests, latency
        self.route_paths = route_paths

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
                path = route.path if route is not None else self._unrouted_label(scope["path"])
                self.requests.labels(scope["method"], path, str(message["status"])).inc()
                self.latency.labels(path).observe(time.perf_counter() - start)
            await send(message)

        await self.app(scope, receive, send_counted)

    def _unrouted_label(self, path: str) -> str:
        """The label of a request no route answered: its path if it names a route, else ``unmatched``."""
        return path if path in self.route_paths else "unmatched"
