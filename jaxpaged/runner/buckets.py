"""Shape buckets: pad step sizes so the step compiles a bounded number of times.

Every distinct padded shape of the step is one XLA compile (seconds on a CPU,
once per machine with the persistent compile cache: `jaxpaged.compile_cache`).
Sizes go to the next power of two, with minimums. One is padded further, where
the padding was measured free (docs/benchmarks/startup.md, "Start-up"): the block
table of a decode-only step is at least `MIN_DECODE_BLOCKS_PER_SEQ` wide. A
decode's attention loop stops at the last key a real row sees, so the wider
table costs its int32 entries and nothing else; before, a batch's decodes
compiled a new step each time its longest context crossed 64, 128 and 256
tokens (block size 16). Steps that prefill keep the narrow minimum: their
attention's key chunk follows the table width, and a 64-token prefill with a
32-block table ran 8-15% slower. Padding decode rows further (to merge the
mixed steps of a first batch) cost 3-70% per step and was left out, except
where one row is XLA:CPU's slow path: a CPU runner pads its decode rows to at
least 2 (`min_decode_rows`, chosen by the runner: `jaxpaged.runner.cpu_step`),
which made a batch-1 pass 0.60x as long in bfloat16 and 0.88x in float32.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.mathutils import pow2_bucket

MIN_PREFILL_TOKENS = 16
# a step whose only multi-token rows verify draft tokens (k + 1 tokens each, k <= 7 fits one bucket at batch 1):
# padding a batch-1 verify step of 5 tokens to 16 made it cost 2.5x a decode step (docs/benchmarks/spec-decode.md)
MIN_VERIFY_TOKENS = 8
MIN_BLOCKS_PER_SEQ = 4
MIN_DECODE_BLOCKS_PER_SEQ = 32


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
                 max_blocks: int, *, verify_only: bool = False, min_decode_rows: int = 1) -> StepBuckets:
    """Pad a step's sizes to powers of two (with the minimums above), so it compiles a bounded number of times.

    `verify_only`: every multi-token row verifies drafts (the smaller `MIN_VERIFY_TOKENS` minimum).
    `min_decode_rows`: the fewest decode rows a step with any decode pads to (the runner's choice for its
    platform and dtype, `jaxpaged.runner.cpu_step.min_decode_rows`; 1 leaves the power of two alone).
    """
    min_tokens = MIN_VERIFY_TOKENS if verify_only else MIN_PREFILL_TOKENS
    t_pre = pow2_bucket(prefill_tokens, min_tokens)
    min_blocks = MIN_BLOCKS_PER_SEQ if prefill_tokens else MIN_DECODE_BLOCKS_PER_SEQ
    return StepBuckets(
        num_decode_rows=pow2_bucket(num_decodes, min_decode_rows),
        num_prefill_rows=pow2_bucket(num_prefills),
        num_prefill_tokens=t_pre,
        max_prefill_query_len=min(pow2_bucket(max_chunk, min_tokens), t_pre),
        blocks_per_seq=pow2_bucket(max_blocks, min_blocks),
    )
