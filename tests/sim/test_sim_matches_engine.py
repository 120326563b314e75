"""The simulated engine makes the real engine's scheduling decisions on the same trace."""

import dataclasses

import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import GPU_PROFILES
from jaxpaged.sim.runner import SimClock, SimulatedRunner
from jaxpaged.sim.validate import serve_all_at_once
from jaxpaged.sim.workloads import make_workload

# 12 requests sharing a 32-token system prompt; 4-token blocks; 40 blocks hold about 3 requests at
# full length, so admission outruns the pool and the scheduler preempts.
CONFIG = EngineConfig(model="tiny", block_size=4, num_blocks=40, max_num_seqs=8, max_num_batched_tokens=32)


def _trace():
    return make_workload("chatbot", num_requests=12, seed=3, system_len=32, user_len=20, output_len=10)


def _record(engine: Engine, requests):
    steps, outputs = [], {}
    for r in requests:
        engine.add_request(r.request_id, r.prompt_token_ids,
                           SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
        steps.append(list(engine.stats.last_step_batch))
    cached = {rid: o.num_cached_tokens for rid, o in outputs.items()}
    preempted = {rid: o.metrics.num_preemptions for rid, o in outputs.items()}
    return steps, engine.scheduler.num_preemptions, cached, preempted


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_simulated_and_real_engines_decide_alike(tiny_model, async_scheduling):
    config = dataclasses.replace(CONFIG, async_scheduling=async_scheduling)
    requests = _trace()
    real = _record(Engine(config, model=tiny_model), requests)
    clock = SimClock()
    tiny = load_config("tiny")
    runner = SimulatedRunner(tiny, CostModel(tiny, GPU_PROFILES["a100-80gb"], block_size=config.block_size), clock,
                             num_blocks=config.num_blocks)
    sim = _record(Engine(config, runner=runner, clock=clock), requests)

    steps, preemptions, cached, preempted = real
    assert preemptions > 0, "the pool was meant to force preemptions"
    assert any(cached.values()), "the shared prompt was meant to hit the cache"
    assert sim[0] == steps  # same (request, sequence, tokens) in every step
    assert sim[1] == preemptions
    assert sim[2] == cached
    assert sim[3] == preempted
    assert runner.num_compiles == 0 and runner.num_steps == len([s for s in steps if s])
    assert clock() > 0


def test_serve_all_at_once_finishes_every_request():
    clock = SimClock()
    cfg = load_config("tiny")
    cost = CostModel(cfg, GPU_PROFILES["h100-80gb"], block_size=CONFIG.block_size)
    engine = Engine(CONFIG, runner=SimulatedRunner(cfg, cost, clock, num_blocks=CONFIG.num_blocks), clock=clock)
    serve_all_at_once(engine, _trace())
    assert not engine.has_unfinished_requests()
    assert engine.kv.stats.num_used_blocks == 0


def test_a_runner_of_another_geometry_is_refused():
    cfg = load_config("tiny")
    clock = SimClock()
    other_block_size = SimulatedRunner(cfg, CostModel(cfg, GPU_PROFILES["h100-80gb"], block_size=16), clock,
                                       num_blocks=CONFIG.num_blocks)
    with pytest.raises(ValueError, match=r"block_size \(16\) differs from EngineConfig.block_size \(4\)"):
        Engine(CONFIG, runner=other_block_size, clock=clock)
    other_count = SimulatedRunner(cfg, CostModel(cfg, GPU_PROFILES["h100-80gb"], block_size=4), clock,
                                  num_blocks=CONFIG.num_blocks + 1)
    with pytest.raises(ValueError, match="pool has 41 blocks; the engine's config asks for 40"):
        Engine(CONFIG, runner=other_count, clock=clock)
    adopted = Engine(dataclasses.replace(CONFIG, num_blocks=None), runner=other_count, clock=clock)
    assert adopted.num_blocks == adopted.kv.num_blocks == 41  # no block count configured: the runner's
