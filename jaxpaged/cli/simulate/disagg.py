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

from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.router import POLICIES
from jaxpaged.sim.disagg_sweep import slo_name, split_sweep, splits
from jaxpaged.sim.kv_link import KVLink
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.serving_sweep import describe
from jaxpaged.sim.slo import SLO, TBT_STATS
from jaxpaged.sim.traces import CONVERSATION_TRACE, load_trace, trace_workload

FLAGS = FlagSet()
PROFILE = FLAGS.DEFINE_string("profile", "h200-141gb", "a100-80gb, h100-80gb, h200-141gb, cpu, or a profile JSON "
                              "(each instance: --tensor_parallel_size of these devices)")
WEIGHT_BYTES = FLAGS.DEFINE_float("weight_bytes_per_param", 2.0, "2 = bf16, 1 = fp8/int8, 0.5 = 4-bit")
KV_BYTES = FLAGS.DEFINE_float("kv_bytes_per_element", 2.0, "2 = bf16/fp16 KV, 1 = fp8 KV")
KV_CACHE_GB = FLAGS.DEFINE_float("kv_cache_gb", None, "KV cache per device in GB (1e9); default: 90% of memory - "
                                  "the device's weights")
ENGINE = EngineFlags(FLAGS, ["model", "block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"],
                     defaults={"model": "llama3-8b", "max_num_seqs": 256, "max_num_batched_tokens": 2048})
MODEL, BLOCK_SIZE, TP = ENGINE.holders["model"], ENGINE.holders["block_size"], ENGINE.holders["tensor_parallel_size"]
MAX_SEQS, MAX_TOKENS = ENGINE.holders["max_num_seqs"], ENGINE.holders["max_num_batched_tokens"]
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

FLAGS.device_profile("profile")
FLAGS.positive("trace_limit")
FLAGS.at_least(2, "num_instances")
FLAGS.at_least(1e-3, "weight_bytes_per_param", "kv_bytes_per_element", "kv_cache_gb")
FLAGS.at_least(1e-6, "kv_link_gb_s")
FLAGS.non_negative("kv_link_latency_ms")
FLAGS.existing_file("trace")
FLAGS.register_validator("prefill_instances", lambda items: all(i.isdigit() and int(i) >= 1 for i in items),
                         "--prefill_instances must be a comma-separated list of integers >= 1 (or empty: all)")
FLAGS.list_of("trace_time_scales", number_at_least=1e-6)
FLAGS.list_of("ttft_slo_s", number_at_least=1e-6)
FLAGS.list_of("tbt_slo_ms", number_at_least=1e-6)


def deployment() -> Deployment:
    """One instance as the flags describe it; a usage error (naming the flags) when its pool cannot be sized."""
    d = Deployment(model=MODEL.value, profile=PROFILE.value, weight_bytes_per_param=WEIGHT_BYTES.value,
                   kv_bytes_per_element=KV_BYTES.value, block_size=BLOCK_SIZE.value,
                   kv_cache_bytes=None if KV_CACHE_GB.value is None else int(KV_CACHE_GB.value * 1e9),
                   max_num_seqs=MAX_SEQS.value, max_num_batched_tokens=MAX_TOKENS.value,
                   tensor_parallel_size=TP.value)
    try:
        d.num_blocks()
    except ValueError as error:
        raise app.UsageError(f"{error} (--kv_cache_gb, --tensor_parallel_size)") from None
    return d


def main(argv):
    """Serve the trace colocated and split at every load; print the rows, then write tables, JSON and plots."""
    del argv
    base = deployment()
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
              sweep.table() + "\n\n" + sweep.slo_table(), echo=False, plots=_plots(base, n, sweep, slos))


def _plots(base: Deployment, n: int, sweep, slos: list[SLO]) -> dict:
    """Goodput by split at each load, and attainment against load for each SLO."""
    from jaxpaged.sim.plots import plot_attainment, plot_split_goodput

    where = f"{base.model}, {n} x {base.tensor_parallel_size} {base.profile}"
    plots = {}
    for scale in sorted({run["time_scale"] for run in sweep.runs}):
        runs = [run for run in sweep.runs if run["time_scale"] == scale]
        curves, colocated = {}, {}
        for slo in slos:
            name = slo_name(slo)
            split_runs = [run for run in runs if not run["colocated"]]
            curves[name] = ([run["prefill"] for run in split_runs],
                            [run["by_slo"][name]["goodput_rps"] for run in split_runs])
            colocated.update({name: run["by_slo"][name]["goodput_rps"] for run in runs if run["colocated"]})
        title = f"{where}, offered {runs[0]['offered_rps']:.2f} req/s"
        plots[f"{PLOT_PREFIX.value}_goodput_x{scale:g}.png"] = (
            lambda c=curves, b=colocated, t=title: plot_split_goodput(c, b, num_instances=n, title=t))
    if len({run["time_scale"] for run in sweep.runs}) > 1:
        for i, slo in enumerate(slos):
            name = slo_name(slo)
            curves = {}
            for run in sorted(sweep.runs, key=lambda r: r["offered_rps"]):
                rates, values = curves.setdefault(run["pools"], ([], []))
                rates.append(run["offered_rps"])
                values.append(run["by_slo"][name]["slo_attainment"])
            plots[f"{PLOT_PREFIX.value}_attainment_slo{i}.png"] = (
                lambda c=curves, t=f"{where}: {name}": plot_attainment(c, title=t))
    return plots
