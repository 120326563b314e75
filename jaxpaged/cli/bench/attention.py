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

import dataclasses

from jaxpaged.bench.offline.attention import AttentionBenchConfig, attention_report, cpu_sweep_report
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
FLAGS.DEFINE_integer("batch", 64, "Decode sequences.")
FLAGS.DEFINE_integer("context_len", 8192, "Tokens of context per sequence.")
FLAGS.DEFINE_integer("num_q_heads", 32, "Query heads (Llama-3-8B: 32).")
FLAGS.DEFINE_integer("num_kv_heads", 8, "KV heads (Llama-3-8B: 8).")
FLAGS.DEFINE_integer("head_dim", 128, "Head dimension (Llama-3-8B: 128).")
EngineFlags(FLAGS, ["block_size"])
FLAGS.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32", "float8_e4m3fn"], "K/V pool dtype.")
FLAGS.DEFINE_integer("prefill_batch", 4, "Prefill chunks (0 skips prefill).")
FLAGS.DEFINE_integer("prefill_chunk", 512, "Queries per prefill chunk.")
FLAGS.DEFINE_integer("repeats", 20, "Timed calls per implementation.")
FLAGS.DEFINE_integer("warmup", 2, "Untimed calls before timing (the first compiles).")
FLAGS.DEFINE_bool("backend_interpret", False, "Run the Pallas kernel in interpret mode (CPU smoke test).")
FLAGS.DEFINE_bool("cpu_sweep", False, "Measure xla_reference vs the chunked xla backend instead (see above).")
FLAGS.DEFINE_list("sweep_prefill_lens", ["512", "1024", "2048", "4096"], "Prefill lengths of --cpu_sweep.")
FLAGS.DEFINE_string("sweep_model", "small", "Model whose heads and whole step --cpu_sweep times.")
FLAGS.DEFINE_integer("sweep_decode_batch", 64, "Decode sequences of --cpu_sweep.")
FLAGS.DEFINE_integer("sweep_decode_context", 320, "Context tokens of each --cpu_sweep decode.")
FLAGS.DEFINE_integer("sweep_repeats", 3, "Timed calls per --cpu_sweep measurement (median).")
OUT = OutputFlags(FLAGS)
FLAGS.positive("batch", "context_len", "num_q_heads", "num_kv_heads", "head_dim",
                     "prefill_chunk", "repeats")
FLAGS.non_negative("prefill_batch", "warmup")
FLAGS.positive("sweep_decode_batch", "sweep_decode_context", "sweep_repeats")
FLAGS.list_of("sweep_prefill_lens", integer_at_least=1)
FLAGS.model_name("sweep_model")


def main(argv):
    """Run the GPU comparison (or --cpu_sweep); print and write the report."""
    del argv
    cfg = AttentionBenchConfig(**{f.name: _value(f.name) for f in dataclasses.fields(AttentionBenchConfig)})
    OUT.write(*(cpu_sweep_report(cfg) if FLAGS.cpu_sweep else attention_report(cfg)))


def _value(name: str):
    value = FLAGS[name].value
    return tuple(int(v) for v in value) if name == "sweep_prefill_lens" else value
