"""The API server's output processing (`FrontendOutputs`) over the core's token ids equals the in-process engine's.

One engine runs each request as the core would (`core_params`: token ids only,
no stop strings), its outputs go through the wire format and `FrontendOutputs`;
the same engine then runs the client's own params directly. Every output of
every step must match: text, token ids, finish and stop reasons, logprobs.
"""

import dataclasses

import msgspec
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.core import messages as M
from jaxpaged.server.core.frontend_outputs import FrontendOutputs, core_params
from jaxpaged.server.core.core_outputs import CoreOutputProcessor, to_delta

PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42], [7, 7, 7, 7]]


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model="tiny", num_blocks=128, max_model_len=256), model=tiny_model)


def _view(outs):
    """A step's outputs as plain data, by request id (their order within a step is no promise)."""
    return sorted([(o.request_id, o.finished, [(c.index, c.text, list(c.token_ids), c.finish_reason, c.stop_reason,
                                                c.logprobs, c.cumulative_logprob) for c in o.outputs],
                    o.prompt_logprobs) for o in outs])


def _direct(engine, params):
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, params)
    steps = []
    while engine.has_unfinished_requests():
        steps.append(_view(engine.step()))
    return [s for s in steps if s]


def _split(engine, params):
    front = FrontendOutputs(engine.tokenizer)
    wire = msgspec.msgpack.Decoder(M.StepOutputs)
    direct_outputs = engine.output_processor
    engine.output_processor = CoreOutputProcessor(lambda: engine.tokenizer)  # as the engine core runs
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, core_params(params))
        front.add(f"r{i}", p, params)
    steps = []
    while engine.has_unfinished_requests():
        message = wire.decode(msgspec.msgpack.encode(M.StepOutputs([to_delta(o) for o in engine.step()])))
        outs = []
        for delta in message.outputs:
            got, stopped = front.apply(delta)
            outs += got
            if stopped:
                engine.abort(delta.request_id)
        steps.append(_view(outs))
    engine.output_processor = direct_outputs
    return [s for s in steps if s]


def _stop_string(engine):
    """Two characters from inside the first prompt's greedy text, so the stop hits mid-stream."""
    engine.add_request("probe", PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                text = o.outputs[0].text
    start = next(i for i in range(6, len(text) - 2) if "\ufffd" not in text[i:i + 2])
    return text[start:start + 2]


D, C, F = RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY
CASES = [(D, {}), (C, {}), (F, {}), (D, {"stop": "?"}), (C, {"stop": "?"}),
         (F, {"stop": "?", "include_stop_str_in_output": True}),
         (D, {"n": 2, "temperature": 0.9, "seed": 3, "logprobs": 2}), (D, {"prompt_logprobs": 2}),
         (F, {"prompt_logprobs": 1, "min_tokens": 4})]


@pytest.mark.parametrize("kind,extra", CASES, ids=["delta", "cumulative", "final", "delta-stop", "cumulative-stop",
                                                  "final-stop-included", "delta-n2-logprobs", "delta-prompt-logprobs",
                                                  "final-prompt-logprobs"])
def test_split_outputs_equal_the_engines(engine, kind, extra):
    if "stop" in extra:
        extra = extra | {"stop": [_stop_string(engine)]}
    params = SamplingParams(**({"max_tokens": 24, "temperature": 0, "ignore_eos": True, "output_kind": kind} | extra))
    direct = _direct(engine, params)
    split = _split(engine, params)
    assert split == direct
    assert engine.kv.stats.usage == 0  # the core's aborted requests freed their blocks
    if "stop" in extra:
        finals = [c for step in direct for (_, done, cs, _) in step if done for c in cs]
        assert any(c[3] == "stop" for c in finals)  # the stop string really ended something


def test_core_params_leave_text_and_stops_to_the_front_end():
    p = SamplingParams(stop=["x"], output_kind=RequestOutputKind.FINAL_ONLY, include_stop_str_in_output=True)
    c = core_params(p)
    assert (c.stop, c.detokenize, c.output_kind, c.include_stop_str_in_output) == ((), False,
                                                                                 RequestOutputKind.DELTA, False)
    final = core_params(SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY))
    assert final.output_kind is RequestOutputKind.FINAL_ONLY and not final.detokenize
    assert dataclasses.replace(c, stop=p.stop) != p  # what the core runs is not what the client asked


def _joined(steps) -> dict:
    """Per (request, sequence): its whole text and tokens (DELTA pieces joined), its finish and stop reasons."""
    seqs = {}
    for step in steps:
        for request_id, _, completions, _ in step:
            for index, text, token_ids, finish, stop, _, cumulative_logprob in completions:
                text0, tokens0, _, _, _ = seqs.get((request_id, index), ("", [], None, None, None))
                seqs[request_id, index] = (text0 + text, tokens0 + token_ids, finish, stop, cumulative_logprob)
    return seqs


def _pop_cumulative_logprobs(joined: dict) -> list[float]:
    """Each sequence's last cumulative logprob, taken out of `_joined`'s entries (sorted by sequence)."""
    logprobs = [joined[key][-1] for key in sorted(joined)]
    for key, entry in joined.items():
        joined[key] = entry[:-1]
    return logprobs


def test_a_speculating_core_is_cut_at_the_stop_string(engine, tiny_model):
    """A core that speculates sends several tokens a step, so a stop string can end mid-delta: the front end
    drops the tokens after it, and the client gets what the in-process engine (one token a step) gives."""
    spec = Engine(EngineConfig(model="tiny", num_blocks=128, max_model_len=256,
                               speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                   "disable_by_batch_size": None}), model=tiny_model)
    stop = _stop_string(engine)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, output_kind=D, stop=[stop])
    direct, split = _joined(_direct(engine, params)), _joined(_split(spec, params))
    # the cumulative logprob counts the tokens kept, not those cut after the stop (float noise aside: the
    # verify rows' logits come from another matmul shape than the sample row's)
    direct_logprobs, split_logprobs = (_pop_cumulative_logprobs(j) for j in (direct, split))
    assert split == direct
    assert split_logprobs == pytest.approx(direct_logprobs, rel=1e-4, abs=1e-4)
    assert spec.stats.spec_num_accepted_tokens > 0 and spec.kv.stats.usage == 0
    assert any(finish == "stop" for _, _, finish, _ in direct.values())


@pytest.mark.parametrize("include", [False, True], ids=["stop-excluded", "stop-included"])
def test_tokens_past_a_stop_string_in_one_delta_are_dropped(engine, include):
    """One delta carries a stop string and tokens after it (the byte tokenizer: one token per character)."""
    tokenizer = engine.tokenizer
    tokens = tokenizer.encode("hello STOP world", add_special_tokens=False)
    front = FrontendOutputs(tokenizer)
    params = SamplingParams(max_tokens=32, stop=["STOP"], include_stop_str_in_output=include)
    front.add("r", [5, 6], params)
    token_logprobs = [-0.5 * (i + 1) for i in range(len(tokens))]
    outs, stopped = front.apply(M.RequestDelta("r", False, 0, [M.SeqDelta(0, tokens, sum(token_logprobs), None, None,
                                                                          None, "", token_logprobs)], None))
    assert stopped
    (completion,) = outs[-1].outputs
    assert completion.token_ids == tokenizer.encode("hello STOP", add_special_tokens=False)  # as one token a step
    kept = len(completion.token_ids)  # the cumulative logprob counts the kept tokens only
    assert completion.cumulative_logprob == pytest.approx(sum(token_logprobs[:kept])) and kept < len(tokens)
    assert completion.text == ("hello STOP" if include else "hello ")
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "STOP")
