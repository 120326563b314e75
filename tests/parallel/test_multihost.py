"""Multi-host: 2 local CPU processes x 2 devices (4-way TP across processes, gloo) give single-process TP=4 tokens."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jaxpaged import distributed
from tests.suite_cache import SUITE_CACHE

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = HERE / "multihost_worker.py"
CACHE = SUITE_CACHE  # the suite's compile cache (tests/suite_cache.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(out: Path, devices: int, *flags: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0",
               JAX_COMPILATION_CACHE_DIR=str(CACHE), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return subprocess.Popen([sys.executable, str(WORKER), f"--out={out}", *flags], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_processes_match_single_process(tmp_path):
    address = f"--coordinator_address=localhost:{_free_port()}"
    procs = {
        "single": _start(tmp_path / "single.json", 4),
        "p0": _start(tmp_path / "p0.json", 2, address, "--num_processes=2", "--process_id=0"),
        "p1": _start(tmp_path / "p1.json", 2, address, "--num_processes=2", "--process_id=1"),
    }
    for name, proc in procs.items():
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}:\n{log[-4000:]}"
    results = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in procs}
    assert results["single"]["process_count"] == 1 and results["single"]["local_devices"] == 4
    for name in ("p0", "p1"):
        r = results[name]
        assert (r["process_count"], r["devices"], r["local_devices"]) == (2, 4, 2)
        assert r["tokens"] == results["single"]["tokens"]  # p1 got its requests by broadcast from p0
        assert r["preemptions"] == results["single"]["preemptions"] > 0
        assert r["host_tier_refused"]
    assert not results["single"]["host_tier_refused"]  # one process: the host tier is fine
    assert len(results["single"]["tokens"]) == 6


def test_a_follower_waiting_on_a_dead_process_0_exits_with_an_error():
    """Process 0 killed (SIGKILL) while process 1 waits in its next broadcast, as a server's follower does
    between steps: process 1 must end, non-zero, naming the dead task, rather than wait forever."""
    address = f"--coordinator_address=localhost:{_free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    worker = [sys.executable, str(HERE / "dead_leader_worker.py"), address, "--num_processes=2"]
    leader = subprocess.Popen(worker + ["--process_id=0"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    follower = subprocess.Popen(worker + ["--process_id=1"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        for line in leader.stdout:
            if "joined" in line:  # both broadcast once: the follower is in its second broadcast
                break
        leader.kill()
        log, _ = follower.communicate(timeout=120)
        assert follower.returncode != 0, log[-3000:]
        assert "another task died" in log, log[-3000:]
    finally:
        leader.kill()
        follower.kill()


@pytest.mark.parametrize("args,message", [
    ((None, 2, 0), "needs --coordinator_address"),
    (("localhost:1", 2, 2), r"process_id must be in \[0, 2\)"),
    (("localhost", 2, 0), "must be host:port"),
    (("localhost:1", 0, 0), "num_processes must be >= 1"),
])
def test_bad_distributed_settings(args, message):
    with pytest.raises(ValueError, match=message):
        distributed.initialize(*args)


def test_single_process_is_a_no_op():
    assert distributed.initialize() is False
    assert distributed.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
