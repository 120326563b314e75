"""Start-up time, cold and warm compile cache, side by side with an older version of the code.

    git worktree add /tmp/jaxpaged-before <commit>
    python scripts/bench_startup.py --models=small,llama-100m --baseline_root=/tmp/jaxpaged-before \
        --repeats=3 --json_out=out/bench_startup.json --md_out=out/bench_startup.md

Each start is a fresh process (see `jaxpaged.bench.startup`): the first `generate`
(import, `LLM` build, one `generate` of 16 prompts of 16-256 tokens, 32 greedy
tokens each) and `scripts/serve.py` from launch to its first streamed token.
`--padding_costs` instead times steps padded past their bucket, the price of
each bucket merge in `jaxpaged/buckets.py`.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

from absl import app, flags

from jaxpaged.bench import flag_checks
from jaxpaged.bench import startup
from jaxpaged.bench.results_io import write_outputs

ROOT = Path(__file__).resolve().parents[1]
MODELS = flags.DEFINE_list("models", ["small", "llama-100m"], "shipped model configs to start")
KINDS = flags.DEFINE_list("kinds", list(startup.KINDS), "generate: a first LLM.generate; serve: server to first token")
CACHES = flags.DEFINE_list("cache_states", list(startup.CACHE_STATES), "off, cold (empty cache), warm (filled)")
BASELINE = flags.DEFINE_string("baseline_root", None, "a source tree of the older version to compare with")
REPEATS = flags.DEFINE_integer("repeats", 3, "starts of every kind, model, version and cache state")
NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 16, "prompts of the first generate")
OUTPUT_LEN = flags.DEFINE_integer("output_len", 32, "greedy tokens per prompt of the first generate")
PADDING = flags.DEFINE_bool("padding_costs", False, "instead: each model's step time with a size padded further "
                            "than its bucket (what merging two buckets costs per step), in this process")
JSON_OUT = flags.DEFINE_string("json_out", None, "write the results here as JSON")
MD_OUT = flags.DEFINE_string("md_out", None, "write the Markdown table here")
flag_checks.list_of("kinds", choices=list(startup.KINDS))
flag_checks.list_of("cache_states", choices=list(startup.CACHE_STATES))
flag_checks.positive("repeats", "num_prompts", "output_len")
flags.register_validator("baseline_root", lambda v: v is None or (Path(v) / "jaxpaged").is_dir(),
                         message="--baseline_root must be a jaxpaged source tree")


def main(argv):
    del argv
    if PADDING.value:
        rows = {model: startup.padding_costs(model) for model in MODELS.value}
        table = startup.padding_table(rows)
        print(table)
        write_outputs({"padding_costs": rows, "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
                      table, JSON_OUT.value, MD_OUT.value)
        return
    versions = {"this": ROOT} | ({"before": Path(BASELINE.value).resolve()} if BASELINE.value else {})
    cases = [startup.StartupCase(model, num_prompts=NUM_PROMPTS.value, output_len=OUTPUT_LEN.value)
             for model in MODELS.value]
    result = startup.measure(versions, cases, kinds=KINDS.value, cache_states=CACHES.value, repeats=REPEATS.value)
    result |= {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": platform.processor()
               or platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
               "versions": {k: str(v) for k, v in versions.items()}}
    table = startup.markdown_table(result, "before" if BASELINE.value else None)
    print(table)
    write_outputs(result, table, JSON_OUT.value, MD_OUT.value)


if __name__ == "__main__":
    app.run(main)
