"""A sliding-window deployment in simulated time, hybrid KV cache groups against every layer full
(`jaxpaged simulate hybrid-kv`)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from jaxpaged.checkpoint import model_config
from jaxpaged.report import markdown_table
from jaxpaged.sim.driver import make_sim_engine, simulate
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.workloads import WorkloadRequest


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


def hybrid_capacity(deployment: Deployment, context_len: int) -> int:
    """Sequences of `context_len` the hybrid pool holds at once (the capacity arithmetic)."""
    from jaxpaged.cache.kv_groups import blocks_for_context, kv_cache_layout
    layout = kv_cache_layout(deployment.model_config.layer_windows)
    per_seq = sum(blocks_for_context(w, context_len, deployment.block_size) for w in layout.windows)
    return deployment.num_blocks() // per_seq


def compare_layouts(model: str, profile: str, context_lens: Sequence[int], *, num_requests: int = 0,
                    max_tokens: int = 1024) -> list[dict]:
    """The model with its sliding windows and with every layer full, at each context: one row per context.

    ``num_requests`` 0 serves 1.5 x what the hybrid pool holds (at least 4). Raises ValueError for a model
    with no sliding-window layer.
    """
    config = model_config(model)
    if all(w is None for w in config.layer_windows):
        raise ValueError(f"{model} has no sliding-window layers")
    with tempfile.TemporaryDirectory() as tmp:
        full_path = Path(tmp) / f"{config.name}-all-full.json"
        full = config.replace(name=f"{config.name}-all-full", sliding_window=None, layer_types=None)
        full_path.write_text(json.dumps(full.to_dict()))
        layouts = {"hybrid": Deployment(model=model, profile=profile),
                   "all-full": Deployment(model=str(full_path), profile=profile)}
        rows = []
        for context_len in context_lens:
            n = num_requests or max(4, int(1.5 * hybrid_capacity(layouts["hybrid"], context_len)))
            rows.append({"context_len": context_len, "num_requests": n,
                         **{name: run(d, context_len, n, max_tokens) for name, d in layouts.items()}})
    return rows


def layouts_table(rows: Sequence[dict]) -> str:
    """One row per context and layout: pool blocks, most running at once, preemptions, simulated output tok/s."""
    return markdown_table(
        ["context", "requests", "layout", "pool blocks", "most running at once", "preemptions", "output tok/s (sim)"],
        [[f"{row['context_len']:,}", row["num_requests"], name, f"{row[name]['num_blocks']:,}",
          row[name]["peak_running"], row[name]["num_preemptions"], f"{row[name]['output_tokens_per_s']:,.0f}"]
         for row in rows for name in ("hybrid", "all-full")],
        align="rrlrrrr")
