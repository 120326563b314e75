"""End-to-end latency of one batch, as vLLM's `bench latency`: the same batch generated again and again, timed."""

from __future__ import annotations

import time

import numpy as np

from jaxpaged.llm import LLM
from jaxpaged.report import markdown_table
from jaxpaged.sampling_params import SamplingParams

PERCENTILES = (10, 25, 50, 75, 90, 99)


def run_latency(engine_kwargs: dict, *, batch_size: int, input_len: int, output_len: int, num_iters_warmup: int,
                num_iters: int, seed: int = 0) -> tuple[dict, str]:
    """Seconds per `generate` of one batch on an `LLM` of ``engine_kwargs``: the mean, percentiles and every
    timed call, and their table.

    ``batch_size`` prompts of ``input_len`` random ids below the vocabulary each generate ``output_len`` tokens
    (greedy, EOS ignored), ``num_iters_warmup`` untimed times (they compile every step shape), then
    ``num_iters`` timed ones; the prefix cache is emptied before each, so no call reuses another's blocks.
    """
    llm = LLM(**engine_kwargs)
    vocab_size = llm.engine.model_config.vocab_size
    prompts = np.random.default_rng(seed).integers(0, vocab_size, size=(batch_size, input_len)).tolist()
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0, detokenize=False)
    latencies = []
    for i in range(num_iters_warmup + num_iters):
        if not llm.engine.reset_prefix_cache():
            raise RuntimeError("the prefix cache could not be emptied: a block is still in use")
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        if i >= num_iters_warmup:
            latencies.append(time.perf_counter() - start)
    summary = {"avg_latency_s": float(np.mean(latencies)),
               "percentiles_s": {str(p): float(np.percentile(latencies, p)) for p in PERCENTILES},
               "latencies_s": latencies}
    table = markdown_table(["batch x (input + output)", "mean (s)", *(f"p{p} (s)" for p in PERCENTILES)],
                           [[f"{batch_size} x ({input_len} + {output_len})", f"{summary['avg_latency_s']:.4f}",
                             *(f"{summary['percentiles_s'][str(p)]:.4f}" for p in PERCENTILES)]])
    return summary, table
