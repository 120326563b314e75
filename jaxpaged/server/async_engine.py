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
import functools
import logging
import threading
import time
from jaxpaged.engine import Engine
from jaxpaged.engine.pin_quota import PinQuota
from jaxpaged import distributed
from jaxpaged.outputs import RequestOutput
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.engine_client import ModelInfo
from jaxpaged.server.tenant_admission import AdmissionLimits, check_admission
from jaxpaged.server.request_stream import (EngineDeadError, QueueFullError, RequestStream, params_from_dict,
                                            params_to_dict, refuse_overlong)

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05  # how long an idle loop sleeps before it looks at the queue again


@dataclasses.dataclass(slots=True)
class _Command:
    """A record for the loop, the future its caller awaits (None: nobody waits) and, for an add, its stream."""

    record: dict
    future: concurrent.futures.Future | None = None
    stream: "RequestStream | None" = None


class AsyncEngine:
    """Runs `engine.step()` in a background thread while requests stream in and out.

    Every hand-off tolerates a caller that has gone: a command whose future
    was cancelled before the loop took it is skipped, a request whose client
    was cancelled while its add was queued is aborted right after it is added,
    and results for callers that are gone are dropped. No request can raise
    out of the loop.
    """

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
        self._commands: collections.deque[_Command] = collections.deque()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}  # touched by the loop thread only
        self._stopping = threading.Event()
        self._crash_requested = False
        self._thread = threading.Thread(target=self._run, name="jaxpaged-engine-loop", daemon=True)

    @functools.cached_property
    def model_info(self) -> ModelInfo:
        """The engine's tokenizer, model and limits (fixed, so read from any thread)."""
        return ModelInfo.of(self.engine, self.max_waiting_requests)

    async def engine_metrics(self) -> str:
        """Nothing: in one process the server's registry already holds the engine's metrics (`attach_metrics`)."""
        return ""

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

    async def stall_for_test(self, seconds: float) -> None:
        """Make the loop sleep `seconds` between two steps, as a long compile would (returns at once)."""
        if self.multi_process:
            raise ValueError("stall_for_test is single-process only (commands are broadcast as data)")
        self._send(_Command({"op": "call", "fn": lambda engine: time.sleep(seconds)}))

    def dead_reason(self) -> str:
        """Why no request can be served (the loop's error, or the shutdown)."""
        if self.error is not None:
            return f"the engine loop died: {type(self.error).__name__}: {self.error}"
        return "the engine is shutting down"

    # ---- what clients call ----------------------------------------------------------------

    async def add_request(self, request_id: str, prompt, params: SamplingParams, *,
                          cache_salt: str | None = None, priority: int = 0, tenant: str | None = None,
                          limits: AdmissionLimits | None = None) -> RequestStream:
        """Queue a request; returns the stream of its outputs (the last one has `finished`).

        A text prompt is tokenized, and every prompt checked, on a worker
        thread, so a huge prompt does not stall the loop (and every stream
        with it). Raises ValueError (bad input), QueueFullError, TenantLimitError
        (past the tenant's ``limits``, tenant_admission.py) or EngineDeadError
        before anything streams. If the caller is cancelled meanwhile, the
        request is not left running.
        """
        prompt = await asyncio.to_thread(self._prepare, prompt, params)
        stream = RequestStream(self, request_id, asyncio.get_running_loop(), params.output_kind)
        record = {"op": "add", "id": request_id, "prompt": prompt, "params": params_to_dict(params),
                  "cache_salt": cache_salt, "arrival_time": self.engine.clock(), "priority": priority,
                  "tenant": tenant, "limits": None if limits is None else limits.to_wire()}
        try:
            await self._call(record, stream)
        except asyncio.CancelledError:
            self.abort(request_id)  # queued after the add: a no-op if the add was skipped or refused
            raise
        return stream

    def _prepare(self, prompt, params: SamplingParams):
        """A worker thread's part of an add: the prompt's token ids, checked as `Engine.add_request` will.

        A prompt that is too long is refused before any per-token work (the
        worker still holds the GIL while it tokenizes, which would stall the
        loop thread): a token-id list by its length, a text by its length
        when the tokenizer bounds the characters per token.
        """
        refuse_overlong(prompt, self.engine.tokenizer, self.engine.max_model_len)
        if isinstance(prompt, str):
            prompt = self.engine.tokenizer.encode(prompt)
        self.engine.validate_prompt(prompt, params)  # reads only the engine's fixed configuration
        return prompt

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op if it already finished); does not wait."""
        if self.error is None:
            self._send(_Command({"op": "abort", "id": request_id}))

    async def reset_prefix_cache(self, namespace: tuple[str, ...] | None = None) -> bool:
        """Drop every unreferenced cached block, on the device and in the host tier (see `reset_prefix_cache`);
        False if some are still in use. With ``namespace``: only that namespace's free device blocks and
        lower-tier entries."""
        return await self._call({"op": "reset", "namespace": None if namespace is None else list(namespace)})

    async def pin_prefix(self, prompt, ttl_s: float, *, cache_salt: str | None = None,
                         quota: PinQuota | None = None) -> int:
        """Pin the prompt's full blocks for `ttl_s` seconds (`Engine.pin_prefix`, charged to `quota`'s owner);
        blocks cached now."""
        return await self._call({"op": "pin", "prompt": prompt, "ttl_s": ttl_s, "cache_salt": cache_salt,
                                 "quota": None if quota is None else quota.to_wire()})

    async def query(self, name: str):
        """The answer to a named engine query (`engine_queries.QUERIES`), read on the loop thread."""
        from jaxpaged.server.engine_queries import answer
        return await self.call_in_loop(lambda engine: answer(engine, name))

    async def call_in_loop(self, fn):
        """Run `fn(engine)` on the loop thread between two steps and return its result.

        The engine is only safe to read there (e.g. to drain its KV events or
        list its cached blocks). Single-process only: a function cannot be
        broadcast to the other processes.
        """
        if self.multi_process:
            raise ValueError("call_in_loop is single-process only (commands are broadcast as data)")
        return await self._call({"op": "call", "fn": fn})

    async def _call(self, record: dict, stream: RequestStream | None = None):
        if not self.is_running:
            raise EngineDeadError(self.dead_reason())
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(_Command(record, future, stream))
        return await asyncio.wrap_future(future)

    def _send(self, command: _Command) -> None:
        self._commands.append(command)
        self._wake.set()

    # ---- the loop thread ------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            drain_deadline = None
            while True:
                if self._stopping.is_set():
                    drain_deadline = self._drain_step(drain_deadline)
                commands = [self._commands.popleft() for _ in range(len(self._commands))]
                commands = [c for c in commands if self._admit(c)]
                if self.multi_process:
                    distributed.broadcast_object([c.record for c in commands])
                stop = self._apply(commands)
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
                distributed.leave_group()
            self._fail_everything(EngineDeadError("the engine is shutting down"))
        except BaseException as err:  # noqa: BLE001 - any failure ends the loop; clients must hear of it
            log.exception("engine loop died")
            self.error = err
            self._fail_everything(EngineDeadError(self.dead_reason()))

    def _drain_step(self, deadline: float | None) -> float:
        """While shutting down: after the drain timeout, abort what is left; once nothing is, stop."""
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.drain_timeout_s
        if now >= deadline:
            for request_id in list(self._streams):
                self._commands.append(_Command({"op": "abort", "id": request_id}))
            deadline = float("inf")  # aborted once; their final outputs follow (adds are refused from now on)
        if not self.engine.has_unfinished_requests() and not self._commands:
            self._commands.append(_Command({"op": "stop"}))
        return deadline

    def _admit(self, command: _Command) -> bool:
        """Whether to apply (and broadcast) a command: not if its caller has gone (its future was
        cancelled), nor an add once shutdown has begun (refused with EngineDeadError, a 503)."""
        if command.future is not None and not command.future.set_running_or_notify_cancel():
            return False
        if command.record["op"] == "add" and self._stopping.is_set():
            _resolve(command.future, error=EngineDeadError("the engine is shutting down"))
            return False
        return True

    def _apply(self, commands: list[_Command]) -> bool:
        """Apply the commands in order, answering their futures; returns whether one was `stop`."""
        stop = False
        for command in commands:
            record = command.record
            try:
                if record["op"] == "call":
                    result = record["fn"](self.engine)
                else:
                    result = apply_record(self.engine, record, self.max_waiting_requests)
                if command.stream is not None:
                    self._streams[record["id"]] = command.stream
                _resolve(command.future, result=result)
            except Exception as err:  # a bad request: its own client gets the error
                _resolve(command.future, error=err)
            stop = stop or record["op"] == "stop"
        return stop

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            stream.put_threadsafe(out)

    def _fail_everything(self, err: BaseException) -> None:
        while self._commands:
            command = self._commands.popleft()
            _resolve(command.future, error=err)
        for stream in self._streams.values():
            stream.put_threadsafe(err)
        self._streams.clear()


def _resolve(future: concurrent.futures.Future | None, *, result=None, error: BaseException | None = None) -> None:
    """Answer a command's future unless nobody waits for it any more (none, cancelled, answered)."""
    if future is None:
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def apply_record(engine: Engine, record: dict, max_waiting_requests: int):
    """Apply one command record to the engine (the same on every process); returns its result."""
    op = record["op"]
    if op == "add":
        if engine.load().num_waiting >= max_waiting_requests:
            raise QueueFullError(f"the waiting queue is full ({max_waiting_requests} requests)")
        check_admission(engine, AdmissionLimits.from_wire(record.get("limits")))
        params = params_from_dict(record["params"])
        engine.add_request(record["id"], record["prompt"], params, cache_salt=record["cache_salt"],
                           arrival_time=record["arrival_time"], priority=record.get("priority", 0),
                           tenant=record.get("tenant"))
        return None
    if op == "abort":
        return engine.abort(record["id"])
    if op == "reset":
        return reset_prefix_cache(engine, record.get("namespace"))
    if op == "pin":
        return engine.pin_prefix(record["prompt"], record["ttl_s"], cache_salt=record["cache_salt"],
                                 quota=PinQuota.from_wire(record.get("quota")))
    if op == "stop":
        return None
    raise ValueError(f"unknown engine command {op!r}")


def reset_prefix_cache(engine: Engine, namespace: list[str] | None = None) -> bool:
    """What `/reset_prefix_cache` clears: every cached block of the device pool, then every cached
    (unpinned) block of the host tier, so no earlier prompt is a hit afterwards. False, and nothing
    cleared, while some device block is in use. The disk tier is kept: it is persistent storage that
    other engines may share, and its files are only served to an engine with the same identity.
    With ``namespace`` (a tenant's reset): only that namespace's free device blocks and lower-tier entries
    (`Engine.reset_prefix_cache`)."""
    return engine.reset_prefix_cache(None if namespace is None else tuple(namespace))


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
    distributed.leave_group()

