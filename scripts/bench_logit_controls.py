"""The cost of penalties + logit_bias on a decode step, and of prompt logprobs on a prefill, side by side.

    python scripts/bench_logit_controls.py --model=llama-100m --decode_batch=32 --decode_context=512 \
        --prefill_len=512 --repeats=10 --json_out=out/logit_controls.json --md_out=out/logit_controls.md
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from jaxpaged.cli import flag_checks
from jaxpaged.bench.offline.logit_controls import penalised, side_by_side, step_pair, with_prompt_logprobs
from jaxpaged.bench.output import write_outputs
from jaxpaged.config import load_config
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner

MODEL = flags.DEFINE_string("model", "llama-100m", "a shipped model config name or a config JSON")
DECODE_BATCH = flags.DEFINE_integer("decode_batch", 32, "sequences in the decode step (all penalised)")
CONTEXT = flags.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
PREFILL = flags.DEFINE_integer("prefill_len", 512, "tokens in the prefill step (all with prompt logprobs)")
TOP_K = flags.DEFINE_integer("prompt_top_logprobs", 5, "top ids per prompt position in the third variant")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
REPEATS = flags.DEFINE_integer("repeats", 10, "alternating rounds (medians reported)")
JSON_OUT = flags.DEFINE_string("json_out", None, "write results here as JSON")
MD_OUT = flags.DEFINE_string("md_out", None, "write the Markdown table here")

flag_checks.model_name("model")
flag_checks.positive("decode_batch", "decode_context", "block_size", "repeats", "prompt_top_logprobs")
flag_checks.at_least(2, "prefill_len")


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
             "| step | variant | median (ms) | ratio to plain |", "|---|---|---|---|"]
    for step, res in (("decode", decode_res), ("prefill", prefill_res)):
        lines += [f"| {step} | {name} | {r['median_ms']:.1f} | {r['ratio']:.3f} |" for name, r in res.items()]
    table = "\n".join(lines)
    print(table)
    write_outputs({"config": config.name, "decode": decode_res, "prefill": prefill_res,
                   "compiles": runner.num_compiles}, table, JSON_OUT.value, MD_OUT.value)


if __name__ == "__main__":
    app.run(main)
