"""Tensor parallelism in the capacity planner, the cost model and the simulated deployment (hand-computed)."""

import pytest

from jaxpaged.bench.capacity import kv_capacity
from jaxpaged.config import load_config
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import DeviceProfile, get_profile
from jaxpaged.sim.scenario import Deployment

L70 = load_config("llama3-70b")  # 80 layers, 64 query / 8 KV heads, hidden 8192
BLOCK = 327_680 * 16  # bytes of one bf16 16-token block, all 8 KV heads


@pytest.mark.parametrize("n,shards", [(1, 1), (4, 4), (8, 8), (16, 8)])  # 16 > 8 KV heads: replicated
def test_capacity_per_device(n, shards):
    cap = kv_capacity(L70, budget_bytes=40 * 10**9, kv_dtype="bfloat16", tensor_parallel_size=n)
    assert cap.kv_shards == shards and cap.bytes_per_block_per_device == BLOCK // shards
    assert cap.num_blocks == 40 * 10**9 // (BLOCK // shards)
    assert cap.weight_bytes_per_device == -(-cap.weight_bytes // n)


def test_capacity_rejects_a_size_that_fits_neither_way():
    with pytest.raises(ValueError, match="divide the model's num_heads"):
        kv_capacity(L70, budget_bytes=10**9, tensor_parallel_size=3)


def test_cost_model_splits_work_and_adds_two_allreduces_per_layer():
    h100 = get_profile("h100-80gb")
    one, four = (CostModel(L70, h100, tensor_parallel_size=n) for n in (1, 4))
    assert four.weight_bytes == one.weight_bytes / 4
    assert four.kv_bytes_per_token == one.kv_bytes_per_token / 4
    assert four.layer_flops_per_token == one.layer_flops_per_token / 4
    batch = [(1, 1000)] * 32  # 32 decodes: 32 token rows
    ring = 2 * 3 / 4 * 32 * 8192 * 2  # ring all-reduce bytes through one link, one all-reduce
    allreduce = 160 * (ring / 450e9 + 10e-6)  # 80 layers x 2
    assert four.allreduce_time(32) == pytest.approx(allreduce)
    cost = four.step_cost(batch)
    phases = (max(cost.dense_flops / h100.peak_flops, cost.dense_bytes / h100.memory_bandwidth)
              + max(cost.attn_flops / h100.peak_flops, cost.attn_bytes / h100.memory_bandwidth))
    assert cost.time_s == pytest.approx(h100.step_overhead_s + phases + allreduce)
    assert four.decode_step_time(32, 32 * 1000, 1000) == four.step_time(batch)  # fast-forward: bit-equal
    assert one.allreduce_time(32) == 0.0


def test_cost_model_needs_an_interconnect():
    bare = DeviceProfile("bare", peak_flops=1e12, memory_bandwidth=1e12, step_overhead_s=0, memory_bytes=0)
    with pytest.raises(ValueError, match="no interconnect_bandwidth"):
        CostModel(L70, bare, tensor_parallel_size=2)


def test_deployment_per_device_memory():
    one = Deployment(profile="a100-80gb")
    with pytest.raises(ValueError, match="leave no room"):  # 141 GB of bf16 weights on one 80 GB device
        one.num_blocks()
    with pytest.raises(ValueError, match="kv_cache_bytes=100 holds no KV block"):  # not the weights' fault
        Deployment(profile="h100-80gb", tensor_parallel_size=4, kv_cache_bytes=100).num_blocks()
    four = Deployment(profile="h100-80gb", tensor_parallel_size=4)
    budget = 0.9 * 80 * 2**30 - L70.num_params() * 2 / 4
    assert four.num_blocks() == int(budget // (BLOCK / 4))
    assert four.cost_model().tensor_parallel_size == 4
