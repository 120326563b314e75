"""vLLM's side of `jaxpaged bench throughput --backend=vllm`, run by the Python of a vLLM install.

A standalone script (it imports vLLM and the standard library only, never
jaxpaged: vLLM's CPU build wants its own torch, so it lives in its own venv).
Started by `vllm_backend.VllmBackend` with a JSON job file as its argument, it
builds `vllm.LLM` on the job's checkpoint and settings, runs one untimed
`generate` over the prompts (vLLM compiles and warms up its graphs there), then
answers each `measure` line on stdin with one timed `generate` pass (`measure N`:
N tokens per prompt instead of the job's `output_len`), and stops
at end of input. Results are JSON lines on stdout prefixed with `RESULT_MARK`,
as vLLM also logs to stdout.
"""

from __future__ import annotations

import json
import sys
import time

RESULT_MARK = "JAXPAGED_VLLM_RESULT "


def main(job_path: str) -> None:
    """Build vLLM from the job file, warm it up, then time one pass per `measure` line on stdin."""
    with open(job_path) as f:
        job = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(**llm_kwargs(job))
    load_s = time.perf_counter() - start
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    temperature = job["temperature"]

    def generate(output_len: int) -> tuple[float, list[list[int]]]:
        params = [SamplingParams(temperature=temperature, max_tokens=output_len, min_tokens=output_len,
                                 ignore_eos=True, detokenize=False, seed=job["seed"] + i if temperature > 0 else None)
                  for i in range(len(prompts))]
        begin = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - begin, [list(o.outputs[0].token_ids) for o in outputs]

    warmup_s, _ = generate(job["output_len"])
    _emit({"ready": True, "load_s": load_s, "warmup_s": warmup_s})
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] != "measure":
            continue
        llm.reset_prefix_cache()  # as the jaxpaged side: nothing reused from the pass before
        elapsed, token_ids = generate(int(words[1]) if len(words) > 1 else job["output_len"])
        _emit({"elapsed_s": elapsed, "token_ids": token_ids})


def llm_kwargs(job: dict) -> dict:
    """`vllm.LLM`'s arguments for `job`: its engine limits where the job sets them (`job["engine"]`), else
    vLLM's own defaults."""
    return {"model": job["checkpoint"], "skip_tokenizer_init": True, "dtype": job["dtype"], "seed": job["seed"],
            "max_model_len": job["max_model_len"], "gpu_memory_utilization": job["memory_fraction"],
            **job.get("engine", {})}


def _emit(record: dict) -> None:
    print(RESULT_MARK + json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
