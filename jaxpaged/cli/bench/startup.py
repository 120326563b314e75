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

import dataclasses
from pathlib import Path

from jaxpaged.bench.offline import startup
from jaxpaged.bench.offline.startup import padding_report, run_startups
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class StartupOptions:
    """What is started, against which older tree, how often; or the padding costs instead."""

    models: tuple[str, ...] = option(("small", "llama-100m"), "shipped model configs to start")
    kinds: tuple[str, ...] = option(tuple(startup.KINDS), "generate: a first LLM.generate; serve: server to first "
                                                          "token", choices=list(startup.KINDS))
    cache_states: tuple[str, ...] = option(tuple(startup.CACHE_STATES), "off, cold (empty cache), warm (filled)",
                                           choices=list(startup.CACHE_STATES))
    baseline_root: str | None = option(None, "a source tree of the older version to compare with")
    repeats: int = option(3, "starts of every kind, model, version and cache state", at_least=1)
    num_prompts: int = option(16, "prompts of the first generate", at_least=1)
    output_len: int = option(32, "greedy tokens per prompt of the first generate", at_least=1)
    vllm_python: str | None = option(None, "also vLLM's LLM() + first generate, cold and warm, through this vLLM "
                                           "install's Python (models as checkpoint directories)")
    padding_costs: bool = option(False, "instead: each model's step time with a size padded further (what merging "
                                        "step shapes would cost)")


COMMAND = CommandFlags(StartupOptions)
FLAGS = COMMAND.flags
FLAGS.register_validator("baseline_root", lambda v: v is None or (Path(v) / "jaxpaged").is_dir(),
                         message="--baseline_root must be a jaxpaged source tree")


def main(argv):
    """Measure the starts (or the padding costs); print and write the table."""
    del argv
    o = COMMAND.options()
    if o.padding_costs:
        COMMAND.out.write(*padding_report(list(o.models)))
        return
    COMMAND.out.write(*run_startups(list(o.models), baseline_root=o.baseline_root, kinds=list(o.kinds),
                                    cache_states=list(o.cache_states), repeats=o.repeats,
                                    num_prompts=o.num_prompts, output_len=o.output_len,
                                    vllm_python=o.vllm_python))
