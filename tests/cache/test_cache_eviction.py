"""Issue 28 item 1: what each eviction policy keeps, pinned prefixes with a TTL, and the residency samples."""

import pytest
from cache_test_helpers import prefill

from jaxpaged.cache import KVCacheManager
from jaxpaged.cache.block_pool import BlockPool
from jaxpaged.engine import EngineConfig

BS = 4


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _tokens(tag: int, blocks: int) -> list[int]:
    return [tag] + [100 + tag] * (blocks * BS - 1)


@pytest.mark.parametrize("policy,kept", [("lru", "b"), ("lfu", "a"), ("slru", "a"), ("sieve", "a")])
def test_which_prefix_survives(policy, kept):
    """A is hit twice and freed before B (never hit): LRU keeps the recent B, the others the reused A."""
    mgr = KVCacheManager(6, BS, eviction_policy=policy)
    a, b = _tokens(1, 2) + [0], _tokens(2, 2) + [0]
    for i in range(3):
        prefill(mgr, f"a{i}", a)
        mgr.free(f"a{i}")
    prefill(mgr, "b", b)
    mgr.free("b")
    # free now: 2 empty blocks (the partial ones), A's 2 (hit twice), then B's 2 (never hit)
    prefill(mgr, "new", _tokens(3, 4))  # 4 blocks: the 2 empty ones and 2 victims
    got = {name: mgr.match_prefix(p).num_cached_tokens for name, p in (("a", a), ("b", b))}
    assert got[kept] == 2 * BS and got["a" if kept == "b" else "b"] < 2 * BS, got


def test_pinned_blocks_go_only_after_every_unpinned_one_and_ttl_returns_them():
    clock = Clock()
    mgr = KVCacheManager(6, BS, clock=clock)
    pinned, other = _tokens(1, 2) + [0], _tokens(2, 2) + [0]
    assert mgr.pin_prefix(pinned, 10.0) == 0  # nothing cached yet: the pin waits for the blocks
    prefill(mgr, "p", pinned)
    mgr.free("p")
    prefill(mgr, "o", other)
    mgr.free("o")  # LRU order now: p's blocks (older) then o's; p's are pinned
    assert mgr.stats.num_pinned_blocks == 2
    prefill(mgr, "x", _tokens(3, 4))  # 4 blocks: 2 empty + both of o's, although p's are older
    assert mgr.match_prefix(pinned).num_cached_tokens == 2 * BS and mgr.match_prefix(other).num_cached_tokens == 0
    assert mgr.stats.evictions_by_reason == {"capacity": 2, "pinned": 0, "reset": 0}
    mgr.free("x")
    prefill(mgr, "y", _tokens(4, 6))  # everything: x's 3 cached blocks first, then the pinned ones
    assert mgr.stats.evictions_by_reason["pinned"] == 2
    mgr.free("y")
    clock.now = 5.0
    prefill(mgr, "p2", pinned)  # cached again, still under its pin
    mgr.free("p2")
    clock.now = 11.0  # the pin ran out: p's blocks are ordinary LRU blocks again (freed before y's)
    prefill(mgr, "z", _tokens(5, 2) + [0])
    mgr.free("z")
    assert mgr.stats.num_pinned_blocks == 0 and len(mgr._pool.pinned) == 0
    assert mgr.match_prefix(pinned).num_cached_tokens == 2 * BS  # expired into the policy, not evicted
    mgr.check_invariants()


def test_pins_respect_the_cache_salt_and_ttl_zero_unpins():
    mgr = KVCacheManager(8, BS)
    prompt = _tokens(1, 2) + [0]
    mgr.pin_prefix(prompt, 100.0, cache_salt="tenant-a")
    prefill(mgr, "b", prompt, cache_salt="tenant-b")
    mgr.free("b")
    assert mgr.stats.num_pinned_blocks == 0  # another tenant's blocks of the same tokens are not pinned
    prefill(mgr, "a", prompt, cache_salt="tenant-a")
    mgr.free("a")
    assert mgr.stats.num_pinned_blocks == 2 and len(mgr._pool.pinned) == 2
    assert mgr.pin_prefix(prompt, 0.0, cache_salt="tenant-a") == 2
    assert mgr.stats.num_pinned_blocks == 0 and len(mgr._pool.pinned) == 0
    mgr.check_invariants()


def test_residency_samples_every_kth_block_with_its_times():
    clock = Clock()
    pool = BlockPool(4, clock=clock)
    tracker = pool.track_residency(0.5)  # every 2nd cached block
    blocks = pool.allocate(2)
    for i, block in enumerate(blocks):
        pool.cache_block(block, bytes([i]) * 32, None, (i,), ())
    assert [b.sampled for b in blocks] == [False, True]
    followed = blocks[1]
    clock.now = 2.0
    pool.take([followed])  # reuse 2 s after it was cached
    clock.now = 5.0
    pool.take([followed])  # and 3 s later
    clock.now = 6.0
    pool.release([followed] * 3 + [blocks[0]])  # last reference dropped at t = 6
    clock.now = 10.0
    pool.allocate(4)  # 2 empty blocks, then evicts both cached ones at t = 10
    assert tracker.reuse_gaps == [2.0, 3.0]
    assert tracker.lifetimes == [10.0] and tracker.idle_before_evict == [4.0]


def test_engine_config_names_the_bad_field():
    with pytest.raises(ValueError, match="eviction_policy"):
        EngineConfig(eviction_policy="mru")
    with pytest.raises(ValueError, match="kv_cache_metrics_sample"):
        EngineConfig(kv_cache_metrics_sample=1.5)
