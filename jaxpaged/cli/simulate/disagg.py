"""Disaggregated prefill and decode, simulated: colocated instances against prefill:decode splits of them.

    jaxpaged simulate disagg --model=llama3-8b --profile=h200-141gb --num_instances=4 \
        --trace=data/traces/mooncake_conversation_trace.jsonl --trace_limit=1000 --trace_time_scales=0.5,0.35 \
        --kv_link_gb_s=50 --ttft_slo_s=2 --tbt_slo_ms=100,30 --plot_dir=docs/plots

Each instance is `--tensor_parallel_size` devices of `--profile`. At each
time scale the trace's requests are served by `--num_instances` colocated
instances and by each split into P prefill + (N - P) decode instances
(`--prefill_instances`, default every P from 1 to N - 1), all in simulated
time (`jaxpaged.sim.disaggregated`): real schedulers and KV cache managers on
every instance, the prompt's K/V moved from prefill to decode instance over
`--kv_link_gb_s` per device (only the blocks the decode instance does not
cache). Each run is scored against every `--ttft_slo_s` x `--tbt_slo_ms` pair
(`--tbt_stat`: which statistic of a request's gaps between tokens): SLO
attainment and goodput (requests meeting both per second). The work is
`jaxpaged.sim.disagg_sweep`.
"""

from __future__ import annotations

import dataclasses
import itertools

from absl import app

from jaxpaged.cli.deployment_flags import DeploymentFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.router import POLICIES
from jaxpaged.sim.disagg_sweep import slo_name, split_sweep, splits
from jaxpaged.sim.kv_link import KVLink
from jaxpaged.sim.serving_sweep import describe
from jaxpaged.sim.slo import SLO, TBT_STATS
from jaxpaged.sim.traces import CONVERSATION_TRACE, load_trace, trace_workload

FLAGS = FlagSet()
DEPLOY = DeploymentFlags(FLAGS, ["model", "block_size", "max_num_seqs", "max_num_batched_tokens",
                                 "tensor_parallel_size"], profile="h200-141gb",
                         profile_help=" (each instance: --tensor_parallel_size of these devices)")
NUM_INSTANCES = FLAGS.DEFINE_integer("num_instances", 4, "instances of --tensor_parallel_size devices each, the same "
                                     "for the colocated run and every split")
COLOCATED = FLAGS.DEFINE_bool("colocated", True, "also run the N instances colocated (--nocolocated: the splits "
                              "only, e.g. when only the link changes)")
PREFILL = FLAGS.DEFINE_list("prefill_instances", [], "prefill instances of each split (default: 1 to N - 1)")
TRACE = FLAGS.DEFINE_string("trace", str(CONVERSATION_TRACE), "Mooncake-format JSONL trace")
TRACE_LIMIT = FLAGS.DEFINE_integer("trace_limit", 1000, "serve only the trace's first N requests")
SCALES = FLAGS.DEFINE_list("trace_time_scales", ["0.5"], "offered loads: the trace's timestamps times each "
                           "(0.5 = twice the trace's rate)")
LINK_GB_S = FLAGS.DEFINE_float("kv_link_gb_s", 50.0, "K/V transfer bandwidth per device, GB/s one way (50: a "
                               "400 Gb/s NIC per GPU)")
LINK_LATENCY_MS = FLAGS.DEFINE_float("kv_link_latency_ms", 0.0, "fixed cost of each K/V transfer (ms)")
TTFT_SLO = FLAGS.DEFINE_list("ttft_slo_s", ["2"], "time-to-first-token objectives (s)")
TBT_SLO = FLAGS.DEFINE_list("tbt_slo_ms", ["100"], "time-between-tokens objectives (ms)")
TBT_STAT = FLAGS.DEFINE_enum("tbt_stat", "p90", list(TBT_STATS), "a request's TBT: mean (TPOT), p90 or max of its "
                             "gaps between tokens")
POLICY = FLAGS.DEFINE_enum("policy", "prefix_aware", list(POLICIES), "routing policy within each pool")
OUT = OutputFlags(FLAGS, plot_dir=None)
PLOT_PREFIX = FLAGS.DEFINE_string("plot_prefix", "disagg", "file name prefix of the PNGs in --plot_dir")

FLAGS.positive("trace_limit")
FLAGS.at_least(2, "num_instances")
FLAGS.at_least(1e-6, "kv_link_gb_s")
FLAGS.non_negative("kv_link_latency_ms")
FLAGS.existing_file("trace")
FLAGS.register_validator("prefill_instances", lambda items: all(i.isdigit() and int(i) >= 1 for i in items),
                         "--prefill_instances must be a comma-separated list of integers >= 1 (or empty: all)")
FLAGS.list_of("trace_time_scales", number_at_least=1e-6)
FLAGS.list_of("ttft_slo_s", number_at_least=1e-6)
FLAGS.list_of("tbt_slo_ms", number_at_least=1e-6)


def main(argv):
    """Serve the trace colocated and split at every load; print the rows, then write tables, JSON and plots."""
    del argv
    base = DEPLOY.deployment()
    n = NUM_INSTANCES.value
    try:
        layouts = splits(n, [int(p) for p in PREFILL.value] or None)[0 if COLOCATED.value else 1:]
    except ValueError as error:
        raise app.UsageError(f"{error} (--prefill_instances)") from None
    slos = [SLO(float(t), float(b) / 1e3, TBT_STAT.value) for t, b in itertools.product(TTFT_SLO.value, TBT_SLO.value)]
    link = KVLink(LINK_GB_S.value * 1e9, LINK_LATENCY_MS.value / 1e3)
    max_len = min(base.model_config.max_position_embeddings, base.num_blocks() * base.block_size)
    trace = load_trace(TRACE.value, limit=TRACE_LIMIT.value)
    requests_at = {float(s): trace_workload(trace, time_scale=float(s), max_model_len=max_len) for s in SCALES.value}
    print(f"{describe(base)}; {n} instances ({n * base.tensor_parallel_size} devices); {len(trace)} trace requests; "
          f"K/V link {LINK_GB_S.value:g} GB/s per device")
    sweep = split_sweep(base, requests_at, layouts, link=link, slos=slos, policy=POLICY.value)
    print("\n" + sweep.slo_table())
    OUT.write({"deployment": dataclasses.asdict(base), "num_instances": n, "trace": TRACE.value,
               "trace_limit": TRACE_LIMIT.value, "kv_link_gb_s": LINK_GB_S.value,
               "kv_link_latency_ms": LINK_LATENCY_MS.value, "policy": POLICY.value,
               "slos": [dataclasses.asdict(s) for s in slos], "runs": sweep.runs},
              sweep.table() + "\n\n" + sweep.slo_table(), echo=False,
              plots=sweep.plots(f"{base.model}, {n} x {base.tensor_parallel_size} {base.profile}", n, PLOT_PREFIX.value))

