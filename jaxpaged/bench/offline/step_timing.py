"""One prefill step and one decode step of a model's random weights, built by hand and timed.

`StepShape` is the pair's sizes, the options of ``jaxpaged bench step``,
``bench logit-controls`` and ``bench tensor-parallel``; `step_pair` builds the
two `StepInput`s; `time_prefill_and_decode` is ``bench step`` itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxpaged.bench.offline.timing import median_step_seconds
from jaxpaged.bench.options import option
from jaxpaged.config import ModelConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.report import markdown_table
from jaxpaged.runner.step_input import ScheduledSeq, StepInput, build_step_input


@dataclasses.dataclass(frozen=True)
class StepShape:
    """A prefill of ``prefill_len`` tokens and a decode step of ``decode_batch`` rows at ``decode_context``."""

    prefill_len: int = option(512, "tokens in the prefill step", at_least=1)
    decode_batch: int = option(32, "sequences in the decode step", at_least=1)
    decode_context: int = option(512, "context length of each decoding sequence", at_least=1)

    def blocks_per_seq(self, block_size: int) -> int:
        """Blocks of one sequence's table: room for the prefill or a decode row's context and its new token."""
        return cdiv(max(self.prefill_len, self.decode_context + 1), block_size)


def step_pair(shape: StepShape, vocab: int, block_size: int,
              rng: np.random.Generator) -> tuple[StepInput, StepInput, int]:
    """``shape``'s decode step and prefill, random token ids below ``vocab``, over shuffled blocks; and the
    number of blocks they need."""
    per_seq = shape.blocks_per_seq(block_size)
    num_blocks = per_seq * (shape.decode_batch + 1)
    tables = rng.permutation(num_blocks).reshape(-1, per_seq)
    decode = build_step_input([ScheduledSeq([int(rng.integers(0, vocab))], shape.decode_context, tables[i + 1])
                               for i in range(shape.decode_batch)], block_size)
    prefill = build_step_input([ScheduledSeq(rng.integers(0, vocab, shape.prefill_len).tolist(), 0, tables[0])],
                               block_size)
    return decode, prefill, num_blocks


def time_prefill_and_decode(config: ModelConfig, shape: StepShape, *, block_size: int, repeats: int) -> dict:
    """Median seconds of ``shape``'s prefill and of its decode step, and the tokens/s each gives."""
    from jaxpaged.model import init_model
    from jaxpaged.runner import ModelRunner
    decode, prefill, num_blocks = step_pair(shape, 256, block_size, np.random.default_rng(0))
    runner = ModelRunner(init_model(config), num_blocks=num_blocks, block_size=block_size)
    prefill_s = median_step_seconds(runner, prefill, repeats)
    decode_s = median_step_seconds(runner, decode, repeats)
    return {"config": config.name, "block_size": block_size, **dataclasses.asdict(shape),
            "prefill_ms": prefill_s * 1e3, "decode_ms": decode_s * 1e3,
            "prefill_tokens_per_s": shape.prefill_len / prefill_s, "decode_tokens_per_s": shape.decode_batch / decode_s,
            "prefill_over_decode": prefill_s / decode_s, "compiles": runner.num_compiles}


def step_table(r: dict) -> str:
    """One row of `time_prefill_and_decode`'s result."""
    return markdown_table(
        ["config", "prefill (ms)", "decode step (ms)", "prefill tok/s", "decode tok/s", "prefill/decode", "compiles"],
        [[f"{r['config']} ({r['prefill_len']} tok; {r['decode_batch']}x{r['decode_context']} ctx)",
          f"{r['prefill_ms']:.1f}", f"{r['decode_ms']:.1f}", f"{r['prefill_tokens_per_s']:.0f}",
          f"{r['decode_tokens_per_s']:.0f}", f"{r['prefill_over_decode']:.1f}x", r["compiles"]]])
