"""`Engine.tenant_requests` (what the per-tenant admission limits count) against plain models: over random adds,
aborts and steps of three tenants on the simulated device, a tenant's unfinished requests are those added, not
aborted, whose final output has not come back, and its waiting ones are those of them with no sequence out of the waiting queue
(the walk over every request the count used before it was indexed by tenant)."""

import random

import pytest

from jaxpaged.engine import EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sequence import SeqStatus
from jaxpaged.sim.driver import make_sim_engine
from jaxpaged.sim.scenario import Deployment

TENANTS = ("alice", "bob", None)


def all_requests_walk(engine, tenant):
    """The rule as a walk over every request of the engine."""
    mine = [r for r in engine._requests.values() if r.tenant == tenant and r.seqs]
    return len(mine), sum(all(s.status is SeqStatus.WAITING for s in r.seqs) for r in mine)


@pytest.mark.parametrize("seed", range(3))
def test_tenant_counts_follow_adds_aborts_and_finishes(seed):
    rng = random.Random(seed)
    deployment = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=64 * 4 * 256, block_size=4)
    config = EngineConfig(model="tiny", block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=32)
    engine, _ = make_sim_engine(config, deployment.model_config, deployment.cost_model())
    live: dict[str, str | None] = {}  # request id -> tenant, added and neither aborted nor finished
    for i in range(200):
        action = rng.random()
        if action < 0.45:
            tenant = rng.choice(TENANTS)
            params = SamplingParams(max_tokens=rng.randint(1, 6), ignore_eos=True, n=rng.choice([1, 1, 2]))
            engine.add_request(f"r{i}", list(range(1, rng.randint(2, 20))), params, tenant=tenant)
            live[f"r{i}"] = tenant
        elif action < 0.55 and live:
            aborted = rng.choice(sorted(live))
            engine.abort(aborted)
            del live[aborted]  # no longer counted, though its final output comes with the next step
        else:
            for out in engine.step():
                if out.finished:
                    live.pop(out.request_id, None)
        for tenant in TENANTS:
            unfinished, waiting = engine.tenant_requests(tenant)
            assert unfinished == sum(t == tenant for t in live.values())
            assert (unfinished, waiting) == all_requests_walk(engine, tenant)
    assert engine.tenant_requests("nobody") == (0, 0)
