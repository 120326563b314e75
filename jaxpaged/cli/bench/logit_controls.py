"""The cost of penalties + logit_bias on a decode step, and of prompt logprobs on a prefill, side by side.

    jaxpaged bench logit-controls --model=llama-100m --decode_batch=32 --decode_context=512 \
        --prefill_len=512 --repeats=10 --json_out=out/logit_controls.json --md_out=out/logit_controls.md
"""

from __future__ import annotations

import numpy as np

from jaxpaged.bench.offline.logit_controls import penalised, side_by_side, step_pair, with_prompt_logprobs
from jaxpaged.bench.output import markdown_table
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.config import load_config
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner

FLAGS = FlagSet()
MODEL = FLAGS.DEFINE_string("model", "llama-100m", "a shipped model config name or a config JSON")
DECODE_BATCH = FLAGS.DEFINE_integer("decode_batch", 32, "sequences in the decode step (all penalised)")
CONTEXT = FLAGS.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
PREFILL = FLAGS.DEFINE_integer("prefill_len", 512, "tokens in the prefill step (all with prompt logprobs)")
TOP_K = FLAGS.DEFINE_integer("prompt_top_logprobs", 5, "top ids per prompt position in the third variant")
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 10, "alternating rounds (medians reported)")
OUT = OutputFlags(FLAGS)

FLAGS.model_name("model")
FLAGS.positive("decode_batch", "decode_context", "repeats", "prompt_top_logprobs")
FLAGS.at_least(2, "prefill_len")


def main(argv):
    del argv
    config = load_config(MODEL.value)
    rng = np.random.default_rng(0)
    decode, prefill, num_blocks = step_pair(config.vocab_size, BLOCK_SIZE.value, DECODE_BATCH.value,
                                            CONTEXT.value, PREFILL.value, rng)
    runner = ModelRunner(init_model(config), num_blocks=num_blocks, block_size=BLOCK_SIZE.value)
    decode_res = side_by_side(runner, {"plain": decode,
                                       "penalties+bias": penalised(decode, CONTEXT.value, config.vocab_size, rng)},
                              REPEATS.value)
    prefill_res = side_by_side(runner, {"plain": prefill, "prompt_logprobs=0": with_prompt_logprobs(prefill, 0),
                                        f"prompt_logprobs={TOP_K.value}": with_prompt_logprobs(prefill, TOP_K.value)},
                               REPEATS.value)
    lines = [f"{config.name}, vocab {config.vocab_size}: decode {DECODE_BATCH.value} x {CONTEXT.value} ctx, "
             f"prefill {PREFILL.value} tokens; {REPEATS.value} alternating rounds", "",
             markdown_table(["step", "variant", "median (ms)", "ratio to plain"],
                            [[step, name, f"{r['median_ms']:.1f}", f"{r['ratio']:.3f}"]
                             for step, res in (("decode", decode_res), ("prefill", prefill_res))
                             for name, r in res.items()], align="llrr")]
    table = "\n".join(lines)
    OUT.write({"config": config.name, "decode": decode_res, "prefill": prefill_res,
               "compiles": runner.num_compiles}, table)
