"""Streaming a request's outputs to its HTTP client: SSE responses, final outputs, and disconnects.

Every way a response can end closes its request streams (`close_streams`),
which aborts their unfinished requests, so a client that leaves frees its
blocks whatever state the response was in.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Awaitable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from jaxpaged.outputs import RequestOutput
from jaxpaged.server import responses as R
from jaxpaged.server.errors import error_body, status_of


def sse_response(streams: list, head: dict, choice, *, include_usage: bool) -> StreamingResponse:
    """Stream every output as SSE chunks: one per completion that moved (`choice(prompt index, completion, output)`),
    a usage chunk when asked, then `[DONE]`; if the engine fails meanwhile, an error event and no `[DONE]`."""
    async def events():
        counts = _Counts()
        template = R.ChunkTemplate(head)
        try:
            async for i, out in merge(streams):
                for c in out.outputs:
                    payload = choice(i, c, out)
                    if payload is not None:  # None: the route holds this delta back (tool calls being parsed)
                        yield template.chunk(payload)
                _count(out, counts)
        except Exception as err:  # noqa: BLE001 - the client must tell a failure from a finished answer
            status, kind = status_of(err)
            yield R.sse(error_body(status, str(err), kind))
            return
        if include_usage:
            yield R.sse(head | {"choices": [], "usage": R.usage(*counts.totals())})
        yield R.sse("[DONE]")
    return StreamsResponse(events(), streams)


class StreamsResponse(StreamingResponse):
    """An SSE response that closes its request streams however it ends.

    Starlette cancels the sending task when the client disconnects; the
    generator may then be suspended at a `yield` (or never started), so its
    own `finally` would run only when it is garbage-collected. Closing here,
    synchronously, aborts every unfinished request at once.
    """

    def __init__(self, content, streams: list) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close_streams(self._streams)


async def unless_disconnected(request: Request, work: Awaitable):
    """Await a handler's `work`, cancelling it if the client disconnects first (its requests are then aborted).

    A disconnected client gets nothing (499 in the server's own log), as in vLLM.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler itself is cancelled (shutdown)
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.cancelled() and task.done():
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # let it finish unwinding (it aborts what it queued)
    return Response(status_code=499)


async def _disconnected(request: Request) -> None:
    """Return once the ASGI server says the client has gone (the body has already been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Counts:
    """Token counts of a streamed request, for its usage chunk."""

    def __init__(self):
        self.prompt, self.completion, self.cached = {}, 0, {}

    def totals(self) -> tuple[int, int, int]:
        """(prompt, completion, cached) tokens over every prompt of the request."""
        return sum(self.prompt.values()), self.completion, sum(self.cached.values())


def _count(out: RequestOutput, counts: _Counts) -> None:
    counts.prompt[out.request_id] = len(out.prompt_token_ids)
    counts.completion += sum(len(c.token_ids) for c in out.outputs)
    counts.cached[out.request_id] = out.num_cached_tokens


async def final_outputs(streams: list) -> list[RequestOutput]:
    """Each stream's final output (non-streaming requests ask for FINAL_ONLY); a cancelled or failed
    wait aborts every request still running."""
    try:
        finals = []
        for stream in streams:
            out = None
            async for out in stream:
                pass
            finals.append(out)
        return finals
    finally:
        close_streams(streams)


async def merge(streams: list) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from every stream as they arrive; closing it aborts unfinished requests."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            close_streams(streams)
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i, stream):
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as err:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, err))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(streams)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        close_streams(streams)
        for task in tasks:
            task.cancel()


def close_streams(streams: list) -> None:
    """Close request streams (synchronous, so it also runs under cancellation): unfinished requests are aborted."""
    for stream in streams:
        stream.close()
