"""Block-size ablation: KV waste, concurrency, prefix hits, throughput and TTFT vs block size.

    jaxpaged bench ablate --model=tiny --workloads=chatbot,unique,multiturn \
        --block_sizes=1,8,16,32,64,128 --json_out=out/ablation.json --plot_dir=docs/plots

Every block size gets the same KV budget in tokens (--kv_budget_tokens).
"""

from __future__ import annotations

import dataclasses

from tqdm.auto import tqdm

from jaxpaged import compile_cache
from jaxpaged.bench.offline.ablation import ablation_plots, ablation_table, sweep_block_sizes
from jaxpaged.bench.offline.serving_workload import SERVING_ENGINE_FIELDS, ServingWorkload
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import load_model
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.workloads import WORKLOADS, max_context_len


@dataclasses.dataclass(frozen=True)
class AblateOptions:
    """The workloads and block sizes swept, and the KV mode of every run."""

    workloads: tuple[str, ...] = option(("chatbot", "unique", "multiturn"), "workloads to sweep",
                                        choices=list(WORKLOADS))
    block_sizes: tuple[int, ...] = option((1, 8, 16, 32, 64, 128), "block sizes to sweep", at_least=1)
    mode: str = option("prefix_on", "KV mode of every run", choices=["prefix_on", "prefix_off"])
    progress: bool = option(True, "show a progress bar")


ENGINE_FIELDS = [f for f in SERVING_ENGINE_FIELDS if f != "block_size"]  # the block size is what the sweep varies
COMMAND = CommandFlags(AblateOptions, ServingWorkload, engine=ENGINE_FIELDS,
                       json_out="out/ablate_block_size.json", plot_dir="out/plots")
FLAGS = COMMAND.flags
# small enough for a few minutes on 2 CPU cores; every one can be overridden on the command line
DEFAULTS = {"model": "tiny", "num_requests": 8, "system_len": 64, "user_len": 48, "prompt_len": 112,
            "output_len": 16, "num_turns": 2, "kv_budget_tokens": 1024, "max_model_len": 512}
for _name, _value in DEFAULTS.items():
    FLAGS.values.set_default(_name, _value)


def main(argv):
    """Sweep, print a compact table, write JSON and plots."""
    del argv
    options, workload, engine = COMMAND.options(), COMMAND.options(ServingWorkload), COMMAND.engine.kwargs()
    compile_cache.configure(engine["compile_cache_dir"])
    workloads = {name: workload.workload(name) for name in options.workloads}
    bar = tqdm(total=len(options.block_sizes) * len(workloads), desc="runs", disable=not options.progress)
    setup = workload.setup(engine | {"block_size": max(options.block_sizes)},
                           max(max_context_len(reqs) for reqs in workloads.values()))
    rows = sweep_block_sizes(load_model(engine["model"]), workloads, list(options.block_sizes), setup,
                             kv_budget_tokens=workload.kv_budget_tokens, mode=options.mode,
                             on_done=lambda _: bar.update())
    bar.close()
    COMMAND.out.write({"model": engine["model"], "rows": rows}, ablation_table(rows), plots=ablation_plots(rows))
