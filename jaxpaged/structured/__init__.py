"""Structured output: JSON schema, regex, choice and grammar constraints on what a request may sample.

A constraint is compiled by llguidance into a matcher per sequence
(`grammar.SequenceConstraint`); before each step that samples, the host fills
the sequence's packed token bitmask (`[ceil(vocab / 32)]` int32) and the jitted
sampler masks the row's logits with it (`bitmask.apply_token_bitmask`). The
matcher advances only on tokens the scheduler accepts.
"""

from jaxpaged.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
