"""`serve_split`: one engine core process and N API server processes on one port (`--engine_core=process`).

The launcher (the process `jaxpaged serve` runs in) binds the port first (a
port in use fails at once, before a model is built), then starts the core,
then the API servers, each accepting on that one listening socket, each
connected to the core over an `ipc://` socket. One socket, not one per server
with SO_REUSEPORT: its accept queue outlives any one server (a server that
dies loses only the connections it had accepted, not those the kernel had
queued for it), and no other process can bind the port beside it. Every child gets SIGTERM if the launcher dies (PR_SET_PDEATHSIG, set
by `start_child`), so no process outlives it: a launcher killed with SIGKILL
still has its children drain and exit. Multi-host: the core is the process
that joins jax.distributed as process 0 (`CoreSpec.distributed`). What the launcher does when a child ends:

- an API server: the core aborts that server's requests, the others keep
  serving, and the launcher starts a new one on the listening socket it kept
  (so connections queued meanwhile are served). At most `api_server_restarts`
  restarts in any `API_RESTART_WINDOW_S` seconds: one more is a crash loop,
  and the launcher stops everything and exits non-zero;
- the core: the API servers have already failed their streams and answer 503
  on /health; after `core_death_grace_s` they are stopped and the launcher
  exits non-zero;
- SIGTERM / SIGINT to the launcher: the API servers drain (uvicorn's graceful
  shutdown, `drain_timeout_s`), then the core drains and saves its snapshot when
  configured, then the launcher exits.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
import threading
import time

from jaxpaged.server.tenants import TenantKeys

log = logging.getLogger(__name__)

_JOIN_SLACK_S = 10.0  # beyond the drain timeout, how long a child may take to exit before it is killed
API_RESTART_WINDOW_S = 60.0  # the restart budget counts the API server restarts in this window


@dataclasses.dataclass(frozen=True)
class ApiSpec:
    """What each API server process serves (the `build_app` options that are not the engine)."""

    host: str
    port: int
    served_model_name: str
    model: str  # picks the chat template
    enable_debug_endpoints: bool = False
    max_request_body_bytes: int | None = None
    drain_timeout_s: float = 30.0
    max_prompts_per_request: int | None = None
    chat_template: str | None = None  # a template file that replaces the model's own
    keys: TenantKeys | None = None  # the API keys and their tenants (None: no authentication)


def serve_split(core_spec, api: ApiSpec, *, api_server_count: int = 1, core_death_grace_s: float = 2.0,
                api_server_restarts: int = 5) -> int:
    """Run the processes until SIGTERM or the core's end; returns the exit status (0 after SIGTERM, 1 when the
    core died or the API servers crash-looped). Raises ListenError, before starting anything, when the port
    cannot be listened on. `api_server_restarts`: the restart budget (see the module docstring)."""
    from jaxpaged.server.core.process import run_core
    listener = listening_socket(api.host, api.port)
    ctx = multiprocessing.get_context("spawn")  # JAX and ZeroMQ are not fork-safe
    socket_dir = tempfile.mkdtemp(prefix="jaxpaged-core-")
    address = f"ipc://{socket_dir}/core.sock"
    core = start_child(ctx, run_core, core_spec, address, name="jaxpaged-engine-core")

    def start_api_server(i: int) -> multiprocessing.Process:
        return start_child(ctx, run_api_server, api, listener, address, core.pid, name=f"jaxpaged-api-{i}")

    live = {i: start_api_server(i) for i in range(api_server_count)}
    log.info("engine core pid %d; API servers %s on %s:%d", core.pid, [s.pid for s in live.values()], api.host,
             api.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    status = 0
    restarts: collections.deque[float] = collections.deque()  # when each restart in the window happened
    with listener:  # kept open: a restarted API server accepts on it, and the kernel queues connections meanwhile
        while not stop.is_set():
            ready = multiprocessing.connection.wait([core.sentinel] + [s.sentinel for s in live.values()],
                                                    timeout=0.2)
            if core.sentinel in ready:
                log.error("the engine core exited (%s); stopping the API servers", core.exitcode)
                stop.wait(core_death_grace_s)
                status = 1
                break
            for i, s in [(i, s) for i, s in live.items() if s.sentinel in ready]:
                del live[i]
                s.join(_JOIN_SLACK_S)  # its sentinel closes as it exits; its status is there once it is reaped
                log.error("API server pid %d exited (%s); %d of %d API servers left", s.pid, s.exitcode,
                          len(live), api_server_count)
                now = time.monotonic()
                while restarts and restarts[0] <= now - API_RESTART_WINDOW_S:
                    restarts.popleft()
                if len(restarts) >= api_server_restarts:
                    log.error("API servers crash-looping: %d restarts in the last %.0f s (the budget, "
                              "--api_server_restarts); stopping the server", len(restarts), API_RESTART_WINDOW_S)
                    status = 1
                    break
                restarts.append(now)
                live[i] = start_api_server(i)
                log.warning("restarted the API server as pid %d (restart %d of %d in %.0f s); %d of %d API "
                            "servers running", live[i].pid, len(restarts), api_server_restarts,
                            API_RESTART_WINDOW_S, len(live), api_server_count)
            if status:
                break
    _stop(list(live.values()), api.drain_timeout_s)
    _stop([core], api.drain_timeout_s)
    shutil.rmtree(socket_dir, ignore_errors=True)
    return status


def _stop(procs, drain_timeout_s: float) -> None:
    """SIGTERM, wait for the drain, then SIGKILL what is left."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(drain_timeout_s + _JOIN_SLACK_S)
        if p.is_alive():
            log.error("%s did not exit; killing it", p.name)
            p.kill()
            p.join()


def start_child(ctx, target, *args, name: str) -> multiprocessing.Process:
    """Start `target(*args)` in a new process of `ctx` that gets SIGTERM when this one dies, however it dies."""
    proc = ctx.Process(target=_child, args=(os.getpid(), target, *args), name=name)
    proc.start()
    return proc


def _child(parent_pid: int, target, *args) -> None:
    """A child's entry: die with the parent (PR_SET_PDEATHSIG: SIGTERM, so it drains), then run `target`."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the prctl: nobody would send the signal
        raise SystemExit(1)
    target(*args)


def run_api_server(api: ApiSpec, listener: socket.socket, address: str, core_pid: int) -> None:
    """An API server process: connect to the core, then serve the app on the launcher's listening socket."""
    import asyncio
    import gc

    import uvicorn

    from jaxpaged.server.api import build_app
    from jaxpaged.server.chat import ChatTemplate
    from jaxpaged.server.core.client import CoreClient

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s api-{os.getpid()} %(levelname)s %(message)s")

    async def main() -> None:
        client = CoreClient(address, core_pid)
        await client.connect()
        app = build_app(client, served_model_name=api.served_model_name,
                        chat_template=ChatTemplate.for_model(api.model, api.chat_template),
                        enable_debug_endpoints=api.enable_debug_endpoints,
                        max_request_body_bytes=api.max_request_body_bytes,
                        max_prompts_per_request=api.max_prompts_per_request, keys=api.keys)
        gc.collect()
        gc.freeze()  # startup's objects (app, tokenizer) live on: no collection walks them again
        config = uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=api.drain_timeout_s)
        await uvicorn.Server(config).serve(sockets=[listener])

    asyncio.run(main(), loop_factory=_event_loop_factory())


def _event_loop_factory():
    """uvloop's event loop when installed (what `uvicorn.run` picks too): its callbacks and socket writes cost
    a fraction of asyncio's pure-Python loop per streamed chunk."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class ListenError(OSError):
    """host:port cannot be listened on (in use, or not an address of this machine)."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port that the API servers share; ListenError naming the address when it
    is in use or cannot be bound. SO_REUSEADDR only: a restart may bind over connections left in TIME_WAIT."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise ListenError(error.errno, f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock
