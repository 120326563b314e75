"""jaxpaged: PagedAttention and automatic prefix caching in JAX/Pallas, with functional KV state.

`from jaxpaged import LLM, SamplingParams` is the offline API; `jaxpaged.engine.Engine`
the step-level one. Importing the package stays light (no JAX) until those are used.
"""

from jaxpaged import host_allocator
from jaxpaged.config import ModelConfig, load_config
from jaxpaged.sampling_params import SamplingParams

host_allocator.configure()  # before any JAX backend starts its threads (host_allocator's docstring)

__all__ = ["LLM", "Engine", "ModelConfig", "SamplingParams", "load_config"]


def __getattr__(name):
    if name == "LLM":
        from jaxpaged.llm import LLM
        return LLM
    if name == "Engine":
        from jaxpaged.engine import Engine
        return Engine
    raise AttributeError(f"module 'jaxpaged' has no attribute {name!r}")
