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
from jaxtyping import Array, Float, Int, UInt32


class SamplingBatch(NamedTuple):
    """Per-sequence sampling parameters for one step (device arrays, padded)."""

    temperature: Float[Array, "S"]  # 0 = greedy
    top_k: Int[Array, "S"]  # <= 0: disabled
    top_p: Float[Array, "S"]  # 1.0: disabled
    seeds: UInt32[Array, "S"]
    counters: Int[Array, "S"]  # index of the token being sampled, folded into the key


def sample(logits: Float[Array, "S V"], params: SamplingBatch) -> tuple[Int[Array, "S"], Float[Array, "S"]]:
    """Sample one token per row; returns ids and their log-probabilities under the raw logits."""
    logits = logits.astype(jnp.float32)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    greedy = jnp.argmax(logits, axis=-1)

    temperature = jnp.maximum(params.temperature, 1e-6)[:, None]
    order = jnp.argsort(-logits, axis=-1)  # descending
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1) / temperature
    vocab = logits.shape[-1]
    rank = jnp.arange(vocab)[None, :]
    top_k = jnp.where(params.top_k <= 0, vocab, params.top_k)[:, None]
    keep = rank < top_k
    probs = jax.nn.softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = keep & (mass_before < params.top_p[:, None])  # the top token always survives
    masked = jnp.where(keep, sorted_logits, -jnp.inf)

    gumbel = _gumbel_noise(params.seeds, params.counters, vocab)
    choice = jnp.argmax(masked + gumbel, axis=-1)
    sampled = jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0]

    tokens = jnp.where(params.temperature <= 0, greedy, sampled).astype(jnp.int32)
    return tokens, jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


def _mix32(x: Array) -> Array:
    """A 32-bit integer finaliser with good avalanche (the "lowbias32" constants)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _gumbel_noise(seeds: UInt32[Array, "S"], counters: Int[Array, "S"], vocab: int) -> Float[Array, "S V"]:
    """Gumbel(0, 1) noise, a pure function of (seed, counter, column)."""
    row = _mix32(seeds.astype(jnp.uint32) ^ _mix32(counters.astype(jnp.uint32) + jnp.uint32(0x9E3779B9)))
    bits = _mix32(row[:, None] ^ _mix32(jnp.arange(vocab, dtype=jnp.uint32)[None, :]))
    # 24 high bits -> uniform in (0, 1), never exactly 0 or 1
    uniform = ((bits >> 8).astype(jnp.float32) + 0.5) / jnp.float32(1 << 24)
    return -jnp.log(-jnp.log(uniform))
