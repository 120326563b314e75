"""Greedy outputs with the host tier, the disk tier and swap preemption equal plain recomputation."""

import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from tests.offload.tier_waves import waves

BS = 4
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TINY_BLOCK_BYTES = 2 * 2 * 2 * BS * 16 * 4  # K/V x layers x kv heads x block size x head dim x float32


def _run(engine, prompts, prefix="r", params=PARAMS):
    for i, p in enumerate(prompts):
        engine.add_request(f"{prefix}{i}", p, params)
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
    return [outs[f"{prefix}{i}"] for i in range(len(prompts))]



def _serve(model, **config):
    engine = Engine(EngineConfig(model="tiny", num_blocks=24, block_size=BS, max_num_batched_tokens=64,
                                 pool_fill_value=float("nan"), **config), model=model)
    outs = [_run(engine, wave, prefix=f"w{i}-") for i, wave in enumerate(waves())]
    return engine, [[o.outputs[0].token_ids for o in wave] for wave in outs], outs


@pytest.fixture(scope="module")
def recomputed(tiny_model):
    """The reference: no prefix caching at all, so every token is recomputed."""
    return _serve(tiny_model, enable_prefix_caching=False)[1]


def _assert_no_leaks(engine):
    stats = engine.kv.stats
    assert stats.num_used_blocks == 0 and stats.num_free_blocks == engine.num_blocks
    engine.kv.check_invariants()
    tiers = engine.tiers
    assert tiers.idle and tiers.num_swapped_seqs == 0 and tiers.host.num_pinned == 0
    assert tiers.host.used_bytes <= engine.config.host_cache_bytes


def test_host_tier_hits_equal_recompute(tiny_model, recomputed):
    engine, tokens, outs = _serve(tiny_model, host_cache_bytes=1 << 20)
    assert tokens == recomputed
    stats = engine.tiers.stats
    assert stats.offloaded > 0 and stats.host_hits > 0
    # the third wave's shared prefixes came back from the host: 40 and 28 tokens (full blocks)
    assert [o.num_cached_tokens for o in outs[2][:2]] == [40, 28]
    assert stats.transfers_out <= engine.stats.num_steps  # batched: at most one transfer per step
    _assert_no_leaks(engine)


def test_without_host_tier_the_prefix_is_recomputed(tiny_model, recomputed):
    """Control for the test above: the same workload without the tier really loses the prefix."""
    engine, tokens, outs = _serve(tiny_model)
    assert tokens == recomputed
    assert engine.tiers is None and outs[2][0].num_cached_tokens < 40


def test_disk_tier_behind_a_small_host_tier(tiny_model, recomputed, tmp_path):
    config = dict(host_cache_bytes=4 * TINY_BLOCK_BYTES, disk_cache_dir=str(tmp_path),
                  disk_cache_bytes=1 << 20)  # host: 4 blocks only, so most go on to disk
    engine, tokens, _ = _serve(tiny_model, **config)
    assert tokens == recomputed
    assert engine.tiers.stats.disk_hits > 0
    _assert_no_leaks(engine)
    # a fresh engine over the same directory (same weights, same format) hits the disk from the start
    fresh = Engine(EngineConfig(model="tiny", num_blocks=24, block_size=BS, **config), model=tiny_model)
    assert [o.outputs[0].token_ids for o in _run(fresh, waves()[2])] == recomputed[2]
    assert fresh.tiers.stats.disk_hits > 0


def test_flipped_byte_on_disk_is_recomputed_not_read(tiny_model, recomputed, tmp_path):
    config = dict(host_cache_bytes=4 * TINY_BLOCK_BYTES, disk_cache_dir=str(tmp_path))
    engine = Engine(EngineConfig(model="tiny", num_blocks=24, block_size=BS, **config), model=tiny_model)
    first, filler, again = waves()
    _run(engine, first + filler)
    files = sorted(tmp_path.glob("*.kvblk"))
    assert files
    for path in files:  # flip one payload byte in every block file
        blob = bytearray(path.read_bytes())
        blob[-5] ^= 0x40
        path.write_bytes(bytes(blob))
    assert [o.outputs[0].token_ids for o in _run(engine, again, prefix="a")] == recomputed[2]
    assert engine.tiers.disk.num_corrupt > 0


def test_swap_preemption_equals_recompute(tiny_model):
    rng = np.random.default_rng(9)
    prompts = [list(rng.integers(0, 250, 24)) for _ in range(6)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def serve(num_blocks=20, **config):
        engine = Engine(EngineConfig(model="tiny", num_blocks=num_blocks, block_size=BS,
                                     max_num_batched_tokens=32, pool_fill_value=float("nan"), **config),
                        model=tiny_model)
        return engine, [o.outputs[0].token_ids for o in _run(engine, prompts, params=params)]

    # recompute preemption without prefix caching: equal to running alone (tests/engine/test_engine_parity.py)
    _, reference = serve(enable_prefix_caching=False)
    engine, tokens = serve(host_cache_bytes=1 << 20, preemption_mode="swap")
    assert engine.scheduler.num_preemptions > 0
    assert engine.tiers.stats.swapped_out > 0 and engine.tiers.stats.swapped_in > 0
    assert tokens == reference
    _assert_no_leaks(engine)
    # a host tier too small to hold a swap falls back to recompute, still correct
    tight, tokens = serve(host_cache_bytes=2 * TINY_BLOCK_BYTES, preemption_mode="swap")
    assert tight.tiers.stats.swap_fallbacks > 0 and tokens == reference
    _assert_no_leaks(tight)


@pytest.mark.parametrize("kwargs,match", [
    (dict(host_cache_bytes=0), "host_cache_bytes must be at least 1"),
    (dict(host_cache_bytes=10), "smaller than one KV block"),
    (dict(disk_cache_dir="/tmp/x"), "needs the host tier"),
    (dict(preemption_mode="swap"), "needs the host tier"),
    (dict(preemption_mode="teleport"), "preemption_mode must be one of"),
    (dict(host_cache_bytes=1 << 20, disk_cache_dir="/tmp/x", disk_cache_bytes=0), "disk_cache_bytes must be"),
])
def test_bad_tier_options_are_rejected(tiny_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Engine(EngineConfig(model="tiny", num_blocks=8, block_size=BS, **kwargs), model=tiny_model)


def test_aborting_swapped_requests_releases_the_host_tier(tiny_model):
    rng = np.random.default_rng(9)
    engine = Engine(EngineConfig(model="tiny", num_blocks=20, block_size=BS, max_num_batched_tokens=32,
                                 host_cache_bytes=1 << 20, preemption_mode="swap"), model=tiny_model)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for i in range(6):
        engine.add_request(str(i), list(rng.integers(0, 250, 24)), params)
    while engine.tiers.num_swapped_seqs == 0:
        assert engine.has_unfinished_requests(), "the workload was meant to swap"
        engine.step()
    for i in range(6):
        engine.abort(str(i))
    engine.step()
    _assert_no_leaks(engine)
