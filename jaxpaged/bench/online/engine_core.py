"""``jaxpaged bench engine-core``: the simulated-device server in one process, split, and with two API servers
(what each column means: docs/benchmarks/engine-core.md)."""

from __future__ import annotations

import dataclasses
import os
import re
import resource
from collections.abc import Mapping, Sequence
from pathlib import Path

from jaxpaged.bench.offline.host_overhead import measure_host_overhead, median_fields
from jaxpaged.bench.online.datasets import random_requests
from jaxpaged.bench.online.http_run import DEVICE_BUSY_METRIC
from jaxpaged.bench.online.online_client import fetch_metric, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.bench.options import option
from jaxpaged.report import markdown_table

CONFIGS = {"thread": ["--engine_core=thread"], "process": ["--engine_core=process"],
           "process2": ["--engine_core=process", "--api_server_count=2"]}
CORE_METRICS = tuple(name + '{kind="decode"}' for name in (
    "jaxpaged:engine_core_step_host_seconds_sum", "jaxpaged:engine_core_step_host_seconds_count",
    "jaxpaged:engine_core_loop_cpu_seconds_total"))
_CLK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class EngineCoreBench:
    """The server every configuration runs and the clients' requests."""

    model: str = "llama3-8b"
    device_profile: str = option("h200-141gb", "the simulated device", check="device_profile")
    random_input_len: int = option(1024, "prompt tokens (random) of each client's one request", at_least=1)
    random_output_len: int = option(128, "generated tokens (ignore EOS) of each request", at_least=1)
    concurrency: tuple[int, ...] = option((64, 256, 512), "streaming clients at once, one run each", at_least=1)
    configs: tuple[str, ...] = option(tuple(CONFIGS), "thread: one process; process: the split; process2: split "
                                                      "with two API servers", choices=list(CONFIGS))
    host_overhead_seqs: tuple[int, ...] = option((), "also time the core's host work per decode step alone at "
                                                     "these sequence counts (e.g. 64,256,512)", at_least=1)
    host_overhead_repeats: int = option(3, "runs per --host_overhead_seqs count", at_least=1)

    def server_args(self, config: str) -> list[str]:
        """``jaxpaged serve`` flags of configuration ``config`` (thread, process, process2)."""
        return ["--device=simulated", f"--model={self.model}", f"--device_profile={self.device_profile}",
                f"--max_num_seqs={max(self.concurrency)}", "--max_num_batched_tokens=8192",
                f"--max_model_len={self.random_input_len + self.random_output_len + 16}",
                "--max_waiting_requests=4096",
                *CONFIGS[config]]


def core_step_ms(before: Sequence[float | None], after: Sequence[float | None]) -> tuple[float | None, float | None]:
    """The core's mean host ms and loop-thread CPU ms per decode step between two reads of `CORE_METRICS`.

    None, None when the server has no core process (no metrics) or no decode step ran.
    """
    if None in after or None in before or after[1] == before[1]:
        return None, None
    steps = after[1] - before[1]
    return (after[0] - before[0]) / steps * 1e3, (after[2] - before[2]) / steps * 1e3


def cpu_seconds(stat: str) -> float:
    """User + system CPU seconds from a ``/proc/PID/stat`` line (all the process's threads)."""
    fields = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLK


def process_roles(log: str, root_pid: int) -> dict[int, str]:
    """Which process of the server's tree is which, from the launcher's log line (none: one process does all)."""
    found = re.search(r"engine core pid (\d+); API servers \[([\d, ]+)\]", log)
    if found is None:
        return {root_pid: "server (engine + API)"}
    roles = {int(found.group(1)): "engine core"}
    roles |= {int(p): f"API server {i}" for i, p in enumerate(found.group(2).split(","))}
    return roles | {root_pid: "launcher"}


def _cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds so far of process ``pid`` (None: this one)."""
    if pid is not None:
        return cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_one(server: ServerProcess, bench: EngineCoreBench, concurrency: int, seed: int) -> dict:
    """One run of ``concurrency`` streaming clients against a started server: one row."""
    requests = random_requests(concurrency, input_len=bench.random_input_len,
                               output_len=bench.random_output_len, seed=seed)
    roles = process_roles(server.log_tail(10**7), server.process.pid)
    metrics = (DEVICE_BUSY_METRIC, *CORE_METRICS)
    before, own_before = {p: _cpu_s(p) for p in roles}, _cpu_s()
    server_before = [fetch_metric(server.base_url, name) for name in metrics]
    results, duration = run_requests(server.base_url, bench.model, requests, [0.0] * concurrency,
                                     ignore_eos=True, timeout_s=1800.0)
    server_after = [fetch_metric(server.base_url, name) for name in metrics]
    core_host_ms, core_cpu_ms = core_step_ms(server_before[1:], server_after[1:])
    m = compute_metrics(results, duration)
    tokens = m["total_output_tokens"] or 1
    busy = (server_after[0] - server_before[0]) / duration
    cpu = {roles[p]: (_cpu_s(p) - before[p]) / tokens * 1e6 for p in roles}
    return {"concurrency": concurrency, "failed": m["failed"], "output_tok_s": m["output_throughput"],
            "device_busy": busy, "never_idle_tok_s": m["output_throughput"] / busy if busy else float("nan"),
            "tpot_p50_ms": m["tpot_median_ms"], "tpot_p99_ms": m["tpot_p99_ms"], "itl_p50_ms": m["itl_median_ms"],
            "itl_p99_ms": m["itl_p99_ms"], "cpu_us_per_token": cpu, "core_host_ms_per_step": core_host_ms,
            "core_loop_cpu_ms_per_step": core_cpu_ms,
            "load_generator_us_per_token": (_cpu_s() - own_before) / tokens * 1e6, "duration_s": duration}


def run_configs(bench: EngineCoreBench) -> list[dict]:
    """Every configuration at every concurrency (after an untimed warm-up run each), rows printed as they finish."""
    rows = []
    for config in bench.configs:
        with ServerProcess(bench.server_args(config)) as server:
            run_one(server, bench, 8, seed=99)  # warm up
            for i, c in enumerate(bench.concurrency):
                row = {"config": config, **run_one(server, bench, c, seed=i)}
                print(row, flush=True)
                rows.append(row)
    return rows


def host_overhead_rows(bench: EngineCoreBench) -> list[dict]:
    """The core's host work per decode step alone at each ``host_overhead_seqs``, with a device that takes no
    time and with the simulated one: medians over ``host_overhead_repeats`` runs, interleaved."""
    runs: dict[tuple[int, bool], list] = {}
    for repeat in range(bench.host_overhead_repeats if bench.host_overhead_seqs else 0):
        for n in bench.host_overhead_seqs:
            for sleep in (False, True):
                runs.setdefault((n, sleep), []).append(measure_host_overhead(
                    n, model=bench.model, profile=bench.device_profile, sleep=sleep, seed=repeat, engine_core=True))
    return [{"num_seqs": n, "device": bench.device_profile if sleep else "none (takes no time)",
             **median_fields(done, ("host_ms", "wire_ms", "us_per_seq", "cpu_ms", "device_busy"))}
            for (n, sleep), done in runs.items()]


def engine_core_table(rows: Sequence[Mapping], host_rows: Sequence[Mapping] = ()) -> str:
    """The runs' table, and the core's host work per decode step alone under it when measured."""
    def pair(r: Mapping, a: str, b: str, digits: int) -> str:
        return "-" if r[a] is None else f"{r[a]:.{digits}f} / {r[b]:.{digits}f}"

    cells = [[r["config"], r["concurrency"], f"{r['output_tok_s']:.0f}", f"{r['device_busy']:.2f}",
              f"{r['never_idle_tok_s']:.0f}", pair(r, "tpot_p50_ms", "tpot_p99_ms", 1),
              pair(r, "itl_p50_ms", "itl_p99_ms", 1),
              ", ".join(f"{k}: {v:.1f}" for k, v in r["cpu_us_per_token"].items()),
              f"{r['load_generator_us_per_token']:.1f}",
              pair(r, "core_host_ms_per_step", "core_loop_cpu_ms_per_step", 2)] for r in rows]
    table = markdown_table(["config", "clients", "out tok/s", "device busy", "never-idle tok/s", "TPOT p50/p99 ms",
                            "ITL p50/p99 ms", "CPU µs per streamed token (per process)", "load generator µs/token",
                            "core host / loop CPU ms per decode step"], cells, align="l" * 10)
    if not host_rows:
        return table
    return table + "\n\n" + markdown_table(
        ["seqs", "device", "core host ms / decode step", "of which wire ms", "µs / seq", "CPU ms / decode step",
         "device busy"],
        [[r["num_seqs"], r["device"], f"{r['host_ms']:.3f}", f"{r['wire_ms']:.3f}", f"{r['us_per_seq']:.2f}",
          f"{r['cpu_ms']:.3f}", f"{r['device_busy']:.1%}"] for r in host_rows], align="rlrrrrr")
