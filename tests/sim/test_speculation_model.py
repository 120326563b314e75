"""The cost model's speculation: acceptance length from a per-draft rate, verify-step cost, speedup by batch size."""

import numpy as np
import pytest

from jaxpaged.config import load_config
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import get_profile
from jaxpaged.sim.speculation import (acceptance_rate, mean_acceptance_length, project_speedup,
                                      project_workloads, verify_step_time)


@pytest.fixture(scope="module")
def cost():
    return CostModel(load_config("llama3-8b"), get_profile("h200-141gb"))


def test_mean_acceptance_length_is_the_simulated_one():
    """tau against a Monte Carlo of the rule: drafts accepted in order, each with probability alpha."""
    rng = np.random.default_rng(0)
    for alpha, k in [(0.0, 4), (0.6, 4), (0.9, 2), (1.0, 3)]:
        accepted = np.cumprod(rng.random((200_000, k)) < alpha, axis=1).sum(axis=1)
        assert mean_acceptance_length(alpha, k) == pytest.approx(1 + accepted.mean(), abs=0.01)
        if 0 < alpha < 1:
            assert acceptance_rate(mean_acceptance_length(alpha, k), k) == pytest.approx(alpha, abs=1e-9)
    with pytest.raises(ValueError, match="mean acceptance length"):
        acceptance_rate(6.0, 4)


def test_verify_step_costs_k_plus_one_tokens(cost):
    assert verify_step_time(cost, 8, 1024, 0) == cost.step_time([(1, 1024)] * 8)  # k = 0: a plain decode
    times = [verify_step_time(cost, 64, 1024, k) for k in range(6)]
    assert all(a < b for a, b in zip(times, times[1:]))
    # compute-bound at a large batch: the verify step's dense FLOPs are (k + 1) times a decode's
    p = cost.profile
    flops = (cost.layer_flops_per_token + cost.lm_head_flops_per_seq) * 5 * 512
    assert verify_step_time(cost, 512, 1024, 4) >= flops / p.peak_flops


def test_speedup_is_tau_when_memory_bound_and_falls_with_batch(cost):
    points = project_speedup(cost, [1, 8, 64, 256, 512], context=1024, k=4, tau=3.0)
    assert points[0].speedup == pytest.approx(3.0, rel=0.01)  # batch 1 on an H200: weight reads dominate
    speedups = [p.speedup for p in points]
    assert all(a >= b for a, b in zip(speedups, speedups[1:])) and speedups[-1] < 3.0 * 0.6


def test_each_workload_is_projected_at_its_own_acceptance_length(cost):
    result, table = project_workloads("llama3-8b", "h200-141gb", {"a": 3.0, "b": 1.5}, [1, 64], context=1024, k=4)
    for name, tau in (("a", 3.0), ("b", 1.5)):
        rows = [r for r in result["rows"] if r["workload"] == name]
        points = project_speedup(cost, [1, 64], context=1024, k=4, tau=tau)
        assert [r["speedup"] for r in rows] == [p.speedup for p in points]
        assert mean_acceptance_length(result["acceptance_rates"][name], 4) == pytest.approx(tau)
    assert table.count("\n| a |") == 2 and table.count("\n| b |") == 2
