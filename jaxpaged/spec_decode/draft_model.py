"""The draft-model proposer: a smaller checkpoint with the target's vocabulary, over its own paged KV.

Where its K/V lives. The draft has its own pool arrays (its own layers,
heads and head size), indexed by the *target's* block ids: block b of the
draft pool holds the draft's K/V for the tokens that block b of the target
pool holds. So the one `KVCacheManager` manages both: a block allocated,
shared, copied on write, cached, evicted, freed or preempted for the target
is so for the draft too, and no rule about blocks is written twice (vLLM
does the same: its draft layers use the target's block tables).

For that to hold, the draft computes K/V for every token the target
computes, in the same step: `catch_up` runs the draft over the step's own
tokens, positions and slots right after the target's forward pass (prefill
chunks, decodes and verify spans alike). A prefix-cache hit then finds the
draft's K/V beside the target's, and a rejected draft's K/V is masked by the
context length and overwritten, exactly like the target's.

Proposing (`propose`, after the scheduler allocated each verifying
sequence's k + 1 slots): one jitted loop of k greedy decode steps per batch.
Step j feeds the last known token (j = 0) or draft j, at position n - 1 + j,
writing its K/V into the sequence's own slot there (those slots are the
verify step's, which rewrites them with the same tokens); a row past its own
count of drafts writes nothing. The drafts are the argmax of the draft's
logits: a point mass, as the rejection sampler assumes.

Not carried: the host/disk tiers, swap-out, snapshots and KV transfers move
the target's blocks only, so a block restored from them holds stale draft
K/V. That lowers acceptance, never the output (verification decides every
token).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.attention import AttentionBackend, AttentionBatch, StepLayout
from jaxpaged.mathutils import cdiv, pow2_bucket
from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.config import ModelConfig
from jaxpaged.kv_pool.pool import KVPool, copy_blocks, create_pool
from jaxpaged.model import DecoderModel
from jaxpaged.spec_decode.proposer import DraftContext


def check_draft_config(draft: ModelConfig, target: ModelConfig, name: str = "the draft model") -> None:
    """ValueError unless `draft` can propose for `target`: the same vocabulary, one full-attention KV group each."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"speculative_config.model {name} has a vocabulary of {draft.vocab_size} tokens, the "
                         f"target's has {target.vocab_size}: a draft model needs the target's tokenizer")
    for who, config in (("the draft model", draft), ("the target model", target)):
        if kv_cache_layout(config.layer_windows).num_groups != 1:
            raise ValueError(f"speculative_config.method='draft_model' needs full attention in every layer; "
                             f"{who} ({config.name}) has sliding-window layers")


class DraftModelProposer:
    """A draft model over its own pool, block ids shared with the target's (implements `Proposer`)."""

    drafts_need_slots = True  # its proposal steps write K/V at the verify positions
    uses_hidden_states = False

    def __init__(self, model: DecoderModel, target: ModelConfig, num_speculative_tokens: int, num_blocks: int,
                 block_size: int, *, kv_dtype=None, backend: AttentionBackend = AttentionBackend(),
                 pool_fill_value: float = 0.0, min_table_blocks: int = 1, name: str = "the draft model"):
        """`num_blocks` and `block_size` are the target pool's; ValueError if the model cannot draft for `target`.

        `min_table_blocks`: the narrowest padded block table of a draft step (the target runner's decode floor,
        so that the draft's steps compile as seldom as the target's)."""
        check_draft_config(model.config, target, name)
        self.config = model.config
        self.num_speculative_tokens = num_speculative_tokens
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.backend = backend
        self.min_table_blocks = min_table_blocks
        self.graphdef, self.params = nnx.split(model)
        self._pool: KVPool = create_pool(self.config, num_blocks, block_size, kv_dtype, fill_value=pool_fill_value)
        self._trace_count = 0
        self._catch_up = jax.jit(self._catch_up_fn, donate_argnums=(1,), static_argnums=(5,))
        self._propose = jax.jit(self._propose_fn, donate_argnums=(1,), static_argnums=(3,))

    @property
    def pool(self) -> KVPool:
        """The draft's pool arrays (read-only)."""
        return self._pool

    @property
    def num_compiles(self) -> int:
        """Distinct shapes of the catch-up and proposal functions compiled so far."""
        return self._trace_count

    # ---- kept in step with the target ------------------------------------------------------------

    def catch_up(self, token_ids: jax.Array, positions: jax.Array, attention: AttentionBatch,
                 layout: StepLayout) -> None:
        """Run the draft over a target step's tokens (device arrays), writing its K/V at the same slots."""
        self._pool = self._catch_up(self.params, self._pool, token_ids, positions, attention, layout)

    def _catch_up_fn(self, params, pool: KVPool, token_ids, positions, attention: AttentionBatch,
                     layout: StepLayout) -> KVPool:
        self._trace_count += 1
        model = nnx.merge(self.graphdef, params)
        _, pool = model(token_ids, positions, pool, attention, layout, self.backend)
        return pool

    def copy_blocks(self, src: np.ndarray, dst: np.ndarray) -> None:
        """The target's copy-on-write copies (padded arrays, `dst` out of range: none), made in the draft pool."""
        self._pool = copy_blocks(self._pool, src, dst)

    # ---- proposing ---------------------------------------------------------------------------------

    def propose(self, token_ids: Sequence[Sequence[int]], max_drafts: Sequence[int],
                context: DraftContext | None = None) -> list[list[int]]:
        """Exactly `max_drafts[i]` greedy draft tokens for sequence i (see `Proposer.propose`).

        Sequence i has its last known token at position n - 1 (n tokens, the
        rest computed) and slots for n - 1 .. n - 1 + max_drafts[i] in
        `context.block_tables[i]`.
        """
        if context is None:
            raise ValueError("the draft-model proposer needs the verify slots (a DraftContext)")
        counts = [min(int(m), self.num_speculative_tokens) for m in max_drafts]
        if len(token_ids) == 0 or max(counts, default=0) == 0:
            return [[] for _ in token_ids]
        if context.copies:
            pairs = np.asarray(context.copies, np.int32)
            self._copy_pairs(pairs[:, 0], pairs[:, 1])
        inputs = self._proposal_inputs(token_ids, counts, context.block_tables)
        drafts, self._pool = self._propose(self.params, self._pool, inputs, StepLayout(inputs[0].shape[0], 0))
        rows = np.asarray(drafts).tolist()
        return [row[:n] for row, n in zip(rows, counts)]

    def _copy_pairs(self, src: np.ndarray, dst: np.ndarray) -> None:
        size = pow2_bucket(len(src))
        padded_src = np.zeros(size, np.int32)
        padded_dst = np.full(size, self.num_blocks, np.int32)  # out of range: dropped
        padded_src[:len(src)], padded_dst[:len(dst)] = src, dst
        self.copy_blocks(padded_src, padded_dst)

    def _proposal_inputs(self, token_ids: Sequence[Sequence[int]], counts: list[int],
                         block_tables: Sequence[Sequence[int]]) -> tuple[np.ndarray, ...]:
        """Padded `(last tokens [S], their positions [S], tables [S, M], draft counts [S])` (count 0: padding)."""
        num_rows = pow2_bucket(len(token_ids))
        widest = max(cdiv(len(t) + n, self.block_size) for t, n in zip(token_ids, counts))
        tables = np.zeros((num_rows, pow2_bucket(widest, self.min_table_blocks)), np.int32)
        last = np.zeros(num_rows, np.int32)
        positions = np.zeros(num_rows, np.int32)
        num_drafts = np.zeros(num_rows, np.int32)
        for row, (tokens, n, table) in enumerate(zip(token_ids, counts, block_tables)):
            tables[row, :len(table)] = table
            last[row], positions[row], num_drafts[row] = tokens[-1], len(tokens) - 1, n
        return last, positions, tables, num_drafts

    def _propose_fn(self, params, pool: KVPool, inputs: tuple[jax.Array, ...], layout: StepLayout):
        """k greedy decode steps in one loop (k is the config's; rows stop at their own count)."""
        self._trace_count += 1
        model = nnx.merge(self.graphdef, params)
        last, positions, tables, num_drafts = inputs
        rows = jnp.arange(last.shape[0], dtype=jnp.int32)
        bs = self.block_size

        def draft_step(j, carry):
            pool, tokens, drafts = carry
            live = j < num_drafts
            pos = positions + j
            block = tables[rows, jnp.minimum(pos // bs, tables.shape[1] - 1)]
            slots = jnp.where(live, block * bs + pos % bs, -1)
            batch = AttentionBatch(slots, tables, jnp.where(live, pos + 1, 0), rows, live.astype(jnp.int32))
            hidden, pool = model(tokens, pos, pool, batch, layout, self.backend)
            nxt = jnp.argmax(model.logits(hidden), axis=-1).astype(jnp.int32)
            return pool, nxt, drafts.at[:, j].set(nxt)

        drafts = jnp.zeros((last.shape[0], self.num_speculative_tokens), jnp.int32)
        pool, _, drafts = jax.lax.fori_loop(0, jnp.max(num_drafts), draft_step, (pool, last, drafts))
        return drafts, pool


def load_draft_proposer(path: str, target: ModelConfig, num_speculative_tokens: int, num_blocks: int,
                        block_size: int, *, dtype=None, seed: int = 0, kv_dtype=None,
                        backend: AttentionBackend = AttentionBackend(),
                        pool_fill_value: float = 0.0, min_table_blocks: int = 1) -> DraftModelProposer:
    """Load `path` (anything `load_model` takes; a config name gives random weights from `seed`) as the draft.

    The vocabulary is checked before any weight is read.
    """
    from jaxpaged.checkpoint import load_model, model_config
    check_draft_config(model_config(path), target, repr(path))
    return DraftModelProposer(load_model(path, dtype=dtype, seed=seed), target, num_speculative_tokens, num_blocks,
                              block_size, kv_dtype=kv_dtype, backend=backend, pool_fill_value=pool_fill_value,
                              min_table_blocks=min_table_blocks, name=repr(path))
