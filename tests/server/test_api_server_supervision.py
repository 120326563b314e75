"""The launcher restarts a dead API server on the socket it kept, within a restart budget (`jaxpaged serve`,
the split server, one API server).

The only API server is killed with SIGKILL while a stream is open on it: the
stream's client sees its connection end without `[DONE]`, the core aborts
its request (nothing keeps running), the launcher starts a new API server on
the same listening socket and the next request is served with the same
greedy tokens as `LLM.generate`. Killed once more within the minute, past a
budget of one restart, the launcher calls it a crash loop and exits 1.
"""

import os
import re
import signal
import time

import httpx
import pytest

from tests.server.live_server import (WAIT_S, free_port, keep_draining, listening_inodes, offline_greedy_text,
                                      served_greedy_text, start_server, wait_healthy, wait_idle)

KV_TOKENS = 2048
MAX_MODEL_LEN = 512
PROBE = [9, 8, 7, 6, 5]


class _Launcher:
    """A split server whose log lines are collected as they come (the tests wait for lines)."""

    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = start_server("--host=127.0.0.1", f"--port={self.port}", "--engine_core=process",
                                 f"--kv_budget_tokens={KV_TOKENS}", f"--max_model_len={MAX_MODEL_LEN}", *flags)
        self.lines = keep_draining(self.proc)
        wait_healthy(self.base, [self.proc])

    def wait_line(self, pattern: str, after: int = 0) -> re.Match:
        """The first log line from index `after` on that matches `pattern` (waits for it)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            for line in self.lines[after:]:
                found = re.search(pattern, line)
                if found:
                    return found
            assert time.monotonic() < deadline, f"no log line matches {pattern!r}:\n{''.join(self.lines[-40:])}"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def launcher():
    server = _Launcher("--api_server_restarts=1")
    yield server
    server.proc.kill()
    server.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def expected_probe():
    return offline_greedy_text(PROBE, KV_TOKENS // 16, MAX_MODEL_LEN)


def _probe(base: str) -> str:
    """A later, unrelated greedy request: it must be served, correctly."""
    return served_greedy_text(base, PROBE)


def test_a_killed_api_server_is_restarted_and_its_request_aborted(launcher, expected_probe):
    first_pid = int(launcher.wait_line(r"API servers \[(\d+)\]").group(1))
    port_inodes = listening_inodes(launcher.port)
    wait_idle(launcher.base)
    with httpx.stream("POST", launcher.base + "/v1/completions", timeout=WAIT_S, json={
            "prompt": [1, 2, 3], "max_tokens": MAX_MODEL_LEN - 8, "ignore_eos": True, "stream": True}) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")  # it is decoding on the API server about to die
        seen = len(launcher.lines)
        os.kill(first_pid, signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):  # the connection ends, and never with [DONE]
            for line in lines:
                assert line != "data: [DONE]"
    launcher.wait_line(rf"API server pid {first_pid} exited \(-9\); 0 of 1 API servers left", seen)
    new_pid = int(launcher.wait_line(r"restarted the API server as pid (\d+) \(restart 1 of 1", seen).group(1))
    assert new_pid != first_pid
    wait_healthy(launcher.base, [launcher.proc])
    assert listening_inodes(launcher.port) == port_inodes  # the same socket: nothing was re-bound
    after = wait_idle(launcher.base)  # the dead server's request was aborted in the core, not left running
    assert after["jaxpaged:kv_cache_usage_perc"] == 0
    assert _probe(launcher.base) == expected_probe


def test_a_crash_loop_past_the_budget_ends_the_server_with_status_1(launcher):
    """Second death within the minute, with a budget of one restart: the launcher stops and exits 1."""
    pid = int(launcher.wait_line(r"restarted the API server as pid (\d+)").group(1))
    seen = len(launcher.lines)
    os.kill(pid, signal.SIGKILL)
    launcher.wait_line(r"API servers crash-looping: 1 restarts in the last 60 s", seen)
    assert launcher.proc.wait(timeout=WAIT_S) == 1
    with pytest.raises(httpx.ConnectError):
        httpx.get(launcher.base + "/health", timeout=5)
