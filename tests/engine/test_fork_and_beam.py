"""Parallel sampling (n > 1) shares the prompt's blocks; beam search matches a non-paged reference."""

import numpy as np

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.scheduler import beam_score
from jaxpaged.sampling_params import SamplingParams
from tests.paged_driver import dense_logits

BS = 4


def _run(model, requests, **kw):
    engine = Engine(EngineConfig(model="tiny", num_blocks=96, block_size=BS, **kw), model=model)
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
    stats = engine.kv.stats
    assert stats.num_used_blocks == 0 and stats.num_free_blocks == engine.num_blocks
    engine.kv.check_invariants()
    return engine, outs


def test_parallel_sampling_shares_blocks_and_diverges(tiny_model):
    prompt = list(range(30, 53))  # 23 tokens: the last prompt block is partly filled, so CoW copies it
    params = SamplingParams(n=4, temperature=1.0, max_tokens=10, seed=11, ignore_eos=True)
    engine, outs = _run(tiny_model, [("n4", prompt, params)], enable_prefix_caching=False)
    out = outs["n4"]
    samples = [tuple(c.token_ids) for c in out.outputs]
    assert len(samples) == 4 and len(set(samples)) == 4
    assert engine.kv.stats.num_cow_copies >= 3
    # four independent requests for the same prompt, no cache sharing between them
    _, independent = _run(tiny_model, [(f"i{k}", prompt, SamplingParams(
        temperature=1.0, max_tokens=10, seed=k, ignore_eos=True)) for k in range(4)],
        enable_prefix_caching=False)
    independent_blocks = sum(o.metrics.peak_blocks_shared for o in independent.values())
    assert out.metrics.peak_blocks_shared < out.metrics.peak_blocks_unshared
    assert out.metrics.peak_blocks_shared < independent_blocks
    # prompt's full blocks once + one private tail each
    full_prompt_blocks = (len(prompt) - 1) // BS
    assert out.metrics.peak_blocks_shared <= full_prompt_blocks + 4 * (-(-(len(prompt) % BS + 10) // BS) + 1)


def test_same_seed_same_samples_whatever_the_batch(tiny_model):
    params = SamplingParams(n=2, temperature=0.8, top_k=50, max_tokens=8, seed=3, ignore_eos=True)
    _, alone = _run(tiny_model, [("x", list(range(9)), params)])
    _, batched = _run(tiny_model, [("y", list(range(100, 140)), SamplingParams(max_tokens=5)),
                                   ("x", list(range(9)), params)])
    assert [c.token_ids for c in alone["x"].outputs] == [c.token_ids for c in batched["x"].outputs]


def reference_beam_search(model, prompt, width, max_tokens, length_penalty):
    """Plain beam search on dense, no-cache logits (ignore_eos): the same selection rule, no paging."""
    beams = [(list(prompt), 0.0)]
    for _ in range(max_tokens):
        candidates = []
        for tokens, cum in beams:
            logits = dense_logits(model, tokens)[-1].astype(np.float64)
            logp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
            for t in np.argsort(-logp)[:2 * width]:
                candidates.append((tokens + [int(t)], cum + logp[t]))
        candidates.sort(key=lambda c: beam_score(len(c[0]) - len(prompt), c[1], False, length_penalty),
                        reverse=True)
        beams = candidates[:width]
    return [(t[len(prompt):], c) for t, c in beams]


def test_beam_search_matches_reference(tiny_model):
    prompt = list(range(60, 73))
    params = SamplingParams(beam_width=3, max_tokens=6, ignore_eos=True, length_penalty=0.7)
    engine, outs = _run(tiny_model, [("beam", prompt, params)])
    expected = reference_beam_search(tiny_model, prompt, 3, 6, 0.7)
    got = [(c.token_ids, c.cumulative_logprob) for c in outs["beam"].outputs]
    assert [g[0] for g in got] == [e[0] for e in expected]
    np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], rtol=1e-4, atol=1e-4)
    assert outs["beam"].metrics.peak_blocks_shared < outs["beam"].metrics.peak_blocks_unshared
