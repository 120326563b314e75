"""An EAGLE-style draft head over the target's hidden states: what the proposer protocol's hidden-state hook feeds.

EAGLE (Li et al. 2024) drafts from the target's own features rather than
from tokens alone: to propose the token after the last known token t at
position n - 1, its head reads the target's last-layer hidden state f at
position n - 2 (the row whose logits gave t) with t's embedding, predicts
the next feature, and reads a token off it with the target's LM head; the
predicted feature feeds the next draft step.

Here the head is `fc([embed(t); f]) -> one decoder layer -> the target's LM
head`, run greedily for k steps in one jitted call. The target's step hands
the features over when the proposer declares `uses_hidden_states`
(`ModelRunner.return_hidden_states`: the step returns the hidden states at
its sample rows and verify rows, and the scheduler keeps each sequence's
`last_hidden` from the row that gave its last token; `DraftContext`).

What it is not: no EAGLE checkpoint is read (the head's weights are random
unless given), so it is the hook's reference user and tested for exactness,
not acceptance; and its decoder layer attends over its own position only.
A trained EAGLE head keeps K/V over its earlier features; those would live
in a pool indexed by the target's block ids, kept in step as the draft
model's is (`draft_model.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.mathutils import pow2_bucket
from jaxpaged.config import ModelConfig
from jaxpaged.model import DecoderModel
from jaxpaged.model.layers import DecoderLayer, _linear
from jaxpaged.model.rope import rope_inv_freq
from jaxpaged.spec_decode.proposer import DraftContext


class EagleHead(nnx.Module):
    """The head's own weights: `fc` over `[embedding; feature]` and one decoder layer of the target's shape."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype=None):
        dtype = jnp.dtype(dtype or config.dtype)
        self.fc = _linear(2 * config.hidden_size, config.hidden_size, dtype, rngs)
        self.layer = DecoderLayer(config, dtype, rngs, 0)
        self.inv_freq = nnx.Variable(jnp.asarray(
            rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)))


class EagleHeadProposer:
    """Greedy drafts from an `EagleHead` over the target's features (implements `Proposer`)."""

    drafts_need_slots = True  # asked once the batch is final, with the DraftContext that carries the features
    uses_hidden_states = True

    def __init__(self, head: EagleHead, target: DecoderModel, num_speculative_tokens: int):
        """`target`'s embedding and LM head are shared with the head (read, never changed)."""
        self.num_speculative_tokens = num_speculative_tokens
        self.graphdef, self.params = nnx.split(head)
        self.target_graphdef, self.target_params = nnx.split(target)
        self._propose = jax.jit(self._propose_fn)

    def propose(self, token_ids: Sequence[Sequence[int]], max_drafts: Sequence[int],
                context: DraftContext | None = None) -> list[list[int]]:
        """Exactly `max_drafts[i]` drafts for sequence i, from its last token and `context.hidden_states[i]`."""
        if context is None or context.hidden_states is None:
            raise ValueError("the EAGLE-style proposer needs the target's hidden states (a DraftContext)")
        counts = [min(int(m), self.num_speculative_tokens) for m in max_drafts]
        if not token_ids:
            return []
        num_rows = pow2_bucket(len(token_ids))
        last = np.zeros(num_rows, np.int32)
        positions = np.zeros(num_rows, np.int32)
        features = np.zeros((num_rows, context.hidden_states.shape[-1]), context.hidden_states.dtype)
        for row, tokens in enumerate(token_ids):
            last[row], positions[row] = tokens[-1], len(tokens) - 1
        features[:len(token_ids)] = context.hidden_states
        drafts = np.asarray(self._propose(self.params, self.target_params, last, features, positions)).tolist()
        return [row[:n] for row, n in zip(drafts, counts)]

    def _propose_fn(self, params, target_params, last: jax.Array, features: jax.Array, positions: jax.Array):
        head = nnx.merge(self.graphdef, params)
        target = nnx.merge(self.target_graphdef, target_params)
        tokens, drafts = last, []
        for j in range(self.num_speculative_tokens):
            x = head.fc(jnp.concatenate([target.embed_tokens(tokens), features], axis=-1))
            features = head.layer.dense(x[:, None, :], (positions + j)[:, None], head.inv_freq[...])[:, 0]
            tokens = jnp.argmax(target.logits(features), axis=-1).astype(jnp.int32)
            drafts.append(tokens)
        return jnp.stack(drafts, axis=1)
