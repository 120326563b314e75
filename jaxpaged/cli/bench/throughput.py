"""Offline throughput of jaxpaged beside Hugging Face transformers and/or vLLM, on the same weights and prompts.

    jaxpaged bench throughput --backend=both --model=llama-100m --num_prompts=64 \
        --input_len=256 --prefix_len=64 --output_len=64 --repeats=3 \
        --json_out=out/bench_throughput.json --md_out=out/bench_throughput.md

vLLM's `benchmark_throughput`: every prompt sent at once, exactly `--output_len` tokens each (EOS ignored);
requests/s and tokens/s of the measured passes alone, the backends' passes interleaved over `--repeats`,
medians and jaxpaged/peer ratios. `--backend=jaxpaged,vllm --vllm_python=PATH` runs a vLLM install in a
subprocess; `hf` needs the `hf` extra (without it `both` runs jaxpaged alone). `--model` is a Hugging Face
checkpoint directory, or a config saved once as one under `--checkpoint_dir`. `--gemm_floor` holds each pass
to the time its weight GEMMs alone would take. docs/benchmarks/throughput.md and cpu-performance.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from jaxpaged import compile_cache
from jaxpaged.bench.offline.hf_backend import HFBackendMissing
from jaxpaged.bench.offline.backend_run import EngineLimits
from jaxpaged.bench.offline.throughput import BACKENDS, PromptSpec, ThroughputRun, run_throughput
from jaxpaged.cli.options import CommandFlags

# the jaxpaged engine's knobs (num_blocks unset: room for every prompt at once); dtype: jaxpaged's and vLLM's
# (hf stays float32)
LIMITS = [f.name for f in dataclasses.fields(EngineLimits)]
COMMAND = CommandFlags(ThroughputRun, PromptSpec, engine=["model", "compile_cache_dir", *LIMITS, "dtype"],
                       engine_defaults={"model": "tiny", "max_num_batched_tokens": 2048})
FLAGS = COMMAND.flags
CHECKPOINT_DIR = FLAGS.DEFINE_string("checkpoint_dir", "out/hf-checkpoints",
                                     "where a config's random weights are saved as a Hugging Face checkpoint")

FLAGS.register_validator("backend", lambda v: v == "both" or all(
    n.strip() in BACKENDS for n in v.split(",")), message=f"--backend must list some of {BACKENDS}, or be both")
FLAGS.register_validator("vllm_python", lambda v: v is None or os.path.exists(v),
                         message="--vllm_python must be the path of an existing Python (a vLLM install's)")
FLAGS.register_multi_flags_validator(
    ["backend", "vllm_python"], lambda f: "vllm" not in f["backend"] or f["vllm_python"],
    message="--backend=vllm needs --vllm_python=PATH: the Python of a vLLM install")
FLAGS.register_multi_flags_validator(
    ["prefix_len", "input_len"], lambda f: f["prefix_len"] < f["input_len"],
    message="--prefix_len must be less than --input_len (every prompt needs a token of its own)")
FLAGS.register_multi_flags_validator(
    ["first_token_pass", "output_len"], lambda f: not f["first_token_pass"] or f["output_len"] >= 2,
    message="--first_token_pass needs --output_len >= 2 (a token after the first to time)")


def main(argv):
    """Prepare the checkpoint and prompts, measure each backend `--repeats` times, print and write the results."""
    del argv
    engine = COMMAND.engine.kwargs()
    compile_cache.configure(engine["compile_cache_dir"])  # '' = off: the engine's "auto" then keeps it off
    limits = EngineLimits(**{name: engine[name] for name in LIMITS})
    spec, run = COMMAND.options(PromptSpec), COMMAND.options(ThroughputRun, limits=limits, dtype=engine["dtype"])
    try:
        result, table = run_throughput(run, engine["model"], CHECKPOINT_DIR.value, spec)
    except HFBackendMissing as err:
        print(f"cannot run --backend=hf: {err}", file=sys.stderr)
        sys.exit(2)
    COMMAND.out.write(result, table)
