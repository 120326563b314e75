"""KV cache grouping (vLLM's equal-size groups) and the hybrid capacity arithmetic, against hand counts."""

import pytest

from jaxpaged.bench.capacity import hybrid_kv_capacity
from jaxpaged.cache.kv_groups import blocks_for_context, kv_cache_layout
from jaxpaged.config import load_config


def test_gemma3_27b_groups_like_vllm():
    """62 layers, every 6th full: 10 full and 52 sliding layers -> groups of 10: 1 full + 6 sliding (last of 2)."""
    config = load_config("gemma-3-27b")
    layout = kv_cache_layout(config.layer_windows)
    assert layout.num_tensors == 10
    assert layout.windows == (None,) + (1024,) * 6
    assert [len(g.layers) for g in layout.groups] == [10, 10, 10, 10, 10, 10, 2]
    assert layout.groups[0].layers == tuple(range(5, 62, 6))
    assert layout.layer_group[5] == 0 and layout.layer_tensor[5] == 0
    assert layout.layer_group[0] == 1 and layout.layer_tensor[0] == 0 and layout.layer_tensor[4] == 4
    # each tensor is used by at most one layer of each group
    for g, group in enumerate(layout.groups):
        assert sorted(layout.layer_tensor[i] for i in group.layers) == list(range(len(group.layers)))


def test_all_full_model_is_one_group_of_every_layer():
    layout = kv_cache_layout((None,) * 5)
    assert layout.num_groups == 1 and layout.num_tensors == 5 and not layout.is_hybrid
    assert layout.layer_tensor == (0, 1, 2, 3, 4)  # exactly today's one-array-per-layer pool


def test_all_sliding_model_is_one_group():
    layout = kv_cache_layout((4096,) * 4)
    assert layout.windows == (4096,) and layout.num_tensors == 4 and layout.is_hybrid


@pytest.mark.parametrize("window", [1, 7, 8, 9, 30])
@pytest.mark.parametrize("bs", [4, 8])
def test_blocks_for_context_counts_what_the_next_query_needs(window, bs):
    for ctx in range(1, 70):
        visible = {p // bs for p in range(max(ctx - window + 1, 0), ctx)}  # keys of the query at ctx
        if ctx % bs:
            visible.add(ctx // bs)  # the partly filled block the next token goes into
        first = min(visible) if visible else ctx // bs
        assert blocks_for_context(window, ctx, bs) == -(-ctx // bs) - first
        assert blocks_for_context(None, ctx, bs) == -(-ctx // bs)


def test_gemma3_27b_capacity_by_hand():
    """32K context, bf16: 8,192 KV bytes per layer per token (2 x 16 heads x 128 x 2 bytes)."""
    cap = hybrid_kv_capacity(load_config("gemma-3-27b"), budget_bytes=80 * 10**9, block_size=16,
                             context_len=32768, kv_dtype="bfloat16")
    per_layer_token = 2 * 16 * 128 * 2
    assert cap.full_bytes_per_seq == 62 * per_layer_token * 32768
    sliding_blocks = 2048 - (32768 - 1024 + 1) // 16  # 64: the blocks holding the last 1,023 keys
    assert cap.hybrid_blocks_per_seq == 2048 + 6 * sliding_blocks
    assert cap.hybrid_bytes_per_seq == cap.hybrid_blocks_per_seq * 16 * 10 * per_layer_token
    assert cap.hybrid_max_concurrent_seqs == (80 * 10**9 // (16 * 10 * per_layer_token)) // cap.hybrid_blocks_per_seq
    assert cap.full_max_concurrent_seqs == (80 * 10**9 // (16 * 62 * per_layer_token)) // 2048
