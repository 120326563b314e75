"""``POST /v1/chat/completions``: OpenAI chat completions over the model's chat template, streamed or not."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request

from jaxpaged.outputs import RequestOutput
from jaxpaged.server import responses as R
from jaxpaged.server.request_stream import refuse_overlong
from jaxpaged.server.protocol import ChatCompletionRequest
from jaxpaged.server.routes.completions import prompt_logprobs_field
from jaxpaged.server.routes.state import ServerState
from jaxpaged.server.streams import final_outputs, sse_response, unless_disconnected


def router(state: ServerState) -> APIRouter:
    """The chat route over `state`."""
    routes = APIRouter()

    @routes.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        return await unless_disconnected(raw, chat(body, raw, state.cache_salt(raw, body.cache_salt)))

    async def chat(body: ChatCompletionRequest, raw: Request, cache_salt: str | None):
        state.check_model(body.model)
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        state.check_request(body, [])  # the one prompt is the rendered messages, checked by length below
        top_k = body.logprobs_k()
        info = state.client.model_info
        prompt = state.render_chat(body)
        refuse_overlong(prompt, info.tokenizer, info.max_model_len)  # before tokenizing it
        # The template writes its own special tokens (BOS): adding the tokenizer's would double them.
        prompt_ids = await asyncio.to_thread(info.tokenizer.encode, prompt, add_special_tokens=False)
        default_max = max(info.max_model_len - len(prompt_ids), 1)
        params = body.sampling_params(default_max_tokens=default_max, logprobs=top_k)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        await state.pin_prompts(raw, body, [prompt_ids], cache_salt)
        streams = await state.submit(raw, request_id, [prompt_ids], params, cache_salt, body.priority)
        created = int(time.time())
        tokenizer = info.tokenizer
        if body.stream:
            head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                    "model": state.served_model_name}

            started: set[int] = set()

            def choice(i: int, c, out: RequestOutput) -> dict:
                delta = {"content": c.text}
                if c.index not in started:
                    started.add(c.index)
                    delta = {"role": "assistant"} | delta
                return {"index": c.index, "delta": delta, "logprobs": R.chat_logprobs(c, tokenizer, top_k or 0),
                        "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
            return sse_response(streams, head, choice, include_usage=body.include_usage)
        finals = await final_outputs(streams)
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": R.chat_logprobs(c, tokenizer, top_k or 0),
                    "finish_reason": R.finish_reason(c), "stop_reason": c.stop_reason}
                   | prompt_logprobs_field(body, out, tokenizer)
                   for out in finals for c in out.outputs]
        return {"id": request_id, "object": "chat.completion", "created": created, "model": state.served_model_name,
                "choices": choices, "usage": R.usage(*R.totals(finals))}

    return routes
