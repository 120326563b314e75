"""The Hugging Face transformers side of `bench throughput` (torch on the CPU).

What a user without a GPU would run instead of jaxpaged: `model.generate` over
one static batch per `batch_size` prompts, left-padded with an attention mask,
as vLLM's `benchmark_throughput --backend=hf` does. torch and transformers come
from the optional `hf` extra and are imported only when this backend runs;
their absence is `HFBackendMissing`, one line naming the extra.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from jaxpaged.bench.offline.backend_run import BackendRun

MISSING_EXTRA = "the hf backend needs torch and transformers: pip install -e '.[hf]'"


class HFBackendMissing(RuntimeError):
    """torch or transformers cannot be imported (the `hf` extra is not installed)."""


class HFBackend:
    """transformers' `generate` over the prompts in static batches: loaded and warmed up once, then measured."""

    name = "hf"

    def __init__(self, checkpoint: str | Path, prompts: Sequence[Sequence[int]], *, output_len: int,
                 temperature: float = 0.0, seed: int = 0, batch_size: int | None = None,
                 num_threads: int | None = 2):
        """Load the checkpoint as a float32 model in eval mode, torch limited to `num_threads`, and warm up on two
        prompts. `temperature=0` is greedy; otherwise plain sampling (top-k and top-p off) seeded by `seed`."""
        try:
            import torch
            import transformers
        except ImportError as err:
            raise HFBackendMissing(f"{MISSING_EXTRA} ({err})") from None
        self._torch, self.seed = torch, seed
        self.prompts = [list(p) for p in prompts]
        self.output_len, self.batch_size = output_len, batch_size or len(prompts)
        self.sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0
                         else {"do_sample": False})
        start = time.perf_counter()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        transformers.utils.logging.disable_progress_bar()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
        self.model.generation_config.eos_token_id = None  # ignore_eos: every prompt gets exactly output_len tokens
        self.load_s = time.perf_counter() - start
        start = time.perf_counter()
        self._generate(self.prompts[:2], min(output_len, 4))
        self.warmup_s = time.perf_counter() - start

    def measure(self, output_len: int | None = None) -> BackendRun:
        """One timed `generate` pass over every prompt (`output_len` tokens each; None: the backend's)."""
        start = time.perf_counter()
        token_ids = self._generate(self.prompts, output_len or self.output_len)
        return BackendRun(self.name, token_ids, time.perf_counter() - start, self.warmup_s, self.load_s)

    def close(self) -> None:
        """Nothing to release: the model goes with the object."""

    def _generate(self, prompts: list[list[int]], output_len: int) -> list[list[int]]:
        """`output_len` new tokens per prompt, `batch_size` prompts per static batch, left-padded with id 0."""
        torch = self._torch
        torch.manual_seed(self.seed)
        outputs = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start:start + self.batch_size]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], dtype=torch.long)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], dtype=torch.long)
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=output_len,
                                          min_new_tokens=output_len, pad_token_id=0, use_cache=True, **self.sampling)
            new = out[:, width:].tolist()
            if any(len(tokens) != output_len for tokens in new):
                raise RuntimeError(f"transformers returned {[len(t) for t in new]} tokens, wanted {output_len} each")
            outputs.extend(new)
        return outputs
