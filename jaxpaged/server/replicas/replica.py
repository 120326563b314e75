"""One engine replica of a Ray Serve deployment: serves requests and streams its KV events to the ingress.

The engine runs in an `AsyncEngine` loop thread, as in the single-engine
server. A background task drains the cache manager's events on that thread
every ``report_interval_s`` (with the replica's load) and sends the batch to
the ingress's ``report``; a batch the ingress did not take is kept and sent
with the next one, so the ingress sees every event once, in order. The first
batch of a replica's life starts with ``AllBlocksCleared``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import AsyncIterator

from prometheus_client import generate_latest
from ray import serve

from jaxpaged.cache.events import AllBlocksCleared, BlockStored, KVEvent
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.metrics import attach_metrics
from jaxpaged.router import ReplicaLoad
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.async_engine import AsyncEngine, EngineDeadError, QueueFullError
from jaxpaged.server.replicas.messages import (Accepted, ModelInfo, RemoteError, ReplicaCacheView,
                                               ReplicaReport)

log = logging.getLogger(__name__)

RESYNC = "resync"  # the ingress's answer to a report from a replica it does not know


def engine_load(engine: Engine) -> ReplicaLoad:
    """The engine's queue lengths and KV usage (call on its loop thread)."""
    return engine.load()


def cached_hashes(engine: Engine) -> set[bytes]:
    """The hashes in the engine's device prefix cache (call on its loop thread)."""
    return engine.cached_block_hashes()


class EngineReplica:
    """A Serve replica holding one engine; see the module docstring.

    Calls may carry ``target_replica`` (read by `PinnedReplicaRouter`, ignored here).
    """

    async def __init__(self, config: EngineConfig, *, ingress_deployment: str, max_waiting_requests: int = 1024,
                       report_interval_s: float = 0.05, heartbeat_s: float = 1.0) -> None:
        """Builds the engine, enables its KV events, starts its loop and the report task."""
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self.actor_name = context.replica_id.to_full_id_str()
        self.report_interval_s = report_interval_s
        self.heartbeat_s = heartbeat_s  # an unchanged replica still reports this often (the ingress's liveness)
        engine = Engine(config)
        engine.enable_kv_events()
        self.metrics = attach_metrics(engine)
        self.async_engine = AsyncEngine(engine, max_waiting_requests=max_waiting_requests)
        self.async_engine.start()
        self._ingress = serve.get_deployment_handle(ingress_deployment, app_name=context.app_name)
        self._reporter = asyncio.get_running_loop().create_task(self._report_forever())

    # ---- requests -------------------------------------------------------------------------

    async def generate(self, request_id: str, prompt, params: SamplingParams, cache_salt: str | None = None,
                       target_replica: str | None = None) -> AsyncIterator:
        """`Accepted()` then the request's outputs; or one `RemoteError` when the engine refused it.

        Cancelling the stream (the client went away) aborts the request.
        """
        try:
            stream = await self.async_engine.add_request(request_id, prompt, params, cache_salt=cache_salt)
        except (ValueError, TypeError, QueueFullError, EngineDeadError) as err:
            yield RemoteError.of(err)
            return
        yield Accepted()
        try:
            async for output in stream:
                yield output
        finally:  # cancelled by the ingress (its client went away), or done: abort if unfinished
            stream.close()

    async def reset_prefix_cache(self, target_replica: str | None = None) -> bool:
        """Drops the unreferenced cached blocks; False if some are in use."""
        return await self.async_engine.reset_prefix_cache()

    async def pin_prefix(self, prompt, ttl_s: float, cache_salt: str | None = None,
                         target_replica: str | None = None) -> int:
        """Pins the prompt's blocks for ``ttl_s`` seconds (`Engine.pin_prefix`); the blocks cached now."""
        return await self.async_engine.pin_prefix(prompt, ttl_s, cache_salt=cache_salt)

    def metrics_text(self, target_replica: str | None = None) -> str:
        """This replica's engine metrics (Prometheus text), for the ingress's ``/metrics``."""
        return generate_latest(self.metrics.registry).decode()

    def crash_for_test(self, target_replica: str | None = None) -> None:
        """Make the engine loop raise, as an unexpected engine error would (debug endpoint)."""
        self.async_engine.crash_for_test()

    async def stall_for_test(self, seconds: float, target_replica: str | None = None) -> None:
        """Make the engine loop sleep ``seconds`` between two steps, as a long compile would (debug endpoint)."""
        await self.async_engine.stall_for_test(seconds)

    def model_info(self, target_replica: str | None = None) -> ModelInfo:
        """Tokenizer, model config and cache geometry, for the ingress."""
        engine = self.async_engine.engine
        return ModelInfo(engine.tokenizer, engine.model_config, engine.max_model_len, engine.block_size,
                         engine.config.hash_algo)

    async def inspect(self, target_replica: str | None = None) -> ReplicaCacheView:
        """The replica's actual cached hashes and load, read on its loop thread (introspection)."""
        hashes, load, evictions = await self.async_engine.call_in_loop(
            lambda e: (cached_hashes(e), engine_load(e), e.kv_stats().num_evictions))
        return ReplicaCacheView(self.replica_id, self.actor_name, hashes, load,
                                {"pid": os.getpid(), "num_evictions": evictions})

    def check_health(self) -> None:
        """Serve's health check: raises (and Serve replaces the replica) once the engine loop is gone."""
        if not self.async_engine.is_running:
            raise RuntimeError(f"replica {self.replica_id}: {self.async_engine.dead_reason()}")
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
                    events, load = await self.async_engine.call_in_loop(self._full_state)
                    pending = events
                else:
                    events, load = await self.async_engine.call_in_loop(self._take)
                    pending.extend(events)
            except EngineDeadError:
                return  # check_health reports it; Serve replaces the replica
            if pending or load != sent_load or loop.time() - sent_at >= self.heartbeat_s:
                report = ReplicaReport(self.replica_id, self.actor_name, pending, load, first=first, resync=resync)
                try:
                    answer = await self._ingress.report.remote(report)
                except Exception as err:  # noqa: BLE001 - the ingress is (re)starting: keep the batch, retry
                    log.warning("replica %s: report not delivered (%s); retrying", self.replica_id, err)
                else:
                    pending, first, sent_load, sent_at = [], False, load, loop.time()
                    resync = answer == RESYNC
            await asyncio.sleep(self.report_interval_s)

    @staticmethod
    def _take(engine: Engine) -> tuple[list[KVEvent], ReplicaLoad]:
        return engine.take_kv_events(), engine_load(engine)

    @staticmethod
    def _full_state(engine: Engine) -> tuple[list[KVEvent], ReplicaLoad]:
        """Events that rebuild the whole cache: cleared, then every cached hash (the log restarts here)."""
        engine.take_kv_events()  # already covered by the state below
        hashes = tuple(cached_hashes(engine))
        events: list[KVEvent] = [AllBlocksCleared()]
        if hashes:
            events.append(BlockStored(hashes, None, None, engine.block_size))
        return events, engine_load(engine)
