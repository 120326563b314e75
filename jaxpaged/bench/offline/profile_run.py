"""``jaxpaged bench profile``: one workload through one KV mode under `jax.profiler`, and the host share of step time.

The engine is built over the benchmark's `TimedRunner` (`serving.make_runner`)
so `profiling.profile_workload` can split each step into device and host time.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxpaged.bench.offline.profiling import profile_workload
from jaxpaged.bench.offline.serving import ServingSetup, engine_config, make_runner
from jaxpaged.sim.workloads import WorkloadRequest


def profile_serving(model, setup: ServingSetup, mode: str, requests: Sequence[WorkloadRequest],
                    trace_dir: str) -> dict:
    """`profile_workload` of ``requests`` in ``mode`` (trace under ``trace_dir``; '' = none); prints a summary."""
    from jaxpaged.engine import Engine
    runner = make_runner(model, setup)
    config = engine_config(setup, mode, model.config.name)
    result = profile_workload(lambda: Engine(config, model, runner=runner, clock=runner.clock), requests, trace_dir,
                              runner=runner)
    result["trace_dir"] = trace_dir
    print(f"steps: {result['num_steps']}, step time {result['step_s']:.3f} s = device {result['device_s']:.3f} s "
          f"+ host {result['host_s']:.3f} s; host share {result['host_share']:.1%} "
          f"({result['host_ms_per_step']:.2f} ms host per step); compile time excluded: {result['compile_s']:.1f} s")
    if trace_dir:
        print(f"trace written under {trace_dir}")
    return result
