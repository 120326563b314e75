"""Structured output through the engine on random weights: every constrained output parses and validates.

One engine per module (tiny model). The references are independent of the
engine: jsonschema for schemas, `re.fullmatch` for regexes, set membership for
choices and allowed ids, and a numpy model of min-p. Greedy outputs must not
depend on prefix hits or preemption (DESIGN rule 9), constraints included.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.llm import LLM
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.structured import StructuredOutputsParams

from tests.structured.structured_cases import CHOICES, REGEXES, SCHEMAS

FORMATS = jsonschema.FormatChecker()
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", num_blocks=256, block_size=16, max_num_seqs=64)


def _json(schema, temperature, seed, **kwargs):
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed,
                          structured_outputs=StructuredOutputsParams(json=schema, **kwargs))


def _check_json(text: str, schema) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_schema_output_validates(llm, temperature):
    assert len(SCHEMAS) >= 30
    params = [_json(s, temperature, seed=i, disable_any_whitespace=True) for i, s in enumerate(SCHEMAS)]
    outs = llm.generate([f"prompt {i}" for i in range(len(SCHEMAS))], params, use_tqdm=False)
    for schema, out in zip(SCHEMAS, outs):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", (schema, completion.text)
        _check_json(completion.text, schema)


def test_flexible_whitespace_json_object_and_closed_objects(llm):
    open_schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                   "required": ["a"]}
    params = [_json(SCHEMAS[20], 1.0, seed=s) for s in range(4)]  # whitespace allowed (vLLM's default)
    params += [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured_outputs=StructuredOutputsParams(
        json_object=True, disable_any_whitespace=True))]
    params += [_json(open_schema, 1.0, seed=s, disable_any_whitespace=True, disable_additional_properties=True)
               for s in range(4)]
    outs = llm.generate([f"w{i}" for i in range(len(params))], params, use_tqdm=False)
    finished = [o.outputs[0] for o in outs if o.outputs[0].finish_reason == "stop"]
    assert len(finished) >= len(params) - 2  # whitespace is unbounded: a run may reach max_tokens
    for out in outs[:4]:
        if out.outputs[0].finish_reason == "stop":
            _check_json(out.outputs[0].text, SCHEMAS[20])
    assert isinstance(json.loads(outs[4].outputs[0].text), dict)
    for out in outs[5:]:
        assert set(json.loads(out.outputs[0].text)) == {"a"}  # closed: no extra keys


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regexes_and_choices(llm, temperature):
    params = [SamplingParams(max_tokens=32, temperature=temperature, seed=i,
                             structured_outputs=StructuredOutputsParams(regex=r)) for i, r in enumerate(REGEXES)]
    params += [SamplingParams(max_tokens=16, temperature=temperature, seed=i,
                              structured_outputs=StructuredOutputsParams(choice=c)) for i, c in enumerate(CHOICES)]
    params += [SamplingParams(max_tokens=16, temperature=temperature, seed=3, structured_outputs=
                              StructuredOutputsParams(grammar='root ::= "(" [a-c]{1,3} ")"'))]
    outs = llm.generate([f"r{i}" for i in range(len(params))], params, use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    assert all(o.outputs[0].finish_reason == "stop" for o in outs), texts
    for regex, text in zip(REGEXES, texts):
        assert re.fullmatch(regex, text), (regex, text)
    for choices, text in zip(CHOICES, texts[len(REGEXES):]):
        assert text in choices
    assert re.fullmatch(r"\([a-c]{1,3}\)", texts[-1])


def test_n_samples_each_follow_the_grammar(llm):
    schema = SCHEMAS[23]
    out = llm.generate(["fork me"], SamplingParams(n=4, max_tokens=MAX_TOKENS, temperature=1.0, seed=7,
                                                   structured_outputs=StructuredOutputsParams(
                                                       json=schema, disable_any_whitespace=True)),
                       use_tqdm=False)[0]
    assert len(out.outputs) == 4 and len({c.text for c in out.outputs}) > 1
    for completion in out.outputs:
        _check_json(completion.text, schema)


def test_allowed_token_ids_and_min_p(llm):
    allowed = [ord(c) for c in "abcxyz"]
    outs = llm.generate(["a", "b"], [
        SamplingParams(max_tokens=24, temperature=1.0, seed=1, allowed_token_ids=allowed, ignore_eos=True),
        SamplingParams(max_tokens=24, temperature=0.0, allowed_token_ids=[ord("q")], ignore_eos=True)],
        use_tqdm=False)
    assert set(outs[0].outputs[0].token_ids) <= set(allowed) and len(set(outs[0].outputs[0].token_ids)) > 1
    assert outs[1].outputs[0].text == "q" * 24


def test_min_p_keeps_only_tokens_near_the_top():
    """The sampler's min-p against a numpy model: every draw is a token with p >= min_p * p_max."""
    import jax
    import jax.numpy as jnp

    from jaxpaged.runner.sampling import SamplingBatch, sample
    rng = np.random.default_rng(0)
    rows, vocab, min_p = 8, 64, 0.3
    logits = rng.normal(size=(rows, vocab)).astype(np.float32) * 3
    probs = np.exp(logits - logits.max(1, keepdims=True))
    keep = probs >= min_p * probs.max(1, keepdims=True)
    seen = np.zeros_like(keep)
    draw = jax.jit(lambda counter: sample(jnp.asarray(logits), SamplingBatch(
        jnp.ones(rows), jnp.full(rows, -1, jnp.int32), jnp.ones(rows), jnp.arange(rows, dtype=jnp.uint32),
        jnp.full(rows, counter, jnp.int32), jnp.full(rows, min_p)))[0])
    for counter in range(48):
        tokens = np.asarray(draw(counter))
        seen[np.arange(rows), tokens] = True
    assert not (seen & ~keep).any()
    assert (seen.sum(1) > 1).any()  # it does sample, not argmax


def _drain(engine: Engine, kind_texts=None) -> dict:
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if kind_texts is not None:
                kind_texts.setdefault(out.request_id, []).append(out.outputs[0].text)
            if out.finished:
                finals[out.request_id] = out
    return finals


def test_streamed_deltas_prefix_hits_and_preemption_keep_outputs_valid_and_greedy_equal(llm):
    schemas = SCHEMAS[19:27]
    prompt = "a shared prompt of forty bytes, or so..."
    greedy = [_json(s, 0.0, seed=0, disable_any_whitespace=True) for s in schemas]
    expected = [o.outputs[0].text for o in llm.generate([prompt] * len(greedy), greedy, use_tqdm=False)]
    for text, schema in zip(expected, schemas):
        _check_json(text, schema)

    # a pool too small for all of them at once: sequences are preempted and recomputed; the prompt's
    # blocks are prefix hits for every request after the first; outputs stream as deltas
    small = Engine(EngineConfig(model="tiny", block_size=8, num_blocks=18, max_num_seqs=8))
    for i, p in enumerate(greedy):
        small.add_request(f"g{i}", prompt, SamplingParams(**{**_fields(p), "output_kind": RequestOutputKind.DELTA}))
    deltas: dict[str, list[str]] = {}
    finals = _drain(small, deltas)
    assert small.num_preemptions > 0
    assert small.kv_stats().prefix_hits_tokens > 0
    for i, text in enumerate(expected):
        assert "".join(deltas[f"g{i}"]) == text
        assert finals[f"g{i}"].outputs[0].finish_reason == "stop"
    assert small.kv_stats().num_used_blocks == 0  # nothing leaks


def _fields(params: SamplingParams) -> dict:
    import dataclasses
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


def test_bad_constraints_are_value_errors_and_change_nothing():
    engine = Engine(EngineConfig(model="tiny", block_size=16, num_blocks=32))
    for params, message in [
        (StructuredOutputsParams(regex="(unclosed"), "structured_outputs.regex does not compile"),
        (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "nope"}}}),
         "structured_outputs.json does not compile"),
        (StructuredOutputsParams(grammar="root ::= missing"), "structured_outputs.grammar does not compile"),
    ]:
        with pytest.raises(ValueError, match=message):
            engine.add_request("bad", "x", SamplingParams(structured_outputs=params))
        assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="allowed_token_ids entry 999 is outside the vocabulary"):
        engine.add_request("bad", "x", SamplingParams(allowed_token_ids=[1, 999]))
    with pytest.raises(ValueError, match="not supported with beam search"):
        SamplingParams(beam_width=2, structured_outputs=StructuredOutputsParams(regex="a"))
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)


def test_overlapped_steps_fill_masks_during_the_forward_pass_and_match_synchronous_steps():
    """With a grammar row the overlapped engine dispatches the forward pass, applies the previous step's
    tokens, fills the masks, then samples; outputs equal the synchronous engine's, seeded sampling included."""
    params = [_json(s, 1.0, seed=i, disable_any_whitespace=True) for i, s in enumerate(SCHEMAS[:12])]
    params += [SamplingParams(max_tokens=12, temperature=1.0, seed=2, ignore_eos=True)]  # unconstrained row
    texts = {}
    for overlapped in (False, True):
        engine = Engine(EngineConfig(model="tiny", block_size=16, num_blocks=128, async_scheduling=overlapped))
        forward_only = []
        dispatch_forward = engine.runner.dispatch_forward
        engine.runner.dispatch_forward = lambda *a, **k: forward_only.append(1) or dispatch_forward(*a, **k)
        for i, p in enumerate(params):
            engine.add_request(str(i), f"q{i}", p)
        texts[overlapped] = {k: v.outputs[0].text for k, v in _drain(engine).items()}
        assert bool(forward_only) == overlapped
    assert texts[True] == texts[False]
    for i, schema in enumerate(SCHEMAS[:12]):
        _check_json(texts[True][str(i)], schema)


def test_abort_mid_grammar_and_logprobs_under_a_grammar():
    """An aborted constrained request frees everything; logprobs under a grammar are the raw logits' (vLLM's
    default), so the chosen token's logprob is that of the unconstrained distribution."""
    engine = Engine(EngineConfig(model="tiny", block_size=16, num_blocks=64))
    constrained = StructuredOutputsParams(json=SCHEMAS[23], disable_any_whitespace=True)
    engine.add_request("gone", "x", SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=1,
                                                   structured_outputs=constrained))
    engine.add_request("kept", "x", SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=3,
                                                   structured_outputs=StructuredOutputsParams(choice=["zz"])))
    for _ in range(3):
        engine.step()
    engine.abort("gone")
    finals = _drain(engine)
    assert finals["gone"].outputs[0].finish_reason == "abort"
    kept = finals["kept"].outputs[0]
    assert kept.text == "zz" and kept.finish_reason == "stop"
    first = kept.logprobs[0]
    assert len(first) in (3, 4) and ord("z") in first  # top 3 of the raw distribution, and the forced token
    assert first[ord("z")] <= max(first.values())
    assert engine.kv_stats().num_used_blocks == 0 and engine.scheduler.num_grammar_requests == 0
