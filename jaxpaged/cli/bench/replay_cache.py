"""Cache-only replay of a Mooncake-format trace: prefix-cache hit rate against capacity, per policy and block size.

    jaxpaged bench replay-cache --block_sizes=512,64 --json_out=out/replay_cache.json

Requests go one at a time, in trace order, through the real KVCacheManager with no model (`--decode` also
caches the generated blocks); a table, JSON and one PNG per block size. See docs/cache.md.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from jaxpaged.bench.offline.cache_replay import markdown_table, replay_plots, sweep
from jaxpaged.bench.options import option
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.traces import CONVERSATION_TRACE, load_trace


@dataclasses.dataclass(frozen=True)
class ReplayOptions:
    """The trace, and the capacities, policies and block sizes it is replayed at."""

    trace: str = option(str(CONVERSATION_TRACE), "Mooncake-format JSONL trace", check="existing_file")
    limit: int | None = option(None, "replay only the first N requests", at_least=1)
    capacities: tuple[float, ...] = option((1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 5e7),
                                           "cache capacities in tokens", at_least=1)
    policies: tuple[str, ...] = option(tuple(EVICTION_POLICIES), "eviction policies", choices=EVICTION_POLICIES)
    block_sizes: tuple[int, ...] = option((512,), "block sizes in tokens", at_least=1)
    decode: bool = option(False, "also allocate and cache each request's generated blocks")
    unbounded: bool = option(True, "also replay with a cache that never evicts")


COMMAND = CommandFlags(ReplayOptions, json_out="out/replay_cache.json", md_out="out/replay_cache.md",
                       plot_dir="out/plots")
FLAGS = COMMAND.flags


def main(argv):
    """Replay the trace at every block size, capacity and policy; print, write and plot the hit rates."""
    del argv
    started, o = time.perf_counter(), COMMAND.options()
    requests = load_trace(o.trace, limit=o.limit)
    print(f"{len(requests)} requests, {sum(r.input_length for r in requests):,} prompt tokens")
    results = sweep(requests, capacities=list(o.capacities), policies=list(o.policies),
                    block_sizes=list(o.block_sizes), decode=o.decode, unbounded=o.unbounded)
    print()
    rows = [dataclasses.asdict(r) | {"hit_rate": r.hit_rate} for r in results]
    COMMAND.out.write({"trace": Path(o.trace).name, "num_requests": len(requests), "decode": o.decode,
                       "results": rows, "wall_s": time.perf_counter() - started}, markdown_table(results),
                      plots=replay_plots(rows, Path(o.trace).name))
