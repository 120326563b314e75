"""OpenAI response bodies built from the engine's `RequestOutput`s."""

from __future__ import annotations

import json
import math

import msgspec

from jaxpaged.outputs import CompletionOutput, RequestOutput


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """The `usage` object, with vLLM's `prompt_tokens_details.cached_tokens`."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def finish_reason(c: CompletionOutput) -> str | None:
    """OpenAI's finish reasons: stop, length; an aborted sequence reports "abort" as vLLM does."""
    return c.finish_reason


def completion_logprobs(c: CompletionOutput, tokenizer, text_offset: int) -> dict | None:
    """The legacy completions `logprobs` object for this output's tokens."""
    if c.logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = text_offset
    for token, entry in zip(c.token_ids, c.logprobs):
        piece = tokenizer.decode([token])
        tokens.append(piece)
        token_logprobs.append(_finite(entry[token]))
        top.append({tokenizer.decode([t]): _finite(lp) for t, lp in entry.items()})
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(c: CompletionOutput, tokenizer, top_k: int) -> dict | None:
    """The chat `logprobs` object: `content` with each token, its logprob and its top alternatives."""
    if c.logprobs is None:
        return None
    content = []
    for token, entry in zip(c.token_ids, c.logprobs):
        top = sorted(entry.items(), key=lambda kv: -kv[1])[:top_k]
        content.append({**_token_logprob(tokenizer, token, entry[token]),
                        "top_logprobs": [_token_logprob(tokenizer, t, lp) for t, lp in top]})
    return {"content": content}


def _token_logprob(tokenizer, token: int, logprob: float) -> dict:
    piece = tokenizer.decode([token])
    return {"token": piece, "logprob": _finite(logprob), "bytes": list(piece.encode())}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf; OpenAI clients expect a number


def sse(payload: dict | str) -> str:
    """One server-sent event line: `data: {json}` (or `data: [DONE]`)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


_encode_json = msgspec.json.Encoder().encode


class ChunkTemplate:
    """A stream's SSE chunks as bytes, its fixed fields encoded once: each chunk only encodes its choice.

    `chunk(choice)` is the JSON object `sse(head | {"choices": [choice], "usage": None})` writes, keys in
    the same order (UTF-8 where `json.dumps` escapes non-ASCII).
    """

    __slots__ = ("_prefix",)

    def __init__(self, head: dict) -> None:
        self._prefix = b"data: " + _encode_json(head)[:-1] + (b',"choices":[' if head else b'{"choices":[')

    def chunk(self, choice: dict) -> bytes:
        """The chunk carrying one choice (and `"usage": null`)."""
        return self._prefix + _encode_json(choice) + b'],"usage":null}\n\n'


def totals(outputs: list[RequestOutput]) -> tuple[int, int, int]:
    """(prompt tokens, completion tokens, cached prompt tokens) over final outputs."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outputs)
    return prompt, completion, cached


def echo_logprobs(prompt_ids: list[int], entries: list | None, c: CompletionOutput | None, tokenizer,
                  text_offset: int) -> dict | None:
    """The legacy `logprobs` object of an `echo` response: the prompt's tokens (first entry `null`),
    then those of `c` (None: prompt only), whose text starts at `text_offset`."""
    if entries is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = 0
    for token, entry in zip(prompt_ids, entries):
        piece = tokenizer.decode([token])
        tokens.append(piece)
        offsets.append(offset)
        offset += len(piece)
        token_logprobs.append(None if entry is None else _finite(entry[token]))
        top.append(None if entry is None else {tokenizer.decode([t]): _finite(lp) for t, lp in entry.items()})
    generated = completion_logprobs(c, tokenizer, text_offset) if c is not None else None
    if generated is not None:
        tokens += generated["tokens"]
        token_logprobs += generated["token_logprobs"]
        top += generated["top_logprobs"]
        offsets += generated["text_offset"]
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def vllm_prompt_logprobs(out: RequestOutput, tokenizer) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs` of a choice: per prompt token, {token id: {logprob, decoded_token}}, first None.

    (vLLM adds each id's `rank`; only the top-k's ranks are known here, so none is given.)
    """
    if out.prompt_logprobs is None:
        return None
    return [None if entry is None else
            {str(t): {"logprob": _finite(lp), "decoded_token": tokenizer.decode([t])} for t, lp in entry.items()}
            for entry in out.prompt_logprobs]
