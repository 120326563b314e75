"""``jaxpaged simulate disagg``: colocated against prefill:decode splits of the same devices, on a trace.

For each offered load (the trace's timestamps times a scale) the same
requests are served by N instances colocated and by every split of the N into
P prefill + (N - P) decode instances (`jaxpaged.sim.disaggregated`). Every
run is scored against each SLO (`jaxpaged.sim.slo`) from the same records:
attainment (requests meeting TTFT and TBT) and goodput (such requests per
second). Rows are printed as the runs finish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpaged.report import markdown_row, markdown_table
from jaxpaged.sim.disaggregated import Pools, PoolsResult, simulate_pools
from jaxpaged.sim.kv_link import KVLink
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.slo import SLO
from jaxpaged.sim.traces import load_trace, trace_workload
from jaxpaged.sim.workloads import WorkloadRequest

HEADER = ["time scale", "offered (req/s)", "pools", "throughput (req/s)", "p50 TTFT (s)", "p99 TTFT (s)",
          "p50 TBT (ms)", "p99 TBT (ms)", "prefill hit rate", "decode hit rate", "KV moved (GB)",
          "p50 transfer (ms)", "preemptions", "wall (s)"]


def slo_name(slo: SLO) -> str:
    """"TTFT 2 s / TBT p90 100 ms"."""
    return f"TTFT {slo.ttft_s:g} s / TBT {slo.tbt_stat} {slo.tbt_s * 1e3:g} ms"


def splits(num_instances: int, prefill_counts: Sequence[int] | None = None) -> list[Pools]:
    """Colocated, then each P prefill + (N - P) decode split (every P from 1 to N - 1 unless given)."""
    counts = range(1, num_instances) if prefill_counts is None else prefill_counts
    for p in counts:
        if not 1 <= p < num_instances:
            raise ValueError(f"a split of {num_instances} instances needs 1 <= prefill instances < "
                             f"{num_instances}, got {p}")
    return [Pools(colocated=num_instances)] + [Pools(prefill=p, decode=num_instances - p) for p in counts]


def offered_rate(requests: Sequence[WorkloadRequest]) -> float:
    """Requests per second of the arrivals (count over the span from the first to the last arrival)."""
    span = max(r.arrival_time for r in requests) - min(r.arrival_time for r in requests)
    return len(requests) / span if span > 0 else float("inf")


def run_row(time_scale: float, offered: float, result: PoolsResult, slo: SLO) -> list:
    """One run's row (TBT columns: `slo`'s statistic)."""
    s = result.summary(slo)
    records = result.records
    prompt = sum(r.num_prompt_tokens for r in records)
    prefill_hits = sum(r.prefill_cached_tokens or 0 for r in records)
    tbt50, tbt99 = s[f"tbt_{slo.tbt_stat}_p50_s"], s[f"tbt_{slo.tbt_stat}_p99_s"]
    ms = lambda v: "-" if v is None else f"{v * 1e3:.1f}"
    return [f"{time_scale:g}", f"{offered:.2f}", s["pools"], f"{s['throughput_rps']:.2f}", f"{s['ttft_p50_s']:.3f}",
            f"{s['ttft_p99_s']:.3f}", ms(tbt50), ms(tbt99),
            "-" if result.pools.colocated else f"{prefill_hits / prompt:.1%}", f"{s['prefix_hit_rate']:.1%}",
            f"{s['transfer_gb']:.1f}", f"{s['transfer_s_p50'] * 1e3:.1f}", s["preemptions"], f"{s['wall_s']:.0f}"]


@dataclasses.dataclass
class SplitSweep:
    """Every run's summary per SLO, and the table rows."""

    runs: list[dict]  # {"time_scale", "offered_rps", "pools", "by_slo": {slo name: summary}}
    rows: list[list]
    slos: list[SLO]

    def table(self) -> str:
        """One row per run."""
        return markdown_table(HEADER, self.rows, align="rrl" + "r" * (len(HEADER) - 3))

    def slo_table(self) -> str:
        """Goodput (req/s) and attainment per run and SLO."""
        header = ["time scale", "pools"] + [f"{slo_name(s)}: goodput (req/s), attainment" for s in self.slos]
        rows = [[f"{run['time_scale']:g}", run["pools"]]
                + [f"{run['by_slo'][slo_name(s)]['goodput_rps']:.2f}, "
                   f"{run['by_slo'][slo_name(s)]['slo_attainment']:.1%}" for s in self.slos]
                for run in self.runs]
        return markdown_table(header, rows, align="rl" + "r" * len(self.slos))

    def plots(self, where: str, num_instances: int, prefix: str) -> dict:
        """File name -> figure builder: goodput by split at each load; with several loads, attainment against
        load for each SLO (``where``: the deployment, for the titles)."""
        from jaxpaged.sim.plots import plot_attainment, plot_split_goodput

        plots = {}
        scales = sorted({run["time_scale"] for run in self.runs})
        for scale in scales:
            runs = [run for run in self.runs if run["time_scale"] == scale]
            curves, colocated = {}, {}
            for slo in self.slos:
                name = slo_name(slo)
                split_runs = [run for run in runs if not run["colocated"]]
                curves[name] = ([run["prefill"] for run in split_runs],
                                [run["by_slo"][name]["goodput_rps"] for run in split_runs])
                colocated.update({name: run["by_slo"][name]["goodput_rps"] for run in runs if run["colocated"]})
            title = f"{where}, offered {runs[0]['offered_rps']:.2f} req/s"
            plots[f"{prefix}_goodput_x{scale:g}.png"] = (
                lambda c=curves, b=colocated, t=title: plot_split_goodput(c, b, num_instances=num_instances, title=t))
        for i, slo in enumerate(self.slos if len(scales) > 1 else []):
            name = slo_name(slo)
            curves = {}
            for run in sorted(self.runs, key=lambda r: r["offered_rps"]):
                rates, values = curves.setdefault(run["pools"], ([], []))
                rates.append(run["offered_rps"])
                values.append(run["by_slo"][name]["slo_attainment"])
            plots[f"{prefix}_attainment_slo{i}.png"] = lambda c=curves, t=f"{where}: {name}": plot_attainment(c, title=t)
        return plots


def trace_at_loads(deployment: Deployment, path: str, *, limit: int,
                   time_scales: Sequence[float]) -> dict[float, list[WorkloadRequest]]:
    """The trace's first ``limit`` requests at each time scale's arrivals, prompts cut to what one instance holds."""
    max_len = min(deployment.model_config.max_position_embeddings, deployment.num_blocks() * deployment.block_size)
    trace = load_trace(path, limit=limit)
    return {scale: trace_workload(trace, time_scale=scale, max_model_len=max_len) for scale in time_scales}


def split_sweep(deployment: Deployment, requests_at: dict[float, list[WorkloadRequest]], pools: Sequence[Pools], *,
                link: KVLink, slos: Sequence[SLO], policy: str = "prefix_aware", echo: bool = True) -> SplitSweep:
    """Every time scale's requests on every pool layout; summaries per SLO (the table's TBT columns use the
    first SLO's statistic)."""
    if echo:
        print(markdown_table(HEADER, []))
    runs, rows = [], []
    for scale, requests in requests_at.items():
        offered = offered_rate(requests)
        for layout in pools:
            result = simulate_pools(deployment, layout, [dataclasses.replace(r) for r in requests], link=link,
                                    policy=policy)
            runs.append({"time_scale": scale, "offered_rps": offered, "pools": layout.label,
                         "prefill": layout.prefill, "decode": layout.decode, "colocated": layout.colocated,
                         "by_slo": {slo_name(s): result.summary(s) for s in slos}})
            rows.append(run_row(scale, offered, result, slos[0]))
            if echo:
                print(markdown_row(rows[-1]), flush=True)
    return SplitSweep(runs, rows, list(slos))
