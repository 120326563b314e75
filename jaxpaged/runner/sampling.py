"""Token sampling on device: greedy, temperature, top-k, top-p, per-request seeds.

Only the sampled ids (and their log-probabilities) leave the device each step.
Randomness is a pure function of (request seed, index of the token being
generated, vocabulary id), so a request's output does not depend on what it was
batched with. The noise comes from a counter-based integer hash rather than
`jax.random`: threefry's per-row key derivation added ~1-2 s to every CPU
compile of the step, and sampling needs uniform bits, not a key hierarchy.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, UInt32


class SamplingBatch(NamedTuple):
    """Per-sequence sampling parameters for one step (device arrays, padded)."""

    temperature: Float[Array, "S"]  # 0 = greedy
    top_k: Int[Array, "S"]  # <= 0: disabled
    top_p: Float[Array, "S"]  # 1.0: disabled
    seeds: UInt32[Array, "S"]
    counters: Int[Array, "S"]  # index of the token being sampled, folded into the key
    min_p: Float[Array, "S"] | None = None  # 0 (or None for every row): disabled


def sample(logits: Float[Array, "S V"], params: SamplingBatch,
           processed: Float[Array, "S V"] | None = None) -> tuple[Int[Array, "S"], Float[Array, "S"]]:
    """Sample one token per row; returns ids and their log-probabilities under the raw logits.

    `processed` (the logits after bias and penalties, `jaxpaged.runner.logit_controls`)
    is what tokens are chosen from when given; the log-probabilities stay the
    raw logits', as vLLM's default.

    The step picks the cheapest of three paths at run time (`lax.cond` runs one
    branch): all rows greedy (an argmax), sampling without top-k/top-p (Gumbel-max
    over the vocabulary, no sort), and the filtered path, which sorts each row.
    A full-vocabulary sort of 64 rows x 32,000 costs ~170 ms on a 2-core CPU,
    about a third of a decode step of a 100M model, so only steps that filter pay
    it. The three paths draw the same token for a row that all of them can serve:
    the noise belongs to (seed, counter, vocabulary id), and the filtered path
    takes its argmax in vocabulary order too.
    """
    raw = logits = logits.astype(jnp.float32)
    if processed is not None:
        logits = processed.astype(jnp.float32)
    greedy = first_argmax(logits)
    vocab = logits.shape[-1]
    sampling = params.temperature > 0
    filtering = filters(params, vocab)

    def draw(filtered: bool):
        def branch():
            scaled = logits / jnp.maximum(params.temperature, 1e-6)[:, None]
            if filtered:
                scaled = jnp.where(filter_mask(scaled, params), scaled, -jnp.inf)
            noisy = scaled + gumbel_noise(params.seeds, params.counters, vocab)
            return jnp.where(sampling, first_argmax(noisy), greedy).astype(jnp.int32)
        return branch

    tokens = jax.lax.cond(
        jnp.any(filtering), draw(filtered=True),
        lambda: jax.lax.cond(jnp.any(sampling), draw(filtered=False), lambda: greedy))
    return tokens, token_logprobs(raw, tokens)


def first_argmax(x: Float[Array, "S V"]) -> Int[Array, "S"]:
    """Each row's index of its first maximum (int32), as `jnp.argmax`, NaN counting as the maximum.

    On CPU it is a max, then the least index holding it: XLA:CPU lowers `argmax`
    to a variadic (value, index) reduction that does not vectorise, ~5x slower on a
    64 x 49,152 step (16 ms against 3 ms on one core). Other platforms keep `argmax`.
    """
    if jax.default_backend() != "cpu":
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    top = jnp.max(x, axis=-1, keepdims=True)
    hit = (x == top) | jnp.isnan(x)
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(hit, index, x.shape[-1]), axis=-1)


def token_logprobs(logits: Float[Array, "S V"], tokens: Int[Array, "S"]) -> Float[Array, "S"]:
    """log softmax(logits)[row, tokens[row]], without writing the whole log-softmax out.

    Shifted by the row's maximum first, as `jax.nn.log_softmax` is, so a token of
    probability near 1 keeps its small log-probability's relative precision. The
    chosen logit is shifted on its own rather than gathered from the shifted row
    (the same subtraction, so the same bits): XLA:CPU then fuses the shift into
    the exp-sum instead of writing the shifted `[S, V]` row out (9.3 against
    12.0 ms for the greedy path on 64 x 49,152 logits, a 2-core AMD EPYC).
    """
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
    chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - top
    return chosen - jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=-1))


def filters(params: SamplingBatch, vocab: int) -> Bool[Array, "S"]:
    """Rows that sample with a top-k, top-p or min-p filter (the sort is skipped when none does)."""
    sampling = params.temperature > 0
    filtering = sampling & (((params.top_k > 0) & (params.top_k < vocab)) | (params.top_p < 1.0))
    if params.min_p is not None:
        filtering = filtering | (sampling & (params.min_p > 0))
    return filtering


def filter_mask(scaled: Float[Array, "S V"], params: SamplingBatch) -> Bool[Array, "S V"]:
    """Which vocabulary ids survive each row's top-k, then top-p, and min-p (the top id always does).

    min-p keeps the ids whose probability (after temperature) is at least
    `min_p` times the most likely id's, as vLLM's sampler.
    """
    num_rows, vocab = scaled.shape
    order = jnp.argsort(-scaled, axis=-1)  # descending
    sorted_scaled = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(vocab)[None, :]
    top_k = jnp.where(params.top_k <= 0, vocab, params.top_k)[:, None]
    keep = rank < top_k
    probs = jax.nn.softmax(jnp.where(keep, sorted_scaled, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # rank 0 always survives: a top_p too small for float32 (1e-40 is 0 or flushed to 0) leaves no mass below it
    keep = keep & ((mass_before < params.top_p[:, None]) | (rank == 0))
    if params.min_p is not None:
        # p_i >= min_p * p_max  <=>  scaled_i - scaled_max >= log(min_p)
        keep = keep & (sorted_scaled - sorted_scaled[:, :1] >= jnp.log(params.min_p)[:, None])
    rows = jnp.arange(num_rows)[:, None]
    return jnp.zeros((num_rows, vocab), bool).at[rows, order].set(keep)


def _mix32(x: Array) -> Array:
    """A 32-bit integer finaliser with good avalanche (the "lowbias32" constants)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def gumbel_noise(seeds: UInt32[Array, "S"], counters: Int[Array, "S"], vocab: int) -> Float[Array, "S V"]:
    """Gumbel(0, 1) noise, a pure function of (seed, counter, column)."""
    row = _mix32(seeds.astype(jnp.uint32) ^ _mix32(counters.astype(jnp.uint32) + jnp.uint32(0x9E3779B9)))
    bits = _mix32(row[:, None] ^ _mix32(jnp.arange(vocab, dtype=jnp.uint32)[None, :]))
    # 24 high bits -> uniform in (0, 1), never exactly 0 or 1
    uniform = ((bits >> 8).astype(jnp.float32) + 0.5) / jnp.float32(1 << 24)
    return -jnp.log(-jnp.log(uniform))


def uniform_noise(seeds: UInt32[Array, "S"], counters: Int[Array, "S"], salt: int) -> Float[Array, "S"]:
    """One uniform in (0, 1) per row, a pure function of (seed, counter, salt).

    It is `gumbel_noise`'s uniform at column 2**31 + salt, a column no
    vocabulary reaches, so it is independent of the row's Gumbel noise.
    """
    if not 0 <= salt < 1 << 31:
        raise ValueError(f"salt must be in [0, 2**31), got {salt}")
    row = _mix32(seeds.astype(jnp.uint32) ^ _mix32(counters.astype(jnp.uint32) + jnp.uint32(0x9E3779B9)))
    bits = _mix32(row ^ _mix32(jnp.uint32((1 << 31) + salt)))
    return ((bits >> 8).astype(jnp.float32) + 0.5) / jnp.float32(1 << 24)
