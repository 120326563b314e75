"""The runner's persistent batch: one row per resident sequence, kept across steps (vLLM v1's InputBatch).

A row holds what changes rarely: the sequence's block table and its sampling
settings. The scheduler sends only changes (rows to add and free, blocks
appended, a block replaced by its copy-on-write copy), and each step's
`StepInput` is cut from the rows with vectorised numpy: no per-step walk over
any sequence's block table in Python.
"""

from __future__ import annotations

import operator

import numpy as np

from jaxpaged.runner.buckets import MIN_VERIFY_TOKENS
from jaxpaged.mathutils import cdiv, next_power_of_two, pow2_bucket
from jaxpaged.runner.logit_rows import LogitRows
from jaxpaged.runner.step_input import StepInput, empty_step_input, step_buckets
from jaxpaged.scheduler.output import TOKEN_ON_DEVICE, SchedulerOutput
from jaxpaged.structured.bitmask import pad_token_masks

MIN_ROWS = 16
_seq_id = operator.attrgetter("seq_id")
MIN_TABLE_COLUMNS = 16


class InputBatch:
    """Host arrays with one row per resident sequence; `prepare` lays out a step from them."""

    def __init__(self, block_size: int, num_rows: int = MIN_ROWS, windows: tuple[int | None, ...] = (None,), *,
                 min_decode_rows: int = 1):
        """Rows and block-table columns start at the given sizes and double when full.

        `min_decode_rows`: the fewest decode rows a step pads to (`step_buckets`; the runner's choice).

        `windows` are the KV cache groups' windows (None: full attention). With
        several groups a row holds the manager's flat table (entry `j * G + g`
        is group `g`'s `j`-th block); with any window each step gets one table
        per group (`[G, S, M]`, even for one all-sliding group).
        """
        self.block_size = block_size
        self.windows = tuple(windows)
        self.min_decode_rows = min_decode_rows
        rows = next_power_of_two(max(num_rows, MIN_ROWS))
        self.block_table = np.zeros((rows, MIN_TABLE_COLUMNS), np.int32)
        self.num_prompt_tokens = np.zeros(rows, np.int32)
        self.temperature = np.zeros(rows, np.float32)
        self.top_k = np.full(rows, -1, np.int32)
        self.top_p = np.ones(rows, np.float32)
        self.min_p = np.zeros(rows, np.float32)
        self.seeds = np.zeros(rows, np.uint32)
        self._row_of: dict[int, int] = {}
        self.logit_rows = LogitRows()  # bias / min_tokens / penalty state of the rows that use them
        self._free_rows = list(range(rows - 1, -1, -1))  # a stack: the lowest row is handed out first

    @property
    def capacity(self) -> int:
        """Rows allocated (held or free)."""
        return self.block_table.shape[0]

    @property
    def num_rows_in_use(self) -> int:
        return len(self._row_of)

    def row_of(self, seq_id: int) -> int:
        """The row that holds sequence `seq_id`."""
        return self._row_of[seq_id]

    def block_ids(self, seq_id: int, num_blocks: int) -> list[int]:
        """The first `num_blocks` entries of the sequence's block table."""
        return self.block_table[self._row_of[seq_id], :num_blocks].tolist()

    # ---- changes from the scheduler -----------------------------------------------------------

    def apply(self, out: SchedulerOutput) -> None:
        """Free rows, add rows, then apply block-table updates, as the scheduler lists them."""
        for seq_id in out.freed_seq_ids:
            row = self._row_of.pop(seq_id)
            self._free_rows.append(row)
            self.logit_rows.remove(row)
        for new in out.new_rows:
            if new.seq_id in self._row_of:
                raise ValueError(f"sequence {new.seq_id} already has row {self._row_of[new.seq_id]}")
            row = self._take_row()
            self._row_of[new.seq_id] = row
            self._ensure_columns(len(new.block_ids))
            self.block_table[row] = 0
            self.block_table[row, :len(new.block_ids)] = new.block_ids
            self.num_prompt_tokens[row] = new.num_prompt_tokens
            self.temperature[row] = new.temperature
            self.top_k[row] = new.top_k
            self.top_p[row] = new.top_p
            self.min_p[row] = new.min_p
            self.seeds[row] = new.seed
            self.logit_rows.add(row, new.controls)
        for seq_id, start, block_ids in out.block_updates:
            end = start + len(block_ids)
            self._ensure_columns(end)
            self.block_table[self._row_of[seq_id], start:end] = block_ids

    def _take_row(self) -> int:
        if not self._free_rows:
            self._grow_rows()
        return self._free_rows.pop()

    def _grow_rows(self) -> None:
        old = self.capacity
        for name in ("block_table", "num_prompt_tokens", "temperature", "top_k", "top_p", "min_p", "seeds"):
            array = getattr(self, name)
            grown = np.zeros((2 * old, *array.shape[1:]), array.dtype)
            grown[:old] = array
            setattr(self, name, grown)
        self.top_k[old:] = -1
        self.top_p[old:] = 1.0
        self._free_rows.extend(range(2 * old - 1, old - 1, -1))

    def _ensure_columns(self, num_blocks: int) -> None:
        columns = self.block_table.shape[1]
        if num_blocks > columns:
            grown = np.zeros((self.capacity, next_power_of_two(num_blocks)), np.int32)
            grown[:, :columns] = self.block_table
            self.block_table = grown

    # ---- one step ------------------------------------------------------------------------------

    def prepare(self, out: SchedulerOutput) -> StepInput:
        """This step's padded arrays, cut from the rows (same layout as `build_step_input`)."""
        num_seqs = out.num_seqs
        bs = self.block_size
        rows = np.fromiter(map(self._row_of.__getitem__, map(_seq_id, out.seqs)), np.int64, num_seqs)
        counts = np.array(out.num_tokens, np.int64)
        starts = np.array(out.starts, np.int64)
        tokens = np.array(out.token_ids, np.int64)
        context = starts + counts

        is_decode = counts == 1
        decode = np.flatnonzero(is_decode)
        prefill = np.flatnonzero(~is_decode)
        prefill_counts = counts[prefill]
        max_blocks = cdiv(int(context.max()), bs)
        buckets = step_buckets(len(decode), len(prefill), int(prefill_counts.sum()),
                               int(prefill_counts.max()) if len(prefill) else 0, max_blocks,
                               verify_only=len(out.verify_spans) == len(prefill),
                               min_decode_rows=self.min_decode_rows)
        self._ensure_columns(buckets.blocks_per_seq * len(self.windows))
        step = empty_step_input(buckets, num_seqs)

        # where each sequence goes: its batch row and its first token row
        n_dec = buckets.num_decode_rows
        batch_row = np.empty(num_seqs, np.int64)
        batch_row[decode] = np.arange(len(decode))
        batch_row[prefill] = n_dec + np.arange(len(prefill))
        first_token = batch_row.copy()
        first_token[prefill] = n_dec + np.cumsum(prefill_counts) - prefill_counts

        # token rows: the scheduler's tokens are concatenated in schedule order
        seq_of_token = np.repeat(np.arange(num_seqs), counts)
        offset = np.arange(len(tokens)) - np.repeat(np.cumsum(counts) - counts, counts)
        dest = first_token[seq_of_token] + offset
        positions = starts[seq_of_token] + offset
        token_rows = rows[seq_of_token]
        on_device = tokens == TOKEN_ON_DEVICE
        step.token_ids[dest] = np.where(on_device, 0, tokens)
        step.token_src_rows[dest] = np.where(on_device, token_rows, -1)
        step.positions[dest] = positions
        if self.windows == (None,):  # one full-attention group: no group axis, nothing slides out
            step.slot_mapping[dest] = self.block_table[token_rows, positions // bs] * bs + positions % bs
            step.block_tables[batch_row] = self.block_table[rows, :buckets.blocks_per_seq]
        else:
            self._group_tables(step, rows, batch_row, starts, dest, token_rows, positions)

        # sequence rows
        step.context_lens[batch_row] = context
        step.query_start[batch_row] = first_token
        step.query_lens[batch_row] = counts
        step.logits_indices[batch_row] = first_token + counts - 1
        step.temperature[batch_row] = self.temperature[rows]
        step.top_k[batch_row] = self.top_k[rows]
        step.top_p[batch_row] = self.top_p[rows]
        step.min_p[batch_row] = self.min_p[rows]
        step.seeds[batch_row] = self.seeds[rows]
        step.counters[batch_row] = context - self.num_prompt_tokens[rows]
        step.sample_rows[batch_row] = rows
        step.order[:] = batch_row
        step.logit_controls = self.logit_rows.build(rows, batch_row, context, self.num_prompt_tokens[rows],
                                                    out.samples, out.seqs)
        if out.prompt_logprob_spans:
            _lay_out_prompt_logprobs(step, out, first_token)
        if out.verify_spans:
            _lay_out_verify_rows(step, out, first_token, batch_row)
        if out.token_mask_indices:
            step.token_masks = pad_token_masks(batch_row[out.token_mask_indices], out.token_masks)
        return step

    def _group_tables(self, step: StepInput, rows, batch_row, starts, dest, token_rows, positions) -> None:
        """Per-group slot mapping `[G, T]` and block tables `[G, S, M]` from the rows' flat tables.

        A sliding group's entries before the first block its queries can see
        (blocks that slid out, which the manager may have given to another
        sequence) are sent as block 0, like padding: attention never reads them.
        """
        bs, num_groups = self.block_size, len(self.windows)
        width = step.block_tables.shape[1]
        slots = np.full((num_groups, len(step.slot_mapping)), -1, np.int32)
        tables = np.zeros((num_groups, *step.block_tables.shape), np.int32)
        row_tables = self.block_table[rows, :width * num_groups].reshape(len(rows), width, num_groups)
        logical = positions // bs * num_groups
        for g, window in enumerate(self.windows):
            slots[g, dest] = self.block_table[token_rows, logical + g] * bs + positions % bs
            table = row_tables[:, :, g]
            if window is not None:
                first = np.maximum(starts - window + 1, 0) // bs
                table = np.where(np.arange(width)[None, :] < first[:, None], 0, table)
            tables[g, batch_row] = table
        step.slot_mapping, step.block_tables = slots, tables


def _lay_out_verify_rows(step: StepInput, out: SchedulerOutput, first_token: np.ndarray,
                         batch_row: np.ndarray) -> None:
    """Each verifying sequence's k + 1 positions (its last known token, then its drafts): their token rows,
    the draft after each (-1 after the last), the sequence's batch row and the counter of the token each
    decides (the sequence's counter is its last row's)."""
    spans = np.array(out.verify_spans, np.int64).reshape(-1, 2)
    lengths = spans[:, 1] + 1
    total = int(lengths.sum())
    offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    size = pow2_bucket(total, MIN_VERIFY_TOKENS)
    rows, drafts = np.zeros(size, np.int32), np.full(size, -1, np.int32)
    seq_rows, counters = np.zeros(size, np.int32), np.zeros(size, np.int32)
    seq_row = np.repeat(batch_row[spans[:, 0]], lengths)
    rows[:total] = np.repeat(first_token[spans[:, 0]], lengths) + offsets
    drafts[:total] = np.concatenate([[*d, -1] for d in out.draft_token_ids])
    seq_rows[:total] = seq_row
    counters[:total] = step.counters[seq_row] - np.repeat(spans[:, 1], lengths) + offsets
    step.verify_rows, step.verify_drafts = rows, drafts
    step.verify_seq_rows, step.verify_counters = seq_rows, counters


def _lay_out_prompt_logprobs(step: StepInput, out: SchedulerOutput, first_token: np.ndarray) -> None:
    """The token rows of the spans' positions and the prompt token each one predicts."""
    total = sum(n for _, _, n in out.prompt_logprob_spans)
    size = pow2_bucket(total, 16)
    rows, targets = np.zeros(size, np.int32), np.zeros(size, np.int32)
    at = 0
    for i, start, n in out.prompt_logprob_spans:  # a span starts where its sequence's chunk does
        rows[at:at + n] = np.arange(first_token[i], first_token[i] + n)
        targets[at:at + n] = out.seqs[i].token_ids[start + 1:start + 1 + n]
        at += n
    step.prompt_logprob_rows, step.prompt_logprob_targets = rows, targets
    step.num_prompt_top_logprobs = out.num_prompt_top_logprobs
