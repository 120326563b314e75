"""Benchmark paged attention: the Pallas kernel beside the XLA gather, dense attention and JAX's kernel.

Decode (one query per sequence, `--batch` sequences of `--context_len` tokens) and a
chunked prefill (`--prefill_batch` chunks of `--prefill_chunk` queries at the end of
`--context_len`-token contexts), timed as the median of `--repeats` calls after a
warm-up, each ended by `block_until_ready`. Achieved bandwidth is the K/V bytes the
attention must read (every context token, K and V, once) over the median time,
against the device's peak HBM bandwidth (n/a off H100/H200).

Implementations, measured in one run:
  pallas       pallas_kernels.ragged_paged_attention, Triton (on CPU only with --backend_interpret)
  pallas_mosaic pallas_kernels.ragged_paged_attention_mgpu, Mosaic GPU / Hopper (on CPU only with
               --backend_interpret: Mosaic GPU interpret mode)
  xla_gather   pallas_kernels.reference (gathers the block table's pages, then einsum)
  xla_chunked  pallas_kernels.chunked_xla (online softmax over key chunks; the CPU backend)
  dense        attention over a contiguous `[batch, kv_heads, context, head_dim]` cache
  jax_bundled  jax.experimental.pallas.ops.gpu.paged_attention, decode on GPU only

`--cpu_sweep` measures the CPU backends instead (the gather reference, the
backend `xla_reference`, beside the chunked one, `xla`): attention alone for a
one-sequence prefill of each `--sweep_prefill_lens` (the `--sweep_model`'s heads)
and a `--sweep_decode_batch` x `--sweep_decode_context` decode (the heads from
--num_q_heads etc.), then the whole model's prefill step at the same lengths and
its decode step, through `ModelRunner` with each backend:

  jaxpaged bench attention --cpu_sweep --num_q_heads=12 --num_kv_heads=4 \
      --head_dim=64 --dtype=float32 --md_out=/tmp/sweep.md

CPU smoke test:
  jaxpaged bench attention --batch=2 --context_len=256 --num_q_heads=4 \
      --num_kv_heads=2 --head_dim=32 --prefill_chunk=16 --repeats=3 --backend_interpret
"""

from __future__ import annotations

from jaxpaged.bench.offline.attention import AttentionBenchConfig, attention_report, cpu_sweep_report
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.options import OptionFlags
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
OPTIONS = OptionFlags(FLAGS, AttentionBenchConfig)
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
OUT = OutputFlags(FLAGS)


def main(argv):
    """Run the GPU comparison (or --cpu_sweep); print and write the report."""
    del argv
    cfg = OPTIONS.options(block_size=BLOCK_SIZE.value)
    OUT.write(*(cpu_sweep_report(cfg) if cfg.cpu_sweep else attention_report(cfg)))
