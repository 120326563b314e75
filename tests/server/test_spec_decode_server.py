"""Speculative decoding through the live server (`--engine_core=process`), driven with the official `openai` client.

The engine core speculates (n-gram, k = 4) with overlapped steps (async scheduling); its API server detokenizes and
applies stop strings, which the core never sees, so a greedy request with a
stop string speculates too and a step can send several tokens past the stop.
Outputs are compared with `LLM.generate` in this process on the same
weights with speculation off: greedy text, token counts, finish reasons.
"""

import openai
import pytest

from jaxpaged.llm import LLM
from jaxpaged.sampling_params import SamplingParams
from tests.server.live_server import read_metrics, serving

KV_TOKENS = 4096
MAX_MODEL_LEN = 512
PROMPTS = ["abcabcabcabc the cat sat on the mat, the cat sat on the", "Hello paged world, hello paged world"]


@pytest.fixture(scope="module")
def server():
    yield from serving(f"--kv_budget_tokens={KV_TOKENS}", f"--max_model_len={MAX_MODEL_LEN}", "--engine_core=process",
                       '--speculative_config={"method": "ngram", "num_speculative_tokens": 4}')


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def reference_llm():
    """`LLM` with speculation off on the same weights."""
    return LLM(model="tiny", num_blocks=KV_TOKENS // 16, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def reference(reference_llm):
    """One greedy or seeded completion from `reference_llm`."""
    return lambda prompt, **kw: reference_llm.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0].outputs[0]


@pytest.fixture(scope="module")
def looping_prompt(reference_llm) -> list[int]:
    """Token ids: a prompt and its greedy continuation, which settles into a cycle. Continuing it, the drafts
    (the cycle, found in the prompt) are accepted from the first step, so a stop string can end mid-step."""
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    out = reference_llm.generate([PROMPTS[0]], params, use_tqdm=False)[0]
    return list(out.prompt_token_ids) + list(out.outputs[0].token_ids)


def test_greedy_outputs_equal_speculation_off(server, client, reference):
    before = read_metrics(server)
    for prompt in PROMPTS:
        full = client.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0,
                                         extra_body={"ignore_eos": True})
        ref = reference(prompt, max_tokens=40, temperature=0, ignore_eos=True)
        assert full.choices[0].text == ref.text and full.usage.completion_tokens == 40
    after = read_metrics(server)
    assert after["jaxpaged:spec_decode_num_drafts_total"] > before.get("jaxpaged:spec_decode_num_drafts_total", 0)
    assert after["jaxpaged:spec_decode_num_accepted_tokens_total"] > 0


def _stop_strings(text: str) -> list[str]:
    """Two-, three- and four-character pieces from inside `text` (no replacement character), so stops hit mid-way."""
    starts = [i for i in range(4, len(text) - 4) if "\ufffd" not in text[i:i + 4]]
    return [text[starts[0]:starts[0] + 2], text[starts[len(starts) // 2]:starts[len(starts) // 2] + 3],
            text[starts[-1]:starts[-1] + 4]]


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
def test_stop_strings_cut_where_speculation_off_cuts(client, reference, looping_prompt, stream):
    for prompt in [*PROMPTS, looping_prompt]:
        whole = reference(prompt, max_tokens=40, temperature=0, ignore_eos=True).text
        for stop in _stop_strings(whole):
            ref = reference(prompt, max_tokens=40, temperature=0, ignore_eos=True, stop=[stop])
            kwargs = dict(model="tiny", prompt=prompt, max_tokens=40, temperature=0, stop=[stop],
                          extra_body={"ignore_eos": True})
            if stream:
                chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                                        **kwargs))
                text = "".join(c.choices[0].text for c in chunks if c.choices)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                usage = chunks[-1].usage
            else:
                full = client.completions.create(**kwargs)
                text, finish, usage = full.choices[0].text, [full.choices[0].finish_reason], full.usage
            assert (text, finish) == (ref.text, [ref.finish_reason]) and ref.finish_reason == "stop"
            assert usage.completion_tokens == len(ref.token_ids)  # no token past the stop string is counted


def test_a_seeded_sampled_request_is_reproducible(client):
    kwargs = dict(model="tiny", prompt=PROMPTS[0], max_tokens=24, temperature=0.8, seed=11,
                  extra_body={"ignore_eos": True})
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first
