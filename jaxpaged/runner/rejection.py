"""Verifying draft tokens in the target step: greedy matching and rejection sampling (device side).

Each verifying sequence sends k + 1 rows to the verifier: the positions of
its last known token and of its k drafts. Row j carries the draft that sits
after it (`drafts[j]`, -1 for the last row, which has none) and the sampling
settings of its sequence with the counter of the token it generates. The
verifier returns one token per row: the draft itself when it is accepted,
otherwise the target's own token for that position. The host accepts the
longest prefix of rows whose token equals their draft and emits those drafts
plus the token of the first row that differs (or of the last row when every
draft was accepted), exactly as greedy verification does.

Greedy rows (temperature 0) return the argmax: a draft is accepted when it is
the argmax, and the token after the accepted drafts is the argmax, so the
output equals speculation off token for token.

Sampled rows use speculative sampling (Leviathan et al. 2023, Chen et al.
2023) for a draft distribution q that is a point mass at the draft d, as
n-gram prompt lookup proposes: with p the target's distribution after
temperature, top-k, top-p and min-p, d is accepted with probability
min(1, p(d) / q(d)) = p(d); when rejected, the token is drawn from the
residual max(0, p - q) renormalised, which is p with d removed. So each
emitted token has the target's distribution exactly:
P(x) = p(d) [x = d] + (1 - p(d)) p(x) [x != d] / (1 - p(d)) = p(x).
The last row draws from p as plain sampling does.

Randomness stays a pure function of (request seed, index of the token being
generated): the acceptance test reads `uniform_noise` and the draw reads the
same Gumbel noise plain sampling uses for that index, so a row without a
draft draws exactly the token plain sampling would, and a seeded request is
reproducible whatever it is batched with. Each token index's noise decides
one emitted token: the rows past a rejection are discarded, and the next
step reads their indices' noise afresh for tokens not yet decided.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxpaged.runner.sampling import (SamplingBatch, filter_mask, filters, first_argmax, gumbel_noise,
                                      token_logprobs, uniform_noise)

NO_DRAFT = -1  # a row with no draft after it (each span's last row, and padding)
ACCEPT_SALT = 1  # the uniform stream of the acceptance test (see `uniform_noise`)


def verify_draft_tokens(logits: Float[Array, "R V"], drafts: Int[Array, "R"], params: SamplingBatch
                        ) -> tuple[Int[Array, "R"], Float[Array, "R"]]:
    """Per verify row, its draft when accepted, else the target's token; and its log-probability (raw logits).

    `logits` are the raw logits at the rows; `params` holds each row's sampling
    settings and the counter (index among the sequence's generated tokens) of
    the token the row decides. Like `jaxpaged.runner.sampling.sample`, the step takes
    the cheapest path at run time: argmax when every row is greedy, no sort
    unless some sampled row filters (top-k, top-p, min-p).
    """
    logits = logits.astype(jnp.float32)
    greedy = first_argmax(logits)
    vocab = logits.shape[-1]
    sampling = params.temperature > 0
    filtering = filters(params, vocab)

    def rejection_sample(filtered: bool):
        def branch():
            scaled = logits / jnp.maximum(params.temperature, 1e-6)[:, None]
            if filtered:
                scaled = jnp.where(filter_mask(scaled, params), scaled, -jnp.inf)
            has_draft = drafts >= 0
            column = jnp.arange(vocab)[None, :]
            is_draft = column == drafts[:, None]
            p_draft = jnp.sum(jnp.where(is_draft, jax.nn.softmax(scaled, axis=-1), 0.0), axis=-1)
            accept = has_draft & (uniform_noise(params.seeds, params.counters, ACCEPT_SALT) < p_draft)
            # the residual for a point-mass draft: p without the draft (a row without a draft draws from p)
            residual = jnp.where(is_draft, -jnp.inf, scaled)
            drawn = first_argmax(residual + gumbel_noise(params.seeds, params.counters, vocab))
            # p(d) = 1 up to rounding leaves no residual: keep the draft rather than a token outside p
            drawn = jnp.where(jnp.isfinite(residual).any(axis=-1), drawn, drafts)
            tokens = jnp.where(accept, drafts, drawn)
            return jnp.where(sampling, tokens, greedy).astype(jnp.int32)
        return branch

    tokens = jax.lax.cond(
        jnp.any(filtering), rejection_sample(filtered=True),
        lambda: jax.lax.cond(jnp.any(sampling), rejection_sample(filtered=False), lambda: greedy))
    return tokens, token_logprobs(logits, tokens)
