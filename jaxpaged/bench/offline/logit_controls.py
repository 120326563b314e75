"""What the logit controls and prompt logprobs cost a step: the same step with and without them, side by side.

Each variant is one hand-built `StepInput`; the rounds alternate the variants
(one run of each per round), and each ratio is the median of its per-round
ratios, so machine drift hits both sides alike.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxpaged.attention.backend import resolve_backend
from jaxpaged.bench.offline.step_timing import StepShape, step_pair
from jaxpaged.bench.offline.timing import alternate, seconds_of
from jaxpaged.config import ModelConfig
from jaxpaged.mathutils import pow2_bucket
from jaxpaged.report import markdown_table
from jaxpaged.runner import ModelRunner
from jaxpaged.runner.logit_controls import LogitControls
from jaxpaged.runner.step_input import StepInput


def penalised(step: StepInput, context: int, vocab: int, rng: np.random.Generator, num_bias: int = 8) -> StepInput:
    """`step` with every real row penalised (context tokens as history) and `num_bias` biased ids per row."""
    rows = step.order.astype(np.int32)
    n = len(rows)
    length = pow2_bucket(context + 1, 16)
    tokens = np.full((n, length), -1, np.int32)
    tokens[:, :context] = rng.integers(0, vocab, (n, context))
    ones = np.ones(n, np.float32)
    controls = LogitControls(
        bias_rows=rows, bias_ids=rng.integers(0, vocab, (n, num_bias)).astype(np.int32),
        bias_values=np.full((n, num_bias), 1.0, np.float32), bias_if_last=np.full((n, num_bias), -1, np.int32),
        penalty_rows=rows, penalty_tokens=tokens, penalty_num_prompt=np.full(n, context // 2, np.int32),
        penalty_last_index=np.full(n, context, np.int32), repetition=1.2 * ones, frequency=0.5 * ones,
        presence=0.5 * ones)
    return dataclasses.replace(step, logit_controls=controls)


def with_prompt_logprobs(step: StepInput, k: int) -> StepInput:
    """`step` (one prefill) returning the logprob of every prompt position's next token, and the top k."""
    num = int(step.query_lens.sum()) - 1
    size = pow2_bucket(num, 16)
    rows = np.zeros(size, np.int32)
    rows[:num] = np.arange(num)
    targets = np.zeros(size, np.int32)
    targets[:num] = step.token_ids[1:num + 1]
    return dataclasses.replace(step, prompt_logprob_rows=rows, prompt_logprob_targets=targets,
                               num_prompt_top_logprobs=pow2_bucket(k))


def side_by_side(runner: ModelRunner, variants: dict[str, StepInput], repeats: int) -> dict[str, dict]:
    """Median seconds of each variant and its median per-round ratio to the first one."""
    times = alternate({name: seconds_of(lambda s=step: runner.execute(s)) for name, step in variants.items()},
                      repeats, warmup=1)  # the first round compiles
    base = np.array(next(iter(times.values())))
    return {name: {"median_ms": float(np.median(t)) * 1e3, "ratio": float(np.median(np.array(t) / base))}
            for name, t in times.items()}


def compare_logit_controls(config: ModelConfig, shape: StepShape, *, top_k: int, block_size: int,
                           repeats: int) -> tuple[dict, str]:
    """``shape``'s decode step plain and with penalties + bias, its prefill plain and with prompt logprobs (0 and
    ``top_k``), side by side on ``config``'s random weights: the result and its table."""
    from jaxpaged.model import init_model
    rng = np.random.default_rng(0)
    decode, prefill, num_blocks = step_pair(shape, config.vocab_size, block_size, rng)
    context = shape.decode_context
    runner = ModelRunner(init_model(config), num_blocks=num_blocks, block_size=block_size, backend=resolve_backend())
    decode_res = side_by_side(runner, {"plain": decode,
                                       "penalties+bias": penalised(decode, context, config.vocab_size, rng)}, repeats)
    prefill_res = side_by_side(runner, {"plain": prefill, "prompt_logprobs=0": with_prompt_logprobs(prefill, 0),
                                        f"prompt_logprobs={top_k}": with_prompt_logprobs(prefill, top_k)}, repeats)
    table = "\n".join([
        f"{config.name}, vocab {config.vocab_size}: decode {shape.decode_batch} x {context} ctx, "
        f"prefill {shape.prefill_len} tokens; {repeats} alternating rounds", "",
        markdown_table(["step", "variant", "median (ms)", "ratio to plain"],
                       [[step, name, f"{r['median_ms']:.1f}", f"{r['ratio']:.3f}"]
                        for step, res in (("decode", decode_res), ("prefill", prefill_res))
                        for name, r in res.items()], align="llrr")])
    return {"config": config.name, "decode": decode_res, "prefill": prefill_res,
            "compiles": runner.num_compiles}, table
