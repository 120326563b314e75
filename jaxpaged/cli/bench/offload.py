"""Benchmarks the memory tiers and the fp8 KV cache; prints Markdown, writes JSON.

    jaxpaged bench offload --json_out=out/bench_offload.json
"""

from __future__ import annotations

import dataclasses

from jaxpaged import compile_cache
from jaxpaged.bench.offline.offload import bench_budget, bench_ttft, capacity_table, markdown
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags
from jaxpaged.config import list_configs


@dataclasses.dataclass(frozen=True)
class OffloadOptions:
    """Which parts run, and each part's sizes."""

    prefix_len: int = option(4000, "Shared prefix length for the TTFT comparison.", at_least=1)
    repeats: int = option(3, "Timed rounds of the TTFT comparison (median reported).", at_least=1)
    num_requests: int = option(64, "Requests in the fixed-budget run.", at_least=1)
    prompt_len: int = option(256, "Prompt length in the fixed-budget run.", at_least=1)
    max_tokens: int = option(32, "Generated tokens per request in the fixed-budget run.", at_least=1)
    plan_models: tuple[str, ...] = option(("small", "llama3-8b", "llama3-70b"), "Models for the planner.",
                                          choices=list_configs())
    plan_bytes: int = option(16 << 30, "KV budget for the capacity planner table.", at_least=1)
    plan_seq_len: int = option(4096, "Sequence length for the planner's concurrency.", at_least=1)
    parts: tuple[str, ...] = option(("capacity", "ttft", "budget"), "Which benchmarks to run.",
                                    choices=["capacity", "ttft", "budget"])


# the timed runs' engines; kv_cache_bytes is the budget of the fp8 vs default run
COMMAND = CommandFlags(OffloadOptions, engine=["model", "block_size", "kv_cache_bytes", "compile_cache_dir"],
                       engine_defaults={"model": "small", "kv_cache_bytes": 32 << 20},
                       json_out="out/bench_offload.json")
FLAGS = COMMAND.flags


def main(argv: list[str]) -> None:
    """Run the chosen parts; print and write the tables."""
    del argv
    o, engine = COMMAND.options(), COMMAND.engine.kwargs()
    compile_cache.configure(engine["compile_cache_dir"])  # '' = off: the engines' "auto" keeps it off
    results = {}
    if "capacity" in o.parts:
        results["capacity"] = capacity_table(list(o.plan_models), o.plan_bytes, engine["block_size"], o.plan_seq_len)
    if "ttft" in o.parts:
        results["ttft"] = bench_ttft(engine["model"], o.prefix_len, o.repeats, block_size=engine["block_size"])
    if "budget" in o.parts:
        results["budget"] = bench_budget(engine["model"], engine["kv_cache_bytes"], o.num_requests, o.prompt_len,
                                         o.max_tokens)
    COMMAND.out.write(results, markdown(results))
