"""`ReplicaPool`: the ingress's view of the engine replicas, an `EngineClient` that `build_app` serves.

Each request is hashed like the engines hash it and routed by a
`jaxpaged.router.Router`, whose index the replicas' event reports feed
(`on_report`). A replica leaves the index (its blocks with it) when Serve's
replica set no longer has it, when a call to it finds it dead, or when it has
not reported for ``liveness_timeout_s``. A restarted replica is a new replica
to Serve (a new id), so it enters the index empty.

Loads: a replica's ``num_waiting`` and ``kv_usage`` come from its latest
report; its request count is the ingress's own count of requests in flight
there (exact and immediate), so ``num_running`` is that count minus the
waiting ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import AsyncIterator

import ray.exceptions

from jaxpaged.engine.pin_quota import PinQuota
from jaxpaged.cache.events import DEVICE_TIER, KVEvent
from jaxpaged.outputs import RequestOutput
from jaxpaged.router import ReplicaLoad, RequestHasher, RouteRequest, Router, make_policy
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.request_stream import EngineDeadError, refuse_overlong
from jaxpaged.server.tenant_admission import AdmissionLimits
from jaxpaged.server.engine_client import ModelInfo
from jaxpaged.server.replicas.messages import Accepted, RemoteError, ReplicaReport
from jaxpaged.server.replicas.metrics import merge_replica_metrics
from jaxpaged.server.replicas.pinned_router import live_replica_ids
from jaxpaged.server.replicas.replica import RESYNC

log = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.1
_ASK_TIMEOUT_S = 60.0  # bound on a replica's answer to an introspection or reset call


@dataclasses.dataclass
class _Replica:
    actor_name: str
    last_report: float
    reported: ReplicaLoad = ReplicaLoad()
    in_flight: int = 0
    routed: int = 0  # requests routed here so far


class ReplicaPool:
    """Routes requests over the replicas of a Serve deployment (see the module docstring)."""

    def __init__(self, handle, info: ModelInfo, *, deployment: str, policy: str = "prefix_aware",
                 liveness_timeout_s: float = 60.0) -> None:
        """``handle``: the replicas' deployment handle (routed by `PinnedReplicaRouter`); ``info``: their model."""
        self.handle = handle
        self.model_info = info
        self.deployment = deployment
        self.liveness_timeout_s = liveness_timeout_s
        self.router = Router(make_policy(policy), RequestHasher(info.block_size, info.hash_algo))
        self.error: BaseException | None = None
        self._replicas: dict[str, _Replica] = {}
        self._departed: set[str] = set()  # replicas that left: late reports from them are ignored
        self._members_seen: set[str] = set()  # replicas Serve has listed as running
        self._watcher: asyncio.Task | None = None
        self._stopped = False

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the task that drops replicas Serve removed or that stopped reporting."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    @property
    def is_running(self) -> bool:
        """Whether some replica is live (has reported and not left)."""
        return not self._stopped and bool(self._replicas)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stops routing (the replicas drain with their own deployment)."""
        self._stopped = True
        if self._watcher is not None:
            self._watcher.get_loop().call_soon_threadsafe(self._watcher.cancel)

    def dead_reason(self) -> str:
        """Why no request can be served."""
        return "the ingress is shutting down" if self._stopped else "no live engine replica"

    def actor_name(self, replica: str | None) -> str | None:
        """The Ray actor name of a live replica (None if it is not live)."""
        state = self._replicas.get(replica)
        return state.actor_name if state is not None else None

    def set_policy(self, name: str, **options) -> None:
        """Routes with another policy from now on (the index is kept)."""
        self.router.policy = make_policy(name, **options)

    # ---- requests -------------------------------------------------------------------------

    async def add_request(self, request_id: str, prompt, params: SamplingParams, *,
                          cache_salt: str | None = None, priority: int = 0, tenant: str | None = None,
                          limits: AdmissionLimits | None = None) -> AsyncIterator[RequestOutput]:
        """Routes and queues a request; returns its outputs' stream.

        Raises, before anything streams: ValueError / TypeError (bad input),
        QueueFullError (the replica's queue is full), TenantLimitError (past the
        tenant's ``limits`` on the chosen replica, which counts only its own) or EngineDeadError (no live
        replica, or the chosen ones died before taking it; tried on up to every
        live replica).
        """
        refuse_overlong(prompt, self.model_info.tokenizer, self.model_info.max_model_len)  # before any per-token work
        if isinstance(prompt, str):  # off the event loop (a long prompt would stall every stream); sent as ids
            prompt = await asyncio.to_thread(self.model_info.tokenizer.encode, prompt)
        token_ids = list(prompt)
        tried: list[str] = []
        while True:
            replica = self._choose(token_ids, cache_salt, exclude=tried)
            stream = self.handle.options(stream=True).generate.remote(request_id, prompt, params, cache_salt,
                                                                      priority, tenant,
                                                                      None if limits is None else limits.to_wire(),
                                                                      target_replica=replica)
            try:
                first = await stream.__anext__()
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as err:
                self._drop(replica, f"call failed: {type(err).__name__}")
                tried.append(replica)
                continue
            except BaseException:  # the client went away (cancelled) before the replica answered
                stream.cancel()  # the replica's generator is cancelled, which aborts the request there
                raise
            if isinstance(first, RemoteError):
                raise first.exception()
            assert isinstance(first, Accepted), first
            return _ReplicaStream(self, replica, request_id, stream)

    def abort(self, request_id: str) -> None:
        """Nothing to do by id: a request is aborted on its replica by closing its stream (`_ReplicaStream.close`),
        which the server always does for a request it gives up."""

    def _choose(self, token_ids: list[int], cache_salt: str | None, exclude: list[str]) -> str:
        loads = {r: self._load(r) for r in self._replicas if r not in exclude}
        if not loads:
            raise EngineDeadError("no live engine replica" + (f" (tried {exclude})" if exclude else ""))
        try:
            matched = self.router.matched_tokens(token_ids, cache_salt)
        except (TypeError, ValueError, OverflowError):
            matched = {}  # not a valid prompt: the replica refuses it with the engine's own message
        return self.router.policy.choose(RouteRequest(len(token_ids), matched), loads)

    def _load(self, replica: str) -> ReplicaLoad:
        state = self._replicas[replica]
        waiting = min(state.reported.num_waiting, state.in_flight)
        return ReplicaLoad(num_waiting=waiting, num_running=state.in_flight - waiting,
                           kv_usage=state.reported.kv_usage)

    async def reset_prefix_cache(self, namespace: tuple[str, ...] | None = None) -> bool:
        """Resets every live replica's prefix cache (or only ``namespace``'s blocks); False if any refused
        (blocks in use)."""
        results = await self._ask_each(list(self._replicas), "reset_prefix_cache", namespace)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise EngineDeadError(f"a replica did not reset its prefix cache: {errors[0]!r}")
        return all(results)

    async def pin_prefix(self, prompt, ttl_s: float, *, cache_salt: str | None = None,
                         quota: PinQuota | None = None) -> int:
        """Pins the prefix on every live replica (any of them may serve it); the blocks cached now, summed.
        Each replica charges ``quota``'s owner on its own ledger.

        A bad prompt or TTL is the first replica's ValueError (every replica refuses it alike)."""
        results = await self._ask_each(list(self._replicas), "pin_prefix", prompt, ttl_s, cache_salt,
                                       None if quota is None else quota.to_wire())
        for r in results:
            if isinstance(r, ValueError):
                raise r
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise EngineDeadError(f"a replica did not pin the prefix: {errors[0]!r}")
        return sum(results)

    async def engine_metrics(self) -> str:
        """Every live replica's engine metrics (Prometheus text), each sample labelled ``replica``."""
        replicas = list(self._replicas)
        texts = await self._ask_each(replicas, "metrics_text")
        return merge_replica_metrics({r: t for r, t in zip(replicas, texts) if isinstance(t, str)})

    def crash_for_test(self) -> None:
        """Make every replica's engine loop raise (the debug endpoint); returns before they do."""
        asyncio.ensure_future(self._ask_each(list(self._replicas), "crash_for_test"))

    async def stall_for_test(self, seconds: float) -> None:
        """Make every replica's engine loop sleep ``seconds`` between two steps (the debug endpoint)."""
        await self._ask_each(list(self._replicas), "stall_for_test", seconds)

    async def _ask(self, replica: str, method: str, *args):
        """Calls ``method`` on one replica."""
        call = getattr(self.handle, method).remote(*args, target_replica=replica)
        return await asyncio.wait_for(call, _ASK_TIMEOUT_S)

    async def _ask_each(self, replicas: list[str], method: str, *args) -> list:
        """``method``'s answer (or the error) from each replica, one call at a time.

        Never concurrently: Serve gives every call made while handling one HTTP
        request that request's internal id, and its request router keys pending
        calls by that id, so of two calls routed at once one was never sent
        (Ray 2.60). Calls made one after another are routed one at a time.
        """
        answers = []
        for replica in replicas:
            try:
                answers.append(await self._ask(replica, method, *args))
            except Exception as err:  # noqa: BLE001 - reported per replica
                answers.append(err)
        return answers

    # ---- events and liveness --------------------------------------------------------------

    def on_report(self, report: ReplicaReport) -> str | None:
        """Applies a replica's event batch and load; `RESYNC` when it must send its whole cache."""
        replica = report.replica_id
        if replica in self._departed:
            return None
        if replica not in self._replicas:
            if not (report.first or report.resync):
                log.info("replica %s is unknown (the ingress restarted?): asking for its whole cache", replica)
                return RESYNC
            self.router.add_replica(replica)
            self._replicas[replica] = _Replica(report.actor_name, time.monotonic())
            log.info("replica %s (%s) joined", replica, report.actor_name)
        state = self._replicas[replica]
        state.last_report = time.monotonic()
        state.reported = report.load
        self.router.on_events(replica, _device_tier(report.events))
        return None

    def _drop(self, replica: str, why: str) -> None:
        if replica in self._replicas:
            log.warning("replica %s left the index: %s", replica, why)
            del self._replicas[replica]
            self.router.remove_replica(replica)
        self._departed.add(replica)

    async def _watch(self) -> None:
        while not self._stopped:
            members = live_replica_ids(self.deployment)
            if members is not None:
                self._members_seen |= members
                for replica in list(self._replicas):
                    if replica in self._members_seen and replica not in members:
                        self._drop(replica, "Serve no longer lists it")
            now = time.monotonic()
            for replica, state in list(self._replicas.items()):
                if now - state.last_report > self.liveness_timeout_s:
                    self._drop(replica, f"no report for {self.liveness_timeout_s} s")
            await asyncio.sleep(_WATCH_INTERVAL_S)

    # ---- introspection --------------------------------------------------------------------

    async def describe(self) -> list[dict]:
        """Per live replica: its actual cache and load (asked of it) beside the index's view of it."""
        replicas = list(self._replicas)
        views = await self._ask_each(replicas, "inspect")
        rows = []
        for replica, view in zip(replicas, views):
            state = self._replicas.get(replica)
            row = {"replica_id": replica, "actor_name": state.actor_name if state else None,
                   "index_hashes": sorted(h.hex() for h in self.router.index.blocks_of(replica))
                   if replica in self._replicas else None,
                   "routed_requests": state.routed if state else None,
                   "in_flight": state.in_flight if state else None,
                   "reported_load": dataclasses.asdict(state.reported) if state else None}
            if isinstance(view, BaseException):  # the call failed
                row |= {"cached_hashes": None, "error": repr(view)}
            elif view.replica_id != replica:
                row |= {"cached_hashes": None, "error": f"answered by {view.replica_id}"}
            else:
                row |= {"cached_hashes": sorted(h.hex() for h in view.cached_hashes),
                        "load": dataclasses.asdict(view.load)} | view.extra
            rows.append(row)
        return rows


class _ReplicaStream:
    """A request's outputs from its replica; counted in the replica's load from acceptance until it ends or closes.

    Closing it before the last output (the client went away) cancels the
    replica's stream, which aborts the request there.
    """

    def __init__(self, pool: ReplicaPool, replica: str, request_id: str, stream) -> None:
        self._pool, self._replica, self._request_id, self._stream = pool, replica, request_id, stream
        self._state = pool._replicas.get(replica)
        self._open = True
        if self._state is not None:
            self._state.in_flight += 1
            self._state.routed += 1

    @property
    def replica(self) -> str:
        """The replica serving this request."""
        return self._replica

    def __aiter__(self) -> "_ReplicaStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._open:
            raise StopAsyncIteration
        try:
            output = await self._stream.__anext__()
        except StopAsyncIteration:
            self._release()
            raise
        except ray.exceptions.RayError as err:
            self._release()
            if isinstance(err, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
                self._pool._drop(self._replica, f"call failed: {type(err).__name__}")
            raise EngineDeadError(f"engine replica {self._replica} failed while serving {self._request_id}: "
                                  f"{type(err).__name__}") from err
        if output.finished:
            self._release()
        return output

    def close(self) -> None:
        """Stops the stream; an unfinished request is aborted on its replica (synchronous: safe under cancellation)."""
        if self._open:
            self._release()
            self._stream.cancel()

    async def aclose(self) -> None:
        """`close()` (the async-iterator spelling)."""
        self.close()

    def _release(self) -> None:
        if self._open and self._state is not None:
            self._state.in_flight -= 1
        self._open = False


def _device_tier(events: list[KVEvent]) -> list[KVEvent]:
    """The device tier's events: the index mirrors what a replica can hit without a transfer."""
    return [e for e in events if e.tier == DEVICE_TIER]
