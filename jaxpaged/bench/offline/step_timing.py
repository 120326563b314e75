"""Prefill and decode steps of a model's random weights, built by hand and timed.

`hand_built_steps` lays out a decode step and one-sequence prefills over shuffled blocks (``bench step``,
``logit-controls``, ``tensor-parallel``, ``cpu-efficiency``, ``attention --cpu_sweep``); `StepShape` is the
sizes of the first three, `step_pair` its two steps; `time_prefill_and_decode` is ``bench step`` itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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


def hand_built_steps(decode_batch: int, decode_context: int, prefill_lens: Sequence[int], vocab: int,
                     block_size: int, rng: np.random.Generator) -> tuple[StepInput, dict[int, StepInput], int]:
    """A decode step of ``decode_batch`` rows at ``decode_context`` and a one-sequence prefill of each length in
    ``prefill_lens``, random token ids below ``vocab``, over shuffled blocks; and the number of blocks they need.

    A decode row's table holds its context's and its new token's blocks, what the engine would give it; the
    prefills share one table as wide as the longest sequence of the set.
    """
    decode_blocks = cdiv(decode_context + 1, block_size)
    prefill_blocks = max(cdiv(max(prefill_lens), block_size), decode_blocks)
    num_blocks = prefill_blocks + decode_batch * decode_blocks
    blocks = rng.permutation(num_blocks)
    tables = blocks[prefill_blocks:].reshape(decode_batch, decode_blocks)
    decode = build_step_input([ScheduledSeq([int(rng.integers(0, vocab))], decode_context, tables[i])
                               for i in range(decode_batch)], block_size)
    prefills = {n: build_step_input([ScheduledSeq(rng.integers(0, vocab, n).tolist(), 0, blocks[:prefill_blocks])],
                                    block_size) for n in prefill_lens}
    return decode, prefills, num_blocks


def step_pair(shape: StepShape, vocab: int, block_size: int,
              rng: np.random.Generator) -> tuple[StepInput, StepInput, int]:
    """``shape``'s decode step and prefill (`hand_built_steps`), and the number of blocks they need."""
    decode, prefills, num_blocks = hand_built_steps(shape.decode_batch, shape.decode_context, [shape.prefill_len],
                                                    vocab, block_size, rng)
    return decode, prefills[shape.prefill_len], num_blocks


def time_prefill_and_decode(config: ModelConfig, shape: StepShape, *, block_size: int,
                            repeats: int) -> tuple[dict, str]:
    """Median seconds of ``shape``'s prefill and of its decode step on ``config``'s random weights, and the tokens/s
    each gives: the result and its table."""
    from jaxpaged.attention.backend import resolve_backend
    from jaxpaged.model import init_model
    from jaxpaged.runner import ModelRunner
    decode, prefill, num_blocks = step_pair(shape, 256, block_size, np.random.default_rng(0))
    runner = ModelRunner(init_model(config), num_blocks=num_blocks, block_size=block_size, backend=resolve_backend())
    prefill_s = median_step_seconds(runner, prefill, repeats)
    decode_s = median_step_seconds(runner, decode, repeats)
    r = {"config": config.name, "block_size": block_size, **dataclasses.asdict(shape),
         "prefill_ms": prefill_s * 1e3, "decode_ms": decode_s * 1e3,
         "prefill_tokens_per_s": shape.prefill_len / prefill_s, "decode_tokens_per_s": shape.decode_batch / decode_s,
         "prefill_over_decode": prefill_s / decode_s, "compiles": runner.num_compiles}
    return r, markdown_table(
        ["config", "prefill (ms)", "decode step (ms)", "prefill tok/s", "decode tok/s", "prefill/decode", "compiles"],
        [[f"{r['config']} ({r['prefill_len']} tok; {r['decode_batch']}x{r['decode_context']} ctx)",
          f"{r['prefill_ms']:.1f}", f"{r['decode_ms']:.1f}", f"{r['prefill_tokens_per_s']:.0f}",
          f"{r['decode_tokens_per_s']:.0f}", f"{r['prefill_over_decode']:.1f}x", r["compiles"]]])
