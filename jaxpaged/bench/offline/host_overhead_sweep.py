"""``jaxpaged bench host-overhead``: host time per step over batch sizes and output kinds, and the device-busy fraction.

Each `measure_host_overhead` run (`jaxpaged.bench.offline.host_overhead`)
drives the engine over a stand-in device. `sweep_host_overhead` repeats every
configuration, interleaved so machine load drifts over all of them alike;
`host_overhead_tables` reports the medians.
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
from collections.abc import Iterable, Sequence

from jaxpaged.bench.offline.host_overhead import HostOverhead, measure_host_overhead
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.report import markdown_table

PARTS = ("schedule_ms", "layout_ms", "update_ms", "outputs_ms", "host_ms", "us_per_seq")


def median_fields(runs: Iterable[HostOverhead], fields: Sequence[str]) -> dict[str, float]:
    """The median of each of ``fields`` over ``runs``."""
    runs = list(runs)
    return {f: statistics.median(getattr(r, f) for r in runs) for f in fields}


@dataclasses.dataclass(frozen=True)
class HostOverheadSweep:
    """What every run shares: the model shape, the device profile, contexts, steps, and whether text streams."""

    model: str = "llama3-8b"
    profile: str = "h200-141gb"
    context_len: int = 1200
    steps: int = 64
    detokenize: bool = False
    structured: bool = False  # every sequence under a grammar (`measure_host_overhead(structured=True)`)


@dataclasses.dataclass
class HostOverheadRuns:
    """Host-time runs by (sequences, output kind) and device-busy runs by (sequences, asynchronous scheduling)."""

    host: dict[tuple[int, str], list[HostOverhead]]
    busy: dict[tuple[int, bool], list[HostOverhead]]

    def report(self) -> dict:
        """Every run, as the JSON keeps them."""
        return {"host": [vars(r) for runs in self.host.values() for r in runs],
                "busy": [vars(r) for runs in self.busy.values() for r in runs]}


def sweep_host_overhead(sweep: HostOverheadSweep, num_seqs: Sequence[int], kinds: Sequence[RequestOutputKind],
                        repeats: int) -> HostOverheadRuns:
    """At each batch size: host time per output kind (a device taking no time), then the device-busy fraction
    with each step taking its predicted time, asynchronous scheduling off and on (the first kind's outputs)."""
    common = dict(model=sweep.model, profile=sweep.profile, context_len=sweep.context_len, steps=sweep.steps,
                  detokenize=sweep.detokenize, structured=sweep.structured)
    runs = HostOverheadRuns({}, {})
    for repeat in range(repeats):  # interleaved: machine load drifts over every configuration alike
        for n in num_seqs:
            for kind in kinds:
                run = measure_host_overhead(n, sleep=False, async_scheduling=True, output_kind=kind, seed=repeat,
                                            **common)
                runs.host.setdefault((n, kind.name), []).append(run)
                print(f"{n} seqs, {kind.name}: host {run.host_ms:.3f} ms", flush=True)
            for async_scheduling in (False, True):
                run = measure_host_overhead(n, sleep=True, async_scheduling=async_scheduling,
                                            output_kind=kinds[0], seed=repeat, **common)
                runs.busy.setdefault((n, async_scheduling), []).append(run)
                print(f"{n} seqs, async={async_scheduling}: device busy {run.device_busy:.3f}", flush=True)
    return runs


def host_overhead_tables(runs: HostOverheadRuns, sweep: HostOverheadSweep, repeats: int) -> str:
    """A title naming the setting and the machine, the host-time table and the device-busy table (medians)."""
    lines = [f"Host time per decode step (ms, medians of {repeats} runs x {sweep.steps} steps), "
             f"{sweep.model} shape, ~{sweep.context_len}-token contexts, device stand-in: {sweep.profile}"
             f"{', every sequence under a JSON-lines grammar' if sweep.structured else ''}; "
             f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}", ""]
    host_rows = []
    for (n, kind), done in runs.host.items():
        values = list(median_fields(done, PARTS).values())
        host_rows.append([n, kind, *(f"{v:.3f}" for v in values[:5]), f"{values[5]:.2f}"])
    lines.append(markdown_table(["seqs", "outputs", "schedule", "layout", "update", "outputs", "whole step (host)",
                                 "us / seq"], host_rows, align="rlrrrrrr"))
    lines += ["", "Device busy while each step takes its predicted time (the stand-in's worker thread sleeps it)", ""]
    busy_rows = []
    for (n, async_scheduling), done in runs.busy.items():
        m = median_fields(done, ("device_ms", "host_ms", "step_ms", "device_busy"))
        busy_rows.append([n, f"{m['device_ms']:.2f}", "async" if async_scheduling else "sync", f"{m['host_ms']:.3f}",
                          f"{m['step_ms']:.2f}", f"{m['device_busy']:.1%}"])
    lines.append(markdown_table(["seqs", "device ms / step", "scheduling", "host ms / step", "wall ms / step",
                                 "device busy"], busy_rows, align="rrlrrr"))
    return "\n".join(lines)
