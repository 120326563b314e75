"""Starting `jaxpaged serve` as subprocesses on 127.0.0.1 for the server tests.

Unlike `jaxpaged.bench.online.server_process.ServerProcess` (one server, log to a file),
these keep the output on a pipe the tests read, and wait on a group of
processes (multi-host).
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from jaxpaged.bench.online.server_process import free_port  # noqa: F401 - the tests import it from here

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 300  # bound on waiting for a server or a Ray cluster to start, or a condition to hold (not a speed check)


def start_server(*flags: str, env: dict | None = None) -> subprocess.Popen:
    """Run `jaxpaged serve` with `flags` (one of them `--port=`); output collected on stdout."""
    return subprocess.Popen([sys.executable, "-m", "jaxpaged", "serve", "--model=tiny", *flags],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def keep_draining(proc: subprocess.Popen) -> list[str]:
    """Read `proc`'s output on a daemon thread into the returned list (grows as lines come): a server whose
    log pipe nobody reads blocks in its next log line once the pipe's 64 KiB are full."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return lines


def wait_healthy(base: str, procs: list[subprocess.Popen]) -> None:
    """Wait until `base/health` answers 200; if a process exits first, kill them all and raise with its log."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            logs = "\n---\n".join(p.stdout.read()[-3000:] for p in procs)
            raise RuntimeError(f"server did not start:\n{logs}")
        time.sleep(0.5)


def serving(*flags: str):
    """A module fixture's body: start `jaxpaged serve` on a free loopback port, yield its base URL, stop it after."""
    port = free_port()
    proc = start_server("--host=127.0.0.1", f"--port={port}", *flags)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, [proc])
    yield base
    proc.terminate()
    proc.wait(timeout=60)


def read_metrics(base: str) -> dict[str, float]:
    """The server's `/metrics`, each sample name summed over its labels."""
    from prometheus_client.parser import text_string_to_metric_families
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=WAIT_S).text):
        for s in family.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    return values


def wait_idle(base: str, settle_s: float = 0.3) -> dict[str, float]:
    """Wait until nothing runs or waits and the generated-token counter stands still; returns the metrics."""
    deadline = time.monotonic() + WAIT_S
    before = None
    while True:
        now = read_metrics(base)
        idle = now["jaxpaged:num_requests_running"] == 0 and now["jaxpaged:num_requests_waiting"] == 0
        if idle and before is not None and before == now["jaxpaged:generation_tokens_total"]:
            return now
        before = now["jaxpaged:generation_tokens_total"] if idle else None
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine did not go idle: {now}")
        time.sleep(settle_s)


def listening_inodes(port: int) -> set[str]:
    """Socket inodes in LISTEN state on ``port`` (from /proc/net/tcp and tcp6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    inodes.add(fields[9])
    return inodes


def listening_pids(port: int) -> list[int]:
    """The processes holding a socket that listens on ``port`` (each process's fds against `listening_inodes`)."""
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{entry}/fd")):
                found.append(int(entry))
        except (FileNotFoundError, PermissionError):
            pass
    return sorted(found)


def maps_jaxlib(pid: int) -> bool:
    """Whether process ``pid`` has jaxlib's shared objects mapped (it imported JAX)."""
    with open(f"/proc/{pid}/maps") as f:
        return "jaxlib" in f.read()


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


def offline_greedy_text(prompt: str, num_blocks: int, max_model_len: int, max_tokens: int = 8) -> str:
    """The tiny model's greedy continuation of `prompt` from `LLM.generate`: what a live server must serve."""
    from jaxpaged.llm import LLM
    from jaxpaged.sampling_params import SamplingParams

    llm = LLM(model="tiny", num_blocks=num_blocks, max_model_len=max_model_len)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].text


def served_greedy_text(base: str, prompt: str, max_tokens: int = 8) -> str:
    """The same greedy continuation from a live server's /v1/completions (asserting a 200)."""
    response = httpx.post(base + "/v1/completions", timeout=WAIT_S, json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]
