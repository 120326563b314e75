"""N-gram speculative decoding on vs off, side by side in one run, on the pretrained SmolLM2 by default.

    jaxpaged bench spec-decode --batch_sizes=1,8,64 --output_len=64 --repeats=2 \\
        --json_out=out/spec_decode.json --md_out=out/spec_decode.md

Chat prompts in the model's template: a repetition-heavy workload (copy a paragraph with one word changed,
rename a variable in a function) and plain chat questions. Modes: `off`, `on` (n-gram, speculating at every
batch size), `default` (n-gram with the default `disable_by_batch_size`). Greedy, EOS ignored, `--output_len`
tokens each; the modes' tokens are checked equal. docs/benchmarks/spec-decode.md.
"""

from __future__ import annotations

from jaxpaged.bench.offline.spec_decode import SpecDecodeOptions, spec_decode_report
from jaxpaged.cli.options import CommandFlags
from jaxpaged.pretrained import default_model_path

COMMAND = CommandFlags(SpecDecodeOptions,
                       engine=["model", "num_blocks", "max_num_batched_tokens", "compile_cache_dir"],
                       engine_defaults={"model": str(default_model_path()), "num_blocks": 2048})
FLAGS = COMMAND.flags


def main(argv):
    """Build the three engines, run both workloads at every batch size, print and write the table."""
    del argv
    COMMAND.out.write(*spec_decode_report(COMMAND.options(), COMMAND.engine.kwargs()))
