"""Per-request logit controls on device: logit bias, min_tokens masks and the three penalties (vLLM's rules).

Only the rows that use a control pay for it. Each control comes as a compact
list of batch rows plus a padded per-row list, never a `[rows, vocab]` state:

- bias: `[B, K]` (token id, value, condition) triples per row. `logit_bias`,
  the `min_tokens` masks (-inf on the stop ids and EOS while fewer than
  `min_tokens` tokens are out; the host knows each row's count) and
  `bad_words` share it. A bad word's last token is banned when the output
  ends with the rest of the word: the host matches all of it but the output's
  last token, which under asynchronous scheduling only the device knows, so
  the entry carries that token as its condition.
- penalties: `[P, L]` the row's context token ids (prompt, then output), of
  which the first `num_prompt` are the prompt. The host knows every context
  token but the one the previous step sampled (asynchronous scheduling); the
  step writes the row's resolved last input token at `last_index`.

Everything is a gather or scatter over the `[S, V]` logits the step has
anyway, so a 128K vocabulary costs nothing extra per row, and a count
`frequency_penalty * count` comes from scatter-adding once per occurrence.
B, K, P and L are padded to powers of two, so the step compiles a bounded
number of times; with no row using a control its arrays are empty and the
step skips it when tracing.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int


class LogitControls(NamedTuple):
    """One step's logit controls (device arrays; padding rows point past the batch and are dropped)."""

    bias_rows: Int[Array, "B"]  # batch row of each biased row
    bias_ids: Int[Array, "B K"]  # token ids; padding: the vocabulary size (dropped)
    bias_values: Float[Array, "B K"]
    bias_if_last: Int[Array, "B K"]  # the entry applies only if the row's last token is this id; -1: always
    penalty_rows: Int[Array, "P"]  # batch row of each penalised row
    penalty_tokens: Int[Array, "P L"]  # the row's context tokens; -1 = padding
    penalty_num_prompt: Int[Array, "P"]  # entries before this are prompt tokens
    penalty_last_index: Int[Array, "P"]  # where the step writes the row's last input token
    repetition: Float[Array, "P"]
    frequency: Float[Array, "P"]
    presence: Float[Array, "P"]


def apply_logit_controls(logits: Float[Array, "S V"], controls: LogitControls,
                         last_tokens: Int[Array, "S"]) -> Float[Array, "S V"]:
    """The logits to choose tokens from: bias (and min_tokens masks) first, then the penalties.

    `last_tokens` is each batch row's last input token (its context's last
    token), resolved on the device.
    """
    if controls.bias_rows.shape[0]:
        rows = jnp.broadcast_to(controls.bias_rows[:, None], controls.bias_ids.shape)
        last = last_tokens[jnp.minimum(controls.bias_rows, logits.shape[0] - 1)][:, None]
        applies = (controls.bias_if_last < 0) | (controls.bias_if_last == last)
        values = jnp.where(applies, controls.bias_values, 0.0)
        logits = logits.at[rows, controls.bias_ids].add(values, mode="drop")
    if controls.penalty_rows.shape[0]:
        logits = _apply_penalties(logits, controls, last_tokens)
    return logits


def _apply_penalties(logits: Float[Array, "S V"], c: LogitControls, last_tokens: Int[Array, "S"]):
    """Repetition over prompt and output tokens, then frequency and presence over output tokens (vLLM's order)."""
    num_rows, vocab = logits.shape
    num_pen, length = c.penalty_tokens.shape
    safe_rows = jnp.minimum(c.penalty_rows, num_rows - 1)
    tokens = c.penalty_tokens.at[jnp.arange(num_pen), c.penalty_last_index].set(last_tokens[safe_rows])
    column = jnp.arange(length)[None, :]
    seen = (column <= c.penalty_last_index[:, None]) & (tokens >= 0)
    output = seen & (column >= c.penalty_num_prompt[:, None])
    rows = jnp.broadcast_to(c.penalty_rows[:, None], tokens.shape)
    gather_rows = jnp.broadcast_to(safe_rows[:, None], tokens.shape)
    gather_ids = jnp.clip(tokens, 0, vocab - 1)
    seen_ids = jnp.where(seen, tokens, vocab)  # vocab: out of range, the scatter drops it
    output_ids = jnp.where(output, tokens, vocab)
    # duplicates of a token read the same value and write the same result, so `set` is idempotent
    value = logits[gather_rows, gather_ids]
    rp = c.repetition[:, None]
    logits = logits.at[rows, seen_ids].set(jnp.where(value > 0, value / rp, value * rp), mode="drop")
    logits = logits.at[rows, output_ids].add(jnp.broadcast_to(-c.frequency[:, None], tokens.shape), mode="drop")
    value = logits[gather_rows, gather_ids]
    return logits.at[rows, output_ids].set(value - c.presence[:, None], mode="drop")


def empty_controls() -> LogitControls:
    """Controls with no row using any (zero-size arrays: the step skips them when tracing)."""
    i32, f32 = np.int32, np.float32
    return LogitControls(np.zeros(0, i32), np.zeros((0, 0), i32), np.zeros((0, 0), f32), np.zeros((0, 0), i32),
                         np.zeros(0, i32), np.zeros((0, 0), i32), np.zeros(0, i32), np.zeros(0, i32),
                         np.zeros(0, f32), np.zeros(0, f32), np.zeros(0, f32))
