"""``jaxpaged bench throughput``: vLLM's `benchmark_throughput` for jaxpaged, transformers and vLLM, side by side.

`run_throughput` builds and warms up each backend on the same checkpoint and prompts, measures their passes
interleaved, and `throughput_table` renders the medians, ratios and each pass's weight-GEMM floor (`GemmFloor`):
the command's help, docs/benchmarks/throughput.md and docs/benchmarks/cpu-performance.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from absl import logging

from jaxpaged.bench.offline.matmul_floor import gemm_flops_per_second, torch_gemm_flops_per_second, weight_flops_per_row
from jaxpaged.bench.offline.backend_run import BackendRun, EngineLimits
from jaxpaged.bench.offline.driver import median_summary, ratio_table
from jaxpaged.bench.online.datasets import prefix_repetition_requests, random_requests
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import is_hf_checkpoint_dir, load_model, save_hf_checkpoint
from jaxpaged.config import list_configs, load_config
from jaxpaged.llm import LLM
from jaxpaged.mathutils import cdiv
from jaxpaged.model import DecoderModel
from jaxpaged.report import metrics_table
from jaxpaged.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """The prompt set: `num_prompts` prompts of `input_len` random tokens, the first `prefix_len` shared."""

    num_prompts: int = option(64, "prompts, all sent at once", at_least=1)
    input_len: int = option(256, "tokens per prompt", at_least=1)
    prefix_len: int = option(64, "leading tokens every prompt shares (0 = all random)", at_least=0)
    output_len: int = option(64, "tokens generated per prompt (EOS ignored)", at_least=1)
    seed: int = option(0, "prompt, weight and sampling seed", at_least=0)

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

    def measure(self, output_len: int | None = None) -> BackendRun:
        """One timed call over the prompts (`output_len` tokens each; None: the backend's), with the prefix cache
        emptied first (nothing reused from before)."""
        if not self.llm.engine.reset_prefix_cache():
            raise RuntimeError("the prefix cache could not be emptied: a block is still in use")
        engine = self.llm.engine
        compiles = engine.num_compiles
        start = time.perf_counter()
        params = self.params if output_len is None else [dataclasses.replace(p, max_tokens=output_len)
                                                         for p in self.params]
        outputs = self.llm.generate(self.prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        token_ids = [list(o.outputs[0].token_ids) for o in outputs]
        computed = sum(len(o.prompt_token_ids) - o.num_cached_tokens for o in outputs)
        return BackendRun(self.name, token_ids, elapsed, self.warmup_s, self.load_s, engine.num_compiles - compiles,
                          computed)

    def close(self) -> None:
        """Nothing to release: the engine goes with the object."""


@dataclasses.dataclass(frozen=True)
class GemmFloor:
    """Per-row weight FLOPs of one model and the FLOP/s this machine reaches at prefill and decode GEMM sizes."""

    layer_flops_per_row: int
    head_flops_per_row: int
    prefill_rows: int
    prefill_flops_per_s: float
    decode_rows: int
    decode_flops_per_s: float
    onednn_prefill_flops_per_s: float | None = None  # the same GEMMs through torch (oneDNN); None without torch
    onednn_decode_flops_per_s: float | None = None

    def seconds(self, summary: Mapping[str, float], *, onednn: bool = False) -> float:
        """The floor of one pass, from its `_summary` dict (needs prompt_tokens_computed, output_tokens,
        num_requests); at oneDNN's measured FLOP/s with `onednn`.

        Rows: the prompt tokens computed (prefix-cache hits skipped) at the prefill rate; every generated
        token but each request's last, plus one LM-head row per generated token, at the decode rate.
        Attention FLOPs are left out, so the floor is a lower bound.
        """
        prefill_rate, decode_rate = ((self.onednn_prefill_flops_per_s, self.onednn_decode_flops_per_s) if onednn
                                     else (self.prefill_flops_per_s, self.decode_flops_per_s))
        fed_back = summary["output_tokens"] - summary["num_requests"]
        prefill = summary["prompt_tokens_computed"] * self.layer_flops_per_row / prefill_rate
        decode = (fed_back * self.layer_flops_per_row
                  + summary["output_tokens"] * self.head_flops_per_row) / decode_rate
        return prefill + decode


def measure_gemm_floor(model: DecoderModel, prefill_rows: int, decode_rows: int, repeats: int = 3) -> GemmFloor:
    """Time the model's weight GEMMs at `prefill_rows` and at `decode_rows` rows on this machine, in XLA and
    (where torch is installed) through torch's oneDNN."""
    if prefill_rows < 1 or decode_rows < 1:
        raise ValueError(f"prefill_rows and decode_rows must be at least 1, got {prefill_rows}, {decode_rows}")
    layer, head = weight_flops_per_row(model)
    return GemmFloor(layer, head, prefill_rows, gemm_flops_per_second(model, prefill_rows, repeats),
                     decode_rows, gemm_flops_per_second(model, decode_rows, repeats),
                     torch_gemm_flops_per_second(model, prefill_rows, repeats),
                     torch_gemm_flops_per_second(model, decode_rows, repeats))


_RATIO_METRICS = ("request_throughput", "output_token_throughput", "total_token_throughput")


def throughput_result(runs: Mapping[str, Sequence[BackendRun]], prompts: Sequence[Sequence[int]],
                      floor: GemmFloor | None = None) -> dict:
    """Every run's summary, the per-backend medians and, for each peer run beside jaxpaged, the jaxpaged/peer ratios.

    `token_agreement[peer]` is the fraction of prompts whose generated ids are the
    same in jaxpaged's and the peer's first measured runs (meaningful for greedy runs).
    With a `floor`, each summary also gets its GEMM floor and elapsed/floor,
    and the ratios the largest jaxpaged/hf that floor allows
    (the GEMM floor above).
    """
    result = {"runs": {name: [_summary(run, prompts, floor) for run in backend_runs]
                       for name, backend_runs in runs.items()}}
    result["median"] = {name: median_summary(summaries) for name, summaries in result["runs"].items()}
    if floor is not None:
        result["gemm_floor"] = dataclasses.asdict(floor)
    for peer in (name for name in runs if name != "jaxpaged" and "jaxpaged" in runs):
        jp, other = result["median"]["jaxpaged"], result["median"][peer]
        ratios = result.setdefault("ratios", {})
        ratios.update({f"{metric}: jaxpaged/{peer}": jp[metric] / other[metric] for metric in _RATIO_METRICS})
        if "tpot_ms" in jp and "tpot_ms" in other:
            ratios[f"time per output token after the first: {peer}/jaxpaged"] = other["tpot_ms"] / jp["tpot_ms"]
        if floor is not None:
            ratios[f"largest possible at the GEMM floor: {peer} elapsed / jaxpaged floor"] = (
                other["elapsed_s"] / jp["gemm_floor_s"])
        if "onednn_gemm_floor_s" in jp:
            ratios[f"largest possible with oneDNN's GEMMs: {peer} elapsed / jaxpaged floor at oneDNN's FLOP/s"] = (
                other["elapsed_s"] / jp["onednn_gemm_floor_s"])
        pairs = zip(runs["jaxpaged"][0].token_ids, runs[peer][0].token_ids)
        agreement = result.setdefault("token_agreement", {})
        agreement[peer] = sum(a == b for a, b in pairs) / len(prompts)
    return result


def _summary(run: BackendRun, prompts: Sequence[Sequence[int]], floor: GemmFloor | None) -> dict[str, float]:
    """vLLM's three throughputs of `run`, its token counts, the times reported apart and, with a `floor`, its
    GEMM floor (and at oneDNN's FLOP/s where measured) and elapsed/floor."""
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = sum(len(ids) for ids in run.token_ids)
    elapsed = max(run.elapsed_s, 1e-9)
    summary = {
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
    if run.first_token_s is not None:
        tokens_per_prompt = output_tokens // max(len(run.token_ids), 1)
        summary["first_token_pass_s"] = run.first_token_s
        summary["tpot_ms"] = 1e3 * (run.elapsed_s - run.first_token_s) / max(tokens_per_prompt - 1, 1)
    if floor is not None:
        summary["gemm_floor_s"] = floor.seconds(summary)
        summary["elapsed_over_gemm_floor"] = summary["elapsed_s"] / summary["gemm_floor_s"]
        if floor.onednn_decode_flops_per_s is not None:
            summary["onednn_gemm_floor_s"] = floor.seconds(summary, onednn=True)
    return summary


_ROWS = (
    ("requests", "num_requests", "{:.0f}"),
    ("prompt tokens", "prompt_tokens", "{:.0f}"),
    ("output tokens", "output_tokens", "{:.0f}"),
    ("elapsed (s)", "elapsed_s", "{:.2f}"),
    ("request throughput (req/s)", "request_throughput", "{:.3f}"),
    ("output token throughput (tok/s)", "output_token_throughput", "{:.1f}"),
    ("total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    ("first-token pass (s): one output token per prompt", "first_token_pass_s", "{:.2f}"),
    ("time per output token after the first (ms)", "tpot_ms", "{:.1f}"),
    ("warm-up / first call (s, excluded)", "warmup_s", "{:.1f}"),
    ("load (s, excluded)", "load_s", "{:.1f}"),
    ("compiles in measured pass", "num_compiles", "{:.0f}"),
    ("prompt tokens computed (cache hits excluded)", "prompt_tokens_computed", "{:.0f}"),
    ("weight-GEMM floor (s)", "gemm_floor_s", "{:.2f}"),
    ("elapsed / GEMM floor", "elapsed_over_gemm_floor", "{:.2f}"),
    ("weight-GEMM floor at oneDNN's FLOP/s (s)", "onednn_gemm_floor_s", "{:.2f}"),
)


def throughput_table(result: Mapping) -> str:
    """A metrics-by-backend Markdown table of the medians, then the ratios and greedy agreement if present."""
    table = metrics_table(result["median"], _ROWS)
    if "ratios" in result:
        agreement = [[f"prompts with identical outputs, jaxpaged and {peer}", f"{share:.0%}"]
                     for peer, share in result["token_agreement"].items()]
        table += "\n\n" + ratio_table(result["ratios"], agreement)
    return table


BACKENDS = ("jaxpaged", "hf", "vllm")  # --backend takes a comma-separated list of these, or "both" (jaxpaged,hf)


@dataclasses.dataclass(frozen=True)
class ThroughputRun:
    """Which backends run, how each generates, how often they are measured, and whether the GEMM floor is timed."""

    backend: str = option("both", "comma-separated backends measured side by side, passes alternating: jaxpaged, "
                                  "hf (transformers on torch CPU), vllm (a vLLM install, --vllm_python); both = "
                                  "jaxpaged,hf")
    temperature: float = option(0.0, "0 = greedy; otherwise plain sampling at this temperature", at_least=0)
    repeats: int = option(1, "measured passes per backend, interleaved; medians reported", at_least=1)
    limits: EngineLimits = EngineLimits()
    hf_batch_size: int | None = option(None, "hf: prompts per static batch (default: all)", at_least=1)
    hf_threads: int = option(2, "hf: torch.set_num_threads", at_least=1)
    gemm_floor: bool = option(True, "time the model's weight GEMMs at prefill and decode sizes and report each "
                                    "pass's weight-GEMM floor (jaxpaged/bench/offline/throughput.py)")
    dtype: str | None = None  # weights and activations of jaxpaged and vLLM (None: the checkpoint's)
    vllm_python: str | None = option(None, "vllm: the Python of a vLLM install (its own venv: vLLM's CPU build "
                                           "wants its own torch); run as a subprocess on the same checkpoint")
    vllm_threads_bind: str | None = option(None, "vllm: VLLM_CPU_OMP_THREADS_BIND (default: every core, e.g. 0-1, "
                                                 "with no core reserved for vLLM's front end)")
    first_token_pass: bool = option(False, "after each measured pass, time one of a single output token per "
                                           "prompt: the time to first token of the batch, and (elapsed - it) / "
                                           "(output_len - 1) the time per output token after the first (TPOT)")

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends to measure, in BACKENDS order (jaxpaged first)."""
        names = ("jaxpaged", "hf") if self.backend == "both" else {n.strip() for n in self.backend.split(",")}
        return tuple(n for n in BACKENDS if n in names)


def build_backends(run: ThroughputRun, checkpoint: Path, prompts: list[list[int]], spec: PromptSpec) -> list:
    """The backends to measure, each built and warmed up, jaxpaged first.

    With ``backend="both"`` and the `hf` extra missing, hf is left out with one
    line on stderr; with ``backend="hf"`` the `HFBackendMissing` is raised.
    """
    from jaxpaged.bench.offline.hf_backend import HFBackend, HFBackendMissing
    common = {"output_len": spec.output_len, "temperature": run.temperature, "seed": spec.seed}
    backends = []
    if "hf" in run.backends:
        try:
            backends.append(HFBackend(checkpoint, prompts, batch_size=run.hf_batch_size, num_threads=run.hf_threads,
                                      **common))
        except HFBackendMissing as err:
            if run.backends == ("hf",):
                raise
            print(f"skipping --backend=hf: {err}", file=sys.stderr)
    if "vllm" in run.backends:
        from jaxpaged.bench.offline.vllm_backend import VllmBackend
        backends.append(VllmBackend(run.vllm_python, checkpoint, prompts, limits=run.limits,
                                    dtype=run.dtype, threads_bind=run.vllm_threads_bind, **common))
    if "jaxpaged" in run.backends:
        backends.insert(0, JaxpagedBackend(checkpoint, prompts, limits=run.limits, dtype=run.dtype, **common))
    for backend in backends:
        logging.info("%s: loaded in %.1f s, warm-up %.1f s", backend.name, backend.load_s, backend.warmup_s)
    return backends


def run_throughput(run: ThroughputRun, model: str, checkpoint_dir: str | Path, spec: PromptSpec) -> tuple[dict, str]:
    """Measure every backend ``run.repeats`` times on ``spec``'s prompts: the result and its table.

    ``model`` is a Hugging Face checkpoint directory or a shipped config saved
    once under ``checkpoint_dir`` (random weights from ``spec.seed``). The
    result names the load average before the run (the written JSON's
    ``measured_on`` the one after: the machine may be shared).
    """
    load_average_start = os.getloadavg()  # the end's is in the written result's measured_on
    checkpoint = hf_checkpoint(model, checkpoint_dir, seed=spec.seed)
    from jaxpaged.checkpoint import read_hf_config
    prompts = make_prompts(spec, read_hf_config(checkpoint).vocab_size)
    backends = build_backends(run, checkpoint, prompts, spec)
    runs = {b.name: [] for b in backends}
    try:
        for repeat in range(run.repeats):
            for backend in backends:
                measured = backend.measure()
                if run.first_token_pass:
                    measured = dataclasses.replace(measured, first_token_s=backend.measure(output_len=1).elapsed_s)
                runs[backend.name].append(measured)
                logging.info("%s pass %d/%d: %.1f s", backend.name, repeat + 1, run.repeats,
                             runs[backend.name][-1].elapsed_s)
    finally:
        for backend in backends:
            backend.close()
    floor = None
    if run.gemm_floor:  # after the passes, so its timing runs cannot disturb them
        from jaxpaged.checkpoint import load_model
        floor = measure_gemm_floor(load_model(str(checkpoint)), prefill_rows=run.limits.max_num_batched_tokens,
                                   decode_rows=min(run.limits.max_num_seqs, spec.num_prompts))
        logging.info("weight GEMMs: %.0f GFLOP/s at %d rows, %.0f GFLOP/s at %d rows (oneDNN: %s, %s)",
                     floor.prefill_flops_per_s / 1e9, floor.prefill_rows,
                     floor.decode_flops_per_s / 1e9, floor.decode_rows,
                     floor.onednn_prefill_flops_per_s, floor.onednn_decode_flops_per_s)
    result = throughput_result(runs, prompts, floor)
    meta = {"load_average_start": load_average_start, "checkpoint": str(checkpoint)}
    return meta | result, throughput_table(result)
