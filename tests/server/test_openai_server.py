"""The OpenAI-compatible server, live in a subprocess, driven with the official `openai` client.

One server at a time for the whole module (tiny model), run twice: the engine
loop in the HTTP server's process (`--engine_core=thread`), and the engine core
in its own process behind two API server processes (`--engine_core=process
--api_server_count=2`); the last test kills its engine loop. Outputs are
compared with `LLM.generate` in this process on the same weights.
"""

import asyncio
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaxpaged.llm import LLM
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.chat import ChatTemplate
from tests.server.live_server import WAIT_S, children_of, listening_pids, maps_jaxlib, read_metrics, serving

KV_TOKENS = 4096


THREAD = ("--engine_core=thread",)
SPLIT = ("--engine_core=process", "--api_server_count=2")  # the default is the split with one API server


@pytest.fixture(scope="module", params=[THREAD, SPLIT], ids=["thread", "process"])
def server(request):
    yield from serving(f"--kv_budget_tokens={KV_TOKENS}", "--max_model_len=512", "--enable_debug_endpoints",
                       *request.param)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def reference():
    """`LLM.generate` on the same weights (greedy and seeded outputs do not depend on batching)."""
    llm = LLM(model="tiny", num_blocks=KV_TOKENS // 16, max_model_len=512)
    return lambda prompts, params: llm.generate(prompts, params, use_tqdm=False)


@pytest.mark.parametrize("seed,temperature", [(None, 0.0), (7, 0.9)])
def test_streamed_equals_non_streamed_equals_engine(client, reference, seed, temperature):
    prompt = "Hello paged world"
    kwargs = dict(model="tiny", prompt=prompt, max_tokens=12, temperature=temperature, seed=seed,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 12
    assert streamed == full.choices[0].text
    ref = reference([prompt], SamplingParams(max_tokens=12, temperature=temperature, seed=seed, ignore_eos=True))[0]
    assert full.choices[0].text == ref.outputs[0].text
    assert full.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert full.choices[0].finish_reason == "length"


def test_chat_uses_the_template_and_matches_the_engine(client, reference):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
    prompt = ChatTemplate().render(messages)
    ref = reference([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    assert reply.choices[0].message.content == ref.outputs[0].text
    assert reply.usage.prompt_tokens == len(ref.prompt_token_ids)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.outputs[0].text


def test_stop_strings_never_reach_the_client(client):
    kwargs = dict(model="tiny", prompt=[5, 6, 7, 8, 9], max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**kwargs).choices[0].text
    start = next(i for i in range(6, len(text) - 2) if "\ufffd" not in text[i:i + 2])
    stop = text[start:start + 2]
    expected = text[:text.index(stop)]
    cut = client.completions.create(stop=[stop], **kwargs).choices[0]
    assert cut.text == expected and cut.finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **kwargs))
    assert streamed == expected


def test_many_concurrent_streaming_clients(server, reference):
    prompts = [[(i * 7 + j) % 250 + 1 for j in range(5 + i % 11)] for i in range(64)]
    aclient = openai.AsyncOpenAI(base_url=server + "/v1", api_key="none", max_retries=0)

    async def one(prompt):
        stream = await aclient.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_of_them():
        return await asyncio.gather(*(one(p) for p in prompts))

    texts = asyncio.run(all_of_them())
    refs = reference(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert texts == [r.outputs[0].text for r in refs]


def test_cached_tokens_reported_per_tenant(client):
    prompt = list(range(1, 65))  # four full blocks

    def cached(salt):
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, extra_body={"cache_salt": salt})
        return out.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") == 48  # the last block holds the token that must be recomputed
    assert cached("tenant-b") == 0


def test_disconnect_mid_stream_frees_the_blocks(server):
    baseline = read_metrics(server)
    body = {"model": "tiny", "prompt": list(range(1, 200)), "max_tokens": 300, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=WAIT_S) as response:
        lines = response.iter_lines()
        got = [line for line, _ in zip((ln for ln in lines if ln.startswith("data:")), range(3))]
    assert len(got) == 3  # it was streaming when the client went away
    deadline = time.monotonic() + WAIT_S
    while True:
        now = read_metrics(server)
        if now["jaxpaged:num_requests_running"] == 0 and now["jaxpaged:kv_cache_usage_perc"] == 0:
            break
        assert time.monotonic() < deadline, f"blocks still held after the disconnect: {now}"
        time.sleep(0.2)
    generated = now["jaxpaged:generation_tokens_total"] - baseline["jaxpaged:generation_tokens_total"]
    assert generated < 300  # aborted, not run to the end


def test_metrics_parse_and_count_http_requests(server, request):
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server + "/metrics").text)}
    assert "jaxpaged:kv_cache_usage_perc" in families
    samples = families["jaxpaged:http_requests"].samples
    ok = [s for s in samples if s.labels.get("path") == "/v1/completions" and s.labels["status"] == "200"]
    assert ok and ok[0].value >= 1
    if "process" in request.node.name:  # the engine core times each loop iteration that stepped
        host = {s.name: s.value for s in families["jaxpaged:engine_core_step_host_seconds"].samples
                if s.name.endswith(("_count", "_sum")) and s.labels["kind"] == "decode"}
        device_steps = next(s.value for s in families["jaxpaged:iteration_tokens"].samples
                            if s.name.endswith("_count"))
        mixed = sum(s.value for s in families["jaxpaged:engine_core_step_host_seconds"].samples
                    if s.name.endswith("_count") and s.labels["kind"] == "mixed")
        assert host["jaxpaged:engine_core_step_host_seconds_count"] + mixed >= device_steps > 0
        assert host["jaxpaged:engine_core_step_host_seconds_sum"] > 0


BAD = [
    ({"model": "nope", "prompt": "x"}, 404, "model"),
    ({"model": "tiny", "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 5}, 400, "top_p"),
    ({"model": "tiny", "prompt": "x", "n": 2.5}, 400, "n"),
    ({"model": "tiny", "prompt": "x", "seed": True}, 400, "seed"),
    ({"model": "tiny", "prompt": "x", "cache_salt": 1.5}, 400, "cache_salt"),
    ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "top_k": 2**40}, 400, "top_k"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 100000}, 400, None),
    ({"model": "tiny", "prompt": ""}, 400, "prompt"),
    ({"model": "tiny", "prompt": []}, 400, "prompt"),
    ({"model": "tiny", "prompt": [1, 99999]}, 400, "prompt"),
    ({"model": "tiny"}, 400, "prompt"),
    ({"model": "tiny", "prompt": "x", "stop": [""]}, 400, "stop"),
    ({"model": "tiny", "prompt": "x", "logprobs": 99}, 400, "logprobs"),
]


@pytest.mark.parametrize("body,status,param", BAD)
def test_bad_requests_are_4xx_and_the_next_is_served(server, body, status, param):
    response = httpx.post(server + "/v1/completions", json=body, timeout=WAIT_S)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["message"]
    if param is not None:
        assert error["param"] == param or param in error["message"], error
    ok = httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": "ok", "max_tokens": 2},
                    timeout=WAIT_S)
    assert ok.status_code == 200


def test_malformed_json_and_empty_messages(server):
    response = httpx.post(server + "/v1/completions", content=b"{bad", headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]
    response = httpx.post(server + "/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"


def test_tokenize_detokenize_and_models(server, client):
    tokens = httpx.post(server + "/tokenize", json={"prompt": "abc"}).json()
    assert tokens["count"] == len(tokens["tokens"]) == 3
    assert httpx.post(server + "/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == "abc"
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.post(server + "/reset_prefix_cache").status_code == 200


def test_only_a_process_running_the_engine_loads_jax(server, request):
    """After every request above (completions, chat, streams, logprobs, tokenize, metrics): the split's API
    servers never imported JAX (on a GPU host, a process that starts a JAX backend takes GPU memory); the
    one-process server, which runs the engine, did (so the check sees JAX where it is)."""
    listening = listening_pids(int(server.rsplit(":", 1)[1]))
    if request.node.callspec.id == "process":
        # the launcher keeps the socket too (to restart an API server on it); the API servers are its children
        api_servers = [pid for pid in listening if any(pid in children_of(other) for other in listening)]
        assert len(listening) == 3 and len(api_servers) == 2
        assert not any(maps_jaxlib(pid) for pid in api_servers)
    else:
        assert len(listening) == 1 and maps_jaxlib(listening[0])


def test_health_turns_503_when_the_engine_loop_dies(server):  # last: it kills the module's server
    assert httpx.get(server + "/health").status_code == 200
    httpx.post(server + "/debug/crash_engine_loop")
    deadline = time.monotonic() + WAIT_S
    while httpx.get(server + "/health").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    response = httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": "x"})
    assert response.status_code == 503
