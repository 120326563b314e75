"""``jaxpaged simulate serving``: request-rate sweeps and trace replays of one deployment, all in simulated time.

`rate_sweep` serves a workload at each offered Poisson rate, per prefix-caching
mode, and bisects for the highest rate whose p99 TTFT stays within a bound
(`jaxpaged.sim.scenario`). `trace_replay` serves a trace at its own arrivals,
once per eviction policy. Both print their table's rows as they finish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpaged.report import markdown_row, markdown_table
from jaxpaged.sim import scenario
from jaxpaged.sim.scenario import Deployment, SweepPoint, TracePoint
from jaxpaged.sim.traces import load_trace, trace_workload
from jaxpaged.sim.workloads import WorkloadRequest

SWEEP_HEADER = ["prefix caching", "offered (req/s)", "throughput (req/s)", "p50 TTFT (s)", "p99 TTFT (s)",
                "p50 TPOT (ms)", "hit rate", "preemptions", "wall (s)"]
TRACE_HEADER = ["policy", "hit rate", "p50 TTFT (s)", "p99 TTFT (s)", "p50 TPOT (ms)", "throughput (req/s)",
                "goodput (req/s)", "preemptions", "evictions", "wall (s)"]


@dataclasses.dataclass
class RateSweep:
    """Per mode: the sustainable rate and every point run; the table's rows; the p99 TTFT curve per mode."""

    results: dict[str, dict]
    rows: list[list]
    curves: dict[str, tuple[list[float], list[float]]]

    def table(self) -> str:
        """Every point, in the order run."""
        return markdown_table(SWEEP_HEADER, self.rows)


def describe(d: Deployment) -> str:
    """One line: the model, the devices, the weights per device and the KV blocks."""
    return (f"{d.model} on {d.tensor_parallel_size} x {d.profile}: weights "
            f"{d.weight_bytes_per_device() / 1e9:.1f} GB per device, {d.num_blocks()} KV blocks of "
            f"{d.block_size} tokens ({d.block_bytes_per_device() / 1e6:.2f} MB per device each)")


def sweep_row(mode: str, p: SweepPoint) -> list:
    """One rate's row."""
    return [mode, f"{p.rate:g}", f"{p.throughput_rps:.2f}", f"{p.ttft_p50:.3f}", f"{p.ttft_p99:.3f}",
            f"{p.tpot_p50 * 1e3:.1f}", f"{p.prefix_hit_rate:.1%}", p.num_preemptions, f"{p.wall_s:.1f}"]


def trace_row(p: TracePoint) -> list:
    """One eviction policy's row."""
    evictions = sum(p.kv_residency["evictions_by_reason"].values())
    return [p.eviction_policy, f"{p.prefix_hit_rate:.1%}", f"{p.ttft_p50:.3f}", f"{p.ttft_p99:.3f}",
            f"{p.tpot_p50 * 1e3:.1f}", f"{p.throughput_rps:.2f}", f"{p.goodput_rps:.2f}", p.num_preemptions,
            evictions, f"{p.wall_s:.0f}"]


def rate_sweep(base: Deployment, requests: list[WorkloadRequest], modes: Sequence[str], rates: Sequence[float], *,
               ttft_p99_bound_s: float, refine: int = 4, seed: int = 0, decode_fast_forward: bool = True,
               echo: bool = True) -> RateSweep:
    """Each prefix-caching mode ("off" / "on") at each rate (0: all at once), then ``refine`` bisection steps.

    A mode's points are listed once each, by rate; the curve holds the points at rates above 0.
    """
    if echo:
        print(describe(base))
        print(markdown_table(SWEEP_HEADER, []))
    results, curves, rows = {}, {}, []
    for mode in modes:
        deployment = dataclasses.replace(base, enable_prefix_caching=mode == "on")

        def run(rate, deployment=deployment):
            return scenario.run_at_rate(deployment, requests, rate, seed=seed, decode_fast_forward=decode_fast_forward)

        def add_rows(new_points: list[SweepPoint], mode=mode) -> None:
            for p in new_points:
                rows.append(sweep_row(mode, p))
                if echo:
                    print(markdown_row(rows[-1]), flush=True)

        points = scenario.sweep(run, rates)
        add_rows(points)
        swept = [p for p in points if p.rate > 0]
        best = scenario.sustainable_rate(swept, ttft_p99_bound_s)
        failing = [p.rate for p in swept if best is None or p.rate > best]
        extra = []
        if refine and failing:
            best, extra = scenario.refine_sustainable_rate(run, best or 0.0, min(failing), ttft_p99_bound_s, refine)
            add_rows(extra)
        swept = sorted(swept + extra, key=lambda p: p.rate)
        results[mode] = {"sustainable_rate": best,
                         "points": [dataclasses.asdict(p) for p in sorted(points + extra, key=lambda p: p.rate)]}
        curves[f"prefix caching {mode}"] = ([p.rate for p in swept], [p.ttft_p99 for p in swept])
    if echo:
        for mode, r in results.items():
            print(f"prefix caching {mode}: sustainable rate {r['sustainable_rate']} req/s "
                  f"(p99 TTFT <= {ttft_p99_bound_s:g} s)")
    return RateSweep(results, rows, curves)


def residency_lines(points: Sequence[TracePoint]) -> str:
    """Each policy's sampled lifetime, idle-before-evict and reuse-gap p50/p90 (simulated seconds)."""
    lines = ["KV residency (sampled; simulated seconds): policy, lifetime p50/p90, idle before evict p50/p90, "
             "reuse gap p50/p90"]
    for p in points:
        r = p.kv_residency
        cells = [f"{r[k]['p50']:.1f}/{r[k]['p90']:.1f}" if r.get(k, {}).get("count") else "-"
                 for k in ("lifetime_s", "idle_before_evict_s", "reuse_gap_s")]
        lines.append(f"  {p.eviction_policy}: " + ", ".join(cells))
    return "\n".join(lines)


def trace_requests(base: Deployment, path: str, *, limit: int | None = None,
                   time_scale: float = 1.0) -> list[WorkloadRequest]:
    """The trace's requests at its timestamps times ``time_scale``, prompts cut to what ``base`` can hold."""
    requests = trace_workload(load_trace(path, limit=limit), time_scale=time_scale,
                              max_model_len=min(base.model_config.max_position_embeddings,
                                                base.num_blocks() * base.block_size))
    print(f"{len(requests)} trace requests over {requests[-1].arrival_time:.0f} s (time scale "
          f"{time_scale:g}); {base.model} on {base.profile}: {base.num_blocks()} KV blocks of "
          f"{base.block_size} tokens ({base.num_blocks() * base.block_size:,} tokens)")
    return requests


def trace_replay(base: Deployment, requests: list[WorkloadRequest], policies: Sequence[str], *, ttft_slo_s: float,
                 tpot_slo_s: float, decode_fast_forward: bool = True,
                 echo: bool = True) -> tuple[list[TracePoint], str]:
    """The trace at its own arrivals once per eviction policy: the points and their table."""
    if echo:
        print(markdown_table(TRACE_HEADER, []))
    points, rows = [], []
    for policy in policies:
        result = scenario.run_with_arrivals(dataclasses.replace(base, eviction_policy=policy), requests,
                                            decode_fast_forward=decode_fast_forward)
        points.append(scenario.summarize_trace(policy, result, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s))
        rows.append(trace_row(points[-1]))
        if echo:
            print(markdown_row(rows[-1]), flush=True)
    if echo:
        print("\n" + residency_lines(points))
    return points, markdown_table(TRACE_HEADER, rows)
