"""KVCacheManager: one test (or a few) per rule of the issue."""

import subprocess
import sys

import pytest
from cache_test_helpers import prefill, snapshot

from jaxpaged.cache import NO_CHANGE, BlockTableUpdate, KVCacheManager, chain_block_hashes

BS = 4


def toks(n, start=0):
    return list(range(start, start + n))


def test_importing_the_cache_does_not_import_jax():
    code = "import sys, jaxpaged.cache; assert 'jax' not in sys.modules, 'jax was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- 1. lazy pool


def test_blocks_are_allocated_lazily_and_returned_on_free():
    mgr = KVCacheManager(8, BS)
    prompt = toks(10)
    assert mgr.allocate_new("a", prompt, 5, mgr.match_prefix(prompt))  # first chunk: 5 tokens
    assert len(mgr.block_table("a")) == 2 and mgr.num_free_blocks == 6
    mgr.commit("a", prompt, 5)
    assert mgr.allocate_slots("a", 3, num_computed_tokens=5) is NO_CHANGE and len(mgr.block_table("a")) == 2
    mgr.commit("a", prompt, 8)  # 8 tokens fit
    update = mgr.allocate_slots("a", 2, num_computed_tokens=8)
    assert len(mgr.block_table("a")) == 3
    assert update == BlockTableUpdate(2, [mgr.block_table("a")[2]], ())
    mgr.commit("a", prompt, 10)
    mgr.free("a")
    assert mgr.num_free_blocks == 8 and mgr.stats.num_used_blocks == 0
    mgr.check_invariants()


# -------------------------------------------------------------- 3. prefix cache


def test_match_returns_longest_cached_run_capped_to_leave_one_token():
    mgr = KVCacheManager(16, BS)
    prefill(mgr, "a", toks(12))
    table = mgr.block_table("a")
    m = mgr.match_prefix(toks(10) + [99, 98, 97])  # blocks 0,1 equal; block 2 differs
    assert m.blocks == table[:2] and m.num_cached_tokens == 8 and len(m.block_hashes) == 3
    exact = mgr.match_prefix(toks(12))  # all 3 blocks cached, but one token must be computed
    assert exact.blocks == table[:2] and exact.num_cached_tokens == 8
    assert mgr.match_prefix(toks(13)).num_cached_tokens == 12
    assert mgr.match_prefix([5] + toks(12)[1:]).num_cached_tokens == 0
    assert mgr.match_prefix(toks(12), cache_salt="other").num_cached_tokens == 0
    assert mgr.match_prefix([]).num_cached_tokens == 0


def test_match_has_no_side_effects():
    mgr = KVCacheManager(8, BS)
    prefill(mgr, "a", toks(8))
    mgr.free("a")
    before = snapshot(mgr)
    mgr.match_prefix(toks(9))
    assert snapshot(mgr) == before


def test_only_computed_full_blocks_are_cached_with_chunked_prefill():
    mgr = KVCacheManager(8, BS)
    prompt = toks(11)
    assert mgr.allocate_new("a", prompt, 6, mgr.match_prefix(prompt))
    assert mgr.stats.num_cached_blocks == 0  # allocated, not computed yet
    mgr.commit("a", prompt, 6)  # block 0 full, block 1 half
    assert mgr.stats.num_cached_blocks == 1
    assert mgr.match_prefix(toks(12)).num_cached_tokens == 4
    assert mgr.allocate_slots("a", 5, num_computed_tokens=6).copies == ()
    mgr.commit("a", prompt, 11)  # block 1 full now; block 2 has 3 of 4
    assert mgr.stats.num_cached_blocks == 2 and mgr.match_prefix(toks(12)).num_cached_tokens == 8
    mgr.check_invariants()


def test_generated_tokens_are_cached_for_the_next_turn():
    mgr = KVCacheManager(8, BS)
    prompt = toks(6)
    prefill(mgr, "turn1", prompt)
    tokens = list(prompt)
    for new_token in (50, 51, 52):  # decode three tokens: block 1 fills with 4,5,50,51
        assert mgr.allocate_slots("turn1", 1, num_computed_tokens=len(tokens)).copies == ()
        tokens.append(new_token)
        mgr.commit("turn1", tokens, len(tokens))
    mgr.free("turn1")
    next_turn = tokens + [60, 61, 62]  # the conversation continues
    m = mgr.match_prefix(next_turn)
    assert m.num_cached_tokens == 8, "the previous answer's full block must hit"
    mgr.check_invariants()


def test_in_flight_prefix_is_reported_then_hit():
    mgr = KVCacheManager(16, BS)
    prompt = toks(13)
    assert mgr.allocate_new("a", prompt, 13, mgr.match_prefix(prompt))
    waiting = mgr.match_prefix(prompt[:12] + [77])
    assert waiting.num_cached_tokens == 0 and waiting.num_pending_tokens == 12
    assert mgr.match_prefix(prompt[:12]).num_pending_tokens == 8  # capped: one token left to compute
    assert mgr.match_prefix(prompt, cache_salt="x").num_pending_tokens == 0
    mgr.commit("a", prompt, 13)  # the scheduler deferred the newcomer one step
    later = mgr.match_prefix(prompt[:12] + [77])
    assert later.num_cached_tokens == 12 and later.num_pending_tokens == 0
    assert mgr._in_flight.counts == {}


def test_in_flight_registration_ends_when_the_computing_sequence_is_freed():
    mgr = KVCacheManager(16, BS)
    prompt = toks(9)
    assert mgr.allocate_new("a", prompt, 9, mgr.match_prefix(prompt))
    assert mgr.match_prefix(prompt).num_pending_tokens == 8
    mgr.free("a")  # preempted before its step ran
    assert mgr.match_prefix(prompt).num_pending_tokens == 0 and mgr._in_flight.counts == {}


def test_same_prefix_computed_twice_concurrently_never_corrupts():
    mgr = KVCacheManager(16, BS)
    prompt = toks(9)
    for seq in ("a", "b"):  # both admitted before either commits: no hit possible
        assert mgr.allocate_new(seq, prompt, 9, mgr.match_prefix(prompt))
    table_a, table_b = mgr.block_table("a"), mgr.block_table("b")
    assert not set(table_a) & set(table_b)
    mgr.commit("a", prompt, 9)
    mgr.commit("b", prompt, 9)  # duplicate: stays private to b
    assert [mgr._pool.cached[h].block_id for h in mgr.match_prefix(prompt).block_hashes] == table_a[:2]
    mgr.free("b")
    assert mgr.num_free_blocks == 16 - 3 and mgr.stats.num_cached_blocks == 2
    assert mgr.match_prefix(toks(10)).blocks == table_a[:2]
    mgr.check_invariants()


# ----------------------------------------------------------------- 4. ref counts


def test_ref_counts_follow_block_tables():
    mgr = KVCacheManager(16, BS)
    prefill(mgr, "a", toks(9))
    prefill(mgr, "b", toks(9))  # hits a's two full blocks
    shared = mgr.block_table("a")[:2]
    assert mgr.block_table("b")[:2] == shared
    assert [mgr._pool.blocks[i].ref_count for i in shared] == [2, 2]
    mgr.free("a")
    assert [mgr._pool.blocks[i].ref_count for i in shared] == [1, 1]
    assert not {b.block_id for b in mgr._pool.free_queue} & set(shared)
    mgr.free("b")
    assert {b.block_id for b in mgr._pool.free_queue} >= set(shared) and mgr.stats.num_cached_blocks == 2
    mgr.check_invariants()


def test_revived_cached_blocks_count_against_free_space():
    mgr = KVCacheManager(4, BS)
    prefill(mgr, "a", toks(12))
    mgr.allocate_new("z", toks(1, 99), 1, None)
    mgr.free("a")  # 3 cached-free blocks; z holds the fourth
    assert mgr.num_free_blocks == 3
    prompt = toks(8) + toks(8, start=100)  # reuses 2 cached blocks, needs 2 fresh: only 1 left
    m = mgr.match_prefix(prompt)
    assert m.num_cached_tokens == 8
    before = snapshot(mgr)
    assert not mgr.allocate_new("b", prompt, 8, m)
    assert snapshot(mgr) == before
    assert mgr.allocate_new("b", prompt, 4, m)  # a shorter first chunk fits
    mgr.check_invariants()


# ------------------------------------------------------------------ 5. eviction


def test_eviction_is_lru_deepest_first_and_drops_hash_entries():
    mgr = KVCacheManager(6, BS)
    evicted = []
    mgr.on_evict = lambda block_id, block_hash, tokens, parent, salt: evicted.append((block_id, tokens, block_hash, parent))
    prefill(mgr, "old", toks(12))  # 3 blocks
    prefill(mgr, "new", toks(8, start=100))  # 2 blocks
    old_table, new_table = mgr.block_table("old"), mgr.block_table("new")
    mgr.free("old")
    mgr.free("new")
    mgr.match_prefix(toks(9))  # a match is not a use: LRU order unchanged
    assert mgr.allocate_new("x", toks(12, start=500), 12, None)  # 3 blocks: 1 truly free + 2 evicted
    expected = [old_table[2], old_table[1]]
    assert [e[0] for e in evicted] == expected and evicted[0][1] == (8, 9, 10, 11)
    old_hashes = chain_block_hashes(None, toks(12), BS)
    assert [(e[2], e[3]) for e in evicted] == [(old_hashes[2], old_hashes[1]), (old_hashes[1], old_hashes[0])]
    assert not set(new_table) & {e[0] for e in evicted}  # freed later, so more recently used
    assert mgr.stats.num_evictions == 2
    assert mgr.match_prefix(toks(13)).num_cached_tokens == 4  # only old block 0 is left
    assert mgr.match_prefix(toks(9, start=100)).num_cached_tokens == 8
    mgr.check_invariants()


def test_a_hit_makes_blocks_most_recently_used():
    mgr = KVCacheManager(4, BS)
    prefill(mgr, "a", toks(4))
    prefill(mgr, "b", toks(4, start=100))
    mgr.free("a")
    mgr.free("b")
    prefill(mgr, "a2", toks(5))  # touches a's block, then frees again below
    mgr.free("a2")
    assert mgr.allocate_new("x", toks(12, start=500), 12, None)  # needs all 3 other blocks
    assert mgr.match_prefix(toks(5)).num_cached_tokens == 4  # a survived, b was evicted
    assert mgr.match_prefix(toks(5, start=100)).num_cached_tokens == 0


def test_next_step_is_allocated_before_the_current_one_is_committed():
    """Asynchronous scheduling: slots for step N+1 are handed out while step N is in flight."""
    mgr = KVCacheManager(8, BS)
    prompt = toks(7)
    assert mgr.allocate_new("a", prompt, 7, mgr.match_prefix(prompt))  # step N: the prompt
    assert mgr.num_computed_tokens("a") == 0  # the caller counts the 7 scheduled tokens
    update = mgr.allocate_slots("a", 1, num_computed_tokens=7)  # step N+1: what step N samples, at position 7
    assert update is NO_CHANGE
    update = mgr.allocate_slots("a", 1, num_computed_tokens=8)  # step N+2 writes position 8: a fresh block
    assert update.start == 2 and update.block_ids == [mgr.block_table("a")[2]]
    mgr.check_invariants()
    mgr.commit("a", prompt, 7)  # step N lands
    tokens = prompt + [1, 2]
    mgr.commit("a", tokens, 8)
    assert mgr.stats.num_cached_blocks == 2  # the two full blocks are cached once their tokens are known
    mgr.commit("a", tokens, 9)
    mgr.fork("a", "b")
    mgr.check_invariants()


# ---------------------------------------------------------------- 6. copy on write


def test_fork_shares_blocks_and_copies_the_partial_block_on_write():
    mgr = KVCacheManager(16, BS)
    tokens = toks(6)
    prefill(mgr, "p", tokens)
    mgr.fork("p", "c")
    parent_table = mgr.block_table("p")
    assert mgr.block_table("c") == parent_table and mgr.num_computed_tokens("c") == 6
    assert [mgr._pool.blocks[i].ref_count for i in parent_table] == [2, 2]
    update = mgr.allocate_slots("c", 1, num_computed_tokens=6)
    child_table = mgr.block_table("c")
    assert update.copies == ((parent_table[1], child_table[1]),) and child_table[0] == parent_table[0]
    assert update.start == 1 and update.block_ids == [child_table[1]]  # the private copy replaces entry 1
    assert mgr.allocate_slots("p", 1, num_computed_tokens=6).copies == ()  # the parent's block is private again
    mgr.commit("c", tokens + [7], 7)
    mgr.commit("p", tokens + [8], 7)
    assert mgr.stats.num_cow_copies == 1
    mgr.check_invariants()
    mgr.free("p")
    mgr.free("c")
    assert mgr.num_free_blocks == 16


def test_fork_at_a_block_boundary_needs_no_copy():
    mgr = KVCacheManager(16, BS)
    prefill(mgr, "p", toks(8))
    mgr.fork("p", "c")
    assert mgr.allocate_slots("c", 1, num_computed_tokens=8).copies == ()
    assert mgr.allocate_slots("p", 1, num_computed_tokens=8).copies == ()
    assert mgr.block_table("c")[2] != mgr.block_table("p")[2]
    mgr.check_invariants()


def test_growth_starts_only_between_the_committed_tokens_and_the_allocated_slots():
    """The caller owns the count of scheduled tokens; a count the manager's state contradicts is refused."""
    mgr = KVCacheManager(16, BS)
    prompt = toks(12)
    assert mgr.allocate_new("p", prompt, 12, mgr.match_prefix(prompt))  # 3 blocks: 12 slots
    mgr.commit("p", prompt, 5)  # 12 scheduled, the first 5 committed so far
    before = snapshot(mgr)
    for start in (4, 13):
        with pytest.raises(ValueError, match=r"num_computed_tokens for 'p' must be in \[5, 12\]"):
            mgr.allocate_slots("p", 1, num_computed_tokens=start)
        assert snapshot(mgr) == before
    assert mgr.allocate_slots("p", 1, num_computed_tokens=12).start == 3  # after the 12 scheduled: block 3
    mgr.check_invariants()


def test_writing_into_a_shared_block_without_allocate_slots_is_refused():
    mgr = KVCacheManager(16, BS)
    prefill(mgr, "p", toks(6))
    mgr.fork("p", "c")
    before = snapshot(mgr)
    with pytest.raises(ValueError, match="shared block"):
        mgr.commit("c", toks(7), 7)
    assert snapshot(mgr) == before


# ------------------------------------------------------------------- 7. metrics


def test_stats_count_usage_queries_hits_and_per_request_cached_tokens():
    mgr = KVCacheManager(10, BS)
    assert prefill(mgr, "a", toks(10)) == 0
    assert prefill(mgr, "b", toks(10)) == 8
    stats = mgr.stats
    assert stats.num_used_blocks == 4 and stats.usage == pytest.approx(0.4)  # 2 shared + 1 + 1
    assert stats.prefix_queries_tokens == 20 and stats.prefix_hits_tokens == 8
    assert stats.prefix_hit_rate == pytest.approx(0.4)
    assert mgr.num_cached_tokens("a") == 0 and mgr.num_cached_tokens("b") == 8
    mgr.free("a")
    mgr.free("b")
    stats = mgr.stats
    assert stats.usage == 0 and stats.num_free_blocks == 10 and stats.num_cached_blocks == 2
    mgr.match_prefix(toks(10))  # queries are counted on admission only
    assert mgr.stats.prefix_queries_tokens == 20


def test_prefix_caching_off_caches_and_counts_nothing():
    mgr = KVCacheManager(8, BS, enable_prefix_caching=False)
    prefill(mgr, "a", toks(9))
    m = mgr.match_prefix(toks(9))
    assert m.num_cached_tokens == 0 and m.block_hashes == []
    assert mgr.stats.num_cached_blocks == 0 and mgr.stats.prefix_queries_tokens == 0
    mgr.check_invariants()


def test_reset_prefix_cache():
    mgr = KVCacheManager(8, BS)
    prefill(mgr, "a", toks(9))
    assert not mgr.reset_prefix_cache()  # a still holds cached blocks
    mgr.free("a")
    assert mgr.reset_prefix_cache()
    assert mgr.match_prefix(toks(9)).num_cached_tokens == 0 and mgr.stats.num_cached_blocks == 0
    mgr.check_invariants()


# -------------------------------------------------------------------- 8. errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_blocks=0, block_size=4), "num_blocks must be a positive int, got 0"),
        (dict(num_blocks=4, block_size=-1), "block_size must be a positive int, got -1"),
        (dict(num_blocks=4, block_size=2.5), "block_size must be a positive int"),
        (dict(num_blocks=4, block_size=4, hash_algo="md5"), "hash_algo must be one of"),
    ],
)
def test_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KVCacheManager(**kwargs)


def _busy_manager():
    mgr = KVCacheManager(4, BS)
    prefill(mgr, "a", toks(6))
    mgr.fork("a", "f")
    mgr.allocate_new("b", toks(3, 50), 3, None)
    return mgr


@pytest.mark.parametrize(
    "action, message",
    [
        (lambda m: m.allocate_new("x", toks(17), 17, None), "17 tokens needs 5 blocks of 4 tokens; the pool has only 4"),
        (lambda m: m.allocate_new("a", toks(2), 2, None), "already allocated"),
        (lambda m: m.allocate_new("x", [], 0, None), "has no tokens"),
        (lambda m: m.allocate_new("x", toks(3), 4, None), r"num_new_tokens must be in \[0, 3\]"),
        (lambda m: m.allocate_new("x", toks(9), 4, m.match_prefix(toks(8))), "PrefixMatch is for 8 tokens"),
        (lambda m: m.allocate_new("x", toks(9), 4, m.match_prefix(toks(9)), cache_salt="s"), "with keys"),
        (lambda m: m.free("nobody"), "not held by the cache manager"),
        (lambda m: m.allocate_slots("nobody", 1, num_computed_tokens=0), "not held by the cache manager"),
        (lambda m: m.allocate_slots("a", 11, num_computed_tokens=6), "17 tokens needs 5 blocks"),
        (lambda m: m.allocate_slots("a", -1, num_computed_tokens=6), "must be >= 0"),
        (lambda m: m.allocate_slots("a", 1, num_computed_tokens=5), r"must be in \[6, 8\]"),
        (lambda m: m.allocate_slots("a", 1, num_computed_tokens=9), r"must be in \[6, 8\]"),
        (lambda m: m.commit("a", toks(6), 5), r"must be in \[6, 6\]"),
        (lambda m: m.commit("b", toks(5, 50), 5), r"must be in \[0, 4\]"),
        (lambda m: m.fork("a", "b"), "fork target 'b' is already allocated"),
        (lambda m: m.fork("nobody", "z"), "not held by the cache manager"),
        (lambda m: m.block_table("nobody"), "not held by the cache manager"),
    ],
)
def test_bad_calls_raise_and_change_nothing(action, message):
    mgr = _busy_manager()
    before = snapshot(mgr)
    with pytest.raises(ValueError, match=message):
        action(mgr)
    assert snapshot(mgr) == before
    mgr.check_invariants()


def test_double_free_raises_and_changes_nothing():
    mgr = _busy_manager()
    mgr.free("b")
    before = snapshot(mgr)
    with pytest.raises(ValueError, match="'b' is not held by the cache manager .*already freed"):
        mgr.free("b")
    assert snapshot(mgr) == before


def test_admission_that_does_not_fit_now_returns_false_and_changes_nothing():
    mgr = _busy_manager()
    before = snapshot(mgr)
    assert not mgr.allocate_new("x", toks(12, 200), 12, None)
    assert mgr.allocate_slots("b", 9, num_computed_tokens=3) is None
    assert snapshot(mgr) == before
    assert mgr.can_fit(16) and not mgr.can_fit(17)


def test_stale_match_is_refused():
    mgr = KVCacheManager(3, BS)
    prefill(mgr, "a", toks(8))
    mgr.free("a")
    m = mgr.match_prefix(toks(9))
    assert m.num_cached_tokens == 8
    assert mgr.allocate_new("x", toks(12, 100), 12, None)  # evicts a's blocks
    mgr.free("x")
    before = snapshot(mgr)
    with pytest.raises(ValueError, match="stale PrefixMatch"):
        mgr.allocate_new("y", toks(9), 1, m)
    assert snapshot(mgr) == before
