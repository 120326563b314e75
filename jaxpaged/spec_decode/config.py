"""`SpeculativeConfig`: which proposer drafts tokens and how many, as vLLM's ``speculative_config`` takes it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jaxpaged.validation import check_int, check_optional_int, check_optional_str, check_str

SPECULATIVE_METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16
# speculation stops at this many running sequences: measured on SmolLM2-135M on a 2-core CPU, n-gram with
# k = 4 on a repetition-heavy workload won 2.12x alone and lost at 4 (0.96x) and 8 (0.82x) sequences, where
# the verify step's k extra tokens per sequence cost more than they save (docs/benchmarks/spec-decode.md).
# A GPU, bound by weight reads up to far larger batches, wants a much higher value.
DEFAULT_DISABLE_BY_BATCH_SIZE = 2


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """How draft tokens are proposed; checked on creation (ValueError naming the field and its limit).

    `method` "ngram" is prompt lookup: the longest suffix of a sequence (between
    `prompt_lookup_min` and `prompt_lookup_max` tokens) that occurred earlier in
    it proposes the `num_speculative_tokens` tokens that followed it there.
    `method` "draft_model" runs `model` (a smaller checkpoint with the
    target's vocabulary: any path or name `jaxpaged.checkpoint.load_model`
    takes) greedily for `num_speculative_tokens` steps over its own paged KV
    (`jaxpaged.spec_decode.draft_model`); `model` is required there and
    refused for "ngram".
    `disable_by_batch_size` (vLLM's): no sequence speculates in a step that
    starts with at least this many running sequences, since a large batch
    is already compute-bound and the drafts' extra query tokens cost more than
    the accepted ones save; None speculates at any batch size.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self):
        check_str("speculative_config.method", self.method, choices=SPECULATIVE_METHODS)
        check_int("speculative_config.num_speculative_tokens", self.num_speculative_tokens, low=1,
                  high=MAX_SPECULATIVE_TOKENS)
        check_int("speculative_config.prompt_lookup_min", self.prompt_lookup_min, low=1, high=1024)
        check_int("speculative_config.prompt_lookup_max", self.prompt_lookup_max, low=self.prompt_lookup_min,
                  high=1024)
        check_optional_str("speculative_config.model", self.model)
        check_optional_int("speculative_config.disable_by_batch_size", self.disable_by_batch_size, low=1,
                           high=1 << 30)
        if self.method == "draft_model" and self.model is None:
            raise ValueError("speculative_config.method='draft_model' needs speculative_config.model "
                             "(the draft checkpoint's path or name)")
        if self.method == "ngram" and self.model is not None:
            raise ValueError("speculative_config.model is for method='draft_model'; method='ngram' takes none")

    @classmethod
    def from_value(cls, value) -> "SpeculativeConfig | None":
        """A `SpeculativeConfig` from None, an instance, a mapping of its fields, or a JSON object string."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            import json
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config must be a JSON object, got {value!r}: {e}") from None
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative_config must be a mapping of {[f.name for f in dataclasses.fields(cls)]}, "
                             f"got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; known: {sorted(known)}")
        return cls(**value)
