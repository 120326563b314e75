"""Llama-family decoder in Flax NNX, running over a functional paged KV pool."""

from jaxpaged.model.llama import LlamaModel, init_model

__all__ = ["LlamaModel", "init_model"]
