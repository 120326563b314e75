"""``jaxpaged bench throughput``: jaxpaged and Hugging Face transformers on the same weights and prompts.

`run_throughput` prepares the checkpoint and prompts, builds and warms up each
backend, measures them ``repeats`` times interleaved, then (``gemm_floor``)
times the model's weight GEMMs so each pass can be held to its floor
(`throughput_floor`); `throughput_report` renders the result.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from absl import logging

from jaxpaged.bench.offline.throughput import (
    EngineLimits,
    HFBackend,
    JaxpagedBackend,
    PromptSpec,
    hf_checkpoint,
    make_prompts,
)
from jaxpaged.bench.offline.throughput_floor import measure_gemm_floor
from jaxpaged.bench.offline.throughput_report import throughput_result, throughput_table

BACKENDS = ("jaxpaged", "hf", "vllm")  # --backend takes a comma-separated list of these, or "both" (jaxpaged,hf)


@dataclasses.dataclass(frozen=True)
class ThroughputRun:
    """Which backends run, how each generates, how often they are measured, and whether the GEMM floor is timed."""

    backend: str = "both"  # comma-separated BACKENDS, or both (= jaxpaged,hf)
    temperature: float = 0.0
    repeats: int = 1
    limits: EngineLimits = EngineLimits()
    hf_batch_size: int | None = None  # None: every prompt in one static batch
    hf_threads: int = 2
    gemm_floor: bool = True
    dtype: str | None = None  # weights and activations of every backend (None: the checkpoint's)
    vllm_python: str | None = None  # the Python of a vLLM install (vllm backend)
    vllm_threads_bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND (None: every core)

    def __post_init__(self) -> None:
        """Refuse an unknown backend, and vllm without its Python."""
        unknown = [name for name in self.backends if name not in BACKENDS]
        if unknown or not self.backends:
            raise ValueError(f"backend must be a comma-separated list of {BACKENDS} or 'both', got {self.backend!r}")
        if "vllm" in self.backends and not self.vllm_python:
            raise ValueError("the vllm backend needs vllm_python: the Python of a vLLM install (--vllm_python)")

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends to measure, jaxpaged first."""
        names = ("jaxpaged", "hf") if self.backend == "both" else tuple(n.strip() for n in self.backend.split(","))
        return tuple(sorted(set(names), key=lambda n: BACKENDS.index(n) if n in BACKENDS else -1))


def build_backends(run: ThroughputRun, checkpoint: Path, prompts: list[list[int]], spec: PromptSpec) -> list:
    """The backends to measure, each built and warmed up, jaxpaged first.

    With ``backend="both"`` and the `hf` extra missing, hf is left out with one
    line on stderr; with ``backend="hf"`` the `HFBackendMissing` is raised.
    """
    from jaxpaged.bench.offline.hf_backend import HFBackendMissing
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
                                    dtype=run.dtype or "auto", threads_bind=run.vllm_threads_bind, **common))
    if "jaxpaged" in run.backends:
        backends.insert(0, JaxpagedBackend(checkpoint, prompts, limits=run.limits, dtype=run.dtype, **common))
    for backend in backends:
        logging.info("%s: loaded in %.1f s, warm-up %.1f s", backend.name, backend.load_s, backend.warmup_s)
    return backends


def run_throughput(run: ThroughputRun, model: str, checkpoint_dir: str | Path, spec: PromptSpec,
                   settings: Mapping = ()) -> tuple[dict, str]:
    """Measure every backend ``run.repeats`` times on ``spec``'s prompts: the result (``settings`` merged in) and
    its table.

    ``model`` is a Hugging Face checkpoint directory or a shipped config saved
    once under ``checkpoint_dir`` (random weights from ``spec.seed``). The
    result names the date and the load average before and after (the machine
    may be shared).
    """
    started = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_average_start": os.getloadavg()}
    checkpoint = hf_checkpoint(model, checkpoint_dir, seed=spec.seed)
    from jaxpaged.checkpoint import read_hf_config
    prompts = make_prompts(spec, read_hf_config(checkpoint).vocab_size)
    backends = build_backends(run, checkpoint, prompts, spec)
    runs = {b.name: [] for b in backends}
    try:
        for repeat in range(run.repeats):
            for backend in backends:
                runs[backend.name].append(backend.measure())
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
        logging.info("weight GEMMs: %.0f GFLOP/s at %d rows, %.0f GFLOP/s at %d rows",
                     floor.prefill_flops_per_s / 1e9, floor.prefill_rows,
                     floor.decode_flops_per_s / 1e9, floor.decode_rows)
    result = throughput_result(runs, prompts, floor)
    meta = started | {"load_average_end": os.getloadavg(), "checkpoint": str(checkpoint)} | dict(settings)
    return meta | result, throughput_table(result)
