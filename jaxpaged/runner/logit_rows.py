"""The persistent batch's logit-control state: which rows use bias, min_tokens or penalties, and their tokens.

Only rows that use a control have an entry, so a batch without any pays one
dict-emptiness check per step. A penalised row keeps its context tokens in a
numpy buffer that grows by the tokens the host learned since the last step
(usually one), so laying out a step copies `[P, L]` ints, not Python lists.
"""

from __future__ import annotations

import numpy as np

from jaxpaged.mathutils import DROPPED, pow2_bucket
from jaxpaged.runner.logit_controls import LogitControls, empty_controls
from jaxpaged.scheduler.output import RowControls


class _Row:
    __slots__ = ("controls", "tokens", "num_tokens")

    def __init__(self, controls: RowControls):
        self.controls = controls
        self.tokens = np.zeros(64 if controls.uses_penalties else 0, np.int32)
        self.num_tokens = 0

    def sync(self, token_ids: list[int], upto: int) -> None:
        """Hold the context tokens `[0, upto)` (they are all known to the host)."""
        if upto > self.tokens.shape[0]:
            grown = np.zeros(pow2_bucket(upto), np.int32)
            grown[:self.num_tokens] = self.tokens[:self.num_tokens]
            self.tokens = grown
        if upto > self.num_tokens:
            self.tokens[self.num_tokens:upto] = token_ids[self.num_tokens:upto]
            self.num_tokens = upto


class LogitRows:
    """Per persistent-batch row: its `RowControls` and (penalties) its context tokens."""

    def __init__(self):
        self._rows: dict[int, _Row] = {}

    def add(self, row: int, controls: RowControls | None) -> None:
        """Give `row` these controls (None: none; the row's previous state is dropped either way)."""
        self._rows.pop(row, None)
        if controls is not None:
            self._rows[row] = _Row(controls)

    def remove(self, row: int) -> None:
        self._rows.pop(row, None)

    def build(self, rows: np.ndarray, batch_rows: np.ndarray, context: np.ndarray, num_prompt: np.ndarray,
              samples: list[bool], seqs: list) -> LogitControls:
        """This step's controls for the sequences that sample (all arrays in schedule order).

        `rows` are persistent rows, `batch_rows` the step's rows, `context` each
        sequence's context length after the step, `num_prompt` its prompt length.
        """
        if not self._rows:
            return empty_controls()
        bias_rows, bias_entries, pen = [], [], []
        for i in np.flatnonzero(np.isin(rows, np.fromiter(self._rows, np.int64, len(self._rows)))):
            if not samples[i]:
                continue  # a prefill chunk that samples nothing: its logits are dropped
            state = self._rows[int(rows[i])]
            c = state.controls
            num_out = int(context[i] - num_prompt[i])
            entries = [(t, v, -1) for t, v in c.logit_bias]
            if num_out < c.min_tokens:
                entries += [(t, -np.inf, -1) for t in c.stop_ids]
            if c.bad_words:
                entries += _bad_word_entries(c.bad_words, seqs[i].token_ids, int(context[i]), num_out)
            if entries:
                bias_rows.append(batch_rows[i])
                bias_entries.append(entries)
            if c.uses_penalties:
                state.sync(seqs[i].token_ids, int(context[i]) - 1)
                pen.append((batch_rows[i], state, int(num_prompt[i])))
        if not bias_rows and not pen:
            return empty_controls()
        controls = empty_controls()
        if bias_rows:
            controls = controls._replace(**_bias_arrays(bias_rows, bias_entries))
        if pen:
            controls = controls._replace(**_penalty_arrays(pen))
        return controls


def _bad_word_entries(words, tokens: list[int], context: int, num_out: int) -> list[tuple[int, float, int]]:
    """Bans for the bad words whose all-but-last tokens may end the output after this step's input.

    The output so far is `tokens[context - num_out:context]`; its last token
    (position context - 1) may be on the device, so it becomes the condition.
    """
    entries = []
    for word in words:
        if len(word) == 1:
            entries.append((word[0], -np.inf, -1))
        elif num_out >= len(word) - 1 and tokens[context - len(word) + 1:context - 1] == list(word[:-2]):
            entries.append((word[-1], -np.inf, word[-2]))
    return entries


def _bias_arrays(rows: list[int], entries: list[list[tuple[int, float, int]]]) -> dict[str, np.ndarray]:
    num, width = pow2_bucket(len(rows)), pow2_bucket(max(map(len, entries)))
    out_rows = np.full(num, DROPPED, np.int32)
    ids = np.full((num, width), DROPPED, np.int32)
    values = np.zeros((num, width), np.float32)
    conditions = np.full((num, width), -1, np.int32)
    out_rows[:len(rows)] = rows
    for j, row_entries in enumerate(entries):
        n = len(row_entries)
        ids[j, :n], values[j, :n], conditions[j, :n] = zip(*row_entries)
    return dict(bias_rows=out_rows, bias_ids=ids, bias_values=values, bias_if_last=conditions)


def _penalty_arrays(pen: list[tuple[int, _Row, int]]) -> dict[str, np.ndarray]:
    num = pow2_bucket(len(pen))
    length = pow2_bucket(max(state.num_tokens for _, state, _ in pen) + 1, 16)
    rows = np.full(num, DROPPED, np.int32)
    tokens = np.full((num, length), -1, np.int32)
    num_prompt = np.zeros(num, np.int32)
    last = np.zeros(num, np.int32)
    rep = np.ones(num, np.float32)
    freq = np.zeros(num, np.float32)
    pres = np.zeros(num, np.float32)
    for j, (row, state, prompt) in enumerate(pen):
        n = state.num_tokens
        rows[j], tokens[j, :n], num_prompt[j], last[j] = row, state.tokens[:n], prompt, n
        c = state.controls
        rep[j], freq[j], pres[j] = c.repetition, c.frequency, c.presence
    return dict(penalty_rows=rows, penalty_tokens=tokens, penalty_num_prompt=num_prompt,
                penalty_last_index=last, repetition=rep, frequency=freq, presence=pres)
