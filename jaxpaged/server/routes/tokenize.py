"""``POST /tokenize`` (a prompt or chat messages to token ids) and ``POST /detokenize`` (ids to text)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from jaxpaged.server.protocol import DetokenizeRequest, TokenizeRequest
from jaxpaged.server.routes.state import ServerState


def router(state: ServerState) -> APIRouter:
    """The tokenizer routes over `state`."""
    routes = APIRouter()
    info = state.client.model_info

    @routes.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        text = state.prompt_or_messages(body, "tokenize")
        tokens = await asyncio.to_thread(info.tokenizer.encode, text)  # off the event loop: prompts can be huge
        return {"tokens": tokens, "count": len(tokens), "max_model_len": info.max_model_len}

    @routes.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        state.check_model(body.model)
        vocab = info.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"tokens: id {bad[0]} is outside the vocabulary [0, {vocab})")
        return {"prompt": info.tokenizer.decode(body.tokens)}

    return routes
