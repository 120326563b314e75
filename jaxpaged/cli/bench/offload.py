"""Benchmarks the memory tiers and the fp8 KV cache; prints Markdown, writes JSON.

    jaxpaged bench offload --json_out=out/bench_offload.json
"""

from __future__ import annotations

from jaxpaged import compile_cache
from jaxpaged.bench.offline.offload import bench_budget, bench_ttft, capacity_table, markdown
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.config import list_configs

FLAGS = FlagSet()
_PREFIX_LEN = FLAGS.DEFINE_integer("prefix_len", 4000, "Shared prefix length for the TTFT comparison.")
_REPEATS = FLAGS.DEFINE_integer("repeats", 3, "Timed rounds of the TTFT comparison (median reported).")
_NUM_REQUESTS = FLAGS.DEFINE_integer("num_requests", 64, "Requests in the fixed-budget run.")
_PROMPT_LEN = FLAGS.DEFINE_integer("prompt_len", 256, "Prompt length in the fixed-budget run.")
_MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 32, "Generated tokens per request in the fixed-budget run.")
_PLAN_MODELS = FLAGS.DEFINE_list("plan_models", ["small", "llama3-8b", "llama3-70b"], "Models for the planner.")
_PLAN_BYTES = FLAGS.DEFINE_integer("plan_bytes", 16 << 30, "KV budget for the capacity planner table.")
_PLAN_SEQ_LEN = FLAGS.DEFINE_integer("plan_seq_len", 4096, "Sequence length for the planner's concurrency.")
_PARTS = FLAGS.DEFINE_list("parts", ["capacity", "ttft", "budget"], "Which benchmarks to run.")
# the timed runs' engines; kv_cache_bytes is the budget of the fp8 vs default run
ENGINE = EngineFlags(FLAGS, ["model", "block_size", "kv_cache_bytes", "compile_cache_dir"],
                     defaults={"model": "small", "kv_cache_bytes": 32 << 20})
_MODEL, _BLOCK_SIZE, _KV_BYTES, _COMPILE_CACHE = (
    ENGINE.holders[n] for n in ("model", "block_size", "kv_cache_bytes", "compile_cache_dir"))
OUT = OutputFlags(FLAGS, json_out="out/bench_offload.json")

FLAGS.positive("prefix_len", "repeats", "num_requests", "prompt_len", "max_tokens",
                     "plan_bytes", "plan_seq_len")
FLAGS.list_of("parts", choices=["capacity", "ttft", "budget"])
FLAGS.list_of("plan_models", choices=list_configs())


def main(argv: list[str]) -> None:
    """Run the chosen parts; print and write the tables."""
    del argv
    compile_cache.configure(_COMPILE_CACHE.value)  # '' = off: the engines' "auto" keeps it off
    results = {}
    if "capacity" in _PARTS.value:
        results["capacity"] = capacity_table(_PLAN_MODELS.value, _PLAN_BYTES.value, _BLOCK_SIZE.value,
                                             _PLAN_SEQ_LEN.value)
    if "ttft" in _PARTS.value:
        results["ttft"] = bench_ttft(_MODEL.value, _PREFIX_LEN.value, _REPEATS.value, block_size=_BLOCK_SIZE.value)
    if "budget" in _PARTS.value:
        results["budget"] = bench_budget(_MODEL.value, _KV_BYTES.value, _NUM_REQUESTS.value,
                                         _PROMPT_LEN.value, _MAX_TOKENS.value)
    OUT.write(results, markdown(results))
