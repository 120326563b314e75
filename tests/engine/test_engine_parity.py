"""Greedy outputs do not depend on batching, block size, prefix caching or preemption (design rule 9)."""

import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _workload(seed=0, count=64):
    """Random lengths; half the prompts share one of two prefixes so the cache has something to hit."""
    rng = np.random.default_rng(seed)
    shared = [list(rng.integers(0, 250, 21)), list(rng.integers(0, 250, 13))]
    prompts = []
    for i in range(count):
        tail = list(rng.integers(0, 250, int(rng.integers(1, 30))))
        prompts.append(shared[i % 2] + tail if i % 4 < 2 else tail)
    return prompts


def run_engine(model, prompts, params=GREEDY, **config):
    engine = Engine(EngineConfig(model="tiny", **config), model=model)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[int(out.request_id)] = out
    return engine, [outputs[i] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def alone_outputs(tiny_model):
    """Each request run on its own: one sequence at a time, big pool, no prefix cache."""
    _, outs = run_engine(tiny_model, _workload(), num_blocks=64, block_size=16, max_num_seqs=1,
                         enable_prefix_caching=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_batched_with_preemption_equals_alone(tiny_model, alone_outputs, block_size, prefix_caching):
    # ~1/4 of what the 64 requests would hold at once: admission outruns the pool and preempts
    num_blocks = 160 // block_size
    engine, outs = run_engine(tiny_model, _workload(), num_blocks=num_blocks, block_size=block_size,
                              max_num_batched_tokens=64, enable_prefix_caching=prefix_caching,
                              pool_fill_value=float("nan"))
    assert engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == alone_outputs
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    stats = engine.kv.stats
    assert stats.num_used_blocks == 0 and stats.num_free_blocks == num_blocks  # nothing leaks
    engine.kv.check_invariants()
    if prefix_caching:
        assert stats.prefix_hits_tokens > 0
    else:
        assert stats.prefix_hits_tokens == 0 and stats.num_cached_blocks == 0


def test_resumed_request_rehits_its_own_blocks(tiny_model):
    """Unique prompts: after a preemption, the only possible cache hits are a request's own blocks."""
    rng = np.random.default_rng(9)
    prompts = [list(rng.integers(0, 250, 24)) for _ in range(6)]
    engine, outs = run_engine(tiny_model, prompts, num_blocks=20, block_size=4, max_num_batched_tokens=32,
                              params=SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    preempted = [o for o in outs if o.metrics.num_preemptions]
    assert preempted, "the pool was meant to force preemption"
    assert engine.kv.stats.prefix_hits_tokens > 0
    assert all(o.num_cached_tokens == 0 for o in outs)  # first admissions hit nothing
