"""Server lifecycle: the waiting-queue bound (503 + Retry-After), and SIGTERM saving the prefix-cache snapshot."""

import asyncio
import signal
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.api import build_app
from jaxpaged.server.async_engine import AsyncEngine, QueueFullError
from tests.server.live_server import WAIT_S, free_port, start_server, wait_healthy

@pytest.fixture(scope="module")
def busy_engine(tiny_model):
    """One sequence at a time, so a second request waits while a long first one runs."""
    return Engine(EngineConfig(model="tiny", num_blocks=64, max_num_seqs=1, max_model_len=1024), model=tiny_model)


def test_queue_bound_refuses_then_recovers(busy_engine):
    async_engine = AsyncEngine(busy_engine, max_waiting_requests=1)
    async_engine.start()
    long = SamplingParams(temperature=0, max_tokens=900, ignore_eos=True)

    async def scenario():
        running = await async_engine.add_request("long", [1, 2, 3], long)
        first = await running.__anext__()  # it runs; nothing else can be admitted beside it
        waiting = await async_engine.add_request("waiting", [4, 5, 6], SamplingParams(max_tokens=2))
        with pytest.raises(QueueFullError, match="waiting queue is full"):
            await async_engine.add_request("refused", [7, 8, 9], SamplingParams(max_tokens=2))
        await running.aclose()  # the client goes away: its request is aborted, the waiting one runs
        outs = [o async for o in waiting]
        return first, outs

    first, outs = asyncio.run(scenario())
    assert not first.finished and outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert not busy_engine.has_request("refused")
    async_engine.shutdown()
    assert busy_engine.kv.stats.usage == 0


def test_queue_full_is_a_503_with_retry_after(busy_engine):
    async_engine = AsyncEngine(busy_engine, max_waiting_requests=0)
    with TestClient(build_app(async_engine, served_model_name="tiny")) as client:
        response = client.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 2})
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        assert "waiting queue is full" in response.json()["error"]["message"]


def _start_server(port: int, snapshot: Path):
    proc = start_server(f"--port={port}", "--kv_budget_tokens=2048", f"--prefix_cache_snapshot={snapshot}",
                        "--save_prefix_cache_on_shutdown")
    wait_healthy(f"http://127.0.0.1:{port}", [proc])
    return proc


def test_sigterm_saves_the_snapshot_and_a_restart_serves_hits(tmp_path):
    snapshot, port = tmp_path / "snapshot", free_port()
    body = {"model": "tiny", "prompt": list(range(1, 65)), "max_tokens": 2}
    proc = _start_server(port, snapshot)
    try:
        first = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=WAIT_S).json()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught: the exit says SIGTERM
        assert proc.wait(timeout=WAIT_S) in (0, -signal.SIGTERM)
        assert "Finished server process" in proc.stdout.read()
    finally:
        proc.kill()
    assert snapshot.exists()
    proc = _start_server(port, snapshot)
    try:
        again = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=WAIT_S).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 48  # restored from the snapshot
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
    finally:
        proc.terminate()
        proc.wait(timeout=WAIT_S)
