"""The proposer protocol: draft tokens for a batch of sequences, checked by one target step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from jaxpaged.spec_decode.config import SpeculativeConfig


class Proposer(Protocol):
    """Proposes up to `num_speculative_tokens` draft tokens per sequence.

    `propose` takes each sequence's tokens (prompt and output, all known to
    the host) and the most drafts each may take, and returns one list of draft
    token ids per sequence (empty: no proposal). A host-side proposer (n-gram)
    reads only the tokens; a draft-model or EAGLE-style proposer would add its
    own state behind the same call.
    """

    num_speculative_tokens: int

    def propose(self, token_ids: Sequence[Sequence[int]], max_drafts: Sequence[int]) -> list[list[int]]:
        """Draft tokens per sequence, at most `max_drafts[i]` for sequence i."""
        ...


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer `config.method` names."""
    if config.method == "ngram":
        from jaxpaged.spec_decode.ngram import NgramProposer
        return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
    raise ValueError(f"speculative_config.method {config.method!r} has no proposer")
