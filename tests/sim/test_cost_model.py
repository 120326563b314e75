"""Cost-model arithmetic against hand-computed numbers."""

import pytest

from jaxpaged.config import ModelConfig, load_config
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import DeviceProfile, get_profile

# hidden 8, 2 layers, 2 query heads and 1 KV head of dim 4, MLP 16, vocab 32:
#   per-layer matmul params = 2*8*8 (q, o) + 2*8*4 (k, v) + 3*8*16 (mlp) = 576
#   dense FLOPs per token   = 2 * 2 layers * 576 = 2304;  LM head per sequence = 2*32*8 = 512
#   weight bytes (2 B)      = (2*576 + 32*8) * 2 = 2816
#   attention FLOPs / pair  = 4 * 2 layers * (2*4) = 64;  KV bytes / token (2 B) = 2*2*1*4*2 = 32
CFG = ModelConfig(name="hand", vocab_size=32, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                  head_dim=4, intermediate_size=16)
BATCH = [(3, 5), (1, 10)]  # a 3-token chunk after 5 cached tokens, a decode at context 10


def _model(peak, bw, padded=False, step=1.0, per_seq=0.5, block_size=4):
    profile = DeviceProfile("hand", peak_flops=peak, memory_bandwidth=bw, step_overhead_s=step,
                            memory_bytes=0, padded_shapes=padded, per_seq_overhead_s=per_seq)
    return CostModel(CFG, profile, weight_bytes_per_param=2, kv_bytes_per_element=2, block_size=block_size)


def test_exact_flops_and_bytes():
    # tokens 4, rows 2; causal pairs 3*5 + (1+2+3) + 1*10 + 1 = 32; KV read 8 + 11, written 4 -> 23 tokens
    cost = _model(1000, 100).step_cost(BATCH)
    assert cost.dense_flops == 2304 * 4 + 512 * 2 == 10240
    assert cost.dense_bytes == 2816
    assert cost.attn_flops == 64 * 32 == 2048
    assert cost.attn_bytes == 32 * 23 == 736


def test_memory_bound_time():
    # 1 + 2*0.5 overhead + max(10.24, 28.16) + max(2.048, 7.36)
    assert _model(1000, 100).step_time(BATCH) == pytest.approx(37.52)


def test_compute_bound_time():
    # 1 + 1 + max(102.4, 0.2816) + max(20.48, 0.0736)
    assert _model(100, 10_000).step_time(BATCH) == pytest.approx(124.88)


def test_padded_shapes_follow_the_bucketed_step():
    # 1 decode row; 1 prefill row of 3 tokens -> prefill tokens 16, query bucket 16 (one tile of 16 rows).
    # The decode walks whole blocks to its context of 11: 3 blocks of 4 = 12 keys; the prefill's tile
    # walks to position 5 + 16 but its context ends at 8: 2 blocks = 8 keys, for each of its 16 rows.
    # pairs = 1*12 + 16*8 = 140; tokens = 1 + 16; rows 2; KV read 12 + 8, written 4
    cost = _model(1000, 100, padded=True).step_cost(BATCH)
    assert cost.dense_flops == 2304 * 17 + 512 * 2 == 40192
    assert cost.attn_flops == 64 * 140 == 8960
    assert cost.attn_bytes == 32 * 24 == 768


def test_padded_prefill_tiles_stop_at_their_last_query():
    # one 300-token chunk after 100 cached tokens, block 4: query bucket 512 -> 4 tiles of 128 rows;
    # tile t walks to min(400, 100 + 128 (t + 1)) keys: 228, 356, 400, 400
    cost = _model(1000, 100, padded=True).step_cost([(300, 100)])
    assert cost.attn_flops == 64 * 128 * (228 + 356 + 400 + 400)
    assert cost.attn_bytes == 32 * ((228 + 356 + 400 + 400) + 300)  # each tile reads its keys; 300 written


def test_padded_decodes_walk_to_the_longest_context():
    # three decodes (bucket 4 rows) at contexts 3, 20 and 9, block 4: every row walks 6 blocks = 24 keys
    cost = _model(1000, 100, padded=True).step_cost([(1, 3), (1, 20), (1, 9)])
    assert cost.attn_flops == 64 * 4 * 24
    model = _model(1000, 100, padded=True)
    assert model.decode_step_time(3, 3 + 20 + 9, 20) == model.step_time([(1, 3), (1, 20), (1, 9)])


def test_copy_time_reads_and_writes_each_block():
    # 3 blocks of 4 tokens * 32 B, read and written, at 100 B/s
    assert _model(1000, 100).copy_time(3) == pytest.approx(2 * 3 * 4 * 32 / 100)


def test_llama3_70b_bytes():
    cfg = load_config("llama3-70b")
    model = CostModel(cfg, get_profile("a100-80gb"), weight_bytes_per_param=2, kv_bytes_per_element=2)
    assert model.kv_bytes_per_token == 327_680  # 2 (K, V) * 80 layers * 8 heads * 128 dims * 2 B
    h = cfg.hidden_size
    norms = 2 * h * cfg.num_layers + h
    # every weight but the embedding table (gathered) and the norms is read each step
    assert model.weight_bytes == 2 * (cfg.num_params() - cfg.vocab_size * h - norms)
    assert 139e9 < model.weight_bytes < 142e9  # fp16 70B: ~140 GB, more than one 80 GB card


def test_a100_decode_of_70b_is_memory_bound():
    # one decode token: the weights dominate; time ~ bytes / 2.039 TB/s
    model = CostModel(load_config("llama3-70b"), get_profile("a100-80gb"), weight_bytes_per_param=0.5)
    cost = model.step_cost([(1, 1000)])
    expected = 50e-6 + cost.dense_bytes / 2.039e12 + cost.attn_bytes / 2.039e12
    assert cost.time_s == pytest.approx(expected)


def test_bad_profile_rejected():
    with pytest.raises(ValueError):
        DeviceProfile("x", peak_flops=0, memory_bandwidth=1, step_overhead_s=0, memory_bytes=0)
    with pytest.raises(ValueError, match="unknown device profile"):
        get_profile("tpu-v9")
