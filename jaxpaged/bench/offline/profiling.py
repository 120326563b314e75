"""``jaxpaged bench profile``: a workload under `jax.profiler.trace`, and the host share of engine step time.

The engine runs over the benchmark's `TimedRunner` (`serving.make_runner`), which adds up the device time of
its steps; the engine's `step` is wrapped to add up their wall time (schedule + device + output processing).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import jax

from jaxpaged.bench.offline.driver import run_workload
from jaxpaged.bench.offline.serving import ServingSetup, engine_config, make_runner
from jaxpaged.sim.workloads import WorkloadRequest


def profile_serving(model_name: str, setup: ServingSetup, mode: str, requests: Sequence[WorkloadRequest],
                    trace_dir: str) -> dict:
    """Run ``requests`` in ``mode`` on ``model_name`` (a config or a checkpoint, its own tokenizer) once to
    compile, then again on a fresh engine over the same runner, traced under ``trace_dir`` ('' = no trace);
    prints a summary.

    Host share = 1 - device time / step time, over the traced run's steps (compile time reported apart).
    """
    from jaxpaged.checkpoint import load_model
    from jaxpaged.engine import Engine
    model = load_model(model_name)
    runner = make_runner(model, setup)
    config = engine_config(setup, mode, model_name)
    run_workload(Engine(config, model, runner=runner, clock=runner.clock), requests)  # compiles every step shape
    engine = Engine(config, model, runner=runner, clock=runner.clock)
    device0, compile0, steps0 = runner.device_s, runner.compile_s, runner.num_steps
    step, step_times = engine.step, []

    def timed_step():
        start = time.perf_counter()
        outputs = step()
        step_times.append(time.perf_counter() - start)
        return outputs

    engine.step = timed_step  # an instance attribute shadowing the method
    with jax.profiler.trace(trace_dir) if trace_dir else contextlib.nullcontext():
        run_workload(engine, requests)
    device, compile_s = runner.device_s - device0, runner.compile_s - compile0
    step_s, num_steps, device_steps = sum(step_times) - compile_s, len(step_times), runner.num_steps - steps0
    result = {
        "num_steps": num_steps,
        "device_steps": device_steps,
        "step_s": step_s,
        "device_s": device,
        "host_s": step_s - device,
        "host_share": (step_s - device) / step_s if step_s > 0 else 0.0,
        "compile_s": compile_s,
        "host_ms_per_step": (step_s - device) / max(num_steps, 1) * 1e3,
        "device_ms_per_step": device / max(device_steps, 1) * 1e3,
        "trace_dir": trace_dir,
    }
    print(f"steps: {num_steps}, step time {step_s:.3f} s = device {device:.3f} s + host {step_s - device:.3f} s; "
          f"host share {result['host_share']:.1%} ({result['host_ms_per_step']:.2f} ms host per step); "
          f"compile time excluded: {compile_s:.1f} s")
    if trace_dir:
        print(f"trace written under {trace_dir}")
    return result
