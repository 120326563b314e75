"""What an API server needs of a request on its way to an engine and back, without the engine: the errors a
client sees, a request's output stream, the length check before tokenizing, and SamplingParams as data.

Nothing here imports JAX (nor the engine): the API server processes of the split server import this, and
`tests/server/test_openai_server.py::test_only_a_process_running_the_engine_loads_jax` checks them.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Protocol

from jaxpaged.outputs import RequestOutput, RequestOutputKind, merge_outputs
from jaxpaged.sampling_params import SamplingParams


class Aborts(Protocol):
    """What a stream's owner does for it: abort its request when the client stops reading."""

    def abort(self, request_id: str) -> None:
        """Abort ``request_id`` (a no-op when it has finished)."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (crashed or shut down); no request can be served."""


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the client should retry later."""


class TenantLimitError(RuntimeError):
    """The request's tenant has as many requests in the engine, or waiting in it, as its key allows (a 429)."""


class RequestStream:
    """One request's outputs as its client's event loop receives them (the last one has `finished`).

    An output that arrives while the previous one is still untaken is merged
    into it (`merge_outputs`, as vLLM's `RequestOutputCollector`): a client
    that falls behind gets one output per wake-up carrying every token since
    its last read, not a backlog of one-token outputs. `close()` before the
    final output aborts the request (its blocks are freed); it is
    synchronous, so it also works where an `await` cannot run (a `finally`
    under cancellation), and closing twice, or after the end, is a no-op. An
    error from the loop (it died) is raised by the next `__anext__`.
    """

    __slots__ = ("_owner", "request_id", "_loop", "_kind", "_items", "_waiter", "_done")

    def __init__(self, owner: Aborts, request_id: str, loop: asyncio.AbstractEventLoop,
                 output_kind: RequestOutputKind = RequestOutputKind.DELTA) -> None:
        self._owner, self.request_id, self._loop, self._kind = owner, request_id, loop, output_kind
        self._items: collections.deque = collections.deque()  # untaken outputs (merged: at most one) / errors
        self._waiter: asyncio.Future | None = None
        self._done = False  # the final output (or an error) was taken, or the client closed the stream

    def put_threadsafe(self, item: RequestOutput | BaseException) -> None:
        """Hand an output or an error over from the loop thread (dropped if the client's loop is gone)."""
        try:
            self._loop.call_soon_threadsafe(self.put, item)
        except RuntimeError:  # the client's event loop is closed: nobody is left to read it
            pass

    def put(self, item: RequestOutput | BaseException) -> None:
        """Hand an output or an error over from the client's own event loop."""
        items = self._items
        if items and not isinstance(item, BaseException) and not isinstance(items[-1], BaseException):
            items[-1] = merge_outputs(items[-1], item, self._kind)
        else:
            items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
        item = self._items.popleft()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    def close(self) -> None:
        """Stop reading; an unfinished request is aborted."""
        if not self._done:
            self._done = True
            self._owner.abort(self.request_id)

    async def aclose(self) -> None:
        """`close()` (the async-iterator spelling)."""
        self.close()


def refuse_overlong(prompt, tokenizer, max_model_len: int) -> None:
    """ValueError for a prompt that cannot fit `max_model_len`, judged by its length alone (no per-token
    work): token ids by their count, a text by its length when the tokenizer bounds the characters per
    token (`max_chars_per_token`). Anything else is left to the engine's own checks."""
    per_token = tokenizer.max_chars_per_token
    if isinstance(prompt, str) and per_token is not None and len(prompt) > per_token * max_model_len:
        raise ValueError(f"prompt ({len(prompt)} characters, so more than {max_model_len} tokens) "
                         f"exceeds max_model_len ({max_model_len})")
    if isinstance(prompt, (list, tuple)) and len(prompt) > max_model_len:
        raise ValueError(f"prompt ({len(prompt)} tokens) exceeds max_model_len ({max_model_len})")


def params_to_dict(params: SamplingParams) -> dict:
    """SamplingParams as JSON-able data (a broadcast command carries it to every process)."""
    d = dataclasses.asdict(params)
    d["output_kind"] = params.output_kind.name
    return d


def params_from_dict(d: dict) -> SamplingParams:
    """The SamplingParams `params_to_dict` wrote."""
    from jaxpaged.outputs import RequestOutputKind
    from jaxpaged.structured import StructuredOutputsParams

    structured = d.get("structured_outputs")
    fields = d | {"output_kind": RequestOutputKind[d["output_kind"]],
                  "structured_outputs": None if structured is None else StructuredOutputsParams(**structured)}
    return SamplingParams(**fields)
