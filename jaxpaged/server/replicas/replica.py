"""One engine replica of a Ray Serve deployment: serves requests and streams its KV events to the ingress.

The replica actor owns one engine core process (`engine_core="process"`, the
default, as each of vLLM's data-parallel ranks is one engine core): it is
that core's only API-server side, a `CoreClient` that detokenizes, while the
core process steps. The core gets SIGTERM if the actor dies (killed, or
replaced by Serve), so none outlives its replica. `engine_core="thread"`
runs the engine in an `AsyncEngine` loop thread of the actor instead.

A background task asks the engine for its cache manager's events (the
`kv_events` query, between two steps) every ``report_interval_s`` (with the
replica's load) and sends the batch to the ingress's ``report``; a batch the
ingress did not take is kept and sent with the next one, so the ingress sees
every event once, in order. The first batch of a replica's life starts with
``AllBlocksCleared``.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import tempfile
from typing import AsyncIterator

from prometheus_client import generate_latest
from ray import serve

from jaxpaged.engine.pin_quota import PinQuota
from jaxpaged.cache.events import AllBlocksCleared, KVEvent
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.metrics import attach_metrics
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.async_engine import AsyncEngine
from jaxpaged.server.request_stream import EngineDeadError, QueueFullError, TenantLimitError
from jaxpaged.server.tenant_admission import AdmissionLimits
from jaxpaged.server.engine_client import ModelInfo
from jaxpaged.server.replicas.messages import Accepted, RemoteError, ReplicaCacheView, ReplicaReport

log = logging.getLogger(__name__)

RESYNC = "resync"  # the ingress's answer to a report from a replica it does not know


class EngineReplica:
    """A Serve replica holding one engine; see the module docstring.

    Calls may carry ``target_replica`` (read by `PinnedReplicaRouter`, ignored here).
    """

    async def __init__(self, config: EngineConfig, *, ingress_deployment: str, max_waiting_requests: int = 1024,
                       report_interval_s: float = 0.05, heartbeat_s: float = 1.0,
                       engine_core: str = "process", report_method: str = "report") -> None:
        """Builds the engine (in its core process, or here), enables its KV events, starts the report task.

        ``report_method``: the ingress method its reports go to (a disaggregated ingress has one per role)."""
        if engine_core not in ("process", "thread"):
            raise ValueError(f"engine_core must be 'process' or 'thread', got {engine_core!r}")
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self.actor_name = context.replica_id.to_full_id_str()
        self.report_interval_s = report_interval_s
        self.report_method = report_method
        self.heartbeat_s = heartbeat_s  # an unchanged replica still reports this often (the ingress's liveness)
        self.metrics = None
        self._core = self._socket_dir = None
        if engine_core == "process":
            self.client = await self._start_core(config, max_waiting_requests)
        else:
            engine = Engine(config)
            engine.enable_kv_events()
            self.metrics = attach_metrics(engine)
            self.client = AsyncEngine(engine, max_waiting_requests=max_waiting_requests)
            self.client.start()
        self._ingress = serve.get_deployment_handle(ingress_deployment, app_name=context.app_name)
        self._reporter = asyncio.get_running_loop().create_task(self._report_forever())

    async def _start_core(self, config: EngineConfig, max_waiting_requests: int):
        """The replica's engine core process (it dies with this actor) and the client connected to it."""
        from jaxpaged.server.core.client import CoreClient
        from jaxpaged.server.core.launcher import start_child
        from jaxpaged.server.core.process import CoreSpec, run_core
        self._socket_dir = tempfile.mkdtemp(prefix="jaxpaged-replica-")
        address = f"ipc://{self._socket_dir}/core.sock"
        spec = CoreSpec(config, max_waiting_requests=max_waiting_requests, enable_kv_events=True)
        self._core = start_child(multiprocessing.get_context("spawn"), run_core, spec, address,
                                 name="jaxpaged-replica-core")
        client = CoreClient(address, self._core.pid)
        await client.connect()
        return client

    def __del__(self) -> None:
        """Serve stops the replica: stop its core process (it drains) and remove its socket."""
        if self._core is not None and self._core.is_alive():
            self._core.terminate()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    # ---- requests -------------------------------------------------------------------------

    async def generate(self, request_id: str, prompt, params: SamplingParams, cache_salt: str | None = None,
                       priority: int = 0, tenant: str | None = None, limits: list | None = None,
                       target_replica: str | None = None) -> AsyncIterator:
        """`Accepted()` then the request's outputs; or one `RemoteError` when the engine refused it.

        Cancelling the stream (the client went away) aborts the request.
        """
        try:
            stream = await self.client.add_request(request_id, prompt, params, cache_salt=cache_salt,
                                                   priority=priority, tenant=tenant,
                                                   limits=AdmissionLimits.from_wire(limits))
        except (ValueError, TypeError, QueueFullError, TenantLimitError, EngineDeadError) as err:
            yield RemoteError.of(err)
            return
        yield Accepted()
        try:
            async for output in stream:
                yield output
        finally:  # cancelled by the ingress (its client went away), or done: abort if unfinished
            stream.close()

    async def reset_prefix_cache(self, namespace: tuple[str, ...] | None = None,
                                 target_replica: str | None = None) -> bool:
        """Drops the unreferenced cached blocks (only ``namespace``'s, if given); False if some are in use."""
        return await self.client.reset_prefix_cache(namespace)

    async def pin_prefix(self, prompt, ttl_s: float, cache_salt: str | None = None, quota: list | None = None,
                         target_replica: str | None = None) -> int:
        """Pins the prompt's blocks for ``ttl_s`` seconds (`Engine.pin_prefix`, charged to ``quota``, a
        `PinQuota.to_wire` list); the blocks cached now."""
        return await self.client.pin_prefix(prompt, ttl_s, cache_salt=cache_salt, quota=PinQuota.from_wire(quota))

    async def metrics_text(self, target_replica: str | None = None) -> str:
        """This replica's engine metrics (Prometheus text), for the ingress's ``/metrics``."""
        if self.metrics is None:
            return await self.client.engine_metrics()
        return generate_latest(self.metrics.registry).decode()

    def crash_for_test(self, target_replica: str | None = None) -> None:
        """Make the engine loop raise, as an unexpected engine error would (debug endpoint)."""
        self.client.crash_for_test()

    async def stall_for_test(self, seconds: float, target_replica: str | None = None) -> None:
        """Make the engine loop sleep ``seconds`` between two steps, as a long compile would (debug endpoint)."""
        await self.client.stall_for_test(seconds)

    def model_info(self, target_replica: str | None = None) -> ModelInfo:
        """Tokenizer, model config and cache geometry, for the ingress."""
        return self.client.model_info

    async def kv_address(self, target_replica: str | None = None) -> str | None:
        """Where this replica's engine serves its KV blocks (a prefill replica), or None."""
        return await self.client.query("kv_address")

    async def set_kv_peers(self, peers: list[str], target_replica: str | None = None) -> None:
        """The prefill replicas' KV endpoints this (decode) replica pulls from (needs engine_core="process")."""
        await self.client.set_kv_peers(peers)

    async def inspect(self, target_replica: str | None = None) -> ReplicaCacheView:
        """The replica's actual cached hashes and load, read on its loop thread (introspection)."""
        hashes, load, evictions = await self.client.query("cache_view")
        return ReplicaCacheView(self.replica_id, self.actor_name, hashes, load,
                                {"pid": self._core.pid if self._core is not None else os.getpid(),
                                 "num_evictions": evictions})

    def check_health(self) -> None:
        """Serve's health check: raises (and Serve replaces the replica) once the engine loop is gone."""
        if not self.client.is_running:
            raise RuntimeError(f"replica {self.replica_id}: {self.client.dead_reason()}")
        if self._reporter.done() and not self._reporter.cancelled() and self._reporter.exception() is not None:
            raise RuntimeError(f"replica {self.replica_id}: event reporting failed: {self._reporter.exception()!r}")

    # ---- event streaming ------------------------------------------------------------------

    async def _report_forever(self) -> None:
        pending: list[KVEvent] = [AllBlocksCleared()]
        first, resync = True, False
        sent_load, sent_at = None, 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                if resync:
                    events, load = await self.client.query("kv_full_state")
                    pending = events
                else:
                    events, load = await self.client.query("kv_events")
                    pending.extend(events)
            except EngineDeadError:
                return  # check_health reports it; Serve replaces the replica
            if pending or load != sent_load or loop.time() - sent_at >= self.heartbeat_s:
                report = ReplicaReport(self.replica_id, self.actor_name, pending, load, first=first, resync=resync)
                try:
                    answer = await getattr(self._ingress, self.report_method).remote(report)
                except Exception as err:  # noqa: BLE001 - the ingress is (re)starting: keep the batch, retry
                    log.warning("replica %s: report not delivered (%s); retrying", self.replica_id, err)
                else:
                    pending, first, sent_load, sent_at = [], False, load, loop.time()
                    resync = answer == RESYNC
            await asyncio.sleep(self.report_interval_s)
