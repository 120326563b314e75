"""jaxpaged: PagedAttention and automatic prefix caching in JAX/Pallas, with functional KV state."""

from jaxpaged.config import ModelConfig, load_config

__all__ = ["ModelConfig", "load_config"]
