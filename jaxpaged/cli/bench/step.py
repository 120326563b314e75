"""Prefill and decode step timings on one config (the foundation's step benchmark).

    jaxpaged bench step --model=small --prefill_len=512 --decode_batch=32
"""

from __future__ import annotations

import numpy as np

from jaxpaged.bench.offline.timing import median_step_seconds
from jaxpaged.bench.output import markdown_table
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.config import load_config
from jaxpaged.mathutils import cdiv
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from jaxpaged.step_input import ScheduledSeq, build_step_input

FLAGS = FlagSet()
MODEL = FLAGS.DEFINE_string("model", "small", "a shipped model config name or a config JSON")
PREFILL = FLAGS.DEFINE_integer("prefill_len", 512, "tokens in the prefill step")
DECODE_BATCH = FLAGS.DEFINE_integer("decode_batch", 32, "sequences in the decode step")
CONTEXT = FLAGS.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 10, "timed repeats per step (median reported)")
OUT = OutputFlags(FLAGS)

FLAGS.model_name("model")
FLAGS.positive("prefill_len", "decode_batch", "decode_context", "repeats")


def main(argv):
    """Time one prefill step and one decode step; print and write the table."""
    del argv
    config = load_config(MODEL.value)
    bs = BLOCK_SIZE.value
    blocks_per_seq = cdiv(max(PREFILL.value, CONTEXT.value + 1), bs)
    num_blocks = blocks_per_seq * (DECODE_BATCH.value + 1)
    runner = ModelRunner(init_model(config), num_blocks=num_blocks, block_size=bs)
    rng = np.random.default_rng(0)
    tables = rng.permutation(num_blocks).reshape(-1, blocks_per_seq)
    prefill = build_step_input([ScheduledSeq(list(rng.integers(0, 256, PREFILL.value)), 0, tables[0])], bs)
    decode = build_step_input([ScheduledSeq([int(rng.integers(0, 256))], CONTEXT.value, tables[i + 1])
                               for i in range(DECODE_BATCH.value)], bs)
    prefill_s = median_step_seconds(runner, prefill, REPEATS.value)
    decode_s = median_step_seconds(runner, decode, REPEATS.value)
    result = {
        "config": config.name, "block_size": bs, "prefill_len": PREFILL.value,
        "decode_batch": DECODE_BATCH.value, "decode_context": CONTEXT.value,
        "prefill_ms": prefill_s * 1e3, "decode_ms": decode_s * 1e3,
        "prefill_tokens_per_s": PREFILL.value / prefill_s,
        "decode_tokens_per_s": DECODE_BATCH.value / decode_s,
        "prefill_over_decode": prefill_s / decode_s, "compiles": runner.num_compiles,
    }
    table = markdown_table(
        ["config", "prefill (ms)", "decode step (ms)", "prefill tok/s", "decode tok/s", "prefill/decode", "compiles"],
        [[f"{config.name} ({PREFILL.value} tok; {DECODE_BATCH.value}x{CONTEXT.value} ctx)", f"{result['prefill_ms']:.1f}",
          f"{result['decode_ms']:.1f}", f"{result['prefill_tokens_per_s']:.0f}", f"{result['decode_tokens_per_s']:.0f}",
          f"{result['prefill_over_decode']:.1f}x", runner.num_compiles]])
    OUT.write(result, table)
