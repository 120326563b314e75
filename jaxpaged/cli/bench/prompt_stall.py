"""How long one huge prompt stalls the other streams: the longest gap between a stream's outputs.

    jaxpaged bench prompt-stall --prompt_chars=20000000 --repeats=3

One greedy stream decodes on an `AsyncEngine` (the server's engine loop, no
HTTP) while, 0.3 s in, another client adds a text prompt of `--prompt_chars`
characters, far over `max_model_len`. Reported: the median over repeats of
the stream's longest gap between two outputs, with and without the huge
prompt, side by side (docs/benchmarks/serving.md, "A huge prompt and the other streams").
"""

from __future__ import annotations

from jaxpaged.bench.online.prompt_stall import measure_prompt_stall
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
PROMPT_CHARS = FLAGS.DEFINE_integer("prompt_chars", 20_000_000, "characters of the huge prompt")
REPEATS = FLAGS.DEFINE_integer("repeats", 3, "rounds with and without the huge prompt")
MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 600, "tokens the measured stream decodes")
ENGINE = EngineFlags(FLAGS, ["model", "num_blocks", "max_model_len", "compile_cache_dir"],
                     defaults={"num_blocks": 256, "max_model_len": 1024})
OUT = OutputFlags(FLAGS)
FLAGS.register_validator("prompt_chars", lambda v: v > 0, message="--prompt_chars must be > 0")
FLAGS.register_validator("repeats", lambda v: v > 0, message="--repeats must be > 0")
FLAGS.register_validator("max_tokens", lambda v: 1 < v <= 900, message="--max_tokens must be in [2, 900]")


def main(argv):
    """Measure, then print and write one Markdown table."""
    del argv
    result, table = measure_prompt_stall(ENGINE.config(), repeats=REPEATS.value, max_tokens=MAX_TOKENS.value,
                                         prompt_chars=PROMPT_CHARS.value)
    OUT.write({"engine": ENGINE.kwargs()} | result, table)
