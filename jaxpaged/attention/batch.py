"""What attention needs to know about one step's batch, as device arrays plus a static layout.

Token rows are grouped: the first `num_decode_seqs` sequences are decodes (one
row each, rows `0 .. num_decode_seqs`), the rest are prefill chunks packed
raggedly after them. Splitting the two lets the XLA backend tile decodes as
`[S, 1]` and prefills as `[S, max_prefill_query_len]` instead of padding every
sequence to the longest chunk.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jaxtyping import Array, Int


class AttentionBatch(NamedTuple):
    """Per-step attention metadata (device arrays, padded to bucket sizes).

    With several KV cache groups, `slot_mapping` and `block_tables` have a
    leading group axis (`[G, T]`, `[G, S, M]`) and each layer reads its group's
    slice (`for_group`); a single group keeps them 2-D and 1-D, as before.
    """

    slot_mapping: Int[Array, "T"] | Int[Array, "G T"]  # flat pool slot of each new token; -1 = padding
    block_tables: Int[Array, "S M"] | Int[Array, "G S M"]  # physical block of each logical block
    context_lens: Int[Array, "S"]  # tokens in context after this step; 0 = padding seq
    query_start: Int[Array, "S"]  # first row of each sequence's queries
    query_lens: Int[Array, "S"]  # rows of each sequence this step; 0 = padding seq

    def for_group(self, group: int) -> "AttentionBatch":
        """The batch as one KV cache group's layers see it (itself when there is one group)."""
        if self.block_tables.ndim == 2:
            return self
        return self._replace(slot_mapping=self.slot_mapping[group], block_tables=self.block_tables[group])


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """Static (compile-time) facts about a step's shapes beyond the array shapes."""

    num_decode_seqs: int  # sequences [0, n) are single-row decodes on rows [0, n)
    max_prefill_query_len: int  # bucket bounding every prefill chunk's row count (0: none)
