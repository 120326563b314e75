"""A device backend that executes nothing: each step advances a simulated clock by its predicted time.

The engine's scheduler and KV cache manager run unchanged over it; only
`run_batch` differs. The simulated runner returns one fixed token for every
sequence, chosen so it is never EOS or a stop token of the model config, so
workloads must fix output lengths with `max_tokens` (and `ignore_eos`). It
allocates no arrays, ignores block tables and never compiles
(`num_compiles == 0`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxpaged.config import ModelConfig
from jaxpaged.runner import StepOutput
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.step_input import ScheduledSeq


class SimClock:
    """Simulated seconds; pass as the engine's `clock` so its timestamps are simulated too."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (a step ran, or the device idled)."""
        if seconds < 0:
            raise ValueError(f"time cannot go backwards ({seconds} s)")
        self.now += seconds

    def advance_to(self, t: float) -> None:
        """Move time forward to `t` if it is later than now."""
        self.now = max(self.now, t)


def fixed_token(config: ModelConfig) -> int:
    """The token every simulated step samples: 0, or 1 when 0 is the model's EOS."""
    return 1 if config.eos_token_id == 0 else 0


class SimulatedRunner:
    """Engine runner whose steps cost time on a `SimClock` instead of running a model."""

    num_compiles = 0

    def __init__(self, config: ModelConfig, cost_model: CostModel, clock: SimClock):
        self.config = config
        self.cost_model = cost_model
        self.clock = clock
        self.token = fixed_token(config)
        self.num_steps = 0
        self.busy_s = 0.0  # simulated seconds spent in steps and copies

    def run_batch(self, batch: Sequence[ScheduledSeq], *, num_top_logprobs: int = 0) -> StepOutput:
        """Advance the clock by the batch's predicted time; sample the fixed token for every sequence."""
        if num_top_logprobs:
            raise NotImplementedError("the simulator does not model beam search")
        seconds = self.cost_model.step_time((len(s.token_ids), s.num_computed_tokens) for s in batch)
        self.clock.advance(seconds)
        self.busy_s += seconds
        self.num_steps += 1
        n = len(batch)
        return StepOutput(token_ids=np.full(n, self.token, np.int32), logprobs=np.zeros(n, np.float32))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write costs memory traffic; nothing is copied."""
        seconds = self.cost_model.copy_time(len(pairs))
        self.clock.advance(seconds)
        self.busy_s += seconds
