"""Attention kernels over a paged KV pool, importable without the rest of jaxpaged.

Each kernel is a pure function with its shapes in the docstring; its pure-JAX
reference lives beside it (`reference.py`) and the tests compare the two.
"""

from pallas_kernels.ragged_paged_attention import ragged_paged_attention
from pallas_kernels.reference import ragged_paged_attention_reference

__all__ = ["ragged_paged_attention", "ragged_paged_attention_reference"]
