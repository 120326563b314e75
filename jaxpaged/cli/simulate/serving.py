"""Simulated serving: the real scheduler and KV cache manager over a roofline cost model, in simulated time.

    jaxpaged simulate serving --model=llama3-70b --profile=a100-80gb --weight_bytes_per_param=0.5 \
        --kv_cache_gb=45 --workload=chatbot --num_requests=2000 --rates=0.5,1,2,4 --plot_dir=docs/plots
    jaxpaged simulate serving --model=llama3-8b --profile=h200-141gb --trace_time_scale=2 \
        --trace=data/traces/mooncake_conversation_trace.jsonl --eviction_policies=lru,lfu,sieve,slru

Per prefix-caching mode: each offered rate's TTFT, throughput, hit rate and preemptions, then the highest
rate whose p99 TTFT stays under `--ttft_p99_bound_s`. With `--trace`: the trace's own arrivals, once per
eviction policy, with goodput and KV residency (`jaxpaged.sim.serving_sweep`). See docs/benchmarks/simulator.md
and docs/benchmarks/eviction.md.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.options import option
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cli.deployment_flags import DeploymentFlags
from jaxpaged.cli.flagset import parse_key_values
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.serving_sweep import rate_sweep, trace_replay, trace_requests
from jaxpaged.sim.workloads import WORKLOADS, make_workload


@dataclasses.dataclass(frozen=True)
class SimulateServingOptions:
    """The workload and the rate sweep, or the trace and the eviction policies it is replayed under."""

    workload: str = option("chatbot", "workload (jaxpaged/sim/workloads.py)", choices=list(WORKLOADS))
    num_requests: int = option(1000, "requests per run", at_least=1)
    scales: tuple[str, ...] = option((), "workload length overrides, key=value (e.g. output_len=100)",
                                     check="key_values")
    prefix_caching: tuple[str, ...] = option(("off", "on"), "modes to run: off, on", choices=["off", "on"])
    rates: tuple[float, ...] = option((0, 1, 2, 4), "offered request rates (req/s); 0 = all at once", at_least=0)
    ttft_p99_bound_s: float = option(2.0, "p99 TTFT bound defining the sustainable rate", at_least=1e-3)
    refine: int = option(4, "bisection steps between the last passing and first failing rate", at_least=0)
    seed: int = option(0, "workload and arrival seed", at_least=0)
    decode_fast_forward: bool = option(True, "jump over predictable decode steps (same results; "
                                             "--nodecode_fast_forward steps through every one)")
    trace: str | None = option(None, "Mooncake-format JSONL trace to replay instead of --workload",
                               check="existing_file")
    trace_limit: int | None = option(None, "replay only the trace's first N requests", at_least=1)
    trace_time_scale: float = option(1.0, "multiply the trace's timestamps (2 = half the rate)", at_least=1e-6)
    eviction_policies: tuple[str, ...] = option(("lru",), "eviction policies to run (with --trace)",
                                                choices=EVICTION_POLICIES)
    goodput_ttft_s: float = option(2.0, "goodput SLO: time to first token (s)", at_least=1e-6)
    goodput_tpot_ms: float = option(100.0, "goodput SLO: time per output token (ms)", at_least=1e-6)
    plot_name: str = option("sim_sweep.png", "file name of the rate sweep's PNG in --plot_dir")


COMMAND = CommandFlags(SimulateServingOptions, plot_dir=None)
FLAGS = COMMAND.flags
# the simulated engine; kv_cache_metrics_sample is used with --trace (the residency numbers)
DEPLOY = DeploymentFlags(FLAGS, ["model", "block_size", "max_num_seqs", "max_num_batched_tokens",
                                 "tensor_parallel_size", "kv_cache_metrics_sample"],
                         profile_help=" (--tensor_parallel_size of these devices: weights and KV per device, two "
                                      "all-reduces per layer over the interconnect)",
                         engine_defaults={"kv_cache_metrics_sample": 0.01})


def main(argv):
    """Sweep the request rates (or replay --trace); print the rows as they finish, then write the results."""
    del argv
    o = COMMAND.options()
    if o.trace:
        run_trace(o)
        return
    scales = parse_key_values(list(o.scales))
    requests = make_workload(o.workload, num_requests=o.num_requests, seed=o.seed, **scales)
    base = DEPLOY.deployment(kv_cache_metrics_sample=0.0)  # the residency sample is read only with --trace
    sweep = rate_sweep(base, requests, list(o.prefix_caching), list(o.rates), ttft_p99_bound_s=o.ttft_p99_bound_s,
                       refine=o.refine, seed=o.seed, decode_fast_forward=o.decode_fast_forward)
    curves = sweep.curves
    from jaxpaged.sim.plots import plot_sweep
    title = f"{base.model} on {base.profile}, {o.workload} ({o.num_requests} requests)"
    COMMAND.out.write({"deployment": dataclasses.asdict(base), "num_blocks": base.num_blocks(),
                       "results": sweep.results}, sweep.table(), echo=False,
                      plots={o.plot_name: lambda: plot_sweep(curves, bound_s=o.ttft_p99_bound_s, title=title)})


def run_trace(o: SimulateServingOptions) -> None:
    """--trace: the trace at its own (time-scaled) arrivals, once per eviction policy."""
    base = DEPLOY.deployment()
    requests = trace_requests(base, o.trace, limit=o.trace_limit, time_scale=o.trace_time_scale)
    points, table = trace_replay(base, requests, list(o.eviction_policies), ttft_slo_s=o.goodput_ttft_s,
                                 tpot_slo_s=o.goodput_tpot_ms / 1e3, decode_fast_forward=o.decode_fast_forward)
    COMMAND.out.write({"deployment": dataclasses.asdict(base), "num_requests": len(requests),
                       "results": [dataclasses.asdict(p) for p in points]},
                      table, echo=False)
