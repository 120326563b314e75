"""Block-size ablation: KV waste, concurrency, prefix hits, throughput and TTFT vs block size.

    jaxpaged bench ablate --model=tiny --workloads=chatbot,unique,multiturn \
        --block_sizes=1,8,16,32,64,128 --json_out=out/ablation.json --plot_dir=docs/plots

Every block size gets the same KV budget in tokens (--kv_budget_tokens).
"""

from __future__ import annotations

from tqdm.auto import tqdm

from jaxpaged.bench.offline.ablation import ablation_plots, ablation_table, sweep_block_sizes
from jaxpaged.checkpoint import load_model
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.cli.workload_flags import WorkloadFlags
from jaxpaged.sim.workloads import WORKLOADS as WORKLOADS_BY_NAME

FLAGS = FlagSet()
bench_flags = WorkloadFlags(FLAGS)
WORKLOADS = FLAGS.DEFINE_list("workloads", ["chatbot", "unique", "multiturn"], "workloads to sweep")
BLOCK_SIZES = FLAGS.DEFINE_list("block_sizes", ["1", "8", "16", "32", "64", "128"], "block sizes to sweep")
MODE = FLAGS.DEFINE_enum("mode", "prefix_on", ["prefix_on", "prefix_off"], "KV mode of every run")
OUT = OutputFlags(FLAGS, json_out="out/ablate_block_size.json", plot_dir="out/plots")
PROGRESS = FLAGS.DEFINE_boolean("progress", True, "show a progress bar")

# small enough for a few minutes on 2 CPU cores; every one can be overridden on the command line
DEFAULTS = {"model": "tiny", "num_requests": 8, "system_len": 64, "user_len": 48, "prompt_len": 112,
            "output_len": 16, "num_turns": 2, "kv_budget_tokens": 1024, "max_model_len": 512}
for _name, _value in DEFAULTS.items():
    FLAGS.values.set_default(_name, _value)

FLAGS.list_of("workloads", choices=list(WORKLOADS_BY_NAME))
FLAGS.list_of("block_sizes", integer_at_least=1)


def main(argv):
    """Sweep, print a compact table, write JSON and plots."""
    del argv
    bench_flags.enable_compile_cache()
    block_sizes = [int(b) for b in BLOCK_SIZES.value]
    workloads = {name: bench_flags.workload_from_flags(name) for name in WORKLOADS.value}
    model = load_model(bench_flags.MODEL.value)
    bar = tqdm(total=len(block_sizes) * len(workloads), desc="runs", disable=not PROGRESS.value)
    rows = sweep_block_sizes(model, workloads, block_sizes, bench_flags.setup_from_flags(
                                 max(block_sizes), [r for reqs in workloads.values() for r in reqs]),
                             kv_budget_tokens=bench_flags.KV_BUDGET.value, mode=MODE.value,
                             on_done=lambda _: bar.update())
    bar.close()
    OUT.write({"model": bench_flags.MODEL.value, "rows": rows}, ablation_table(rows), plots=ablation_plots(rows))
