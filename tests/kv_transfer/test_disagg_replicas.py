"""Prefill and decode deployments on Ray Serve behind one ingress (`jaxpaged serve --prefill_replicas=1
--decode_replicas=1`): one replica each, each owning its engine core process, blocks over ZeroMQ."""

import os
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.live_server import ROOT, WAIT_S, free_port, offline_greedy_text
from tests.suite_cache import SUITE_CACHE

pytest.importorskip("ray.serve", reason="the replicas need the serve extra (ray[serve])")

KV_TOKENS, MAX_LEN = 1024, 512
ENV = {"XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false",
       "JAX_COMPILATION_CACHE_DIR": str(SUITE_CACHE),
       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
       "RAY_USAGE_STATS_ENABLED": "0", "JAX_PLATFORMS": "cpu"}
SHARED = "A system prompt both requests share, long enough for several blocks of sixteen tokens. "


def _transfer(base: str) -> dict[tuple[str, str], float]:
    """KV connector counters by (replica, label) from the ingress's /metrics."""
    found = {}
    response = httpx.get(base + "/metrics", timeout=WAIT_S)
    response.raise_for_status()  # before the app is deployed, Ray Serve's proxy answers 404 "Path '/metrics' not found"
    text = response.text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "jaxpaged:kv_transfer_blocks_total":
                found[(s.labels.get("replica"), s.labels["event"])] = s.value
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("disagg") / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxpaged", "serve", "--model=tiny", "--prefill_replicas=1", "--decode_replicas=1",
             "--host=127.0.0.1", f"--port={port}", f"--kv_budget_tokens={KV_TOKENS}", f"--max_model_len={MAX_LEN}",
             "--max_num_batched_tokens=256"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **ENV), stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 2 * WAIT_S
    try:
        while True:  # both replicas reported: each one's connector counters are in the ingress's /metrics
            try:
                if len({replica for replica, _ in _transfer(base)}) == 2:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the disaggregated app did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _complete(base: str, prompt: str) -> dict:
    response = httpx.post(base + "/v1/completions", timeout=WAIT_S, json={
        "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    return response.json()


def _received(counters) -> float:
    return sum(v for (_, event), v in counters.items() if event == "received")


def _held(counters) -> float:
    return sum(v for (_, event), v in counters.items() if event == "already_held")


def test_greedy_through_the_deployments_equals_colocated_and_the_shared_prefix_is_not_pulled_twice(server):
    first = SHARED + "First question?"
    answer = _complete(server, first)
    assert answer["choices"][0]["text"] == offline_greedy_text(first, KV_TOKENS // 16, MAX_LEN)
    full_blocks = (answer["usage"]["prompt_tokens"] - 1) // 16
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == full_blocks * 16
    after_first = _transfer(server)
    assert _received(after_first) == full_blocks
    second = SHARED + "A second, different question?"
    answer = _complete(server, second)
    assert answer["choices"][0]["text"] == offline_greedy_text(second, KV_TOKENS // 16, MAX_LEN)
    after_second = _transfer(server)
    shared_blocks = len(SHARED) // 16  # the tiny model's tokenizer is one token per byte
    assert _held(after_second) - _held(after_first) >= shared_blocks  # already on the decode replica: not pulled
    assert _received(after_second) - _received(after_first) == (answer["usage"]["prompt_tokens"] - 1) // 16 - \
        (_held(after_second) - _held(after_first))


class _FakeStream:
    def __init__(self, replica):
        self.replica = replica

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise StopAsyncIteration


class _FakePool:
    """Stands in for a ReplicaPool: records each add's params; answers `kv_address` per replica."""

    def __init__(self, replicas, addresses=None, serving=None):
        self._replicas = dict.fromkeys(replicas)
        self.addresses, self.serving, self.params = addresses or {}, serving, []
        self.model_info = None

    async def add_request(self, request_id, prompt, params, **kwargs):
        self.params.append(params)
        return _FakeStream(self.serving)

    async def _ask_each(self, replicas, method, *args):
        return [self.addresses.get(r) if method == "kv_address" else None for r in replicas]


def test_the_decode_hop_names_the_prefill_replica_that_ran_the_prompt():
    import asyncio

    from jaxpaged.sampling_params import SamplingParams
    from jaxpaged.server.replicas.disagg import DisaggPool
    addresses = {"p0": "tcp://10.0.0.1:5600", "p1": "tcp://10.0.0.2:5601"}
    decode = _FakePool(["d0"])
    for serving in ("p1", "p0"):
        pool = DisaggPool(_FakePool(["p0", "p1"], addresses, serving=serving), decode)
        asyncio.run(pool.add_request("r", [1, 2, 3], SamplingParams(max_tokens=4)))
        assert decode.params[-1].kv_source == addresses[serving] and decode.params[-1].max_tokens == 4
