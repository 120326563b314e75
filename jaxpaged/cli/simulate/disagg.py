"""Disaggregated prefill and decode, simulated: N colocated instances against P prefill + (N - P) decode splits.

    jaxpaged simulate disagg --model=llama3-8b --profile=h200-141gb --num_instances=4 \
        --trace_limit=1000 --trace_time_scales=0.5,0.35 --kv_link_gb_s=50 --ttft_slo_s=2 --tbt_slo_ms=100,30

Every run serves the trace at each time scale (`jaxpaged.sim.disagg_sweep`) and is scored against every
`--ttft_slo_s` x `--tbt_slo_ms` pair: SLO attainment and goodput. See docs/benchmarks/disaggregation-sim.md.
"""

from __future__ import annotations

import dataclasses
import itertools

from absl import app

from jaxpaged.bench.options import option
from jaxpaged.cli.deployment_flags import DeploymentFlags
from jaxpaged.cli.options import CommandFlags
from jaxpaged.router import POLICIES
from jaxpaged.sim.disagg_sweep import split_sweep, splits, trace_at_loads
from jaxpaged.sim.kv_link import KVLink
from jaxpaged.sim.serving_sweep import describe
from jaxpaged.sim.slo import SLO, TBT_STATS
from jaxpaged.sim.traces import CONVERSATION_TRACE


@dataclasses.dataclass(frozen=True)
class DisaggOptions:
    """The instances and splits, the trace and its loads, the K/V link, the SLOs and the routing policy."""

    num_instances: int = option(4, "instances of --tensor_parallel_size devices each, the same for the colocated "
                                   "run and every split", at_least=2)
    colocated: bool = option(True, "also run the N instances colocated (--nocolocated: the splits only, e.g. when "
                                   "only the link changes)")
    prefill_instances: tuple[int, ...] = option((), "prefill instances of each split (default: 1 to N - 1)",
                                                at_least=1)
    trace: str = option(str(CONVERSATION_TRACE), "Mooncake-format JSONL trace", check="existing_file")
    trace_limit: int = option(1000, "serve only the trace's first N requests", at_least=1)
    trace_time_scales: tuple[float, ...] = option((0.5,), "offered loads: the trace's timestamps times each (0.5 = "
                                                          "twice the trace's rate)", at_least=1e-6)
    kv_link_gb_s: float = option(50.0, "K/V transfer bandwidth per device, GB/s one way (50: a 400 Gb/s NIC per "
                                       "GPU)", at_least=1e-6)
    kv_link_latency_ms: float = option(0.0, "fixed cost of each K/V transfer (ms)", at_least=0)
    ttft_slo_s: tuple[float, ...] = option((2,), "time-to-first-token objectives (s)", at_least=1e-6)
    tbt_slo_ms: tuple[float, ...] = option((100,), "time-between-tokens objectives (ms)", at_least=1e-6)
    tbt_stat: str = option("p90", "a request's TBT: mean (TPOT), p90 or max of its gaps between tokens",
                           choices=list(TBT_STATS))
    policy: str = option("prefix_aware", "routing policy within each pool", choices=list(POLICIES))
    plot_prefix: str = option("disagg", "file name prefix of the PNGs in --plot_dir")


COMMAND = CommandFlags(DisaggOptions, plot_dir=None)
FLAGS = COMMAND.flags
DEPLOY = DeploymentFlags(FLAGS, ["model", "block_size", "max_num_seqs", "max_num_batched_tokens",
                                 "tensor_parallel_size"], profile="h200-141gb",
                         profile_help=" (each instance: --tensor_parallel_size of these devices)")


def main(argv):
    """Serve the trace colocated and split at every load; print the rows, then write tables, JSON and plots."""
    del argv
    base, o = DEPLOY.deployment(), COMMAND.options()
    n = o.num_instances
    try:
        layouts = splits(n, list(o.prefill_instances) or None)[0 if o.colocated else 1:]
    except ValueError as error:
        raise app.UsageError(f"{error} (--prefill_instances)") from None
    slos = [SLO(t, b / 1e3, o.tbt_stat) for t, b in itertools.product(o.ttft_slo_s, o.tbt_slo_ms)]
    link = KVLink(o.kv_link_gb_s * 1e9, o.kv_link_latency_ms / 1e3)
    requests_at = trace_at_loads(base, o.trace, limit=o.trace_limit, time_scales=o.trace_time_scales)
    num_requests = len(next(iter(requests_at.values())))
    print(f"{describe(base)}; {n} instances ({n * base.tensor_parallel_size} devices); {num_requests} trace requests; "
          f"K/V link {o.kv_link_gb_s:g} GB/s per device")
    sweep = split_sweep(base, requests_at, layouts, link=link, slos=slos, policy=o.policy)
    print("\n" + sweep.slo_table())
    COMMAND.out.write({"deployment": dataclasses.asdict(base), "slos": [dataclasses.asdict(s) for s in slos],
                       "runs": sweep.runs},
                      sweep.table() + "\n\n" + sweep.slo_table(), echo=False,
                      plots=sweep.plots(f"{base.model}, {n} x {base.tensor_parallel_size} {base.profile}", n,
                                        o.plot_prefix))
