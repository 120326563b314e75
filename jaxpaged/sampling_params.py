"""SamplingParams: how to pick each request's output tokens (vLLM-shaped), validated on creation."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxpaged.outputs import RequestOutputKind


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings.

    `temperature=0` is greedy. `top_k=-1` and `top_p=1` disable those filters.
    `n > 1` samples n sequences from one prefilled prompt (blocks shared,
    copy-on-write). `beam_width > 1` runs beam search instead of sampling and
    returns the `beam_width` best beams, scored by `cumulative_logprob / len ** length_penalty`.
    `detokenize=False` leaves each output's `text` empty (token ids only), as in vLLM.
    `output_kind` chooses what `Engine.step` streams back for the request:
    everything so far after every step (CUMULATIVE, the default), only what is
    new (DELTA), or one output at the end (FINAL_ONLY). Beam search returns its
    beams only at the end, whatever the kind.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    beam_width: int = 1
    length_penalty: float = 1.0
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}")
        if self.beam_width > 1 and self.n > 1:
            raise ValueError("beam search returns beam_width beams; set n=1 with beam_width > 1")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def use_beam_search(self) -> bool:
        return self.beam_width > 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
