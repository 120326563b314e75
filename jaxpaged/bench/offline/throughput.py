"""Offline throughput, as vLLM's `benchmark_throughput`: a fixed prompt set, all at once, timed end to end.

Both backends read the same Hugging Face checkpoint directory (a shipped config
is saved as one first, with random weights from a seed) and get the same
prompts, and every prompt generates exactly `output_len` tokens (EOS ignored).
Throughput is requests, output tokens and prompt + output tokens per second of
the measured pass; what comes before it is reported apart: for jaxpaged a
first `LLM.generate` over the same prompts (it compiles every step shape),
then the prefix cache is emptied so the measured call reuses nothing from it;
for transformers a short warm-up `generate` (jaxpaged/bench/offline/hf_backend.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from jaxpaged.bench.online.datasets import prefix_repetition_requests, random_requests
from jaxpaged.checkpoint import is_hf_checkpoint_dir, load_model, save_hf_checkpoint
from jaxpaged.config import list_configs, load_config
from jaxpaged.engine.config import EngineConfig
from jaxpaged.llm import LLM
from jaxpaged.mathutils import cdiv
from jaxpaged.sampling_params import SamplingParams

BACKENDS = ("jaxpaged", "hf")


@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """The prompt set: `num_prompts` prompts of `input_len` random tokens, the first `prefix_len` shared."""

    num_prompts: int
    input_len: int
    prefix_len: int
    output_len: int
    seed: int = 0

    def __post_init__(self):
        for name in ("num_prompts", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.prefix_len < self.input_len:
            raise ValueError(f"prefix_len must be in [0, input_len) = [0, {self.input_len}) so every prompt "
                             f"has a token of its own, got {self.prefix_len}")


def make_prompts(spec: PromptSpec, vocab_size: int) -> list[list[int]]:
    """The prompts of `spec` as token ids below `vocab_size`, the same for a given seed."""
    if spec.prefix_len:
        requests = prefix_repetition_requests(
            spec.num_prompts, prefix_len=spec.prefix_len, suffix_len=spec.input_len - spec.prefix_len,
            num_prefixes=1, output_len=spec.output_len, seed=spec.seed, vocab_limit=vocab_size)
    else:
        requests = random_requests(spec.num_prompts, input_len=spec.input_len, output_len=spec.output_len,
                                   seed=spec.seed, vocab_limit=vocab_size)
    return [list(r.prompt) for r in requests]


def hf_checkpoint(model: str, cache_dir: str | Path, seed: int = 0) -> Path:
    """A Hugging Face checkpoint directory holding `model`'s weights.

    `model` is such a directory (returned as is), a jaxpaged Orbax directory, a
    shipped config name or a config JSON (random weights from `seed`); the
    latter are written once under `cache_dir` and reused on later runs.
    """
    path = Path(model)
    if is_hf_checkpoint_dir(path):
        return path
    if path.is_dir():
        name = path.resolve().name
    elif model in list_configs() or model.endswith(".json"):
        name = f"{load_config(model).name}-seed{seed}"
    else:
        raise ValueError(f"model must be a Hugging Face checkpoint directory, a jaxpaged checkpoint directory, "
                         f"a config JSON or a shipped config ({', '.join(list_configs())}), got {model!r}")
    target = Path(cache_dir) / name
    if not is_hf_checkpoint_dir(target):
        save_hf_checkpoint(load_model(model, seed=seed), target)
    return target


@dataclasses.dataclass(frozen=True)
class BackendRun:
    """One backend's measured pass over the prompts and what preceded it.

    Attributes:
      backend: "jaxpaged" or "hf".
      token_ids: generated ids per prompt, in prompt order.
      elapsed_s: wall time of the measured pass.
      warmup_s: the pass before the first measured one (jaxpaged: the first, compiling call;
        hf: the warm-up generate).
      load_s: loading the weights (and building the engine).
      num_compiles: step shapes compiled during the measured pass (jaxpaged; 0 for hf).
      prompt_tokens_computed: prompt tokens the pass ran through the model (jaxpaged: prefix-cache
        hits excluded); None: all of them.
    """

    backend: str
    token_ids: list[list[int]]
    elapsed_s: float
    warmup_s: float
    load_s: float
    num_compiles: int = 0
    prompt_tokens_computed: int | None = None


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """The jaxpaged engine's knobs; `num_blocks=None` sizes the pool to hold every prompt at once."""

    block_size: int = EngineConfig.block_size
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_blocks: int | None = None
    enable_prefix_caching: bool = True


class JaxpagedBackend:
    """`LLM.generate` over the prompts: built and warmed up once (a first, compiling call), then measured."""

    name = "jaxpaged"

    def __init__(self, checkpoint: str | Path, prompts: Sequence[Sequence[int]], *, output_len: int,
                 temperature: float = 0.0, seed: int = 0, limits: EngineLimits = EngineLimits(),
                 dtype: str | None = None):
        """Build the engine (pool sized by `limits`, weights in `dtype`) and make the first call over `prompts`."""
        self.prompts = [list(p) for p in prompts]
        max_len = max(len(p) for p in prompts) + output_len
        num_blocks = limits.num_blocks or len(prompts) * cdiv(max_len, limits.block_size) + 1
        start = time.perf_counter()
        self.llm = LLM(str(checkpoint), block_size=limits.block_size, num_blocks=num_blocks, max_model_len=max_len,
                       max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
                       enable_prefix_caching=limits.enable_prefix_caching, seed=seed, dtype=dtype)
        self.load_s = time.perf_counter() - start
        self.params = [SamplingParams(temperature=temperature, max_tokens=output_len, ignore_eos=True,
                                      detokenize=False, seed=seed + i if temperature > 0 else None)
                       for i in range(len(prompts))]
        start = time.perf_counter()
        self.llm.generate(self.prompts, self.params, use_tqdm=False)
        self.warmup_s = time.perf_counter() - start

    def measure(self) -> BackendRun:
        """One timed call over the prompts, with the prefix cache emptied first (nothing reused from before)."""
        if not self.llm.engine.reset_prefix_cache():
            raise RuntimeError("the prefix cache could not be emptied: a block is still in use")
        engine = self.llm.engine
        compiles = engine.num_compiles
        start = time.perf_counter()
        outputs = self.llm.generate(self.prompts, self.params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        token_ids = [list(o.outputs[0].token_ids) for o in outputs]
        computed = sum(len(o.prompt_token_ids) - o.num_cached_tokens for o in outputs)
        return BackendRun(self.name, token_ids, elapsed, self.warmup_s, self.load_s, engine.num_compiles - compiles,
                          computed)

    def close(self) -> None:
        """Nothing to release: the engine goes with the object."""


class HFBackend:
    """transformers' `generate` over the prompts in static batches: loaded and warmed up once, then measured."""

    name = "hf"

    def __init__(self, checkpoint: str | Path, prompts: Sequence[Sequence[int]], *, output_len: int,
                 temperature: float = 0.0, seed: int = 0, batch_size: int | None = None,
                 num_threads: int | None = 2):
        """Load the checkpoint into torch (`hf_backend.MISSING_EXTRA` if it cannot) and warm up on two prompts."""
        from jaxpaged.bench.offline import hf_backend
        self._hf = hf_backend
        self.prompts = [list(p) for p in prompts]
        self.kwargs = {"output_len": output_len, "batch_size": batch_size or len(prompts),
                       "temperature": temperature, "seed": seed}
        start = time.perf_counter()
        self.model = hf_backend.load_hf_model(str(checkpoint), num_threads=num_threads)
        self.load_s = time.perf_counter() - start
        start = time.perf_counter()
        hf_backend.generate(self.model, self.prompts[:2], **(self.kwargs | {"output_len": min(output_len, 4)}))
        self.warmup_s = time.perf_counter() - start

    def measure(self) -> BackendRun:
        """One timed `generate` pass over every prompt."""
        start = time.perf_counter()
        token_ids = self._hf.generate(self.model, self.prompts, **self.kwargs)
        return BackendRun(self.name, token_ids, time.perf_counter() - start, self.warmup_s, self.load_s)

    def close(self) -> None:
        """Nothing to release: the model goes with the object."""


def summarize(run: BackendRun, prompts: Sequence[Sequence[int]]) -> dict[str, float]:
    """vLLM's three throughputs of `run` plus its token counts and the times reported apart."""
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = sum(len(ids) for ids in run.token_ids)
    elapsed = max(run.elapsed_s, 1e-9)
    return {
        "num_requests": len(run.token_ids),
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_computed": prompt_tokens if run.prompt_tokens_computed is None else run.prompt_tokens_computed,
        "output_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens,
        "elapsed_s": run.elapsed_s,
        "request_throughput": len(run.token_ids) / elapsed,
        "output_token_throughput": output_tokens / elapsed,
        "total_token_throughput": (prompt_tokens + output_tokens) / elapsed,
        "warmup_s": run.warmup_s,
        "load_s": run.load_s,
        "num_compiles": run.num_compiles,
    }
