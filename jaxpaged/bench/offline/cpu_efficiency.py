"""``jaxpaged bench cpu-efficiency``: a decode step over its matmul floor, long over short prefill tokens/s, and
each step's time split by the code its XLA ops came from (the command's help says how each is timed).
"""

from __future__ import annotations

import numpy as np

from jaxpaged.attention.backend import resolve_backend
from jaxpaged.bench.offline.matmul_floor import matmul_flops, time_matmul_floor
from jaxpaged.bench.offline.step_profile import profile_step
from jaxpaged.bench.offline.step_timing import hand_built_steps
from jaxpaged.bench.offline.timing import median_step_seconds
from jaxpaged.checkpoint import model_config
from jaxpaged.model import init_model
from jaxpaged.report import markdown_table
from jaxpaged.runner import ModelRunner


def measure(config_name: str, decode_batch: int, decode_context: int, prefill_lens: list[int],
            block_size: int, repeats: int, breakdown: bool = False) -> dict:
    """Run both measurements on one model and runner; times in ms (with `breakdown`, ms per part)."""
    config = model_config(config_name)
    if max(prefill_lens + [decode_context + 1]) > config.max_position_embeddings:
        raise ValueError(f"lengths must fit max_position_embeddings={config.max_position_embeddings}")
    model = init_model(config)
    decode, prefills, num_blocks = hand_built_steps(decode_batch, decode_context, sorted(prefill_lens),
                                                    config.vocab_size, block_size, np.random.default_rng(0))
    runner = ModelRunner(model, num_blocks=num_blocks, block_size=block_size, max_num_seqs=decode_batch,
                         backend=resolve_backend())  # the engine's attention on this platform
    # One decode step and one floor run per round, alternating, so a burst of load on this shared machine
    # slows both sides of a round's ratio rather than one side of the whole comparison.
    rounds = [(median_step_seconds(runner, decode, 1), time_matmul_floor(model, decode_batch, 1))
              for _ in range(repeats)]
    decode_s, floor_s = (float(np.median(times)) for times in zip(*rounds))
    ratio = float(np.median([step / floor for step, floor in rounds]))
    prefill = {n: n / median_step_seconds(runner, step, repeats) for n, step in prefills.items()}
    shortest, longest = min(prefill), max(prefill)
    parts = {}
    if breakdown:
        parts = {"decode": profile_step(runner, decode), f"prefill {longest}": profile_step(runner, prefills[longest])}
        parts = {kind: {part: s * 1e3 for part, s in times.items()} for kind, times in parts.items()}
    return {
        "model": config.name, "block_size": block_size,
        "decode_batch": decode_batch, "decode_context": decode_context,
        "decode_step_ms": decode_s * 1e3, "matmul_floor_ms": floor_s * 1e3,
        "matmul_gflops_per_s": matmul_flops(model, decode_batch) / floor_s / 1e9,
        "decode_over_floor": ratio,  # median of the per-round ratios
        "decode_rounds_ms": [[step * 1e3, floor * 1e3] for step, floor in rounds],
        "prefill_tokens_per_s": {str(k): v for k, v in prefill.items()},
        "long_over_short_prefill": prefill[longest] / prefill[shortest],
        "compiles": runner.num_compiles,
        "breakdown_ms": parts,
    }


def markdown(result: dict) -> str:
    """The two ratios with their inputs, as a Markdown table."""
    lens = list(result["prefill_tokens_per_s"])
    rows = [
        [f"decode step, {result['decode_batch']} seqs x {result['decode_context']} ctx (ms)",
         f"{result['decode_step_ms']:.1f}"],
        [f"its weight GEMMs alone (ms; {result['matmul_gflops_per_s']:.0f} GFLOP/s)",
         f"{result['matmul_floor_ms']:.1f}"],
        ["**decode step / matmul floor**", f"**{result['decode_over_floor']:.2f}x**"],
        *([f"prefill of {n} tokens (tokens/s)", f"{result['prefill_tokens_per_s'][n]:.0f}"] for n in lens),
        [f"**prefill tokens/s, {lens[-1]} over {lens[0]}**", f"**{result['long_over_short_prefill']:.2f}**"],
    ]
    table = markdown_table(["measurement", "value"], rows, align="ll") + "\n"
    parts = result.get("breakdown_ms") or {}
    if parts:
        kinds = list(parts)
        names = sorted({name for times in parts.values() for name in times},
                       key=lambda name: -max(times.get(name, 0.0) for times in parts.values()))
        totals = {kind: sum(parts[kind].values()) or 1.0 for kind in kinds}
        rows = [[name, *(f"{parts[k].get(name, 0.0):.1f} ({parts[k].get(name, 0.0) / totals[k]:.0%})" for k in kinds)]
                for name in names]
        rows.append(["all ops", *(f"{sum(parts[kind].values()):.1f}" for kind in kinds)])
        table += "\n" + markdown_table(["part", *(f"{kind} (ms, share)" for kind in kinds)], rows,
                                        align="l" * (len(kinds) + 1)) + "\n"
    return table
