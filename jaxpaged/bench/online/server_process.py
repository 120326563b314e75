"""Start ``jaxpaged serve`` as a subprocess on a free loopback port, wait until it is healthy, stop it.

Used by the offline-vs-HTTP benchmark and the end-to-end benchmark test:

    with ServerProcess(["--model=tiny", "--kv_budget_tokens=1024"]) as server:
        run_requests(server.base_url, ...)

The server's output goes to a log file (``log_path``); a server that exits or
does not answer ``GET /health`` with 200 in time raises RuntimeError quoting
the log's end.
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
SERVE_COMMAND = [sys.executable, "-m", "jaxpaged", "serve"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A ``jaxpaged serve`` subprocess on 127.0.0.1; a context manager that starts and stops it."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str] | None = None,
                 startup_timeout_s: float = 300.0, host: str = "127.0.0.1") -> None:
        """Prepare ``jaxpaged serve <args> --host=<host> --port=<free port>``; ``env`` is added to the environment."""
        self.host = host
        self.port = free_port(host)
        self.base_url = f"http://{host}:{self.port}"
        self.args = [*args, f"--host={host}", f"--port={self.port}"]
        self.env = dict(os.environ, **(env or {}))
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(tempfile.mkdtemp(prefix="jaxpaged-serve-")) / "server.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        """Launch the server and block until ``GET /health`` answers 200 (RuntimeError otherwise)."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([*SERVE_COMMAND, *self.args], cwd=ROOT, env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server was not healthy within {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

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
        """The last ``num_chars`` characters the server printed."""
        return self.log_path.read_text(errors="replace")[-num_chars:] if self.log_path.exists() else ""

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
