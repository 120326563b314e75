"""`EngineClient`: what the FastAPI app (`build_app`) needs of the engine it serves.

Three implement it: `AsyncEngine` (the engine loop in this process),
`core.client.CoreClient` (the engine core in another process) and
`replicas.pool.ReplicaPool` (engine replicas on Ray Serve), so the app is one
piece of code for all of them.
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol

from jaxpaged.outputs import RequestOutput
from jaxpaged.sampling_params import SamplingParams


class ModelLimits(Protocol):
    """The engine's fixed facts the app reads: its tokenizer, model config and longest sequence."""

    tokenizer: object
    model_config: object
    max_model_len: int


class RequestOutputStream(Protocol):
    """One request's outputs (the last has `finished`); `close()` aborts it if unfinished."""

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    def close(self) -> None: ...


class EngineClient(Protocol):
    """Requests in, streams of outputs out; errors (ValueError, QueueFullError, EngineDeadError) raised by
    `add_request` before anything streams. Optional: `engine_metrics()` (text appended to /metrics),
    `crash_for_test()` and `stall_for_test()` (the debug endpoints)."""

    engine: ModelLimits
    error: BaseException | None

    @property
    def is_running(self) -> bool: ...

    def start(self) -> None: ...

    def shutdown(self, timeout_s: float | None = None) -> None: ...

    async def add_request(self, request_id: str, prompt, params: SamplingParams, *,
                          cache_salt: str | None = None) -> RequestOutputStream: ...

    def abort(self, request_id: str) -> None: ...

    async def reset_prefix_cache(self) -> bool: ...
