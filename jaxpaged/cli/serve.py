"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over one jaxpaged engine.

    jaxpaged serve --host=127.0.0.1 --port=8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32}'

Without --model it serves the pretrained SmolLM2-135M-Instruct GGUF that
`make model` unpacks into data/models/ (jaxpaged/pretrained.py); --model
takes a GGUF file, a checkpoint directory or a shipped random-weight config
(tiny, small, ...).

Endpoints: /v1/completions, /v1/chat/completions (both with `"stream": true`
as server-sent events), /v1/models, /health, /metrics (Prometheus),
/tokenize, /detokenize, /reset_prefix_cache. SIGTERM drains in-flight
requests (then aborts what is left) and saves the prefix-cache snapshot when
--save_prefix_cache_on_shutdown.

Data-parallel replicas: --data_parallel_size=N (N > 1) starts a local Ray
cluster and N engine replicas as a Ray Serve deployment behind one HTTP
ingress with the same API, which routes each request by the replicas'
cached prefixes (--routing_policy; docs/replicas.md, "Replicas on Ray
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
from absl import app

from jaxpaged import distributed
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.engine import EngineConfig
from jaxpaged.metrics import attach_metrics
from jaxpaged.pretrained import default_model_path
from jaxpaged.server.api import build_app
from jaxpaged.server.async_engine import AsyncEngine, run_follower
from jaxpaged.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.core.process import CoreSpec, build_engine
from jaxpaged.server.tenants import TenantKeys
from jaxpaged.sim.profiles import GPU_PROFILES

FLAGS = FlagSet()
FLAGS.adopt([distributed.COORDINATOR_ADDRESS, distributed.NUM_PROCESSES, distributed.PROCESS_ID])
# every EngineConfig field is a flag (jaxpaged/cli/engine_flags.py); the server samples KV residency by default
ENGINE = EngineFlags(FLAGS, defaults={"kv_cache_metrics_sample": 0.01, "model": str(default_model_path())})
MODEL = ENGINE.holders["model"]
SERVED_NAME = FLAGS.DEFINE_string("served_model_name", None, "the model name clients use (default: --model)")
HOST = FLAGS.DEFINE_string("host", "127.0.0.1", "address to listen on")
PORT = FLAGS.DEFINE_integer("port", 8000, "port to listen on")
KV_BUDGET = FLAGS.DEFINE_integer("kv_budget_tokens", None, "KV pool size in tokens (default: --kv_cache_bytes)")
MAX_WAITING = FLAGS.DEFINE_integer("max_waiting_requests", 1024, "waiting-queue bound; beyond it: 503")
MAX_PROMPTS = FLAGS.DEFINE_integer("max_prompts_per_request", None,
                                   "most prompts in one completion request; more: 400 (default: a quarter of "
                                   "--max_waiting_requests, so one request cannot fill the queue)")
MAX_BODY = FLAGS.DEFINE_integer("max_request_body_bytes", DEFAULT_MAX_REQUEST_BODY_BYTES,
                                "largest request body accepted; larger ones get a 413 before they are parsed")
DRAIN = FLAGS.DEFINE_float("drain_timeout_s", 30.0, "at shutdown, how long in-flight requests may finish")
DEBUG = FLAGS.DEFINE_boolean("enable_debug_endpoints", False,
                             "expose /debug/* (crash the engine loop; with replicas: their caches, the policy)")
DEVICE = FLAGS.DEFINE_enum("device", "real", ["real", "simulated"],
                           "real: run the model on JAX's devices; simulated: steps sleep the cost model's time "
                           "on --device_profile (no model is built)")
DEVICE_PROFILE = FLAGS.DEFINE_string("device_profile", "h200-141gb",
                                     "the device --device=simulated stands in for: a GPU profile name "
                                     f"({', '.join(sorted(GPU_PROFILES))}), cpu, or a profile JSON")
DP = FLAGS.DEFINE_integer("data_parallel_size", 1, "engine replicas; > 1 serves them on Ray Serve")
PREFILL_REPLICAS = FLAGS.DEFINE_integer("prefill_replicas", 0, "disaggregated on Ray Serve: prefill replicas (with "
                                        "--decode_replicas; docs/disaggregation.md)", lower_bound=0)
DECODE_REPLICAS = FLAGS.DEFINE_integer("decode_replicas", 0, "disaggregated on Ray Serve: decode replicas",
                                       lower_bound=0)
POLICY = FLAGS.DEFINE_enum("routing_policy", "prefix_aware", ["prefix_aware", "round_robin", "least_loaded"],
                           "how the replicas' ingress picks a replica (with --data_parallel_size > 1)")
ENGINE_CORE = FLAGS.DEFINE_enum("engine_core", "process", ["process", "thread"],
                                "process: the engine core runs in its own process and the API server(s) tokenize, "
                                "detokenize and match stop strings (jaxpaged/server/core/); with replicas, one "
                                "core process per replica; thread: the engine loop runs in the HTTP server's "
                                "(or the replica actor's) process")
CHAT_TEMPLATE = FLAGS.DEFINE_string("chat_template", None,
                                   "a chat template file (jinja text, or JSON with \"chat_template\") that replaces "
                                   "the model's own (chat_template.jinja, tokenizer_config.json, a GGUF's metadata)")
API_SERVERS = FLAGS.DEFINE_integer("api_server_count", 1, "API server processes on the one port "
                                   "(with --engine_core=process)")
API_KEY = FLAGS.DEFINE_string("api_key", None,
                               "one API key every client must send as 'Authorization: Bearer <key>' on every "
                               "route but /health and /metrics (an admin tenant named 'default'); without "
                               "--api_key or --api_keys_file every client is trusted (default: the "
                               "JAXPAGED_API_KEY environment variable, which other users cannot read in ps)")
API_KEYS_FILE = FLAGS.DEFINE_string("api_keys_file", None,
                                    "a JSON file of API keys, each with its tenant, role (user/admin) and "
                                    "limits; a tenant's requests hash their blocks in its own cache namespace "
                                    "(jaxpaged/server/tenants.py)")
API_RESTARTS = FLAGS.DEFINE_integer("api_server_restarts", 5,
                                    "an API server that dies is restarted on the same socket, at most this many "
                                    "times a minute; one more is a crash loop: the server exits 1 "
                                    "(0: the first death stops the server)")

FLAGS.positive("api_server_count", "port", "kv_budget_tokens", "max_waiting_requests", "data_parallel_size",
               "max_request_body_bytes", "max_prompts_per_request")
FLAGS.non_negative("drain_timeout_s", "api_server_restarts")
FLAGS.register_multi_flags_validator(
    ["data_parallel_size", "tensor_parallel_size", "num_processes"],
    lambda v: v["data_parallel_size"] == 1 or (v["tensor_parallel_size"] == 1 and (v["num_processes"] or 1) == 1),
    message="--data_parallel_size > 1 runs single-device, single-process replicas: drop --tensor_parallel_size "
            "and --num_processes")
FLAGS.register_multi_flags_validator(
    ["device", "data_parallel_size", "tensor_parallel_size", "num_processes"],
    lambda v: v["device"] == "real" or (v["data_parallel_size"] == 1 and v["tensor_parallel_size"] == 1
                                        and (v["num_processes"] or 1) == 1),
    message="--device=simulated models one device in one process: drop --data_parallel_size, "
            "--tensor_parallel_size and --num_processes")
FLAGS.register_multi_flags_validator(
    ["engine_core", "api_server_count", "data_parallel_size"],
    lambda v: v["api_server_count"] == 1 or (v["engine_core"] == "process" and v["data_parallel_size"] == 1),
    message="--api_server_count > 1 needs --engine_core=process and one engine (replicas have one ingress)")
FLAGS.device_profile("device_profile")
FLAGS.existing_file("chat_template")


def engine_config() -> EngineConfig:
    """The EngineConfig the flags describe (``--kv_budget_tokens``, when set, gives the number of blocks)."""
    overrides = {}
    if KV_BUDGET.value is not None:
        overrides["num_blocks"] = -(-KV_BUDGET.value // ENGINE.holders["block_size"].value)
    return ENGINE.config(**overrides)


def core_spec() -> CoreSpec:
    """What the engine core builds and how it serves, from the flags (multi-host: as process 0)."""
    multi_host = None
    if distributed.NUM_PROCESSES.value > 1:
        multi_host = (distributed.COORDINATOR_ADDRESS.value, distributed.NUM_PROCESSES.value,
                      distributed.PROCESS_ID.value)
    return CoreSpec(engine_config(), device=DEVICE.value, device_profile=DEVICE_PROFILE.value,
                    max_waiting_requests=MAX_WAITING.value, drain_timeout_s=DRAIN.value, distributed=multi_host)


def tenant_keys() -> TenantKeys | None:
    """The API keys ``--api_key`` / ``--api_keys_file`` configure (None: none); a usage error when they are bad."""
    try:
        return TenantKeys.from_options(API_KEY.value or os.environ.get("JAXPAGED_API_KEY") or None,
                                       API_KEYS_FILE.value)
    except (OSError, ValueError) as error:
        raise app.UsageError(f"--api_key/--api_keys_file: {error}") from None


def check_gguf_model() -> None:
    """A GGUF --model that cannot be served (unsupported architecture, tensor type or tokenizer, missing tensors)
    is a usage error before anything starts, not a traceback from the engine core (`--model` itself is checked
    to be a GGUF file, a directory, a config JSON or a shipped config name by its flag validator)."""
    from jaxpaged.checkpoint import check_gguf_checkpoint, is_gguf_file
    if not is_gguf_file(MODEL.value):
        return
    from jaxpaged.tokenizer import load_gguf_tokenizer
    try:
        check_gguf_checkpoint(MODEL.value)
        load_gguf_tokenizer(MODEL.value)
    except ValueError as error:
        raise app.UsageError(f"--model={MODEL.value}: {error}") from None


def main(argv):
    """Serve until SIGTERM / Ctrl-C: replicas, a multi-host follower, the split (default) or one process."""
    del argv
    check_gguf_model()
    logging.basicConfig(level=logging.INFO)
    tenant_keys()  # a bad keys file stops the server before anything starts
    if PREFILL_REPLICAS.value or DECODE_REPLICAS.value:
        serve_disaggregated()
    elif DP.value > 1:
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
                    chat_template=ChatTemplate.for_model(MODEL.value, CHAT_TEMPLATE.value), registry=metrics.registry,
                    enable_debug_endpoints=DEBUG.value, max_request_body_bytes=MAX_BODY.value,
                    max_prompts_per_request=MAX_PROMPTS.value, keys=tenant_keys())
    uvicorn.run(api, host=HOST.value, port=PORT.value, log_level="info", timeout_graceful_shutdown=DRAIN.value)


def serve_follower() -> None:
    """A multi-host process other than 0: no HTTP, only the engine stepping on process 0's commands, in this
    process (whatever --engine_core), until process 0 stops it. If process 0 dies, JAX's coordination client
    ends this process at once (SIGABRT, "another task died"), so a follower never waits on a dead leader."""
    distributed.initialize_from_flags()
    run_follower(build_engine(core_spec()), max_waiting_requests=MAX_WAITING.value)


def serve_engine_core_process() -> int:
    """--engine_core=process: one engine core process and --api_server_count API servers; returns the status."""
    from jaxpaged.server.core.launcher import ApiSpec, ListenError, serve_split
    api = ApiSpec(HOST.value, PORT.value, SERVED_NAME.value or MODEL.value, MODEL.value,
                  enable_debug_endpoints=DEBUG.value, max_request_body_bytes=MAX_BODY.value,
                  drain_timeout_s=DRAIN.value, max_prompts_per_request=MAX_PROMPTS.value,
                  chat_template=CHAT_TEMPLATE.value, keys=tenant_keys())
    try:
        return serve_split(core_spec(), api, api_server_count=API_SERVERS.value,
                           api_server_restarts=API_RESTARTS.value)
    except ListenError as error:  # raised before any process starts
        raise app.UsageError(f"--host/--port: {error.strerror}") from None


def serve_data_parallel() -> None:
    """--data_parallel_size replicas on a local Ray Serve cluster, until SIGTERM / Ctrl-C."""
    from jaxpaged.server.replicas.app import build_replica_app, serve_replicas_forever
    api = build_replica_app(engine_config(), num_replicas=DP.value, engine_core=ENGINE_CORE.value, **replica_options())
    serve_replicas_forever(api, host=HOST.value, port=PORT.value)


def serve_disaggregated() -> None:
    """--prefill_replicas and --decode_replicas on a local Ray Serve cluster, until SIGTERM / Ctrl-C."""
    from jaxpaged.server.replicas.app import serve_replicas_forever
    from jaxpaged.server.replicas.disagg import build_disagg_app
    if not (PREFILL_REPLICAS.value and DECODE_REPLICAS.value):
        raise app.UsageError("--prefill_replicas and --decode_replicas go together (both at least 1)")
    api = build_disagg_app(engine_config(), num_prefill=PREFILL_REPLICAS.value, num_decode=DECODE_REPLICAS.value,
                           **replica_options())
    serve_replicas_forever(api, host=HOST.value, port=PORT.value)


def replica_options() -> dict:
    """What every replica deployment takes from the flags (the replicas keep this process's ``XLA_FLAGS``)."""
    replica_env = {"XLA_FLAGS": os.environ["XLA_FLAGS"]} if "XLA_FLAGS" in os.environ else None
    return {"served_model_name": SERVED_NAME.value or MODEL.value, "policy": POLICY.value,
            "max_waiting_requests": MAX_WAITING.value, "enable_debug_endpoints": DEBUG.value,
            "replica_env": replica_env, "max_request_body_bytes": MAX_BODY.value,
            "chat_template": CHAT_TEMPLATE.value, "keys": tenant_keys()}
