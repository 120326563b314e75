"""The decoder of every supported family (Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 3) in Flax NNX, over a functional paged KV pool."""

from jaxpaged.model.decoder import DecoderModel, init_model

__all__ = ["DecoderModel", "init_model"]
