"""Prompt logprobs against the dense forward; bias, min_tokens and penalties against plain-numpy rules.

The penalty rules are vLLM's: repetition over prompt and output tokens
(positive logits divided, negative multiplied), then frequency (times the
output count) and presence (once per output token present).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.mathutils import DROPPED
from jaxpaged.runner.logit_controls import LogitControls, apply_logit_controls
from jaxpaged.sampling_params import SamplingParams
from tests.paged_driver import dense_logits

PROMPT = list(range(30, 60))  # 30 tokens: two 16-token chunks


def _numpy_controls(logits, bias, contexts, num_prompt, rep, freq, pres):
    """vLLM's rules with count matrices, one row at a time."""
    out = logits.astype(np.float64).copy()
    for row, entries in bias.items():
        for t, v in entries:
            out[row, t] += v
    for row, tokens in contexts.items():
        prompt, output = tokens[:num_prompt[row]], tokens[num_prompt[row]:]
        seen = np.zeros(out.shape[1], bool)
        seen[list(tokens)] = True
        r = np.where(seen, rep[row], 1.0)
        out[row] = np.where(out[row] > 0, out[row] / r, out[row] * r)
        counts = np.bincount(output, minlength=out.shape[1]) if output else np.zeros(out.shape[1])
        out[row] -= freq[row] * counts + pres[row] * (counts > 0)
    return out


def test_controls_match_the_numpy_rules_on_fixed_logits():
    rng = np.random.default_rng(0)
    vocab, num_rows = 50, 4
    logits = rng.normal(0, 3, (num_rows, vocab)).astype(np.float32)
    last = np.array([7, 9, 11, 13], np.int32)  # each row's last input token (resolved on the device)
    # row 0: prompt [3, 3, 5] + output [5, 8, 8] then last 7; row 2: prompt only + last 11
    contexts = {0: [3, 3, 5, 5, 8, 8, 8], 2: [1, 2, 2]}
    num_prompt = {0: 3, 2: 2}
    rep, freq, pres = {0: 1.7, 2: 0.6}, {0: 0.5, 2: -0.3}, {0: 0.9, 2: 1.5}
    # row 1's second entry applies only if its last token is 9 (it is); row 2's -3 only if its last is 5 (not)
    bias = {1: [(4, 10.0), (6, -np.inf)], 2: []}
    length = 16
    tokens = np.full((4, length), -1, np.int32)
    tokens[0, :6], tokens[1, :2] = contexts[0][:-1], contexts[2][:-1]
    controls = LogitControls(
        bias_rows=np.array([1, 2, DROPPED, DROPPED], np.int32),
        bias_ids=np.array([[4, 6], [1, DROPPED], [0, 0], [0, 0]], np.int32),
        bias_values=np.array([[10, -np.inf], [-3, 0], [5, 5], [5, 5]], np.float32),
        bias_if_last=np.array([[-1, 9], [5, -1], [-1, -1], [-1, -1]], np.int32),
        penalty_rows=np.array([0, 2, DROPPED, DROPPED], np.int32), penalty_tokens=tokens,
        penalty_num_prompt=np.array([3, 2, 0, 0], np.int32), penalty_last_index=np.array([6, 2, 0, 0], np.int32),
        repetition=np.array([1.7, 0.6, 2, 2], np.float32), frequency=np.array([0.5, -0.3, 1, 1], np.float32),
        presence=np.array([0.9, 1.5, 1, 1], np.float32))
    got = np.asarray(jax.jit(apply_logit_controls)(jnp.asarray(logits), controls, jnp.asarray(last)))
    full = {0: contexts[0][:-1] + [int(last[0])], 2: contexts[2][:-1] + [int(last[2])]}
    expected = _numpy_controls(logits, bias, full, num_prompt, rep, freq, pres)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[3], logits[3])  # a row with no control is untouched


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model="tiny", block_size=4, num_blocks=64, max_num_batched_tokens=16),
                  model=tiny_model)


def _run(engine, prompt, params):
    engine.add_request("r", prompt, params)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out if out.finished else final
    return final


def test_prompt_logprobs_equal_the_dense_forward_across_chunks_and_prefix_hits(engine, tiny_model):
    ref = np.asarray(jax.nn.log_softmax(dense_logits(tiny_model, PROMPT), axis=-1))
    _run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=2))  # caches the prompt's blocks
    stats = engine.kv.stats
    out = _run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))
    assert out.num_cached_tokens == 0  # no prefix hit: every position has its logits
    after = engine.kv.stats
    assert (after.prefix_queries_tokens, after.prefix_hits_tokens) == (stats.prefix_queries_tokens,
                                                                       stats.prefix_hits_tokens)
    lp = out.prompt_logprobs
    assert lp[0] is None and len(lp) == len(PROMPT)
    for i in range(1, len(PROMPT)):
        assert lp[i][PROMPT[i]] == pytest.approx(ref[i - 1, PROMPT[i]], abs=1e-4)
        top = np.argsort(-ref[i - 1])[:3]
        assert set(top.tolist()) <= set(lp[i])
    assert _run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=2)).num_cached_tokens == 28  # still cached


def _greedy(engine, prompt, **kw):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **kw)  # context < 16: one L bucket
    return _run(engine, prompt, params).outputs[0].token_ids


def _first_repeat(tokens: list[int]) -> int:
    return next(i for i, t in enumerate(tokens) if t in tokens[:i])


def test_each_control_moves_tokens_the_expected_way_without_recompiling(engine):
    prompt = [3] * 8
    base = _greedy(engine, prompt)
    repeats = lambda toks: len(toks) - len(set(toks))  # noqa: E731
    assert repeats(base) > 0  # the tiny model loops: something for the penalties to break
    k = _first_repeat(base)
    for kw in ({"frequency_penalty": 1.0}, {"presence_penalty": 1.0}, {"repetition_penalty": 2.0}):
        out = _greedy(engine, prompt, **kw)
        assert out[:k] == base[:k] and out[k] != base[k], kw  # same until base repeats itself, then not
        assert repeats(out) < repeats(base), kw
    # repetition counts the prompt too: a prompt that holds greedy's next token pushes it away
    looped = prompt + base[:k]
    assert _greedy(engine, looped)[0] == base[k]  # the loop goes on: its next token is in the prompt
    assert _greedy(engine, looped, repetition_penalty=2.0)[0] != base[k]
    assert _greedy(engine, prompt, logit_bias={200: 100.0}) == [200] * 8
    # min_tokens: the stop id (greedy's first token) cannot end the sequence before 5 tokens
    stopped = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=8, min_tokens=5,
                                                  stop_token_ids=[base[0]])).outputs[0].token_ids
    assert len(stopped) >= 5 and base[0] not in stopped[:5]
    compiles = None
    for value in (0.25, 0.5, 1.5):  # after the first, other values with the same shapes: no new compile
        if value == 0.5:
            compiles = engine.runner.num_compiles
        _greedy(engine, prompt, frequency_penalty=value, presence_penalty=value / 2, repetition_penalty=1 + value,
                logit_bias={3: value})
    assert engine.runner.num_compiles == compiles


def test_bad_words_never_appear_in_the_output(engine):
    prompt = [17] * 8
    base = _greedy(engine, prompt)
    ascii_at = [j for j, t in enumerate(base) if 33 <= t < 127]  # the byte tokenizer: one character, one token
    single = ascii_at[0]
    pair = next(j for j in ascii_at if j + 1 in ascii_at)  # two printable tokens in a row
    out = _greedy(engine, prompt, bad_words=[chr(base[single])])
    assert base[single] not in out and out[:single] == base[:single]
    word = chr(base[pair]) + chr(base[pair + 1])
    out = _greedy(engine, prompt, bad_words=[word])
    assert out[:pair + 1] == base[:pair + 1]  # its first token is allowed ...
    assert out[pair + 1] != base[pair + 1]  # ... but not the token that would complete it
    assert (base[pair], base[pair + 1]) not in set(zip(out, out[1:]))


def test_bad_values_name_the_field(engine):
    for kw, field in [({"presence_penalty": 2.5}, "presence_penalty"), ({"repetition_penalty": 0.0}, "repetition"),
                      ({"min_tokens": 17}, "min_tokens"), ({"logit_bias": {1: 101.0}}, "logit_bias"),
                      ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"bad_words": [" "]}, "bad_words")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)
    with pytest.raises(ValueError, match="logit_bias token id 9999"):
        engine.add_request("bad", [1, 2], SamplingParams(logit_bias={9999: 1.0}))
    assert not engine.has_unfinished_requests() and engine.kv.stats.num_used_blocks == 0
