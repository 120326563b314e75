"""Host-side cost of the KV cache manager (``jaxpaged bench block-manager``): throughput and admission time.

Every figure is the median of ``repeats`` timed calls (``perf_counter_ns``, garbage collector paused), the
cases interleaved (each repeat runs every case once) so machine load hits all of them alike.
"""

from __future__ import annotations

import gc
import hashlib
import random
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from jaxpaged.bench.options import option
from jaxpaged.cache.block_pool import BlockPool
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cache.hashing import HASH_ALGOS, hash_request_blocks
from jaxpaged.cache.kv_cache_manager import KVCacheManager
from jaxpaged.engine.config import EngineConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.report import markdown_table as render_table


@dataclass(frozen=True)
class BenchConfig:
    """What to measure: pool shape, prompt length, repeats, hash algorithms."""

    num_blocks: int = 4096
    block_size: int = EngineConfig.block_size
    prompt_len: int = option(1024, "Prompt length in tokens.", at_least=1)
    repeats: int = option(2000, "Timed calls per measurement (median reported).", at_least=1)
    hash_algo: tuple[str, ...] = option(("sha256", "xxh3_128"), "Hash algorithms to compare.", choices=HASH_ALGOS)
    seed: int = 0
    eviction_policy: tuple[str, ...] = option(EVICTION_POLICIES, "Eviction policies whose per-block cost is measured.",
                                              choices=EVICTION_POLICIES)


@dataclass(frozen=True)
class Case:
    """One timed operation: ``run(i)`` is timed; ``setup(i)``/``teardown(i)`` are not."""

    run: Callable[[int], object]
    setup: Callable[[int], object] | None = None
    teardown: Callable[[int], object] | None = None


def time_interleaved(cases: dict[str, Case], repeats: int) -> dict[str, float]:
    """Median microseconds per case, running every case once per repeat."""
    samples: dict[str, list[int]] = {name: [] for name in cases}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(repeats):
            for name, case in cases.items():
                if case.setup is not None:
                    case.setup(i)
                start = time.perf_counter_ns()
                case.run(i)
                samples[name].append(time.perf_counter_ns() - start)
                if case.teardown is not None:
                    case.teardown(i)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: statistics.median(values) / 1e3 for name, values in samples.items()}


def raw_sha256_chain(token_ids: list[int], block_size: int) -> list[bytes]:
    """Reference floor: bare hashlib SHA-256 chained over int64 blocks, no framing."""
    data = struct.pack(f"<{len(token_ids)}q", *token_ids)
    step = 8 * block_size
    parent = b"\0" * 32
    hashes = []
    for offset in range(0, len(data) - step + 1, step):
        parent = hashlib.sha256(parent + data[offset : offset + step]).digest()
        hashes.append(parent)
    return hashes


def _admit(mgr: KVCacheManager, seq_id: object, tokens: list[int]) -> None:
    """match_prefix + allocate_new for the whole uncached remainder of ``tokens``."""
    match = mgr.match_prefix(tokens)
    if not mgr.allocate_new(seq_id, tokens, len(tokens) - match.num_cached_tokens, match):
        raise RuntimeError("benchmark pool too small for the prompt")


def _hash_cases(cfg: BenchConfig, algo: str, prompt: list[int], cold: list[list[int]]) -> dict[str, Case]:
    """Hash chain, match and admission (cold and fully cached) for one hash algorithm."""
    bs = cfg.block_size
    cold_mgr = KVCacheManager(cfg.num_blocks, bs, hash_algo=algo)
    warm_mgr = KVCacheManager(cfg.num_blocks, bs, hash_algo=algo)
    _admit(warm_mgr, "warm", prompt)
    warm_mgr.commit("warm", prompt, len(prompt))
    warm_mgr.free("warm")
    return {
        f"hash_chain/{algo}": Case(lambda i: hash_request_blocks(prompt, bs, hash_algo=algo)),
        f"match_cached/{algo}": Case(lambda i: warm_mgr.match_prefix(prompt)),
        f"admit_cold/{algo}": Case(lambda i: _admit(cold_mgr, i, cold[i % len(cold)]), teardown=cold_mgr.free),
        f"admit_cached/{algo}": Case(lambda i: _admit(warm_mgr, i, prompt), teardown=warm_mgr.free),
    }


def _block_cases(cfg: BenchConfig, prompt: list[int]) -> dict[str, Case]:
    """Bare allocate / free of a prompt's blocks and one decode step (caching off)."""
    bs = cfg.block_size
    alloc_mgr = KVCacheManager(cfg.num_blocks, bs, enable_prefix_caching=False)
    free_mgr = KVCacheManager(cfg.num_blocks, bs, enable_prefix_caching=False)
    decode_mgr = KVCacheManager(cfg.num_blocks, bs, enable_prefix_caching=False)
    decode_mgr.allocate_new("s", [0], 0, None)
    max_len = cfg.num_blocks * bs

    def commit_one_token(i: int) -> None:
        length = decode_mgr.num_computed_tokens("s") + 1
        decode_mgr.commit("s", range(length), length)
        if length == max_len:  # pool full: start the sequence over
            decode_mgr.free("s")
            decode_mgr.allocate_new("s", [0], 0, None)

    return {
        "allocate": Case(lambda i: alloc_mgr.allocate_new(i, prompt, len(prompt), None), teardown=alloc_mgr.free),
        "free": Case(free_mgr.free, setup=lambda i: free_mgr.allocate_new(i, prompt, len(prompt), None)),
        "decode_allocate_slots": Case(lambda i: decode_mgr.allocate_slots(
            "s", 1, num_computed_tokens=decode_mgr.num_computed_tokens("s")), teardown=commit_one_token),
    }


def _policy_cases(cfg: BenchConfig, policy: str) -> dict[str, Case]:
    """The eviction policy's own cost on a pool whose every free block is cached: evict a prompt's worth of
    blocks (``allocate``), free them cached (``release``), and revive cached blocks with a prefix hit."""
    pool = BlockPool(cfg.num_blocks, eviction_policy=policy)
    n = cdiv(cfg.prompt_len, cfg.block_size)
    serial = iter(range(1 << 62))

    def cached(blocks: list) -> list:
        """``blocks``, each cached under a fresh hash."""
        for block in blocks:
            pool.cache_block(block, next(serial).to_bytes(32, "little"), None, (), ())
        return blocks

    pool.release(cached(pool.allocate(cfg.num_blocks))[::-1])  # every block cached and free
    held: list = []
    hits: list = []

    def take_hit(i: int) -> None:
        hits[:] = list(pool.policy)[-n:] if i % 64 == 0 or len(hits) != n else hits

    return {
        f"evict/{policy}": Case(lambda i: held.extend(pool.allocate(n)),
                                teardown=lambda i: (pool.release(cached(held)[::-1]), held.clear())),
        f"release/{policy}": Case(lambda i: pool.release(held[::-1]), setup=lambda i: held.extend(
            cached(pool.allocate(n))), teardown=lambda i: held.clear()),
        f"hit/{policy}": Case(lambda i: pool.take(hits), setup=take_hit,
                              teardown=lambda i: pool.release(hits[::-1])),
    }


def run_benchmarks(cfg: BenchConfig) -> dict:
    """Runs everything; returns a JSON-ready dict with the config and results."""
    rng = random.Random(cfg.seed)
    prompt = [rng.randrange(128_000) for _ in range(cfg.prompt_len)]
    cold = [[rng.randrange(128_000) for _ in range(cfg.prompt_len)] for _ in range(200)]
    cases = {"raw_sha256_chain": Case(lambda i: raw_sha256_chain(prompt, cfg.block_size))}
    for algo in cfg.hash_algo:
        cases.update(_hash_cases(cfg, algo, prompt, cold))
    cases.update(_block_cases(cfg, prompt))
    for policy in cfg.eviction_policy:
        cases.update(_policy_cases(cfg, policy))
    median_us = time_interleaved(cases, cfg.repeats)

    prompt_blocks = cdiv(cfg.prompt_len, cfg.block_size)
    per_second = lambda name: prompt_blocks / (median_us[name] * 1e-6)  # noqa: E731
    floor = median_us.get("hash_chain/sha256", float("nan"))
    per_algo = {
        algo: {
            "hash_chain_us": median_us[f"hash_chain/{algo}"],
            "admit_cold_us": median_us[f"admit_cold/{algo}"],
            "admit_cached_us": median_us[f"admit_cached/{algo}"],
            "admit_cached_over_sha256_chain": median_us[f"admit_cached/{algo}"] / floor,
            "match_cached_us": median_us[f"match_cached/{algo}"],
            "match_blocks_per_s": per_second(f"match_cached/{algo}"),
        }
        for algo in cfg.hash_algo
    }
    return {
        "config": asdict(cfg),
        "median_us": median_us,
        "per_hash_algo": per_algo,
        "allocate_blocks_per_s": per_second("allocate"),
        "free_blocks_per_s": per_second("free"),
        "per_eviction_policy_ns_per_block": {
            policy: {op: median_us[f"{op}/{policy}"] * 1e3 / prompt_blocks for op in ("evict", "release", "hit")}
            for policy in cfg.eviction_policy
        },
    }


def markdown_table(results: dict) -> str:
    """The results as Markdown: hashing/admission per algorithm, then block operations."""
    algos = list(results["per_hash_algo"])
    rows = [
        ("hash chain over the prompt (µs)", "hash_chain_us", ".1f"),
        ("admit cold prompt: hash + match + allocate (µs)", "admit_cold_us", ".1f"),
        ("admit fully cached prompt: hash + match + touch + allocate (µs)", "admit_cached_us", ".1f"),
        ("admit fully cached / SHA-256 chain", "admit_cached_over_sha256_chain", ".2f"),
        ("match_prefix on the cached prompt (µs)", "match_cached_us", ".1f"),
        ("match throughput (blocks/s)", "match_blocks_per_s", ",.0f"),
    ]
    tables = [render_table(["measure (median)", *algos],
                           [[label, *(format(results["per_hash_algo"][algo][key], fmt) for algo in algos)]
                            for label, key, fmt in rows])]
    us = results["median_us"]
    tables.append(render_table(["block operation, prefix caching off (median)", "value"], [
        ["allocate a prompt's blocks (µs)", f"{us['allocate']:.1f}"],
        ["allocate throughput (blocks/s)", f"{results['allocate_blocks_per_s']:,.0f}"],
        ["free a prompt's blocks (µs)", f"{us['free']:.1f}"],
        ["free throughput (blocks/s)", f"{results['free_blocks_per_s']:,.0f}"],
        ["decode step allocate_slots(seq, 1) (µs)", f"{us['decode_allocate_slots']:.2f}"],
        ["bare hashlib SHA-256 chain, no framing (µs)", f"{us['raw_sha256_chain']:.1f}"],
    ]))
    tables.append(render_table(["eviction policy (ns per block, median)", "evict", "release cached", "prefix hit"],
                               [[name, f"{c['evict']:.0f}", f"{c['release']:.0f}", f"{c['hit']:.0f}"]
                                for name, c in results["per_eviction_policy_ns_per_block"].items()]))
    return "\n\n".join(tables)
