"""Simulated replicas behind the router: one replica equals the single-engine driver; routing keeps prefixes."""

import dataclasses

import pytest

from jaxpaged.router import LeastLoadedPolicy, PrefixAwarePolicy, RoundRobinPolicy
from jaxpaged.sim.cluster import simulate_cluster
from jaxpaged.sim.driver import make_sim_engine, simulate
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.workloads import assign_arrivals, make_workload

TINY = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=200 * 4 * 256, block_size=4,
                  max_num_seqs=8, max_num_batched_tokens=64)  # 200 blocks of 4 tokens (256 B per token)
SMALL = dict(user_len=16, output_len=8)


def _multiturn(num_requests, rate, seed=0):
    return assign_arrivals(make_workload("multiturn", num_requests=num_requests, seed=seed, **SMALL), rate, seed)


@pytest.mark.parametrize("workload", ["chatbot", "multiturn"])
def test_one_replica_equals_the_single_engine_driver(workload):
    scales = dict(system_len=24, **SMALL) if workload == "chatbot" else SMALL
    requests = assign_arrivals(make_workload(workload, num_requests=24, seed=1, **scales), 400.0, 1)
    engine, clock = make_sim_engine(TINY.engine_config(), TINY.model_config, TINY.cost_model())
    reference = simulate(engine, clock, [dataclasses.replace(r) for r in requests], decode_fast_forward=False)
    result = simulate_cluster(TINY, 1, RoundRobinPolicy(), [dataclasses.replace(r) for r in requests])
    by_id = lambda records: sorted(records, key=lambda r: r.request_id)
    assert by_id(result.records) == by_id(reference.records)
    assert result.prefix_hit_rate > 0


def test_prefix_aware_routing_keeps_conversations_on_their_replica():
    requests = _multiturn(60, rate=200.0)  # 15 conversations: round robin does not keep them by chance
    results = {policy.name: simulate_cluster(TINY, 4, policy, [dataclasses.replace(r) for r in requests])
               for policy in (RoundRobinPolicy(), LeastLoadedPolicy(), PrefixAwarePolicy())}
    for result in results.values():
        assert len(result.records) == 60
    aware = results["prefix_aware"]
    assert aware.prefix_hit_rate > results["round_robin"].prefix_hit_rate
    assert aware.prefix_hit_rate > results["least_loaded"].prefix_hit_rate
    # under this light load every later turn goes where its conversation's history is cached
    replica = aware.replica_of
    for r in requests:
        if r.turn > 0:
            assert replica[r.request_id] == replica[f"multiturn-{r.conversation_id}-t{r.turn - 1}"]
    assert len(set(replica.values())) == 4  # and new conversations still spread over every replica


def test_bad_replica_count():
    with pytest.raises(ValueError, match="num_replicas"):
        simulate_cluster(TINY, 0, RoundRobinPolicy(), [])
