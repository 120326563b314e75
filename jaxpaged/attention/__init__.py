"""Attention backends over the paged pool: `xla` (chunked, CPU default), `xla_reference` and `pallas` (GPU)."""

from jaxpaged.attention.backend import AttentionBackend, paged_attention, resolve_backend, write_and_attend
from jaxpaged.attention.batch import AttentionBatch, StepLayout

__all__ = ["AttentionBackend", "AttentionBatch", "StepLayout", "paged_attention", "resolve_backend",
           "write_and_attend"]
