"""KV cache events: replaying them mirrors the manager's prefix cache exactly."""

import random

import pytest
from cache_test_helpers import prefill

from jaxpaged.cache import KVCacheManager, chain_block_hashes
from jaxpaged.cache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    replay,
    stored_in_chain_order,
)
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.driver import make_sim_engine
from jaxpaged.sim.scenario import Deployment

BS = 4


def _cached(mgr) -> set[bytes]:
    return {info.block_hash for info in mgr.cached_blocks()}


def _check_stored_events(events) -> None:
    """Every BlockStored's hashes follow from its parent and tokens (a first block's salt is not in the event)."""
    for event in events:
        if isinstance(event, BlockStored) and event.parent_block_hash is not None:
            assert chain_block_hashes(event.parent_block_hash, event.token_ids, BS) == list(event.block_hashes)


def test_no_subscriber_no_event_work():
    mgr = KVCacheManager(8, BS)
    assert mgr._pool.events is None and mgr._pool._evict_hook is None
    prefill(mgr, "a", list(range(12)))
    assert mgr.take_events() == []
    evicted = []
    mgr.on_evict = lambda *args: evicted.append(args)
    assert mgr._pool._evict_hook is mgr.on_evict  # only the offload hook: called directly


def test_events_and_on_evict_both_see_evictions():
    mgr = KVCacheManager(4, BS)
    log = mgr.enable_events()
    evicted = []
    mgr.on_evict = lambda block_id, block_hash, tokens, parent, salt: evicted.append(block_hash)
    prefill(mgr, "a", list(range(16)))
    mgr.free("a")
    prefill(mgr, "b", list(range(100, 116)))  # reuses all four cached blocks
    events = log.take()
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed == evicted and len(removed) == 4
    assert replay(events) == _cached(mgr)


def _random_op(mgr, rng, prefixes, live, step, counts) -> None:
    """One random manager operation: admit, decode, fork, free, or (when idle) reset."""
    op = rng.random()
    if op < 0.35 and len(live) < 5:
        sid = f"s{step}"
        tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        salt = rng.choice([None, None, "tenant-a"])
        match = mgr.match_prefix(tokens, cache_salt=salt)
        if mgr.allocate_new(sid, tokens, len(tokens) - match.num_cached_tokens, match, cache_salt=salt):
            counts["hits"] += match.num_cached_tokens > 0
            mgr.commit(sid, tokens, len(tokens))
            live[sid] = tokens
    elif op < 0.65 and live:
        sid = rng.choice(sorted(live))
        if mgr.allocate_slots(sid, 1, num_computed_tokens=len(live[sid])) is not None:
            live[sid].append(rng.randrange(3))  # few distinct tokens: forks often publish duplicates
            mgr.commit(sid, live[sid], len(live[sid]))
    elif op < 0.75 and live and len(live) < 5:
        parent = rng.choice(sorted(live))
        mgr.fork(parent, f"f{step}")  # every scheduled token is committed: this workload commits at once
        live[f"f{step}"] = list(live[parent])
    elif op < 0.97 and live:
        sid = rng.choice(sorted(live))
        mgr.free(sid)
        del live[sid]
    elif not live:
        counts["resets"] += mgr.reset_prefix_cache()


def test_random_workload_replay_equals_cache():
    """Eviction, prefix hits (salted too), decode commits, forks, refused duplicates and resets."""
    rng = random.Random(0)
    mgr = KVCacheManager(24, BS)
    mgr.enable_events(include_token_ids=True)
    mirror: set[bytes] = set()
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 14))] for _ in range(4)]
    live: dict[str, list[int]] = {}
    counts = {"hits": 0, "evictions": 0, "resets": 0}
    for step in range(400):
        _random_op(mgr, rng, prefixes, live, step, counts)
        events = mgr.take_events()
        _check_stored_events(events)
        counts["evictions"] += sum(len(e.block_hashes) for e in events if isinstance(e, BlockRemoved))
        replay(events, mirror)
        assert mirror == _cached(mgr), f"step {step}"
    assert counts["hits"] and counts["evictions"] and counts["resets"], counts


def _assert_parents_first(events, tier_hashes) -> None:
    """Each announced block's parent, when the tier holds it, was announced before it (by an earlier event)."""
    seen: set[bytes] = set()
    for event in events:
        parent = event.parent_block_hash
        assert parent is None or parent not in tier_hashes or parent in seen, event
        seen.update(event.block_hashes)


def test_enabling_events_announces_every_cached_block_parents_first():
    """A router attaching late: the log starts with the cache's contents, in chain order, then goes on."""
    rng = random.Random(3)
    mgr = KVCacheManager(20, BS)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 14))] for _ in range(4)]
    live: dict[str, list[int]] = {}
    counts = {"hits": 0, "evictions": 0, "resets": 0}
    num_checked = 0
    for step in range(300):
        _random_op(mgr, rng, prefixes, live, step, counts)
        if step % 20:
            continue
        cached = {info.block_hash: info for info in mgr.cached_blocks()}
        log = mgr.enable_events(include_token_ids=True)
        announced = log.take()
        assert all(isinstance(e, BlockStored) and e.tier == "device" for e in announced)
        assert sum(len(e.block_hashes) for e in announced) == len(cached)  # each block once
        assert replay(announced) == set(cached)
        _check_stored_events(announced)
        _assert_parents_first(announced, set(cached))
        for event in announced:  # the run's first parent is the block's real parent
            assert event.parent_block_hash == cached[event.block_hashes[0]].parent_hash
        num_checked += len(cached) > 0
        mirror = replay(announced)
        for later in range(step + 1, step + 10):  # and events go on from there
            _random_op(mgr, rng, prefixes, live, later + 1000, counts)
            replay(mgr.take_events(), mirror)
            assert mirror == _cached(mgr)
    assert num_checked > 5 and mgr.stats.num_evictions > 0 and counts["hits"], counts
    mgr.disable_events()
    assert mgr.event_log is None and mgr.take_events() == []


def test_stored_in_chain_order_walks_each_chain_from_its_root():
    """A tree given children first: a-b-c with a sibling d of b; e whose parent is gone, f after e (tokens unknown)."""
    entries = [(b"c", b"b", (3,)), (b"f", b"e", None), (b"b", b"a", (2,)), (b"d", b"a", (4,)),
               (b"e", b"gone", (5,)), (b"a", None, (1,))]
    with_tokens = stored_in_chain_order(entries, 1, "host", include_token_ids=True)
    assert [(e.block_hashes, e.parent_block_hash, e.token_ids) for e in with_tokens] == [
        ((b"e",), b"gone", (5,)), ((b"f",), b"e", None), ((b"a", b"b", b"c"), None, (1, 2, 3)), ((b"d",), b"a", (4,))]
    assert {e.tier for e in with_tokens} == {"host"}
    without = stored_in_chain_order(entries, 1, "disk", include_token_ids=False)
    assert [(e.block_hashes, e.parent_block_hash, e.token_ids) for e in without] == [
        ((b"e", b"f"), b"gone", None), ((b"a", b"b", b"c"), None, None), ((b"d",), b"a", None)]
    assert stored_in_chain_order([], 4, "device", include_token_ids=True) == []


def test_replay_keeps_tiers_apart():
    events = [BlockStored((b"x", b"y"), None, None, BS), BlockStored((b"x",), None, None, BS, tier="host"),
              BlockRemoved((b"x",)), AllBlocksCleared(tier="disk"), BlockStored((b"z",), None, None, BS, tier="disk")]
    assert replay(events) == {b"y"} and replay(events, tier="host") == {b"x"} and replay(events, tier="disk") == {b"z"}
    with pytest.raises(ValueError, match="not a KV event"):
        replay(["not an event"])


def test_sim_engine_replay_equals_cache_through_preemption_and_reset():
    """A real engine (simulated runner) with a small pool: prefix hits, evictions, preemption, reset."""
    deployment = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=40 * BS * 256, block_size=BS,
                            max_num_seqs=6, max_num_batched_tokens=48)
    engine, clock = make_sim_engine(deployment.engine_config(), deployment.model_config, deployment.cost_model())
    engine.kv.enable_events()
    rng = random.Random(1)
    shared = [rng.randrange(200) for _ in range(20)]
    mirror: set[bytes] = set()

    def run_batch(tag: str, count: int) -> None:
        for i in range(count):
            prompt = shared + [rng.randrange(200) for _ in range(rng.randrange(2, 30))]
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt, "cache_salt": rng.choice([None, "t1"])},
                               SamplingParams(temperature=0, max_tokens=rng.randrange(8, 40), ignore_eos=True,
                                              detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY))
        while engine.has_unfinished_requests():
            engine.step()
            replay(engine.kv.take_events(), mirror)
            assert mirror == _cached(engine.kv)

    run_batch("a", 12)
    assert engine.kv.reset_prefix_cache()
    assert engine.kv.take_events() == [AllBlocksCleared()]
    mirror.clear()
    assert _cached(engine.kv) == set()
    run_batch("b", 12)
    stats = engine.kv.stats
    assert engine.scheduler.num_preemptions > 0
    assert stats.prefix_hits_tokens > 0 and stats.num_evictions > 0
