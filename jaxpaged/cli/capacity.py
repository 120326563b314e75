"""KV-cache capacity for a model config: bytes per token, blocks and sequences for a budget.

    jaxpaged capacity --model=llama3-70b --kv_dtype=float16 --budget_gb=45 --context_len=2048

Reproduces the reference figures: Llama-3-70B fp16 = 327,680 bytes per token,
a 16-token block ~5.2 MB, ~8,600 blocks in 45 GB (and weights ~141 GB in fp16).

A model with sliding-window layers (e.g. ``--model=gemma-3-27b``) also gets the
hybrid KV cache manager's figures at each ``--context_lens`` entry: KV bytes per
sequence and concurrent sequences, hybrid vs every layer treated as full.
"""

from __future__ import annotations

from jaxpaged.bench.capacity import capacity_report
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.config import DTYPE_ALIASES, SUPPORTED_DTYPES

FLAGS = FlagSet()
KV_DTYPE = FLAGS.DEFINE_string("kv_dtype", "float16", "KV cache dtype (float16, bfloat16, float32, fp8)")
WEIGHT_DTYPE = FLAGS.DEFINE_string("weight_dtype", None, "weight dtype (default: the KV dtype)")
BUDGET_GB = FLAGS.DEFINE_float("budget_gb", 45.0, "KV memory budget in GB (1e9 bytes), of each device "
                               "with --tensor_parallel_size")
ENGINE = EngineFlags(FLAGS, ["model", "block_size", "tensor_parallel_size"], defaults={"model": "llama3-70b"})
MODEL, BLOCK_SIZE, TP = (ENGINE.holders[n] for n in ("model", "block_size", "tensor_parallel_size"))
CONTEXT_LEN = FLAGS.DEFINE_integer("context_len", 2048, "tokens per sequence")
CONTEXT_LENS = FLAGS.DEFINE_list("context_lens", [], "sliding-window models: contexts to compare the hybrid "
                                  "and all-full layouts at (default: --context_len)")
OUT = OutputFlags(FLAGS)

KV_DTYPE_NAMES = list(SUPPORTED_DTYPES) + list(DTYPE_ALIASES) + ["fp8"]
FLAGS.one_of("kv_dtype", KV_DTYPE_NAMES)
FLAGS.one_of("weight_dtype", KV_DTYPE_NAMES)
FLAGS.at_least(1e-9, "budget_gb")
FLAGS.positive("context_len")


def main(argv):
    """Print the capacity figures (and write JSON if asked)."""
    del argv
    result, text = capacity_report(model_config(MODEL.value), budget_bytes=int(BUDGET_GB.value * 1e9),
                                   context_len=CONTEXT_LEN.value, kv_dtype=KV_DTYPE.value,
                                   weight_dtype=WEIGHT_DTYPE.value, block_size=BLOCK_SIZE.value,
                                   tensor_parallel_size=TP.value, hybrid_context_lens=[int(n) for n in CONTEXT_LENS.value])
    print(text)
    OUT.write(result)
