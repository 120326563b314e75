"""`AsyncEngine`: one engine loop thread that every HTTP client's request feeds.

The `Engine` is not thread-safe, so only the loop thread touches it. Clients
hand it commands (add, abort, reset the prefix cache) through a queue; each
add is answered through a future, so a bad request's ValueError reaches its
own client before anything streams, and nothing else is disturbed. Outputs
go back to each request's asyncio queue on the client's event loop. All
clients' requests batch together continuously, because they are all in the
one engine.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
from typing import AsyncIterator, Callable

from jaxpaged.engine import Engine
from jaxpaged.outputs import RequestOutput
from jaxpaged.sampling_params import SamplingParams

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05  # how long an idle loop sleeps before it looks at the queue again


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (crashed or shut down); no request can be served."""


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the client should retry later."""


@dataclasses.dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class AsyncEngine:
    """Runs `engine.step()` in a background thread while requests stream in and out."""

    def __init__(self, engine: Engine, *, max_waiting_requests: int = 1024, drain_timeout_s: float = 30.0):
        """`max_waiting_requests` bounds the admission queue (QueueFullError beyond it);
        at shutdown, in-flight requests get `drain_timeout_s` to finish before they are aborted."""
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.drain_timeout_s = drain_timeout_s
        self.error: BaseException | None = None
        self._commands: collections.deque[tuple[Callable[[], object], concurrent.futures.Future]] = \
            collections.deque()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._stopping = threading.Event()
        self._crash_requested = False
        self._thread = threading.Thread(target=self._run, name="jaxpaged-engine-loop", daemon=True)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    @property
    def is_running(self) -> bool:
        """Whether the loop thread is alive and has not failed."""
        return self._thread.is_alive() and self.error is None and not self._stopping.is_set()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop taking requests, let in-flight ones finish (or abort them after the drain timeout),
        run `Engine.shutdown` (saves the prefix-cache snapshot when configured) and join the thread."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def crash_for_test(self) -> None:
        """Make the loop raise on its next iteration (the server's debug endpoint uses this)."""
        self._crash_requested = True
        self._wake.set()

    # ---- what clients call ----------------------------------------------------------------

    async def add_request(self, request_id: str, prompt, params: SamplingParams, *,
                          cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Queue a request; returns the stream of its outputs (the last one has `finished`).

        Raises ValueError (bad input), QueueFullError or EngineDeadError before anything streams.
        """
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())

        def add():
            if len(self.engine.scheduler.waiting) >= self.max_waiting_requests:
                raise QueueFullError(f"the waiting queue is full ({self.max_waiting_requests} requests)")
            self.engine.add_request(request_id, prompt, params, cache_salt=cache_salt)
            self._streams[request_id] = stream

        await self._call(add)
        return self._iterate(request_id, stream)

    async def _iterate(self, request_id: str, stream: _Stream) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:  # the client went away (or the loop died): free the request's blocks
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op if it already finished); does not wait."""
        if self.error is None:
            self._submit(lambda: self.engine.abort(request_id))

    async def reset_prefix_cache(self) -> bool:
        """Drop every unreferenced cached block; False if some are still in use."""
        return await self._call(self.engine.kv.reset_prefix_cache)

    async def _call(self, fn: Callable[[], object]):
        if not self.is_running:
            raise EngineDeadError(self._dead_reason())
        return await asyncio.wrap_future(self._submit(fn))

    def _submit(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.append((fn, future))
        self._wake.set()
        return future

    def _dead_reason(self) -> str:
        if self.error is not None:
            return f"the engine loop died: {type(self.error).__name__}: {self.error}"
        return "the engine is shutting down"

    # ---- the loop thread ------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stopping.is_set():
                self._run_commands()
                if self._crash_requested:
                    raise RuntimeError("engine loop crashed on request (debug endpoint)")
                if not engine.has_unfinished_requests():
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                self._deliver(engine.step())
            self._drain()
        except BaseException as err:  # noqa: BLE001 - any failure ends the loop; clients must hear of it
            log.exception("engine loop died")
            self.error = err
            self._fail_everything(EngineDeadError(self._dead_reason()))

    def _run_commands(self) -> None:
        while self._commands:
            fn, future = self._commands.popleft()
            try:
                future.set_result(fn())
            except Exception as err:  # a bad request: its own client gets the error
                future.set_exception(err)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)

    def _drain(self) -> None:
        """At shutdown: let requests finish for a while, abort the rest, then shut the engine down."""
        import time
        engine = self.engine
        self._run_commands()
        deadline = time.monotonic() + self.drain_timeout_s
        while engine.has_unfinished_requests() and time.monotonic() < deadline:
            self._deliver(engine.step())
        for request_id in list(self._streams):
            engine.abort(request_id)
        while engine.has_unfinished_requests():
            self._deliver(engine.step())
        engine.shutdown()
        self._fail_everything(EngineDeadError("the engine is shutting down"))

    def _fail_everything(self, err: BaseException) -> None:
        while self._commands:
            _, future = self._commands.popleft()
            if not future.done():
                future.set_exception(err)
        for stream in self._streams.values():
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, err)
        self._streams.clear()
