"""The cost model's sliding-window attention against a brute-force count per layer and query."""

import pytest

from jaxpaged.config import load_config
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import get_profile

W = 24
LAYER_TYPES = ("sliding_attention", "full_attention", "sliding_attention")


def brute_force(config, seqs):
    """(query, key) pairs and K/V tokens read, summed over layers, walking every query."""
    pairs = kv = 0
    for window in config.layer_windows:
        for n, c in seqs:
            pairs += sum(p + 1 if window is None else min(p + 1, window) for p in range(c, c + n))
            first_key = 0 if window is None else max(c - window + 1, 0)
            kv += c + n - first_key
    return pairs, kv


@pytest.mark.parametrize("seqs", [[(1, 0)], [(1, 5), (1, 23), (1, 24), (1, 100)], [(40, 0), (7, 20), (3, 60)]])
def test_windowed_attention_cost_counts_only_the_window(seqs):
    config = load_config("tiny").replace(num_layers=3, sliding_window=W, layer_types=LAYER_TYPES)
    model = CostModel(config, get_profile("h200-141gb"), block_size=8)
    cost = model.step_cost(seqs)
    pairs, kv = brute_force(config, seqs)
    per_layer_pair = model.attn_flops_per_pair / config.num_layers
    per_layer_token = model.kv_bytes_per_token / config.num_layers
    assert cost.attn_flops == pytest.approx(per_layer_pair * pairs, rel=1e-12)
    written = config.num_layers * sum(n for n, _ in seqs)  # every layer writes the new tokens
    assert cost.attn_bytes == pytest.approx(per_layer_token * (kv + written), rel=1e-12)
    full = CostModel(config.replace(sliding_window=None, layer_types=None), get_profile("h200-141gb"), block_size=8)
    assert cost.attn_flops <= full.step_cost(seqs).attn_flops
