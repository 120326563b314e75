"""Real-text quality on the pretrained model: perplexity under each numerics and KV layout, fp8 KV against bf16.

    jaxpaged bench quality --json_out=out/quality.json --md_out=out/quality.md

Perplexity of the shipped public-domain passages (data/quality/passages.jsonl)
under float32, bfloat16 weights + KV, fp8 KV (unit, per-tensor and per-head
calibrated scales, calibrated on a short and on a long text), the contiguous layout and a hybrid (sliding-window) layout;
then greedy chat answers of the bf16-weight engine with fp8 KV against bf16 KV
over the shipped chat prompts (data/quality/chat_prompts.jsonl): identical
answers, and teacher-forced top-1 agreement. What each figure means, and the figures:
docs/benchmarks/quality.md.
"""

from __future__ import annotations

import dataclasses
import time

import jax

from jaxpaged.bench.offline.quality import (CHAT_PROMPTS, PASSAGES, QualityBench, agreement_table, fp8_agreement,
                                            perplexity_rows, perplexity_table, perplexity_variants, read_jsonl)
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags
from jaxpaged.pretrained import default_model_path


@dataclasses.dataclass(frozen=True)
class QualityOptions:
    """Which figures, over how much of the shipped text, and the hybrid layout's window."""

    window: int = option(128, "sliding window of the hybrid layout's local layers", at_least=1)
    num_passages: int | None = option(None, "score only the first N passages (default: all)", at_least=1)
    num_prompts: int | None = option(None, "use only the first N chat prompts (default: all)", at_least=1)
    max_tokens: int = option(32, "greedy answer tokens per chat prompt", at_least=1)
    parts: tuple[str, ...] = option(("perplexity", "agreement"), "which figures to measure",
                                    choices=("perplexity", "agreement"))


COMMAND = CommandFlags(QualityOptions, engine=["model", "block_size"],
                       engine_defaults={"model": str(default_model_path())})  # the pretrained GGUF by default
FLAGS = COMMAND.flags


def main(argv):
    """Measure the figures --parts names on --model, print the tables and write the results."""
    del argv
    from jaxpaged.checkpoint import model_config
    from jaxpaged.server.chat import ChatTemplate
    from jaxpaged.tokenizer import load_tokenizer

    o, model, block_size = COMMAND.options(), COMMAND.engine_value("model"), COMMAND.engine_value("block_size")
    tokenizer = load_tokenizer(model, model_config(model))
    template = ChatTemplate.for_model(model)
    passages = [tokenizer.encode(p["text"]) for p in read_jsonl(PASSAGES)[:o.num_passages]]
    prompts = [tokenizer.encode(template.render(c["messages"]), add_special_tokens=False)
               for c in read_jsonl(CHAT_PROMPTS)[:o.num_prompts]]
    longest = max(max(len(p) for p in passages) + 1, max(len(p) for p in prompts) + o.max_tokens)
    max_len = -(-longest // block_size) * block_size
    bench = QualityBench(model, block_size, max_len, calibration_ids=prompts[0], long_calibration_ids=passages[0])
    result = {"jax": jax.__version__}
    tables, start = [], time.perf_counter()
    if "perplexity" in o.parts:
        result["perplexity"] = perplexity_rows(bench, perplexity_variants(o.window), passages)
        tables.append(perplexity_table(result["perplexity"]))
    if "agreement" in o.parts:
        result["fp8_vs_bf16"] = fp8_agreement(bench, prompts, o.max_tokens, tokenizer.stop_token_ids)
        tables.append(agreement_table(result["fp8_vs_bf16"]))
    result["seconds"] = time.perf_counter() - start
    COMMAND.out.write(result, "\n\n".join(tables))
