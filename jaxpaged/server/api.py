"""The FastAPI app: OpenAI-compatible completions and chat, models, health, metrics, tokenizer, cache reset.

Every client's request goes into the one `AsyncEngine`. Errors follow the
OpenAI shape, `{"error": {"message", "type", "param", "code"}}`: 400 for bad
input (the engine's ValueErrors, malformed JSON, wrong types), 404 for an
unknown model, 503 with `Retry-After` when the waiting queue is full or the
engine loop is gone. A streaming client that disconnects has its request
aborted, which frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from jaxpaged.outputs import RequestOutput
from jaxpaged.server import responses as R
from jaxpaged.server.async_engine import AsyncEngine, EngineDeadError, QueueFullError
from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                      PinRequest, TokenizeRequest)

RETRY_AFTER_S = 1


class ModelNotFound(Exception):
    """The request names a model this server does not serve."""


def build_app(async_engine: AsyncEngine, *, served_model_name: str, chat_template: ChatTemplate | None = None,
              registry: CollectorRegistry | None = None, enable_debug_endpoints: bool = False) -> FastAPI:
    """The app over a started-or-not `AsyncEngine`; the loop starts and stops with the app's lifespan."""
    engine = async_engine.engine
    chat_template = chat_template or ChatTemplate()
    registry = registry or CollectorRegistry()
    http_requests = Counter("jaxpaged:http_requests", "HTTP requests by method, path and status.",
                            ["method", "path", "status"], registry=registry)
    http_latency = Histogram("jaxpaged:http_request_duration_seconds", "Time to the response's start, by path.",
                             ["path"], registry=registry)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not async_engine.is_running and async_engine.error is None:
            async_engine.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, async_engine.shutdown)

    app = FastAPI(title="jaxpaged", lifespan=lifespan)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = route.path if route is not None else "unmatched"
        http_requests.labels(request.method, path, str(response.status_code)).inc()
        http_latency.labels(path).observe(time.perf_counter() - start)
        return response

    # ---- errors ---------------------------------------------------------------------------

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request", "type": ""}
        if err.get("type") == "json_invalid":
            return _error(400, f"malformed JSON body: {err['msg']}", "BadRequestError")
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        message = f"{param}: {err['msg']}" if param else err["msg"]
        return _error(400, message, "BadRequestError", param)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return _error(400, str(exc), "BadRequestError", _field_named(str(exc)))

    @app.exception_handler(TypeError)
    async def bad_type(request: Request, exc: TypeError):
        return _error(400, str(exc), "BadRequestError", _field_named(str(exc)))

    @app.exception_handler(ModelNotFound)
    async def no_model(request: Request, exc: ModelNotFound):
        return _error(404, f"The model `{exc}` does not exist.", "NotFoundError", "model")

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, exc: QueueFullError):
        return _error(503, str(exc), "ServiceUnavailableError", headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request: Request, exc: EngineDeadError):
        return _error(503, str(exc), "ServiceUnavailableError")

    def check_model(name: str | None) -> None:
        if name is not None and name != served_model_name:
            raise ModelNotFound(name)

    # ---- service endpoints ----------------------------------------------------------------

    @app.get("/health")
    async def health():
        if async_engine.is_running:
            return PlainTextResponse("")
        return _error(503, "the engine loop is not running", "ServiceUnavailableError")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": 0,
                                            "owned_by": "jaxpaged", "max_model_len": engine.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def prompt_or_messages(body, what: str):
        """The body's `prompt`, or its `messages` rendered by the chat template (exactly one must be set)."""
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ValueError(f"{what} needs exactly one of 'prompt' and 'messages'")
        return body.prompt if body.prompt is not None else chat_template.render(
            [{"role": m.role, "content": m.text()} for m in body.messages],
            add_generation_prompt=body.add_generation_prompt)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        text = prompt_or_messages(body, "tokenize")
        tokens = engine.tokenizer.encode(text)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        check_model(body.model)
        vocab = engine.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"tokens: id {bad[0]} is outside the vocabulary [0, {vocab})")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        if not await async_engine.reset_prefix_cache():
            return _error(409, "some cached blocks are in use; nothing was reset", "ConflictError")
        return PlainTextResponse("")

    @app.post("/v1/cache/pin")
    async def pin_prefix(body: PinRequest):
        prompt = prompt_or_messages(body, "pin")
        cached = await async_engine.pin_prefix(prompt, body.ttl_s, cache_salt=body.cache_salt)
        return {"cached_blocks": cached, "ttl_s": body.ttl_s}

    async def pin_prompts(body, prompts) -> None:
        """The request's `pin_ttl_s`: pin each prompt's blocks before it is queued."""
        if body.pin_ttl_s is not None:
            for prompt in prompts:
                await async_engine.pin_prefix(prompt, body.pin_ttl_s, cache_salt=body.cache_salt)

    if enable_debug_endpoints:
        @app.post("/debug/crash_engine_loop")
        async def crash():
            """For tests: make the engine loop die, as an unexpected engine error would."""
            async_engine.crash_for_test()
            return PlainTextResponse("")

    # ---- completions ----------------------------------------------------------------------

    async def submit(base_id: str, prompts, params, cache_salt) -> list[AsyncIterator[RequestOutput]]:
        streams = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await async_engine.add_request(f"{base_id}-{i}", prompt, params,
                                                              cache_salt=cache_salt))
        except BaseException:
            for s in streams:
                await s.aclose()  # aborts the ones already queued
            raise
        return streams

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        check_model(body.model)
        if body.echo:
            raise ValueError("echo is not supported")
        params = body.sampling_params(default_max_tokens=16, logprobs=body.logprobs)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        await pin_prompts(body, body.prompts())
        streams = await submit(request_id, body.prompts(), params, body.cache_salt)
        created = int(time.time())
        head = {"id": request_id, "object": "text_completion", "created": created, "model": served_model_name}
        tokenizer = engine.tokenizer
        if body.stream:
            offsets: dict[int, int] = {}

            def choice(i: int, c) -> dict:
                index = i * params.n + c.index
                offset = offsets.get(index, 0)
                offsets[index] = offset + len(c.text)
                return {"index": index, "text": c.text, "logprobs": R.completion_logprobs(c, tokenizer, offset),
                        "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
            return _sse_response(streams, head, choice, include_usage=body.include_usage)
        finals = await _finals(streams)
        choices = [{"index": i * params.n + c.index, "text": c.text,
                    "logprobs": R.completion_logprobs(c, tokenizer, 0),
                    "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
                   for i, out in enumerate(finals) for c in out.outputs]
        return head | {"choices": choices, "usage": R.usage(*R.totals(finals))}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        check_model(body.model)
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        top_k = body.logprobs_k()
        prompt = chat_template.render([{"role": m.role, "content": m.text()} for m in body.messages],
                                      add_generation_prompt=body.add_generation_prompt)
        default_max = max(engine.max_model_len - len(engine.tokenizer.encode(prompt)), 1)
        params = body.sampling_params(default_max_tokens=default_max, logprobs=top_k)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        await pin_prompts(body, [prompt])
        streams = await submit(request_id, [prompt], params, body.cache_salt)
        created = int(time.time())
        tokenizer = engine.tokenizer
        if body.stream:
            head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                    "model": served_model_name}

            started: set[int] = set()

            def choice(i: int, c) -> dict:
                delta = {"content": c.text}
                if c.index not in started:
                    started.add(c.index)
                    delta = {"role": "assistant"} | delta
                return {"index": c.index, "delta": delta, "logprobs": R.chat_logprobs(c, tokenizer, top_k or 0),
                        "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
            return _sse_response(streams, head, choice, include_usage=body.include_usage)
        finals = await _finals(streams)
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": R.chat_logprobs(c, tokenizer, top_k or 0),
                    "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
                   for out in finals for c in out.outputs]
        return {"id": request_id, "object": "chat.completion", "created": created, "model": served_model_name,
                "choices": choices, "usage": R.usage(*R.totals(finals))}

    return app


def _sse_response(streams: list[AsyncIterator[RequestOutput]], head: dict, choice, *,
                  include_usage: bool) -> StreamingResponse:
    """Stream every output as SSE chunks: one per completion that moved (`choice(prompt index, completion)`),
    a usage chunk when asked, then `[DONE]`."""
    async def events():
        counts = _Counts()
        async for i, out in _merge(streams):
            for c in out.outputs:
                yield R.sse(head | {"choices": [choice(i, c)], "usage": None})
            _count(out, counts)
        if include_usage:
            yield R.sse(head | {"choices": [], "usage": R.usage(*counts.totals())})
        yield R.sse("[DONE]")
    return StreamingResponse(events(), media_type="text/event-stream")


class _Counts:
    """Token counts of a streamed request, for its usage chunk."""

    def __init__(self):
        self.prompt, self.completion, self.cached = {}, 0, {}

    def totals(self) -> tuple[int, int, int]:
        return sum(self.prompt.values()), self.completion, sum(self.cached.values())


def _count(out: RequestOutput, counts: _Counts) -> None:
    counts.prompt[out.request_id] = len(out.prompt_token_ids)
    counts.completion += sum(len(c.token_ids) for c in out.outputs)
    counts.cached[out.request_id] = out.num_cached_tokens


async def _finals(streams: list[AsyncIterator[RequestOutput]]) -> list[RequestOutput]:
    """Each stream's final output (non-streaming requests ask for FINAL_ONLY)."""
    async def last(stream):
        out = None
        async for out in stream:
            pass
        return out
    tasks = [asyncio.ensure_future(last(s)) for s in streams]
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # a cancelled handler (client gone) aborts every request it queued
        await _cancel(tasks, streams)


async def _merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from every stream as they arrive; closing it aborts unfinished requests."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i, stream):
        try:
            async for out in stream:
                await queue.put((i, out))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, err))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(streams)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        await _cancel(tasks, streams)


async def _cancel(tasks: list[asyncio.Future], streams: list[AsyncIterator[RequestOutput]]) -> None:
    """Cancel the tasks reading the streams, wait for them, and close the streams (aborting unfinished requests)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in streams:
        await s.aclose()


def _field_named(message: str) -> str | None:
    """The request field an engine error message starts with ("top_p must be ..."), if any."""
    first = message.split(" ", 1)[0].rstrip(":")
    fields = (set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
              | set(PinRequest.model_fields) | {"prompt"})
    return first if first in fields else None


def _error(status: int, message: str, kind: str, param: str | None = None, headers: dict | None = None):
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)
