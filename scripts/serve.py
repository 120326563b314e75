"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over one jaxpaged engine.

    python scripts/serve.py --model=tiny --host=127.0.0.1 --port=8000
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "tiny", "prompt": "Hello", "max_tokens": 16}'

Endpoints: /v1/completions, /v1/chat/completions (both with `"stream": true`
as server-sent events), /v1/models, /health, /metrics (Prometheus),
/tokenize, /detokenize, /reset_prefix_cache. SIGTERM drains in-flight
requests (then aborts what is left) and saves the prefix-cache snapshot when
--save_prefix_cache_on_shutdown.

Data-parallel replicas: --data_parallel_size=N (N > 1) starts a local Ray
cluster and N engine replicas as a Ray Serve deployment behind one HTTP
ingress with the same API, which routes each request by the replicas'
cached prefixes (--routing_policy; docs/ARCHITECTURE.md, "Replicas on Ray
Serve"). Needs the `serve` extra (ray[serve]).

Simulated device: --device=simulated serves a shape-only model (e.g.
--model=llama3-8b) over a device that sleeps each step's predicted time on
--device_profile (an H200 by default) and samples a fixed non-EOS token: the
whole server at GPU step rates on a CPU, with no model built
(jaxpaged/sim/realtime.py; /metrics counts the device's busy seconds).

Engine core process (the default, --engine_core=process): the engine core
(scheduler, KV manager, runner, tiers) runs in its own process and
--api_server_count API server processes (HTTP, tokenization,
detokenization, stop strings) serve the one port, talking to it over ZeroMQ
(jaxpaged/server/core/); this process only launches and watches them. With
replicas, each replica actor owns one engine core process. --engine_core=thread
runs the engine loop in the HTTP server's process instead.

Multi-host: start one process per host with the same flags plus
--coordinator_address, --num_processes and --process_id; process 0 serves
HTTP and its engine core broadcasts every engine command to the others, which
step in lockstep and exit if process 0 disappears (docs/ARCHITECTURE.md,
"Processes").
"""

from __future__ import annotations

import logging
import os

import uvicorn
from absl import app, flags

from jaxpaged import distributed
from jaxpaged.bench import flag_checks
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.engine import EngineConfig
from jaxpaged.metrics import attach_metrics
from jaxpaged.server.api import build_app
from jaxpaged.server.async_engine import AsyncEngine, run_follower
from jaxpaged.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.core.process import CoreSpec, build_engine
from jaxpaged.sim.profiles import GPU_PROFILES

# ---- engine flags (EngineConfig's fields) ---------------------------------------------------------------------
MODEL = flags.DEFINE_string("model", "tiny", "a shipped model config name, a config JSON or a checkpoint directory")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
KV_BUDGET = flags.DEFINE_integer("kv_budget_tokens", None, "KV pool size in tokens (default: --kv_cache_bytes)")
KV_BYTES = flags.DEFINE_integer("kv_cache_bytes", None, "KV pool size in bytes (default 256 MiB)")
PREFIX_CACHING = flags.DEFINE_boolean("enable_prefix_caching", True, "reuse cached blocks of shared prefixes")
MAX_NUM_SEQS = flags.DEFINE_integer("max_num_seqs", 64, "most sequences running at once")
MAX_BATCHED = flags.DEFINE_integer("max_num_batched_tokens", 512, "token budget of one step")
MAX_MODEL_LEN = flags.DEFINE_integer("max_model_len", None, "longest prompt + output (default: the model's)")
HOST_CACHE = flags.DEFINE_integer("host_cache_bytes", None, "host RAM tier for evicted cached blocks (bytes)")
DISK_DIR = flags.DEFINE_string("disk_cache_dir", None, "disk tier directory behind the host tier")
SNAPSHOT = flags.DEFINE_string("prefix_cache_snapshot", None, "prefix-cache snapshot directory, restored at start")
SAVE_SNAPSHOT = flags.DEFINE_boolean("save_prefix_cache_on_shutdown", False, "write the snapshot at shutdown")
KV_DTYPE = flags.DEFINE_enum("kv_cache_dtype", "auto", ["auto", "float32", "bfloat16", "fp8_e4m3"], "KV dtype")
TP = flags.DEFINE_integer("tensor_parallel_size", 1, "devices the model is split over")
ATTENTION = flags.DEFINE_enum("attention_backend", "auto", ["auto", "xla", "xla_reference", "pallas", "pallas_mosaic"],
                              "attention backend")
SEED = flags.DEFINE_integer("seed", 0, "weights seed for shipped configs, and unseeded sampling")
EVICTION = flags.DEFINE_enum("eviction_policy", "lru", list(EVICTION_POLICIES),
                             "which cached block at ref count 0 is evicted first")
METRICS_SAMPLE = flags.DEFINE_float("kv_cache_metrics_sample", 0.01, "fraction of cached blocks whose residency "
                                    "(lifetime, idle before evict, reuse gaps) /metrics reports (0 = off)")

# ---- server-only flags (how the engine is served: processes, HTTP, replicas, device) ----------------------------
SERVED_NAME = flags.DEFINE_string("served_model_name", None, "the model name clients use (default: --model)")
HOST = flags.DEFINE_string("host", "127.0.0.1", "address to listen on")
PORT = flags.DEFINE_integer("port", 8000, "port to listen on")
MAX_WAITING = flags.DEFINE_integer("max_waiting_requests", 1024, "waiting-queue bound; beyond it: 503")
MAX_BODY = flags.DEFINE_integer("max_request_body_bytes", DEFAULT_MAX_REQUEST_BODY_BYTES,
                                "largest request body accepted; larger ones get a 413 before they are parsed")
DRAIN = flags.DEFINE_float("drain_timeout_s", 30.0, "at shutdown, how long in-flight requests may finish")
DEBUG = flags.DEFINE_boolean("enable_debug_endpoints", False,
                             "expose /debug/* (crash the engine loop; with replicas: their caches, the policy)")
DEVICE = flags.DEFINE_enum("device", "real", ["real", "simulated"],
                           "real: run the model on JAX's devices; simulated: steps sleep the cost model's time "
                           "on --device_profile (no model is built)")
DEVICE_PROFILE = flags.DEFINE_string("device_profile", "h200-141gb",
                                     "the device --device=simulated stands in for: a GPU profile name "
                                     f"({', '.join(sorted(GPU_PROFILES))}), cpu, or a profile JSON")
DP = flags.DEFINE_integer("data_parallel_size", 1, "engine replicas; > 1 serves them on Ray Serve")
POLICY = flags.DEFINE_enum("routing_policy", "prefix_aware", ["prefix_aware", "round_robin", "least_loaded"],
                           "how the replicas' ingress picks a replica (with --data_parallel_size > 1)")
ENGINE_CORE = flags.DEFINE_enum("engine_core", "process", ["process", "thread"],
                                "process: the engine core runs in its own process and the API server(s) tokenize, "
                                "detokenize and match stop strings (jaxpaged/server/core/); with replicas, one "
                                "core process per replica; thread: the engine loop runs in the HTTP server's "
                                "(or the replica actor's) process")
API_SERVERS = flags.DEFINE_integer("api_server_count", 1, "API server processes on the one port "
                                   "(with --engine_core=process)")

flag_checks.positive("api_server_count", "port", "block_size", "kv_budget_tokens", "kv_cache_bytes", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len", "host_cache_bytes", "tensor_parallel_size",
                     "max_waiting_requests", "data_parallel_size", "max_request_body_bytes")
flag_checks.non_negative("seed", "drain_timeout_s")
flags.register_validator("kv_cache_metrics_sample", lambda v: 0 <= v <= 1,
                         message="--kv_cache_metrics_sample must be in [0, 1]")
flags.register_multi_flags_validator(
    ["data_parallel_size", "tensor_parallel_size", "num_processes"],
    lambda v: v["data_parallel_size"] == 1 or (v["tensor_parallel_size"] == 1 and (v["num_processes"] or 1) == 1),
    message="--data_parallel_size > 1 runs single-device, single-process replicas: drop --tensor_parallel_size "
            "and --num_processes")
flags.register_multi_flags_validator(
    ["device", "data_parallel_size", "tensor_parallel_size", "num_processes"],
    lambda v: v["device"] == "real" or (v["data_parallel_size"] == 1 and v["tensor_parallel_size"] == 1
                                        and (v["num_processes"] or 1) == 1),
    message="--device=simulated models one device in one process: drop --data_parallel_size, "
            "--tensor_parallel_size and --num_processes")
flags.register_multi_flags_validator(
    ["engine_core", "api_server_count", "data_parallel_size"],
    lambda v: v["api_server_count"] == 1 or (v["engine_core"] == "process" and v["data_parallel_size"] == 1),
    message="--api_server_count > 1 needs --engine_core=process and one engine (replicas have one ingress)")
flag_checks.model_name()
flag_checks.device_profile("device_profile")


def engine_config() -> EngineConfig:
    """The EngineConfig the flags describe."""
    num_blocks = None
    if KV_BUDGET.value is not None:
        num_blocks = -(-KV_BUDGET.value // BLOCK_SIZE.value)
    return EngineConfig(
        model=MODEL.value, block_size=BLOCK_SIZE.value, num_blocks=num_blocks, kv_cache_bytes=KV_BYTES.value,
        enable_prefix_caching=PREFIX_CACHING.value, max_num_seqs=MAX_NUM_SEQS.value,
        max_num_batched_tokens=MAX_BATCHED.value, max_model_len=MAX_MODEL_LEN.value,
        host_cache_bytes=HOST_CACHE.value, disk_cache_dir=DISK_DIR.value, prefix_cache_snapshot=SNAPSHOT.value,
        save_prefix_cache_on_shutdown=SAVE_SNAPSHOT.value, kv_cache_dtype=KV_DTYPE.value,
        tensor_parallel_size=TP.value, attention_backend=ATTENTION.value, seed=SEED.value,
        eviction_policy=EVICTION.value, kv_cache_metrics_sample=METRICS_SAMPLE.value)


def core_spec() -> CoreSpec:
    """What the engine core builds and how it serves, from the flags (multi-host: as process 0)."""
    multi_host = None
    if distributed.NUM_PROCESSES.value > 1:
        multi_host = (distributed.COORDINATOR_ADDRESS.value, distributed.NUM_PROCESSES.value,
                      distributed.PROCESS_ID.value)
    return CoreSpec(engine_config(), device=DEVICE.value, device_profile=DEVICE_PROFILE.value,
                    max_waiting_requests=MAX_WAITING.value, drain_timeout_s=DRAIN.value, distributed=multi_host)


def main(argv):
    """Serve until SIGTERM / Ctrl-C: replicas, a multi-host follower, the split (default) or one process."""
    del argv
    logging.basicConfig(level=logging.INFO)
    if DP.value > 1:
        serve_data_parallel()
    elif distributed.PROCESS_ID.value > 0:
        serve_follower()
    elif ENGINE_CORE.value == "process":
        status = serve_engine_core_process()
        logging.shutdown()
        os._exit(status)  # the launcher holds nothing to save; its interpreter teardown took ~1.5 s on a busy host
    else:
        serve_in_process()


def serve_in_process() -> None:
    """--engine_core=thread: the engine loop in a thread of the HTTP server's process."""
    multi_process = distributed.initialize_from_flags()
    engine = build_engine(core_spec())
    metrics = attach_metrics(engine)
    async_engine = AsyncEngine(engine, max_waiting_requests=MAX_WAITING.value, drain_timeout_s=DRAIN.value,
                               multi_process=multi_process)
    api = build_app(async_engine, served_model_name=SERVED_NAME.value or MODEL.value,
                    chat_template=ChatTemplate.for_model(MODEL.value), registry=metrics.registry,
                    enable_debug_endpoints=DEBUG.value, max_request_body_bytes=MAX_BODY.value)
    uvicorn.run(api, host=HOST.value, port=PORT.value, log_level="info", timeout_graceful_shutdown=DRAIN.value)


def serve_follower() -> None:
    """A multi-host process other than 0: no HTTP, only the engine stepping on process 0's commands, in this
    process (whatever --engine_core), until process 0 stops it. If process 0 dies, JAX's coordination client
    ends this process at once (SIGABRT, "another task died"), so a follower never waits on a dead leader."""
    distributed.initialize_from_flags()
    run_follower(build_engine(core_spec()), max_waiting_requests=MAX_WAITING.value)


def serve_engine_core_process() -> int:
    """--engine_core=process: one engine core process and --api_server_count API servers; returns the status."""
    from jaxpaged.server.core.launcher import ApiSpec, serve_split
    api = ApiSpec(HOST.value, PORT.value, SERVED_NAME.value or MODEL.value, MODEL.value,
                  enable_debug_endpoints=DEBUG.value, max_request_body_bytes=MAX_BODY.value,
                  drain_timeout_s=DRAIN.value)
    return serve_split(core_spec(), api, api_server_count=API_SERVERS.value)


def serve_data_parallel() -> None:
    """--data_parallel_size replicas on a local Ray Serve cluster, until SIGTERM / Ctrl-C."""
    from jaxpaged.server.replicas.app import build_replica_app, serve_replicas_forever
    replica_env = {"XLA_FLAGS": os.environ["XLA_FLAGS"]} if "XLA_FLAGS" in os.environ else None
    api = build_replica_app(engine_config(), num_replicas=DP.value, served_model_name=SERVED_NAME.value or MODEL.value,
                            policy=POLICY.value, max_waiting_requests=MAX_WAITING.value,
                            enable_debug_endpoints=DEBUG.value, replica_env=replica_env,
                            max_request_body_bytes=MAX_BODY.value, engine_core=ENGINE_CORE.value)
    serve_replicas_forever(api, host=HOST.value, port=PORT.value)


if __name__ == "__main__":
    app.run(main)
