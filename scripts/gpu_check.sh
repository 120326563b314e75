#!/usr/bin/env bash
# One prepared GPU check for the Pallas paged-attention kernel (issue 5), under 5 minutes.
#
#   scripts/gpu_check.sh OUTDIR
#
# Run from the repository root on a GPU machine with no network and no .venv: it uses
# the `python3` that has jax (override with PYTHON=...). It
#   1. records the machine (nvidia-smi, jax devices),
#   2. runs tests/kernels compiled (JAXPAGED_PALLAS_INTERPRET=0), JUnit XML + log,
#   3. benchmarks decode at batch 64 x 8K context, Llama-3-8B heads, bf16 (plus a
#      4 x 512-token prefill chunk), writing OUTDIR/bench_attention.{json,md}.
# Stages are time-boxed; a failing stage is recorded and the next one still runs.
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JAXPAGED_PALLAS_INTERPRET=0
export XLA_PYTHON_CLIENT_PREALLOCATE=false
SUMMARY="$OUTDIR/summary.txt"
: >"$SUMMARY"

log() { echo "$*" | tee -a "$SUMMARY"; }

# jaxtyping only annotates; if the machine lacks it, a stub keeps the imports working.
if ! "$PYTHON" -c "import jaxtyping" 2>/dev/null; then
  STUBS=$(mktemp -d)
  mkdir -p "$STUBS/jaxtyping"
  cat >"$STUBS/jaxtyping/__init__.py" <<'EOF'
"""Stub for machines without jaxtyping: `Float[Array, "..."]` is just `Any`."""
from typing import Any


class _Subscriptable:
    def __getitem__(self, item):
        return Any


Array = Any
Float = Int = Bool = Shaped = Num = _Subscriptable()
EOF
  export PYTHONPATH="$PYTHONPATH:$STUBS"
  log "note: jaxtyping missing, using a stub"
fi

log "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$SUMMARY"
"$PYTHON" -c "import jax, sys; print('python', sys.version.split()[0], 'jax', jax.__version__, jax.devices())" 2>&1 | tee -a "$SUMMARY"

log "== kernel tests, compiled"
if "$PYTHON" -c "import pytest" 2>/dev/null; then
  timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels \
    --junitxml="$OUTDIR/kernel_tests.xml" >"$OUTDIR/kernel_tests.log" 2>&1
  log "pytest exit code: $?"
  tail -n 5 "$OUTDIR/kernel_tests.log" | tee -a "$SUMMARY"
else
  log "pytest missing: tests skipped (the benchmark still checks the kernel against the XLA reference)"
fi

log "== benchmark: decode 64 x 8K, Llama-3-8B heads, bf16"
if "$PYTHON" -c "import absl" 2>/dev/null; then
  timeout 120 "$PYTHON" scripts/bench_attention.py --batch=64 --context_len=8192 --num_q_heads=32 \
    --num_kv_heads=8 --head_dim=128 --block_size=16 --dtype=bfloat16 --repeats=20 \
    --prefill_batch=4 --prefill_chunk=512 \
    --json_out="$OUTDIR/bench_attention.json" --md_out="$OUTDIR/bench_attention.md" \
    >"$OUTDIR/bench_attention.log" 2>&1
  log "bench exit code: $?"
  cat "$OUTDIR/bench_attention.md" 2>/dev/null | tee -a "$SUMMARY" >/dev/null
else
  log "absl-py missing: benchmark skipped"
fi
log "== done; reports in $OUTDIR"
