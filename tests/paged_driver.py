"""A minimal host driver for foundation tests: random physical blocks, chunked prefill, greedy decode.

It is deliberately independent of the real scheduler and cache manager, so the
model/pool/attention path is tested on its own.
"""

from __future__ import annotations

import dataclasses

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.runner import ModelRunner
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input


@dataclasses.dataclass
class DrivenSeq:
    prompt: list[int]
    max_new: int
    blocks: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0
    logits: dict = dataclasses.field(default_factory=dict)  # position -> logits row

    def __post_init__(self):
        self.tokens = list(self.prompt)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= len(self.prompt) + self.max_new


def drive(runner: ModelRunner, prompts, max_new: int, chunk: int, rng: np.random.Generator,
          stagger: bool = True) -> list[DrivenSeq]:
    """Run prompts to completion; each step every live sequence computes one chunk or one decode.

    With `stagger`, sequence i joins at step i, so batches mix prefill chunks and decodes.
    Physical blocks are a random permutation of the pool: tables are non-contiguous.
    """
    bs = runner.block_size
    perm = list(rng.permutation(runner.pool.num_blocks))
    seqs = []
    for p in prompts:
        need = -(-(len(p) + max_new) // bs) * runner.kv_layout.num_groups  # a table per KV cache group
        seqs.append(DrivenSeq(list(p), max_new, [int(perm.pop()) for _ in range(need)]))
    step = 0
    while not all(s.done for s in seqs):
        live = [s for i, s in enumerate(seqs) if not s.done and (not stagger or i <= step)]
        step += 1
        if not live:
            continue
        scheduled = []
        for s in live:
            todo = s.tokens[s.computed:s.computed + chunk]
            scheduled.append(ScheduledSeq(todo, s.computed, s.blocks))
        out = runner.execute(build_step_input(scheduled, bs, runner.kv_layout.num_groups), return_logits=True)
        for s, sched, tok, logit in zip(live, scheduled, out.token_ids, out.logits):
            s.computed += len(sched.token_ids)
            s.logits[s.computed - 1] = logit
            if s.computed == len(s.tokens):  # whole sequence so far computed: sample
                s.tokens.append(int(tok))
    return seqs


@functools.cache
def _jitted_dense(graphdef):
    return jax.jit(lambda state, tokens: nnx.merge(graphdef, state).forward_dense(tokens))


def dense_logits(model, tokens: list[int]) -> np.ndarray:
    """No-cache logits `[len(tokens), vocab]`, jitted; input padded to a power of two.

    Padding at the end cannot change earlier positions of a causal model, and
    one padded length keeps the number of compiles small.
    """
    length = 1 << max(len(tokens) - 1, 0).bit_length()
    padded = np.zeros((1, max(length, 16)), np.int32)
    padded[0, :len(tokens)] = tokens
    graphdef, state = nnx.split(model)
    return np.asarray(_jitted_dense(graphdef)(state, jnp.asarray(padded)))[0, :len(tokens)]


DENSE_ATOL = 2e-4


def dense_check(model, seqs) -> None:
    """Every recorded paged logits row matches the dense forward; greedy tokens match exactly."""
    for s in seqs:
        dense = dense_logits(model, s.tokens[:-1])
        for pos, row in s.logits.items():
            np.testing.assert_allclose(row, dense[pos], atol=DENSE_ATOL, rtol=1e-4)
        generated = s.tokens[len(s.prompt):]
        expected = [int(np.argmax(dense[p])) for p in range(len(s.prompt) - 1, len(s.tokens) - 1)]
        assert generated == expected
