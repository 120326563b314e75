"""Real-text quality on the pretrained model: perplexity under each numerics and KV layout, fp8 KV against bf16.

    jaxpaged bench quality --json_out=out/quality.json --md_out=out/quality.md

Perplexity of the shipped passages (data/quality/passages.jsonl) under float32, bfloat16, fp8 KV with each
kind of scale, the contiguous layout and a sliding-window hybrid; then the fp8-KV engine's greedy chat answers
against bf16 KV's over data/quality/chat_prompts.jsonl (identical answers, teacher-forced top-1 agreement).
What each figure means, and the figures: docs/benchmarks/quality.md.
"""

from __future__ import annotations

from jaxpaged.bench.offline.quality import QualityOptions, quality_report
from jaxpaged.cli.options import CommandFlags
from jaxpaged.pretrained import default_model_path

COMMAND = CommandFlags(QualityOptions, engine=["model", "block_size"],
                       engine_defaults={"model": str(default_model_path())})  # the pretrained GGUF by default
FLAGS = COMMAND.flags


def main(argv):
    """Measure the figures --parts names on --model, print the tables and write the results."""
    del argv
    COMMAND.out.write(*quality_report(COMMAND.options(), COMMAND.engine_value("model"),
                                      COMMAND.engine_value("block_size")))
