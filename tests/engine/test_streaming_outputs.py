"""`Engine.step` streams: an output for every request that advanced, as its output kind asks."""

import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams

KINDS = (RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY)
PROMPTS = {"greedy": [72, 101, 108, 108, 111] * 3, "sampled": list(range(30, 51))}


def _params(name, kind):
    if name == "greedy":
        return SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, output_kind=kind)
    return SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=7, ignore_eos=True, output_kind=kind)


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def streams(tiny_model, request):
    """Every output of the same requests under each output kind, in one engine (chunked prefill)."""
    engine = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=96, max_num_batched_tokens=16,
                                 async_scheduling=request.param), model=tiny_model)
    for kind in KINDS:
        for name, prompt in PROMPTS.items():
            engine.add_request(f"{name}-{kind.name}", prompt, _params(name, kind))
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return engine, outputs


def test_one_final_output_per_request_and_it_comes_last(streams):
    _, outputs = streams
    assert len(outputs) == len(KINDS) * len(PROMPTS)
    for rid, outs in outputs.items():
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True], rid
    for name in PROMPTS:
        assert len(outputs[f"{name}-FINAL_ONLY"]) == 1


def test_deltas_add_up_to_the_final_output(streams):
    engine, outputs = streams
    for name in PROMPTS:
        final = {c.index: c for c in outputs[f"{name}-FINAL_ONLY"][0].outputs}
        tokens, texts, reasons = {}, {}, {}
        for out in outputs[f"{name}-DELTA"]:
            assert out.outputs, "a delta output carries something new"
            for c in out.outputs:
                assert c.token_ids or c.finish_reason, "a listed completion has new tokens or just finished"
                tokens.setdefault(c.index, []).extend(c.token_ids)
                texts[c.index] = texts.get(c.index, "") + c.text
                reasons[c.index] = c.finish_reason
        assert tokens == {i: c.token_ids for i, c in final.items()}
        assert reasons == {i: c.finish_reason for i, c in final.items()}
        assert texts == {i: c.text for i, c in final.items()}
        assert all(c.text == engine.tokenizer.decode(c.token_ids) for c in final.values())


def test_cumulative_outputs_grow_one_step_at_a_time(streams):
    _, outputs = streams
    for name in PROMPTS:
        final = {c.index: c for c in outputs[f"{name}-FINAL_ONLY"][0].outputs}
        seen = {}
        for out in outputs[f"{name}-CUMULATIVE"]:
            for c in out.outputs:
                before = seen.get(c.index, [])
                assert c.token_ids[:len(before)] == before and len(c.token_ids) <= len(before) + 1
                seen[c.index] = c.token_ids
        last = {c.index: c for c in outputs[f"{name}-CUMULATIVE"][-1].outputs}
        assert {i: (c.token_ids, c.text) for i, c in last.items()} == \
            {i: (c.token_ids, c.text) for i, c in final.items()}
    # one output per generated token: the greedy request advanced by one token in each step that sampled
    assert len(outputs["greedy-CUMULATIVE"]) == len(outputs["greedy-DELTA"]) == 9
