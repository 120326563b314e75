"""`jaxpaged serve --kv_role=prefill` and `--kv_role=decode` as two processes, `jaxpaged proxy` in front.

Blocks travel over the default transport (``--kv_transport=auto``: ``jax.experimental.transfer``
here) between the two engine core
processes. The prefill engine answers each pull after 1 s
(``--kv_serve_delay_s``), which gives the last test a window to SIGKILL it
mid-transfer; it must stay the module's last.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.server.live_server import (ROOT, WAIT_S, free_port, keep_draining, listening_pids, offline_greedy_text,
                                      start_server, wait_healthy)

KV_TOKENS, MAX_LEN = 2048, 512
COMMON = (f"--kv_budget_tokens={KV_TOKENS}", f"--max_model_len={MAX_LEN}")  # --kv_transport=auto: jax here
PROMPT = "The paged KV cache moves between engines block by block, " * 2


@pytest.fixture(scope="module")
def disagg():
    kv_port, prefill_port, decode_port, proxy_port = (free_port() for _ in range(4))
    kv_address = f"tcp://127.0.0.1:{kv_port}"
    prefill = start_server(f"--port={prefill_port}", *COMMON, "--kv_role=prefill", f"--kv_listen={kv_address}",
                           "--kv_serve_delay_s=1")
    decode = start_server(f"--port={decode_port}", *COMMON, "--kv_role=decode", f"--kv_peers={kv_address}",
                          "--kv_transfer_timeout_s=4")
    proxy = subprocess.Popen([sys.executable, "-m", "jaxpaged", "proxy", f"--port={proxy_port}",
                              f"--prefill=http://127.0.0.1:{prefill_port}",
                              f"--decode=http://127.0.0.1:{decode_port}"],
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs = [prefill, decode, proxy]
    bases = {name: f"http://127.0.0.1:{port}" for name, port in
             (("prefill", prefill_port), ("decode", decode_port), ("proxy", proxy_port))}
    wait_healthy(bases["prefill"], procs)
    wait_healthy(bases["decode"], procs)
    wait_healthy(bases["proxy"], procs)
    for proc in procs:
        keep_draining(proc)
    yield bases | {"kv_port": kv_port}
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def reference():
    return lambda prompt: offline_greedy_text(prompt, KV_TOKENS // 16, MAX_LEN, max_tokens=8)


def _complete(base: str, prompt: str, **extra) -> dict:
    response = httpx.post(base + "/v1/completions", timeout=WAIT_S, json={
        "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def _cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def _transfer(base: str) -> dict[str, float]:
    """The decode engine's KV connector counters by label (``received``, ``failed``, ...)."""
    from prometheus_client.parser import text_string_to_metric_families
    found = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=WAIT_S).text):
        for sample in family.samples:
            if sample.name.startswith("jaxpaged:kv_transfer") and sample.name.endswith("_total"):
                found[sample.labels.get("event") or sample.labels.get("outcome") or "bytes"] = sample.value
    return found


def test_greedy_through_the_proxy_equals_colocated_streamed_and_not(disagg, reference):
    answer = _complete(disagg["proxy"], PROMPT)
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert answer["choices"][0]["text"] == reference(PROMPT)
    assert _cached(answer) == (prompt_tokens - 1) // 16 * 16  # every full block came from the prefill engine
    counters = _transfer(disagg["decode"])
    assert counters["received"] == (prompt_tokens - 1) // 16 and counters["failed"] == counters["refused"] == 0
    assert counters["bytes"] > 0
    other = "A different prompt, long enough to span a few blocks of sixteen tokens each."
    with httpx.stream("POST", disagg["proxy"] + "/v1/completions", timeout=WAIT_S, json={
            "prompt": other, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    import json
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines if json.loads(line[6:])["choices"])
    assert text == reference(other)


def test_bad_input_is_the_prefill_engines_400(disagg):
    response = httpx.post(disagg["proxy"] + "/v1/completions", timeout=WAIT_S,
                          json={"prompt": "x", "max_tokens": -1})
    assert response.status_code == 400 and "error" in response.json()


def test_cache_salt_isolation_holds_across_the_hop(disagg, reference):
    prompt = "Tenant A's private system prompt, which tenant B must never read from a cache. " * 2
    prefilled = _complete(disagg["prefill"], prompt, max_tokens=1, cache_salt="tenant-a")
    # where its blocks are, for the decode hop (the proxy passes it on: the decode engine pulls from there)
    assert prefilled["kv_transfer_params"] == {"remote_address": f"tcp://127.0.0.1:{disagg['kv_port']}"}
    other = _complete(disagg["decode"], prompt, cache_salt="tenant-b")
    assert _cached(other) == 0 and other["choices"][0]["text"] == reference(prompt)
    same = _complete(disagg["decode"], prompt, cache_salt="tenant-a")
    assert _cached(same) > 0 and same["choices"][0]["text"] == reference(prompt)


def test_a_prefill_engine_killed_mid_transfer_makes_decode_recompute(disagg, reference):
    prompt = "This prompt's blocks are in the prefill engine's outbox when it is killed. " * 2
    _complete(disagg["prefill"], prompt, max_tokens=1)
    [core] = listening_pids(disagg["kv_port"])  # the prefill engine core: it serves the KV pulls
    answers = []
    thread = threading.Thread(target=lambda: answers.append(_complete(disagg["decode"], prompt)))
    thread.start()
    time.sleep(0.5)  # the decode engine's pull is waiting for its answer (1 s)
    os.kill(core, signal.SIGKILL)
    thread.join(WAIT_S)
    [answer] = answers
    assert _transfer(disagg["decode"])["failed"] == 1  # the pull was under way, and failed
    assert _cached(answer) == 0  # nothing landed: the whole prompt was computed on the decode engine
    assert answer["choices"][0]["text"] == reference(prompt)
