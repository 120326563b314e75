"""Start-up time: a fresh process's first `generate` and a server's launch to first token, cold and warm.

    jaxpaged bench startup --models=small,llama-100m --baseline_root=/path/to/older/checkout \
        --json_out=out/bench_startup.json --md_out=out/bench_startup.md

Every start is a new process (`jaxpaged.bench.offline.startup`), with no
persistent compile cache, an empty one (cold) and the one the cold start
filled (warm); with `--baseline_root`, an older source tree is started the
same way, alternating with this one, and each row's ratio is to that tree's
start without a cache; with `--vllm_python=PATH`, vLLM's `LLM()` and first
`generate` of the same prompts, cold and warm. `--padding_costs` instead
times each model's step with a size padded further (what merging two step
shapes would cost).
"""

from __future__ import annotations

from pathlib import Path

from jaxpaged.bench.offline import startup
from jaxpaged.bench.offline.startup import padding_report, run_startups
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
MODELS = FLAGS.DEFINE_list("models", ["small", "llama-100m"], "shipped model configs to start")
KINDS = FLAGS.DEFINE_list("kinds", list(startup.KINDS), "generate: a first LLM.generate; serve: server to first token")
CACHES = FLAGS.DEFINE_list("cache_states", list(startup.CACHE_STATES), "off, cold (empty cache), warm (filled)")
BASELINE = FLAGS.DEFINE_string("baseline_root", None, "a source tree of the older version to compare with")
REPEATS = FLAGS.DEFINE_integer("repeats", 3, "starts of every kind, model, version and cache state")
NUM_PROMPTS = FLAGS.DEFINE_integer("num_prompts", 16, "prompts of the first generate")
OUTPUT_LEN = FLAGS.DEFINE_integer("output_len", 32, "greedy tokens per prompt of the first generate")
VLLM_PYTHON = FLAGS.DEFINE_string("vllm_python", None, "also vLLM's LLM() + first generate, cold and warm, "
                                  "through this vLLM install's Python (models as checkpoint directories)")
PADDING = FLAGS.DEFINE_bool("padding_costs", False, "instead: each model's step time with a size padded further "
                            "(what merging step shapes would cost)")
OUT = OutputFlags(FLAGS)

FLAGS.list_of("kinds", choices=list(startup.KINDS))
FLAGS.list_of("cache_states", choices=list(startup.CACHE_STATES))
FLAGS.positive("repeats", "num_prompts", "output_len")
FLAGS.register_validator("baseline_root", lambda v: v is None or (Path(v) / "jaxpaged").is_dir(),
                         message="--baseline_root must be a jaxpaged source tree")


def main(argv):
    """Measure the starts (or the padding costs); print and write the table."""
    del argv
    if PADDING.value:
        OUT.write(*padding_report(MODELS.value))
        return
    OUT.write(*run_startups(MODELS.value, baseline_root=BASELINE.value, kinds=KINDS.value, cache_states=CACHES.value,
                            repeats=REPEATS.value, num_prompts=NUM_PROMPTS.value, output_len=OUTPUT_LEN.value,
                            vllm_python=VLLM_PYTHON.value))
