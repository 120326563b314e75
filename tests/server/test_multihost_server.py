"""Multi-host serving: 2 local processes x 2 CPU devices (TP=4 across them); process 0 serves HTTP.

Process 0 is split (the default): its engine core process is jax process 0 and
broadcasts to process 1, which steps in its own single process. Its outputs
equal a one-process engine's; SIGTERM to process 0 stops both.
"""

import signal

import httpx
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from tests.server.live_server import WAIT_S, children_of, free_port, start_server, wait_healthy
from tests.suite_cache import SUITE_CACHE

CACHE = SUITE_CACHE  # the suite's compile cache (tests/suite_cache.py)


def _start(process_id: int, coordinator: str, port: int):
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
           "JAX_COMPILATION_CACHE_DIR": str(CACHE), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    return start_server(f"--port={port}", "--kv_budget_tokens=1024", "--tensor_parallel_size=4",
                        f"--coordinator_address={coordinator}", "--num_processes=2", f"--process_id={process_id}",
                        env=env)


@pytest.fixture(scope="module")
def group():
    port, coordinator = free_port(), f"localhost:{free_port()}"
    procs = [_start(0, coordinator, port), _start(1, coordinator, port)]
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, procs)
    yield base, procs
    for p in procs:
        p.kill()


def test_outputs_equal_one_process_and_sigterm_stops_the_group(group, tiny_model):
    base, procs = group
    assert len(children_of(procs[0].pid)) >= 2 and not children_of(procs[1].pid)  # core + API server; none
    prompts = [[5, 6, 7, 8, 9, 10], list(range(20, 41))]
    bodies = [{"model": "tiny", "prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": True} for p in prompts]
    bodies.append({"model": "tiny", "prompt": prompts[1], "max_tokens": 6, "temperature": 0.8, "seed": 3,
                   "ignore_eos": True, "n": 2})
    got = [httpx.post(base + "/v1/completions", json=b, timeout=WAIT_S).json() for b in bodies]
    engine = Engine(EngineConfig(model="tiny", num_blocks=64), model=tiny_model)
    for i, b in enumerate(bodies):
        engine.add_request(str(i), b["prompt"], SamplingParams(
            max_tokens=6, temperature=b["temperature"], seed=b.get("seed"), n=b.get("n", 1), ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            finals[out.request_id] = out
    for i, response in enumerate(got):
        assert [c["text"] for c in response["choices"]] == [c.text for c in finals[str(i)].outputs], response
    assert httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "x", "top_p": 3}).status_code == 400
    procs[0].send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=WAIT_S)
    assert procs[1].returncode == 0  # the follower left its loop on process 0's stop
