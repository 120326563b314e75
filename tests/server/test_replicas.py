"""Two engine replicas on a local Ray Serve cluster behind the prefix-aware ingress (`jaxpaged serve --data_parallel_size=2`),
each replica actor owning one engine core process (the default `--engine_core=process`), with API keys: the tests
speak as an admin tenant (a client's `cache_salt` is a sub-namespace of it), and the tenant tests check that keys,
namespaces and a user's scoped reset hold across replicas.

One cluster for the module, started as a `jaxpaged serve` subprocess and
driven with the official `openai` client; each replica's XLA runs
single-threaded so two cores suffice. The ingress's debug endpoints give each
replica's actual cached hashes beside the router's index of it, and kill a
replica's actor. Outputs are compared with `LLM.generate` in this process on
the same weights.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaxpaged.llm import LLM
from jaxpaged.router import RequestHasher
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.tenants import Tenant, tenant_cache_salt
from tests.server.live_server import ROOT, WAIT_S, free_port
from tests.suite_cache import SUITE_CACHE

pytest.importorskip("ray.serve", reason="the replicas need the serve extra (ray[serve])")

KV_TOKENS = 1024  # 64 blocks per replica: small enough that the eviction test evicts
MAX_MODEL_LEN = 512
BLOCK = 16
ENV = {"XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false",
       "JAX_COMPILATION_CACHE_DIR": str(SUITE_CACHE),
       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
       "RAY_USAGE_STATS_ENABLED": "0", "JAX_PLATFORMS": "cpu"}
ADMIN = "sk-admin"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
KEYS = {"allow_sub_namespaces": True, "keys": [{"key": ADMIN, "tenant": "admin", "role": "admin"},
                                               {"key": "sk-alice", "tenant": "alice"},
                                               {"key": "sk-bob", "tenant": "bob"}]}


def _salt(client_salt: str | None = None, tenant: str = "admin") -> str:
    """The cache salt the ingress gives a tenant's request (its namespace, the client's salt inside it)."""
    return tenant_cache_salt(Tenant(tenant), client_salt, allow_sub_namespaces=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("replicas") / "serve.log"
    keys_file = log_path.parent / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxpaged", "serve", "--model=tiny", "--data_parallel_size=2",
             "--host=127.0.0.1", f"--port={port}", f"--kv_budget_tokens={KV_TOKENS}",
             f"--max_model_len={MAX_MODEL_LEN}", "--max_num_batched_tokens=256", "--enable_debug_endpoints",
             f"--api_keys_file={keys_file}"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **ENV), stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: proc.poll() is None and len(_live(base)) == 2, proc, log_path, "two replicas to report")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=ADMIN, max_retries=0, timeout=WAIT_S)


@pytest.fixture(scope="module")
def reference():
    llm = LLM(model="tiny", num_blocks=KV_TOKENS // BLOCK, max_model_len=MAX_MODEL_LEN)
    return lambda prompts, params: llm.generate(prompts, params, use_tqdm=False)


def _wait(condition, proc=None, log_path=None, what="the condition"):
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"jaxpaged serve exited while waiting for {what}:\n{Path(log_path).read_text()[-4000:]}")
        if time.monotonic() > deadline:
            tail = Path(log_path).read_text()[-4000:] if log_path else ""
            raise TimeoutError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.2)


def _replicas(base: str) -> list[dict]:
    return httpx.get(base + "/debug/replicas", timeout=30, headers=AUTH).json()["replicas"]


def _live(base: str) -> list[dict]:
    try:
        return [r for r in _replicas(base) if r.get("cached_hashes") is not None]
    except (httpx.HTTPError, ValueError, KeyError):
        return []


def _index_matches_caches(base: str) -> bool:
    rows = _replicas(base)
    return all(r["cached_hashes"] is not None and r["index_hashes"] == r["cached_hashes"] for r in rows)


def _holder(base: str, hashes: list[bytes]) -> list[str]:
    """Replicas whose actual cache holds all of ``hashes``."""
    wanted = {h.hex() for h in hashes}
    return [r["replica_id"] for r in _replicas(base) if wanted <= set(r["cached_hashes"] or ())]


def _complete(client, prompt, **kwargs):
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=kwargs.pop("max_tokens", 4),
                                     temperature=0.0, **kwargs)


def test_outputs_equal_a_single_engine(client, reference):
    prompts = [[(7 * i + j) % 250 + 1 for j in range(20 + 5 * i)] for i in range(4)]
    for temperature, seed in ((0.0, None), (0.9, 7)):
        params = SamplingParams(max_tokens=10, temperature=temperature, seed=seed, ignore_eos=True)
        expected = [out.outputs[0].text for out in reference(prompts, params)]
        got = [client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=temperature, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text for p in prompts]
        assert got == expected


def test_tenants_stick_to_the_replica_that_cached_their_prefix(server, client):
    hasher = RequestHasher(BLOCK)
    prefix = {"a": [11 + i % 200 for i in range(64)], "b": [3 + (5 * i) % 200 for i in range(64)]}
    salt = {"a": "tenant-a", "b": "tenant-b"}
    owner = {}
    for tenant in ("a", "b"):  # the first request of each tenant: nothing matches, so the least loaded
        # idle as the router sees them: no request in flight, no KV usage left in their last reports
        _wait(lambda: all(r["in_flight"] == 0 and r["reported_load"]["kv_usage"] == 0 for r in _replicas(server)),
              what="idle replicas in the router's view")
        _complete(client, prefix[tenant] + [1, 2], extra_body={"cache_salt": salt[tenant]})
        hashes = hasher.block_hashes(prefix[tenant], _salt(salt[tenant]))
        _wait(lambda: _holder(server, hashes) and _index_matches_caches(server), what="the prefix's events")
        (owner[tenant],) = _holder(server, hashes)
    assert owner["a"] != owner["b"], "idle replicas take turns for requests that match nothing"
    for round_ in range(3):
        for tenant in ("a", "b"):
            out = _complete(client, prefix[tenant] + [100 + round_] * 5, extra_body={"cache_salt": salt[tenant]})
            assert out.usage.prompt_tokens_details.cached_tokens == len(prefix[tenant])
    for tenant, other in (("a", "b"), ("b", "a")):  # each replica caches its tenant's prefix only
        assert _holder(server, hasher.block_hashes(prefix[tenant], _salt(salt[tenant]))) == [owner[tenant]]
        assert owner[tenant] not in _holder(server, hasher.block_hashes(prefix[other], _salt(salt[other])))


def test_index_equals_replica_caches_after_a_run_with_evictions(server, client):
    prompts = [[(13 * i + 3 * j) % 250 + 1 for j in range(40 + i % 7)] for i in range(40)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: _complete(client, p, max_tokens=12), prompts))
    assert all(o.choices[0].finish_reason in ("length", "stop") for o in outs)
    _wait(lambda: _index_matches_caches(server), what="the index to match the caches")
    rows = _replicas(server)
    assert all(r["cached_hashes"] for r in rows)
    assert sum(r["num_evictions"] for r in rows) > 0, "the run should evict cached blocks (BlockRemoved events)"
    assert {r["replica_id"] for r in rows} == {r["replica_id"] for r in _live(server)}


def _replica_series(base: str, name: str) -> dict[str, float]:
    """One engine metric from the ingress's ``/metrics``, by its ``replica`` label."""
    families = text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text)
    return {s.labels["replica"]: s.value for f in families for s in f.samples if s.name == name}


def _replicas_idle(base: str, ids: set[str], last: dict) -> bool:
    """Nothing in flight per the ingress, nothing running or waiting per each replica's engine, and the
    generated-token counters unchanged since the previous call (``last`` keeps them)."""
    rows = _replicas(base)
    running = _replica_series(base, "jaxpaged:num_requests_running")
    waiting = _replica_series(base, "jaxpaged:num_requests_waiting")
    generated = _replica_series(base, "jaxpaged:generation_tokens_total")
    idle = ({r["replica_id"] for r in rows} == ids == set(running) and all(r["in_flight"] == 0 for r in rows)
            and not any(running.values()) and not any(waiting.values()) and generated == last.get("generated"))
    last["generated"] = generated
    time.sleep(0.3)
    return idle


def test_clients_hanging_up_never_kill_a_replica_or_leak_its_count(server, client, reference):
    """Both replicas stall (as for a compile) while impatient clients queue requests and give up, then
    streams disconnect after a chunk or two: the same two replicas live on, the ingress counts nothing in
    flight, each engine is idle, and the next request is right."""
    ids = {r["replica_id"] for r in _live(server)}
    assert len(ids) == 2
    stall = httpx.post(server + "/debug/stall_engine_loop", json={"seconds": 2.0}, timeout=30, headers=AUTH)
    assert stall.status_code == 200
    impatient = openai.OpenAI(base_url=server + "/v1", api_key=ADMIN, max_retries=0, timeout=1.0)

    def give_up(i):
        kwargs = dict(model="tiny", prompt=[i + 1, 5, 5], max_tokens=200, extra_body={"ignore_eos": True})
        with pytest.raises(openai.APITimeoutError):
            if i % 2:
                list(impatient.completions.create(stream=True, **kwargs))
            else:
                impatient.completions.create(**kwargs)

    def read_then_leave(i):
        body = {"model": "tiny", "prompt": [i + 30, 6, 6], "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server + "/v1/completions", json=body, timeout=WAIT_S, headers=AUTH) as response:
            lines = (line for line in response.iter_lines() if line.startswith("data: "))
            for _ in range(1 + i % 2):
                next(lines)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(give_up, range(8)))
        list(pool.map(read_then_leave, range(16)))
    last: dict = {}
    _wait(lambda: _replicas_idle(server, ids, last), what="both replicas to go idle with nothing in flight")
    assert all(v == 0 for v in _replica_series(server, "jaxpaged:kv_cache_usage_perc").values())
    params = SamplingParams(max_tokens=6, temperature=0.0)
    assert _complete(client, [4, 4, 2], max_tokens=6).choices[0].text == \
        reference([[4, 4, 2]], params)[0].outputs[0].text
    assert {r["replica_id"] for r in _live(server)} == ids  # neither replica was replaced


def test_a_refused_multi_prompt_request_leaves_nothing_running(server):
    before = sum(_replica_series(server, "jaxpaged:generation_tokens_total").values())
    response = httpx.post(server + "/v1/completions", timeout=WAIT_S, headers=AUTH, json={
        "model": "tiny", "prompt": ["hello there", ""], "max_tokens": 300, "ignore_eos": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    ids, last = {r["replica_id"] for r in _live(server)}, {}
    _wait(lambda: _replicas_idle(server, ids, last), what="both replicas to go idle")
    assert sum(last["generated"].values()) - before < 300


def test_killed_replica_fails_its_requests_and_leaves_the_index(server, client, reference):
    prefix = [17 + (3 * i) % 200 for i in range(48)]
    _complete(client, prefix + [1])
    _wait(lambda: _holder(server, RequestHasher(BLOCK).block_hashes(prefix, _salt())) and _index_matches_caches(server),
          what="the prefix's events")
    (victim,) = _holder(server, RequestHasher(BLOCK).block_hashes(prefix, _salt()))
    long = dict(max_tokens=MAX_MODEL_LEN - len(prefix) - 8, extra_body={"ignore_eos": True})
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_complete, client, prefix + [2 + i] * 4, **long) for i in range(3)]
        _wait(lambda: next(r for r in _replicas(server) if r["replica_id"] == victim)["in_flight"] == 3,
              what="the requests to run on the victim")
        assert httpx.post(server + "/debug/kill_replica", json={"replica_id": victim}, headers=AUTH).status_code == 200
        for future in futures:
            with pytest.raises(openai.APIStatusError) as err:
                future.result()
            assert err.value.status_code == 503
            assert victim in err.value.message and "failed" in err.value.message
    ids = [r["replica_id"] for r in _replicas(server)]
    assert victim not in ids  # its blocks left the index with it
    _wait(lambda: len(_live(server)) == 2, what="Serve to start a replacement replica")
    assert victim not in [r["replica_id"] for r in _replicas(server)]
    _wait(lambda: _index_matches_caches(server), what="the index to match the caches")
    params = SamplingParams(max_tokens=6, temperature=0.0)
    assert _complete(client, prefix + [9], max_tokens=6).choices[0].text == \
        reference([prefix + [9]], params)[0].outputs[0].text


def test_debug_endpoints_refuse_bad_input(server):
    assert httpx.post(server + "/debug/routing_policy", json={"policy": "random"}, headers=AUTH).status_code == 400
    assert httpx.post(server + "/debug/kill_replica", json={"replica_id": "nope"}, headers=AUTH).status_code == 400


def test_a_bad_request_is_a_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=MAX_MODEL_LEN + 1)
    assert "max_model_len" in err.value.message or "max_tokens" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=[1, 2, 999], max_tokens=2)
    assert "vocabulary" in err.value.message
    assert _complete(client, [1, 2, 3]).choices[0].finish_reason == "length"


def test_each_replica_steps_in_its_own_engine_core_process(server):
    """The default `--engine_core=process`: every replica actor has spawned one engine core process (the pid
    `/debug/replicas` reports), a child of that Ray actor's worker process."""
    pids = [r["pid"] for r in _live(server)]
    assert len(set(pids)) == 2
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"multiprocessing.spawn" in f.read()
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            assert b"ray" in f.read()  # the replica's actor (a Ray worker), not the launcher


def test_keys_and_tenant_namespaces_hold_across_replicas(server, client):
    """No key: 401 at the ingress. Bob's prompt is a miss for alice on whichever replica serves her, and bob's
    reset (a user's: his own namespace) leaves alice's blocks on both replicas."""
    assert httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": [1], "max_tokens": 1},
                      timeout=WAIT_S).status_code == 401
    alice, bob = (openai.OpenAI(base_url=server + "/v1", api_key=key, max_retries=0, timeout=WAIT_S)
                  for key in ("sk-alice", "sk-bob"))
    prompt = [29 + (7 * i) % 200 for i in range(48)] + [1]

    def cached(user):
        return _complete(user, prompt, max_tokens=1).usage.prompt_tokens_details.cached_tokens

    def routed(tenant):  # the router has the tenant's blocks in its index, so its next request goes there
        hashes = RequestHasher(BLOCK).block_hashes(prompt[:48], _salt(tenant=tenant))
        _wait(lambda: _holder(server, hashes) and _index_matches_caches(server), what=f"{tenant}'s events")

    assert cached(bob) == 0
    routed("bob")
    assert cached(bob) == 48
    assert cached(alice) == 0  # same tokens, another tenant: a miss, whatever replica she is routed to
    routed("alice")
    assert cached(alice) == 48
    assert bob.post("/../reset_prefix_cache", cast_to=httpx.Response).status_code == 200
    assert cached(alice) == 48
    assert cached(bob) == 0
    _wait(lambda: _index_matches_caches(server), what="the index to match the caches")
