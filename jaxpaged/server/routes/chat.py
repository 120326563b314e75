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
from jaxpaged.server.tools import ToolCall, ToolPlan, parse_output, plan_tools, streamable_content


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
        plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls,
                          template_source=state.chat_template.source,
                          structured_outputs_requested=body.structured_outputs_params() is not None)
        prompt = state.render_chat(body, tools=list(plan.tools) if plan else None)
        refuse_overlong(prompt, info.tokenizer, info.max_model_len)  # before tokenizing it
        # The template writes its own special tokens (BOS): adding the tokenizer's would double them.
        prompt_ids = await asyncio.to_thread(info.tokenizer.encode, prompt, add_special_tokens=False)
        default_max = max(info.max_model_len - len(prompt_ids), 1)
        params = body.sampling_params(default_max_tokens=default_max, logprobs=top_k,
                                      constraint=plan.constraint if plan else None)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        await state.pin_prompts(raw, body, [prompt_ids], cache_salt)
        streams = await state.submit(raw, request_id, [prompt_ids], params, cache_salt, body.priority)
        created = int(time.time())
        tokenizer = info.tokenizer
        if body.stream:
            head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                    "model": state.served_model_name}

            started: set[int] = set()
            tool_deltas = _ToolDeltas(plan)

            def choice(i: int, c, out: RequestOutput) -> dict | None:
                delta = tool_deltas.delta(c) if plan is not None and plan.mode != "none" else {"content": c.text}
                if delta is None:
                    return None
                if c.index not in started:
                    started.add(c.index)
                    delta = {"role": "assistant"} | delta
                return {"index": c.index, "delta": delta, "logprobs": R.chat_logprobs(c, tokenizer, top_k or 0),
                        "finish_reason": tool_deltas.finish_reason(c), "stop_reason": c.stop_reason}
            return sse_response(streams, head, choice, include_usage=body.include_usage)
        finals = await final_outputs(streams)
        choices = [{"index": c.index, "logprobs": R.chat_logprobs(c, tokenizer, top_k or 0)}
                   | _message_and_finish(plan, c) | {"stop_reason": c.stop_reason}
                   | prompt_logprobs_field(body, out, tokenizer)
                   for out in finals for c in out.outputs]
        return {"id": request_id, "object": "chat.completion", "created": created, "model": state.served_model_name,
                "choices": choices, "usage": R.usage(*R.totals(finals))} | state.kv_transfer_fields()

    return routes


def _content_end(plan: ToolPlan, text: str) -> int:
    """Where the content before an `auto` output's first call ends (the whole text when it has no marker)."""
    return streamable_content(plan.parser, text) if plan.mode == "auto" else 0


def _message_and_finish(plan: ToolPlan | None, c) -> dict:
    """A finished choice's `message` (content and tool calls) and `finish_reason`."""
    if plan is None:
        return {"message": {"role": "assistant", "content": c.text}, "finish_reason": R.finish_reason(c)}
    content, calls = parse_output(plan, c.text)
    message = {"role": "assistant", "content": content, "tool_calls": [call.to_dict() for call in calls]}
    return {"message": message, "finish_reason": _tool_finish_reason(plan, c, calls)}


def _tool_finish_reason(plan: ToolPlan | None, c, calls) -> str | None:
    """"tool_calls" when `auto` or `required` produced calls (vLLM's rule; a named call keeps "stop")."""
    reason = R.finish_reason(c)
    if reason == "stop" and calls and plan is not None and plan.mode in ("auto", "required"):
        return "tool_calls"
    return reason


class _ToolDeltas:
    """Streamed tool calls in the OpenAI delta shape.

    A named function streams its arguments as they are generated (the first
    delta carries the call's id and name). `auto` streams the content that
    surely precedes any call (`streamable_content`) and, when the choice
    finishes, parses the whole text and sends the rest of the content and
    the calls; `required` sends its calls when the choice finishes.
    """

    def __init__(self, plan: ToolPlan | None):
        self.plan = plan
        self._texts: dict[int, str] = {}
        self._sent: dict[int, int] = {}  # characters of each choice's text already sent as content
        self._ids: dict[int, str] = {}
        self._calls: dict[int, list[ToolCall]] = {}

    def delta(self, c) -> dict | None:
        """The delta to send for this output delta, or None to hold it back."""
        plan = self.plan
        if plan.mode == "named":
            entry = {"index": 0, "function": {"arguments": c.text}}
            if c.index not in self._ids:
                self._ids[c.index] = ToolCall(plan.named, "").id
                entry = {"index": 0, "id": self._ids[c.index], "type": "function",
                         "function": {"name": plan.named, "arguments": c.text}}
            return {"tool_calls": [entry]}
        text = self._texts[c.index] = self._texts.get(c.index, "") + c.text
        sent = self._sent.get(c.index, 0)
        if c.finish_reason is None:
            ready = streamable_content(plan.parser, text) if plan.mode == "auto" else 0
            if ready <= sent:
                return None
            self._sent[c.index] = ready
            return {"content": text[sent:ready]}
        content, calls = parse_output(plan, text)
        self._calls[c.index] = calls
        # content is the text before the first call; what was streamed of it is not sent again
        rest = text[sent:] if not calls else text[sent:max(sent, _content_end(plan, text))]
        delta: dict = {"content": rest.rstrip() if calls else rest} if rest.strip() or not calls else {}
        if calls:
            delta["tool_calls"] = [{"index": k} | call.to_dict() for k, call in enumerate(calls)]
        return delta or {"content": ""}

    def finish_reason(self, c) -> str | None:
        """The choice's finish reason ("tool_calls" when auto or required produced calls)."""
        return _tool_finish_reason(self.plan, c, self._calls.get(c.index))
