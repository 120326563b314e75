"""The GEMM floor of an offline throughput pass: its time if nothing but its weight GEMMs took any.

A pass pushes some rows through the decoder stack and some through the LM head,
and each row costs the same weight-GEMM FLOPs in any engine
(`matmul_floor.weight_flops_per_row`). The floor is those FLOPs at the FLOP/s
this machine reaches on the model's own weight GEMMs: prompt rows at the rate
of a prefill-sized GEMM, generated rows at the rate of a decode-sized one. Both
backends are held to the same rates, so

- `elapsed / floor` is how far a pass is from its weight GEMMs (attention,
  gathers, padding, host work and slower kernels make up the rest), and
- `hf elapsed / jaxpaged floor` is the largest jaxpaged/hf ratio this machine
  allows on the workload: a jaxpaged pass that were nothing but GEMMs at full
  speed would not go past it.

Rows counted: the prompt tokens a backend computes (jaxpaged skips prefix-cache
hits; transformers computes every prompt token), every generated token except
each request's last (sampled, never fed back), and one LM-head row per
generated token (both compute logits only where they sample). Attention FLOPs
are left out, so the floor is a lower bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jaxpaged.bench.offline.matmul_floor import gemm_flops_per_second, weight_flops_per_row
from jaxpaged.model import DecoderModel


@dataclasses.dataclass(frozen=True)
class GemmFloor:
    """Per-row weight FLOPs of one model and the FLOP/s this machine reaches at prefill and decode GEMM sizes."""

    layer_flops_per_row: int
    head_flops_per_row: int
    prefill_rows: int
    prefill_flops_per_s: float
    decode_rows: int
    decode_flops_per_s: float

    def seconds(self, summary: Mapping[str, float]) -> float:
        """The floor of one pass, from its `summarize` dict (needs prompt_tokens_computed, output_tokens,
        num_requests)."""
        fed_back = summary["output_tokens"] - summary["num_requests"]
        prefill = summary["prompt_tokens_computed"] * self.layer_flops_per_row / self.prefill_flops_per_s
        decode = (fed_back * self.layer_flops_per_row
                  + summary["output_tokens"] * self.head_flops_per_row) / self.decode_flops_per_s
        return prefill + decode


def measure_gemm_floor(model: DecoderModel, prefill_rows: int, decode_rows: int, repeats: int = 3) -> GemmFloor:
    """Time the model's weight GEMMs at `prefill_rows` and at `decode_rows` rows on this machine."""
    if prefill_rows < 1 or decode_rows < 1:
        raise ValueError(f"prefill_rows and decode_rows must be at least 1, got {prefill_rows}, {decode_rows}")
    layer, head = weight_flops_per_row(model)
    return GemmFloor(layer, head, prefill_rows, gemm_flops_per_second(model, prefill_rows, repeats),
                     decode_rows, gemm_flops_per_second(model, decode_rows, repeats))
