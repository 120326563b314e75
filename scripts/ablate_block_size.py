"""Block-size ablation: KV waste, concurrency, prefix hits, throughput and TTFT vs block size.

    python scripts/ablate_block_size.py --model=tiny --workloads=chatbot,unique,multiturn \
        --block_sizes=1,8,16,32,64,128 --json_out=out/ablation.json --plot_dir=docs/plots

Every block size gets the same KV budget in tokens (--kv_budget_tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import app, flags
from tqdm.auto import tqdm

from jaxpaged.cli import flag_checks
from jaxpaged.cli import workload_flags as bench_flags
from jaxpaged.bench.offline.ablation import ABLATION_METRICS, sweep_block_sizes
from jaxpaged.bench.offline.plots import plot_all
from jaxpaged.checkpoint import load_model
from jaxpaged.workloads import WORKLOADS as WORKLOADS_BY_NAME

WORKLOADS = flags.DEFINE_list("workloads", ["chatbot", "unique", "multiturn"], "workloads to sweep")
BLOCK_SIZES = flags.DEFINE_list("block_sizes", ["1", "8", "16", "32", "64", "128"], "block sizes to sweep")
MODE = flags.DEFINE_enum("mode", "prefix_on", ["prefix_on", "prefix_off"], "KV mode of every run")
JSON_OUT = flags.DEFINE_string("json_out", "out/ablate_block_size.json", "write the rows here as JSON")
PLOT_DIR = flags.DEFINE_string("plot_dir", "out/plots", "one PNG per metric goes here ('' = none)")
PROGRESS = flags.DEFINE_boolean("progress", True, "show a progress bar")

# small enough for a few minutes on 2 CPU cores; every one can be overridden on the command line
DEFAULTS = {"model": "tiny", "num_requests": 8, "system_len": 64, "user_len": 48, "prompt_len": 112,
            "output_len": 16, "num_turns": 2, "kv_budget_tokens": 1024, "max_model_len": 512}

flag_checks.list_of("workloads", choices=list(WORKLOADS_BY_NAME))
flag_checks.list_of("block_sizes", integer_at_least=1)


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
    print("| block size | workload | " + " | ".join(ABLATION_METRICS) + " |")
    print("|---|---|" + "---:|" * len(ABLATION_METRICS))
    for r in rows:
        print(f"| {r['block_size']} | {r['workload']} | " + " | ".join(f"{r[m]:.3g}" for m in ABLATION_METRICS) + " |")
    Path(JSON_OUT.value).parent.mkdir(parents=True, exist_ok=True)
    Path(JSON_OUT.value).write_text(json.dumps({"model": bench_flags.MODEL.value, "rows": rows}, indent=2))
    if PLOT_DIR.value:
        for path in plot_all(rows, ABLATION_METRICS, Path(PLOT_DIR.value)):
            print(f"wrote {path}")


if __name__ == "__main__":
    for name, value in DEFAULTS.items():
        flags.FLAGS.set_default(name, value)
    app.run(main)
