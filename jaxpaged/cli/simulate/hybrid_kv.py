"""Simulated serving of a sliding-window model: the hybrid KV cache manager vs every layer as full attention.

    jaxpaged simulate hybrid-kv --model=gemma-3-27b --profile=h200-141gb --context_lens=8192,32768

For each context, `--num_requests` requests (prompt = context - max_tokens,
all arriving at once, no shared prefixes) are served twice in simulated time on
the same deployment: with the model's windows (the engine picks the hybrid
manager: KV cache groups, sliding groups dropping blocks) and with the windows
removed (one group of every layer, today's layout). Reports the pool, the most
sequences running at once, and simulated throughput.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from absl import app

from jaxpaged.bench.output import markdown_table
from jaxpaged.bench.simulator.hybrid_kv import hybrid_capacity, run
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.config import load_config
from jaxpaged.sim.scenario import Deployment

FLAGS = FlagSet()
MODEL = FLAGS.DEFINE_string("model", "gemma-3-27b", "a shipped model config with sliding-window layers")
PROFILE = FLAGS.DEFINE_string("profile", "h200-141gb", "device profile")
CONTEXT_LENS = FLAGS.DEFINE_list("context_lens", ["8192", "32768"], "tokens per sequence (prompt + output)")
NUM_REQUESTS = FLAGS.DEFINE_integer("num_requests", 0, "requests per run (0: 1.5 x what the hybrid pool holds)")
MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 1024, "tokens generated per request (long enough that memory, "
                                  "not the prefill rate, bounds how many run at once)")
OUT = OutputFlags(FLAGS)
FLAGS.model_name("model")
FLAGS.positive("max_tokens")


def main(argv):
    """Both layouts at every context; a Markdown table."""
    del argv
    config = load_config(MODEL.value)
    if all(w is None for w in config.layer_windows):
        raise app.UsageError(f"{MODEL.value} has no sliding-window layers")
    with tempfile.TemporaryDirectory() as tmp:
        full_path = Path(tmp) / f"{config.name}-all-full.json"
        full = config.replace(name=f"{config.name}-all-full", sliding_window=None, layer_types=None)
        full_path.write_text(json.dumps(full.to_dict()))
        layouts = {"hybrid": Deployment(model=MODEL.value, profile=PROFILE.value),
                   "all-full": Deployment(model=str(full_path), profile=PROFILE.value)}
        rows = []
        for context_len in map(int, CONTEXT_LENS.value):
            results = {}
            for name, deployment in layouts.items():
                n = NUM_REQUESTS.value or max(4, int(1.5 * hybrid_capacity(layouts["hybrid"], context_len)))
                results[name] = run(deployment, context_len, n, MAX_TOKENS.value)
            rows.append({"context_len": context_len, "num_requests": n, **results})
    table = markdown_table(
        ["context", "requests", "layout", "pool blocks", "most running at once", "preemptions", "output tok/s (sim)"],
        [[f"{row['context_len']:,}", row["num_requests"], name, f"{row[name]['num_blocks']:,}", row[name]["peak_running"],
          row[name]["num_preemptions"], f"{row[name]['output_tokens_per_s']:,.0f}"] for row in rows for name in layouts],
        align="rrlrrrr")
    OUT.write({"rows": rows}, table)
