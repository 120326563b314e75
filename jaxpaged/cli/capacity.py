"""KV-cache capacity of a model: bytes per token, blocks and concurrent sequences for a memory budget.

    jaxpaged capacity --model=llama3-70b --kv_dtype=float16 --budget_gb=45 --context_len=2048

Llama-3-70B fp16: 327,680 bytes per token, a 16-token block ~5.2 MB, 8,583 blocks in 45 GB, weights ~141 GB.
A sliding-window model (``--model=gemma-3-27b``) also gets the hybrid KV cache manager's figures at each
``--context_lens`` entry, against every layer full. See docs/benchmarks/block-size.md and hybrid-kv.md.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.capacity import capacity_report
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.options import CommandFlags
from jaxpaged.config import DTYPE_ALIASES, SUPPORTED_DTYPES

KV_DTYPE_NAMES = list(dict.fromkeys([*SUPPORTED_DTYPES, *DTYPE_ALIASES, "fp8"]))


@dataclasses.dataclass(frozen=True)
class CapacityOptions:
    """The precisions, the budget, and the contexts the capacity is counted at."""

    kv_dtype: str = option("float16", "KV cache dtype (float16, bfloat16, float32, fp8)", choices=KV_DTYPE_NAMES)
    weight_dtype: str | None = option(None, "weight dtype (default: the KV dtype)", choices=KV_DTYPE_NAMES)
    budget_gb: float = option(45.0, "KV memory budget in GB (1e9 bytes), of each device with "
                                    "--tensor_parallel_size", at_least=1e-9)
    context_len: int = option(2048, "tokens per sequence", at_least=1)
    context_lens: tuple[int, ...] = option((), "sliding-window models: contexts to compare the hybrid and all-full "
                                               "layouts at (default: --context_len)", at_least=1)


COMMAND = CommandFlags(CapacityOptions, engine=["model", "block_size", "tensor_parallel_size"],
                       engine_defaults={"model": "llama3-70b"})
FLAGS = COMMAND.flags


def main(argv):
    """Print the capacity figures (and write JSON if asked)."""
    del argv
    o, engine = COMMAND.options(), COMMAND.engine.kwargs()
    result, text = capacity_report(model_config(engine["model"]), budget_bytes=int(o.budget_gb * 1e9),
                                   context_len=o.context_len, kv_dtype=o.kv_dtype, weight_dtype=o.weight_dtype,
                                   block_size=engine["block_size"], tensor_parallel_size=engine["tensor_parallel_size"],
                                   hybrid_context_lens=list(o.context_lens))
    print(text)
    COMMAND.out.write(result)
