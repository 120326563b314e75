"""The host-side batch descriptor for one step: numpy arrays padded to bucket sizes.

A `StepInput` says, for each sequence, which tokens to compute this step and
where they go, as flat arrays (one device_put). Single-row sequences (decodes,
and prefill chunks of one token) come first in the batch; prefill chunks
follow, packed raggedly. `order` maps batch rows back to the caller's order.

Two builders make the same layout: the engine's runner cuts it from its
persistent batch with vectorised numpy (`jaxpaged.runner.input_batch`), and
`build_step_input` lays out a list of `ScheduledSeq` one sequence at a time
(tests, benchmarks, calibration; the reference the persistent batch is tested
against). `step_buckets` (`jaxpaged.runner.buckets`) is the padding rule both use.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import chex
import numpy as np

from jaxpaged.attention.batch import StepLayout
from jaxpaged.mathutils import cdiv
from jaxpaged.runner.buckets import StepBuckets, step_buckets
from jaxpaged.runner.logit_controls import LogitControls
from jaxpaged.structured.bitmask import TokenMasks


@dataclasses.dataclass(slots=True)
class ScheduledSeq:
    """One sequence's work for a step.

    `token_ids` are the tokens computed this step, at positions
    `num_computed_tokens ..`; `block_table` must already cover them.
    """

    token_ids: Sequence[int]
    num_computed_tokens: int
    block_table: Sequence[int]
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int = 0
    sample_index: int = 0  # which generated token this step samples (folds into the RNG key)


@dataclasses.dataclass
class StepInput:
    """Padded numpy arrays for one step, plus its static layout."""

    token_ids: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32
    slot_mapping: np.ndarray  # [T] int32, -1 = padding ([G, T] with several KV cache groups)
    block_tables: np.ndarray  # [S, M] int32 ([G, S, M] with several KV cache groups)
    context_lens: np.ndarray  # [S] int32
    query_start: np.ndarray  # [S] int32
    query_lens: np.ndarray  # [S] int32
    logits_indices: np.ndarray  # [S] int32: row of each sequence's last token
    temperature: np.ndarray  # [S] float32
    top_k: np.ndarray  # [S] int32
    top_p: np.ndarray  # [S] float32
    min_p: np.ndarray  # [S] float32 (0: off)
    seeds: np.ndarray  # [S] uint32
    counters: np.ndarray  # [S] int32
    token_src_rows: np.ndarray  # [T] int32: persistent row whose last sample is this input token; -1 = token_ids
    sample_rows: np.ndarray  # [S] int32: persistent row that keeps this row's sample on the device; -1 = none
    layout: StepLayout
    order: np.ndarray  # [num_seqs]: batch row of the caller's i-th sequence
    num_seqs: int  # real (unpadded) sequences
    # logit bias / min_tokens / penalties of the rows that use them (None: no row does)
    logit_controls: LogitControls | None = None
    # prompt logprobs: token rows whose next-token logprob is returned, and that next token (padded)
    prompt_logprob_rows: np.ndarray | None = None  # [P] int32
    prompt_logprob_targets: np.ndarray | None = None  # [P] int32
    num_prompt_top_logprobs: int = 0
    # speculative decoding: token rows whose next token is verified (padded; see jaxpaged.runner.rejection):
    # the draft after each row (-1: none), its sequence's batch row, and the counter of the token it decides
    verify_rows: np.ndarray | None = None  # [V] int32
    verify_drafts: np.ndarray | None = None  # [V] int32
    verify_seq_rows: np.ndarray | None = None  # [V] int32
    verify_counters: np.ndarray | None = None  # [V] int32
    # structured output / allowed_token_ids: packed masks of the constrained rows (None: no row has one)
    token_masks: TokenMasks | None = None

    def check_shapes(self) -> None:
        """Assert the arrays agree with each other (the host -> device boundary)."""
        num_tokens = self.token_ids.shape[0]
        grouped = self.block_tables.ndim == 3
        num_rows = self.block_tables.shape[grouped]
        chex.assert_shape([self.token_ids, self.positions, self.token_src_rows], (num_tokens,))
        chex.assert_shape(self.slot_mapping, self.block_tables.shape[:1] * grouped + (num_tokens,))
        chex.assert_shape([self.context_lens, self.query_start, self.query_lens, self.logits_indices,
                           self.temperature, self.top_k, self.top_p, self.min_p, self.seeds, self.counters,
                           self.sample_rows], (num_rows,))
        if self.layout.num_decode_seqs > num_rows or self.layout.num_decode_seqs > num_tokens:
            raise ValueError(f"layout claims {self.layout.num_decode_seqs} decode rows; "
                             f"the step has {num_rows} sequences and {num_tokens} tokens")

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens computed this step."""
        return int(self.query_lens.sum())


def empty_step_input(buckets: StepBuckets, num_seqs: int) -> StepInput:
    """A step of the given padded sizes with every row and token set to padding."""
    num_tokens, num_rows = buckets.num_tokens, buckets.num_rows
    return StepInput(
        token_ids=np.zeros(num_tokens, np.int32),
        positions=np.zeros(num_tokens, np.int32),
        slot_mapping=np.full(num_tokens, -1, np.int32),
        block_tables=np.zeros((num_rows, buckets.blocks_per_seq), np.int32),
        context_lens=np.zeros(num_rows, np.int32),
        query_start=np.zeros(num_rows, np.int32),
        query_lens=np.zeros(num_rows, np.int32),
        logits_indices=np.zeros(num_rows, np.int32),
        temperature=np.zeros(num_rows, np.float32),
        top_k=np.full(num_rows, -1, np.int32),
        top_p=np.ones(num_rows, np.float32),
        min_p=np.zeros(num_rows, np.float32),
        seeds=np.zeros(num_rows, np.uint32),
        counters=np.zeros(num_rows, np.int32),
        token_src_rows=np.full(num_tokens, -1, np.int32),
        sample_rows=np.full(num_rows, -1, np.int32),
        layout=StepLayout(num_decode_seqs=buckets.num_decode_rows,
                          max_prefill_query_len=buckets.max_prefill_query_len),
        order=np.zeros(num_seqs, np.int64),
        num_seqs=num_seqs,
    )


def build_step_input(seqs: Sequence[ScheduledSeq], block_size: int, num_groups: int = 1, *,
                     min_decode_rows: int = 1) -> StepInput:
    """Lay out one step's sequences into bucketed arrays, one sequence at a time.

    `min_decode_rows`: as `step_buckets`' (a CPU runner's padding for its dtype: `ModelRunner.min_decode_rows`).

    With `num_groups` KV cache groups each `block_table` is the flat interleaved table
    (entry `j * G + g` is group `g`'s `j`-th block) and the step gets `[G, T]` slots
    and `[G, S, M]` tables.
    """
    if num_groups > 1:
        per_group = [build_step_input([dataclasses.replace(s, block_table=list(s.block_table)[g::num_groups])
                                       for s in seqs], block_size, min_decode_rows=min_decode_rows)
                     for g in range(num_groups)]
        step = per_group[0]
        step.slot_mapping = np.stack([p.slot_mapping for p in per_group])
        step.block_tables = np.stack([p.block_tables for p in per_group])
        return step
    if not seqs:
        raise ValueError("a step needs at least one sequence")
    for s in seqs:
        if len(s.token_ids) == 0:
            raise ValueError("every scheduled sequence must compute at least one token")
        needed = cdiv(s.num_computed_tokens + len(s.token_ids), block_size)
        if len(s.block_table) < needed:
            raise ValueError(f"block table of {len(s.block_table)} blocks cannot hold "
                             f"{s.num_computed_tokens + len(s.token_ids)} tokens ({needed} blocks needed)")
    decode = [i for i, s in enumerate(seqs) if len(s.token_ids) == 1]
    prefill = [i for i, s in enumerate(seqs) if len(s.token_ids) > 1]
    buckets = step_buckets(
        len(decode), len(prefill),
        prefill_tokens=sum(len(seqs[i].token_ids) for i in prefill),
        max_chunk=max((len(seqs[i].token_ids) for i in prefill), default=0),
        max_blocks=max(cdiv(s.num_computed_tokens + len(s.token_ids), block_size) for s in seqs),
        min_decode_rows=min_decode_rows)
    out = empty_step_input(buckets, len(seqs))
    n_dec = buckets.num_decode_rows
    rows = [(row, i, row) for row, i in enumerate(decode)]
    start = n_dec
    for j, i in enumerate(prefill):
        rows.append((n_dec + j, i, start))
        start += len(seqs[i].token_ids)
    for row, i, token_start in rows:
        _fill_row(out, row, token_start, seqs[i], block_size)
        out.order[i] = row
    return out


def _fill_row(out: StepInput, row: int, start: int, s: ScheduledSeq, block_size: int) -> None:
    n = len(s.token_ids)
    positions = np.arange(s.num_computed_tokens, s.num_computed_tokens + n, dtype=np.int32)
    table = np.asarray(s.block_table, np.int32)
    out.token_ids[start:start + n] = s.token_ids
    out.positions[start:start + n] = positions
    out.slot_mapping[start:start + n] = table[positions // block_size] * block_size + positions % block_size
    kept = min(len(table), out.block_tables.shape[1])
    out.block_tables[row, :kept] = table[:kept]
    out.context_lens[row] = s.num_computed_tokens + n
    out.query_start[row] = start
    out.query_lens[row] = n
    out.logits_indices[row] = start + n - 1
    out.temperature[row] = s.temperature
    out.top_k[row] = s.top_k
    out.top_p[row] = s.top_p
    out.seeds[row] = np.uint32(s.seed & 0xFFFFFFFF)
    out.counters[row] = s.sample_index
