"""Prefill and decode step timings on one config (the foundation's step benchmark).

    python scripts/bench_step.py --model=small --prefill_len=512 --decode_batch=32
"""

from __future__ import annotations

import json

import numpy as np
from absl import app, flags

from jaxpaged.cli import flag_checks
from jaxpaged.bench.offline.timing import median_step_seconds
from jaxpaged.config import load_config
from jaxpaged.mathutils import cdiv
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from jaxpaged.step_input import ScheduledSeq, build_step_input

MODEL = flags.DEFINE_string("model", "small", "a shipped model config name or a config JSON")
PREFILL = flags.DEFINE_integer("prefill_len", 512, "tokens in the prefill step")
DECODE_BATCH = flags.DEFINE_integer("decode_batch", 32, "sequences in the decode step")
CONTEXT = flags.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
REPEATS = flags.DEFINE_integer("repeats", 10, "timed repeats per step (median reported)")
JSON_OUT = flags.DEFINE_string("json_out", None, "write results here as JSON")

flag_checks.model_name("model")
flag_checks.positive("prefill_len", "decode_batch", "decode_context", "block_size", "repeats")


def main(argv):
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
    print("| config | prefill (ms) | decode step (ms) | prefill tok/s | decode tok/s | prefill/decode | compiles |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {config.name} ({PREFILL.value} tok; {DECODE_BATCH.value}x{CONTEXT.value} ctx) | "
          f"{result['prefill_ms']:.1f} | {result['decode_ms']:.1f} | {result['prefill_tokens_per_s']:.0f} | "
          f"{result['decode_tokens_per_s']:.0f} | {result['prefill_over_decode']:.1f}x | {runner.num_compiles} |")
    if JSON_OUT.value:
        with open(JSON_OUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    app.run(main)
