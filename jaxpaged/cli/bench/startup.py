"""Start-up time: a fresh process's first `generate` and a server's launch to first token, cold and warm.

    jaxpaged bench startup --models=small,llama-100m --baseline_root=/path/to/older/checkout \\
        --json_out=out/bench_startup.json --md_out=out/bench_startup.md

Every start is a new process, with no persistent compile cache, an empty one (cold) and the one the cold start
filled (warm); `--baseline_root` starts an older source tree the same way, alternating, each row's ratio to its
start without a cache; `--vllm_python=PATH` adds vLLM's `LLM()` and first `generate` of the same prompts.
`--padding_costs` instead times each model's step at a size padded further (what merging two step shapes
would cost). docs/benchmarks/startup.md.
"""

from __future__ import annotations

from pathlib import Path

from jaxpaged.bench.offline.startup import StartupOptions, startup_report
from jaxpaged.cli.options import CommandFlags

COMMAND = CommandFlags(StartupOptions)
FLAGS = COMMAND.flags
FLAGS.register_validator("baseline_root", lambda v: v is None or (Path(v) / "jaxpaged").is_dir(),
                         message="--baseline_root must be a jaxpaged source tree")


def main(argv):
    """Measure the starts (or the padding costs); print and write the table."""
    del argv
    COMMAND.out.write(*startup_report(COMMAND.options()))
