"""Profile a workload: a jax.profiler trace plus the host share of engine step time.

``jaxpaged bench profile``: the engine is built over the benchmark's `TimedRunner`
(`serving.make_runner`) so `profile_workload` can split each step into device and host time."""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax

from jaxpaged.bench.offline.driver import run_workload
from jaxpaged.bench.offline.serving import ServingSetup, engine_config, make_runner
from jaxpaged.bench.offline.timing import TimedRunner
from jaxpaged.sim.workloads import WorkloadRequest


class StepTimer:
    """Wraps ``engine.step`` to add up its wall time (schedule + device + output processing)."""

    def __init__(self, engine) -> None:
        """Install the wrapper on ``engine`` (an instance attribute shadowing the method)."""
        self.total_s = 0.0
        self.num_steps = 0
        self._step = engine.step
        engine.step = self

    def __call__(self):
        start = time.perf_counter()
        outputs = self._step()
        self.total_s += time.perf_counter() - start
        self.num_steps += 1
        return outputs


def profile_workload(make_engine, requests: Sequence[WorkloadRequest], trace_dir: str | None, *,
                     runner: TimedRunner) -> dict[str, float]:
    """Run ``requests`` once to compile, then again under ``jax.profiler.trace(trace_dir)``.

    ``make_engine()`` returns a fresh engine over ``runner`` (both runs share it). Host share = 1 - device time / step time, over the
    traced run's steps that compiled nothing (compiling steps are reported apart).
    """
    run_workload(make_engine(), requests)  # warm-up: compile every step shape
    engine = make_engine()
    device0, compile0, steps0 = runner.device_s, runner.compile_s, runner.num_steps
    timer = StepTimer(engine)
    if trace_dir:
        with jax.profiler.trace(trace_dir):
            run_workload(engine, requests)
    else:
        run_workload(engine, requests)
    device = runner.device_s - device0
    compile_s = runner.compile_s - compile0
    step_s = timer.total_s - compile_s
    return {
        "num_steps": timer.num_steps,
        "device_steps": runner.num_steps - steps0,
        "step_s": step_s,
        "device_s": device,
        "host_s": step_s - device,
        "host_share": (step_s - device) / step_s if step_s > 0 else 0.0,
        "compile_s": compile_s,
        "host_ms_per_step": (step_s - device) / max(timer.num_steps, 1) * 1e3,
        "device_ms_per_step": device / max(runner.num_steps - steps0, 1) * 1e3,
    }


def profile_serving(model, setup: ServingSetup, mode: str, requests: Sequence[WorkloadRequest],
                    trace_dir: str, model_name: str | None = None) -> dict:
    """`profile_workload` of ``requests`` in ``mode`` (trace under ``trace_dir``; '' = none); prints a summary.

    ``model_name`` (default: the config's name) is what the engine's tokenizer is loaded from: the checkpoint
    path of a real model.
    """
    from jaxpaged.engine import Engine
    runner = make_runner(model, setup)
    config = engine_config(setup, mode, model_name or model.config.name)
    result = profile_workload(lambda: Engine(config, model, runner=runner, clock=runner.clock), requests, trace_dir,
                              runner=runner)
    result["trace_dir"] = trace_dir
    print(f"steps: {result['num_steps']}, step time {result['step_s']:.3f} s = device {result['device_s']:.3f} s "
          f"+ host {result['host_s']:.3f} s; host share {result['host_share']:.1%} "
          f"({result['host_ms_per_step']:.2f} ms host per step); compile time excluded: {result['compile_s']:.1f} s")
    if trace_dir:
        print(f"trace written under {trace_dir}")
    return result
