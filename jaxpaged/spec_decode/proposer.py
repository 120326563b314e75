"""The proposer protocol: draft tokens for a batch of sequences, checked by one target step."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from jaxpaged.spec_decode.config import SpeculativeConfig


@dataclasses.dataclass
class DraftContext:
    """What a proposer that declares `drafts_need_slots` gets besides the tokens.

    Its sequences were already scheduled to verify: every sequence of n known
    tokens holds slots for positions n - 1 .. n - 1 + max_drafts (its last
    known token, then its drafts) in `block_tables` (the KV manager's tables,
    the target's block ids), and `copies` are the step's copy-on-write pairs
    (src, dst), not yet made on the device. `hidden_states` (`[B, H]`, only for
    a proposer that declares `uses_hidden_states`) are the target's last-layer
    hidden states (after the final norm) at each sequence's position n - 2:
    the row whose logits gave its last known token (EAGLE's features).
    """

    block_tables: list[list[int]]
    copies: list[tuple[int, int]]
    hidden_states: np.ndarray | None = None


class Proposer(Protocol):
    """Proposes up to `num_speculative_tokens` draft tokens per sequence.

    `propose` takes each sequence's tokens (prompt and output, all known to
    the host) and the most drafts each may take, and returns one list of draft
    token ids per sequence (empty: no proposal). A host-side proposer (n-gram)
    reads only the tokens and is asked before the step's slots are allocated.

    A proposer with `drafts_need_slots` (a model that writes K/V at the draft
    positions: the draft model, an EAGLE head) is asked after scheduling, with
    a `DraftContext`, and must return exactly `max_drafts[i]` tokens for
    sequence i (the slots were allocated for that many). With
    `uses_hidden_states` the target's step also keeps its last-layer hidden
    states and the context carries them.
    """

    num_speculative_tokens: int
    drafts_need_slots: bool
    uses_hidden_states: bool

    def propose(self, token_ids: Sequence[Sequence[int]], max_drafts: Sequence[int],
                context: DraftContext | None = None) -> list[list[int]]:
        """Draft tokens per sequence, at most `max_drafts[i]` for sequence i (exactly, with `drafts_need_slots`)."""
        ...


class StepFollower(Protocol):
    """A proposer with its own paged KV indexed by the target's block ids, kept in step by the runner."""

    def catch_up(self, token_ids, positions, attention, layout) -> None:
        """Compute its K/V for a target step's tokens (device arrays), at the step's slots."""
        ...

    def copy_blocks(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Make the target's copy-on-write copies (padded; `dst` out of range: none) in its own pool."""
        ...


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The host-side proposer `config.method` names (the draft model is built with the runner: `EngineBuilder`)."""
    if config.method == "ngram":
        from jaxpaged.spec_decode.ngram import NgramProposer
        return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
    raise ValueError(f"speculative_config.method {config.method!r} has no host-side proposer")
