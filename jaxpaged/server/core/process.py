"""The engine core process: the engine's loop behind a ZeroMQ ROUTER socket.

It owns the scheduler, KV manager, runner and tiers, and nothing of HTTP or
text: requests arrive tokenized, and after every step each API server that has
requests in it gets one `StepOutputs` with their new token ids. A bad request
is answered with its error before anything streams. The core watches every
API server's pid (a pidfd in the same poll as the socket): when one dies, its
requests are aborted, so their blocks are freed and nothing else is disturbed.

SIGTERM drains: adds are refused, in-flight requests get `drain_timeout_s`,
then what is left is aborted, `Engine.shutdown` saves the snapshot when
configured, and the process exits. A failure of the loop is sent to every API
server (`Dead`) before the process exits non-zero.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import sys
import time
from typing import Callable

import msgspec
import zmq

from jaxpaged import distributed
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutput
from jaxpaged.server.core.core_outputs import CoreOutputProcessor, to_delta
from jaxpaged.server.async_engine import apply_record
from jaxpaged.server.core import messages as M
from jaxpaged.server.core.compiling import PendingCompiles
from jaxpaged.server.engine_client import ModelInfo

log = logging.getLogger(__name__)

_IDLE_POLL_MS = 50  # how long an idle core waits for a message before it looks again


@dataclasses.dataclass(frozen=True)
class CoreSpec:
    """What the core process builds: the engine and how it serves."""

    engine_config: EngineConfig
    device: str = "real"  # or "simulated": steps sleep the cost model's time on `device_profile`
    device_profile: str = "h200-141gb"
    max_waiting_requests: int = 1024
    drain_timeout_s: float = 30.0
    enable_kv_events: bool = False  # a replica's core: its ingress routes on the cache manager's events
    # Multi-host: (coordinator_address, num_processes, process_id 0). This core joins jax.distributed and
    # broadcasts every iteration's engine commands to the other processes (`async_engine.run_follower`).
    distributed: tuple[str, int, int] | None = None


def build_engine(spec: CoreSpec) -> Engine:
    """The engine `spec` describes (real, or over the simulated device)."""
    if spec.device == "simulated":
        from jaxpaged.sim.realtime import simulated_device_engine
        return simulated_device_engine(spec.engine_config, spec.device_profile)
    return Engine(spec.engine_config)


def run_core(spec: CoreSpec, address: str) -> None:
    """Process entry point: build the engine, bind `address`, serve until SIGTERM or a failure."""
    # force: an import before this one (orbax, through absl) may have configured the root logger at WARNING
    logging.basicConfig(level=logging.INFO, format="%(asctime)s core %(levelname)s %(message)s", force=True)
    from jaxpaged.metrics import attach_metrics
    multi_process = spec.distributed is not None and distributed.initialize(*spec.distributed)
    engine = build_engine(spec)
    if spec.enable_kv_events:
        engine.enable_kv_events()
    metrics = attach_metrics(engine)
    gc.collect()
    gc.freeze()  # what startup built (model, pool, tokenizer) lives on: no collection walks it again
    core = EngineCore(engine, address, metrics=metrics, max_waiting_requests=spec.max_waiting_requests,
                      drain_timeout_s=spec.drain_timeout_s, multi_process=multi_process)
    signal.signal(signal.SIGTERM, lambda *_: core.request_stop())
    signal.signal(signal.SIGINT, lambda *_: core.request_stop())
    status = core.serve()
    log.info("engine core exits (%d)", status)
    # Everything the engine keeps is written by now (Engine.shutdown). The interpreter's own teardown
    # (XLA's client and thread pools) took ~3 s more on a busy 2-core host and serves nobody: skip it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@dataclasses.dataclass(slots=True)
class _Command:
    """An engine command record and who waits for its answer (None: nobody)."""

    record: dict
    identity: bytes | None = None
    call_id: int | None = None


class EngineCore:
    """The loop: read every pending message, apply it, step, send each API server its step's outputs.

    Engine commands (add, abort, reset, pin, stop) are records applied in
    arrival order once per iteration; with `multi_process` (process 0 of a
    multi-host group) each iteration's records are broadcast first, so every
    process applies the same ones and steps in lockstep.
    """

    def __init__(self, engine: Engine, address: str, *, metrics=None, max_waiting_requests: int = 1024,
                 drain_timeout_s: float = 30.0, multi_process: bool = False) -> None:
        """Binds a ROUTER socket at `address` (`ipc://...` or `tcp://...`)."""
        self.engine, self.metrics = engine, metrics
        # streaming outputs built in their wire form (final ones stay RequestOutputs for the stat loggers)
        engine.set_output_processor(CoreOutputProcessor(lambda: engine.tokenizer))
        self._step_time = StepHostTime(metrics.registry, engine.device_wait_s) if metrics is not None else None
        self.max_waiting_requests, self.drain_timeout_s = max_waiting_requests, drain_timeout_s
        self.multi_process = multi_process
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.bind(address)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._decoder = msgspec.msgpack.Decoder(M.ToCore)
        self._encoder = msgspec.msgpack.Encoder()
        self._clients: dict[bytes, int] = {}  # identity -> pidfd of its API server process
        self._owner: dict[str, bytes] = {}  # request id -> identity of the API server that added it
        self._commands: list[_Command] = []  # this iteration's engine commands
        self._compiling = PendingCompiles(engine.validate_prompt)  # adds whose grammar compiles off the loop
        self._stop_requested = False
        self._crash_requested = False
        self._stall_s = 0.0  # the debug stall: slept once, after this iteration's messages are read

    def request_stop(self) -> None:
        """Begin draining (signal-handler safe: it only sets a flag)."""
        self._stop_requested = True

    def serve(self) -> int:
        """Run until drained (returns 0) or failed (tells every API server, returns 1)."""
        try:
            drain_deadline = None
            while True:
                stop = False
                if self._stop_requested:
                    if drain_deadline is None:
                        drain_deadline = time.monotonic() + self.drain_timeout_s
                    if time.monotonic() >= drain_deadline:
                        self._abort(list(self._owner))
                        drain_deadline = float("inf")
                    stop = not self.engine.has_unfinished_requests()
                busy = self.engine.has_unfinished_requests()
                if busy and self._step_time is not None:
                    self._step_time.start()
                self._read_messages(0 if busy or stop else 1 if self._compiling else _IDLE_POLL_MS)
                self._take_compiled()
                if stop:
                    self._commands.append(_Command({"op": "stop"}))
                self._apply_commands()
                if stop:
                    break
                if self._stall_s:
                    time.sleep(self._stall_s)  # as a long compile would: what arrives meanwhile waits
                    self._stall_s = 0.0
                if self._crash_requested:
                    raise RuntimeError("engine core crashed on request (debug endpoint)")
                if self.engine.has_unfinished_requests():
                    self._send_outputs(self.engine.step())
                    if busy and self._step_time is not None:
                        self._step_time.stop(self.engine.stats)
            self.engine.shutdown()
            if self.multi_process:
                distributed.leave_group()
            self._tell_everyone(M.Dead("the engine is shutting down"))
            return 0
        except BaseException as err:  # noqa: BLE001 - every API server must hear of it
            log.exception("engine core died")
            self._tell_everyone(M.Dead(f"the engine loop died (engine core process): {type(err).__name__}: {err}"))
            return 1
        finally:
            self._sock.close(linger=1000)
            self._ctx.term()

    # ---- messages in ----------------------------------------------------------------------

    def _read_messages(self, timeout_ms: int) -> None:
        events = dict(self._poller.poll(timeout_ms))
        for identity, pidfd in list(self._clients.items()):
            if pidfd in events:
                self._client_died(identity)
        if self._sock not in events:
            return
        while True:
            try:
                identity, payload = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._take(identity.bytes, self._decoder.decode(payload.buffer))

    def _take(self, identity: bytes, msg) -> None:
        """Queue an engine command for this iteration, or answer a call that does not touch the engine's state."""
        if isinstance(msg, M.Abort):
            self._abort(msg.request_ids)
            return
        record = self._record_of(msg)
        if record is not None and PendingCompiles.needs(record):
            self._compiling.submit(_Command(record, identity, msg.call_id))
            return
        if record is not None:
            self._commands.append(_Command(record, identity, msg.call_id))
            return
        try:
            reply = M.Reply(msg.call_id, self._answer(identity, msg))
        except Exception as err:  # a bad request or call: only its caller hears of it
            reply = M.Reply(msg.call_id, None, type(err).__name__, str(err))
        self._send(identity, reply)

    def _record_of(self, msg) -> dict | None:
        if isinstance(msg, M.Add):
            return {"op": "add", "id": msg.request_id, "prompt": msg.prompt_token_ids, "params": msg.params,
                    "cache_salt": msg.cache_salt, "arrival_time": self.engine.clock(), "priority": msg.priority,
                    "tenant": msg.tenant, "limits": msg.limits}
        if isinstance(msg, M.Call) and msg.name == "reset_prefix_cache":
            return {"op": "reset", "namespace": msg.args[0] if msg.args else None}
        if isinstance(msg, M.Call) and msg.name == "pin_prefix":
            prompt, ttl_s, cache_salt, quota = msg.args
            return {"op": "pin", "prompt": prompt, "ttl_s": ttl_s, "cache_salt": cache_salt, "quota": quota}
        return None

    def _take_compiled(self) -> None:
        """Queue the adds whose constraint compiled; answer those whose did not with the error."""
        for command, error in self._compiling.ready():
            if error is None:
                self._commands.append(command)
            else:
                self._send(command.identity, M.Reply(command.call_id, None, type(error).__name__, str(error)))

    def _apply_commands(self) -> None:
        """Refuse adds while draining, broadcast the rest (multi-host), apply them in order and answer them."""
        commands, self._commands = self._commands, []
        admitted = []
        for c in commands:
            if c.record["op"] == "add" and self._stop_requested:
                self._send(c.identity, M.Reply(c.call_id, None, "EngineDeadError", "the engine is shutting down"))
            else:
                admitted.append(c)
        if self.multi_process:
            distributed.broadcast_object([c.record for c in admitted])
        for c in admitted:
            try:
                value, error = apply_record(self.engine, c.record, self.max_waiting_requests), None
                if c.record["op"] == "add":
                    self._owner[c.record["id"]] = c.identity
            except Exception as err:  # a bad request: only its caller hears of it
                value, error = None, err
            if c.identity is not None:
                self._send(c.identity, M.Reply(c.call_id, value) if error is None
                           else M.Reply(c.call_id, None, type(error).__name__, str(error)))

    def _answer(self, identity: bytes, msg):
        if isinstance(msg, M.Hello):
            return self._hello(identity, msg.pid)
        return self._call(msg.name, msg.args)

    def _hello(self, identity: bytes, pid: int) -> bytes:
        if identity not in self._clients:
            pidfd = os.pidfd_open(pid)
            self._clients[identity] = pidfd
            self._poller.register(pidfd, zmq.POLLIN)
        import pickle  # the tokenizer is a Python object; both ends are this same program
        return pickle.dumps(ModelInfo.of(self.engine, self.max_waiting_requests))

    def _call(self, name: str, args: list):
        if name == "query":
            import pickle  # the answers are Python objects (KV events, loads); both ends are this same program
            from jaxpaged.server.engine_queries import answer
            return pickle.dumps(answer(self.engine, str(args[0])))
        if name == "metrics":
            from prometheus_client import generate_latest
            return generate_latest(self.metrics.registry).decode() if self.metrics is not None else ""
        if name == "stall":
            if self.multi_process:
                raise ValueError("stall is single-process only (the other processes step in lockstep)")
            self._stall_s = float(args[0])  # answered at once, as the in-process loop's stall is
            return None
        if name == "crash":
            self._crash_requested = True
            return None
        if name == "set_kv_peers":  # disaggregation on Ray Serve: the ingress names the prefill engines
            if self.engine.kv_connector is None:
                raise ValueError("set_kv_peers needs an engine with a kv_role")
            self.engine.kv_connector.set_peers([str(peer) for peer in args])
            return None
        raise ValueError(f"unknown engine core call {name!r}")

    def _abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        for c in self._compiling.drop(lambda c: c.record["id"] in ids):  # never added: nothing to free
            self._send(c.identity, M.Reply(c.call_id, None, "ValueError", "the request was aborted"))
        queued = {c.record["id"] for c in self._commands if c.record["op"] == "add"}  # added this iteration
        for request_id in request_ids:
            if request_id in self._owner or request_id in queued:
                self._commands.append(_Command({"op": "abort", "id": request_id}))

    def _client_died(self, identity: bytes) -> None:
        """An API server's process ended: abort its requests (their final outputs go nowhere)."""
        pidfd = self._clients.pop(identity)
        self._poller.unregister(pidfd)
        os.close(pidfd)
        self._compiling.drop(lambda c: c.identity == identity)
        mine = [r for r, owner in self._owner.items() if owner == identity]
        log.warning("an API server died; aborting its %d requests", len(mine))
        self._abort(mine)

    # ---- messages out ---------------------------------------------------------------------

    def _send_outputs(self, outputs: list[M.RequestDelta | RequestOutput]) -> None:
        batches: dict[bytes, list[M.RequestDelta]] = {}
        for out in outputs:
            identity = self._owner.get(out.request_id)
            if out.finished:
                self._owner.pop(out.request_id, None)
            if identity is None or identity not in self._clients:
                continue
            batches.setdefault(identity, []).append(to_delta(out))
        for identity, deltas in batches.items():
            self._send(identity, M.StepOutputs(deltas))

    def _send(self, identity: bytes, msg) -> None:
        try:
            self._sock.send_multipart([identity, self._encoder.encode(msg)], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # the API server is gone (its pidfd tells us soon)
            pass

    def _tell_everyone(self, msg) -> None:
        for identity in list(self._clients):
            self._send(identity, msg)


class StepHostTime:
    """The core's host time per step as Prometheus metrics: each loop iteration that stepped (messages in,
    the engine's step, messages out), less the time it waited for the device where the runner counts it
    (`Engine.device_wait_s`: the simulated devices), and the loop thread's CPU time; by the kind of step scheduled
    (`decode`: one token for every sequence, nothing admitted; `mixed`: anything else)."""

    def __init__(self, registry, device_wait_s: Callable[[], float]) -> None:
        """Registers `jaxpaged:engine_core_step_host_seconds` and `jaxpaged:engine_core_loop_cpu_seconds`."""
        from prometheus_client import Counter, Histogram
        self.host = Histogram("jaxpaged:engine_core_step_host_seconds",
                              "Host time of each engine core iteration that stepped, less its wait for the device.",
                              ["kind"], buckets=(2.5e-4, 5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0),
                              registry=registry)
        self.cpu = Counter("jaxpaged:engine_core_loop_cpu_seconds",
                           "CPU time of the engine core's loop thread in iterations that stepped.", ["kind"],
                           registry=registry)
        self._device_wait_s = device_wait_s  # the engine's running total
        self._start = self._cpu = self._wait = 0.0

    def start(self) -> None:
        """An iteration that will step begins."""
        self._start, self._cpu = time.perf_counter(), time.thread_time()
        self._wait = self._device_wait_s()

    def stop(self, stats) -> None:
        """It ended (`stats`: the engine's `SchedulerStats`): observe its host time and CPU time."""
        waited = self._device_wait_s() - self._wait
        kind = "decode" if stats.last_step_tokens == stats.last_step_seqs else "mixed"
        self.host.labels(kind).observe(time.perf_counter() - self._start - waited)
        self.cpu.labels(kind).inc(time.thread_time() - self._cpu)


class _EngineDead(RuntimeError):
    """Sent as `EngineDeadError` (the client maps error names back)."""


_EngineDead.__name__ = "EngineDeadError"
