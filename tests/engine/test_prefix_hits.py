"""Prefix-cache hits reported per request, against expectations computed from the block rules alone."""

import numpy as np

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams

BS = 4


def expected_hit(prompt, cached_sequences, block_size=BS):
    """Longest full-block prefix shared with a cached sequence, leaving one prompt token to compute."""
    best = 0
    for cached in cached_sequences:
        common = 0
        for a, b in zip(prompt, cached):
            if a != b:
                break
            common += 1
        best = max(best, common)
    return (min(best, len(prompt) - 1) // block_size) * block_size


def _engine(model, **kw):
    return Engine(EngineConfig(model="tiny", num_blocks=128, block_size=BS, **kw), model=model)


def _run(engine, requests):
    for rid, prompt, params, salt in requests:
        engine.add_request(rid, prompt, params, cache_salt=salt)
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
    return outs


def test_shared_prefix_hits_match_block_rules(tiny_model):
    rng = np.random.default_rng(1)
    system = list(rng.integers(0, 250, 37))
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    engine = _engine(tiny_model)
    first = _run(engine, [("warm", system + [1, 2, 3], params, None)])["warm"]
    assert first.num_cached_tokens == 0
    # the cache holds the full blocks of everything computed: prompt + all generated tokens but the last
    cached = [(system + [1, 2, 3] + first.outputs[0].token_ids)[:-1]]
    users = [system + list(rng.integers(0, 250, n)) for n in (1, 4, 9, 30)]
    users.append(system[:8] + [255] * 10)  # diverges inside the third block
    users.append(system[:3])  # shorter than one block
    requests = [(f"u{i}", p, params, None) for i, p in enumerate(users)]
    requests.append(("other-tenant", system + [7, 7], params, "tenant-b"))
    outs = _run(engine, requests)
    for i, prompt in enumerate(users):
        assert outs[f"u{i}"].num_cached_tokens == expected_hit(prompt, cached), i
    assert outs["other-tenant"].num_cached_tokens == 0  # a different salt shares nothing
    assert outs["u0"].num_cached_tokens == 36  # 9 full blocks of the 37-token system prompt


def test_same_prefix_in_flight_is_computed_once(tiny_model):
    """Two requests with one prefix, added together: the second waits a step and hits the first's blocks."""
    rng = np.random.default_rng(2)
    system = list(rng.integers(0, 250, 32))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    engine = _engine(tiny_model, max_num_batched_tokens=64)
    outs = _run(engine, [("a", system + [5], params, None), ("b", system + [6], params, None)])
    assert outs["a"].num_cached_tokens == 0
    assert outs["b"].num_cached_tokens == 32


def test_multi_turn_hits_previous_answer(tiny_model):
    rng = np.random.default_rng(3)
    turn1 = list(rng.integers(0, 250, 22))
    params = SamplingParams(temperature=0, max_tokens=19, ignore_eos=True)
    engine = _engine(tiny_model)
    answer = _run(engine, [("t1", turn1, params, None)])["t1"].outputs[0].token_ids
    turn2 = turn1 + answer + list(rng.integers(0, 250, 6))
    out = _run(engine, [("t2", turn2, params, None)])["t2"]
    computed_turn1 = len(turn1) + len(answer) - 1  # the last answer token never went through the model
    assert out.num_cached_tokens == (computed_turn1 // BS) * BS
    assert out.num_cached_tokens > len(turn1)  # the hit reaches into the first answer
