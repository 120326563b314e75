"""Shape buckets: pad step sizes so the step compiles a bounded number of times.

Every distinct padded shape of the step is one XLA compile (seconds on a CPU,
once per process; loaded from the persistent compile cache on a warm start).
Most sizes go to the next power of two. Two are padded further, where the
padding is free or nearly so (measured in docs/BENCHMARKS.md, "Start-up"):

- blocks per sequence: at least `MIN_BLOCKS_PER_SEQ`. Attention loops only
  up to the last key a real query sees, so a wider block table costs its
  int32 entries and nothing else; growing a table from 4 to 8, 16 and 32
  blocks used to compile a new step each time a batch's longest context
  crossed 64, 128 and 256 tokens (block size 16).
- decode rows of a step that prefills: at least one per
  `PREFILL_TOKENS_PER_DECODE_ROW` prefill tokens (at most 1/32 more tokens),
  so the transient steps of a first batch (512 prefill tokens next to 0, 2, 8
  or 16 decodes) share one shape. Padded decode rows have no context: the
  decode attention's loop bound comes from the real rows (none in a pure
  prefill step, which then skips the loop), so they cost only their MLP rows.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.mathutils import next_power_of_two

MIN_PREFILL_TOKENS = 16
MIN_BLOCKS_PER_SEQ = 32
PREFILL_TOKENS_PER_DECODE_ROW = 32


def pow2_bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum); 0 stays 0 (an absent group)."""
    if n <= 0:
        return 0
    return next_power_of_two(max(n, minimum))


@dataclasses.dataclass(frozen=True)
class StepBuckets:
    """Padded sizes of one step: decode rows, prefill rows, prefill tokens, longest chunk, table width."""

    num_decode_rows: int
    num_prefill_rows: int
    num_prefill_tokens: int
    max_prefill_query_len: int
    blocks_per_seq: int

    @property
    def num_tokens(self) -> int:
        """Padded tokens of the step: one per decode row, then the prefill tokens."""
        return self.num_decode_rows + self.num_prefill_tokens

    @property
    def num_rows(self) -> int:
        """Padded sequences of the step (decode rows first)."""
        return self.num_decode_rows + self.num_prefill_rows


def step_buckets(num_decodes: int, num_prefills: int, prefill_tokens: int, max_chunk: int,
                 max_blocks: int) -> StepBuckets:
    """Pad a step's sizes to powers of two (with the minimums above), so it compiles a bounded number of times."""
    t_pre = pow2_bucket(prefill_tokens, MIN_PREFILL_TOKENS)
    decode_rows = pow2_bucket(num_decodes)
    if prefill_tokens:
        decode_rows = max(decode_rows, t_pre // PREFILL_TOKENS_PER_DECODE_ROW)
    return StepBuckets(
        num_decode_rows=decode_rows,
        num_prefill_rows=pow2_bucket(num_prefills),
        num_prefill_tokens=t_pre,
        max_prefill_query_len=min(pow2_bucket(max_chunk, MIN_PREFILL_TOKENS), t_pre),
        blocks_per_seq=pow2_bucket(max_blocks, MIN_BLOCKS_PER_SEQ),
    )
