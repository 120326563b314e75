"""Real-text quality of the serving numerics on a pretrained model (`jaxpaged bench quality`): perplexity under
each numerics and KV layout, and the fp8-KV engine's agreement with the bf16 one. The variants, the fp8 scale
kinds and what each figure means: docs/benchmarks/quality.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxpaged.bench.options import option
from jaxpaged.mathutils import cdiv
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.report import markdown_table
from jaxpaged.sampling_params import SamplingParams

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "quality"
PASSAGES = DATA_DIR / "passages.jsonl"
CHAT_PROMPTS = DATA_DIR / "chat_prompts.jsonl"
FP8_SCALES = ("unit", "per-tensor", "per-head", "per-head-long")
_REQUEST_IDS = itertools.count()


@dataclasses.dataclass(frozen=True)
class QualityOptions:
    """Which figures, over how much of the shipped text, and the hybrid layout's window."""

    window: int = option(128, "sliding window of the hybrid layout's local layers", at_least=1)
    num_passages: int | None = option(None, "score only the first N passages (default: all)", at_least=1)
    num_prompts: int | None = option(None, "use only the first N chat prompts (default: all)", at_least=1)
    max_tokens: int = option(32, "greedy answer tokens per chat prompt", at_least=1)
    parts: tuple[str, ...] = option(("perplexity", "agreement"), "which figures to measure",
                                    choices=("perplexity", "agreement"))


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of serving the model: weight dtype, KV dtype, fp8 scale kind, KV layout, sliding window."""

    name: str
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    scales: str | None = None  # one of FP8_SCALES for an fp8 pool
    kv_layout: str = "paged"
    window: int | None = None  # hybrid: every layer but each 6th slides with this window


def perplexity_variants(window: int) -> list[Variant]:
    """The variants the perplexity table compares, the float32 reference first."""
    return [
        Variant("float32 (reference)"),
        Variant("bfloat16 weights + KV", dtype="bfloat16"),
        *[Variant(f"fp8 KV, {s} scales (float32 weights)", kv_cache_dtype="fp8_e4m3", scales=s) for s in FP8_SCALES],
        Variant("fp8 KV, per-head scales (bfloat16 weights)", dtype="bfloat16", kv_cache_dtype="fp8_e4m3",
                scales="per-head"),
        Variant("contiguous KV layout (float32)", kv_layout="contiguous"),
        Variant(f"hybrid: 5 of 6 layers slide, window {window} (float32)", window=window),
    ]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON object of a JSON-lines file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def windowed(model, window: int):
    """The same weights with a Gemma-3-like layer pattern: every 6th layer full, the others sliding `window`."""
    from jaxpaged.checkpoint.skeleton import assemble_model, model_params

    config = model.config
    types = tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(config.num_layers))
    return assemble_model(config.replace(sliding_window=window, layer_types=types), model_params(model))


class QualityBench:
    """The model loaded once per weight dtype and one engine per (weights, KV dtype, layout, window)."""

    def __init__(self, model_path: str, block_size: int, max_model_len: int, calibration_ids: list[int],
                 long_calibration_ids: list[int]):
        """`calibration_ids`: the tokens fp8 scales are calibrated on (`per-head`, and `per-tensor` from them);
        `long_calibration_ids`: those of `per-head-long`."""
        self.model_path, self.block_size, self.max_model_len = model_path, block_size, max_model_len
        self.calibration_ids = {"short": calibration_ids, "long": long_calibration_ids}
        self._models: dict[tuple[str, int | None], Any] = {}
        self._engines: dict[tuple, Any] = {}
        self._scales: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def model(self, dtype: str, window: int | None = None):
        """The pretrained model in `dtype` (with sliding windows when `window`)."""
        key = (dtype, window)
        if key not in self._models:
            from jaxpaged.checkpoint import load_model
            base = self._models.get((dtype, None)) or load_model(self.model_path, dtype=dtype)
            self._models[(dtype, None)] = base
            self._models[key] = base if window is None else windowed(base, window)
        return self._models[key]

    def scales(self, kind: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """fp8 `(k_scale, v_scale)` of `kind` (see the module docstring), calibrated on the model in `dtype`."""
        from jaxpaged.kv_pool.fp8 import DEFAULT_SCALE_MARGIN
        from jaxpaged.runner import calibrate_kv_scales

        config = self.model(dtype).config
        if kind == "unit":
            ones = np.ones((config.num_layers, config.num_kv_heads), np.float32)
            return ones, ones
        source = "long" if kind == "per-head-long" else "short"
        if (dtype, source) not in self._scales:
            self._scales[(dtype, source)] = calibrate_kv_scales(self.model(dtype), self.calibration_ids[source],
                                                                self.block_size, DEFAULT_SCALE_MARGIN)
        k, v = self._scales[(dtype, source)]
        if kind == "per-tensor":
            return (np.broadcast_to(k.max(axis=1, keepdims=True), k.shape).copy(),
                    np.broadcast_to(v.max(axis=1, keepdims=True), v.shape).copy())
        return k, v

    def engine(self, variant: Variant):
        """The engine of `variant`: built once per (weights, KV dtype, layout, window); fp8 scales are set on
        its pool for each variant (they are data, so a new scale kind compiles nothing)."""
        from jaxpaged.engine import Engine, EngineConfig

        key = (variant.dtype, variant.kv_cache_dtype, variant.kv_layout, variant.window)
        model = self.model(variant.dtype, variant.window)
        if key not in self._engines:
            fp8 = variant.kv_cache_dtype == "fp8_e4m3"
            config = EngineConfig(model=self.model_path, dtype=variant.dtype, kv_cache_dtype=variant.kv_cache_dtype,
                                  kv_layout=variant.kv_layout, block_size=self.block_size,
                                  max_model_len=self.max_model_len, num_blocks=None,
                                  kv_cache_bytes=256 << 20, max_num_batched_tokens=self.max_model_len,
                                  max_num_seqs=64, enable_prefix_caching=False,
                                  kv_scales=self.scales("unit", variant.dtype) if fp8 else None)
            self._engines[key] = Engine(config, model=model)
        engine = self._engines[key]
        if variant.scales is not None:
            engine.set_kv_scales(*self.scales(variant.scales, variant.dtype))
        return engine


def run_requests(engine, prompts: list[list[int]], params: SamplingParams) -> list:
    """Every prompt to completion on `engine`, submitted together; outputs in prompt order."""
    names = [f"q{next(_REQUEST_IDS)}" for _ in prompts]
    for name, prompt in zip(names, prompts):
        engine.add_request(name, prompt, params)
    done = {}
    while engine.has_unfinished_requests():
        done |= {out.request_id: out for out in engine.step() if out.finished}
    return [done[name] for name in names]


def passage_logprobs(engine, passages: list[list[int]]) -> list[np.ndarray]:
    """log p(token i | tokens before it) for every token after the first of each passage."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)
    outs = run_requests(engine, passages, params)
    return [np.array([entry[token] for entry, token in zip(out.prompt_logprobs[1:], ids[1:])])
            for out, ids in zip(outs, passages)]


def perplexity_rows(bench: QualityBench, variants: list[Variant], passages: list[list[int]]) -> list[dict]:
    """Per variant: perplexity over all passage tokens, per passage, and the gap to the first variant's logprobs."""
    rows, reference = [], None
    for variant in variants:
        engine = bench.engine(variant)
        compiles_before, start = engine.num_compiles, time.perf_counter()
        logprobs = passage_logprobs(engine, passages)
        every = np.concatenate(logprobs)
        reference = every if reference is None else reference
        rows.append({"variant": variant.name, **dataclasses.asdict(variant),
                     "tokens_scored": int(every.size), "perplexity": float(math.exp(-every.mean())),
                     "per_passage_perplexity": [float(math.exp(-lp.mean())) for lp in logprobs],
                     "max_abs_logprob_diff_vs_reference": float(np.abs(every - reference).max()),
                     "mean_abs_logprob_diff_vs_reference": float(np.abs(every - reference).mean()),
                     "seconds": time.perf_counter() - start, "compiles": engine.num_compiles - compiles_before})
    return rows


def fp8_agreement(bench: QualityBench, prompts: list[list[int]], max_tokens: int, stops: set[int]) -> dict:
    """bf16 KV against fp8 KV (per-head scales), both on bf16 weights, over the chat prompts: identical greedy
    answers (up to a stop token), and the fp8 engine's top-1 at each position of the bf16 answers it reads."""
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, output_kind=RequestOutputKind.FINAL_ONLY)

    def answers(engine) -> list[list[int]]:
        return [list(itertools.takewhile(lambda t: t not in stops, out.outputs[0].token_ids))
                for out in run_requests(engine, prompts, greedy)]

    reference = answers(bench.engine(Variant("bf16", dtype="bfloat16")))
    fp8 = bench.engine(Variant("fp8", dtype="bfloat16", kv_cache_dtype="fp8_e4m3", scales="per-head"))
    fp8_answers = answers(fp8)
    common = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
              for x, y in zip(reference, fp8_answers)]
    answered = [(prompt, answer) for prompt, answer in zip(prompts, reference) if answer]
    forced = run_requests(fp8, [p + a for p, a in answered], SamplingParams(
        max_tokens=1, prompt_logprobs=1, output_kind=RequestOutputKind.FINAL_ONLY))
    top1 = [max(entry, key=entry.get) == token for out, (prompt, answer) in zip(forced, answered)
            for entry, token in zip(out.prompt_logprobs[len(prompt):], answer)]
    return {"prompts": len(prompts), "max_tokens": max_tokens,
            "answers_identical": sum(a == r for a, r in zip(fp8_answers, reference)),
            "mean_tokens_before_first_difference": float(np.mean(common)),
            "mean_answer_tokens_bf16": float(np.mean([len(r) for r in reference])),
            "teacher_forced_positions": len(top1), "teacher_forced_top1_agreement": sum(top1) / max(len(top1), 1)}


def perplexity_table(rows: list[dict]) -> str:
    """The perplexity rows as a Markdown table."""
    return markdown_table(
        ["variant", "tokens", "perplexity", "vs float32", "max |dlogp|", "mean |dlogp|"],
        [[r["variant"], r["tokens_scored"], f"{r['perplexity']:.3f}",
          f"{r['perplexity'] / rows[0]['perplexity']:.4f}x", f"{r['max_abs_logprob_diff_vs_reference']:.4f}",
          f"{r['mean_abs_logprob_diff_vs_reference']:.5f}"] for r in rows])


def agreement_table(result: dict) -> str:
    """The fp8-vs-bf16 agreement as a Markdown table."""
    return markdown_table(
        ["chat prompts", "answers identical", "tokens before first difference (mean)", "answer tokens (mean)",
         "teacher-forced positions", "top-1 agreement"],
        [[result["prompts"], result["answers_identical"], f"{result['mean_tokens_before_first_difference']:.1f}",
          f"{result['mean_answer_tokens_bf16']:.1f}", result["teacher_forced_positions"],
          f"{result['teacher_forced_top1_agreement']:.4f}"]])


def quality_report(options: QualityOptions, model: str, block_size: int) -> tuple[dict, str]:
    """The figures ``options.parts`` names, on ``model`` over the shipped passages and chat prompts (the latter
    in the model's chat template): the result and its tables."""
    from jaxpaged.checkpoint import model_config
    from jaxpaged.server.chat import ChatTemplate
    from jaxpaged.tokenizer import load_tokenizer

    tokenizer, template = load_tokenizer(model, model_config(model)), ChatTemplate.for_model(model)
    passages = [tokenizer.encode(p["text"]) for p in read_jsonl(PASSAGES)[:options.num_passages]]
    prompts = [tokenizer.encode(template.render(c["messages"]), add_special_tokens=False)
               for c in read_jsonl(CHAT_PROMPTS)[:options.num_prompts]]
    longest = max(max(len(p) for p in passages) + 1, max(len(p) for p in prompts) + options.max_tokens)
    bench = QualityBench(model, block_size, cdiv(longest, block_size) * block_size, calibration_ids=prompts[0],
                         long_calibration_ids=passages[0])
    result, tables, start = {"jax": jax.__version__}, [], time.perf_counter()
    if "perplexity" in options.parts:
        result["perplexity"] = perplexity_rows(bench, perplexity_variants(options.window), passages)
        tables.append(perplexity_table(result["perplexity"]))
    if "agreement" in options.parts:
        result["fp8_vs_bf16"] = fp8_agreement(bench, prompts, options.max_tokens, tokenizer.stop_token_ids)
        tables.append(agreement_table(result["fp8_vs_bf16"]))
    result["seconds"] = time.perf_counter() - start
    return result, "\n\n".join(tables)
