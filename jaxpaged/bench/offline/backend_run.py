"""What one backend's measured pass returns (`BackendRun`) and the engine knobs jaxpaged runs with (`EngineLimits`).

Shared by `throughput.py` and the peer it runs in a subprocess (`vllm_backend.py`), so that the peer never imports
the benchmark that drives it.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.engine.config import EngineConfig


@dataclasses.dataclass(frozen=True)
class BackendRun:
    """One backend's measured pass over the prompts and what preceded it.

    Attributes:
      backend: "jaxpaged" or "hf".
      token_ids: generated ids per prompt, in prompt order.
      elapsed_s: wall time of the measured pass.
      warmup_s: the pass before the first measured one (jaxpaged: the first, compiling call;
        hf: the warm-up generate).
      load_s: loading the weights (and building the engine).
      num_compiles: step shapes compiled during the measured pass (jaxpaged; 0 for hf).
      prompt_tokens_computed: prompt tokens the pass ran through the model (jaxpaged: prefix-cache
        hits excluded); None: all of them.
    """

    backend: str
    token_ids: list[list[int]]
    elapsed_s: float
    warmup_s: float
    load_s: float
    num_compiles: int = 0
    prompt_tokens_computed: int | None = None


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """The jaxpaged engine's knobs; `num_blocks=None` sizes the pool to hold every prompt at once."""

    block_size: int = EngineConfig.block_size
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
