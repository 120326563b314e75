"""Cache-only replay of a Mooncake-format trace: prefix-cache hit rate against capacity, per policy and block size.

Requests go one at a time, in trace order, through the real KVCacheManager with
no model (every prompt block touched; ``--decode`` also caches the generated
blocks). Prints a Markdown table, writes JSON and one PNG per block size.

    jaxpaged bench replay-cache --block_sizes=512,64 --json_out=out/replay_cache.json
"""

from __future__ import annotations

import time
from pathlib import Path

from jaxpaged.bench.offline.cache_replay import markdown_table, print_result, replay_plots, result_rows, sweep
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.sim.traces import CONVERSATION_TRACE, load_trace

FLAGS = FlagSet()
_TRACE = FLAGS.DEFINE_string("trace", str(CONVERSATION_TRACE), "Mooncake-format JSONL trace")
_LIMIT = FLAGS.DEFINE_integer("limit", None, "replay only the first N requests")
_CAPACITIES = FLAGS.DEFINE_list("capacities", ["1e5", "3e5", "1e6", "3e6", "1e7", "3e7", "5e7"],
                                "cache capacities in tokens")
_POLICIES = FLAGS.DEFINE_list("policies", list(EVICTION_POLICIES), "eviction policies")
_BLOCK_SIZES = FLAGS.DEFINE_list("block_sizes", ["512"], "block sizes in tokens")
_DECODE = FLAGS.DEFINE_boolean("decode", False, "also allocate and cache each request's generated blocks")
_UNBOUNDED = FLAGS.DEFINE_boolean("unbounded", True, "also replay with a cache that never evicts")
OUT = OutputFlags(FLAGS, json_out="out/replay_cache.json", md_out="out/replay_cache.md", plot_dir="out/plots")

FLAGS.positive("limit")
FLAGS.existing_file("trace")
FLAGS.list_of("capacities", number_at_least=1)
FLAGS.list_of("policies", choices=EVICTION_POLICIES)
FLAGS.list_of("block_sizes", integer_at_least=1)


def main(argv):
    """Replay the trace at every block size, capacity and policy; print, write and plot the hit rates."""
    del argv
    started = time.perf_counter()
    requests = load_trace(_TRACE.value, limit=_LIMIT.value)
    print(f"{len(requests)} requests, {sum(r.input_length for r in requests):,} prompt tokens")
    results = sweep(requests, capacities=[float(c) for c in _CAPACITIES.value], policies=_POLICIES.value,
                    block_sizes=[int(b) for b in _BLOCK_SIZES.value], decode=_DECODE.value, unbounded=_UNBOUNDED.value,
                    on_result=print_result)
    table = markdown_table(results)
    print()
    rows = result_rows(results)
    OUT.write({"trace": Path(_TRACE.value).name, "num_requests": len(requests), "decode": _DECODE.value,
               "results": rows, "wall_s": time.perf_counter() - started}, table,
              plots=replay_plots(rows, Path(_TRACE.value).name))
