"""Simulated serving of a sliding-window model: the hybrid KV cache manager vs every layer as full attention.

    python scripts/simulate_hybrid_kv.py --model=gemma-3-27b --profile=h200-141gb --context_lens=8192,32768

For each context, `--num_requests` requests (prompt = context - max_tokens,
all arriving at once, no shared prefixes) are served twice in simulated time on
the same deployment: with the model's windows (the engine picks the hybrid
manager: KV cache groups, sliding groups dropping blocks) and with the windows
removed (one group of every layer, today's layout). Reports the pool, the most
sequences running at once, and simulated throughput.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from absl import app, flags

from jaxpaged.bench import flag_checks
from jaxpaged.config import load_config
from jaxpaged.sim.driver import make_sim_engine, simulate
from jaxpaged.sim.scenario import Deployment
from jaxpaged.workloads import WorkloadRequest

MODEL = flags.DEFINE_string("model", "gemma-3-27b", "a shipped model config with sliding-window layers")
PROFILE = flags.DEFINE_string("profile", "h200-141gb", "device profile")
CONTEXT_LENS = flags.DEFINE_list("context_lens", ["8192", "32768"], "tokens per sequence (prompt + output)")
NUM_REQUESTS = flags.DEFINE_integer("num_requests", 0, "requests per run (0: 1.5 x what the hybrid pool holds)")
MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "tokens generated per request (long enough that memory, "
                                  "not the prefill rate, bounds how many run at once)")
JSON_OUT = flags.DEFINE_string("json_out", None, "also write the results here")
flag_checks.model_name("model")
flag_checks.positive("max_tokens")


def run(deployment: Deployment, context_len: int, num_requests: int, max_tokens: int) -> dict:
    """One simulated run; the most sequences running at once is sampled after every step."""
    engine, clock = make_sim_engine(deployment.engine_config(), deployment.model_config, deployment.cost_model())
    peak = [0]
    engine.stat_loggers.append(lambda e, outputs: peak.__setitem__(0, max(peak[0], e.load().num_running)))
    prompt_len = context_len - max_tokens
    requests = [WorkloadRequest(f"r{i}", [(i * 7919 + j) % 30000 + 1 for j in range(prompt_len)], max_tokens)
                for i in range(num_requests)]
    result = simulate(engine, clock, requests)
    return {"num_blocks": engine.num_blocks, "kv_layout_groups": len(engine.model_config.attention_windows),
            "peak_running": peak[0], "num_preemptions": result.num_preemptions,
            "simulated_s": result.duration_s, "output_tokens_per_s": result.output_tokens / result.duration_s,
            "wall_s": result.wall_s}


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
                n = NUM_REQUESTS.value or max(4, int(1.5 * _capacity(layouts["hybrid"], context_len)))
                results[name] = run(deployment, context_len, n, MAX_TOKENS.value)
            rows.append({"context_len": context_len, "num_requests": n, **results})
    print("| context | requests | layout | pool blocks | most running at once | preemptions | output tok/s (sim) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        for name in layouts:
            r = row[name]
            print(f"| {row['context_len']:,} | {row['num_requests']} | {name} | {r['num_blocks']:,} | "
                  f"{r['peak_running']} | {r['num_preemptions']} | {r['output_tokens_per_s']:,.0f} |")
    if JSON_OUT.value:
        Path(JSON_OUT.value).write_text(json.dumps(rows, indent=2))


def _capacity(deployment: Deployment, context_len: int) -> int:
    """Sequences of `context_len` the hybrid pool holds at once (the capacity arithmetic)."""
    from jaxpaged.cache.kv_groups import blocks_for_context, kv_cache_layout
    layout = kv_cache_layout(deployment.model_config.layer_windows)
    per_seq = sum(blocks_for_context(w, context_len, deployment.block_size) for w in layout.windows)
    return deployment.num_blocks() // per_seq


if __name__ == "__main__":
    app.run(main)
