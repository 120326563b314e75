"""Paged attention timed side by side (`jaxpaged bench attention`): the Pallas kernels against the XLA gather
and the chunked XLA backend; and the CPU backends alone (`--cpu_sweep`). What each implementation is and how it
is timed: the command's help and docs/benchmarks/kernels.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.attention import AttentionBackend
from jaxpaged.attention.backend import mosaic_gpu_available
from jaxpaged.bench.offline.step_timing import hand_built_steps
from jaxpaged.bench.offline.timing import median_seconds, median_step_seconds, seconds_of
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import model_config
from jaxpaged.engine.config import EngineConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.model import init_model
from jaxpaged.report import markdown_table
from jaxpaged.runner import ModelRunner
from pallas_kernels import ragged_paged_attention_mgpu as mgpu
from pallas_kernels.chunked_xla import chunked_paged_attention
from pallas_kernels.ragged_paged_attention import ragged_paged_attention
from pallas_kernels.reference import ragged_paged_attention_reference


@dataclasses.dataclass(frozen=True)
class AttentionBenchConfig:
    """The shapes, dtype and timing of one attention benchmark (`jaxpaged bench attention` fills it)."""

    batch: int = option(64, "Decode sequences.", at_least=1)
    context_len: int = option(8192, "Tokens of context per sequence.", at_least=1)
    num_q_heads: int = option(32, "Query heads (Llama-3-8B: 32).", at_least=1)
    num_kv_heads: int = option(8, "KV heads (Llama-3-8B: 8).", at_least=1)
    head_dim: int = option(128, "Head dimension (Llama-3-8B: 128).", at_least=1)
    dtype: str = option("bfloat16", "K/V pool dtype.", choices=["bfloat16", "float32", "float8_e4m3fn"])
    prefill_batch: int = option(4, "Prefill chunks (0 skips prefill).", at_least=0)
    prefill_chunk: int = option(512, "Queries per prefill chunk.", at_least=1)
    repeats: int = option(20, "Timed calls per implementation.", at_least=1)
    warmup: int = option(2, "Untimed calls before timing (the first compiles).", at_least=0)
    backend_interpret: bool = option(False, "Run the Pallas kernel in interpret mode (CPU smoke test).")
    cpu_sweep: bool = option(False, "Measure xla_reference vs the chunked xla backend instead (see above).")
    sweep_prefill_lens: tuple[int, ...] = option((512, 1024, 2048, 4096), "Prefill lengths of --cpu_sweep.",
                                                 at_least=1)
    sweep_model: str = option("small", "Model whose heads and whole step --cpu_sweep times.", check="model_name")
    sweep_decode_batch: int = option(64, "Decode sequences of --cpu_sweep.", at_least=1)
    sweep_decode_context: int = option(320, "Context tokens of each --cpu_sweep decode.", at_least=1)
    sweep_repeats: int = option(3, "Timed calls per --cpu_sweep measurement (median).", at_least=1)
    block_size: int = EngineConfig.block_size


PEAK_HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12}

CPU_BACKENDS = ("xla_reference", "xla")
Candidate = tuple[Callable | None, str]  # the function timed (None: skipped) and a note on it
PAGED_ARGS = ("q", "k_pages", "v_pages", "block_tables", "context_lens", "query_start", "query_lens")


def peak_bandwidth(device) -> float | None:
    """Peak HBM bytes/s of a known GPU, else None."""
    kind = device.device_kind
    return next((peak for name, peak in PEAK_HBM_BYTES_PER_S.items() if name in kind), None)


def time_against(fn: Callable, args: tuple, expected: jax.Array, repeats: int, warmup: int) -> dict:
    """Median wall time of `fn(*args)` over `repeats` calls after `warmup` calls (the first one timed apart), and
    its largest difference from `expected` (the XLA gather reference's output)."""
    def call():
        return jax.block_until_ready(fn(*args))
    first_call_s = seconds_of(call)()
    return {"median_s": median_seconds(call, repeats, warmup=max(warmup - 1, 0)), "first_call_s": first_call_s,
            "max_abs_err_vs_xla": float(jnp.max(jnp.abs(call().astype(jnp.float32) - expected.astype(jnp.float32))))}


def paged_call(inputs: dict, query_len: int) -> tuple[tuple, dict]:
    """The positional arguments and the keywords every ragged paged attention takes on `make_paged_inputs`."""
    return tuple(inputs[name] for name in PAGED_ARGS), {
        "max_query_len": query_len, "sm_scale": inputs["q"].shape[-1] ** -0.5,
        "k_scale": inputs["k_scale"], "v_scale": inputs["v_scale"]}


def make_paged_inputs(cfg: AttentionBenchConfig, num_seqs: int, context_len: int, query_len: int, key: jax.Array,
                      heads: tuple[int, int, int] | None = None, table_blocks: int | None = None) -> dict:
    """A pool holding `num_seqs` contexts in shuffled blocks, queries at each context's end.

    `heads` is (query heads, KV heads, head dim), the flags' by default; `table_blocks`
    pads each block table to that width (a bucketed step's padding), default none.
    """
    block_size = cfg.block_size
    heads, kv_heads, dim = heads or (cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim)
    blocks_per_seq = max(cdiv(context_len, block_size), table_blocks or 0)
    num_blocks = num_seqs * blocks_per_seq
    kq, kk, kv, kp = jax.random.split(key, 4)
    pool_dtype = jnp.dtype(cfg.dtype)
    q_dtype = jnp.bfloat16 if pool_dtype.itemsize == 1 else pool_dtype
    shape = (kv_heads, num_blocks, block_size, dim)
    scales = None
    if pool_dtype.itemsize == 1:
        scales = jnp.full((kv_heads,), 0.5, jnp.float32)
    tables = jax.random.permutation(kp, num_blocks).reshape(num_seqs, blocks_per_seq).astype(jnp.int32)
    return {
        "q": jax.random.normal(kq, (num_seqs * query_len, heads, dim), q_dtype),
        "k_pages": jax.random.normal(kk, shape, jnp.bfloat16).astype(pool_dtype),
        "v_pages": jax.random.normal(kv, shape, jnp.bfloat16).astype(pool_dtype),
        "block_tables": tables,
        "context_lens": jnp.full((num_seqs,), context_len, jnp.int32),
        "query_start": jnp.arange(num_seqs, dtype=jnp.int32) * query_len,
        "query_lens": jnp.full((num_seqs,), query_len, jnp.int32),
        "k_scale": scales,
        "v_scale": scales,
    }


def kernel_candidates(cfg: AttentionBenchConfig, inputs: dict, static: dict) -> dict[str, Candidate]:
    """The Triton and the Mosaic GPU kernels: compiled on a GPU, interpreted on CPU with --backend_interpret."""
    on_cpu = jax.default_backend() == "cpu"
    if on_cpu and not cfg.backend_interpret:
        return dict.fromkeys(("pallas", "pallas_mosaic"), (None, "skipped on CPU (pass --backend_interpret)"))
    triton = jax.jit(functools.partial(ragged_paged_attention, **static, interpret=cfg.backend_interpret))
    candidates = {"pallas": (triton, "interpret mode" if cfg.backend_interpret else "")}
    q, k_pages = inputs["q"], inputs["k_pages"]
    if not mosaic_gpu_available():
        candidates["pallas_mosaic"] = (None, f"skipped: JAX {jax.__version__} has no Mosaic GPU backend")
    elif not mgpu.supports(q.dtype, k_pages.dtype, q.shape[-1], q.shape[1] // k_pages.shape[0]):
        candidates["pallas_mosaic"] = (None, f"skipped: takes 16-bit queries and head_dim 64 or 128 "
                                             f"(q {q.dtype}, {q.shape})")
    else:
        interpret = mgpu.interpret_params(detect_races=False) if on_cpu else None
        mosaic = jax.jit(functools.partial(mgpu.ragged_paged_attention_mgpu, **static, interpret=interpret))
        candidates["pallas_mosaic"] = (mosaic, "Mosaic GPU interpret mode" if on_cpu else "Mosaic GPU (TMA + WGMMA)")
    return candidates


def benchmark_phase(cfg: AttentionBenchConfig, phase: str, num_seqs: int, query_len: int, key: jax.Array) -> list[dict]:
    """Time every available implementation on one decode or prefill workload, with its time over the Triton
    kernel's (`pallas_speedup`)."""
    inputs = make_paged_inputs(cfg, num_seqs, cfg.context_len, query_len, key)
    paged_args, static = paged_call(inputs, query_len)
    kv_bytes = 2 * num_seqs * cfg.context_len * cfg.num_kv_heads * cfg.head_dim * inputs["k_pages"].dtype.itemsize
    reference = jax.jit(functools.partial(ragged_paged_attention_reference, **static))
    chunked = jax.jit(functools.partial(chunked_paged_attention, **static))
    candidates = kernel_candidates(cfg, inputs, static) | {"xla_gather": (reference, ""), "xla_chunked": (chunked, "")}
    expected = reference(*paged_args)
    peak = peak_bandwidth(jax.devices()[0])
    rows = []
    for name, (fn, note) in candidates.items():
        row = {"phase": phase, "impl": name, "note": note, "kv_bytes": kv_bytes}
        if fn is not None:
            try:
                row.update(time_against(fn, paged_args, expected, cfg.repeats, cfg.warmup))
            except Exception as error:  # noqa: BLE001 - report a failing kernel, keep measuring
                row["note"] = f"failed: {error!r}"[:300]
        if "median_s" in row:
            row["gb_per_s"] = kv_bytes / row["median_s"] / 1e9
            row["pct_peak"] = 100 * kv_bytes / row["median_s"] / peak if peak else None
        rows.append(row)
    pallas = next((r for r in rows if r["impl"] == "pallas" and "median_s" in r), None)
    for row in rows:
        if pallas and "median_s" in row:
            row["pallas_speedup"] = row["median_s"] / pallas["median_s"]
    return rows


def decode_targets(rows: list[dict]) -> dict:
    """Issue 5's decode targets on an H200 (batch 64 x 8K, Llama-3-8B heads, bf16) met or not (None where a
    figure is missing)."""
    decode = {r["impl"]: r for r in rows if r["phase"] == "decode"}

    def meets(impl: str, figure: str, target: float) -> bool | None:
        value = decode.get(impl, {}).get(figure)
        return None if value is None else bool(value >= target)

    return {"pct_peak>=70": meets("pallas", "pct_peak", 70.0),
            "vs_xla_gather>=3x": meets("xla_gather", "pallas_speedup", 3.0),
            "mosaic_pct_peak>=70": meets("pallas_mosaic", "pct_peak", 70.0)}


def machine() -> dict:
    """What the report was measured on: the first device, JAX's backend and version, its peak bandwidth."""
    device = jax.devices()[0]
    return {"device": device.device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
            "peak_hbm_bytes_per_s": peak_bandwidth(device)}


def heading(title: str, report: dict) -> list[str]:
    """A report's first lines: the title with the device and JAX version, then its configuration."""
    machine = report["machine"]
    return [f"# {title} — {machine['device']} (JAX {machine['jax']})", "",
            "Config: " + ", ".join(f"{k}={v}" for k, v in report["config"].items()), ""]


def markdown(report: dict) -> str:
    """The results as a Markdown table, with the machine and configuration above it."""
    fmt = lambda value, spec: "n/a" if value is None else format(value, spec)  # noqa: E731
    lines = heading("Paged attention benchmark", report)
    rows = []
    for r in report["results"]:
        median_ms = r["median_s"] * 1e3 if "median_s" in r else None
        rows.append([r["phase"], r["impl"], fmt(median_ms, ".3f"), fmt(r.get("first_call_s"), ".2f"),
                     fmt(r.get("gb_per_s"), ".1f"), fmt(r.get("pct_peak"), ".1f"), fmt(r.get("pallas_speedup"), ".2f"),
                     fmt(r.get("max_abs_err_vs_xla"), ".2e"), r["note"]])
    lines += [markdown_table(["phase", "impl", "median ms", "first call s", "K/V GB/s", "% peak HBM", "time / pallas",
                              "max abs err", "note"], rows, align="l" * 9), "",
              "Decode targets: " + ", ".join(f"{k}: {v}" for k, v in report["decode_targets"].items()), ""]
    return "\n".join(lines)


def time_attention(inputs: dict, query_len: int, repeats: int) -> dict[str, float]:
    """Median ms of each CPU backend's attention on one workload, and its max error vs the reference."""
    args, static = paged_call(inputs, query_len)
    fns = {"xla_reference": ragged_paged_attention_reference, "xla": chunked_paged_attention}
    jitted = {name: jax.jit(functools.partial(fn, **static)) for name, fn in fns.items()}
    expected = jitted["xla_reference"](*args)
    rows = {name: time_against(fn, args, expected, repeats, warmup=1) for name, fn in jitted.items()}
    return {name: row["median_s"] * 1e3 for name, row in rows.items()} | {
        "max_abs_err": rows["xla"]["max_abs_err_vs_xla"]}


def cpu_sweep(cfg: AttentionBenchConfig) -> list[dict]:
    """xla_reference vs xla: attention alone and the whole model, prefill lengths and one decode batch."""
    config = model_config(cfg.sweep_model)
    model_heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    lens = [int(n) for n in cfg.sweep_prefill_lens]
    batch, context, repeats, bs = (cfg.sweep_decode_batch, cfg.sweep_decode_context, cfg.sweep_repeats,
                                   cfg.block_size)
    key = jax.random.key(0)
    rows = []

    def add(section, tokens, times, extra=""):
        rows.append({"section": section, "tokens": tokens, "shape": extra, **times})
        print(rows[-1], flush=True)

    for n in lens:
        add("attention prefill", n, time_attention(make_paged_inputs(cfg, 1, n, n, key, model_heads), n, repeats),
            f"1 seq, {model_heads[0]}/{model_heads[1]} heads x {model_heads[2]}")
    table = 1 << (cdiv(context, bs) - 1).bit_length()  # the step's power-of-two table bucket
    add("attention decode", batch, time_attention(make_paged_inputs(cfg, batch, context, 1, key, table_blocks=table),
                                                  1, repeats),
        f"{batch} x {context} ctx, {cfg.num_q_heads}/{cfg.num_kv_heads} heads x {cfg.head_dim}")

    decode, prefills, num_blocks = hand_built_steps(batch, context, lens, 256, bs, np.random.default_rng(0))
    model = init_model(config)
    runners = {b: ModelRunner(model, num_blocks=num_blocks, block_size=bs, backend=AttentionBackend(b))
               for b in CPU_BACKENDS}
    # The backends alternate per workload, so a change in the machine's load hits both alike.
    model_rows = {n: {b: median_step_seconds(runners[b], prefills[n], repeats) * 1e3 for b in CPU_BACKENDS}
                  for n in lens}
    decode_row = {b: median_step_seconds(runners[b], decode, repeats) * 1e3 for b in CPU_BACKENDS}
    for n in lens:
        add("model prefill", n, model_rows[n], config.name)
    add("model decode", batch, decode_row, f"{config.name}, {batch} x {context} ctx")
    for row in rows:
        row["speedup"] = row["xla_reference"] / row["xla"]
        for backend in CPU_BACKENDS:
            row[f"{backend}_tokens_per_s"] = row["tokens"] / row[backend] * 1e3
    return rows


def sweep_markdown(report: dict) -> str:
    """The sweep as a Markdown table, plus each backend's long-over-short prefill throughput."""
    lines = heading("CPU attention backends", report)
    rows = [[r["section"], r["tokens"], r["shape"], f"{r['xla_reference']:.1f}", f"{r['xla']:.1f}",
             f"{r['speedup']:.1f}x",
             f"{r['xla_reference_tokens_per_s']:.0f}", f"{r['xla_tokens_per_s']:.0f}",
             format(r["max_abs_err"], ".1e") if "max_abs_err" in r else ""] for r in report["results"]]
    lines += [markdown_table(["section", "tokens", "shape", "xla_reference ms", "xla ms", "speedup",
                              "xla_reference tok/s", "xla tok/s", "max abs err"], rows, align="l" * 9), "",
              "Whole-model prefill tokens/s, longest over shortest length: "
              + ", ".join(f"{k}: {v:.2f}" for k, v in report["long_over_short_prefill"].items()), ""]
    return "\n".join(lines)


def _plain(report: dict) -> dict:
    """The report with numpy / JAX scalars as floats (what JSON takes)."""
    return json.loads(json.dumps(report, default=float))


def attention_report(cfg: AttentionBenchConfig) -> tuple[dict, str]:
    """The kernels against the XLA paths (decode, then prefill when ``cfg.prefill_batch``), with the decode
    targets: the report and its Markdown."""
    key = jax.random.key(0)
    results = benchmark_phase(cfg, "decode", cfg.batch, 1, key)
    if cfg.prefill_batch > 0:
        results += benchmark_phase(cfg, "prefill", cfg.prefill_batch, cfg.prefill_chunk, jax.random.fold_in(key, 1))
    report = {"machine": machine(), "config": dataclasses.asdict(cfg), "results": results,
              "decode_targets": decode_targets(results)}
    return _plain(report), markdown(report)


def cpu_sweep_report(cfg: AttentionBenchConfig) -> tuple[dict, str]:
    """`cpu_sweep` with the machine, its settings and each backend's whole-model prefill tokens/s at the longest
    length over the shortest: the report and its Markdown."""
    results = cpu_sweep(cfg)
    prefill = sorted((r for r in results if r["section"] == "model prefill"), key=lambda r: r["tokens"])
    report = {"machine": machine(), "config": dataclasses.asdict(cfg), "results": results,
              "long_over_short_prefill": {b: prefill[-1][f"{b}_tokens_per_s"] / prefill[0][f"{b}_tokens_per_s"]
                                          for b in CPU_BACKENDS}}
    return _plain(report), sweep_markdown(report)
