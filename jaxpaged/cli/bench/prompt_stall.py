"""How long one huge prompt stalls the other streams: the longest gap between a stream's outputs.

    jaxpaged bench prompt-stall --prompt_chars=20000000 --repeats=3

One stream decodes on an `AsyncEngine` while another client adds a prompt far over ``max_model_len``;
medians with and without it (docs/benchmarks/serving.md, "A huge prompt and the other streams").
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.online.prompt_stall import measure_prompt_stall
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class PromptStallOptions:
    """The huge prompt, the measured stream, and the rounds."""

    prompt_chars: int = option(20_000_000, "characters of the huge prompt", at_least=1)
    repeats: int = option(3, "rounds with and without the huge prompt", at_least=1)
    max_tokens: int = option(600, "tokens the measured stream decodes")


COMMAND = CommandFlags(PromptStallOptions, engine=["model", "num_blocks", "max_model_len", "compile_cache_dir"],
                       engine_defaults={"num_blocks": 256, "max_model_len": 1024})
FLAGS = COMMAND.flags
FLAGS.register_validator("max_tokens", lambda v: 1 < v <= 900, message="--max_tokens must be in [2, 900]")


def main(argv):
    """Measure, then print and write one Markdown table."""
    del argv
    o = COMMAND.options()
    result, table = measure_prompt_stall(COMMAND.engine.config(), repeats=o.repeats, max_tokens=o.max_tokens,
                                         prompt_chars=o.prompt_chars)
    COMMAND.out.write({"engine": COMMAND.engine.kwargs()} | result, table)
