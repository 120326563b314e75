"""What one backend's measured pass returns (`BackendRun`) and the engine knobs jaxpaged runs with (`EngineLimits`).

Apart from `throughput.py`, so that the peers it drives (`hf_backend.py`, `vllm_backend.py`) never import it.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.engine.config import EngineConfig


@dataclasses.dataclass(frozen=True)
class BackendRun:
    """One backend's measured pass over the prompts, and what preceded it (reported apart)."""

    backend: str  # "jaxpaged", "hf" or "vllm"
    token_ids: list[list[int]]  # generated ids per prompt, in prompt order
    elapsed_s: float  # the measured pass
    warmup_s: float  # the call before the first measured one (jaxpaged's compiles every step shape)
    load_s: float  # loading the weights and building the engine
    num_compiles: int = 0  # step shapes jaxpaged compiled during the measured pass
    prompt_tokens_computed: int | None = None  # prompt tokens run through the model (None: all of them)
    first_token_s: float | None = None  # a pass of one output token per prompt right after (first_token_pass)


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """The jaxpaged engine's knobs; `num_blocks=None` sizes the pool to hold every prompt at once."""

    block_size: int = EngineConfig.block_size
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
