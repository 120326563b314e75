"""jaxpaged: PagedAttention and automatic prefix caching in JAX/Pallas, with functional KV state.

`from jaxpaged import LLM, SamplingParams` is the offline API; `jaxpaged.engine.Engine`
the step-level one. Importing the package stays light (no JAX) until those are used.
"""

from jaxpaged.config import ModelConfig, load_config
from jaxpaged.sampling_params import SamplingParams

__all__ = ["LLM", "Engine", "ModelConfig", "SamplingParams", "load_config"]


def __getattr__(name):
    if name == "LLM":
        from jaxpaged.llm import LLM
        return LLM
    if name == "Engine":
        from jaxpaged.engine import Engine
        return Engine
    raise AttributeError(f"module 'jaxpaged' has no attribute {name!r}")
