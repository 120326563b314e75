"""The public API (LLM, Engine), bad input, abort, and the Pallas backend end to end."""

import numpy as np
import pytest

from jaxpaged import LLM, SamplingParams
from jaxpaged.engine import Engine, EngineConfig

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


def _engine(model, **kw):
    kw.setdefault("num_blocks", 32)
    return Engine(EngineConfig(model="tiny", block_size=4, max_model_len=96, **kw), model=model)


def _drain(engine):
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
    return outs


@pytest.mark.parametrize("prompt, params, match", [
    ([], GREEDY, "empty"),
    ([1, 2, 300], GREEDY, "outside the vocabulary"),
    ([-1], GREEDY, "outside the vocabulary"),
    ([1, 2.5], GREEDY, "integers"),
    ([[1, 2]], GREEDY, "flat sequence"),
    ([1, 2**64], GREEDY, "flat sequence of integers"),
    (np.array([[1, 2]]), GREEDY, "flat sequence"),
    (np.array([1.0, 2.0]), GREEDY, "dtype float64"),
    (b"abc", GREEDY, "not bytes"),
    (list(range(90)), SamplingParams(max_tokens=10), "max_model_len"),
    (list(range(60)), SamplingParams(max_tokens=30, n=4), "never fit"),
])
def test_bad_requests_rejected_while_others_run(tiny_model, prompt, params, match):
    engine = _engine(tiny_model)
    engine.add_request("good", list(range(10, 30)), GREEDY)
    engine.step()
    used = engine.kv.stats.num_used_blocks
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", prompt, params)
    assert engine.kv.stats.num_used_blocks == used and engine.get_num_unfinished_requests() == 1
    outs = _drain(engine)
    alone = _drain_one(tiny_model, list(range(10, 30)))
    assert outs["good"].outputs[0].token_ids == alone
    assert engine.kv.stats.num_used_blocks == 0


def _drain_one(model, prompt):
    engine = _engine(model)
    engine.add_request("solo", prompt, GREEDY)
    return _drain(engine)["solo"].outputs[0].token_ids


def test_duplicate_request_id_rejected(tiny_model):
    engine = _engine(tiny_model)
    engine.add_request("a", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", [4, 5], GREEDY)


def test_abort_frees_blocks(tiny_model):
    engine = _engine(tiny_model)
    engine.add_request("keep", list(range(20)), GREEDY)
    engine.add_request("drop", list(range(50, 80)), SamplingParams(max_tokens=40, ignore_eos=True))
    engine.step()
    used_before = engine.kv.stats.num_used_blocks
    engine.abort("drop")
    assert engine.kv.stats.num_used_blocks < used_before
    outs = _drain(engine)
    assert outs["drop"].outputs[0].finish_reason == "abort" and outs["drop"].finished  # its last output
    assert outs["keep"].outputs[0].token_ids == _drain_one(tiny_model, list(range(20)))
    assert engine.kv.stats.num_used_blocks == 0


def test_llm_generate_prompt_forms_order_and_timings():
    llm = LLM("tiny", num_blocks=64, block_size=8, seed=0)
    prompts = ["hello world", [72, 105], {"prompt": "hello world", "cache_salt": "tenant-a"},
               {"prompt_token_ids": list(b"hello world")}]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [list(b"hello world"), [72, 105],
                                                 list(b"hello world"), list(b"hello world")]
    assert outs[0].prompt == "hello world"
    # same tokens, same greedy output; the salted copy is a different tenant but computes the same thing
    assert outs[0].outputs[0].token_ids == outs[2].outputs[0].token_ids == outs[3].outputs[0].token_ids
    assert outs[2].num_cached_tokens == 0
    for o in outs:
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
        assert o.outputs[0].finish_reason == "length" and len(o.outputs[0].token_ids) == 5
    with pytest.raises(ValueError):
        llm.generate([[1, 2], []], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # the valid prompt was not queued either


def test_prompt_ids_from_any_integer_sequence(tiny_model):
    engine = _engine(tiny_model)
    for rid, prompt in (("list", [72, 105, 33]), ("range", range(72, 75)), ("gen", (t for t in [72, 105, 33])),
                        ("numpy", np.array([72, 105, 33], np.int32))):
        engine.add_request(rid, prompt, GREEDY)
    assert all(type(t) is int for r in engine._requests.values() for t in r.prompt_token_ids)
    outs = _drain(engine)
    assert outs["list"].outputs[0].token_ids == outs["gen"].outputs[0].token_ids == \
        outs["numpy"].outputs[0].token_ids


def test_detokenize_false_returns_ids_without_text(tiny_model):
    engine = _engine(tiny_model)
    engine.add_request("text", [72, 105, 33], GREEDY)
    engine.add_request("ids", [72, 105, 33], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                                           detokenize=False))
    outs = _drain(engine)
    text, ids = outs["text"].outputs[0], outs["ids"].outputs[0]
    assert ids.token_ids == text.token_ids
    assert ids.text == "" and text.text == engine.tokenizer.decode(text.token_ids)


def test_pallas_interpret_backend_matches_xla(tiny_model):
    prompts = [list(range(5, 24)), list(range(100, 107)), list(range(40, 76))]
    results = []
    for backend in ("xla", "pallas"):
        engine = _engine(tiny_model, attention_backend=backend, pallas_interpret=True, num_blocks=48,
                         max_num_batched_tokens=16)
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, GREEDY)
        outs = _drain(engine)
        results.append([outs[str(i)].outputs[0].token_ids for i in range(len(prompts))])
    assert results[0] == results[1]


def test_prompt_ids_in_any_integer_container_are_the_same_request(tiny_model):
    engine = _engine(tiny_model)
    ids = list(range(10, 30))
    forms = {"list": ids, "tuple": tuple(ids), "int32": np.array(ids, np.int32), "generator": (i for i in ids),
             "numpy-ints": [np.int64(i) for i in ids]}
    for name, prompt in forms.items():
        engine.add_request(name, prompt, GREEDY)
    outs = _drain(engine)
    for name in forms:
        assert outs[name].prompt_token_ids == ids
        assert all(type(i) is int for i in outs[name].prompt_token_ids)
        assert outs[name].outputs[0].token_ids == outs["list"].outputs[0].token_ids


def test_llm_generate_returns_its_own_outputs_while_other_requests_run():
    llm = LLM("tiny", num_blocks=64, block_size=8, seed=0)
    llm.engine.add_request("side", [5, 6, 7], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    outs = llm.generate([[72, 105], [1, 2, 3]], GREEDY, use_tqdm=False)
    assert [o.request_id for o in outs] == ["llm-0", "llm-1"] and all(o.finished for o in outs)
    assert llm.engine.has_unfinished_requests()  # the side request is still running, untouched
