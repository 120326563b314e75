"""The disaggregation proxy: one OpenAI endpoint over prefill engines and decode engines.

    client ──► proxy ──► prefill engine (jaxpaged serve --kv_role=prefill): the request with max_tokens=1
                   │         its prompt's blocks go to the prefill engine's outbox
                   └───► decode engine (--kv_role=decode --kv_peers=...): the request as sent, streamed back;
                             it pulls the prompt blocks it does not cache from the prefill engines first

Both hops are plain HTTP to ordinary `jaxpaged serve` processes, so
validation, tenants and errors are theirs: a 4xx from the prefill engine is
the client's answer (nothing reaches a decode engine); a prefill engine that
fails (5xx, unreachable) only costs the decode engine the prompt's compute.
Each prompt goes to the prefill and the decode engine its text hashes to
(the first ``PREFIX_CHARS`` characters), so prompts sharing a prefix meet
their cached blocks on both sides.
"""

from __future__ import annotations

import hashlib
import json
import logging

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

log = logging.getLogger(__name__)

PREFIX_CHARS = 256  # the part of a prompt that chooses its engines (prefix-aware on both sides)
FORWARDED_HEADERS = ("authorization", "content-type")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


def prefill_body(body: dict) -> dict:
    """The request a prefill engine runs: the same prompt and sampling, one token, not streamed."""
    body = dict(body, max_tokens=1, stream=False, n=1)
    body.pop("stream_options", None)
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return body


def decode_body(body: dict, prefill_answer: bytes | None) -> dict:
    """The request a decode engine runs: as sent, with the prefill engine's ``kv_transfer_params`` (where its
    blocks are: the decode engine pulls from that engine alone) when its answer named them."""
    try:
        params = json.loads(prefill_answer).get("kv_transfer_params") if prefill_answer else None
    except (ValueError, AttributeError):
        params = None
    return dict(body, kv_transfer_params=params) if isinstance(params, dict) else body


def pick(urls: list[str], body: dict) -> str:
    """The engine a request's prompt prefix hashes to (the same prefix, the same engine)."""
    if len(urls) == 1:
        return urls[0]
    prompt = body.get("prompt", body.get("messages", ""))
    text = json.dumps(prompt, sort_keys=True)[:PREFIX_CHARS]
    return urls[int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") % len(urls)]


def build_proxy_app(prefill_urls: list[str], decode_urls: list[str], *, timeout_s: float = 600.0) -> FastAPI:
    """The proxy's FastAPI app over the given engines' base URLs (``http://host:port``)."""
    if not prefill_urls or not decode_urls:
        raise ValueError("the proxy needs at least one prefill and one decode engine URL")
    app = FastAPI(title="jaxpaged disaggregation proxy")
    client = httpx.AsyncClient(timeout=timeout_s)
    app.state.stats = {"prefill_failures": 0}

    async def relay(raw: Request, path: str) -> Response:
        try:
            body = json.loads(await raw.body())
        except ValueError as err:
            return _error(400, f"the request body is not JSON: {err}")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        headers = {k: v for k, v in raw.headers.items() if k.lower() in FORWARDED_HEADERS}
        prefill_answer = None
        try:
            first = await client.post(pick(prefill_urls, body) + path, json=prefill_body(body), headers=headers)
            if 400 <= first.status_code < 500:
                return Response(first.content, first.status_code, media_type="application/json")
            if first.status_code != 200:
                raise httpx.HTTPStatusError(f"status {first.status_code}", request=first.request, response=first)
            prefill_answer = first.content
        except httpx.HTTPError as err:  # the decode engine computes the prompt itself
            app.state.stats["prefill_failures"] += 1
            log.warning("prefill engine failed (%s); the decode engine computes the prompt", err)
        request = client.build_request("POST", pick(decode_urls, body) + path, json=decode_body(body, prefill_answer),
                                       headers=headers)
        try:
            second = await client.send(request, stream=True)
        except httpx.HTTPError as err:
            return _error(503, f"decode engine unreachable: {err}", "service_unavailable")

        async def chunks():
            try:
                async for chunk in second.aiter_raw():
                    yield chunk
            finally:
                await second.aclose()

        return StreamingResponse(chunks(), status_code=second.status_code,
                                 media_type=second.headers.get("content-type"))

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await relay(raw, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await relay(raw, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models() -> Response:
        answer = await client.get(decode_urls[0] + "/v1/models")
        return Response(answer.content, answer.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        for url in prefill_urls + decode_urls:
            try:
                if (await client.get(url + "/health")).status_code != 200:
                    return _error(503, f"{url} is not healthy", "service_unavailable")
            except httpx.HTTPError:
                return _error(503, f"{url} is unreachable", "service_unavailable")
        return JSONResponse({"status": "ok"})

    @app.on_event("shutdown")
    async def close() -> None:
        await client.aclose()

    return app
