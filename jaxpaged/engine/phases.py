"""Host seconds spent in each part of `Engine.step`, each part also a `jax.profiler` trace annotation.

The engine times its three host parts (the scheduler's `schedule`, its
`update_from_output`, the output processor) as it annotates them for
`jax.profiler` traces, so benchmarks and the engine core's metrics read them
through `Engine.step_phase_seconds()` instead of wrapping the parts' methods.
Two `perf_counter` calls per part cost well under a microsecond a step.
"""

from __future__ import annotations

import time

import jax

PHASES = ("schedule", "update", "outputs")
_TRACE_NAMES = {"schedule": "schedule", "update": "update_from_output", "outputs": "process_outputs"}


class _Phase:
    """Context manager: one part of a step, annotated for traces and added to its running total."""

    __slots__ = ("_totals", "_name", "_trace_name", "_annotation", "_start")

    def __init__(self, totals: dict[str, float], name: str):
        self._totals, self._name, self._trace_name = totals, name, _TRACE_NAMES[name]

    def __enter__(self) -> None:
        self._annotation = jax.profiler.TraceAnnotation(self._trace_name)
        self._annotation.__enter__()
        self._start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self._totals[self._name] += time.perf_counter() - self._start
        self._annotation.__exit__(*exc)


class StepPhases:
    """Running totals (host seconds) of `schedule`, `update` and `outputs` over every step so far."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.schedule, self.update, self.outputs = (_Phase(self.totals, name) for name in PHASES)

    def seconds(self) -> dict[str, float]:
        """A copy of the running totals, by phase name."""
        return dict(self.totals)
