"""`BodyLimit`: an ASGI middleware that refuses request bodies over a byte limit with a 413, and bodies with
more JSON values than any request can use with a 400, before they are parsed.

The declared `Content-Length` is checked before anything is read; a body sent
without one (chunked) is read up to the limit and refused as soon as it
passes it, so a client cannot make the server buffer more than the limit.
The body is then replayed to the app, and later `receive()` calls (the
disconnect message) go to the server as usual.

Parsing costs memory per JSON value (a Python object each), so a body's
values are bounded too (`json_values_at_most`): counted on the raw bytes as
its commas, `[` and `{` (C-speed; those inside strings count as well, which
only errs towards refusing a body made of millions of them).

Not FastAPI's `max_body_size`: its refusal of a declared `Content-Length` is
a plain-text "Content Too Large", sent past the app's exception handlers, and
every refusal here must have the OpenAI error shape.
"""

from __future__ import annotations

from typing import Callable

from jaxpaged.server.errors import error_response

DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 2**20  # a 1M-token prompt as JSON ids is ~7 MiB


class BodyLimit:
    """Wraps an ASGI app; `max_bytes=None` disables the byte limit. `max_json_values`, when given, is called for
    each body: the most JSON values it may hold."""

    def __init__(self, app, *, max_bytes: int | None, max_json_values: Callable[[], int] | None = None) -> None:
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                      or max_bytes < 1):
            raise ValueError(f"max_request_body_bytes must be a positive int or None, got {max_bytes!r}")
        self.app, self.max_bytes = app, max_bytes
        self._max_json_values = max_json_values

    async def __call__(self, scope, receive, send) -> None:
        """Pass the request on with its body buffered, or answer 413."""
        if scope["type"] != "http" or (self.max_bytes is None and self._max_json_values is None):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if self.max_bytes is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if self.max_bytes is not None and size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False
        if self._max_json_values is not None:
            most, values = self._max_json_values(), json_values_at_most(body)
            if values > most:
                response = error_response(400, f"the request body holds up to {values} JSON values, more than any "
                                               f"request can use (at most {most})", "BadRequestError")
                await response(scope, receive, send)
                return

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        response = error_response(413, f"the request body is larger than the server's limit "
                                       f"(max_request_body_bytes={self.max_bytes})", "RequestTooLargeError")
        await response(scope, receive, send)


def json_values_at_most(body: bytes) -> int:
    """An upper bound on the number of JSON values in `body` (each value but the first follows a comma or
    opens an array or object)."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1
