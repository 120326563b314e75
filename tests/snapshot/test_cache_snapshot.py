"""Persistent prefix cache: snapshot to disk, restore into a new engine, refuse a mismatched snapshot."""

import json

import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.snapshot.store import META_FILE

BS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
RNG = np.random.default_rng(7)
PROMPT = [int(t) for t in RNG.integers(0, 250, 22)]
OTHER = [int(t) for t in RNG.integers(0, 250, 13)]


def _engine(model, **kw) -> Engine:
    kw.setdefault("num_blocks", 64)
    return Engine(EngineConfig(model="tiny", block_size=BS, **kw), model=model)


def _run(engine, requests):
    """requests: (id, prompt, cache_salt); returns {id: RequestOutput}."""
    for rid, prompt, salt in requests:
        engine.add_request(rid, prompt, GREEDY, cache_salt=salt)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step())
    return outs


def _full_blocks(prompt):
    """Tokens a prompt gets from a cache that holds it: full blocks, leaving one token to compute."""
    return (len(prompt) - 1) // BS * BS


def _kv_by_hash(engine):
    """{block hash: (K, V) of that block in every layer} from the engine's pool."""
    pool = engine.runner.pool
    return {b.block_hash: ([np.asarray(k[:, b.block_id]) for k in pool.k],
                           [np.asarray(v[:, b.block_id]) for v in pool.v])
            for b in engine.kv.cached_blocks()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model):
    """An engine that served PROMPT and a salted OTHER, shut down with save-on-shutdown."""
    path = tmp_path_factory.mktemp("snap") / "prefix-cache"
    engine = _engine(tiny_model, prefix_cache_snapshot=str(path), save_prefix_cache_on_shutdown=True)
    assert engine.kv.stats.num_cached_blocks == 0  # nothing there yet: a first start
    outs = _run(engine, [("a", PROMPT, None), ("b", OTHER, "tenant-1")])
    engine.shutdown()
    return path, engine, outs


def test_restored_snapshot_hits_first_request_with_identical_output(saved, tiny_model):
    path, first, outs = saved
    assert outs["a"].num_cached_tokens == 0
    engine = _engine(tiny_model, prefix_cache_snapshot=str(path))
    engine.kv.check_invariants()
    assert engine.kv.stats.num_cached_blocks == first.kv.stats.num_cached_blocks > 0
    # the K/V contents came back bit for bit, each under its hash
    before, after = _kv_by_hash(first), _kv_by_hash(engine)
    assert before.keys() == after.keys()
    for block_hash, (k, v) in before.items():
        for x, y in zip(k + v, after[block_hash][0] + after[block_hash][1]):
            np.testing.assert_array_equal(x, y)
    again = _run(engine, [("a2", PROMPT, None), ("b2", OTHER, "tenant-1"), ("b3", OTHER, None)])
    assert again["a2"].num_cached_tokens == _full_blocks(PROMPT) == 20
    assert again["b2"].num_cached_tokens == _full_blocks(OTHER) == 12  # the salt came back too
    assert again["b3"].num_cached_tokens == 0  # ...and still separates tenants
    assert again["a2"].outputs[0].token_ids == outs["a"].outputs[0].token_ids
    assert again["b2"].outputs[0].token_ids == outs["b"].outputs[0].token_ids
    engine.kv.check_invariants()


def test_restored_cache_reaches_into_the_generated_answer(saved, tiny_model):
    path, _, outs = saved
    engine = _engine(tiny_model)
    stats = engine.load_prefix_cache(str(path))
    restored = engine.kv.stats.num_cached_blocks
    assert (stats.num_restored, stats.num_skipped, stats.num_dropped) == (restored, 0, 0)
    turn2 = PROMPT + outs["a"].outputs[0].token_ids + [5, 6, 7]
    computed = len(PROMPT) + GREEDY.max_tokens - 1  # the last answer token never went through the model
    assert _run(engine, [("t2", turn2, None)])["t2"].num_cached_tokens == computed // BS * BS == 24


@pytest.mark.parametrize("change, field", [
    (dict(block_size=8), "block_size"),
    (dict(hash_algo="xxh3_128"), "hash_algo"),
    (dict(kv_cache_dtype="bfloat16"), "kv_cache_dtype"),
    (dict(model_seed=1), "params_fingerprint"),
    (dict(rope_theta=5e5), "model_config.rope_theta"),
])
def test_mismatched_snapshot_is_refused(saved, tiny_model, change, field):
    path = saved[0]
    model = tiny_model
    if "model_seed" in change:
        model = init_model(tiny_model.config, seed=change.pop("model_seed"))
    if "rope_theta" in change:
        model = init_model(tiny_model.config.replace(rope_theta=change.pop("rope_theta")), seed=0)
    kw = dict(block_size=BS, num_blocks=64) | change
    message = rf"different engine: {field}.* differs \(snapshot: .*, this engine: "
    with pytest.raises(ValueError, match=message):
        Engine(EngineConfig(model="tiny", prefix_cache_snapshot=str(path), **kw), model=model)


def test_tampered_block_is_skipped_not_served(saved, tiny_model, tmp_path):
    path = saved[0]
    copy = tmp_path / "snap"
    _engine(tiny_model, prefix_cache_snapshot=str(path)).save_prefix_cache(str(copy))
    meta = json.loads((copy / META_FILE).read_text())
    # change a token of PROMPT's third block: it and every block after it fail their hash
    tampered = next(b for b in meta["blocks"] if b["tokens"] == PROMPT[8:12])
    tampered["tokens"][0] = (tampered["tokens"][0] + 1) % 250
    (copy / META_FILE).write_text(json.dumps(meta))
    engine = _engine(tiny_model)
    stats = engine.load_prefix_cache(str(copy))
    assert stats.num_skipped >= 1 and stats.num_restored == len(meta["blocks"]) - stats.num_skipped
    engine.kv.check_invariants()
    out = _run(engine, [("a", PROMPT, None)])["a"]
    assert out.num_cached_tokens == 8  # the two blocks before the tampered one
    assert out.outputs[0].token_ids == saved[2]["a"].outputs[0].token_ids


def test_small_pool_keeps_the_hottest_chains(saved, tiny_model):
    path, first, _ = saved
    total = first.kv.stats.num_cached_blocks
    other_blocks = (len(OTHER) + GREEDY.max_tokens - 1) // BS  # b finished last: hottest
    engine = _engine(tiny_model, num_blocks=other_blocks + 1)
    stats = engine.load_prefix_cache(str(path))
    assert stats.num_restored == other_blocks and stats.num_dropped == total - other_blocks
    engine.kv.check_invariants()
    assert engine.kv.num_free_blocks == other_blocks + 1  # cached blocks are free (evictable)


def test_guards(saved, tiny_model, tmp_path):
    (tmp_path / "data").mkdir()
    engine = _engine(tiny_model)
    with pytest.raises(ValueError, match="not a prefix-cache snapshot; refusing"):
        engine.save_prefix_cache(str(tmp_path / "data"))
    with pytest.raises(ValueError, match="not a prefix-cache snapshot"):
        engine.load_prefix_cache(str(tmp_path / "data"))
    with pytest.raises(ValueError, match="needs a path"):
        engine.save_prefix_cache()
    with pytest.raises(ValueError, match="needs prefix_cache_snapshot"):
        EngineConfig(save_prefix_cache_on_shutdown=True)
    uncached = _engine(tiny_model, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="cannot restore .* prefix caching is disabled"):
        uncached.load_prefix_cache(str(saved[0]))
    with pytest.raises(ValueError, match="cannot save .* prefix caching is disabled"):
        uncached.save_prefix_cache(str(tmp_path / "off"))
    assert engine.save_prefix_cache(str(tmp_path / "empty")) == 0  # an empty cache round-trips
    assert _engine(tiny_model).load_prefix_cache(str(tmp_path / "empty")).num_restored == 0


def test_cached_blocks_lists_coldest_first_in_use_last():
    from jaxpaged.cache import KVCacheManager
    kv = KVCacheManager(8, BS)
    for seq, tokens in (("old", [1] * 8), ("new", [2] * 8), ("held", [3] * 4 + [9])):
        assert kv.allocate_new(seq, tokens, len(tokens), kv.match_prefix(tokens))
        kv.commit(seq, tokens, len(tokens))
    kv.free("old")
    kv.free("new")
    blocks = kv.cached_blocks()
    assert [b.token_ids[0] for b in blocks] == [1, 1, 2, 2, 3]  # eviction order, then the held block
    assert [b.ref_count for b in blocks] == [0, 0, 0, 0, 1]
    assert blocks[0].parent_hash == blocks[1].block_hash and blocks[1].parent_hash is None  # deepest first
    kv.check_invariants()


def test_host_tier_blocks_survive_a_restart(tmp_path, tiny_model):
    """Blocks evicted to the host tier are snapshotted too (tier "host") and hit after a restart."""
    path = tmp_path / "snap"
    config = dict(num_blocks=12, host_cache_bytes=1 << 20, prefix_cache_snapshot=str(path),
                  save_prefix_cache_on_shutdown=True)
    first = _engine(tiny_model, **config)
    before = _run(first, [("a", PROMPT, None)])["a"].outputs[0].token_ids
    evictor = [int(t) for t in np.random.default_rng(8).integers(0, 250, 32)]
    _run(first, [("evict", evictor, None)])  # needs 10 of 12 blocks: PROMPT's blocks go to the host
    host_hashes = [h for h, b in first.tiers.host.items() if b.data is not None]
    assert host_hashes
    first.shutdown()
    meta = json.loads((path / META_FILE).read_text())
    assert sum(b["tier"] == "host" for b in meta["blocks"]) == len(host_hashes)

    second = _engine(tiny_model, **config)
    assert [h for h, _ in second.tiers.host.items()] == host_hashes
    after = _run(second, [("a2", PROMPT, None)])["a2"].outputs[0].token_ids
    assert after == before
    assert second.tiers.stats.host_hits > 0

    no_tier = _engine(tiny_model, num_blocks=12)  # same identity, no host tier: those blocks are skipped
    stats = no_tier.load_prefix_cache(str(path))
    assert stats.num_skipped >= len(host_hashes)
