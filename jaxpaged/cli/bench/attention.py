"""Benchmark paged attention: the Pallas kernels beside the XLA gather and the chunked XLA backend.

Decode (`--batch` sequences of `--context_len` tokens, one query each) and a chunked prefill
(`--prefill_batch` chunks of `--prefill_chunk` queries at the end of such contexts): the median of
`--repeats` calls after `--warmup`, and the K/V bytes read over that time against the GPU's peak HBM
bandwidth (n/a off H100/H200). Implementations: `pallas` (Triton) and `pallas_mosaic` (Mosaic GPU; on CPU
both only with --backend_interpret), `xla_gather` (pallas_kernels/reference.py), `xla_chunked`
(pallas_kernels/chunked_xla.py). `--cpu_sweep` times the CPU backends instead, attention alone and the
whole model's step (docs/benchmarks/kernels.md):

  jaxpaged bench attention --cpu_sweep --num_q_heads=12 --num_kv_heads=4 --head_dim=64 --dtype=float32

CPU smoke test:
  jaxpaged bench attention --batch=2 --context_len=256 --num_q_heads=4 \
      --num_kv_heads=2 --head_dim=32 --prefill_chunk=16 --repeats=3 --backend_interpret
"""

from __future__ import annotations

from jaxpaged.bench.offline.attention import AttentionBenchConfig, attention_report, cpu_sweep_report
from jaxpaged.cli.options import CommandFlags

COMMAND = CommandFlags(AttentionBenchConfig, engine=["block_size"])
FLAGS = COMMAND.flags


def main(argv):
    """Run the GPU comparison (or --cpu_sweep); print and write the report."""
    del argv
    cfg = COMMAND.options(block_size=COMMAND.engine_value("block_size"))
    COMMAND.out.write(*(cpu_sweep_report(cfg) if cfg.cpu_sweep else attention_report(cfg)))
