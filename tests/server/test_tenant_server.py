"""A live `jaxpaged serve` with API keys (one server, engine core in its own process, two API server processes),
driven by the official `openai` client: every refusal (missing key, wrong key, a user in another tenant's
namespace, a tenant over its concurrency, queue or pin limits) has its status and OpenAI error type, one tenant's
prompt is a cache miss for another whatever `cache_salt` the other sends, and a user's reset drops only its own
namespace."""

import json
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.live_server import WAIT_S, keep_draining, free_port, start_server, wait_healthy, wait_idle

PROMPT = list(range(1, 65))  # four full blocks: a hit reuses three (the last token is always recomputed)
KEYS = {"keys": [
    {"key": "sk-alice", "tenant": "alice", "max_concurrent_requests": 1},
    {"key": "sk-bob", "tenant": "bob", "max_pins": 2, "max_pinned_blocks": 6},
    {"key": "sk-ops", "tenant": "ops", "role": "admin"},
    {"key": "sk-carol", "tenant": "carol", "max_queued_requests": 1}]}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    port = free_port()
    proc = start_server("--host=127.0.0.1", f"--port={port}", "--kv_budget_tokens=4096", "--max_model_len=512",
                        f"--api_keys_file={keys_file}", "--scheduling_policy=fair", "--api_server_count=2",
                        "--enable_debug_endpoints")
    log = keep_draining(proc)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, [proc])
    yield base
    proc.terminate()
    proc.wait(timeout=60)
    assert not any("Traceback" in line for line in log), "".join(log)


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=WAIT_S)


def cached_tokens(base: str, key: str, **extra) -> int:
    out = client(base, key).completions.create(model="tiny", prompt=PROMPT, max_tokens=1, extra_body=extra)
    return out.usage.prompt_tokens_details.cached_tokens


def test_missing_or_wrong_key_is_401_but_health_and_metrics_are_open(base):
    for key in ("sk-wrong", "sk-alic", "sk-alice-"):
        with pytest.raises(openai.AuthenticationError) as refused:
            client(base, key).completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=1)
        assert refused.value.status_code == 401
        assert refused.value.body["type"] == "AuthenticationError"
    with pytest.raises(openai.AuthenticationError):  # the client sends no key at all
        client(base, "sk-bob").completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=1,
                                                  extra_headers={"Authorization": ""})
    for path in ("/v1/models", "/v1/completions", "/reset_prefix_cache", "/v1/cache/pin", "/tokenize"):
        response = httpx.post(base + path, json={})
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == 401
    assert httpx.get(base + "/v1/models", headers={"Authorization": "Basic sk-alice"}).status_code == 401
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/metrics").status_code == 200
    assert client(base, "sk-bob").models.list().data[0].id == "tiny"


def test_another_tenants_prompt_is_a_miss_whatever_salt_is_sent(base):
    wait_idle(base)
    assert cached_tokens(base, "sk-alice") == 0
    assert cached_tokens(base, "sk-alice") == 48  # alice hits her own blocks
    assert cached_tokens(base, "sk-alice", cache_salt="anything") == 48  # her salt is her tenant's, not hers
    assert cached_tokens(base, "sk-bob") == 0  # without isolation, the same unsalted prompt would hit 48
    for salt in ("alice", '["tenant", "alice"]'):  # whatever bob sends, he hits only what he computed himself
        assert cached_tokens(base, "sk-bob", cache_salt=salt) == 48
    assert cached_tokens(base, "sk-ops", cache_salt='["tenant", "alice"]') == 0  # an admin too: own namespace


def reset(base: str, key: str) -> int:
    return client(base, key).post("/../reset_prefix_cache", cast_to=httpx.Response).status_code


def test_a_users_reset_drops_only_its_own_namespace(base):
    wait_idle(base)
    for key in ("sk-alice", "sk-bob", "sk-ops"):
        cached_tokens(base, key)  # each tenant's namespace holds the prompt's blocks
    assert reset(base, "sk-bob") == 200
    assert cached_tokens(base, "sk-alice") == 48  # other tenants' blocks stay
    assert cached_tokens(base, "sk-ops") == 48
    assert cached_tokens(base, "sk-bob") == 0  # bob's own are gone
    assert cached_tokens(base, "sk-bob") == 48


def test_foreign_pins_and_a_whole_reset_need_an_admin(base):
    wait_idle(base)
    with pytest.raises(openai.PermissionDeniedError):
        client(base, "sk-bob").post("/cache/pin", body={"prompt": PROMPT, "ttl_s": 0, "tenant": "alice"},
                                    cast_to=httpx.Response)
    own = client(base, "sk-bob").post("/cache/pin", body={"prompt": PROMPT, "ttl_s": 60, "tenant": "bob"},
                                      cast_to=httpx.Response)
    assert own.status_code == 200
    foreign = client(base, "sk-ops").post("/cache/pin", body={"prompt": PROMPT, "ttl_s": 0, "tenant": "alice"},
                                          cast_to=httpx.Response)
    assert foreign.status_code == 200
    with pytest.raises(openai.BadRequestError, match="no tenant named 'nobody'"):
        client(base, "sk-ops").post("/cache/pin", body={"prompt": PROMPT, "ttl_s": 1, "tenant": "nobody"},
                                    cast_to=httpx.Response)
    assert cached_tokens(base, "sk-alice") == 48
    cached_tokens(base, "sk-bob")
    assert reset(base, "sk-ops") == 200
    assert cached_tokens(base, "sk-alice") == 0  # the admin's reset dropped every namespace
    assert cached_tokens(base, "sk-bob") == 0


def test_a_tenant_past_its_concurrency_limit_gets_429_and_others_do_not(base):
    wait_idle(base)
    first_chunk = threading.Event()
    done = threading.Event()

    def long_stream():
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=WAIT_S,
                          headers={"Authorization": "Bearer sk-alice"}) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    first_chunk.set()
                    if done.is_set():
                        return

    streamer = threading.Thread(target=long_stream, daemon=True)
    streamer.start()
    try:
        assert first_chunk.wait(WAIT_S)
        for _ in range(8):  # each on a new connection: either API server process may take it
            with pytest.raises(openai.RateLimitError) as refused:
                client(base, "sk-alice").completions.create(model="tiny", prompt=[1, 2], max_tokens=1)
            assert refused.value.status_code == 429
            assert refused.value.response.headers["retry-after"] == "1"
            assert "max_concurrent_requests" in refused.value.message
        assert client(base, "sk-bob").completions.create(model="tiny", prompt=[1, 2], max_tokens=1).choices
    finally:
        done.set()
        streamer.join(WAIT_S)
    wait_idle(base)
    assert client(base, "sk-alice").completions.create(model="tiny", prompt=[1, 2], max_tokens=1).choices


def test_pins_past_a_tenants_quota_get_429_and_nothing_is_pinned(base):
    bob = client(base, "sk-bob")

    def pin(prompt, ttl_s):
        return bob.post("/cache/pin", body={"prompt": prompt, "ttl_s": ttl_s}, cast_to=httpx.Response)

    bob.post("/cache/pin", body={"prompt": PROMPT, "ttl_s": 0}, cast_to=httpx.Response)  # a clean slate
    assert pin(list(range(100, 132)), 60).status_code == 200  # 2 blocks
    with pytest.raises(openai.RateLimitError, match="max_pinned_blocks=6") as refused:
        pin(list(range(140, 220)), 60)  # 5 more blocks
    assert refused.value.response.headers["retry-after"] == "1"
    assert pin(list(range(140, 204)), 60).status_code == 200  # 4 more: 6 in all
    with pytest.raises(openai.RateLimitError, match="max_pins=2"):
        bob.completions.create(model="tiny", prompt=list(range(230, 246)), max_tokens=1,
                               extra_body={"pin_ttl_s": 60})
    assert pin(list(range(100, 132)), 0).status_code == 200  # unpinning frees its share
    out = bob.completions.create(model="tiny", prompt=list(range(230, 246)), max_tokens=1,
                                 extra_body={"pin_ttl_s": 60})
    assert out.choices


def test_priority_reaches_the_engine_and_a_bad_one_is_a_400(base):
    bob = client(base, "sk-bob")
    assert bob.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2, extra_body={"priority": -3}).choices
    with pytest.raises(openai.BadRequestError, match="priority") as refused:
        bob.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2, extra_body={"priority": 2**40})
    assert refused.value.body["param"] == "priority"


def test_a_bad_keys_file_stops_the_server_before_it_starts(tmp_path):
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"keys": [{"key": "k", "tenant": "a", "role": "root"}]}))
    proc = start_server("--port=1", f"--api_keys_file={keys_file}")
    out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode != 0
    assert "keys[0].role must be one of ['user', 'admin']" in out


def http_requests(connection: httpx.Client) -> tuple[dict[tuple[str, str, str], float], tuple]:
    """(method, path, status) -> the jaxpaged:http_requests count, from the /metrics of the connection's API
    server, and the client address of the TCP connection that read it."""
    response = connection.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    counts = {(s.labels["method"], s.labels["path"], s.labels["status"]): s.value
              for s in families["jaxpaged:http_requests"].samples if s.name.endswith("_total")}
    return counts, client_address(response)


def client_address(response: httpx.Response) -> tuple:
    """The local (host, port) of the TCP connection a response came on: the same address, the same server process."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def test_middleware_refusals_are_counted_in_http_requests(base):
    # The series is per API server process, so the refusals and the counts around them must travel on one
    # keep-alive connection. A server may close an idle connection (uvicorn's keep-alive timeout) and the client
    # then opens a new one, possibly to the other API server: such a try is recognised and run again.
    for _ in range(3):
        with httpx.Client(base_url=base, timeout=WAIT_S) as connection:
            before, first = http_requests(connection)
            refused = [connection.get("/v1/models", headers={"Authorization": "Bearer nope"}) for _ in range(2)]
            refused.append(connection.get("/no/such/route"))  # refused before any route is matched
            addresses = {client_address(r) for r in refused}  # while the connection is open
            after, last = http_requests(connection)
        if addresses | {last} == {first}:
            break
    else:
        pytest.fail("three tries each changed TCP connection: no count could be read from one API server")
    assert [r.status_code for r in refused] == [401, 401, 401]
    assert after[("GET", "/v1/models", "401")] - before.get(("GET", "/v1/models", "401"), 0) == 2
    assert after[("GET", "unmatched", "401")] - before.get(("GET", "unmatched", "401"), 0) == 1


def test_a_tenant_past_its_queued_limit_gets_429_while_others_queue(base):
    """carol may have one request waiting: the core is stalled while three of hers and two of bob's arrive
    (through both API servers), so all five wait together when it reads them; two of carol's are refused."""
    wait_idle(base)
    stalled = httpx.post(base + "/debug/stall_engine_loop", json={"seconds": 4},
                         headers={"Authorization": "Bearer sk-ops"})
    assert stalled.status_code == 200
    results: dict[str, list] = {"sk-carol": [], "sk-bob": []}

    def complete(key):
        try:
            out = client(base, key).completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2)
            results[key].append(out.usage.completion_tokens)
        except openai.RateLimitError as refused:
            results[key].append(refused)

    threads = [threading.Thread(target=complete, args=(key,)) for key in ["sk-carol"] * 3 + ["sk-bob"] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    refusals = [r for r in results["sk-carol"] if isinstance(r, openai.RateLimitError)]
    assert len(refusals) == 2 and results["sk-carol"].count(2) == 1, results
    assert all("max_queued_requests" in r.message and r.status_code == 429 for r in refusals)
    assert all(r.response.headers["retry-after"] == "1" for r in refusals)
    assert results["sk-bob"] == [2, 2]  # no limit of bob's: both of his queued
