"""Each request's cost is bounded before it costs anything (`jaxpaged serve`, the split server, tiny model).

Every limit of `jaxpaged/server/limits.py` is tried at its value and one past
it, each body padded to the server's maximum body size: at the limit the
request runs (or is refused by a later check), past it the answer is a 400
in the OpenAI error shape naming the field and the limit. Nothing refused
runs (the generated-token counter moves by exactly the accepted requests'
tokens), integers of any size are 400s, and the API server's resident memory
stays under the bound docs/RELIABILITY.md states.
"""

import json

import httpx
import pytest

from jaxpaged.server import limits as L
from jaxpaged.server.body_limit import json_values_at_most
from tests.server.live_server import (WAIT_S, free_port, keep_draining, listening_pids, start_server, wait_healthy,
                                     wait_idle)

MAX_NUM_SEQS = 4
MAX_WAITING = 16
MAX_PROMPTS = MAX_WAITING // 4  # the derived default
MAX_MODEL_LEN = 256
VOCAB = 272  # the tiny model's
BODY_LIMIT = 4 * 2**20
MAX_JSON_VALUES = (MAX_PROMPTS + 4) * (MAX_MODEL_LEN + 1) + L.JSON_VALUES_SLACK
MIB = 2**20
# The stated bound (docs/RELIABILITY.md): worst-case bodies at the maximum body size grow an API server's
# resident high-water mark by at most 6 bodies' worth, 128 bytes per JSON value a body may hold, and 32 MiB.
RSS_GROWTH_BOUND = 6 * BODY_LIMIT + 128 * MAX_JSON_VALUES + 32 * MIB


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = start_server("--host=127.0.0.1", f"--port={port}", "--engine_core=process", "--kv_budget_tokens=2048",
                        f"--max_model_len={MAX_MODEL_LEN}", f"--max_num_seqs={MAX_NUM_SEQS}",
                        f"--max_waiting_requests={MAX_WAITING}", f"--max_request_body_bytes={BODY_LIMIT}")
    keep_draining(proc)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, [proc])
    api_pids = [pid for pid in listening_pids(port) if pid != proc.pid]  # the launcher holds the socket too
    assert len(api_pids) == 1
    yield base, api_pids[0]
    proc.terminate()
    proc.wait(timeout=60)


def _padded(body: dict) -> bytes:
    """`body` as JSON, grown to exactly the server's maximum body size by an ignored string field."""
    data = json.dumps(body).encode()
    room = BODY_LIMIT - len(data) - len(b', "x_pad": ""')
    assert room >= 0, "the shape alone is over the body limit"
    return data[:-1] + b', "x_pad": "' + b"p" * room + b'"}'


def _one(**fields) -> dict:
    """A cheap greedy completion (one token per sequence) with `fields`."""
    return {"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "ignore_eos": True} | fields


def _with_json_values(count: int) -> dict:
    """A cheap completion whose padded body holds exactly `count` JSON values (an ignored list makes up the rest)."""
    empty = json_values_at_most(_padded(_one(x_filler=[])))
    return _one(x_filler=[0] * (count - empty + 1))


# (what, body of a size, the limit (it runs), one past it (a 400), the refusal's param, a phrase of its message)
SHAPES = [
    ("n", lambda k: _one(n=k), MAX_NUM_SEQS, MAX_NUM_SEQS + 1, "n", f"at most {MAX_NUM_SEQS}"),
    ("best_of", lambda k: _one(n=MAX_NUM_SEQS, best_of=k), MAX_NUM_SEQS, MAX_NUM_SEQS + 1, "best_of",
     f"at most {MAX_NUM_SEQS}"),
    ("prompts", lambda k: _one(prompt=[[i + 1] for i in range(k)]), MAX_PROMPTS, MAX_PROMPTS + 1, "prompt",
     f"at most {MAX_PROMPTS} prompts"),
    # the longest prompt that leaves room for its one output token; past it, more ids than max_model_len
    ("token ids", lambda k: _one(prompt=[7] * k), MAX_MODEL_LEN - 1, MAX_MODEL_LEN + 1, "prompt",
     f"max_model_len ({MAX_MODEL_LEN})"),
    ("stop strings", lambda k: _one(stop=[f"s{i}" for i in range(k)]), L.MAX_STOP_STRINGS, L.MAX_STOP_STRINGS + 1,
     "stop", f"at most {L.MAX_STOP_STRINGS}"),
    ("stop length", lambda k: _one(stop="s" * k), L.MAX_STOP_STRING_CHARS, L.MAX_STOP_STRING_CHARS + 1, "stop",
     f"at most {L.MAX_STOP_STRING_CHARS} characters"),
    ("stop_token_ids", lambda k: _one(stop_token_ids=list(range(k))), L.MAX_STOP_TOKEN_IDS,
     L.MAX_STOP_TOKEN_IDS + 1, "stop_token_ids", f"at most {L.MAX_STOP_TOKEN_IDS}"),
    ("bad_words", lambda k: _one(bad_words=[f"w{i}" for i in range(k)]), L.MAX_BAD_WORDS, L.MAX_BAD_WORDS + 1,
     "bad_words", f"at most {L.MAX_BAD_WORDS}"),
    ("bad word length", lambda k: _one(bad_words=["w" * k]), L.MAX_BAD_WORD_CHARS, L.MAX_BAD_WORD_CHARS + 1,
     "bad_words", f"at most {L.MAX_BAD_WORD_CHARS} characters"),
    ("JSON values", _with_json_values, MAX_JSON_VALUES, MAX_JSON_VALUES + 1, None, f"at most {MAX_JSON_VALUES}"),
]


def _generated(base: str) -> float:
    return wait_idle(base)["jaxpaged:generation_tokens_total"]


def _hwm_kib(pid: int) -> int:
    """The process's resident-memory high-water mark (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.fixture(scope="module")
def baseline_hwm(server):
    base, pid = server
    httpx.post(base + "/v1/completions", json=_one(), timeout=WAIT_S).raise_for_status()  # warm: first request
    return _hwm_kib(pid)


@pytest.mark.parametrize("what,make,at_limit,past_limit,param,phrase", SHAPES, ids=[s[0] for s in SHAPES])
def test_each_limit_at_its_value_runs_and_one_past_is_a_400(server, baseline_hwm, what, make, at_limit, past_limit,
                                                             param, phrase):
    base, _ = server
    if what == "JSON values":
        assert json_values_at_most(_padded(make(at_limit))) == MAX_JSON_VALUES
    before = _generated(base)
    at = httpx.post(base + "/v1/completions", content=_padded(make(at_limit)), timeout=WAIT_S,
                    headers={"content-type": "application/json"})
    assert at.status_code == 200, at.text
    choices = at.json()["choices"]
    assert len(choices) == (MAX_NUM_SEQS if what in ("n", "best_of") else MAX_PROMPTS if what == "prompts" else 1)
    assert _generated(base) - before == len(choices)  # one token each, and nothing else ran

    past = httpx.post(base + "/v1/completions", content=_padded(make(past_limit)), timeout=WAIT_S,
                      headers={"content-type": "application/json"})
    assert past.status_code == 400, past.text
    error = past.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert error["param"] == param and phrase in error["message"], error
    assert _generated(base) - before == len(choices)  # the refused request queued nothing


@pytest.mark.parametrize("body", [
    {"prompt": [2**70]}, {"prompt": [[1], [-(2**70)]]}, {"prompt": [2**63]}, {"prompt": "x", "seed": 2**64},
    {"prompt": "x", "n": 2**31 - 1}, {"prompt": "x", "n": 10**30}, {"prompt": "x", "best_of": 2**70},
    {"prompt": "x", "max_tokens": 2**70}, {"prompt": "x", "stop_token_ids": [2**70]},
    {"prompt": "x", "logit_bias": {str(2**70): 1}}, {"prompt": "x", "logprobs": 2**70},
    {"prompt": "x", "prompt_logprobs": -(2**70)}, {"prompt": "x", "top_k": 2**70}, {"prompt": "x", "min_tokens": 2**70},
])
def test_integers_of_any_size_are_400s(server, body):
    base, _ = server
    response = httpx.post(base + "/v1/completions", json=body, timeout=WAIT_S)
    assert response.status_code == 400, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path,body", [
    ("/v1/cache/pin", {"prompt": [2**70], "ttl_s": 1}), ("/detokenize", {"tokens": [2**70]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2**70,
                              "logprobs": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2**40}),
])
def test_integers_of_any_size_are_400s_on_every_route(server, path, body):
    base, _ = server
    response = httpx.post(base + path, json=body, timeout=WAIT_S)
    assert response.status_code == 400, response.text


def test_logit_bias_entries_past_the_limit_are_a_400(server):
    """The tiny vocabulary is smaller than the limit: 1,024 entries are refused for their ids, 1,025 for
    their number."""
    base, _ = server
    at = httpx.post(base + "/v1/completions", json=_one(logit_bias={str(i): 0 for i in range(1024)}), timeout=WAIT_S)
    assert at.status_code == 400 and "outside the vocabulary" in at.json()["error"]["message"], at.text
    past = httpx.post(base + "/v1/completions", json=_one(logit_bias={str(i): 0 for i in range(1025)}),
                      timeout=WAIT_S)
    assert past.status_code == 400 and "at most 1024 entries" in past.json()["error"]["message"], past.text
    assert past.json()["error"]["param"] == "logit_bias"


def _worst_bodies() -> list[tuple[str, bytes]]:
    """Bodies at the maximum size whose parse is the costliest per byte (each value a Python object)."""
    values = MAX_JSON_VALUES
    fill = BODY_LIMIT - 64
    return [
        ("text prompt", b'{"prompt": "' + b"a" * fill + b'"}'),
        ("one-id prompts", b'{"prompt": [' + b"[1]," * (fill // 4) + b"[1]]}"),
        ("empty strings", b'{"prompt": "x", "stop": [' + b'"",' * (fill // 3) + b'""]}'),
        ("empty objects", b'{"prompt": "x", "stop": [' + b"{}," * (fill // 3) + b"{}]}"),
        ("wrong-typed items", b'{"prompt": "x", "stop_token_ids": [' + b"1.5," * (fill // 4) + b"1]}"),
        ("deep nesting", b'{"prompt": "x", "user": ' + b"[" * (fill // 2) + b"]" * (fill // 2) + b"}"),
        ("nesting within the value bound", b'{"prompt": "x", "user": ' + b"[" * (values // 2) + b"]" * (values // 2)
         + b', "x_pad": "' + b"p" * (fill - values) + b'"}'),
        ("messages", b'{"messages": [' + b",".join([b'{"role":"user","content":"a"}'] * (fill // 30)) + b"]}"),
        ("logit_bias", b'{"prompt": "x", "logit_bias": {' + b",".join(b'"%d":"a"' % i for i in range(fill // 14))
         + b"}}"),
    ]


def test_worst_case_bodies_keep_the_api_server_under_its_memory_bound(server, baseline_hwm):
    base, pid = server
    before = _generated(base)
    for name, body in _worst_bodies():
        assert len(body) <= BODY_LIMIT, name
        response = httpx.post(base + "/v1/completions" if b'"messages"' not in body[:20] else
                              base + "/v1/chat/completions", content=body, timeout=WAIT_S,
                              headers={"content-type": "application/json"})
        assert response.status_code == 400, (name, response.text[:300])
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}, name
        growth = (_hwm_kib(pid) - baseline_hwm) * 1024
        print(f"{name}: VmHWM +{growth / MIB:.1f} MiB")
        assert growth <= RSS_GROWTH_BOUND, (name, growth / MIB)
    assert _generated(base) == before  # none of them queued anything
    assert httpx.post(base + "/v1/completions", json=_one(), timeout=WAIT_S).status_code == 200
