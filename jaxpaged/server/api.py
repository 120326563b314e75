"""The FastAPI app: OpenAI-compatible completions and chat, models, health, metrics, tokenizer, cache reset.

Every client's request goes into the one `EngineClient` (engine_client.py). Errors follow the
OpenAI shape, `{"error": {"message", "type", "param", "code"}}`: 400 for bad
input (the engine's ValueErrors, malformed JSON, wrong types), 404 for an
unknown model, 413 for a body over `max_request_body_bytes`, 503 with
`Retry-After` when the waiting queue is full or the engine loop is gone.

No client can stop the engine, or keep it busy after leaving: a client that
disconnects (streaming or not) has every request it queued aborted, which
frees its blocks, and so does a multi-prompt request refused at a later
prompt. A stream whose engine died ends with an error event (an OpenAI error
object in a `data:` line) and no `[DONE]`; a non-streaming request gets 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import AsyncIterator, Awaitable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxpaged.outputs import RequestOutput
from jaxpaged.server import responses as R
from jaxpaged.server.async_engine import EngineDeadError, QueueFullError, refuse_overlong
from jaxpaged.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES, BodyLimit
from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.engine_client import EngineClient
from jaxpaged.server.http_metrics import CountRequests
from jaxpaged.server.errors import error_body, error_response as _error, status_of
from jaxpaged.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                      PinRequest, TokenizeRequest)

RETRY_AFTER_S = 1


class ModelNotFound(Exception):
    """The request names a model this server does not serve."""


def build_app(async_engine: EngineClient, *, served_model_name: str, chat_template: ChatTemplate | None = None,
              registry: CollectorRegistry | None = None, enable_debug_endpoints: bool = False,
              max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES) -> FastAPI:
    """The app over a started-or-not `EngineClient` (`AsyncEngine`, `CoreClient`, `ReplicaPool`); it starts and
    stops with the app's lifespan.

    `max_request_body_bytes` refuses larger bodies with a 413 before they are parsed (None: no limit).
    """
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

    app.add_middleware(CountRequests, requests=http_requests, latency=http_latency)
    app.add_middleware(BodyLimit, max_bytes=max_request_body_bytes)  # outermost: before anything reads the body

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

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI's own refusals (a body that is not UTF-8, an unknown path, a wrong method), OpenAI-shaped
        kind = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        return _error(exc.status_code, str(exc.detail), kind, headers=getattr(exc, "headers", None))

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
        text = generate_latest(registry)
        engine_metrics = getattr(async_engine, "engine_metrics", None)  # replicas: each one's, labelled
        if engine_metrics is not None:
            text += (await engine_metrics()).encode()
        return PlainTextResponse(text, media_type=CONTENT_TYPE_LATEST)

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
        tokens = await asyncio.to_thread(engine.tokenizer.encode, text)  # off the event loop: prompts can be huge
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

        @app.post("/debug/stall_engine_loop")
        async def stall(request: Request):
            """For tests: make the engine loop sleep between two steps, as a long compile would."""
            body = await request.json()
            seconds = body.get("seconds") if isinstance(body, dict) else None
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds <= 60:
                raise ValueError(f"seconds must be a number in [0, 60], got {seconds!r}")
            await async_engine.stall_for_test(float(seconds))
            return PlainTextResponse("")

    # ---- completions ----------------------------------------------------------------------

    async def submit(base_id: str, prompts, params, cache_salt) -> list:
        """Queue every prompt; if one is refused (or the client leaves), abort those already queued."""
        streams = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await async_engine.add_request(f"{base_id}-{i}", prompt, params,
                                                              cache_salt=cache_salt))
        except BaseException:
            _close(streams)
            raise
        return streams

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        return await _unless_disconnected(raw, complete(body))

    async def complete(body: CompletionRequest):
        check_model(body.model)
        params = body.completion_params(default_max_tokens=16)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        await pin_prompts(body, body.prompts())
        streams = await submit(request_id, body.prompts(), params, body.cache_salt)
        created = int(time.time())
        head = {"id": request_id, "object": "text_completion", "created": created, "model": served_model_name}
        tokenizer = engine.tokenizer
        if body.stream:
            offsets: dict[int, int] = {}

            def choice(i: int, c, out: RequestOutput) -> dict:
                index = i * params.n + c.index
                first = index not in offsets
                offset = offsets.get(index, 0)
                if body.echo and first:
                    prompt = _prompt_text(out, tokenizer)
                    text = prompt + ("" if body.echo_only else c.text)
                    logprobs = R.echo_logprobs(out.prompt_token_ids, out.prompt_logprobs,
                                               None if body.echo_only else c, tokenizer, len(prompt))
                elif body.echo_only:
                    text, logprobs = "", None if body.logprobs is None else R.echo_logprobs([], [], None, tokenizer, 0)
                else:
                    text, logprobs = c.text, R.completion_logprobs(c, tokenizer, offset)
                offsets[index] = offset + len(text)
                return {"index": index, "text": text, "logprobs": logprobs,
                        "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
            return _sse_response(streams, head, choice, include_usage=body.include_usage)
        finals = await _finals(streams)
        choices = [{"index": i * params.n + c.index, **_completion_choice(body, out, c, tokenizer),
                    "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
                   | _prompt_logprobs_field(body, out, tokenizer)
                   for i, out in enumerate(finals) for c in out.outputs]
        prompt_tokens, completion_tokens, cached = R.totals(finals)
        return head | {"choices": choices, "usage": R.usage(prompt_tokens, 0 if body.echo_only else completion_tokens,
                                                            cached)}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        return await _unless_disconnected(raw, chat(body))

    async def chat(body: ChatCompletionRequest):
        check_model(body.model)
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        top_k = body.logprobs_k()
        prompt = chat_template.render([{"role": m.role, "content": m.text()} for m in body.messages],
                                      add_generation_prompt=body.add_generation_prompt)
        refuse_overlong(prompt, engine.tokenizer, engine.max_model_len)  # before tokenizing it
        # The template writes its own special tokens (BOS): adding the tokenizer's would double them.
        prompt_ids = await asyncio.to_thread(engine.tokenizer.encode, prompt, add_special_tokens=False)
        default_max = max(engine.max_model_len - len(prompt_ids), 1)
        params = body.sampling_params(default_max_tokens=default_max, logprobs=top_k)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        await pin_prompts(body, [prompt_ids])
        streams = await submit(request_id, [prompt_ids], params, body.cache_salt)
        created = int(time.time())
        tokenizer = engine.tokenizer
        if body.stream:
            head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                    "model": served_model_name}

            started: set[int] = set()

            def choice(i: int, c, out: RequestOutput) -> dict:
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
                   | _prompt_logprobs_field(body, out, tokenizer)
                   for out in finals for c in out.outputs]
        return {"id": request_id, "object": "chat.completion", "created": created, "model": served_model_name,
                "choices": choices, "usage": R.usage(*R.totals(finals))}

    return app


def _sse_response(streams: list, head: dict, choice, *, include_usage: bool) -> StreamingResponse:
    """Stream every output as SSE chunks: one per completion that moved (`choice(prompt index, completion, output)`),
    a usage chunk when asked, then `[DONE]`; if the engine fails meanwhile, an error event and no `[DONE]`."""
    async def events():
        counts = _Counts()
        template = R.ChunkTemplate(head)
        try:
            async for i, out in _merge(streams):
                for c in out.outputs:
                    yield template.chunk(choice(i, c, out))
                _count(out, counts)
        except Exception as err:  # noqa: BLE001 - the client must tell a failure from a finished answer
            status, kind = status_of(err)
            yield R.sse(error_body(status, str(err), kind))
            return
        if include_usage:
            yield R.sse(head | {"choices": [], "usage": R.usage(*counts.totals())})
        yield R.sse("[DONE]")
    return _StreamsResponse(events(), streams)


class _StreamsResponse(StreamingResponse):
    """An SSE response that closes its request streams however it ends.

    Starlette cancels the sending task when the client disconnects; the
    generator may then be suspended at a `yield` (or never started), so its
    own `finally` would run only when it is garbage-collected. Closing here,
    synchronously, aborts every unfinished request at once.
    """

    def __init__(self, content, streams: list) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            _close(self._streams)


async def _unless_disconnected(request: Request, work: Awaitable):
    """Await a handler's `work`, cancelling it if the client disconnects first (its requests are then aborted).

    A disconnected client gets nothing (499 in the server's own log), as in vLLM.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler itself is cancelled (shutdown)
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.cancelled() and task.done():
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # let it finish unwinding (it aborts what it queued)
    return Response(status_code=499)


async def _disconnected(request: Request) -> None:
    """Return once the ASGI server says the client has gone (the body has already been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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


async def _finals(streams: list) -> list[RequestOutput]:
    """Each stream's final output (non-streaming requests ask for FINAL_ONLY); a cancelled or failed
    wait aborts every request still running."""
    try:
        finals = []
        for stream in streams:
            out = None
            async for out in stream:
                pass
            finals.append(out)
        return finals
    finally:
        _close(streams)


async def _merge(streams: list) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from every stream as they arrive; closing it aborts unfinished requests."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            _close(streams)
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i, stream):
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as err:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, err))
        finally:
            queue.put_nowait((i, done))

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
        _close(streams)
        for task in tasks:
            task.cancel()


def _close(streams: list) -> None:
    """Close request streams (synchronous, so it also runs under cancellation): unfinished requests are aborted."""
    for stream in streams:
        stream.close()


def _prompt_text(out: RequestOutput, tokenizer) -> str:
    return out.prompt if out.prompt is not None else tokenizer.decode(out.prompt_token_ids)


def _completion_choice(body: CompletionRequest, out: RequestOutput, c, tokenizer) -> dict:
    """A final choice's `text` and `logprobs`; with `echo`, the prompt first (alone with `max_tokens=0`)."""
    if not body.echo:
        return {"text": c.text, "logprobs": R.completion_logprobs(c, tokenizer, 0)}
    prompt = _prompt_text(out, tokenizer)
    generated = None if body.echo_only else c
    return {"text": prompt + (generated.text if generated else ""),
            "logprobs": R.echo_logprobs(out.prompt_token_ids, out.prompt_logprobs, generated, tokenizer,
                                        len(prompt))}


def _prompt_logprobs_field(body, out: RequestOutput, tokenizer) -> dict:
    """vLLM's per-choice `prompt_logprobs`, when the request asked for them by that name."""
    if body.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": R.vllm_prompt_logprobs(out, tokenizer)}


def _field_named(message: str) -> str | None:
    """The request field an engine error message starts with ("top_p must be ..."), if any."""
    first = message.split(" ", 1)[0].rstrip(":")
    fields = (set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
              | set(PinRequest.model_fields) | {"prompt"})
    return first if first in fields else None
