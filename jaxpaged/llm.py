"""`LLM`: vLLM-shaped offline API over the engine."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tqdm.auto import tqdm

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutput, RequestOutputKind
from jaxpaged.sampling_params import SamplingParams


class LLM:
    """Generate for a batch of prompts: `LLM(model="tiny").generate(prompts, SamplingParams(...))`.

    Keyword arguments are `EngineConfig` fields: block_size, num_blocks or kv_cache_bytes,
    enable_prefix_caching, max_num_seqs, max_num_batched_tokens, max_model_len,
    attention_backend ("auto" | "cpu" | "xla" | "xla_reference" | "pallas" | "pallas_mosaic", pallas_interpret), kv_cache_dtype
    ("auto" | "bfloat16" | "fp8_e4m3", kv_scales), host_cache_bytes / disk_cache_dir
    (lower cache tiers), preemption_mode ("recompute" | "swap"), prefix_cache_snapshot,
    hash_algo, seed, tensor_parallel_size (split the model over that many devices).
    See `jaxpaged.engine.EngineConfig`.
    """

    def __init__(self, model: str = "tiny", **kwargs):
        self.engine = Engine(EngineConfig(model=model, **kwargs))
        self._next_id = 0

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        A prompt is a token-id list, a string, or a dict with `prompt_token_ids`
        or `prompt` and optionally `cache_salt`. If any prompt is invalid,
        ValueError is raised before anything runs. Only this call's requests
        are waited for and returned; requests added through `llm.engine` (or
        left by an interrupted call) keep running, and their outputs are not
        returned here.
        """
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
        for prompt, params in zip(prompts, sampling_params):
            self.engine.validate_prompt(prompt, params)  # all or nothing
        ids = []
        for prompt, params in zip(prompts, sampling_params):
            ids.append(self._new_request_id())
            self.engine.add_request(ids[-1], prompt,
                                    dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY))
        return self._run_until_finished(ids, use_tqdm)

    def _new_request_id(self) -> str:
        """The next `llm-N` id that the engine does not hold (a request may have been added directly)."""
        while self.engine.has_request(f"llm-{self._next_id}"):
            self._next_id += 1
        self._next_id += 1
        return f"llm-{self._next_id - 1}"

    def _run_until_finished(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        """Step until each of `ids` has its final output; other requests' outputs are left alone."""
        results: dict[str, RequestOutput] = {}
        wanted = set(ids)
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
            while len(results) < len(ids):
                if not self.engine.has_unfinished_requests():
                    missing = sorted(wanted - set(results))
                    raise RuntimeError(f"the engine finished without outputs for {missing}")
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted and out.request_id not in results:
                        results[out.request_id] = out
                        bar.update(1)
        return [results[i] for i in ids]
