#!/usr/bin/env bash
# One prepared GPU check of both Pallas paged-attention kernels (Triton and Mosaic GPU), under 8 minutes.
#
#   scripts/gpu_check.sh OUTDIR
#
# Run from the repository root on a GPU machine with no network and no .venv: it uses
# the `python3` that has jax (override with PYTHON=...). It
#   1. records the machine (nvidia-smi, jax devices),
#   2. runs tests/kernels compiled (JAXPAGED_PALLAS_INTERPRET=0) with the Mosaic GPU
#      kernel's whole grid (JAXPAGED_MGPU_FULL_GRID=1), JUnit XML + log,
#   3. benchmarks both kernels beside the XLA paths: decode at batch 64 x 8K context
#      and a 4 x 512-token prefill chunk, Llama-3-8B heads, bf16 then fp8 K/V, with
#      achieved HBM bandwidth as a fraction of peak (OUTDIR/bench_attention_{bf16,fp8}.*),
#   4. runs the engine once (`jaxpaged bench throughput`, random weights with Llama-3-8B layer
#      shapes, 4 of its 32 layers), on the Mosaic kernel if its benchmark rows passed,
#      else on the Triton kernel (OUTDIR/bench_throughput.*).
# Stages are time-boxed; a failing stage is recorded and the next one still runs.
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JAXPAGED_PALLAS_INTERPRET=0
export JAXPAGED_MGPU_FULL_GRID=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
SUMMARY="$OUTDIR/summary.txt"
WORK=$(mktemp -d)
: >"$SUMMARY"

log() { echo "$*" | tee -a "$SUMMARY"; }

# jaxtyping only annotates; if the machine lacks it, a stub keeps the imports working.
if ! "$PYTHON" -c "import jaxtyping" 2>/dev/null; then
  mkdir -p "$WORK/stubs/jaxtyping"
  cat >"$WORK/stubs/jaxtyping/__init__.py" <<'STUB'
"""Stub for machines without jaxtyping: `Float[Array, "..."]` is just `Any`."""
from typing import Any


class _Subscriptable:
    def __getitem__(self, item):
        return Any


Array = Any
Float = Int = Bool = Shaped = Num = _Subscriptable()
STUB
  export PYTHONPATH="$PYTHONPATH:$WORK/stubs"
  log "note: jaxtyping missing, using a stub"
fi

log "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 | tee -a "$SUMMARY"
"$PYTHON" -c "import jax, sys; print('python', sys.version.split()[0], 'jax', jax.__version__, jax.devices())" 2>&1 | tee -a "$SUMMARY"

log "== kernel tests, compiled (Triton and Mosaic GPU)"
if "$PYTHON" -c "import pytest" 2>/dev/null; then
  timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels \
    --junitxml="$OUTDIR/kernel_tests.xml" >"$OUTDIR/kernel_tests.log" 2>&1
  log "pytest exit code: $?"
  tail -n 8 "$OUTDIR/kernel_tests.log" | tee -a "$SUMMARY"
else
  log "pytest missing: tests skipped (the benchmark still checks both kernels against the XLA reference)"
fi

if "$PYTHON" -c "import absl" 2>/dev/null; then
  for dtype in bfloat16 float8_e4m3fn; do
    tag=$([ "$dtype" = bfloat16 ] && echo bf16 || echo fp8)
    log "== benchmark: decode 64 x 8K + prefill 4 x 512, Llama-3-8B heads, $tag K/V"
    timeout 80 "$PYTHON" -m jaxpaged bench attention --batch=64 --context_len=8192 --num_q_heads=32 \
      --num_kv_heads=8 --head_dim=128 --block_size=16 --dtype="$dtype" --repeats=20 \
      --prefill_batch=4 --prefill_chunk=512 \
      --json_out="$OUTDIR/bench_attention_$tag.json" --md_out="$OUTDIR/bench_attention_$tag.md" \
      >"$OUTDIR/bench_attention_$tag.log" 2>&1
    log "bench exit code: $?"
    cat "$OUTDIR/bench_attention_$tag.md" 2>/dev/null | tee -a "$SUMMARY" >/dev/null
  done

  # The engine on the Mosaic kernel only if its decode and prefill rows ran (else Triton).
  if "$PYTHON" - "$OUTDIR/bench_attention_bf16.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
ok = [r for r in rows if r["impl"] == "pallas_mosaic" and "median_s" in r and r["max_abs_err_vs_xla"] < 0.1]
sys.exit(0 if len(ok) == 2 else 1)
PY
  then kernel=mosaic; else kernel=triton; export JAXPAGED_ATTENTION_BACKEND=pallas; fi
  log "== engine: jaxpaged bench throughput, Llama-3-8B layer shapes (4 layers, random weights), $kernel kernel"
  "$PYTHON" - "$WORK/llama3-8b-4l.json" <<'PY'
import json, sys
config = json.load(open("configs/llama3-8b.json"))
config.update(name="llama3-8b-4layers", num_layers=4)
json.dump(config, open(sys.argv[1], "w"))
PY
  timeout 170 "$PYTHON" -m jaxpaged bench throughput --backend=jaxpaged --model="$WORK/llama3-8b-4l.json" \
    --checkpoint_dir="$WORK/checkpoints" --compile_cache_dir="$WORK/jax-cache" --num_prompts=64 \
    --input_len=512 --prefix_len=64 --output_len=64 --max_num_batched_tokens=2048 --gemm_floor=false \
    --json_out="$OUTDIR/bench_throughput.json" --md_out="$OUTDIR/bench_throughput.md" \
    >"$OUTDIR/bench_throughput.log" 2>&1
  log "engine exit code: $? (kernel: $kernel)"
  cat "$OUTDIR/bench_throughput.md" 2>/dev/null | tee -a "$SUMMARY" >/dev/null
else
  log "absl-py missing: benchmarks skipped"
fi
rm -rf "$WORK"
log "== done; reports in $OUTDIR"
