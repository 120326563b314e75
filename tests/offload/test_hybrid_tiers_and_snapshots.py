"""Host/disk tiers, prefix-cache snapshots, the contiguous baseline and residency sampling for a
sliding-window model (KV cache groups: one sliding group of window W, one full group).

One runner (one set of compiled steps) serves every engine here; before each
restore the whole pool is filled with NaN, so a token can only be right if the
restored blocks really came back from the tier or the snapshot, and a sliding
group that read a block outside its window (never restored, NaN) would turn
the outputs into NaN. The references are a run without prefix caching on the
same weights and the dense no-cache forward. The model also caps its attention
logits (Gemma 2's `attn_logit_softcapping`), so the paged path's cap is checked
against the dense forward's on the way.
"""

import numpy as np
import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.snapshot.identity import check_identity
from tests.engine.test_sliding_window_engine import _run, assert_dense_greedy

W, BS, NB, PREFIX = 16, 4, 48, 64
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
# a restore of the 64-token prefix: the full group all 16 blocks, the sliding group the blocks holding
# the W - 1 tokens before token 64 (blocks 12..15): what vLLM's SlidingWindowManager needs for a hit
FULL_BLOCKS, WINDOW_BLOCKS = PREFIX // BS, PREFIX // BS - (PREFIX - W + 1) // BS


@pytest.fixture(scope="module")
def model():
    config = load_config("tiny").replace(sliding_window=W, layer_types=("sliding_attention", "full_attention"),
                                         attn_logit_softcapping=1.0)
    return init_model(config, seed=3)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    prefix = list(rng.integers(0, 250, PREFIX))
    return {"a": prefix + list(rng.integers(0, 250, 30)), "b": prefix + list(rng.integers(0, 250, 25)),
            "fill": [list(rng.integers(0, 250, 94)) for _ in range(2)], "short": list(rng.integers(0, 250, 40))}


@pytest.fixture(scope="module")
def reference(model, prompts):
    """The runner every engine shares, and prompt b's tokens recomputed from scratch (dense-checked)."""
    engine = Engine(EngineConfig(model="tiny", num_blocks=NB, block_size=BS, max_num_batched_tokens=32,
                                 enable_prefix_caching=False, pool_fill_value=float("nan")), model=model)
    (out,) = _run(engine, [prompts["b"]], PARAMS)
    assert_dense_greedy(model, prompts["b"], out.outputs[0].token_ids)
    fills = [o.outputs[0].token_ids for o in _run(engine, prompts["fill"], PARAMS)]
    return engine.runner, out.outputs[0].token_ids, fills


def _engine(runner, **config):
    return Engine(EngineConfig(model="tiny", num_blocks=NB, block_size=BS, max_num_batched_tokens=32, **config),
                  runner=runner)


def _poison(runner):
    runner.write_blocks(list(range(NB)), [np.full(runner.kv_block_shape, np.nan, np.float32)] * NB)


def _evict_to_tiers(engine, prompts):
    """Prompt a, then two unrelated prompts that evict all of a's blocks (offloaded); then the device
    cache is dropped and the pool poisoned, so only the tiers can give a's prefix back."""
    _poison(engine.runner)
    _run(engine, [prompts["a"]], PARAMS)
    for i, fill in enumerate(prompts["fill"]):
        _run(engine, [fill], PARAMS)
    assert engine.kv.reset_prefix_cache()
    _poison(engine.runner)


def _assert_clean(engine):
    assert engine.kv.stats.num_used_blocks == 0
    engine.kv.check_invariants()
    assert engine.tiers is None or (engine.tiers.idle and engine.tiers.host.num_pinned == 0)


def test_host_tier_restores_each_group_its_own_blocks(reference, prompts):
    runner, expected, _ = reference
    engine = _engine(runner, host_cache_bytes=1 << 22)
    engine.kv.enable_events()
    _evict_to_tiers(engine, prompts)
    (out,) = _run(engine, [prompts["b"]], PARAMS)
    assert out.outputs[0].token_ids == expected
    assert out.num_cached_tokens == PREFIX
    assert engine.tiers.stats.host_hits == FULL_BLOCKS + WINDOW_BLOCKS  # nothing outside the window
    events = engine.kv.take_events()
    hashes = [h for e in events for h in getattr(e, "block_hashes", ())]
    assert hashes and {len(h) for h in hashes} == {32}  # group-tagged keys never reach the router
    _assert_clean(engine)


def test_tier_serves_the_sliding_group_where_the_device_serves_the_full_one(reference, prompts):
    """A short filler evicts (LRU) only a's sliding blocks, which slid out or were freed first: the
    device alone serves no hit, the full group's device blocks plus the window from the host serve 64."""
    runner, expected, _ = reference
    engine = _engine(runner, host_cache_bytes=1 << 22)
    _poison(runner)
    _run(engine, [prompts["a"]], PARAMS)
    _run(engine, [prompts["short"]], PARAMS)
    assert engine.kv.match_prefix(prompts["b"]).num_cached_tokens == 0
    (out,) = _run(engine, [prompts["b"]], PARAMS)
    assert out.outputs[0].token_ids == expected
    assert out.num_cached_tokens == PREFIX
    assert engine.tiers.stats.host_hits == WINDOW_BLOCKS
    _assert_clean(engine)


def test_disk_tier_behind_a_small_host_tier(reference, prompts, tmp_path):
    runner, expected, _ = reference
    block_bytes = int(np.prod(runner.kv_block_shape)) * 4
    engine = _engine(runner, host_cache_bytes=6 * block_bytes, disk_cache_dir=str(tmp_path))
    _evict_to_tiers(engine, prompts)
    (out,) = _run(engine, [prompts["b"]], PARAMS)
    assert out.outputs[0].token_ids == expected
    assert out.num_cached_tokens == PREFIX
    assert engine.tiers.stats.disk_hits > 0
    _assert_clean(engine)


@pytest.mark.parametrize("caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_swap_preemption_brings_back_each_groups_blocks(reference, prompts, caching):
    """Two unrelated 94-token prompts need ~2 x 29 blocks of 48: one is preempted, swapped out and back
    (with the prefix cache, the blocks still cached on the device first, the host's after them)."""
    runner, _, expected = reference
    _poison(runner)
    engine = _engine(runner, host_cache_bytes=1 << 22, preemption_mode="swap", enable_prefix_caching=caching)
    outs = _run(engine, prompts["fill"], PARAMS)
    assert [o.outputs[0].token_ids for o in outs] == expected
    stats = engine.tiers.stats
    assert engine.scheduler.num_preemptions > 0 and stats.swapped_in > 0 and stats.swap_fallbacks == 0
    _assert_clean(engine)
    assert engine.tiers.num_swapped_seqs == 0


def test_snapshot_restores_each_group_into_a_poisoned_pool(reference, prompts, tmp_path):
    runner, expected, _ = reference
    engine = _engine(runner)
    _run(engine, [prompts["a"]], PARAMS)
    saved = engine.save_prefix_cache(tmp_path / "snap")
    assert saved == len(engine.kv.cached_blocks())
    _poison(runner)
    restored = _engine(runner, prefix_cache_snapshot=str(tmp_path / "snap"))
    assert {b.block_hash for b in restored.kv.cached_blocks()} == {b.block_hash for b in engine.kv.cached_blocks()}
    (out,) = _run(restored, [prompts["b"]], PARAMS)
    assert out.outputs[0].token_ids == expected
    assert out.num_cached_tokens == PREFIX
    _assert_clean(restored)

    identity = restored.snapshot_identity()
    assert identity["kv_cache_groups"] == [[None, [1]], [W, [0]]]
    with pytest.raises(ValueError, match="kv_cache_groups differs"):
        check_identity(dict(identity, kv_cache_groups=[[None, [0, 1]]]), identity, "snap")


def test_contiguous_baseline_treats_every_layer_as_full(reference, prompts):
    """Each group reserves max_model_len: 2 x 24 blocks, the whole pool, for one sequence."""
    runner, expected, _ = reference
    _poison(runner)
    engine = _engine(runner, kv_layout="contiguous", enable_prefix_caching=False)
    assert engine.max_model_len == (NB // 2) * BS and engine.kv.region_blocks == NB
    (out,) = _run(engine, [prompts["b"]], PARAMS)
    assert out.outputs[0].token_ids == expected
    assert out.metrics.peak_blocks_unshared == NB
    engine.kv.check_invariants()


def test_residency_sampling_follows_every_groups_blocks(reference, prompts):
    runner, _, _ = reference
    ticks = iter(range(10**6))
    engine = Engine(EngineConfig(model="tiny", num_blocks=NB, block_size=BS, max_num_batched_tokens=32,
                                 kv_cache_metrics_sample=1.0), runner=runner, clock=lambda: float(next(ticks)))
    _run(engine, [prompts["a"]], PARAMS)
    match = engine.kv.match_prefix(prompts["a"])
    _run(engine, [prompts["a"]], PARAMS)
    residency = engine.kv.residency
    assert len(residency.reuse_gaps) == len(match.matched) > 0  # every hit block, both groups
    for i, fill in enumerate(prompts["fill"]):
        _run(engine, [fill], PARAMS)
    assert len(residency.lifetimes) == len(residency.idle_before_evict) == engine.kv.stats.num_evictions > 0
    assert all(idle >= 0 for idle in residency.idle_before_evict)
    _assert_clean(engine)
