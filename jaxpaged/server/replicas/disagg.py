"""Disaggregated prefill and decode on Ray Serve: two replica deployments behind one ingress.

```
 HTTP ──► Serve proxy ──► DisaggIngress (build_app over a DisaggPool)
                             │ (1) prefill ReplicaPool: prefix-aware over the prefill replicas' KV events
                             │     the request with max_tokens=1, drained
                             │ (2) decode ReplicaPool: prefix-aware over the decode replicas' KV events
                             ▼     the request as sent, streamed back
          PrefillReplica x P (kv_role=prefill)  ◄── pull(keys) ──  DecodeReplica x D (kv_role=decode)
```

Each deployment's replicas report their KV events to their own pool
(``report_prefill`` / ``report_decode``), so routing is prefix-aware on both
sides: a prompt goes to the prefill replica that caches most of it, then to
the decode replica that does (which then pulls only the blocks it lacks).
Before a decode hop the ingress makes sure every decode replica knows every
live prefill replica's KV endpoint (``kv_address`` / ``set_kv_peers``),
asking again only when either replica set changed.
"""

from __future__ import annotations

import dataclasses
import logging

from ray import serve
from ray.serve.config import RequestRouterConfig

from jaxpaged.engine import EngineConfig
from jaxpaged.engine.pin_quota import PinQuota
from jaxpaged.router import POLICIES
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from jaxpaged.server.replicas.app import HEALTH_CHECK_PERIOD_S, PINNED_ROUTER, QUIET, PoolIngress
from jaxpaged.server.replicas.messages import ReplicaReport
from jaxpaged.server.replicas.pool import ReplicaPool
from jaxpaged.server.replicas.replica import EngineReplica
from jaxpaged.server.request_stream import EngineDeadError
from jaxpaged.server.tenant_admission import AdmissionLimits
from jaxpaged.server.tenants import TenantKeys

log = logging.getLogger(__name__)

PREFILL_DEPLOYMENT = "PrefillReplica"
DECODE_DEPLOYMENT = "DecodeReplica"
DISAGG_INGRESS = "DisaggIngress"


def prefill_params(params: SamplingParams) -> SamplingParams:
    """What a prefill replica runs: the prompt and one token, one sequence, only the final output."""
    return dataclasses.replace(params, n=1, beam_width=1, max_tokens=1, min_tokens=0,
                               output_kind=RequestOutputKind.FINAL_ONLY, stop=(), logprobs=None,
                               prompt_logprobs=None, structured_outputs=None)


class DisaggPool:
    """An `EngineClient` over a prefill `ReplicaPool` and a decode `ReplicaPool` (see the module docstring)."""

    def __init__(self, prefill: ReplicaPool, decode: ReplicaPool) -> None:
        self.prefill, self.decode = prefill, decode
        self.model_info = decode.model_info
        self.error: BaseException | None = None
        self._peers_for: tuple | None = None  # (prefill ids, decode ids) the decode replicas' peers were set for
        self._kv_addresses: dict[str, str] = {}  # prefill replica id -> its KV endpoint
        self.prefill_failures = 0

    @property
    def is_running(self) -> bool:
        """Whether a decode replica is live (a prefill replica is optional: decode computes the prompt)."""
        return self.decode.is_running

    def start(self) -> None:
        """Start both pools' watchers."""
        self.prefill.start()
        self.decode.start()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop routing."""
        self.prefill.shutdown(timeout_s)
        self.decode.shutdown(timeout_s)

    def dead_reason(self) -> str:
        """Why no request can be served."""
        return self.decode.dead_reason()

    async def add_request(self, request_id: str, prompt, params: SamplingParams, *,
                          cache_salt: str | None = None, priority: int = 0, tenant: str | None = None,
                          limits: AdmissionLimits | None = None):
        """Prefill on a prefill replica (drained), then the request's stream from a decode replica; the tenant's
        `limits` hold on each hop.

        A bad request is the prefill replica's ValueError; a prefill hop that fails otherwise only costs
        the decode replica the prompt's compute. The decode replica pulls from the prefill replica that ran
        the prompt (``SamplingParams.kv_source``)."""
        source = None
        try:
            stream = await self.prefill.add_request(f"{request_id}-prefill", prompt, prefill_params(params),
                                                    cache_salt=cache_salt, priority=priority, tenant=tenant,
                                                    limits=limits)
            async for _ in stream:
                pass
            source = stream.replica
        except EngineDeadError as err:
            self.prefill_failures += 1
            log.warning("prefill hop of %s failed (%s); the decode replica computes the prompt", request_id, err)
        await self._sync_peers()
        params = dataclasses.replace(params, kv_source=self._kv_addresses.get(source))
        return await self.decode.add_request(request_id, prompt, params, cache_salt=cache_salt, priority=priority,
                                             tenant=tenant, limits=limits)

    async def _sync_peers(self) -> None:
        """Tell every decode replica the live prefill replicas' KV endpoints, when either set changed."""
        members = (tuple(sorted(self.prefill._replicas)), tuple(sorted(self.decode._replicas)))
        if members == self._peers_for:
            return
        answers = await self.prefill._ask_each(list(members[0]), "kv_address")
        self._kv_addresses = {r: a for r, a in zip(members[0], answers) if isinstance(a, str)}
        addresses = list(self._kv_addresses.values())
        answers = await self.decode._ask_each(list(members[1]), "set_kv_peers", addresses)
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed:
            log.warning("a decode replica did not take its KV peers: %r", failed[0])
            return  # asked again before the next request
        self._peers_for = members

    def abort(self, request_id: str) -> None:
        """Nothing by id: closing the stream aborts the request on its decode replica (`ReplicaPool.abort`)."""

    async def reset_prefix_cache(self, namespace: tuple[str, ...] | None = None) -> bool:
        """Reset both sides' prefix caches (or only ``namespace``'s blocks); False if either refused."""
        prefill = await self.prefill.reset_prefix_cache(namespace)
        return (await self.decode.reset_prefix_cache(namespace)) and prefill

    async def pin_prefix(self, prompt, ttl_s: float, *, cache_salt: str | None = None,
                         quota: PinQuota | None = None) -> int:
        """Pin on the decode replicas (where the prefix is read for every token); the blocks cached now."""
        return await self.decode.pin_prefix(prompt, ttl_s, cache_salt=cache_salt, quota=quota)

    async def engine_metrics(self) -> str:
        """Every replica's engine metrics, prefill then decode (each sample labelled with its replica)."""
        return (await self.prefill.engine_metrics()) + (await self.decode.engine_metrics())

    def crash_for_test(self) -> None:
        """Crash the decode replicas' engine loops (debug endpoint)."""
        self.decode.crash_for_test()

    async def stall_for_test(self, seconds: float) -> None:
        """Stall the decode replicas' engine loops (debug endpoint)."""
        await self.decode.stall_for_test(seconds)


@serve.ingress()
class DisaggIngress(PoolIngress):
    """The HTTP front over a `DisaggPool`: the single-engine server's app, routes and errors."""

    async def __init__(self, prefill, decode, *, served_model_name: str, model: str, policy: str,
                       enable_debug_endpoints: bool, liveness_timeout_s: float,
                       max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
                       chat_template: str | None = None, keys: TenantKeys | None = None) -> None:
        """``prefill`` / ``decode``: the two deployments' handles; the debug routes see the decode side."""
        info = await decode.model_info.remote()
        pool = DisaggPool(
            ReplicaPool(prefill, info, deployment=PREFILL_DEPLOYMENT, policy=policy,
                        liveness_timeout_s=liveness_timeout_s),
            ReplicaPool(decode, info, deployment=DECODE_DEPLOYMENT, policy=policy,
                        liveness_timeout_s=liveness_timeout_s))
        self._serve_pool(pool, pool.decode, served_model_name=served_model_name, model=model,
                         enable_debug_endpoints=enable_debug_endpoints, max_request_body_bytes=max_request_body_bytes,
                         chat_template=chat_template, keys=keys)

    def report_prefill(self, report: ReplicaReport) -> str | None:
        """A prefill replica's KV-event batch and load."""
        return self.pool.prefill.on_report(report)

    def report_decode(self, report: ReplicaReport) -> str | None:
        """A decode replica's KV-event batch and load."""
        return self.pool.decode.on_report(report)


def build_disagg_app(config: EngineConfig, *, num_prefill: int, num_decode: int, served_model_name: str,
                     policy: str = "prefix_aware", max_waiting_requests: int = 1024,
                     enable_debug_endpoints: bool = False, replica_env: dict[str, str] | None = None,
                     liveness_timeout_s: float = 60.0, report_interval_s: float = 0.05,
                     max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
                     chat_template: str | None = None, keys: TenantKeys | None = None, kv_host: str = "127.0.0.1"):
    """The bound Serve application: ``num_prefill`` prefill and ``num_decode`` decode replicas (each its own
    engine core process) behind one ingress. ``config`` is both sides' engine; its kv_* fields are set here
    (``kv_host``: the address the prefill replicas serve their blocks on)."""
    if num_prefill < 1 or num_decode < 1:
        raise ValueError(f"num_prefill and num_decode must be >= 1, got {num_prefill} and {num_decode}")
    if policy not in POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}; choose one of {sorted(POLICIES)}")
    prefill_config = dataclasses.replace(config, kv_role="prefill", kv_listen=f"tcp://{kv_host}:0", kv_peers=None)
    decode_config = dataclasses.replace(config, kv_role="decode", kv_listen=None, kv_peers=None)
    actor_options = {"num_cpus": 0}
    if replica_env:
        actor_options["runtime_env"] = {"env_vars": dict(replica_env)}

    def replicas(name: str, count: int, engine: EngineConfig, report_method: str):
        return serve.deployment(
            EngineReplica, name=name, num_replicas=count, max_ongoing_requests=100_000,
            ray_actor_options=actor_options, health_check_period_s=HEALTH_CHECK_PERIOD_S, logging_config=QUIET,
            request_router_config=RequestRouterConfig(request_router_class=PINNED_ROUTER),
        ).bind(engine, ingress_deployment=DISAGG_INGRESS, max_waiting_requests=max_waiting_requests,
               report_interval_s=report_interval_s, engine_core="process", report_method=report_method)

    ingress = serve.deployment(DisaggIngress, name=DISAGG_INGRESS, num_replicas=1, max_ongoing_requests=100_000,
                               ray_actor_options={"num_cpus": 0}, logging_config=QUIET)
    return ingress.bind(replicas(PREFILL_DEPLOYMENT, num_prefill, prefill_config, "report_prefill"),
                        replicas(DECODE_DEPLOYMENT, num_decode, decode_config, "report_decode"),
                        served_model_name=served_model_name, model=config.model, policy=policy,
                        enable_debug_endpoints=enable_debug_endpoints, liveness_timeout_s=liveness_timeout_s,
                        max_request_body_bytes=max_request_body_bytes, chat_template=chat_template, keys=keys)
