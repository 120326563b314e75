"""Cache-only replay of a request trace through the real :class:`KVCacheManager`, no model (docs/cache.md).

Requests run one at a time in trace order (as the Mooncake paper's Figure 9 counts): match the prefix,
allocate, commit every prompt token (and with ``decode`` the generated ones), free. The hit rate is prefix-hit
tokens over prompt tokens; a prompt that could never fit the pool counts as a miss and changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from jaxpaged.cache import KVCacheManager
from jaxpaged.engine.config import EngineConfig
from jaxpaged.report import markdown_table as render_table
from jaxpaged.sim.traces import TraceRequest, output_token_ids, prompt_token_ids


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """One replay: policy, geometry, token counts and how long it took."""

    policy: str
    block_size: int
    capacity_tokens: int
    num_requests: int
    query_tokens: int
    hit_tokens: int
    num_evictions: int
    num_skipped: int  # prompts longer than the whole pool
    seconds: float

    @property
    def hit_rate(self) -> float:
        """Hit tokens over prompt tokens."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


def replay_trace(requests: Sequence[TraceRequest], *, capacity_tokens: int | float,
                 block_size: int = EngineConfig.block_size, policy: str = "lru", decode: bool = False,
                 hash_algo: str = "xxh3_128",
                 prompts: Sequence[np.ndarray] | None = None) -> ReplayResult:
    """Replays ``requests`` through a pool of ``capacity_tokens // block_size`` blocks (``inf``: one big
    enough for the whole trace, the unbounded hit rate); ``prompts`` reuses token ids already made."""
    if math.isinf(capacity_tokens):
        num_blocks = sum(-(-(r.input_length + decode * r.output_length) // block_size) for r in requests)
    else:
        num_blocks = int(capacity_tokens) // block_size
    if num_blocks < 1:
        raise ValueError(f"capacity_tokens must hold at least one block of {block_size}, got {capacity_tokens}")
    mgr = KVCacheManager(num_blocks, block_size, hash_algo=hash_algo, eviction_policy=policy)
    start = time.perf_counter()
    query = skipped = 0
    for i, request in enumerate(requests):
        tokens = (prompts[i] if prompts is not None else prompt_token_ids(request)).tolist()
        query += len(tokens)
        if not mgr.can_fit(len(tokens) + decode * request.output_length):
            skipped += 1
            continue
        match = mgr.match_prefix(tokens)
        # the pool is empty of holders between requests, so admission always fits
        assert mgr.allocate_new(i, tokens, len(tokens) - match.num_cached_tokens, match)
        mgr.commit(i, tokens, len(tokens))
        if decode and request.output_length:
            tokens += output_token_ids(i, request).tolist()
            assert mgr.allocate_slots(i, request.output_length, num_computed_tokens=mgr.num_computed_tokens(i)) \
                is not None
            mgr.commit(i, tokens, len(tokens))
        mgr.free(i)
    stats = mgr.stats
    # queries count every prompt, skipped ones included (the manager only counts admitted ones)
    return ReplayResult(policy, block_size, int(min(capacity_tokens, num_blocks * block_size)), len(requests),
                        query, stats.prefix_hits_tokens, stats.num_evictions, skipped,
                        time.perf_counter() - start)


def sweep(requests: Sequence[TraceRequest], *, capacities: Sequence[float], policies: Sequence[str],
          block_sizes: Sequence[int], decode: bool = False, unbounded: bool = True) -> list[ReplayResult]:
    """Every (block size, policy, capacity) replay, plus the unbounded one per block size (policy
    ``"unbounded"``), a progress line each; token ids are made once."""
    prompts = [prompt_token_ids(r) for r in requests]
    results = []
    for block_size in block_sizes:
        for policy, capacity in [("unbounded", math.inf)] * unbounded + [(p, c) for p in policies for c in capacities]:
            r = replay_trace(requests, capacity_tokens=capacity, block_size=block_size, decode=decode,
                             policy="lru" if policy == "unbounded" else policy, prompts=prompts)
            r = dataclasses.replace(r, policy=policy)
            results.append(r)
            print(f"  bs={r.block_size} {r.policy:>9} {r.capacity_tokens:>12,} tokens: hit rate {r.hit_rate:6.2%}"
                  f" ({r.seconds:.1f} s, {r.num_skipped} prompts longer than the pool)", flush=True)
    return results


def markdown_table(results: Sequence[ReplayResult]) -> str:
    """Hit rate (%) per policy (rows) and capacity (columns), one table per block size."""
    lines = []
    for block_size in dict.fromkeys(r.block_size for r in results):
        rows = [r for r in results if r.block_size == block_size]
        unbounded = next((r for r in rows if r.policy == "unbounded"), None)
        capacities = sorted({r.capacity_tokens for r in rows if r.policy != "unbounded"})
        table_rows = []
        for policy in dict.fromkeys(r.policy for r in rows if r.policy != "unbounded"):
            by_cap = {r.capacity_tokens: r.hit_rate for r in rows if r.policy == policy}
            table_rows.append([policy, *(f"{100 * by_cap[c]:.1f}" for c in capacities)])
        lines += [f"block size {block_size}" + (f" (unbounded hit rate {unbounded.hit_rate:.1%})"
                                                 if unbounded else ""), "",
                  render_table(["policy", *(f"{c:.0e} tok" for c in capacities)], table_rows), ""]
    return "\n".join(lines)


# the paper's Figure 9 reading for the conversation trace
PAPER_NOTE = "Mooncake (FAST'25) Fig. 9: a 3M-token local cache reaches well under half the unbounded hit rate"


def replay_plots(rows: Sequence[dict], trace_name: str) -> dict[str, Callable[[], object]]:
    """``replay_hit_rate_bs<B>.png`` per block size: its figure of hit rate against capacity, a line per policy;
    ``rows`` are the results as dicts, hit rate included."""
    from jaxpaged.bench.offline.plots import plot_hit_rate_vs_capacity
    return {f"replay_hit_rate_bs{bs}.png": functools.partial(
        plot_hit_rate_vs_capacity, [r for r in rows if r["block_size"] == bs],
        title=f"{trace_name}, block size {bs}", note=PAPER_NOTE)
        for bs in dict.fromkeys(r["block_size"] for r in rows)}
