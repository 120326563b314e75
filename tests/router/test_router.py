"""The prefix-aware router's library: index fed by real managers' events, hashing, policies."""

import pytest

from jaxpaged.cache import KVCacheManager
from jaxpaged.cache.events import BlockStored
from jaxpaged.router import (
    LeastLoadedPolicy,
    PrefixAwarePolicy,
    PrefixIndex,
    ReplicaLoad,
    RequestHasher,
    RoundRobinPolicy,
    RouteRequest,
    Router,
    make_policy,
)

BS = 4


def _prefill(mgr, seq_id, tokens, salt=None):
    match = mgr.match_prefix(tokens, cache_salt=salt)
    assert mgr.allocate_new(seq_id, tokens, len(tokens) - match.num_cached_tokens, match, cache_salt=salt)
    mgr.commit(seq_id, tokens, len(tokens))


def _replicas(count, num_blocks=16, hash_algo="sha256"):
    managers = {f"r{i}": KVCacheManager(num_blocks, BS, hash_algo=hash_algo) for i in range(count)}
    for mgr in managers.values():
        mgr.enable_events()
    router = Router(PrefixAwarePolicy(), RequestHasher(BS, hash_algo))
    for name in managers:
        router.add_replica(name)
    return managers, router


def _sync(managers, router):
    for name, mgr in managers.items():
        router.on_events(name, mgr.take_events())


def _idle(router):
    return {r: ReplicaLoad() for r in router.replicas}


@pytest.mark.parametrize("hash_algo", ["sha256", "xxh3_128"])
def test_hasher_equals_the_engines_hashes(hash_algo):
    mgr = KVCacheManager(8, BS, hash_algo=hash_algo)
    hasher = RequestHasher(BS, hash_algo)
    tokens = list(range(19))
    for salt in (None, "tenant-a"):
        assert hasher.block_hashes(tokens, salt) == mgr.match_prefix(tokens, cache_salt=salt).block_hashes
    assert hasher.block_hashes(tokens, "a") != hasher.block_hashes(tokens, "b")


def test_bad_hasher_and_policy_arguments():
    with pytest.raises(ValueError, match="block_size"):
        RequestHasher(0)
    with pytest.raises(ValueError, match="hash_algo"):
        RequestHasher(4, "md5")
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")
    with pytest.raises(ValueError, match="imbalance_threshold"):
        PrefixAwarePolicy(imbalance_threshold=-1)


def test_index_mirrors_each_replicas_cache_through_eviction():
    managers, router = _replicas(2, num_blocks=6)
    a, b = managers["r0"], managers["r1"]
    _prefill(a, "x", list(range(12)))
    _prefill(b, "y", list(range(100, 112)), salt="t")
    a.free("x")
    _prefill(a, "z", list(range(50, 66)))  # 4 blocks: evicts 2 of x's cached 3
    _sync(managers, router)
    for name, mgr in managers.items():
        assert router.index.blocks_of(name) == {info.block_hash for info in mgr.cached_blocks()}
    assert a.reset_prefix_cache() is False  # z still holds blocks
    a.free("z")
    assert a.reset_prefix_cache()
    _sync(managers, router)
    assert router.index.blocks_of("r0") == set() and len(router.index) == 3


def test_matched_tokens_are_each_replicas_cached_prefix_and_respect_the_salt():
    managers, router = _replicas(3)
    shared = list(range(8))
    _prefill(managers["r0"], "a", shared + [1, 1, 1, 1])
    _prefill(managers["r1"], "b", shared + [2, 2, 2, 2])
    _prefill(managers["r2"], "c", shared + [1, 1, 1, 1], salt="tenant")
    _sync(managers, router)
    prompt = shared + [1, 1, 1, 1, 9]
    expected = {name: mgr.match_prefix(prompt).num_cached_tokens for name, mgr in managers.items()}
    assert router.matched_tokens(prompt) == {r: n for r, n in expected.items() if n} == {"r0": 12, "r1": 8}
    assert router.matched_tokens(prompt, "tenant") == {"r2": 12}
    assert router.route(prompt, _idle(router)) == "r0"
    assert router.route(prompt, _idle(router), cache_salt="tenant") == "r2"


def test_a_removed_replica_leaves_the_index_and_gets_no_request():
    managers, router = _replicas(2)
    _prefill(managers["r1"], "a", list(range(12)))
    _sync(managers, router)
    assert router.route(list(range(13)), _idle(router)) == "r1"
    router.remove_replica("r1")
    assert len(router.index) == 0 and router.replicas == ["r0"]
    assert router.route(list(range(13)), _idle(router)) == "r0"
    with pytest.raises(ValueError, match="not in the index"):
        router.on_events("r1", [])
    with pytest.raises(ValueError, match="live replicas"):
        router.route([1], {"r0": ReplicaLoad(), "r1": ReplicaLoad()})
    router.remove_replica("r0")
    with pytest.raises(ValueError, match="no replica"):
        router.route([1], {})


def test_prefix_aware_falls_back_to_least_loaded():
    policy = PrefixAwarePolicy(waiting_penalty=0.05, imbalance_threshold=4)
    loads = {"a": ReplicaLoad(num_running=3), "b": ReplicaLoad(num_running=1), "c": ReplicaLoad(num_running=2)}
    nothing = RouteRequest(100, {})
    assert policy.choose(nothing, loads) == "b"  # no match: least loaded
    half_on_a = RouteRequest(100, {"a": 50})
    assert policy.choose(half_on_a, loads) == "a"  # the cached prefix wins over a small load difference
    imbalanced = {**loads, "a": ReplicaLoad(num_running=6)}  # 6 - 1 > 4
    assert policy.choose(half_on_a, imbalanced) == "b"
    queued = {**loads, "a": ReplicaLoad(num_waiting=1, num_running=2)}  # 0.5 - 1 * 0.05 > 0.4 - 0
    assert policy.choose(RouteRequest(100, {"a": 50, "c": 40}), queued) == "a"
    queued = {**loads, "a": ReplicaLoad(num_waiting=4, num_running=0)}  # 0.5 - 4 * 0.05 < 0.4
    assert policy.choose(RouteRequest(100, {"a": 50, "c": 40}), queued) == "c"


def test_round_robin_and_least_loaded():
    loads = {"a": ReplicaLoad(num_running=2), "b": ReplicaLoad(num_running=2, kv_usage=0.5),
             "c": ReplicaLoad(num_running=2, kv_usage=0.1)}
    rr = RoundRobinPolicy()
    request = RouteRequest(10, {"b": 8})
    assert [rr.choose(request, loads) for _ in range(4)] == ["a", "b", "c", "a"]
    assert LeastLoadedPolicy().choose(request, loads) == "a"
    assert LeastLoadedPolicy().choose(request, {**loads, "a": ReplicaLoad(num_waiting=3)}) == "c"


def test_index_match_counts_leading_blocks_only():
    index = PrefixIndex()
    for r in ("a", "b"):
        index.add_replica(r)
    index.apply("a", [BlockStored((b"1", b"2", b"3"), None, None, BS)])
    index.apply("b", [BlockStored((b"1", b"3"), None, None, BS)])  # holds block 3 but not 2
    assert index.match([b"1", b"2", b"3", b"4"]) == {"a": 3, "b": 1}
    assert index.match([b"2"]) == {"a": 1} and index.match([]) == {}
    with pytest.raises(ValueError, match="already"):
        index.add_replica("a")


def test_index_mirrors_one_tier_and_skips_the_others():
    from jaxpaged.cache.events import AllBlocksCleared, BlockRemoved

    device, host = PrefixIndex(), PrefixIndex(tier="host")
    events = [BlockStored((b"1", b"2"), None, None, BS),
              BlockStored((b"1", b"9"), None, None, BS, "host"),
              BlockRemoved((b"2",), "host"),  # the host never held 2: the device copy stays
              AllBlocksCleared("disk")]
    for index in (device, host):
        index.add_replica("a")
        index.apply("a", events)
    assert device.blocks_of("a") == {b"1", b"2"}
    assert host.blocks_of("a") == {b"1", b"9"}
