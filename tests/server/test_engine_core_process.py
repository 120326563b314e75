"""The split server's failure behaviour (`--engine_core=process`), with the official `openai` client.

An API server that dies leaves the core and the other API server serving; the
core killed with SIGKILL ends every open stream with an error event and turns
/health into 503, then every process exits; SIGTERM drains an open stream,
saves the snapshot and leaves no process behind; the launcher killed with
SIGKILL still drains and leaves no process behind. (The OpenAI API's behaviour
over the split is `test_openai_server.py`'s, run against both.)
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.server.live_server import (WAIT_S, children_of, free_port, listening_inodes, start_server,
                                     wait_healthy)


def _start(*flags):
    port = free_port()
    proc = start_server(f"--port={port}", "--engine_core=process", "--api_server_count=2", "--kv_budget_tokens=2048",
                        "--max_model_len=1024", "--drain_timeout_s=20", *flags)
    core, apis = None, []
    for line in proc.stdout:  # the launcher names its children before they serve
        found = re.search(r"engine core pid (\d+); API servers \[([\d, ]+)\]", line)
        if found:
            core, apis = int(found.group(1)), [int(p) for p in found.group(2).split(",")]
            break
    assert core is not None, "the launcher did not start"
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep the pipe drained
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, [proc])
    _wait_listening(apis, port)  # /health may have been answered by one API server while another still starts
    return proc, base, core, apis


def _fd_targets(pid: int) -> set[str]:
    """What the open file descriptors of `pid` point at (fds closing meanwhile are skipped)."""
    targets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return targets


def _wait_listening(pids: list[int], port: int) -> None:
    """Until every process in `pids` holds a listening socket on `port`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        listening = {f"socket:[{inode}]" for inode in listening_inodes(port)}
        if all(_fd_targets(pid) & listening for pid in pids):
            return
        assert time.monotonic() < deadline, f"API servers not listening on {port}: {pids}"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Whether any thread of `pid` has yet to exit. Not the leader's state alone: a killed process's leader turns
    zombie at once while its other threads, still holding the process's sockets, take tens of ms to exit."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except FileNotFoundError:
            pass
    return False


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + WAIT_S
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if _alive(p)]}"
        time.sleep(0.1)


def _long_stream(client: openai.OpenAI, max_tokens: int = 900, model: str = "tiny"):
    return client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=max_tokens, temperature=0, stream=True,
                                     extra_body={"ignore_eos": True})


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=WAIT_S)


def test_api_server_death_then_sigterm_drains_and_saves(tmp_path):
    snapshot = tmp_path / "snapshot"
    proc, base, core, apis = _start(f"--prefix_cache_snapshot={snapshot}", "--save_prefix_cache_on_shutdown")
    try:
        assert len(listening_inodes(int(base.rsplit(":", 1)[1]))) == 1  # one accept queue, which outlives a server
        os.kill(apis[0], signal.SIGKILL)
        _wait_gone([apis[0]])
        client = _client(base)
        for _ in range(8):  # new connections reach the API server that is left
            out = client.completions.create(model="tiny", prompt=list(range(1, 65)), max_tokens=2)
            assert out.choices[0].finish_reason == "length"
        assert _alive(core) and _alive(apis[1]) and proc.poll() is None
        assert httpx.get(base + "/health").status_code == 200

        stream = _long_stream(client, 200)
        next(stream)  # it is running when SIGTERM arrives
        proc.send_signal(signal.SIGTERM)
        rest = list(stream)  # drained to its end, not cut
        assert rest[-1].choices[0].finish_reason == "length"
        assert proc.wait(timeout=WAIT_S) == 0
        _wait_gone([core, apis[1]])
        assert snapshot.exists()
    finally:
        proc.kill()


def test_a_port_in_use_is_a_usage_error_before_anything_starts():
    """Another server's socket on the port, even one that allows sharing it (SO_REUSEPORT): the launcher fails
    at once naming the address, and starts no core and no API server (it would otherwise split the port's
    connections with a stranger)."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = start_server(f"--port={port}", "--engine_core=process", "--api_server_count=2")
        out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 1
    assert f"FATAL usage error: --host/--port: cannot listen on 127.0.0.1:{port}: Address already in use" in out
    assert "engine core pid" not in out


LAUNCHER_BACKENDS = """
import os, sys
from jax._src import xla_bridge
from jaxpaged.cli import main as cli
from jaxpaged.cli import serve
from jaxpaged.server.core import launcher
seen = []
launcher.serve_split = lambda core_spec, api, **_: seen.append(dict(xla_bridge._backends)) or 0
serve.os._exit = lambda status: None  # main's fast exit after the launcher returns
assert cli.run(["jaxpaged", "serve", *sys.argv[1:]]) == 0 and len(seen) == 1
print("backends", sorted(seen[0]))
"""


def test_the_launcher_starts_no_jax_backend_before_its_children():
    """Up to starting the core, `jaxpaged serve`'s own process initializes no JAX backend: on a GPU host one
    would take the GPU memory the engine core is about to claim. (A fresh process: this one has backends.)"""
    out = subprocess.run([sys.executable, "-c", LAUNCHER_BACKENDS, "--model=tiny", "--kv_cache_dtype=fp8",
                          "--tensor_parallel_size=1"], capture_output=True, text=True, timeout=WAIT_S, check=True)
    assert out.stdout.strip().splitlines()[-1] == "backends []"


def test_core_sigkill_fails_every_stream_then_nothing_is_left():
    proc, base, core, apis = _start()
    try:
        client = _client(base)
        streams = [_long_stream(client) for _ in range(4)]
        for s in streams:
            next(s)
        killed = time.monotonic()
        os.kill(core, signal.SIGKILL)
        for s in streams:
            with pytest.raises(openai.APIError, match="engine core"):
                for _ in s:
                    pass
        print(f"every stream failed {time.monotonic() - killed:.3f} s after the SIGKILL")
        assert httpx.get(base + "/health").status_code == 503
        response = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert response.status_code == 503
        assert proc.wait(timeout=WAIT_S) == 1
        _wait_gone([core, *apis])
    finally:
        proc.kill()


def test_launcher_sigkill_drains_then_leaves_no_process():
    """The launcher (jaxpaged serve's own process) killed with SIGKILL: its children get SIGTERM (PR_SET_PDEATHSIG),
    so the open stream is drained to its end and the core, the API servers and multiprocessing's helper exit."""
    proc, base, core, apis = _start("--device=simulated", "--model=llama3-8b")  # no model to build or compile
    children = children_of(proc.pid)
    try:
        assert {core, *apis} <= set(children)
        stream = _long_stream(_client(base), 200, model="llama3-8b")
        next(stream)
        proc.kill()
        rest = list(stream)
        assert rest[-1].choices[0].finish_reason == "length"
        _wait_gone(children)
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
