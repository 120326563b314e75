"""Simulated serving: the real scheduler and KV cache manager over a roofline cost model.

    jaxpaged simulate serving --model=llama3-70b --profile=a100-80gb \
        --weight_bytes_per_param=0.5 --kv_cache_gb=45 --workload=chatbot --num_requests=2000 \
        --rates=0.5,1,1.5,2,2.5,3,4 --prefix_caching=off,on --plot_dir=docs/plots

For each prefix-caching mode: serve the workload at each offered Poisson rate
(rate 0 = every request at once, the saturated throughput), report p50/p99
TTFT, throughput, hit rate and preemptions, then bisect for the highest rate
whose p99 TTFT stays under `--ttft_p99_bound_s`. All times are simulated.

With `--trace` (a Mooncake-format JSONL trace, e.g. data/traces/mooncake_conversation_trace.jsonl) the
requests and their arrivals come from the trace instead (timestamps times `--trace_time_scale`; `--rates`
and `--workload` are not used), served once per `--eviction_policies` entry; the report gives hit rate,
TTFT p50/p99, TPOT, goodput (requests meeting `--goodput_ttft_s` and `--goodput_tpot_ms`) and the KV
residency numbers (evictions by reason, sampled block lifetimes).

    jaxpaged simulate serving --model=llama3-8b --profile=h200-141gb \
        --trace=data/traces/mooncake_conversation_trace.jsonl --trace_time_scale=2 \
        --eviction_policies=lru,lfu,sieve,slru

The work is `jaxpaged.sim.serving_sweep`.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cli.deployment_flags import DeploymentFlags
from jaxpaged.cli.flagset import FlagSet, parse_key_values
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.sim.serving_sweep import rate_sweep, trace_replay, trace_requests
from jaxpaged.sim.workloads import WORKLOADS, make_workload

FLAGS = FlagSet()
WORKLOAD = FLAGS.DEFINE_enum("workload", "chatbot", list(WORKLOADS), "workload (jaxpaged/sim/workloads.py)")
NUM_REQUESTS = FLAGS.DEFINE_integer("num_requests", 1000, "requests per run")
SCALES = FLAGS.DEFINE_list("scales", [], "workload length overrides, key=value (e.g. output_len=100)")
# the simulated engine; kv_cache_metrics_sample is used with --trace (the residency numbers)
DEPLOY = DeploymentFlags(FLAGS, ["model", "block_size", "max_num_seqs", "max_num_batched_tokens",
                                 "tensor_parallel_size", "kv_cache_metrics_sample"],
                         profile_help=" (--tensor_parallel_size of these devices: weights and KV per device, two "
                                      "all-reduces per layer over the interconnect)",
                         engine_defaults={"kv_cache_metrics_sample": 0.01})
PREFIX = FLAGS.DEFINE_list("prefix_caching", ["off", "on"], "modes to run: off, on")
RATES = FLAGS.DEFINE_list("rates", ["0", "1", "2", "4"], "offered request rates (req/s); 0 = all at once")
BOUND = FLAGS.DEFINE_float("ttft_p99_bound_s", 2.0, "p99 TTFT bound defining the sustainable rate")
REFINE = FLAGS.DEFINE_integer("refine", 4, "bisection steps between the last passing and first failing rate")
SEED = FLAGS.DEFINE_integer("seed", 0, "workload and arrival seed")
FAST_FORWARD = FLAGS.DEFINE_bool("decode_fast_forward", True, "jump over predictable decode steps (same "
                                  "results; --nodecode_fast_forward steps through every one)")
TRACE = FLAGS.DEFINE_string("trace", None, "Mooncake-format JSONL trace to replay instead of --workload")
TRACE_LIMIT = FLAGS.DEFINE_integer("trace_limit", None, "replay only the trace's first N requests")
TRACE_SCALE = FLAGS.DEFINE_float("trace_time_scale", 1.0, "multiply the trace's timestamps (2 = half the rate)")
POLICIES = FLAGS.DEFINE_list("eviction_policies", ["lru"], "eviction policies to run (with --trace)")
GOOD_TTFT = FLAGS.DEFINE_float("goodput_ttft_s", 2.0, "goodput SLO: time to first token (s)")
GOOD_TPOT = FLAGS.DEFINE_float("goodput_tpot_ms", 100.0, "goodput SLO: time per output token (ms)")
OUT = OutputFlags(FLAGS, plot_dir=None)
PLOT_NAME = FLAGS.DEFINE_string("plot_name", "sim_sweep.png", "file name of the rate sweep's PNG in --plot_dir")

FLAGS.positive("num_requests")
FLAGS.non_negative("refine", "seed")
FLAGS.at_least(1e-3, "ttft_p99_bound_s")
FLAGS.list_of("prefix_caching", choices=["off", "on"])
FLAGS.list_of("rates", number_at_least=0)
FLAGS.key_values("scales")
FLAGS.positive("trace_limit")
FLAGS.existing_file("trace")
FLAGS.at_least(1e-6, "trace_time_scale", "goodput_ttft_s", "goodput_tpot_ms")
FLAGS.list_of("eviction_policies", choices=EVICTION_POLICIES)


def main(argv):
    """Sweep the request rates (or replay --trace); print the rows as they finish, then write the results."""
    del argv
    if TRACE.value:
        run_trace()
        return
    requests = make_workload(WORKLOAD.value, num_requests=NUM_REQUESTS.value, seed=SEED.value, **parse_key_values(SCALES.value))
    base = DEPLOY.deployment(kv_cache_metrics_sample=0.0)  # the residency sample is read only with --trace
    sweep = rate_sweep(base, requests, PREFIX.value, [float(r) for r in RATES.value], ttft_p99_bound_s=BOUND.value,
                       refine=REFINE.value, seed=SEED.value, decode_fast_forward=FAST_FORWARD.value)
    curves = sweep.curves
    from jaxpaged.sim.plots import plot_sweep
    title = f"{base.model} on {base.profile}, {WORKLOAD.value} ({NUM_REQUESTS.value} requests)"
    OUT.write({"deployment": dataclasses.asdict(base), "workload": WORKLOAD.value, "num_requests": NUM_REQUESTS.value,
               "scales": parse_key_values(SCALES.value), "num_blocks": base.num_blocks(),
               "ttft_p99_bound_s": BOUND.value, "results": sweep.results},
              sweep.table(), echo=False,
              plots={PLOT_NAME.value: lambda: plot_sweep(curves, bound_s=BOUND.value, title=title)})


def run_trace() -> None:
    """--trace: the trace at its own (time-scaled) arrivals, once per eviction policy."""
    base = DEPLOY.deployment()
    requests = trace_requests(base, TRACE.value, limit=TRACE_LIMIT.value, time_scale=TRACE_SCALE.value)
    points, table = trace_replay(base, requests, POLICIES.value, ttft_slo_s=GOOD_TTFT.value,
                                 tpot_slo_s=GOOD_TPOT.value / 1e3, decode_fast_forward=FAST_FORWARD.value)
    OUT.write({"deployment": dataclasses.asdict(base), "trace": TRACE.value, "num_requests": len(requests),
               "trace_time_scale": TRACE_SCALE.value, "goodput_ttft_s": GOOD_TTFT.value,
               "goodput_tpot_ms": GOOD_TPOT.value, "results": [dataclasses.asdict(p) for p in points]},
              table, echo=False)
