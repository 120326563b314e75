"""`CoreClient`: the API server's `EngineClient` over an engine core in another process.

It is an `EngineClient` (engine_client.py), as `AsyncEngine` is, so the app
is the same code in one process or split. Prompts are tokenized here, on a worker thread;
the core checks and adds them and answers each add before anything streams.
Every step's `StepOutputs` is turned into text here (`FrontendOutputs`).

The core's death is seen at once: its pid is watched through a pidfd on the
event loop, and a `Dead` message says why when its loop failed. Either way
every open stream gets `EngineDeadError` and `/health` answers 503.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle

import msgspec
import zmq
import zmq.asyncio

from jaxpaged.engine.pin_quota import PinQuota, PinQuotaError
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.request_stream import (EngineDeadError, QueueFullError, RequestStream, TenantLimitError,
                                            params_to_dict, refuse_overlong)
from jaxpaged.server.core import messages as M
from jaxpaged.server.core.frontend_outputs import FrontendOutputs, core_params
from jaxpaged.server.engine_client import ModelInfo
from jaxpaged.server.tenant_admission import AdmissionLimits

log = logging.getLogger(__name__)

_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "QueueFullError": QueueFullError,
           "EngineDeadError": EngineDeadError, "PinQuotaError": PinQuotaError,
           "TenantLimitError": TenantLimitError}


class CoreClient:
    """One API server's connection to the engine core (a DEALER socket; see the module docstring)."""

    def __init__(self, address: str, core_pid: int) -> None:
        """`core_pid`: the core's process, watched so its death is noticed within the event loop's next turn."""
        self.address, self.core_pid = address, core_pid
        self.model_info: ModelInfo | None = None
        self.error: BaseException | None = None
        self.multi_process = False
        self._ctx = zmq.asyncio.Context()
        self._sock = None
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(M.FromCore)
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._streams: dict[str, RequestStream] = {}
        self._outputs: FrontendOutputs | None = None
        self._reader: asyncio.Task | None = None
        self._pidfd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the one that connected: the socket lives on it
        self._stopped = False

    # ---- lifecycle ------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect, introduce this process and learn the model; raises EngineDeadError if the core dies first."""
        loop = self._loop = asyncio.get_running_loop()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.address)
        self._pidfd = os.pidfd_open(self.core_pid)
        loop.add_reader(self._pidfd, self._core_exited)
        self._reader = loop.create_task(self._read())
        info = await self._call(M.Hello(0, os.getpid()))
        self.model_info = pickle.loads(info)
        self._outputs = FrontendOutputs(self.model_info.tokenizer)

    def start(self) -> None:
        """Nothing to start (`connect` did it); kept for `build_app`'s lifespan."""

    @property
    def is_running(self) -> bool:
        """Whether the core is alive and serving."""
        return self.error is None and not self._stopped and self.model_info is not None

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop serving through the core, then close the connection on its event loop (callable from any
        thread): open streams end with EngineDeadError, and the socket and its ZeroMQ context close (a context
        left open can hang the interpreter's exit in its `term()`). The core is stopped by whoever started it."""
        self._stopped = True
        if self._loop is None or self._loop.is_closed():
            self._close()
        else:
            self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        if self._ctx.closed:
            return
        self._fail_open(EngineDeadError("the API server is shutting down"))
        if self._reader is not None:
            self._reader.cancel()
        if self._pidfd is not None:
            if self.error is None and not self._loop.is_closed():  # `_fail` removed its reader already
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._ctx.term()

    def dead_reason(self) -> str:
        """Why no request can be served."""
        return str(self.error) if self.error is not None else "the engine is shutting down"

    def crash_for_test(self) -> None:
        """Make the core's loop fail (the debug endpoint)."""
        asyncio.ensure_future(self._call(M.Call(0, "crash")))

    async def stall_for_test(self, seconds: float) -> None:
        """Make the core sleep `seconds` between two steps (returns at once)."""
        await self._call(M.Call(0, "stall", [seconds]))

    async def engine_metrics(self) -> str:
        """The core's Prometheus metrics text (appended to this server's own on /metrics)."""
        return await self._call(M.Call(0, "metrics"))

    async def reset_prefix_cache(self, namespace: tuple[str, ...] | None = None) -> bool:
        """As `AsyncEngine.reset_prefix_cache`, in the core."""
        return await self._call(M.Call(0, "reset_prefix_cache", [] if namespace is None else [list(namespace)]))

    async def pin_prefix(self, prompt, ttl_s: float, *, cache_salt: str | None = None,
                         quota: PinQuota | None = None) -> int:
        """As `AsyncEngine.pin_prefix`, in the core (a text prompt is tokenized there, as the engine would)."""
        return await self._call(M.Call(0, "pin_prefix", [prompt, ttl_s, cache_salt,
                                                         None if quota is None else quota.to_wire()]))

    async def set_kv_peers(self, peers: list[str]) -> None:
        """The KV endpoints the core's decode engine pulls from from now on (disaggregation on Ray Serve)."""
        await self._call(M.Call(0, "set_kv_peers", list(peers)))

    async def query(self, name: str):
        """The answer to a named engine query (`engine_queries.QUERIES`), read in the core between two steps."""
        return pickle.loads(await self._call(M.Call(0, "query", [name])))

    # ---- requests -------------------------------------------------------------------------

    async def add_request(self, request_id: str, prompt, params: SamplingParams, *,
                          cache_salt: str | None = None, priority: int = 0, tenant: str | None = None,
                          limits: AdmissionLimits | None = None) -> RequestStream:
        """As `AsyncEngine.add_request`: tokenized here, checked and added by the core before this returns."""
        if not self.is_running:
            raise EngineDeadError(self.dead_reason())
        refuse_overlong(prompt, self.model_info.tokenizer, self.model_info.max_model_len)
        if isinstance(prompt, str):
            prompt = await asyncio.to_thread(self.model_info.tokenizer.encode, prompt)
        if not isinstance(prompt, (list, tuple)):
            raise ValueError("prompt must be a string or a list of token ids")
        prompt = list(prompt)
        stream = RequestStream(self, request_id, asyncio.get_running_loop(), params.output_kind)
        self._streams[request_id] = stream
        self._outputs.add(request_id, prompt, params)
        try:
            await self._call(M.Add(0, request_id, prompt, params_to_dict(core_params(params)), cache_salt,
                                   priority, tenant, None if limits is None else limits.to_wire()))
        except BaseException as err:
            self._forget(request_id)
            if isinstance(err, asyncio.CancelledError):
                self.abort(request_id)  # it may have been added meanwhile
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request in the core (no-op if it finished); does not wait."""
        self._forget(request_id)
        self._send(M.Abort([request_id]))

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        if self._outputs is not None:
            self._outputs.drop(request_id)

    # ---- the socket -----------------------------------------------------------------------

    async def _call(self, msg):
        if self.error is not None:
            raise EngineDeadError(self.dead_reason())
        msg.call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[msg.call_id] = future
        self._send(msg)
        try:
            return await future
        finally:
            self._calls.pop(msg.call_id, None)

    def _send(self, msg) -> None:
        if self._sock is not None and self.error is None:
            self._sock.send(self._encoder.encode(msg), zmq.NOBLOCK, copy=False)

    async def _read(self) -> None:
        try:
            while True:
                msg = self._decoder.decode(await self._sock.recv(copy=False))
                if isinstance(msg, M.StepOutputs):
                    self._deliver(msg.outputs)
                elif isinstance(msg, M.Reply):
                    self._reply(msg)
                else:
                    self._fail(EngineDeadError(msg.reason))
                    return
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a broken transport ends serving through it
            log.exception("reading from the engine core failed")
            self._fail(EngineDeadError(f"the engine core connection failed: {err}"))

    def _reply(self, msg: M.Reply) -> None:
        future = self._calls.get(msg.call_id)
        if future is None or future.done():
            return
        if msg.error_type is None:
            future.set_result(msg.value)
        else:
            future.set_exception(_ERRORS.get(msg.error_type, RuntimeError)(msg.error))

    def _deliver(self, deltas: list[M.RequestDelta]) -> None:
        stops = []
        for delta in deltas:
            stream = self._streams.get(delta.request_id)
            if stream is None:
                continue
            outputs, stopped = self._outputs.apply(delta)
            for out in outputs:
                stream.put(out)
                if out.finished:
                    self._streams.pop(delta.request_id, None)
            if stopped:
                stops.append(delta.request_id)
        if stops:
            self._send(M.Abort(stops))

    def _core_exited(self) -> None:
        self._fail(EngineDeadError("the engine core process exited"))

    def _fail(self, err: EngineDeadError) -> None:
        if self.error is not None:
            return
        self.error = err
        log.error("engine core gone: %s", err)
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
        self._fail_open(err)

    def _fail_open(self, err: EngineDeadError) -> None:
        """End every pending call and open stream with ``err``."""
        for future in self._calls.values():
            if not future.done():
                future.set_exception(err)
        for stream in self._streams.values():
            stream.put(err)
        self._streams.clear()
