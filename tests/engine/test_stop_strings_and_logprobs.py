"""Stop strings (matched on detokenized text, never leaked) and per-token logprobs."""

import math

import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100] * 2
KINDS = (RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY)


def _run(engine, params_by_id):
    for rid, params in params_by_id.items():
        engine.add_request(rid, PROMPT, params)
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def engine(tiny_model, request):
    return Engine(EngineConfig(model="tiny", block_size=4, num_blocks=64, async_scheduling=request.param),
                  model=tiny_model)


@pytest.fixture(scope="module")
def free_text(engine):
    """The greedy text with no stop string, and a stop string taken from its middle."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    text = _run(engine, {"free": params})["free"][0].outputs[0].text
    start = next(i for i in range(6, len(text) - 2) if "\ufffd" not in text[i:i + 2])
    stop = text[start:start + 2]
    return text, stop


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_the_text_and_never_leaks(engine, free_text, include):
    text, stop = free_text
    expected = text[:text.index(stop)] + (stop if include else "")
    params = {kind.name: SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=["\x00never", stop],
                                        include_stop_str_in_output=include, output_kind=kind) for kind in KINDS}
    outputs = _run(engine, params)
    for kind in KINDS:
        outs = outputs[kind.name]
        final = outs[-1].outputs[0]
        assert final.finish_reason == "stop" and final.stop_reason == stop
        streamed = "".join(o.outputs[0].text for o in outs) if kind is RequestOutputKind.DELTA else final.text
        assert streamed == expected, kind
        if kind is RequestOutputKind.CUMULATIVE:
            for o in outs:  # nothing past the cut is ever handed out, not even part of the stop string
                assert expected.startswith(o.outputs[0].text)
        assert len(final.token_ids if kind is not RequestOutputKind.DELTA
                   else sum((o.outputs[0].token_ids for o in outs), [])) < 24
    assert engine.kv.stats.usage == 0  # the stopped requests' blocks are free


def test_stop_strings_are_validated():
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=[""])
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=[3])
    with pytest.raises(ValueError, match="beam"):
        SamplingParams(stop=["x"], beam_width=2)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=True)
    assert SamplingParams(stop="ab").stop == ("ab",)


def test_logprobs_of_each_output_token(engine):
    params = {
        "top3": SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3),
        "top0": SamplingParams(temperature=1.0, seed=3, max_tokens=6, ignore_eos=True, logprobs=0,
                               output_kind=RequestOutputKind.DELTA),
        "none": SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    }
    outputs = _run(engine, params)
    top3 = outputs["top3"][-1].outputs[0]
    assert len(top3.logprobs) == len(top3.token_ids) == 6
    for token, entry in zip(top3.token_ids, top3.logprobs):
        assert len(entry) == 3  # greedy: the sampled token is one of the top 3
        assert max(entry, key=entry.get) == token
        assert all(v <= 0 for v in entry.values())
    assert math.isclose(sum(e[t] for t, e in zip(top3.token_ids, top3.logprobs)), top3.cumulative_logprob,
                        rel_tol=1e-5, abs_tol=1e-5)
    deltas = outputs["top0"]
    tokens = sum((o.outputs[0].token_ids for o in deltas), [])
    entries = sum((o.outputs[0].logprobs for o in deltas), [])
    assert [list(e) for e in entries] == [[t] for t in tokens]  # the sampled token alone
    assert outputs["none"][-1].outputs[0].logprobs is None
