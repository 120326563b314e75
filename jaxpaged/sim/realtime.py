"""An engine over a simulated device that takes real time: the whole server at a GPU's step rate on a CPU.

`simulated_device_engine` builds the real engine (scheduler, KV cache manager,
input and output processing) over a `SleepingDeviceRunner`: every step sleeps
the time the roofline cost model predicts for it on a device profile (an H200
by default) and samples a fixed token that is never EOS. Its KV pool holds as
many blocks as the device's memory leaves after the weights (vLLM's
`gpu_memory_utilization` rule), unless the config names a pool size. No model
is built and nothing is compiled, so `jaxpaged serve --device=simulated` starts in
seconds and lets the HTTP server, the scheduler and the load generator be
measured at the step rates a GPU would impose; the runner counts the seconds
its device was busy (`jaxpaged:device_busy_seconds` in `/metrics`).
"""

from __future__ import annotations

import dataclasses

from jaxpaged.config import dtype_itemsize
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.sleeping_runner import SleepingDeviceRunner

DEFAULT_PROFILE = "h200-141gb"


def simulated_device_engine(engine_config: EngineConfig, profile: str = DEFAULT_PROFILE, *,
                            weight_bytes_per_param: float = 2.0, memory_utilization: float = 0.9) -> Engine:
    """The engine `engine_config` describes, over a device of `profile` simulated in real time.

    `engine_config.model` must be a shipped config name or a config JSON (the
    shape is all the cost model needs; shape-only configs such as `llama3-8b`
    work). The pool is `engine_config.num_blocks` / `kv_cache_bytes` when set,
    else what `memory_utilization` of the device's memory holds after the
    weights at `weight_bytes_per_param`; K/V take the bytes of
    `engine_config.kv_cache_dtype` (`auto`: 2, bf16). Raises ValueError for an unknown
    model or profile, or weights that leave no room for a KV cache.
    """
    if engine_config.tensor_parallel_size != 1:
        raise ValueError("--device=simulated models one device: tensor_parallel_size must be 1")
    kv_dtype = "bfloat16" if engine_config.kv_cache_dtype == "auto" else engine_config.kv_cache_dtype
    deployment = Deployment(model=engine_config.model, profile=profile, block_size=engine_config.block_size,
                            weight_bytes_per_param=weight_bytes_per_param, kv_bytes_per_element=dtype_itemsize(kv_dtype),
                            kv_cache_bytes=engine_config.kv_cache_bytes, memory_utilization=memory_utilization)
    num_blocks = engine_config.num_blocks or deployment.num_blocks()
    runner = SleepingDeviceRunner(deployment.model_config, deployment.cost_model(), num_blocks)
    return Engine(dataclasses.replace(engine_config, num_blocks=num_blocks, kv_cache_bytes=None), runner=runner)
