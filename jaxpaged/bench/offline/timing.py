"""Device-time accounting around a runner, a clock that leaves compile time out, and side-by-side repeats."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np

from jaxpaged.runner import ModelRunner, Runner, StepHandle
from jaxpaged.runner.step_input import StepInput
from jaxpaged.scheduler import ModelOutput, SchedulerOutput

T = TypeVar("T")


class TimedRunner:
    """A `Runner` wrapper timing each step as the host sees it (dispatch plus wait): a step that compiled a new
    shape counts as compile time, the others as device time (with asynchronous scheduling: the time the host
    was held up by the device). ``Engine(runner=TimedRunner(...))`` works unchanged."""

    def __init__(self, runner: Runner) -> None:
        """Wrap ``runner``; all totals start at 0."""
        self.inner, self.config = runner, runner.config
        self.block_size, self.num_blocks = runner.block_size, runner.num_blocks
        self.capabilities = runner.capabilities.of_steps()
        self.device_s = self.compile_s = 0.0
        self.num_steps = 0

    @property
    def num_compiles(self) -> int:
        return self.inner.num_compiles

    def reset(self) -> None:
        """Reset the wrapped runner's persistent batch (the totals are kept)."""
        self.inner.reset()

    def execute_model(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Dispatch the step on the wrapped runner; its time is booked when the result is read."""
        compiles = self.inner.num_compiles
        start = time.perf_counter()
        handle = self.inner.execute_model(scheduler_output)
        return _TimedStep(self, handle, time.perf_counter() - start, compiles,
                          counts=bool(scheduler_output.seq_ids))

    def clock(self) -> float:
        """``perf_counter`` minus all compile time so far: latencies measured on it exclude compiles.

        The compiling step's own execution is dropped with its compile (one step per new shape).
        """
        return time.perf_counter() - self.compile_s


class _TimedStep:
    def __init__(self, timer: TimedRunner, handle: StepHandle, dispatch_s: float, compiles: int, *,
                 counts: bool):
        self._timer, self._handle, self._dispatch_s, self._compiles, self._counts = (
            timer, handle, dispatch_s, compiles, counts)

    def result(self) -> ModelOutput:
        start = time.perf_counter()
        result = self._handle.result()
        elapsed = self._dispatch_s + time.perf_counter() - start
        timer = self._timer
        if timer.inner.num_compiles > self._compiles:
            timer.compile_s += elapsed
        else:
            timer.device_s += elapsed
        timer.num_steps += self._counts
        return result


def alternate(runs: Mapping[str, Callable[[], T]], repeats: int, *, warmup: int = 0) -> dict[str, list[T]]:
    """Each of ``runs`` called ``repeats`` times, in rounds that call every one in turn, so load on a shared
    machine falls on all alike; ``warmup`` unrecorded rounds first (compiles). What each call returned, by name."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    results: dict[str, list[T]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            results[name].append(run())
    return results


def seconds_of(fn: Callable[[], object]) -> Callable[[], float]:
    """A call of ``fn`` that returns how long it took (seconds)."""
    def timed() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return timed


def median_seconds(fn: Callable[[], object], repeats: int, *, warmup: int = 1) -> float:
    """Median seconds of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls (the first compiles)."""
    for _ in range(warmup):
        fn()
    return float(np.median([seconds_of(fn)() for _ in range(repeats)]))


def median_step_seconds(runner: ModelRunner, step: StepInput, repeats: int) -> float:
    """Median seconds of one hand-built step, after a compile-and-warm-up run.

    Each run brings the sampled ids to the host: a full round trip.
    """
    return median_seconds(lambda: runner.execute(step), repeats)
