"""A sliding-window deployment in simulated time, hybrid KV cache groups against every layer full
(`jaxpaged simulate hybrid-kv`)."""

from __future__ import annotations

from jaxpaged.sim.driver import make_sim_engine, simulate
from jaxpaged.sim.scenario import Deployment
from jaxpaged.workloads import WorkloadRequest


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
