"""A reset scoped to a cache namespace (a tenant's ``/reset_prefix_cache``) against a plain-Python model of
the rule: the entries dropped are exactly those of free cached blocks whose chain's salt is in the namespace
(salts known here from the requests' own salts, not from the blocks), pinned ones included; blocks in use and
every other namespace keep theirs, and the manager's invariants hold."""

import random

import pytest

from jaxpaged.cache import KVCacheManager
from jaxpaged.cache.hashing import hash_request_blocks
from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.cache.namespaces import namespace_salt, salt_in_namespace
from tests.cache.cache_test_helpers import prefill

BS = 4
SALTS = [None, "free-form", namespace_salt(("tenant", "alice")), namespace_salt(("tenant", "alice", "sub")),
         namespace_salt(("tenant", "alice2")), namespace_salt(("tenant", "bob"))]


def test_an_empty_or_malformed_namespace_is_refused_and_nothing_is_dropped():
    mgr = KVCacheManager(8, BS)
    prefill(mgr, "a", list(range(9)), cache_salt=namespace_salt(("tenant", "alice")))
    mgr.free("a")
    for bad in ((), "tenant", ("tenant", 1)):
        with pytest.raises(ValueError, match="namespace must be a non-empty sequence of strings"):
            mgr.reset_prefix_cache(bad)
    assert mgr.stats.num_cached_blocks == 2


def test_namespace_membership():
    alice = ("tenant", "alice")
    assert salt_in_namespace(namespace_salt(alice), alice)
    assert salt_in_namespace(namespace_salt(alice + ("x",)), alice)
    for salt in (None, "free-form", "[1]", namespace_salt(("tenant", "alice2")), namespace_salt(("tenant",))):
        assert not salt_in_namespace(salt, alice), salt


@pytest.mark.parametrize("seed", range(12))
def test_scoped_reset_drops_exactly_the_free_blocks_of_the_namespace(seed):
    rng = random.Random(seed)
    mgr = KVCacheManager(48, BS)
    salt_of_hash: dict[bytes, str | None] = {}  # the model: each block hash's salt, from the requests
    live: dict[str, tuple[list[int], str | None]] = {}
    for step in range(rng.randint(6, 14)):
        tokens = [rng.randint(1, 3) for _ in range(rng.randint(5, 17))]  # small alphabet: shared prefixes
        salt = rng.choice(SALTS)
        seq = f"s{step}"
        if mgr.max_blocks_for(len(tokens)) > mgr._pool.num_free:
            break
        prefill(mgr, seq, tokens, cache_salt=salt)
        for h in hash_request_blocks(tokens, BS, salt):
            salt_of_hash[h] = salt
        live[seq] = (tokens, salt)
        if rng.random() < 0.6:
            mgr.free(seq)
            del live[seq]
        if rng.random() < 0.3:
            mgr.pin_prefix(tokens, 60.0, cache_salt=salt)
    namespace = rng.choice([("tenant", "alice"), ("tenant", "bob"), ("tenant", "alice", "sub")])
    held = {h for tokens, salt in live.values() for h in hash_request_blocks(tokens, BS, salt)}
    before = set(mgr._pool.cached)
    expected = {h for h in before if h in held or not salt_in_namespace(salt_of_hash[h], namespace)}
    assert mgr.reset_prefix_cache(namespace)
    assert set(mgr._pool.cached) == expected
    mgr.check_invariants()
    for seq in list(live):
        mgr.free(seq)
    mgr.check_invariants()


def test_restored_blocks_keep_their_chains_salt():
    alice, bob = namespace_salt(("tenant", "alice")), namespace_salt(("tenant", "bob"))
    source = KVCacheManager(16, BS)
    prefill(source, "a", list(range(13)), cache_salt=alice)
    prefill(source, "b", list(range(13)), cache_salt=bob)
    source.free("a")
    source.free("b")
    entries = [(b.block_hash, b.parent_hash, b.token_ids, b.extra_keys) for b in source.cached_blocks()]
    rng = random.Random(0)
    rng.shuffle(entries)  # restore order is not chain order
    restored = KVCacheManager(16, BS)
    assert None not in restored.cache_restored_blocks(entries)
    restored.reset_prefix_cache(("tenant", "alice"))
    assert set(restored._pool.cached) == set(hash_request_blocks(list(range(13)), BS, bob))
    restored.check_invariants()


def test_a_scoped_reset_reports_removed_hashes_and_the_whole_reset_still_refuses_while_in_use():
    mgr = KVCacheManager(16, BS)
    log = mgr.enable_events()
    alice = namespace_salt(("tenant", "alice"))
    prefill(mgr, "a", list(range(9)), cache_salt=alice)
    prefill(mgr, "b", list(range(9)), cache_salt=namespace_salt(("tenant", "bob")))
    mgr.free("a")
    log.take()
    assert mgr.reset_prefix_cache(("tenant", "alice"))  # never refused, though bob's blocks are in use
    removed = [h for event in log.take() for h in event.block_hashes]
    assert sorted(removed) == sorted(hash_request_blocks(list(range(9)), BS, alice))
    assert not mgr.reset_prefix_cache()


def test_a_sliding_window_model_drops_the_namespaces_blocks_in_every_group():
    mgr = KVCacheManager(64, BS, kv_cache_layout((None, 8)))
    alice, bob = namespace_salt(("tenant", "alice")), namespace_salt(("tenant", "bob"))
    for seq, salt in (("a", alice), ("b", bob), ("c", alice)):
        prefill(mgr, seq, list(range(1, 14)) + [len(seq)], cache_salt=salt)
    mgr.free("a")
    mgr.free("b")
    before = {key: block.cache_salt for key, block in mgr._pool.cached.items()}
    assert set(before.values()) == {alice, bob} and len(before) > 6  # both groups' keys, both tenants
    held = {b for b in mgr.held_blocks("c")}
    mgr.reset_prefix_cache(("tenant", "alice"))
    after = {key: block.cache_salt for key, block in mgr._pool.cached.items()}
    assert {k for k, s in before.items() if s == bob} <= set(after)
    assert {mgr._pool.cached[k].block_id for k, s in after.items() if s == alice} <= held  # only c's blocks
    assert any(s == alice for s in after.values())
    mgr.check_invariants()
