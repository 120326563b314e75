"""``POST /v1/completions``: OpenAI text completions, streamed (SSE) or not, with echo and logprobs."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from jaxpaged.outputs import RequestOutput
from jaxpaged.server import responses as R
from jaxpaged.server.protocol import CompletionRequest
from jaxpaged.server.routes.state import ServerState
from jaxpaged.server.streams import final_outputs, sse_response, unless_disconnected


def router(state: ServerState) -> APIRouter:
    """The completions route over `state`."""
    routes = APIRouter()

    @routes.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        return await unless_disconnected(raw, complete(body, raw, state.cache_salt(raw, body.cache_salt)))

    async def complete(body: CompletionRequest, raw: Request, cache_salt: str | None):
        state.check_model(body.model)
        prompts = body.prompts()
        state.check_request(body, prompts)
        params = body.completion_params(default_max_tokens=16)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        await state.pin_prompts(raw, body, prompts, cache_salt)
        streams = await state.submit(raw, request_id, prompts, params, cache_salt, body.priority)
        created = int(time.time())
        head = {"id": request_id, "object": "text_completion", "created": created, "model": state.served_model_name}
        tokenizer = state.client.model_info.tokenizer
        if body.stream:
            offsets: dict[int, int] = {}

            def choice(i: int, c, out: RequestOutput) -> dict:
                index = i * params.n + c.index
                first = index not in offsets
                offset = offsets.get(index, 0)
                if body.echo and first:
                    prompt = prompt_text(out, tokenizer)
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
            return sse_response(streams, head, choice, include_usage=body.include_usage)
        finals = await final_outputs(streams)
        choices = [{"index": i * params.n + c.index, **_completion_choice(body, out, c, tokenizer),
                    "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
                   | prompt_logprobs_field(body, out, tokenizer)
                   for i, out in enumerate(finals) for c in out.outputs]
        prompt_tokens, completion_tokens, cached = R.totals(finals)
        return head | {"choices": choices, "usage": R.usage(prompt_tokens, 0 if body.echo_only else completion_tokens,
                                                            cached)} | state.kv_transfer_fields()

    return routes


def prompt_text(out: RequestOutput, tokenizer) -> str:
    """The request's prompt as text (decoded from its ids when it came as ids)."""
    return out.prompt if out.prompt is not None else tokenizer.decode(out.prompt_token_ids)


def _completion_choice(body: CompletionRequest, out: RequestOutput, c, tokenizer) -> dict:
    """A final choice's `text` and `logprobs`; with `echo`, the prompt first (alone with `max_tokens=0`)."""
    if not body.echo:
        return {"text": c.text, "logprobs": R.completion_logprobs(c, tokenizer, 0)}
    prompt = prompt_text(out, tokenizer)
    generated = None if body.echo_only else c
    return {"text": prompt + (generated.text if generated else ""),
            "logprobs": R.echo_logprobs(out.prompt_token_ids, out.prompt_logprobs, generated, tokenizer,
                                        len(prompt))}


def prompt_logprobs_field(body, out: RequestOutput, tokenizer) -> dict:
    """vLLM's per-choice `prompt_logprobs`, when the request asked for them by that name."""
    if body.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": R.vllm_prompt_logprobs(out, tokenizer)}
