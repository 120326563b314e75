"""``jaxpaged bench step``: one prefill step and one decode step of a model's random weights, timed."""

from __future__ import annotations

import numpy as np

from jaxpaged.bench.offline.logit_controls import step_pair
from jaxpaged.bench.offline.timing import median_step_seconds
from jaxpaged.config import ModelConfig
from jaxpaged.report import markdown_table


def time_prefill_and_decode(config: ModelConfig, *, prefill_len: int, decode_batch: int, decode_context: int,
                            block_size: int, repeats: int) -> dict:
    """Median seconds of a ``prefill_len``-token prefill and of a ``decode_batch`` x ``decode_context`` decode step,
    and the tokens/s each gives."""
    from jaxpaged.model import init_model
    from jaxpaged.runner import ModelRunner
    decode, prefill, num_blocks = step_pair(256, block_size, decode_batch, decode_context, prefill_len,
                                            np.random.default_rng(0))
    runner = ModelRunner(init_model(config), num_blocks=num_blocks, block_size=block_size)
    prefill_s = median_step_seconds(runner, prefill, repeats)
    decode_s = median_step_seconds(runner, decode, repeats)
    return {"config": config.name, "block_size": block_size, "prefill_len": prefill_len,
            "decode_batch": decode_batch, "decode_context": decode_context,
            "prefill_ms": prefill_s * 1e3, "decode_ms": decode_s * 1e3,
            "prefill_tokens_per_s": prefill_len / prefill_s, "decode_tokens_per_s": decode_batch / decode_s,
            "prefill_over_decode": prefill_s / decode_s, "compiles": runner.num_compiles}


def step_table(r: dict) -> str:
    """One row of `time_prefill_and_decode`'s result."""
    return markdown_table(
        ["config", "prefill (ms)", "decode step (ms)", "prefill tok/s", "decode tok/s", "prefill/decode", "compiles"],
        [[f"{r['config']} ({r['prefill_len']} tok; {r['decode_batch']}x{r['decode_context']} ctx)",
          f"{r['prefill_ms']:.1f}", f"{r['decode_ms']:.1f}", f"{r['prefill_tokens_per_s']:.0f}",
          f"{r['decode_tokens_per_s']:.0f}", f"{r['prefill_over_decode']:.1f}x", r["compiles"]]])
