"""Speculative decoding: the configuration, the proposer protocol and the n-gram (prompt lookup) proposer."""

from jaxpaged.spec_decode.config import SPECULATIVE_METHODS, SpeculativeConfig
from jaxpaged.spec_decode.ngram import NgramProposer
from jaxpaged.spec_decode.proposer import DraftContext, Proposer, make_proposer

__all__ = ["SPECULATIVE_METHODS", "DraftContext", "NgramProposer", "Proposer", "SpeculativeConfig", "make_proposer"]
