"""Start a child process (``jaxpaged serve``, its proxy, Prometheus) logging to a file, wait until it answers, stop it.

    with ServerProcess(["--model=tiny", "--kv_budget_tokens=1024"]) as server:
        run_requests(server.base_url, ...)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]  # the checkout: the server imports this copy of jaxpaged
SERVE_COMMAND = (sys.executable, "-m", "jaxpaged", "serve")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ChildProcess:
    """``command`` as a subprocess whose output goes to ``log_path``; a context manager that starts and stops it."""

    def __init__(self, command: Sequence[str], ready_url: str, *, env: Mapping[str, str] | None = None,
                 inherit_env: bool = True, cwd: str | Path | None = ROOT, startup_timeout_s: float = 300.0) -> None:
        """Prepare ``command``, ready once ``GET ready_url`` answers 200; ``env`` is added to this process's
        environment (``inherit_env=False``: it is the whole environment)."""
        self.command = list(command)
        self.ready_url = ready_url
        self.env = dict(os.environ, **(env or {})) if inherit_env else dict(env or {})
        self.cwd = cwd
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(tempfile.mkdtemp(prefix="jaxpaged-child-")) / "child.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> ChildProcess:
        """Launch the command and block until its ready URL answers 200; RuntimeError quoting the log's end if it
        exits or does not answer in time."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command[0]} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.ready_url, timeout=2.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.ready_url} did not answer within {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (graceful shutdown), then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log_tail(self, num_chars: int = 3000) -> str:
        """The last ``num_chars`` characters the child printed."""
        return self.log_path.read_text(errors="replace")[-num_chars:] if self.log_path.exists() else ""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerProcess(ChildProcess):
    """``jaxpaged serve <args>`` on a free port of ``host``, ready once ``GET /health`` answers 200."""

    def __init__(self, args: Sequence[str], *, command: Sequence[str] = SERVE_COMMAND, host: str = "127.0.0.1",
                 **child) -> None:
        """Prepare ``command <args> --host=<host> --port=<free port>`` (``child``: `ChildProcess`'s keywords)."""
        self.host = host
        self.port = free_port(host)
        self.base_url = f"http://{host}:{self.port}"
        super().__init__([*command, *args, f"--host={host}", f"--port={self.port}"], f"{self.base_url}/health", **child)
