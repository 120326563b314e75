"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over one jaxpaged engine, or replicas on Ray Serve.

    jaxpaged serve --host=127.0.0.1 --port=8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32}'

Without --model it serves the pretrained SmolLM2-135M-Instruct GGUF of `make model`; --model also takes a
checkpoint directory or a shipped config (tiny, small, ...). The routes, the engine core process
(--engine_core) and multi-host: docs/server.md; --device=simulated: docs/simulator.md; replicas
(--data_parallel_size, --prefill_replicas/--decode_replicas): docs/replicas.md, docs/disaggregation.md.
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
MAX_PROMPTS = FLAGS.DEFINE_integer("max_prompts_per_request", None, "most prompts in one completion request; more: "
                                   "400 (default: a quarter of --max_waiting_requests)")
MAX_BODY = FLAGS.DEFINE_integer("max_request_body_bytes", DEFAULT_MAX_REQUEST_BODY_BYTES,
                                "largest request body accepted; larger ones get a 413 before they are parsed")
DRAIN = FLAGS.DEFINE_float("drain_timeout_s", 30.0, "at shutdown, how long in-flight requests may finish")
DEBUG = FLAGS.DEFINE_boolean("enable_debug_endpoints", False,
                             "expose /debug/* (crash the engine loop; with replicas: their caches, the policy)")
DEVICE = FLAGS.DEFINE_enum("device", "real", ["real", "simulated"], "real: run the model on JAX's devices; "
                           "simulated: steps sleep the cost model's time on --device_profile (no model is built)")
DEVICE_PROFILE = FLAGS.DEFINE_string("device_profile", "h200-141gb", "the device --device=simulated stands in for: "
                                     f"a GPU profile ({', '.join(sorted(GPU_PROFILES))}), cpu, or a profile JSON")
DP = FLAGS.DEFINE_integer("data_parallel_size", 1, "engine replicas; > 1 serves them on Ray Serve")
PREFILL_REPLICAS = FLAGS.DEFINE_integer("prefill_replicas", 0, "disaggregated on Ray Serve: prefill replicas (with "
                                        "--decode_replicas; docs/disaggregation.md)", lower_bound=0)
DECODE_REPLICAS = FLAGS.DEFINE_integer("decode_replicas", 0, "disaggregated on Ray Serve: decode replicas",
                                       lower_bound=0)
POLICY = FLAGS.DEFINE_enum("routing_policy", "prefix_aware", ["prefix_aware", "round_robin", "least_loaded"],
                           "how the replicas' ingress picks a replica (with --data_parallel_size > 1)")
ENGINE_CORE = FLAGS.DEFINE_enum("engine_core", "process", ["process", "thread"],
                                "process: the engine core in its own process (one per replica), the API servers "
                                "tokenize and detokenize; thread: the engine loop in the HTTP server's process")
CHAT_TEMPLATE = FLAGS.DEFINE_string("chat_template", None, "a chat template file (jinja, or JSON with "
                                    "\"chat_template\") replacing the model's own")
API_SERVERS = FLAGS.DEFINE_integer("api_server_count", 1, "API server processes on the one port "
                                   "(with --engine_core=process)")
API_KEY = FLAGS.DEFINE_string("api_key", None, "one API key every client must send as 'Authorization: Bearer <key>' "
                              "(but to /health and /metrics); default: $JAXPAGED_API_KEY (not shown in ps); "
                              "without a key every client is trusted")
API_KEYS_FILE = FLAGS.DEFINE_string("api_keys_file", None, "a JSON file of API keys, each with its tenant, role "
                                    "(user/admin) and limits (jaxpaged/server/tenants.py)")
API_RESTARTS = FLAGS.DEFINE_integer("api_server_restarts", 5, "restarts a minute of an API server that dies; one "
                                    "more is a crash loop: exit 1 (0: the first death stops the server)")

FLAGS.positive("api_server_count", "port", "kv_budget_tokens", "max_waiting_requests", "data_parallel_size",
               "max_request_body_bytes", "max_prompts_per_request")
FLAGS.non_negative("drain_timeout_s", "api_server_restarts")


def _one_device(v) -> bool:
    return v["tensor_parallel_size"] == 1 and (v["num_processes"] or 1) == 1


FLAGS.register_multi_flags_validator(
    ["data_parallel_size", "tensor_parallel_size", "num_processes"], lambda v: v["data_parallel_size"] == 1 or
    _one_device(v), message="--data_parallel_size > 1 runs single-device, single-process replicas: drop "
    "--tensor_parallel_size and --num_processes")
FLAGS.register_multi_flags_validator(
    ["device", "data_parallel_size", "tensor_parallel_size", "num_processes"],
    lambda v: v["device"] == "real" or (v["data_parallel_size"] == 1 and _one_device(v)),
    message="--device=simulated models one device in one process: drop --data_parallel_size, "
            "--tensor_parallel_size and --num_processes")
FLAGS.register_multi_flags_validator(
    ["engine_core", "api_server_count", "data_parallel_size"],
    lambda v: v["api_server_count"] == 1 or (v["engine_core"] == "process" and v["data_parallel_size"] == 1),
    message="--api_server_count > 1 needs --engine_core=process and one engine (replicas have one ingress)")
FLAGS.register_multi_flags_validator(
    ["prefill_replicas", "decode_replicas"], lambda v: bool(v["prefill_replicas"]) == bool(v["decode_replicas"]),
    message="--prefill_replicas and --decode_replicas go together (both at least 1)")
FLAGS.device_profile("device_profile")
FLAGS.existing_file("chat_template")


def engine_config() -> EngineConfig:
    """The EngineConfig the flags describe (``--kv_budget_tokens``, when set, gives the number of blocks)."""
    if KV_BUDGET.value is None:
        return ENGINE.config()
    return ENGINE.config(num_blocks=-(-KV_BUDGET.value // ENGINE.holders["block_size"].value))


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
    """A GGUF --model that cannot be served (architecture, tensor type or tokenizer unsupported, tensors missing)
    is a usage error before anything starts, not a traceback from the engine core."""
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
    if PREFILL_REPLICAS.value or DP.value > 1:
        serve_replicas()
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


def serve_replicas() -> None:
    """--data_parallel_size replicas, or --prefill_replicas and --decode_replicas, on a local Ray Serve cluster,
    until SIGTERM / Ctrl-C (the replicas keep this process's ``XLA_FLAGS``)."""
    from jaxpaged.server.replicas.app import build_replica_app, serve_replicas_forever
    options = {"served_model_name": SERVED_NAME.value or MODEL.value, "policy": POLICY.value,
               "max_waiting_requests": MAX_WAITING.value, "enable_debug_endpoints": DEBUG.value,
               "replica_env": {"XLA_FLAGS": os.environ["XLA_FLAGS"]} if "XLA_FLAGS" in os.environ else None,
               "max_request_body_bytes": MAX_BODY.value, "chat_template": CHAT_TEMPLATE.value, "keys": tenant_keys()}
    if PREFILL_REPLICAS.value:
        from jaxpaged.server.replicas.disagg import build_disagg_app
        api = build_disagg_app(engine_config(), num_prefill=PREFILL_REPLICAS.value, num_decode=DECODE_REPLICAS.value,
                               **options)
    else:
        api = build_replica_app(engine_config(), num_replicas=DP.value, engine_core=ENGINE_CORE.value, **options)
    serve_replicas_forever(api, host=HOST.value, port=PORT.value)
