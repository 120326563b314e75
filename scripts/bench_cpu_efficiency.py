"""How close one jitted step gets to what its arithmetic needs, side by side in one process.

    python scripts/bench_cpu_efficiency.py --model=llama-100m --decode_batch=64 --decode_context=320 \
        --prefill_lens=512,4096 --md_out=out/cpu_efficiency.md

Two measurements, each a ratio of times taken in this run (the machine is shared,
so absolute times drift; ratios measured side by side drift less):
  * decode: a `decode_batch`-sequence decode step at `decode_context` tokens of
    context, against its matmul floor (the step's weight GEMMs alone, on the same
    weights: jaxpaged/bench/offline/matmul_floor.py). 1.0 would be a step that is all matmul.
    The two are timed in alternating rounds; the ratio is the median of the
    rounds' ratios.
  * prefill: tokens/s of a one-sequence prefill at each of `prefill_lens`; the
    ratio is the longest's tokens/s over the shortest's (1.0: context length is free).
With `--breakdown` (default) a `jax.profiler` trace of the decode step and of the
longest prefill is split by the code each XLA op came from (attention, MLP, LM
head, K/V write, sampling, ...: jaxpaged/bench/offline/step_profile.py).
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from jaxpaged.cli import flag_checks
from jaxpaged.bench.offline.matmul_floor import matmul_flops, time_matmul_floor
from jaxpaged.bench.output import write_outputs
from jaxpaged.bench.offline.step_profile import profile_step
from jaxpaged.bench.offline.timing import median_step_seconds
from jaxpaged.config import load_config
from jaxpaged.mathutils import cdiv
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from jaxpaged.step_input import ScheduledSeq, build_step_input

MODEL = flags.DEFINE_string("model", "small", "a shipped model config name or a config JSON")
DECODE_BATCH = flags.DEFINE_integer("decode_batch", 64, "sequences in the decode step")
CONTEXT = flags.DEFINE_integer("decode_context", 320, "context length of each decoding sequence")
PREFILL_LENS = flags.DEFINE_list("prefill_lens", ["512", "4096"], "one-sequence prefill lengths to compare")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
REPEATS = flags.DEFINE_integer("repeats", 5, "timed repeats per measurement (median reported)")
JSON_OUT = flags.DEFINE_string("json_out", None, "write results here as JSON")
MD_OUT = flags.DEFINE_string("md_out", None, "write the Markdown table here")
BREAKDOWN = flags.DEFINE_boolean("breakdown", True, "trace the decode step and the longest prefill and split their time by part")

flag_checks.model_name("model")
flag_checks.positive("decode_batch", "decode_context", "block_size", "repeats")
flag_checks.list_of("prefill_lens", integer_at_least=1)


def measure(config_name: str, decode_batch: int, decode_context: int, prefill_lens: list[int],
            block_size: int, repeats: int, breakdown: bool = False) -> dict:
    """Run both measurements on one model and runner; times in ms (with `breakdown`, ms per part)."""
    config = load_config(config_name)
    if max(prefill_lens + [decode_context + 1]) > config.max_position_embeddings:
        raise ValueError(f"lengths must fit max_position_embeddings={config.max_position_embeddings}")
    model = init_model(config)
    blocks_per_seq = cdiv(max(prefill_lens + [decode_context + 1]), block_size)
    num_blocks = blocks_per_seq * (decode_batch + 1)
    runner = ModelRunner(model, num_blocks=num_blocks, block_size=block_size, max_num_seqs=decode_batch)
    rng = np.random.default_rng(0)
    tables = rng.permutation(num_blocks).reshape(-1, blocks_per_seq)
    vocab = config.vocab_size

    decode_blocks = cdiv(decode_context + 1, block_size)  # what the engine would give each sequence
    decode = build_step_input([ScheduledSeq([int(rng.integers(0, vocab))], decode_context,
                                            tables[i + 1][:decode_blocks]) for i in range(decode_batch)], block_size)
    # One decode step and one floor run per round, alternating, so a burst of load on this shared machine
    # slows both sides of a round's ratio rather than one side of the whole comparison.
    rounds = [(median_step_seconds(runner, decode, 1), time_matmul_floor(model, decode_batch, 1))
              for _ in range(repeats)]
    decode_s, floor_s = (float(np.median(times)) for times in zip(*rounds))
    ratio = float(np.median([step / floor for step, floor in rounds]))
    prefill, step = {}, None
    for length in sorted(prefill_lens):
        step = build_step_input([ScheduledSeq(list(rng.integers(0, vocab, length)), 0, tables[0])], block_size)
        prefill[length] = length / median_step_seconds(runner, step, repeats)
    shortest, longest = min(prefill), max(prefill)
    parts = {}
    if breakdown:
        parts = {"decode": profile_step(runner, decode), f"prefill {longest}": profile_step(runner, step)}
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
        "| measurement | value |", "|---|---|",
        f"| decode step, {result['decode_batch']} seqs x {result['decode_context']} ctx (ms) "
        f"| {result['decode_step_ms']:.1f} |",
        f"| its weight GEMMs alone (ms; {result['matmul_gflops_per_s']:.0f} GFLOP/s) "
        f"| {result['matmul_floor_ms']:.1f} |",
        f"| **decode step / matmul floor** | **{result['decode_over_floor']:.2f}x** |",
    ]
    rows += [f"| prefill of {n} tokens (tokens/s) | {result['prefill_tokens_per_s'][n]:.0f} |" for n in lens]
    rows.append(f"| **prefill tokens/s, {lens[-1]} over {lens[0]}** | **{result['long_over_short_prefill']:.2f}** |")
    table = "\n".join(rows) + "\n"
    parts = result.get("breakdown_ms") or {}
    if parts:
        kinds = list(parts)
        names = sorted({name for times in parts.values() for name in times},
                       key=lambda name: -max(times.get(name, 0.0) for times in parts.values()))
        lines = ["| part | " + " | ".join(f"{kind} (ms, share)" for kind in kinds) + " |",
                 "|---|" + "---|" * len(kinds)]
        for name in names:
            cells = []
            for kind in kinds:
                total = sum(parts[kind].values()) or 1.0
                ms = parts[kind].get(name, 0.0)
                cells.append(f"{ms:.1f} ({ms / total:.0%})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("| all ops | " + " | ".join(f"{sum(parts[kind].values()):.1f}" for kind in kinds) + " |")
        table += "\n" + "\n".join(lines) + "\n"
    return table


def main(argv):
    del argv
    result = measure(MODEL.value, DECODE_BATCH.value, CONTEXT.value, [int(n) for n in PREFILL_LENS.value],
                     BLOCK_SIZE.value, REPEATS.value, BREAKDOWN.value)
    table = markdown(result)
    print(table)
    write_outputs(result, table, JSON_OUT.value, MD_OUT.value)


if __name__ == "__main__":
    app.run(main)
