"""Token bitmasks: filled on the host for the rows a step samples, applied to the logits inside the jitted step.

A row's mask is `[ceil(vocab / 32)]` int32 words; bit `t % 32` of word
`t // 32` allows token `t` (llguidance's packing). A step carries masks only
for its constrained rows, as `rows [C]` (the step's batch rows; padding rows
point past the batch and are dropped) and `bits [C, W]`, with C padded to a
power of two, so a batch without constraints ships nothing and compiles the
same step as before, and a batch with them compiles once per C bucket.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.mathutils import DROPPED, pow2_bucket
from jaxpaged.structured.grammar import BITS, SequenceConstraint

_executor = None


class TokenMasks(NamedTuple):
    """One step's token masks (device arrays, or host arrays before the transfer)."""

    rows: Int[Array, "C"]  # batch row of each mask; padding: DROPPED
    bits: Int[Array, "C W"]  # packed allowed tokens


def empty_token_masks() -> TokenMasks:
    """No constrained row (zero-size arrays: the step skips the mask when tracing)."""
    return TokenMasks(np.zeros(0, np.int32), np.zeros((0, 0), np.int32))


def fill_bitmasks(constraints: list[SequenceConstraint], width: int) -> np.ndarray:
    """`[len(constraints), width]` int32: each constraint's allowed next tokens.

    The matchers' masks are computed in parallel by llguidance's thread pool
    (the GIL is released), then static `allowed_token_ids` masks are applied.
    """
    global _executor
    import llguidance

    masks = np.full((len(constraints), width), -1, np.int32)
    matchers = [(c.matcher, i) for i, c in enumerate(constraints) if c.matcher is not None]
    if matchers:
        if _executor is None:
            _executor = llguidance.LLExecutor()
        _executor.unsafe_compute_mask_ptr(matchers, masks.ctypes.data, width * 4, len(constraints))
    for i, c in enumerate(constraints):
        if c.allowed is not None:
            masks[i] &= c.allowed
    return masks


def pad_token_masks(batch_rows: np.ndarray, bits: np.ndarray) -> TokenMasks:
    """The step's masks padded to a power-of-two count of rows (padding rows dropped by the scatter)."""
    count = len(batch_rows)
    size = pow2_bucket(count)
    rows = np.full(size, DROPPED, np.int32)
    rows[:count] = batch_rows
    padded = np.full((size, bits.shape[1]), -1, np.int32)
    padded[:count] = bits
    return TokenMasks(rows, padded)


def apply_token_bitmask(logits: Float[Array, "S V"], masks: TokenMasks) -> Float[Array, "S V"]:
    """`logits` with every token a row's mask does not allow set to -inf (rows without a mask unchanged)."""
    num_rows, vocab = logits.shape
    ids = jnp.arange(vocab)
    allowed = (masks.bits[:, ids // BITS] >> (ids % BITS)) & 1  # [C, V]
    rows = masks.rows
    masked = jnp.where(allowed == 1, logits[jnp.minimum(rows, num_rows - 1)], -jnp.inf)
    return logits.at[rows].set(masked, mode="drop")


def unpack_bitmask(bits: np.ndarray, vocab_size: int) -> np.ndarray:
    """The host reference of the packing: `[..., vocab]` booleans from `[..., W]` int32 words."""
    ids = np.arange(vocab_size)
    return ((bits[..., ids // BITS] >> (ids % BITS)) & 1).astype(bool)
