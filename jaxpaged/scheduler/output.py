"""What the scheduler hands the runner each step, and what the runner hands back.

The runner keeps a persistent batch: one row per resident sequence (its block
table and sampling settings) across steps. So a `SchedulerOutput` carries only
what changed since the last one (rows to add, blocks appended, rows to free,
copy-on-write copies) plus this step's per-sequence work: which sequences,
from which position, how many tokens, and the input token ids the host knows.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import NamedTuple

import numpy as np

from jaxpaged.sequence import Request, Sequence

TOKEN_ON_DEVICE = -1  # an input token sampled by the previous step and still on the device
_seq_id = operator.attrgetter("seq_id")


class RowControls(NamedTuple):
    """A sequence's logit controls, as the scheduler hands them to the runner with its row (host values)."""

    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    stop_ids: tuple[int, ...] = ()  # masked while fewer than min_tokens tokens are out (stop ids + EOS)
    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    bad_words: tuple[tuple[int, ...], ...] = ()  # token ids of each bad word (output must not contain them)

    @property
    def uses_penalties(self) -> bool:
        return self.repetition != 1.0 or bool(self.frequency) or bool(self.presence)


class NewRow(NamedTuple):
    """A sequence the runner has no row for (admitted, resumed after preemption, or forked)."""

    seq_id: int
    block_ids: list[int]
    num_prompt_tokens: int  # the sampled token's index among the outputs is context length - this
    temperature: float
    top_k: int
    top_p: float
    seed: int
    controls: RowControls | None = None  # logit bias, min_tokens, penalties (None: none)
    min_p: float = 0.0


@dataclasses.dataclass(slots=True)
class SchedulerOutput:
    """One step's batch and the changes the runner applies to its persistent batch first.

    The per-sequence lists are parallel, in schedule order. `token_ids` is their
    input tokens, concatenated; `TOKEN_ON_DEVICE` marks a token the previous
    step sampled that the host has not read (asynchronous scheduling): the
    runner takes it from its device copy of that row's last sample.
    """

    seqs: list[Sequence] = dataclasses.field(default_factory=list)
    starts: list[int] = dataclasses.field(default_factory=list)  # first position computed
    num_tokens: list[int] = dataclasses.field(default_factory=list)  # tokens computed
    samples: list[bool] = dataclasses.field(default_factory=list)  # the step samples the seq's next token
    token_ids: list[int] = dataclasses.field(default_factory=list)
    new_rows: list[NewRow] = dataclasses.field(default_factory=list)
    block_updates: list[tuple[int, int, list[int]]] = dataclasses.field(default_factory=list)
    freed_seq_ids: list[int] = dataclasses.field(default_factory=list)  # rows to release, before new_rows
    copies: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (src, dst) blocks
    preempted: list[Request] = dataclasses.field(default_factory=list)
    num_top_logprobs: int = 0  # beam search: how many top log-probabilities per row to bring back
    # prompt logprobs: (index in seqs, first position, count): the step returns the logprob of the
    # token after each of those positions; the spans' rows come back concatenated in this order
    prompt_logprob_spans: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    num_prompt_top_logprobs: int = 0  # top ids per prompt position (padded to a power of two)
    # structured output / allowed_token_ids: which sampling sequences (index in seqs) have a mask, and
    # their packed masks [C, ceil(vocab / 32)] int32; filled by `Scheduler.fill_token_masks`
    token_mask_indices: list[int] = dataclasses.field(default_factory=list)
    token_masks: np.ndarray | None = None
    # the masks are filled after the previous step's tokens are read, while this step's forward pass runs
    # (asynchronous scheduling with a grammar row): the runner dispatches the sampling half then
    token_masks_deferred: bool = False
    # speculative decoding: (index in seqs, number of draft tokens k) per sequence that verifies drafts; its
    # step computes its last known token then the k drafts, and returns the verified token after each of
    # those k + 1 positions (spans concatenated in this order)
    verify_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    draft_token_ids: list[list[int]] = dataclasses.field(default_factory=list)  # each span's drafts

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def seq_ids(self) -> list[int]:
        """The scheduled sequences' ids, in schedule order."""
        return list(map(_seq_id, self.seqs))

    @property
    def num_batched_tokens(self) -> int:
        return len(self.token_ids)


@dataclasses.dataclass
class ModelOutput:
    """A step's results on the host, one row per scheduled sequence, in schedule order."""

    token_ids: np.ndarray  # [num_seqs] sampled ids
    logprobs: np.ndarray  # [num_seqs] log-probability of each sampled id
    top_ids: np.ndarray | None = None  # [num_seqs, k] when num_top_logprobs > 0
    top_logprobs: np.ndarray | None = None
    logits: np.ndarray | None = None  # [num_seqs, vocab] when a hand-built step asks for them
    # the prompt-logprob spans' positions, concatenated (padded past their total)
    prompt_logprobs: np.ndarray | None = None  # [P] logprob of the next prompt token
    prompt_top_ids: np.ndarray | None = None  # [P, k] when num_prompt_top_logprobs > 0
    prompt_top_logprobs: np.ndarray | None = None
    # speculative decoding: the verify spans' positions, concatenated (padded past their total)
    verify_ids: np.ndarray | None = None  # [V] verified token after each position (its draft when accepted)
    verify_logprobs: np.ndarray | None = None  # [V] its log-probability
    # a proposer that reads the target's hidden states (EAGLE-style): the last layer's, after the final norm
    hidden_states: np.ndarray | None = None  # [num_seqs, H] at each sequence's sampled row
    verify_hidden_states: np.ndarray | None = None  # [V, H] at the verify positions (as verify_ids)


@dataclasses.dataclass
class SchedulerStats:
    """Cumulative counters plus the last scheduled step's batch (read by metrics and benchmarks)."""

    num_steps: int = 0  # steps with work, counted when scheduled
    prompt_tokens: int = 0  # prompt tokens computed (cache hits excluded), counted when their step lands
    generation_tokens: int = 0
    last_step_tokens: int = 0
    last_step_seqs: int = 0
    # speculative decoding (vLLM's spec_decode counters): verify steps' sequences, drafts and accepted drafts
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self._last_batch: tuple[list[Sequence], list[int]] = ([], [])

    def set_last_batch(self, seqs: list[Sequence], num_tokens: list[int]) -> None:
        """Record the last scheduled step's sequences and token counts (read lazily)."""
        self._last_batch = (seqs, num_tokens)

    @property
    def last_step_batch(self) -> list[tuple[str, int, int]]:
        """The last scheduled step: (request id, sequence index, tokens computed), in schedule order."""
        seqs, counts = self._last_batch
        return [(s.request.request_id, s.index, n) for s, n in zip(seqs, counts)]
