"""Offline throughput of jaxpaged and Hugging Face transformers on the same weights and prompts.

    jaxpaged bench throughput --backend=both --model=llama-100m --num_prompts=64 \
        --input_len=256 --prefix_len=64 --output_len=64 --repeats=3 \
        --json_out=out/bench_throughput.json --md_out=out/bench_throughput.md

The counterpart of vLLM's `benchmark_throughput --backend=vllm|hf`, with jaxpaged beside either:
every prompt is sent at once and generates exactly `--output_len` tokens (EOS
ignored); requests/s, output tokens/s and total tokens/s are of the measured
pass alone (compile and warm-up are reported apart). `--backend=both` runs
jaxpaged and hf in one process, interleaved over `--repeats`, and reports
medians and the jaxpaged/peer ratios. `--backend=jaxpaged,vllm
--vllm_python=PATH` runs vLLM from its own install in a subprocess, given every
core (jaxpaged/bench/offline/vllm_backend.py). `--model` is a Hugging Face checkpoint directory, or a
shipped config saved once as one under `--checkpoint_dir` (random weights from
`--seed`). The hf backend needs the `hf` extra (torch + transformers); without
it `--backend=hf` exits with one line saying so and `both` runs jaxpaged alone.

After the passes (`--gemm_floor`, default on) the model's weight GEMMs are timed
at a prefill-sized and a decode-sized row count, and each pass is held to its
weight-GEMM floor: the time its rows' GEMMs alone would take at those rates
(jaxpaged/bench/offline/throughput.py). `hf elapsed / jaxpaged floor` is the
largest jaxpaged/hf ratio this machine allows on the workload.

The work is `jaxpaged.bench.offline.throughput`.
"""

from __future__ import annotations

import os
import sys

from jaxpaged import compile_cache
from jaxpaged.bench.offline.hf_backend import HFBackendMissing
from jaxpaged.bench.offline.throughput import EngineLimits, PromptSpec
from jaxpaged.bench.offline.throughput import BACKENDS, ThroughputRun, run_throughput
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
BACKEND = FLAGS.DEFINE_string("backend", "both",
                              "comma-separated backends measured side by side, passes alternating: jaxpaged, hf "
                              "(transformers on torch CPU), vllm (a vLLM install, --vllm_python); both = jaxpaged,hf")
VLLM_PYTHON = FLAGS.DEFINE_string("vllm_python", None, "vllm: the Python of a vLLM install (its own venv: vLLM's "
                                  "CPU build wants its own torch); run as a subprocess on the same checkpoint")
VLLM_THREADS_BIND = FLAGS.DEFINE_string("vllm_threads_bind", None, "vllm: VLLM_CPU_OMP_THREADS_BIND (default: every "
                                        "core, e.g. 0-1, with no core reserved for vLLM's front end)")
SHARED = EngineFlags(FLAGS, ["model", "compile_cache_dir"], defaults={"model": "tiny"})
MODEL, COMPILE_CACHE = SHARED.holders["model"], SHARED.holders["compile_cache_dir"]
CHECKPOINT_DIR = FLAGS.DEFINE_string("checkpoint_dir", "out/hf-checkpoints",
                                     "where a config's random weights are saved as a Hugging Face checkpoint")
NUM_PROMPTS = FLAGS.DEFINE_integer("num_prompts", 64, "prompts, all sent at once")
INPUT_LEN = FLAGS.DEFINE_integer("input_len", 256, "tokens per prompt")
PREFIX_LEN = FLAGS.DEFINE_integer("prefix_len", 64, "leading tokens every prompt shares (0 = all random)")
OUTPUT_LEN = FLAGS.DEFINE_integer("output_len", 64, "tokens generated per prompt (EOS ignored)")
TEMPERATURE = FLAGS.DEFINE_float("temperature", 0.0, "0 = greedy; otherwise plain sampling at this temperature")
SEED = FLAGS.DEFINE_integer("seed", 0, "prompt, weight and sampling seed")
REPEATS = FLAGS.DEFINE_integer("repeats", 1, "measured passes per backend, interleaved; medians reported")
# the jaxpaged engine's knobs (num_blocks unset: room for every prompt at once)
ENGINE = EngineFlags(FLAGS, ["block_size", "max_num_seqs", "max_num_batched_tokens", "num_blocks",
                             "enable_prefix_caching"], defaults={"max_num_batched_tokens": 2048})
DTYPE = EngineFlags(FLAGS, ["dtype"]).holders["dtype"]  # jaxpaged's and vLLM's (hf stays float32)
HF_BATCH_SIZE = FLAGS.DEFINE_integer("hf_batch_size", None, "hf: prompts per static batch (default: all)")
HF_THREADS = FLAGS.DEFINE_integer("hf_threads", 2, "hf: torch.set_num_threads")
GEMM_FLOOR = FLAGS.DEFINE_boolean("gemm_floor", True, "time the model's weight GEMMs at prefill and decode sizes and "
                                  "report each pass's weight-GEMM floor (jaxpaged/bench/offline/throughput.py)")
OUT = OutputFlags(FLAGS)

FLAGS.positive("num_prompts", "input_len", "output_len", "repeats", "hf_batch_size", "hf_threads")
FLAGS.non_negative("prefix_len", "temperature", "seed")
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


def _settings(spec: PromptSpec) -> dict:
    """The flags that shape the run, for the JSON."""
    return {"model": MODEL.value, "backend": BACKEND.value, "num_prompts": spec.num_prompts,
            "input_len": spec.input_len, "prefix_len": spec.prefix_len, "output_len": spec.output_len,
            "temperature": TEMPERATURE.value, "seed": SEED.value, "repeats": REPEATS.value, "dtype": DTYPE.value,
            "hf_threads": HF_THREADS.value, "hf_batch_size": HF_BATCH_SIZE.value or spec.num_prompts,
            "jaxpaged": ENGINE.kwargs()}


def main(argv):
    """Prepare the checkpoint and prompts, measure each backend `--repeats` times, print and write the results."""
    del argv
    compile_cache.configure(COMPILE_CACHE.value)  # '' = off: the engine's "auto" then keeps it off
    spec = PromptSpec(NUM_PROMPTS.value, INPUT_LEN.value, PREFIX_LEN.value, OUTPUT_LEN.value, SEED.value)
    run = ThroughputRun(backend=BACKEND.value, temperature=TEMPERATURE.value, repeats=REPEATS.value,
                        limits=EngineLimits(**ENGINE.kwargs()), hf_batch_size=HF_BATCH_SIZE.value,
                        hf_threads=HF_THREADS.value, gemm_floor=GEMM_FLOOR.value, dtype=DTYPE.value,
                        vllm_python=VLLM_PYTHON.value, vllm_threads_bind=VLLM_THREADS_BIND.value)
    try:
        result, table = run_throughput(run, MODEL.value, CHECKPOINT_DIR.value, spec, _settings(spec))
    except HFBackendMissing as err:
        print(f"cannot run --backend=hf: {err}", file=sys.stderr)
        sys.exit(2)
    OUT.write(result, table)
