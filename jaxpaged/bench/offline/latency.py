"""End-to-end latency of one batch, as vLLM's `bench latency`: the same batch generated again and again, timed."""

from __future__ import annotations

import time

import numpy as np

from jaxpaged.llm import LLM
from jaxpaged.report import markdown_table
from jaxpaged.sampling_params import SamplingParams

PERCENTILES = (10, 25, 50, 75, 90, 99)


def random_prompts(batch_size: int, input_len: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """``batch_size`` prompts of ``input_len`` uniform random token ids below ``vocab_size``."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=(batch_size, input_len)).tolist()


def measure_latency(llm: LLM, prompts: list[list[int]], output_len: int, *, num_iters_warmup: int,
                    num_iters: int) -> list[float]:
    """Seconds per `generate` of the whole batch (``output_len`` tokens each, EOS ignored), ``num_iters`` times.

    The warm-up calls compile every step shape first; the prefix cache is
    emptied before each call, so no call reuses another's prompt blocks.
    """
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0, detokenize=False)
    latencies = []
    for i in range(num_iters_warmup + num_iters):
        if not llm.engine.reset_prefix_cache():
            raise RuntimeError("the prefix cache could not be emptied: a block is still in use")
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        if i >= num_iters_warmup:
            latencies.append(time.perf_counter() - start)
    return latencies


def latency_summary(latencies: list[float]) -> dict:
    """Mean and the percentiles of ``latencies`` (seconds), with the raw list."""
    return {"avg_latency_s": float(np.mean(latencies)),
            "percentiles_s": {str(p): float(np.percentile(latencies, p)) for p in PERCENTILES},
            "latencies_s": list(latencies)}


def latency_table(summary: dict, batch_size: int, input_len: int, output_len: int) -> str:
    """One row: the batch's shape, the mean and every percentile of `latency_summary` (seconds)."""
    return markdown_table(["batch x (input + output)", "mean (s)", *(f"p{p} (s)" for p in PERCENTILES)],
                          [[f"{batch_size} x ({input_len} + {output_len})", f"{summary['avg_latency_s']:.4f}",
                            *(f"{summary['percentiles_s'][str(p)]:.4f}" for p in PERCENTILES)]])


def run_latency(engine_kwargs: dict, *, batch_size: int, input_len: int, output_len: int, num_iters_warmup: int,
                num_iters: int, seed: int = 0) -> tuple[dict, str]:
    """An `LLM` of ``engine_kwargs`` generates one random batch again and again: `latency_summary` and its table."""
    llm = LLM(**engine_kwargs)
    prompts = random_prompts(batch_size, input_len, llm.engine.model_config.vocab_size, seed)
    summary = latency_summary(measure_latency(llm, prompts, output_len, num_iters_warmup=num_iters_warmup,
                                              num_iters=num_iters))
    return summary, latency_table(summary, batch_size, input_len, output_len)
