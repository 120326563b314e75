"""The simulated-H200 server in one process vs the engine core split off vs two API servers, side by side.

    python scripts/bench_engine_core.py --model=llama3-8b --concurrency=64,256,512 --random_output_len=256 \
        --json_out=out/bench_engine_core.json --md_out=out/bench_engine_core.md

For each configuration (`--engine_core=thread`, `process`, `process` with
`--api_server_count=2`) one `serve.py --device=simulated --model=llama3-8b`
server is started; at each concurrency, that many streaming clients each send
one random `--random_input_len`-token prompt for `--random_output_len` tokens (ignore EOS).
Reported: output tok/s, the device-busy fraction, the rate a never-idle device
would give (tok/s / busy), TPOT and ITL p50/p99, and CPU seconds per streamed
token of every server process (read from /proc: the engine core, each API
server) and of this load generator.
"""

from __future__ import annotations

import os
import re
import resource

from absl import app, flags

from jaxpaged.bench.datasets import random_requests
from jaxpaged.bench import flag_checks
from jaxpaged.bench import flags as bench_flags
from jaxpaged.bench.online import DEVICE_BUSY_METRIC, RANDOM_INPUT as INPUT_LEN, RANDOM_OUTPUT as OUTPUT_LEN
from jaxpaged.bench.online_client import fetch_metric, run_requests
from jaxpaged.bench.online_metrics import compute_metrics
from jaxpaged.bench.results_io import write_outputs
from jaxpaged.bench.server_process import ServerProcess

CONCURRENCY = flags.DEFINE_list("concurrency", ["64", "256", "512"], "streaming clients at once, one run each")
CONFIGS = flags.DEFINE_list("configs", ["thread", "process", "process2"],
                            "thread: one process; process: the split; process2: split with two API servers")
PROFILE = flags.DEFINE_string("device_profile", "h200-141gb", "the simulated device")
JSON_OUT = flags.DEFINE_string("json_out", None, "write the results here as JSON")
MD_OUT = flags.DEFINE_string("md_out", None, "write the Markdown table here")
flag_checks.list_of("concurrency", integer_at_least=1)
flag_checks.list_of("configs", choices=["thread", "process", "process2"])
flag_checks.device_profile("device_profile")

_CLK = os.sysconf("SC_CLK_TCK")


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
    results, duration = run_requests(server.base_url, bench_flags.MODEL.value, requests, [0.0] * concurrency,
                                     ignore_eos=True, timeout_s=1800.0)
    busy_after = fetch_metric(server.base_url, DEVICE_BUSY_METRIC)
    m = compute_metrics(results, duration)
    tokens = m["total_output_tokens"] or 1
    busy = (busy_after - busy_before) / duration
    cpu = {roles[p]: (_cpu_s(p) - before[p]) / tokens * 1e6 for p in roles}
    return {"concurrency": concurrency, "failed": m["failed"], "output_tok_s": m["output_throughput"],
            "device_busy": busy, "never_idle_tok_s": m["output_throughput"] / busy if busy else float("nan"),
            "tpot_p50_ms": m["tpot_median_ms"], "tpot_p99_ms": m["tpot_p99_ms"], "itl_p50_ms": m["itl_median_ms"],
            "itl_p99_ms": m["itl_p99_ms"], "cpu_us_per_token": cpu,
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
             "| CPU µs per streamed token (per process) | load generator µs/token |", "|" + "---|" * 9]
    for r in rows:
        cpu = ", ".join(f"{k}: {v:.1f}" for k, v in r["cpu_us_per_token"].items())
        lines.append(f"| {r['config']} | {r['concurrency']} | {r['output_tok_s']:.0f} | {r['device_busy']:.2f} "
                     f"| {r['never_idle_tok_s']:.0f} | {r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} "
                     f"| {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | {cpu} "
                     f"| {r['load_generator_us_per_token']:.1f} |")
    table = "\n".join(lines)
    print(table)
    write_outputs({"rows": rows}, table, JSON_OUT.value, MD_OUT.value)


if __name__ == "__main__":
    app.run(main)
