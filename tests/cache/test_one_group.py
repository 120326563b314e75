"""A plain model is the one-group case of KVCacheManager: its fast paths are only shortcuts of the group rules.

The manager takes shortcuts when the layout is one full-attention group (the
coordinator's unitary path: one table, the plain hash as key, events without a
group filter). Driving the same random operations through a manager forced
onto the general per-group path must give the same block tables, matches,
updates, copies, stats, cached entries, evictions and KV events, call by call.
"""

import random

import pytest

from jaxpaged.cache import KVCacheManager
from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.cache.single_type_managers import (SINGLE_TYPE_MANAGERS, FullAttentionManager,
                                                 SlidingWindowManager, single_type_manager)

NUM_BLOCKS, BS = 20, 4


def _general(mgr: KVCacheManager) -> KVCacheManager:
    """The same manager with its one-group shortcuts turned off (every call takes the per-group code)."""
    mgr._unitary = mgr._coordinator.unitary = False
    return mgr


def _observed(mgr: KVCacheManager, seqs: list[int]) -> tuple:
    stats = mgr.stats
    return ({s: mgr.block_table(s) for s in seqs}, stats, mgr.cached_blocks(),
            [mgr.num_blocks_held(s) for s in seqs], [mgr.held_blocks(s) for s in seqs])


def _result(value):
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "copies"):  # a BlockTableUpdate
        return value.start, list(value.block_ids), value.copies
    return (value.blocks, value.num_cached_tokens, value.block_hashes, value.num_pending_tokens)


def _call(fn, *args, **kwargs):
    try:
        return _result(fn(*args, **kwargs))
    except ValueError as err:
        return f"ValueError: {err}"


@pytest.mark.parametrize("events", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_unitary_shortcuts_match_the_group_rules(seed, events):
    rng = random.Random(seed)
    fast, general = KVCacheManager(NUM_BLOCKS, BS), _general(KVCacheManager(NUM_BLOCKS, BS))
    assert fast.unitary and not general.unitary
    evicted = {id(fast): [], id(general): []}
    for mgr in (fast, general):
        mgr.on_evict = lambda *args, log=evicted[id(mgr)]: log.append(args)
        if events:  # off: commits take the unitary publishing loop
            mgr.enable_events(include_token_ids=True)
    base = [rng.randrange(4) for _ in range(48)]
    tokens: dict[int, list[int]] = {}
    next_id = 0
    for _ in range(250):
        op = rng.random()
        seqs = sorted(tokens)
        if op < 0.3 or not seqs:
            sid, next_id = next_id, next_id + 1
            prompt = base[:rng.randrange(40)] + [rng.randrange(4) for _ in range(rng.randrange(1, 8))]
            salt = rng.choice([None, None, "tenant"])
            matches = [mgr.match_prefix(prompt, cache_salt=salt) for mgr in (fast, general)]
            assert _result(matches[0]) == _result(matches[1])
            n = rng.randrange(len(prompt) - matches[0].num_cached_tokens + 1)
            admitted = [_call(mgr.allocate_new, sid, prompt, n, m, cache_salt=salt)
                        for mgr, m in zip((fast, general), matches)]
            assert admitted[0] == admitted[1]
            if admitted[0] is True:
                tokens[sid] = list(prompt)
                done = matches[0].num_cached_tokens + n
                if done:
                    for mgr in (fast, general):
                        mgr.commit(sid, prompt, done)
        elif op < 0.75:
            sid = rng.choice(seqs)
            start = fast.num_computed_tokens(sid)
            if start == len(tokens[sid]):
                tokens[sid].append(rng.randrange(4))
            count = rng.randrange(1, len(tokens[sid]) - start + 1)
            updates = [_call(mgr.allocate_slots, sid, count, num_computed_tokens=start) for mgr in (fast, general)]
            assert updates[0] == updates[1]
            if isinstance(updates[0], tuple):
                for mgr in (fast, general):
                    mgr.commit(sid, tokens[sid], start + count)
        elif op < 0.85:
            sid = rng.choice(seqs)
            if fast.num_computed_tokens(sid):
                for mgr in (fast, general):
                    mgr.fork(sid, next_id)
                tokens[next_id] = tokens[sid][:fast.num_computed_tokens(sid)]
                next_id += 1
        else:
            sid = rng.choice(seqs)
            for mgr in (fast, general):
                mgr.free(sid)
            del tokens[sid]
        seqs = sorted(tokens)
        assert _observed(fast, seqs) == _observed(general, seqs)
        assert evicted[id(fast)] == evicted[id(general)]
        assert fast.take_events() == general.take_events()
        fast.check_invariants()
        general.check_invariants()
    assert fast.stats.num_evictions > 0 and fast.stats.num_cow_copies > 0  # the run reached both rules


def test_one_group_per_attention_spec():
    """Each group gets the single-type manager of its attention spec; a plain model's is one full group."""
    assert set(SINGLE_TYPE_MANAGERS) == {"full_attention", "sliding_window"}
    layout = kv_cache_layout((None, 8, None, 8))
    managers = [single_type_manager(group, g, BS) for g, group in enumerate(layout.groups)]
    assert [type(m) for m in managers] == [FullAttentionManager, SlidingWindowManager]
    assert [m.key(b"h" * 32) for m in managers] == [b"h" * 32, b"h" * 32 + (1).to_bytes(2, "little")]
    assert KVCacheManager(NUM_BLOCKS, BS).layout.windows == (None,)
    assert KVCacheManager(NUM_BLOCKS, BS, kv_cache_layout((None, None))).unitary
    assert not KVCacheManager(NUM_BLOCKS, BS, kv_cache_layout((8,))).unitary  # one group, but it slides
