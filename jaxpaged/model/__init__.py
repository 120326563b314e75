"""Llama-family decoder in Flax NNX, running over a functional paged KV pool."""

from jaxpaged.model.decoder import DecoderModel, init_model

__all__ = ["DecoderModel", "init_model"]
