"""The online benchmark's HTTP side: streamed OpenAI completions, timed chunk by chunk.

`run_requests` sends every request at its arrival offset to ``POST /v1/completions`` (``stream``,
``stream_options.include_usage``) and records for each what ``vllm bench serve`` records (`RequestResult`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence

import httpx

from jaxpaged.bench.online.datasets import BenchRequest

COMPLETIONS_PATH = "/v1/completions"
DONE = "[DONE]"


@dataclasses.dataclass
class RequestResult:
    """What one request did, in seconds of ``time.perf_counter``: sent at ``start_time``, ``ttft`` to the first
    content chunk, ``itl`` the gaps between content chunks, ``latency`` to the last one (= ttft + sum(itl)).

    ``success``: the stream held content, then ``[DONE]``, and no error (else ``error`` says why: HTTP status and
    body, an error chunk, or the exception). ``prompt_len`` is the server's ``usage.prompt_tokens`` when reported,
    else the dataset's count; ``output_tokens`` and ``cached_tokens`` come from ``usage`` (None without it).
    """

    request_id: str
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int | None = None
    cached_tokens: int | None = None
    start_time: float = 0.0
    ttft: float = 0.0
    itl: list[float] = dataclasses.field(default_factory=list)
    latency: float = 0.0
    text: str = ""
    finish_reason: str | None = None


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Each server-sent event's data (its data lines joined by newlines) as a blank line or the end closes it;
    comments and the other fields (event:, id:, retry:) carry nothing the benchmark needs."""
    data: list[str] = []
    async for line in lines:
        line = line.rstrip("\r\n")
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
        elif not line and data:
            yield "\n".join(data)
            data = []
    if data:
        yield "\n".join(data)


class CompletionStream:
    """Folds a completion stream's data payloads, with their arrival times, into a `RequestResult`."""

    def __init__(self, result: RequestResult) -> None:
        """Fill ``result``, whose ``start_time`` is when the request was sent."""
        self.result, self.done, self.has_content = result, False, False

    def on_payload(self, payload: str, now: float) -> None:
        """Take one event's data that arrived at ``now``; ValueError for an error chunk or bad JSON."""
        if self.done:
            raise ValueError(f"data after [DONE]: {payload[:200]!r}")
        if payload.strip() == DONE:
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            raise ValueError(f"a chunk is not JSON: {payload[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise ValueError(f"a chunk is not a JSON object: {payload[:200]!r}")
        if "error" in chunk:
            raise ValueError(f"error chunk: {json.dumps(chunk['error'])[:500]}")
        r = self.result
        if chunk.get("choices"):  # a content chunk (its text may be empty)
            choice = chunk["choices"][0]
            if self.has_content:
                r.itl.append(now - (r.start_time + r.latency))
            else:
                r.ttft = now - r.start_time
            self.has_content, r.latency = True, now - r.start_time
            r.text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            r.finish_reason = choice.get("finish_reason") or r.finish_reason
        if usage := chunk.get("usage"):
            r.output_tokens = usage.get("completion_tokens")
            r.prompt_len = usage.get("prompt_tokens", r.prompt_len)
            r.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")

    def finish(self) -> None:
        """Mark the result successful, or ValueError when the stream ended early or held no content."""
        if not self.done:
            raise ValueError("the stream ended before data: [DONE]")
        if not self.has_content:
            raise ValueError("the stream held no content chunk")
        self.result.success = True


def completion_body(request: BenchRequest, model: str, *, ignore_eos: bool = True,
                    temperature: float = 0.0) -> dict:
    """The streamed ``/v1/completions`` request body for ``request``."""
    body = {"model": model, "prompt": request.prompt, "max_tokens": request.output_len,
            "temperature": temperature, "ignore_eos": ignore_eos, "stream": True,
            "stream_options": {"include_usage": True}}
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    return body


async def send_completion(client: httpx.AsyncClient, request: BenchRequest, body: dict, *,
                          clock: Callable[[], float] = time.perf_counter) -> RequestResult:
    """POST ``body`` as a streamed completion and time its chunks; failures come back in the result."""
    result = RequestResult(request.request_id, prompt_len=request.prompt_len)
    result.start_time = clock()
    stream = CompletionStream(result)
    try:
        async with client.stream("POST", COMPLETIONS_PATH, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:500]}"
                return result
            async for payload in sse_events(response.aiter_lines()):
                stream.on_payload(payload, clock())
        stream.finish()
    except Exception as e:  # noqa: BLE001 - a benchmark records every failure and goes on
        result.error = f"{type(e).__name__}: {e}"
    return result


def fetch_model_name(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model ``GET /v1/models`` lists."""
    response = httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=timeout_s, trust_env=False)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no model")
    return models[0]["id"]


def fetch_metric(base_url: str, name: str, timeout_s: float = 10.0) -> float | None:
    """The value of one unlabelled sample of the server's ``GET /metrics`` (None if it exports none)."""
    response = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s, trust_env=False)
    response.raise_for_status()
    for line in response.text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    return None


def run_requests(base_url: str, model: str, requests: Sequence[BenchRequest], offsets: Sequence[float], *,
                 max_concurrency: int | None = None, ignore_eos: bool = True, timeout_s: float = 600.0,
                 on_done: Callable[[RequestResult], None] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> tuple[list[RequestResult], float]:
    """Send ``requests[i]`` at ``offsets[i]`` seconds after the start; returns results (in order) and the duration.

    The duration runs from the start to the last request's end. ``max_concurrency`` (None = unlimited) caps
    requests in flight; a request waiting for a slot is sent late and its timings start when it is sent.
    ``transport`` replaces the network (tests pass an ``httpx.MockTransport``).
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1 (or None = unlimited), got {max_concurrency}")
    if len(offsets) != len(requests):
        raise ValueError(f"{len(offsets)} arrival offsets for {len(requests)} requests")
    connections = max_concurrency or max(1, len(requests))  # never queue in httpx's pool: it would count in TTFT
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0))

    async def run() -> tuple[list[RequestResult], float]:
        slots = asyncio.Semaphore(connections)
        async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout, limits=limits, trust_env=False,
                                     transport=transport) as client:
            async def one(request: BenchRequest, body: dict) -> RequestResult:
                async with slots:
                    result = await send_completion(client, request, body)
                if on_done is not None:
                    on_done(result)
                return result

            start, tasks = time.perf_counter(), []
            for request, offset in zip(requests, offsets):
                body = completion_body(request, model, ignore_eos=ignore_eos)
                if (delay := start + offset - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(request, body)))
            return list(await asyncio.gather(*tasks)), time.perf_counter() - start
    return asyncio.run(run())
