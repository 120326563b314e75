"""No client can stop the live server, or keep it busy after leaving (`jaxpaged serve`, tiny model, one server).

Clients that hang up (official `openai` client with a short timeout, raw
sockets closed mid-request), refused multi-prompt requests, malformed and
oversized bodies; after each the engine is alive, goes idle (nothing running
or waiting, and the generated-token counter stands still) and the next
request matches `LLM.generate` on the same weights. The last test kills the
engine loop and checks open streams end with an error event.
"""

import concurrent.futures
import json
import socket
import time

import httpx
import openai
import pytest

from tests.server.live_server import (WAIT_S, free_port, offline_greedy_text, read_metrics, served_greedy_text,
                                      start_server, wait_healthy, wait_idle)

KV_TOKENS = 4096
MAX_MODEL_LEN = 512
BODY_LIMIT = 100_000
PROBE = [9, 8, 7, 6, 5]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = start_server("--host=127.0.0.1", f"--port={port}", f"--kv_budget_tokens={KV_TOKENS}",
                        f"--max_model_len={MAX_MODEL_LEN}", "--max_num_seqs=4", "--max_waiting_requests=4",
                        # more prompts per request than the queue holds: the 503 of a queue that fills mid-request
                        "--max_prompts_per_request=16",
                        f"--max_request_body_bytes={BODY_LIMIT}", "--enable_debug_endpoints")
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, [proc])
    yield base, port
    proc.terminate()
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def base(server):
    return server[0]


@pytest.fixture(scope="module")
def expected_probe():
    return offline_greedy_text(PROBE, KV_TOKENS // 16, MAX_MODEL_LEN)


def _probe(base: str) -> str:
    """A later, unrelated request: it must be served, correctly."""
    return served_greedy_text(base, PROBE)


def _long(prompt, **extra) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": True} | extra


def _raw_post(port: int, body: dict | bytes, path: str = "/v1/completions") -> socket.socket:
    """Send a request on a raw socket and return the socket (unread)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_clients_hanging_up_while_the_loop_is_busy(base, server, expected_probe):
    """The loop stalls (as for a compile) while twelve clients queue requests and give up."""
    wait_idle(base)
    assert httpx.post(base + "/debug/stall_engine_loop", json={"seconds": 2.5}).status_code == 200
    impatient = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=1.0)

    def give_up(i):
        with pytest.raises(openai.APITimeoutError):
            kwargs = dict(model="tiny", prompt=[i + 1, 2, 3], max_tokens=300, extra_body={"ignore_eos": True})
            if i % 2:
                list(impatient.completions.create(stream=True, **kwargs))
            else:
                impatient.completions.create(**kwargs)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(give_up, range(8)))
    sockets = [_raw_post(server[1], _long([i + 20, 4, 4], stream=bool(i % 2))) for i in range(4)]
    time.sleep(0.5)
    for sock in sockets:
        sock.close()
    before = wait_idle(base)
    assert httpx.get(base + "/health").status_code == 200
    assert _probe(base) == expected_probe
    after = wait_idle(base)
    assert after["jaxpaged:generation_tokens_total"] - before["jaxpaged:generation_tokens_total"] == 8
    assert after["jaxpaged:kv_cache_usage_perc"] == 0


def test_non_streaming_clients_that_hang_up_are_aborted(base, server, expected_probe):
    before = wait_idle(base)
    sockets = [_raw_post(server[1], _long([i + 3, 1, 4, 1, 5])) for i in range(4)]
    deadline = time.monotonic() + WAIT_S
    while read_metrics(base)["jaxpaged:generation_tokens_total"] < before["jaxpaged:generation_tokens_total"] + 8:
        assert time.monotonic() < deadline, "the requests never started decoding"
        time.sleep(0.05)
    for sock in sockets:  # they were decoding when their clients went away
        sock.close()
    after = wait_idle(base)
    assert after["jaxpaged:generation_tokens_total"] - before["jaxpaged:generation_tokens_total"] < 4 * 400
    assert after["jaxpaged:kv_cache_usage_perc"] == 0
    assert _probe(base) == expected_probe


@pytest.mark.parametrize("prompts,status", [(["hello there", ""], 400),
                                            ([[i + 1, 2, 3] for i in range(10)], 503)])
def test_a_refused_multi_prompt_request_runs_none_of_its_prompts(base, expected_probe, prompts, status):
    """A prompt refused as bad input (400), or by the waiting-queue bound (503, 4 running + 4 waiting):
    the prompts queued before it are aborted, not left running."""
    before = wait_idle(base)
    response = httpx.post(base + "/v1/completions", json=_long(prompts), timeout=WAIT_S)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == status
    after = wait_idle(base)
    assert after["jaxpaged:generation_tokens_total"] - before["jaxpaged:generation_tokens_total"] < 400
    assert _probe(base) == expected_probe  # the next, unrelated client is not refused


@pytest.mark.parametrize("content,status", [
    (b'{"model": "tiny", "prompt": "\xff\xfe"}', 400),  # not UTF-8
    (b'{"model": "\\ud800", "prompt": "x"}', 404),  # a lone surrogate in the model name
    (b'{"model": "tiny", "prompt": "' + b"x" * BODY_LIMIT + b'"}', 413),
    (b'[1, 2', 400),
    (b'"just a string"', 400),
])
def test_malformed_and_oversized_bodies_get_openai_errors(base, content, status):
    response = httpx.post(base + "/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and isinstance(error["message"], str) and error["type"]


def test_chunked_oversized_body_and_unknown_routes(base):
    chunks = (b"x" * 10_000 for _ in range(BODY_LIMIT // 10_000 + 2))  # no Content-Length: counted as read
    response = httpx.post(base + "/v1/completions", content=chunks, headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == 413
    assert httpx.get(base + "/v1/nowhere").json()["error"]["code"] == 404
    assert httpx.get(base + "/v1/completions").json()["error"]["code"] == 405


def test_a_huge_prompt_is_refused_while_other_streams_run(base, expected_probe):
    with httpx.stream("POST", base + "/v1/completions", timeout=WAIT_S,
                      json={"model": "tiny", "prompt": PROBE, "max_tokens": 8, "temperature": 0,
                            "ignore_eos": True, "stream": True}) as stream:
        huge = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "y" * (BODY_LIMIT - 100)},
                          timeout=WAIT_S)
        events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    assert huge.status_code == 400 and "max_model_len" in huge.json()["error"]["message"]
    chat = httpx.post(base + "/v1/chat/completions", timeout=WAIT_S, json={
        "model": "tiny", "messages": [{"role": "user", "content": "z" * (BODY_LIMIT - 200)}]})
    assert chat.status_code == 400 and "max_model_len" in chat.json()["error"]["message"]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == expected_probe


def test_streams_of_a_dead_engine_end_with_an_error_event(base):  # last: it kills the module's server
    wait_idle(base)
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=WAIT_S)
    sdk_stream = client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=400, stream=True,
                                           extra_body={"ignore_eos": True})
    with httpx.stream("POST", base + "/v1/completions", json=_long([4, 5, 6], stream=True),
                      timeout=WAIT_S) as raw:
        lines = (line for line in raw.iter_lines() if line.startswith("data: "))
        first = [next(lines), next(lines)]
        next(iter(sdk_stream))
        assert httpx.post(base + "/debug/crash_engine_loop").status_code == 200
        rest = list(lines)
    assert all("error" not in json.loads(line[6:]) for line in first)
    assert "data: [DONE]" not in rest
    error = json.loads(rest[-1][6:])["error"]
    assert error["code"] == 503 and "engine loop died" in error["message"]
    with pytest.raises(openai.APIError, match="engine loop died"):
        list(sdk_stream)
    response = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "x"})
    assert response.status_code == 503 and response.json()["error"]["code"] == 503
