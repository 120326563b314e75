"""Real-text quality on the pretrained model: perplexity under each numerics and KV layout, fp8 KV against bf16.

    jaxpaged bench quality --json_out=out/quality.json --md_out=out/quality.md

Perplexity of the shipped public-domain passages (data/quality/passages.jsonl)
under float32, bfloat16 weights + KV, fp8 KV (unit, per-tensor and per-head
calibrated scales, calibrated on a short and on a long text), the contiguous layout and a hybrid (sliding-window) layout;
then greedy chat answers of the bf16-weight engine with fp8 KV against bf16 KV
over the shipped chat prompts (data/quality/chat_prompts.jsonl): identical
answers, and teacher-forced top-1 agreement. What each figure means:
jaxpaged/bench/offline/quality.py; the figures: docs/benchmarks/quality.md.
"""

from __future__ import annotations

import os
import platform
import time

import jax

from jaxpaged.bench.offline.quality import (CHAT_PROMPTS, PASSAGES, QualityBench, agreement_table, fp8_agreement,
                                            perplexity_rows, perplexity_table, perplexity_variants, read_jsonl)
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.pretrained import default_model_path

FLAGS = FlagSet()
ENGINE = EngineFlags(FLAGS, ["model", "block_size"], defaults={"model": str(default_model_path())})
MODEL, BLOCK_SIZE = ENGINE.holders["model"], ENGINE.holders["block_size"]  # the pretrained GGUF by default
WINDOW = FLAGS.DEFINE_integer("window", 128, "sliding window of the hybrid layout's local layers")
NUM_PASSAGES = FLAGS.DEFINE_integer("num_passages", None, "score only the first N passages (default: all)")
NUM_PROMPTS = FLAGS.DEFINE_integer("num_prompts", None, "use only the first N chat prompts (default: all)")
MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 32, "greedy answer tokens per chat prompt")
PARTS = FLAGS.DEFINE_list("parts", ["perplexity", "agreement"], "which figures to measure")
OUT = OutputFlags(FLAGS)
FLAGS.model_name("model")
FLAGS.positive("block_size", "window", "num_passages", "num_prompts", "max_tokens")
FLAGS.list_of("parts", choices=("perplexity", "agreement"))


def main(argv):
    """Measure the figures --parts names on --model, print the tables and write the results."""
    del argv
    from jaxpaged.checkpoint import model_config
    from jaxpaged.server.chat import ChatTemplate
    from jaxpaged.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(MODEL.value, model_config(MODEL.value))
    template = ChatTemplate.for_model(MODEL.value)
    passages = [tokenizer.encode(p["text"]) for p in read_jsonl(PASSAGES)[:NUM_PASSAGES.value]]
    prompts = [tokenizer.encode(template.render(c["messages"]), add_special_tokens=False)
               for c in read_jsonl(CHAT_PROMPTS)[:NUM_PROMPTS.value]]
    longest = max(max(len(p) for p in passages) + 1, max(len(p) for p in prompts) + MAX_TOKENS.value)
    max_len = -(-longest // BLOCK_SIZE.value) * BLOCK_SIZE.value
    bench = QualityBench(MODEL.value, BLOCK_SIZE.value, max_len, calibration_ids=prompts[0],
                         long_calibration_ids=passages[0])
    result = {"model": MODEL.value, "block_size": BLOCK_SIZE.value, "machine": platform.processor() or
              platform.machine(), "cpus": os.cpu_count(), "jax": jax.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    tables, start = [], time.perf_counter()
    if "perplexity" in PARTS.value:
        result["perplexity"] = perplexity_rows(bench, perplexity_variants(WINDOW.value), passages)
        tables.append(perplexity_table(result["perplexity"]))
    if "agreement" in PARTS.value:
        result["fp8_vs_bf16"] = fp8_agreement(bench, prompts, MAX_TOKENS.value, tokenizer.stop_token_ids)
        tables.append(agreement_table(result["fp8_vs_bf16"]))
    result["seconds"] = time.perf_counter() - start
    OUT.write(result, "\n\n".join(tables))
