"""The simulated-H200 server in one process vs the engine core split off vs two API servers, side by side.

    jaxpaged bench engine-core --model=llama3-8b --concurrency=64,256,512 --random_output_len=256 \
        --json_out=out/bench_engine_core.json --md_out=out/bench_engine_core.md

For each configuration (`--engine_core=thread`, `process`, `process` with
`--api_server_count=2`) one `jaxpaged serve --device=simulated --model=llama3-8b`
server is started; at each concurrency, that many streaming clients each send
one random `--random_input_len`-token prompt for `--random_output_len` tokens (ignore EOS).
Reported: output tok/s, the device-busy fraction, the rate a never-idle device
would give (tok/s / busy), TPOT and ITL p50/p99, CPU seconds per streamed
token of every server process (read from /proc: the engine core, each API
server) and of this load generator, and, split, the engine core's own host
time and loop-thread CPU time per decode step (its `engine_core_step_host_seconds`
and `engine_core_loop_cpu_seconds` metrics, means over the run's decode steps).

`--host_overhead_seqs` adds the engine core's host time per decode step
measured alone (`jaxpaged.bench.host_overhead` with `engine_core=True`: the
core's output processing, stat logger and message encoding, no HTTP, no
sockets), with a device that takes no time and with the simulated H200's
steps, medians of `--host_overhead_repeats` runs of 64 steps.
"""

from __future__ import annotations

import os
import re
import resource
import statistics

from jaxpaged.bench.online.datasets import random_requests
from jaxpaged.bench.online.online_client import fetch_metric, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.bench.simulator.host_overhead import measure_host_overhead
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.http_bench import DEVICE_BUSY_METRIC, HttpBenchFlags
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.cli.workload_flags import WorkloadFlags

FLAGS = FlagSet()
bench_flags = WorkloadFlags(FLAGS)
online = HttpBenchFlags(FLAGS, bench_flags)
INPUT_LEN, OUTPUT_LEN = online.RANDOM_INPUT, online.RANDOM_OUTPUT
CONCURRENCY = FLAGS.DEFINE_list("concurrency", ["64", "256", "512"], "streaming clients at once, one run each")
CONFIGS = FLAGS.DEFINE_list("configs", ["thread", "process", "process2"],
                            "thread: one process; process: the split; process2: split with two API servers")
PROFILE = FLAGS.DEFINE_string("device_profile", "h200-141gb", "the simulated device")
HOST_SEQS = FLAGS.DEFINE_list("host_overhead_seqs", None, "also time the core's host work per decode step alone "
                              "at these sequence counts (e.g. 64,256,512)")
HOST_REPEATS = FLAGS.DEFINE_integer("host_overhead_repeats", 3, "runs per --host_overhead_seqs count")
OUT = OutputFlags(FLAGS)
FLAGS.list_of("concurrency", integer_at_least=1)
FLAGS.list_of("host_overhead_seqs", integer_at_least=1)
FLAGS.positive("host_overhead_repeats")
FLAGS.list_of("configs", choices=["thread", "process", "process2"])
FLAGS.device_profile("device_profile")

_CLK = os.sysconf("SC_CLK_TCK")
CORE_METRICS = tuple(name + '{kind="decode"}' for name in (
    "jaxpaged:engine_core_step_host_seconds_sum", "jaxpaged:engine_core_step_host_seconds_count",
    "jaxpaged:engine_core_loop_cpu_seconds_total"))


def _core_step_ms(server: ServerProcess, before: list) -> tuple[float | None, float | None]:
    """The core's mean host ms and loop-thread CPU ms per decode step since `before` (None: no core process)."""
    after = [fetch_metric(server.base_url, name) for name in CORE_METRICS]
    if None in after or None in before or after[1] == before[1]:
        return None, None
    steps = after[1] - before[1]
    return (after[0] - before[0]) / steps * 1e3, (after[2] - before[2]) / steps * 1e3


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            pass
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


def _roles(server: ServerProcess) -> dict[int, str]:
    """Which process of the server's tree is which (from the launcher's log line)."""
    root = server.process.pid
    found = re.search(r"engine core pid (\d+); API servers \[([\d, ]+)\]", server.log_tail(10**7))
    if found is None:
        return {root: "server (engine + API)"}
    roles = {int(found.group(1)): "engine core"}
    roles |= {int(p): f"API server {i}" for i, p in enumerate(found.group(2).split(","))}
    return roles | {root: "launcher"}


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_one(server: ServerProcess, concurrency: int, seed: int) -> dict:
    """One run of `concurrency` streaming clients against a started server."""
    requests = random_requests(concurrency, input_len=INPUT_LEN.value, output_len=OUTPUT_LEN.value, seed=seed)
    roles = _roles(server)
    before = {p: _cpu_s(p) for p in roles}
    own_before = _own_cpu_s()
    busy_before = fetch_metric(server.base_url, DEVICE_BUSY_METRIC)
    core_before = [fetch_metric(server.base_url, name) for name in CORE_METRICS]
    results, duration = run_requests(server.base_url, bench_flags.MODEL.value, requests, [0.0] * concurrency,
                                     ignore_eos=True, timeout_s=1800.0)
    busy_after = fetch_metric(server.base_url, DEVICE_BUSY_METRIC)
    core_host_ms, core_cpu_ms = _core_step_ms(server, core_before)
    m = compute_metrics(results, duration)
    tokens = m["total_output_tokens"] or 1
    busy = (busy_after - busy_before) / duration
    cpu = {roles[p]: (_cpu_s(p) - before[p]) / tokens * 1e6 for p in roles}
    return {"concurrency": concurrency, "failed": m["failed"], "output_tok_s": m["output_throughput"],
            "device_busy": busy, "never_idle_tok_s": m["output_throughput"] / busy if busy else float("nan"),
            "tpot_p50_ms": m["tpot_median_ms"], "tpot_p99_ms": m["tpot_p99_ms"], "itl_p50_ms": m["itl_median_ms"],
            "itl_p99_ms": m["itl_p99_ms"], "cpu_us_per_token": cpu, "core_host_ms_per_step": core_host_ms,
            "core_loop_cpu_ms_per_step": core_cpu_ms,
            "load_generator_us_per_token": (_own_cpu_s() - own_before) / tokens * 1e6, "duration_s": duration}


def main(argv):
    """Run every configuration at every concurrency; print and write the table."""
    del argv
    concurrencies = [int(c) for c in CONCURRENCY.value]
    base = ["--device=simulated", f"--model={bench_flags.MODEL.value}", f"--device_profile={PROFILE.value}",
            f"--max_num_seqs={max(concurrencies)}", "--max_num_batched_tokens=8192",
            f"--max_model_len={INPUT_LEN.value + OUTPUT_LEN.value + 16}", "--max_waiting_requests=4096"]
    extra = {"thread": ["--engine_core=thread"], "process": ["--engine_core=process"],
             "process2": ["--engine_core=process", "--api_server_count=2"]}
    rows = []
    for config in CONFIGS.value:
        with ServerProcess(base + extra[config]) as server:
            run_one(server, 8, seed=99)  # warm up
            for i, c in enumerate(concurrencies):
                row = {"config": config, **run_one(server, c, seed=i)}
                print(row, flush=True)
                rows.append(row)
    lines = ["| config | clients | out tok/s | device busy | never-idle tok/s | TPOT p50/p99 ms | ITL p50/p99 ms "
             "| CPU µs per streamed token (per process) | load generator µs/token "
             "| core host / loop CPU ms per decode step |", "|" + "---|" * 10]
    for r in rows:
        cpu = ", ".join(f"{k}: {v:.1f}" for k, v in r["cpu_us_per_token"].items())
        core = ("-" if r["core_host_ms_per_step"] is None
                else f"{r['core_host_ms_per_step']:.2f} / {r['core_loop_cpu_ms_per_step']:.2f}")
        lines.append(f"| {r['config']} | {r['concurrency']} | {r['output_tok_s']:.0f} | {r['device_busy']:.2f} "
                     f"| {r['never_idle_tok_s']:.0f} | {r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} "
                     f"| {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | {cpu} "
                     f"| {r['load_generator_us_per_token']:.1f} | {core} |")
    host_rows = _host_overhead_rows()
    if host_rows:
        lines += ["", "| seqs | device | core host ms / decode step | of which wire ms | µs / seq "
                  "| CPU ms / decode step | device busy |", "|---:|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['num_seqs']} | {r['device']} | {r['host_ms']:.3f} | {r['wire_ms']:.3f} | "
                  f"{r['us_per_seq']:.2f} | {r['cpu_ms']:.3f} | {r['device_busy']:.1%} |" for r in host_rows]
    table = "\n".join(lines)
    OUT.write({"rows": rows, "host_overhead": host_rows}, table)


def _host_overhead_rows() -> list[dict]:
    """The core's host work per decode step alone: medians over repeats, runs interleaved."""
    runs: dict[tuple[int, bool], list] = {}
    for repeat in range(HOST_REPEATS.value if HOST_SEQS.value else 0):
        for n in map(int, HOST_SEQS.value):  # unset: None, no rows
            for sleep in (False, True):
                runs.setdefault((n, sleep), []).append(
                    measure_host_overhead(n, model=bench_flags.MODEL.value, profile=PROFILE.value, sleep=sleep,
                                          seed=repeat, engine_core=True))
    rows = []
    for (n, sleep), done in runs.items():
        med = {f: statistics.median(getattr(r, f) for r in done) for f in ("host_ms", "wire_ms", "us_per_seq",
                                                                        "cpu_ms", "device_busy")}
        rows.append({"num_seqs": n, "device": PROFILE.value if sleep else "none (takes no time)", **med})
    return rows

