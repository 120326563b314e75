"""Asynchronous scheduling changes when the host works, never what is generated.

Step N+1 is scheduled and dispatched before step N's tokens are read; a
sequence that stops at step N has one surplus token computed in N+1, which
must never reach an output. Greedy and seeded outputs must be identical with
async scheduling on and off across preemption, prefix hits, n > 1, beam
search, stop tokens and max_tokens, and no block may leak.
"""

import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams

BS = 4
SHARED = list(range(40, 61))  # 21 tokens: 5 full blocks shared by half the prompts


def _workload():
    """(request id, prompt, params): greedy and seeded sampling, n > 1, various lengths."""
    rng = np.random.default_rng(7)
    requests = []
    for i in range(14):
        tail = rng.integers(0, 250, int(rng.integers(2, 19))).tolist()
        prompt = SHARED + tail if i % 2 == 0 else tail
        max_tokens = int(rng.integers(1, 24))
        if i % 5 == 3:
            params = SamplingParams(n=3, temperature=0.9, top_p=0.9, seed=100 + i, max_tokens=max_tokens,
                                    ignore_eos=True)
        elif i % 4 == 1:
            params = SamplingParams(temperature=1.0, top_k=20, seed=i, max_tokens=max_tokens, ignore_eos=True)
        else:
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        requests.append((f"r{i}", prompt, params))
    return requests


def _run(model, requests, **config):
    engine = Engine(EngineConfig(model="tiny", block_size=BS, pool_fill_value=float("nan"), **config), model=model)
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        engine.kv.check_invariants()
    stats = engine.kv.stats
    assert stats.num_used_blocks == 0 and stats.num_free_blocks == engine.num_blocks  # nothing leaks
    outputs = {rid: [(c.index, c.token_ids, c.finish_reason) for c in out.outputs] for rid, out in finals.items()}
    return engine, outputs


def _with_stops(requests, outputs):
    """Stop every other single-sequence request, and each n > 1 request, at a token it generated alone.

    The stop token is the second one of the (first) sample: with n > 1 the
    other samples run on after that sample stops.
    """
    stopped = []
    for i, (rid, prompt, params) in enumerate(requests):
        tokens = outputs[rid][0][1]
        if params.beam_width == 1 and (i % 2 or params.n > 1) and len(tokens) >= 3:
            params = SamplingParams(n=params.n, temperature=params.temperature, top_k=params.top_k,
                                    top_p=params.top_p, seed=params.seed, max_tokens=params.max_tokens,
                                    ignore_eos=True, stop_token_ids=[tokens[1]])
        stopped.append((rid, prompt, params))
    return stopped


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The synchronous engine's outputs on a roomy pool: no preemption."""
    requests = _workload()
    _, plain = _run(tiny_model, requests, num_blocks=256, async_scheduling=False)
    requests = _with_stops(requests, plain)
    engine, outputs = _run(tiny_model, requests, num_blocks=256, async_scheduling=False)
    return requests, outputs, engine.stats.generation_tokens


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_async_outputs_equal_sync_under_preemption(tiny_model, reference, prefix_caching):
    requests, expected, generated = reference
    stopped = [rid for rid, out in expected.items() if out[0][2] == "stop"]
    assert len(stopped) >= 3, "the workload was meant to stop some requests on a stop token"
    assert any(len(out) > 1 and out[0][2] == "stop" and out[1][2] == "length" for out in expected.values()), \
        "an n > 1 request was meant to have one sample stop while another runs on"
    outputs = {}
    for async_scheduling in (False, True):
        engine, outputs[async_scheduling] = _run(
            tiny_model, requests, num_blocks=28, max_num_batched_tokens=32, enable_prefix_caching=prefix_caching,
            async_scheduling=async_scheduling)
        assert engine.scheduler.num_preemptions > 0, "the small pool was meant to preempt"
        assert engine.stats.generation_tokens == generated  # a surplus token is not even counted
        if prefix_caching:
            assert engine.kv.stats.prefix_hits_tokens > 0
    assert outputs[True] == outputs[False] == expected
    for rid in stopped:  # the stop token ends the output: the token computed after it is never shown
        index, tokens, reason = expected[rid][0]
        assert reason == "stop" and tokens[-1] == tokens[1] and len(tokens) == 2


def test_async_engine_overlaps_and_lays_out_the_next_step_first(tiny_model):
    """With async on, the step processed in a call is the one dispatched in the call before."""
    engine = Engine(EngineConfig(model="tiny", block_size=BS, num_blocks=64), model=tiny_model)
    engine.add_request("a", list(range(10)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert engine.step() == []  # the prefill is in flight; nothing has come back yet
    assert engine.has_step_in_flight
    out = engine.step()  # reads the prefill's token while the first decode runs
    assert [len(o.outputs[0].token_ids) for o in out] == [1]
    outputs = out
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [len(o.outputs[0].token_ids) for o in outputs] == [1, 2, 3, 4] and outputs[-1].finished
    assert engine.stats.num_steps == 4  # no step past max_tokens: a length stop is known in advance


def test_beam_search_runs_synchronously_and_alike(tiny_model):
    """Beam search needs each step's tokens before the next step: the async engine waits, and agrees."""
    requests = _workload()[:6] + [("beam", SHARED[:9], SamplingParams(beam_width=3, max_tokens=5, ignore_eos=True))]
    outputs = [_run(tiny_model, requests, num_blocks=64, async_scheduling=flag)[1] for flag in (False, True)]
    assert outputs[0] == outputs[1]
    assert len(outputs[0]["beam"]) == 3
