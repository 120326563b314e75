"""The Ray Serve application: N `EngineReplica`s behind one HTTP ingress that routes by cached prefix.

The ingress serves the single-engine server's FastAPI app (`build_app`) over
a `ReplicaPool`, plus, behind ``enable_debug_endpoints``:

- ``GET /debug/replicas``: per live replica, the index's hashes beside the
  replica's actual cached hashes and its load;
- ``POST /debug/routing_policy`` ``{"policy": name}``: route with another
  policy from now on (the benchmark compares policies on one cluster);
- ``POST /debug/kill_replica`` ``{"replica_id": id}``: ``ray.kill`` that
  replica's actor, as a crash would (Serve starts a replacement).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import ray
from fastapi import Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve._private.constants import SERVE_NAMESPACE
from ray.serve.config import HTTPOptions, RequestRouterConfig

import jaxpaged
from jaxpaged.engine import EngineConfig
from jaxpaged.router import POLICIES
from jaxpaged.server.api import build_app
from jaxpaged.server.tenants import TenantKeys
from jaxpaged.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.replicas.messages import ReplicaReport
from jaxpaged.server.replicas.pool import ReplicaPool
from jaxpaged.server.replicas.replica import EngineReplica

log = logging.getLogger(__name__)

PROXY_READY_CHECK_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
# Three missed checks (Serve's rule) take about Serve's own 60 s limit for the proxy to start.
PROXY_READY_CHECK_TIMEOUT_S = 20
# Starting the local node again when its raylet missed Ray's fixed start-up deadline (a busy machine).
RAY_START_ATTEMPTS = 3

REPLICA_DEPLOYMENT = "EngineReplica"
INGRESS_DEPLOYMENT = "Ingress"
# Replicas compile on their first requests and a step can take seconds on a busy CPU: Serve's default
# health-check timeout (30 s) is kept; the period is short so a dead engine loop is noticed quickly.
HEALTH_CHECK_PERIOD_S = 1.0
QUIET = {"enable_access_log": False}  # one line per event report would drown the log
PINNED_ROUTER = "jaxpaged.server.replicas.pinned_router.PinnedReplicaRouter"  # by name: imported where it runs


class PoolIngress:
    """What every ingress shares: the single-engine server's app over a pool (an `EngineClient`), built once the
    pool exists, with the debug routes over ``debug_pool`` when enabled."""

    def _serve_pool(self, pool, debug_pool: ReplicaPool, *, served_model_name: str, model: str,
                    enable_debug_endpoints: bool, max_request_body_bytes: int | None, chat_template: str | None,
                    keys: TenantKeys | None) -> None:
        """Keep what the app is built from (called by the ingress's ``__init__``)."""
        self.pool, self._debug_pool = pool, debug_pool
        self._served_model_name = served_model_name
        self._chat_template = ChatTemplate.for_model(model, chat_template)
        self._debug = enable_debug_endpoints
        self._max_body = max_request_body_bytes
        self._keys = keys

    def __serve_build_asgi_app__(self):
        """The app, built once the pool exists."""
        app = build_app(self.pool, served_model_name=self._served_model_name, chat_template=self._chat_template,
                        enable_debug_endpoints=self._debug, max_request_body_bytes=self._max_body, keys=self._keys)
        if self._debug:
            add_debug_routes(app, self._debug_pool)
        return app


@serve.ingress()
class Ingress(PoolIngress):
    """The HTTP front: the OpenAI-compatible app over a `ReplicaPool` of the replica deployment."""

    async def __init__(self, replicas, *, served_model_name: str, model: str, policy: str,
                       enable_debug_endpoints: bool, liveness_timeout_s: float,
                       max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
                       chat_template: str | None = None, keys: TenantKeys | None = None) -> None:
        """``replicas``: the `EngineReplica` deployment's handle; ``chat_template``: a file replacing the
        model's; ``keys``: the API keys (None: none)."""
        info = await replicas.model_info.remote()
        pool = ReplicaPool(replicas, info, deployment=REPLICA_DEPLOYMENT, policy=policy,
                           liveness_timeout_s=liveness_timeout_s)
        self._serve_pool(pool, pool, served_model_name=served_model_name, model=model,
                         enable_debug_endpoints=enable_debug_endpoints, max_request_body_bytes=max_request_body_bytes,
                         chat_template=chat_template, keys=keys)

    def report(self, report: ReplicaReport) -> str | None:
        """A replica's KV-event batch and load (called by the replicas)."""
        return self.pool.on_report(report)


def add_debug_routes(app, pool: ReplicaPool) -> None:
    """``/debug/replicas``, ``/debug/routing_policy``, ``/debug/kill_replica`` (tests and benchmarks only)."""

    def bad_request(message: str, param: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}},
                            status_code=400)

    @app.get("/debug/replicas")
    async def replicas():
        return {"policy": pool.router.policy.name, "replicas": await pool.describe()}

    @app.post("/debug/routing_policy")
    async def routing_policy(request: Request):
        body = await request.json()
        name = body.get("policy") if isinstance(body, dict) else None
        if name not in POLICIES:
            return bad_request(f"policy must be one of {sorted(POLICIES)}, got {name!r}", "policy")
        pool.set_policy(name)
        return {"policy": name}

    @app.post("/debug/kill_replica")
    async def kill_replica(request: Request):
        body = await request.json()
        replica = body.get("replica_id") if isinstance(body, dict) else None
        actor_name = pool.actor_name(replica)
        if actor_name is None:
            return bad_request(f"replica_id must name a live replica, got {replica!r}", "replica_id")
        ray.kill(ray.get_actor(actor_name, namespace=SERVE_NAMESPACE), no_restart=True)
        return {"killed": replica}


def build_replica_app(config: EngineConfig, *, num_replicas: int, served_model_name: str, policy: str = "prefix_aware",
                      max_waiting_requests: int = 1024, enable_debug_endpoints: bool = False,
                      replica_env: dict[str, str] | None = None, liveness_timeout_s: float = 60.0,
                      report_interval_s: float = 0.05,
                      max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
                      engine_core: str = "process", chat_template: str | None = None,
                      keys: TenantKeys | None = None):
    """The bound Serve application: ``num_replicas`` engines behind the routing ingress.

    ``engine_core``: "process", each replica actor owns one engine core process
    (the replica detokenizes, its core steps); "thread", the engine loop runs
    in the actor. ``keys``: the API keys the ingress checks (None: none).

    ``replica_env``: environment variables of the replica processes (e.g. XLA
    thread limits). Replicas ask for no CPU from Ray's scheduler, so any
    number fits a small machine (they share its cores).
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if policy not in POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}; choose one of {sorted(POLICIES)}")
    actor_options = {"num_cpus": 0}
    if replica_env:
        actor_options["runtime_env"] = {"env_vars": dict(replica_env)}
    replica = serve.deployment(
        EngineReplica, name=REPLICA_DEPLOYMENT, num_replicas=num_replicas, max_ongoing_requests=100_000,
        ray_actor_options=actor_options, health_check_period_s=HEALTH_CHECK_PERIOD_S, logging_config=QUIET,
        request_router_config=RequestRouterConfig(request_router_class=PINNED_ROUTER),
    ).bind(config, ingress_deployment=INGRESS_DEPLOYMENT, max_waiting_requests=max_waiting_requests,
           report_interval_s=report_interval_s, engine_core=engine_core)
    ingress = serve.deployment(Ingress, name=INGRESS_DEPLOYMENT, num_replicas=1, max_ongoing_requests=100_000,
                               ray_actor_options={"num_cpus": 0}, logging_config=QUIET)
    return ingress.bind(replica, served_model_name=served_model_name, model=config.model, policy=policy,
                        enable_debug_endpoints=enable_debug_endpoints, liveness_timeout_s=liveness_timeout_s,
                        max_request_body_bytes=max_request_body_bytes, chat_template=chat_template, keys=keys)


def start_local_ray(num_cpus: int | None = None) -> None:
    """A local Ray cluster whose workers import this checkout of jaxpaged (unless Ray is already up).

    Serve's HTTP proxy gets `PROXY_READY_CHECK_TIMEOUT_S` to come up (unless the environment sets
    ``RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S``): Serve's 5 s default, missed three times in a row, makes
    `serve.start` fail, and on a small machine busy compiling a new actor's process can take longer.
    For the same reason a node whose raylet misses Ray's fixed 30 s start-up deadline is started again
    (`RAY_START_ATTEMPTS` in all).
    """
    if ray.is_initialized():
        return
    # Set before ray.init: the local cluster's processes, Serve's controller among them, inherit it.
    os.environ.setdefault(PROXY_READY_CHECK_ENV, str(PROXY_READY_CHECK_TIMEOUT_S))
    checkout = str(Path(jaxpaged.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
            return
        except Exception as error:  # Ray raises a bare Exception when its raylet misses a fixed 30 s deadline
            if "timed out during startup" not in str(error) or attempt == RAY_START_ATTEMPTS:
                raise
            log.warning("Ray's local node did not start in time (attempt %d of %d); starting it again",
                        attempt, RAY_START_ATTEMPTS)
            ray.shutdown()


def start_replicas(app, *, host: str, port: int, num_cpus: int | None = None, app_name: str = "jaxpaged"):
    """Starts a local Ray cluster (unless one is up), Serve's HTTP proxy on ``host:port``, and the app."""
    start_local_ray(num_cpus)
    serve.start(http_options=HTTPOptions(host=host, port=port))
    return serve.run(app, name=app_name, route_prefix="/")


def serve_replicas_forever(app, *, host: str, port: int) -> None:
    """`start_replicas`, then block until SIGTERM / Ctrl-C, then shut Serve and Ray down."""
    start_replicas(app, host=host, port=port)
    log.info("serving on http://%s:%d", host, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
