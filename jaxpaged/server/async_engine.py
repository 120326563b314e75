"""`AsyncEngine`: one engine loop thread that every HTTP client's request feeds.

The `Engine` is not thread-safe, so only the loop thread touches it. Clients
hand it commands (add, abort, reset the prefix cache) through a queue; each
add is answered through a future, so a bad request's ValueError reaches its
own client before anything streams, and nothing else is disturbed. Outputs
go back to each request's asyncio queue on the client's event loop. All
clients' requests batch together continuously, because they are all in the
one engine.

Multi-host (`jax.distributed`, tensor parallelism across processes): every
process runs the same engine on the same requests. Commands are therefore
data (`add`, `abort`, `reset`, `stop` records): process 0's loop broadcasts
each iteration's records, every process applies them in the same order and
steps; the other processes run `run_follower`. Draining at shutdown is decided
by process 0 alone (it sends the aborts and the stop), so no process depends
on its own clock.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import AsyncIterator

from jaxpaged.engine import Engine
from jaxpaged import distributed
from jaxpaged.outputs import RequestOutput, RequestOutputKind
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

    def __init__(self, engine: Engine, *, max_waiting_requests: int = 1024, drain_timeout_s: float = 30.0,
                 multi_process: bool = False):
        """`max_waiting_requests` bounds the admission queue (QueueFullError beyond it); at shutdown,
        in-flight requests get `drain_timeout_s` to finish before they are aborted. `multi_process`:
        this is process 0 of several, which broadcasts every iteration's commands (see `run_follower`)."""
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.drain_timeout_s = drain_timeout_s
        self.multi_process = multi_process
        self.error: BaseException | None = None
        self._commands: collections.deque[tuple[dict, concurrent.futures.Future | None]] = collections.deque()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._streams_pending: dict[str, _Stream] = {}  # adds not yet applied by the loop
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
        record = {"op": "add", "id": request_id, "prompt": prompt, "params": params_to_dict(params),
                  "cache_salt": cache_salt, "arrival_time": self.engine.clock()}
        self._streams_pending[request_id] = stream
        try:
            await self._call(record)
        finally:
            self._streams_pending.pop(request_id, None)
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
            self._commands.append(({"op": "abort", "id": request_id}, None))
            self._wake.set()

    async def reset_prefix_cache(self) -> bool:
        """Drop every unreferenced cached block; False if some are still in use."""
        return await self._call({"op": "reset"})

    async def pin_prefix(self, prompt, ttl_s: float, *, cache_salt: str | None = None) -> int:
        """Pin the prompt's full blocks for `ttl_s` seconds (`Engine.pin_prefix`); blocks cached now."""
        return await self._call({"op": "pin", "prompt": prompt, "ttl_s": ttl_s, "cache_salt": cache_salt})

    async def call_in_loop(self, fn):
        """Run `fn(engine)` on the loop thread between two steps and return its result.

        The engine is only safe to read there (e.g. to drain its KV events or
        list its cached blocks). Single-process only: a function cannot be
        broadcast to the other processes.
        """
        if self.multi_process:
            raise ValueError("call_in_loop is single-process only (commands are broadcast as data)")
        return await self._call({"op": "call", "fn": fn})

    async def _call(self, record: dict):
        if not self.is_running:
            raise EngineDeadError(self._dead_reason())
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.append((record, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    def _dead_reason(self) -> str:
        if self.error is not None:
            return f"the engine loop died: {type(self.error).__name__}: {self.error}"
        return "the engine is shutting down"

    # ---- the loop thread ------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            drain_deadline = None
            while True:
                if self._stopping.is_set():
                    drain_deadline = self._drain_step(drain_deadline)
                records = list(self._commands)
                for _ in records:
                    self._commands.popleft()
                if self.multi_process:
                    distributed.broadcast_object([r for r, _ in records])
                stop = self._apply(records)
                if stop:
                    break
                if self._crash_requested:
                    raise RuntimeError("engine loop crashed on request (debug endpoint)")
                if not engine.has_unfinished_requests():
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                self._deliver(engine.step())
            engine.shutdown()
            if self.multi_process:
                _leave_group()
            self._fail_everything(EngineDeadError("the engine is shutting down"))
        except BaseException as err:  # noqa: BLE001 - any failure ends the loop; clients must hear of it
            log.exception("engine loop died")
            self.error = err
            self._fail_everything(EngineDeadError(self._dead_reason()))

    def _drain_step(self, deadline: float | None) -> float:
        """While shutting down: after the drain timeout, abort what is left; once nothing is, stop."""
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.drain_timeout_s
        if now >= deadline:
            for request_id in list(self._streams):
                self._commands.append(({"op": "abort", "id": request_id}, None))
            deadline = float("inf")  # aborted once; their final outputs follow
        if not self.engine.has_unfinished_requests() and not self._commands:
            self._commands.append(({"op": "stop"}, None))
        return deadline

    def _apply(self, records: list[tuple[dict, concurrent.futures.Future | None]]) -> bool:
        """Apply the records in order, answering their futures; returns whether one was `stop`."""
        stop = False
        for record, future in records:
            try:
                if record["op"] == "call":
                    result = record["fn"](self.engine)
                else:
                    result = apply_record(self.engine, record, self.max_waiting_requests)
                if record["op"] == "add":
                    self._streams[record["id"]] = self._streams_pending[record["id"]]
                if future is not None:
                    future.set_result(result)
            except Exception as err:  # a bad request: its own client gets the error
                if future is not None:
                    future.set_exception(err)
            stop = stop or record["op"] == "stop"
        return stop

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)

    def _fail_everything(self, err: BaseException) -> None:
        while self._commands:
            _, future = self._commands.popleft()
            if future is not None and not future.done():
                future.set_exception(err)
        for stream in self._streams.values():
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, err)
        self._streams.clear()


def params_to_dict(params: SamplingParams) -> dict:
    """SamplingParams as JSON-able data (a broadcast command carries it to every process)."""
    d = dataclasses.asdict(params)
    d["output_kind"] = params.output_kind.name
    return d


def apply_record(engine: Engine, record: dict, max_waiting_requests: int):
    """Apply one command record to the engine (the same on every process); returns its result."""
    op = record["op"]
    if op == "add":
        if len(engine.scheduler.waiting) >= max_waiting_requests:
            raise QueueFullError(f"the waiting queue is full ({max_waiting_requests} requests)")
        params = SamplingParams(**(record["params"] | {"output_kind": RequestOutputKind[record["params"]["output_kind"]]}))
        engine.add_request(record["id"], record["prompt"], params, cache_salt=record["cache_salt"],
                           arrival_time=record["arrival_time"])
        return None
    if op == "abort":
        return engine.abort(record["id"])
    if op == "reset":
        return engine.kv.reset_prefix_cache()
    if op == "pin":
        return engine.pin_prefix(record["prompt"], record["ttl_s"], cache_salt=record["cache_salt"])
    if op == "stop":
        return None
    raise ValueError(f"unknown engine command {op!r}")


def run_follower(engine: Engine, *, max_waiting_requests: int = 1024) -> None:
    """The engine loop of a process other than 0: apply process 0's commands, step, until `stop`."""
    while True:
        records = distributed.broadcast_object(None)
        for record in records:
            try:
                apply_record(engine, record, max_waiting_requests)
            except Exception:  # noqa: BLE001 - process 0 refused it the same way and told its client
                pass
        if any(r["op"] == "stop" for r in records):
            break
        if engine.has_unfinished_requests():
            engine.step()
    engine.shutdown()
    _leave_group()


def _leave_group() -> None:
    """Leave the jax.distributed group together (a barrier), before process 0's coordinator goes away."""
    import jax
    jax.distributed.shutdown()
