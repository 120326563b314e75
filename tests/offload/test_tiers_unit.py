"""KVTiers against a real pool, without the engine: transfers batched per step, ordering, swap bookkeeping."""

import jax.numpy as jnp
import numpy as np

from jaxpaged.cache import KVCacheManager
from jaxpaged.offload import HostKVCache, KVTiers
from jaxpaged.runner import ModelRunner

BS = 4


def _setup(tiny_model, num_blocks=4):
    runner = ModelRunner(tiny_model, num_blocks, BS, kv_dtype=jnp.float32)
    # every block holds its own id in K and minus its id in V, so moved data is recognisable
    blocks = [np.stack([np.full(runner.kv_block_shape[1:], i, np.float32),
                        np.full(runner.kv_block_shape[1:], -i, np.float32)]) for i in range(num_blocks)]
    runner.write_blocks(range(num_blocks), blocks)
    block_bytes = int(np.prod(runner.kv_block_shape)) * 4
    kv = KVCacheManager(num_blocks, BS)
    tiers = KVTiers(kv, HostKVCache(64 * block_bytes, block_bytes))
    return runner, kv, tiers


def test_block_evicted_and_restored_in_one_step_gets_its_old_data(tiny_model):
    runner, kv, tiers = _setup(tiny_model)
    prompt_a = list(range(100, 109))  # two full blocks + one token
    assert kv.allocate_new("a", prompt_a, 9, None)
    kv.commit("a", prompt_a, 9)
    a_blocks = kv.block_table("a")[:2]
    expected = runner.read_blocks(a_blocks)
    kv.free("a")
    # one "schedule": b takes every block (evicting a's two), then c's prefix match continues into the host
    assert kv.allocate_new("b", list(range(16)), 16, None)
    kv.free("b")
    prompt_c = prompt_a[:8] + [7, 7]
    match = kv.match_prefix(prompt_c)
    assert match.num_cached_tokens == 0
    restore = tiers.plan_restore("c", match, len(prompt_c), len(prompt_c))
    assert restore.num_tokens == 8 and all(block.data is None for block in restore.blocks)  # not landed yet
    assert kv.allocate_new("c", prompt_c, 10, match)
    tiers.admitted("c", restore)
    tiers.apply(runner)  # one gather (a's blocks, before they are overwritten), one scatter
    tiers.finish()
    assert tiers.stats.transfers_out == tiers.stats.transfers_in == 1 and tiers.idle
    restored = runner.read_blocks(kv.block_table("c")[:2])
    for got, want in zip(restored, expected):
        np.testing.assert_array_equal(got, want)


def test_swap_out_pins_and_drop_releases(tiny_model):
    runner, kv, tiers = _setup(tiny_model)
    assert kv.allocate_new("s", list(range(6)), 6, None)
    kv.commit("s", list(range(6)), 6)
    assert tiers.swap_out("s", 6)
    assert tiers.host.num_pinned == 2 and tiers.num_swapped_seqs == 1
    kv.free("s")
    tiers.apply(runner)
    tiers.finish()
    tiers.drop_swap("s")
    assert tiers.host.num_pinned == 0 and tiers.num_swapped_seqs == 0 and tiers.idle
