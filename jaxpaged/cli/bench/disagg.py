"""Disaggregated prefill/decode measured: colocated vs one prefill + one decode process, and the transports.

    jaxpaged bench disagg --model=tiny --num_long=4 --long_prompt_len=1024 --repeats=20

Running decodes with long prompts arriving, against one ``jaxpaged serve`` and against a prefill and a decode
server behind ``jaxpaged proxy`` per transport (TTFT, TPOT per request class); then each transport's
per-request overhead and bandwidth between two processes. docs/benchmarks/disaggregation.md.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.online.disagg import (MAX_WARMUP_RUNS, DisaggWorkload, disagg_table, measure_transport,
                                          run_deployment)
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags
from jaxpaged.pretrained import default_model_path


@dataclasses.dataclass(frozen=True)
class DisaggBenchOptions:
    """The engines' KV pool, the transports, and which parts run."""

    kv_budget_tokens: int = option(16384, "each engine's KV pool in tokens", at_least=1)
    transports: tuple[str, ...] = option(("zmq", "jax"), "transports to measure (zmq, jax)", choices=["zmq", "jax"])
    transport_blocks: int = option(256, "blocks in the bandwidth pull", at_least=1)
    repeats: int = option(20, "pulls per transport measurement (medians)", at_least=1)
    max_warmup_runs: int = option(MAX_WARMUP_RUNS, "warm-up runs at most per deployment (each until a run "
                                  "compiles no new step shape)", at_least=1)
    skip_serving: bool = option(False, "measure the transports only")
    skip_transports: bool = option(False, "measure the deployments only")


COMMAND = CommandFlags(DisaggBenchOptions, DisaggWorkload, engine=["model", "max_model_len"],  # every engine's
                       engine_defaults={"model": str(default_model_path()), "max_model_len": 2048})
FLAGS = COMMAND.flags


def main(argv):
    """Run both parts, then print and write the tables."""
    del argv
    from jaxpaged.checkpoint import model_config
    from jaxpaged.engine import EngineConfig
    from jaxpaged.kv_pool.pool import kv_dtype_from_name
    o, workload, model = COMMAND.options(), COMMAND.options(DisaggWorkload), COMMAND.engine_value("model")
    serving = [run_deployment("colocated" if t is None else f"1 prefill + 1 decode ({t})", model, workload,
                              transport=t, kv_budget_tokens=o.kv_budget_tokens, max_warmup_runs=o.max_warmup_runs,
                              max_model_len=COMMAND.engine_value("max_model_len"))
               for t in ([] if o.skip_serving else [None, *o.transports])]
    config = model_config(model)
    dtype = kv_dtype_from_name("auto", config.dtype)
    shape = (2, config.num_layers, config.num_kv_heads, EngineConfig().block_size, config.head_dim)
    transports = [] if o.skip_transports else [
        measure_transport(t, shape, str(dtype), num_blocks=o.transport_blocks, repeats=o.repeats)
        for t in o.transports]
    result = {"serving": serving, "transports": transports, "block_shape": list(shape), "kv_dtype": str(dtype)}
    COMMAND.out.write(result, disagg_table(serving, transports))
