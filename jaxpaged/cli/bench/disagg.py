"""Disaggregated prefill/decode measured: colocated vs one prefill + one decode process, and the transports.

    jaxpaged bench disagg --model=tiny --num_long=4 --long_prompt_len=1024 --repeats=20

Serving: the same workload (running decodes + long prompts arriving while
they run) against one `jaxpaged serve`, then against `--kv_role=prefill` +
`--kv_role=decode` + `jaxpaged proxy` for each of --transports; TTFT and TPOT
p50/p99 per request class. Transports: per-request overhead and bandwidth of
each between two processes (jaxpaged/bench/online/disagg.py,
docs/disaggregation.md).
"""

from __future__ import annotations

import dataclasses
import os
import platform

from jaxpaged.bench.online.disagg import DisaggWorkload, disagg_table, measure_transport, run_deployment
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.pretrained import default_model_path

FLAGS = FlagSet()
ENGINE = EngineFlags(FLAGS, ["model", "max_model_len"],
                     defaults={"model": str(default_model_path()), "max_model_len": 2048})
MODEL, MAX_LEN = ENGINE.holders["model"], ENGINE.holders["max_model_len"]  # every engine serves these
KV_TOKENS = FLAGS.DEFINE_integer("kv_budget_tokens", 16384, "each engine's KV pool in tokens", lower_bound=1)
TRANSPORTS = FLAGS.DEFINE_list("transports", ["zmq", "jax"], "transports to measure (zmq, jax)")
NUM_DECODES = FLAGS.DEFINE_integer("num_decodes", 4, "running decodes sent at the start", lower_bound=1)
DECODE_OUT = FLAGS.DEFINE_integer("decode_output_len", 128, "tokens each running decode generates", lower_bound=2)
NUM_LONG = FLAGS.DEFINE_integer("num_long", 4, "long prompts arriving while the decodes run", lower_bound=1)
LONG_LEN = FLAGS.DEFINE_integer("long_prompt_len", 1024, "tokens of each long prompt", lower_bound=1)
LONG_INTERVAL = FLAGS.DEFINE_float("long_interval_s", 1.5, "seconds between long prompts", lower_bound=0.0)
TRANSPORT_BLOCKS = FLAGS.DEFINE_integer("transport_blocks", 256, "blocks in the bandwidth pull", lower_bound=1)
REPEATS = FLAGS.DEFINE_integer("repeats", 20, "pulls per transport measurement (medians)", lower_bound=1)
SKIP_SERVING = FLAGS.DEFINE_bool("skip_serving", False, "measure the transports only")
SKIP_TRANSPORTS = FLAGS.DEFINE_bool("skip_transports", False, "measure the deployments only")
OUT = OutputFlags(FLAGS)
FLAGS.register_validator("transports", lambda v: bool(v) and set(v) <= {"zmq", "jax"},
                         message="--transports must be a non-empty subset of zmq,jax")


def main(argv):
    """Run both parts, then print and write the tables."""
    del argv
    from jaxpaged.engine import EngineConfig
    from jaxpaged.kv_pool.pool import kv_dtype_from_name
    workload = DisaggWorkload(num_decodes=NUM_DECODES.value, decode_output_len=DECODE_OUT.value,
                              num_long=NUM_LONG.value, long_prompt_len=LONG_LEN.value,
                              long_interval_s=LONG_INTERVAL.value)
    serving = []
    if not SKIP_SERVING.value:
        common = dict(kv_budget_tokens=KV_TOKENS.value, max_model_len=MAX_LEN.value)
        serving.append(run_deployment("colocated", MODEL.value, workload, **common))
        for transport in TRANSPORTS.value:
            serving.append(run_deployment(f"1 prefill + 1 decode ({transport})", MODEL.value, workload,
                                          transport=transport, **common))
    config = _model_config(MODEL.value)
    block_size = EngineConfig().block_size
    dtype = kv_dtype_from_name("auto", config.dtype)
    shape = (2, config.num_layers, config.num_kv_heads, block_size, config.head_dim)
    transports = [] if SKIP_TRANSPORTS.value else [
        measure_transport(t, shape, str(dtype), num_blocks=TRANSPORT_BLOCKS.value, repeats=REPEATS.value)
        for t in TRANSPORTS.value]
    result = {"model": MODEL.value, "machine": f"{platform.node()} ({os.cpu_count()} CPUs, shared)",
              "workload": dataclasses.asdict(workload),
              "serving": serving, "transports": transports, "block_shape": list(shape), "kv_dtype": str(dtype)}
    OUT.write(result, disagg_table(serving, transports))


def _model_config(model: str):
    from jaxpaged.checkpoint import model_config
    return model_config(model)
