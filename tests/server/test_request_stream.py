"""A reader that falls behind gets the outputs it missed merged into one (`merge_outputs`, `RequestStream`).

Reference: the same requests run with CUMULATIVE outputs. The DELTA outputs a
slow reader takes, each the merge of a run of consecutive ones, must add up to
the CUMULATIVE final output (tokens, text, logprobs, prompt logprobs, finish).
"""

import asyncio
import copy

import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import CompletionOutput, RequestOutput, RequestOutputKind, merge_outputs
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.request_stream import RequestStream

D, C = RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE
PROMPT = [5, 6, 7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def runs(tiny_model):
    """Every DELTA output of the request, and its CUMULATIVE final output."""
    engine = Engine(EngineConfig(model="tiny", num_blocks=64, max_model_len=128), model=tiny_model)
    return _run(engine, D), _run(engine, C)[-1]


def _run(engine, kind):
    params = SamplingParams(max_tokens=12, n=2, temperature=0.9, seed=7, logprobs=2, prompt_logprobs=1,
                            ignore_eos=True, output_kind=kind)
    engine.add_request("r", PROMPT, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs


def _view(out):
    return ([(c.index, list(c.token_ids), c.text, c.logprobs, c.finish_reason, c.stop_reason) for c in out.outputs],
            out.prompt_logprobs, out.finished)


class _Owner:
    def __init__(self):
        self.aborted = []

    def abort(self, request_id):
        self.aborted.append(request_id)


@pytest.mark.parametrize("group", [1, 2, 3, 100])
def test_merged_delta_outputs_add_up_to_the_cumulative_output(runs, group):
    deltas, final = runs
    assert len(deltas) > 3

    async def read_in_groups():
        stream = RequestStream(_Owner(), "r", asyncio.get_running_loop(), D)
        taken = []
        for i in range(0, len(deltas), group):  # the reader wakes once per `group` outputs
            for out in deltas[i:i + group]:
                stream.put(copy.deepcopy(out))
            taken.append(await stream.__anext__())
        return taken

    taken = asyncio.run(read_in_groups())
    assert len(taken) == -(-len(deltas) // group)
    total = copy.deepcopy(taken[0])
    for out in taken[1:]:
        total = merge_outputs(total, out, D)
    assert _view(total) == _view(final)
    assert taken[-1].finished and not any(o.finished for o in taken[:-1])


def test_cumulative_outputs_are_replaced_and_errors_never_merged():
    async def go():
        stream = RequestStream(_Owner(), "r", asyncio.get_running_loop(), C)
        first = RequestOutput("r", None, [1], [CompletionOutput(0, [2], "a", 0.0, None)], False, 0, None)
        second = RequestOutput("r", None, [1], [CompletionOutput(0, [2, 3], "ab", 0.0, None)], False, 0, None)
        stream.put(first)
        stream.put(second)
        assert await stream.__anext__() is second
        stream.put(first)
        stream.put(RuntimeError("engine died"))
        stream.put(second)
        assert await stream.__anext__() is first
        with pytest.raises(RuntimeError):
            await stream.__anext__()
    asyncio.run(go())
