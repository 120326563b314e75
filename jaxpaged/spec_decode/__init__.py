"""Speculative decoding: the configuration, the proposer protocol and the n-gram (prompt lookup) proposer."""

from jaxpaged.spec_decode.config import SPECULATIVE_METHODS, SpeculativeConfig
from jaxpaged.spec_decode.ngram import NgramProposer
from jaxpaged.spec_decode.proposer import Proposer, make_proposer

__all__ = ["SPECULATIVE_METHODS", "NgramProposer", "Proposer", "SpeculativeConfig", "make_proposer"]
