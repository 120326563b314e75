"""Device-time accounting around a runner, and a clock that leaves compile time out."""

from __future__ import annotations

import time


class TimedRunner:
    """Wraps a runner (``ModelRunner`` or any object with ``run_batch``) and times each step.

    A step during which the runner compiled a new shape counts as compile time;
    the others count as device time (``run_batch`` returns once the sampled ids
    are on the host, so it is a full round trip). Every other attribute is the
    wrapped runner's, so an ``Engine(runner=TimedRunner(...))`` works unchanged.
    """

    def __init__(self, runner) -> None:
        """Wrap ``runner``; all totals start at 0."""
        self.inner = runner
        self.device_s = 0.0
        self.compile_s = 0.0
        self.num_steps = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run_batch(self, batch, **kwargs):
        """Run the step on the wrapped runner, adding its wall time to compile_s or device_s."""
        compiles = self.inner.num_compiles
        start = time.perf_counter()
        result = self.inner.run_batch(batch, **kwargs)
        elapsed = time.perf_counter() - start
        if self.inner.num_compiles > compiles:
            self.compile_s += elapsed
        else:
            self.device_s += elapsed
        self.num_steps += 1
        return result

    def clock(self) -> float:
        """``perf_counter`` minus all compile time so far: latencies measured on it exclude compiles.

        The compiling step's own execution is dropped with its compile (one step per new shape).
        """
        return time.perf_counter() - self.compile_s
