"""`EngineClient`: all the HTTP server (`build_app` and its routes) knows of the engine it serves.

Three implement it: `AsyncEngine` (the engine loop in a thread of this
process), `core.client.CoreClient` (the engine core in another process) and
`replicas.pool.ReplicaPool` (engine replicas on Ray Serve, routed by prefix),
so the app is one piece of code for all of them. `tests/server/
test_engine_clients.py` checks that each has every member, with the same
parameters.
"""

from __future__ import annotations

import dataclasses
from typing import AsyncIterator, Protocol, runtime_checkable

from jaxpaged.engine.pin_quota import PinQuota
from jaxpaged.server.tenant_admission import AdmissionLimits
from jaxpaged.config import ModelConfig
from jaxpaged.outputs import RequestOutput
from jaxpaged.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """The engine's fixed facts a front end reads: its tokenizer, model, longest sequence and cache geometry
    (the block size and hash algorithm, for a router that hashes prompts as the engine does), and the sizes
    a request's limits derive from (`limits.RequestLimits`): the sequences it runs at once and its
    waiting-queue bound."""

    tokenizer: object
    model_config: ModelConfig
    max_model_len: int
    block_size: int
    hash_algo: str
    max_num_seqs: int = 64
    max_waiting_requests: int = 1024
    kv_address: str | None = None  # a prefill engine's KV endpoint: its responses name it (kv_transfer_params)

    @classmethod
    def of(cls, engine, max_waiting_requests: int = 1024) -> "ModelInfo":
        """The facts of an `Engine` (fixed at its construction, so safe to read from any thread), served with
        a waiting queue of `max_waiting_requests`."""
        from jaxpaged.server.engine_queries import kv_address
        return cls(engine.tokenizer, engine.model_config, engine.max_model_len, engine.block_size,
                   engine.config.hash_algo, engine.config.max_num_seqs, max_waiting_requests, kv_address(engine))


class RequestOutputStream(Protocol):
    """One request's outputs (the last has `finished`); `close()` aborts it if unfinished."""

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    def close(self) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    """Requests in, streams of outputs out. `add_request` raises ValueError / TypeError (bad input),
    QueueFullError or EngineDeadError before anything streams. `engine_metrics()` is Prometheus text the
    server appends to its own /metrics ("" when the server's registry already has the engine's);
    `crash_for_test` / `stall_for_test` back the debug endpoints."""

    model_info: ModelInfo
    error: BaseException | None

    @property
    def is_running(self) -> bool: ...

    def start(self) -> None: ...

    def shutdown(self, timeout_s: float | None = None) -> None: ...

    def dead_reason(self) -> str: ...

    async def add_request(self, request_id: str, prompt, params: SamplingParams, *,
                          cache_salt: str | None = None, priority: int = 0, tenant: str | None = None,
                          limits: AdmissionLimits | None = None) -> RequestOutputStream: ...

    def abort(self, request_id: str) -> None: ...

    async def reset_prefix_cache(self, namespace: tuple[str, ...] | None = None) -> bool: ...

    async def pin_prefix(self, prompt, ttl_s: float, *, cache_salt: str | None = None,
                         quota: PinQuota | None = None) -> int: ...

    async def engine_metrics(self) -> str: ...

    def crash_for_test(self) -> None: ...

    async def stall_for_test(self, seconds: float) -> None: ...
