"""The cost of penalties + logit_bias on a decode step, and of prompt logprobs on a prefill, side by side.

    jaxpaged bench logit-controls --model=llama-100m --decode_batch=32 --decode_context=512 \
        --prefill_len=512 --repeats=10 --json_out=out/logit_controls.json --md_out=out/logit_controls.md
"""

from __future__ import annotations

from jaxpaged.bench.offline.logit_controls import compare_logit_controls
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
DECODE_BATCH = FLAGS.DEFINE_integer("decode_batch", 32, "sequences in the decode step (all penalised)")
CONTEXT = FLAGS.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
PREFILL = FLAGS.DEFINE_integer("prefill_len", 512, "tokens in the prefill step (all with prompt logprobs)")
TOP_K = FLAGS.DEFINE_integer("prompt_top_logprobs", 5, "top ids per prompt position in the third variant")
ENGINE = EngineFlags(FLAGS, ["model", "block_size"], defaults={"model": "llama-100m"})
MODEL, BLOCK_SIZE = ENGINE.holders["model"], ENGINE.holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 10, "alternating rounds (medians reported)")
OUT = OutputFlags(FLAGS)

FLAGS.positive("decode_batch", "decode_context", "repeats", "prompt_top_logprobs")
FLAGS.at_least(2, "prefill_len")


def main(argv):
    """Time each variant side by side; print and write the table."""
    del argv
    result, table = compare_logit_controls(model_config(MODEL.value), decode_batch=DECODE_BATCH.value,
                                           context=CONTEXT.value, prefill_len=PREFILL.value, top_k=TOP_K.value,
                                           block_size=BLOCK_SIZE.value, repeats=REPEATS.value)
    OUT.write(result, table)
