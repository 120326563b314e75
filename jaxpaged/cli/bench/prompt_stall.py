"""How long one huge prompt stalls the other streams: the longest gap between a stream's outputs.

    jaxpaged bench prompt-stall --prompt_chars=20000000 --repeats=3

One stream decodes on an `AsyncEngine` while another client adds a prompt far over ``max_model_len``;
medians with and without it (docs/benchmarks/serving.md, "A huge prompt and the other streams").
"""

from __future__ import annotations

from jaxpaged.bench.online.prompt_stall import PromptStallOptions, measure_prompt_stall
from jaxpaged.cli.options import CommandFlags

COMMAND = CommandFlags(PromptStallOptions, engine=["model", "num_blocks", "max_model_len", "compile_cache_dir"],
                       engine_defaults={"num_blocks": 256, "max_model_len": 1024})
FLAGS = COMMAND.flags
FLAGS.register_validator("max_tokens", lambda v: 1 < v <= 900, message="--max_tokens must be in [2, 900]")


def main(argv):
    """Measure, then print and write one Markdown table."""
    del argv
    result, table = measure_prompt_stall(COMMAND.engine.config(), options=COMMAND.options())
    COMMAND.out.write({"engine": COMMAND.engine.kwargs()} | result, table)
